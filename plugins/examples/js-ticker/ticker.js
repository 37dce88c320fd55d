// js-ticker: a taskhost producer plugin in JavaScript (ComponentizeJS).
//
// A task emits `<message> <i>` for i = 1..count, line i being due at
// `start + i * interval_ms` (computed from the start, so it never drifts),
// and stops when cancelled. The same behaviour as the Rust `plugins/ticker`.
//
// The execution model (see `wit/producer.wit`): every export returns at
// once. Never wait in a loop or on a promise: the host waits on the pollable
// `subscribe` returns (a clock pollable here), then calls `done` and
// `readOutput`. Nothing runs between calls, so each call first emits every
// line due by now.
//
// Bindings as ComponentizeJS maps the WIT: the export `producer` is an
// object with the interface's functions and its resource as a class; a
// `result<_, string>` is a return (ok) or a thrown string (err); u64 values
// (clock instants) are BigInts; enums are their WIT names as strings.

import { now, subscribeDuration, subscribeInstant } from 'wasi:clocks/monotonic-clock@0.2.12';
import { log } from 'taskhost:producer/host-log@0.2.2';

const KIND = 'js-ticker';
const DESCRIPTION = 'Emits a numbered line every interval_ms milliseconds, count times (a JavaScript plugin).';
const MAX_COUNT = 100000;
const MAX_INTERVAL_MS = 3600000;
const NANOS_PER_MILLI = 1000000n;

/** The instance config: `{"default_message": "..."}`, all optional. */
function parseConfig(config) {
  let value;
  try {
    value = JSON.parse(config || '{}');
  } catch (error) {
    throw `invalid config: ${error.message}`;
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw 'invalid config: expected a table';
  }
  for (const key of Object.keys(value)) {
    if (key !== 'default_message') {
      throw `invalid config: unknown field "${key}", expected \`default_message\``;
    }
  }
  const message = value.default_message ?? 'tick';
  if (typeof message !== 'string') throw 'invalid config: default_message must be a string';
  return message;
}

/** The arguments, already validated by the host against the schema. */
function parseArgs(args, defaultMessage) {
  let value;
  try {
    value = JSON.parse(args);
  } catch (error) {
    throw `invalid arguments: ${error.message}`;
  }
  const count = value.count ?? 3;
  const intervalMs = value.interval_ms ?? 1000;
  const message = value.message ?? defaultMessage;
  if (!Number.isInteger(count) || count < 0 || count > MAX_COUNT) {
    throw `invalid arguments: count must be an integer from 0 to ${MAX_COUNT}`;
  }
  if (!Number.isInteger(intervalMs) || intervalMs < 0 || intervalMs > MAX_INTERVAL_MS) {
    throw `invalid arguments: interval_ms must be an integer from 0 to ${MAX_INTERVAL_MS}`;
  }
  return { count, intervalMs, message };
}

/** One task. It runs in its own instance, so its state lives here. */
class Task {
  constructor(count, intervalMs, message) {
    this.start = now();
    this.count = count;
    this.intervalNs = BigInt(intervalMs) * NANOS_PER_MILLI;
    this.message = message;
    this.emitted = 0;
    this.cancelled = false;
    this.output = '';
  }

  finished() {
    return this.cancelled || this.emitted === this.count;
  }

  /** Emits every line due by now and not yet emitted. */
  catchUp() {
    if (this.finished()) return;
    let due = this.count;
    if (this.intervalNs !== 0n) {
      const elapsed = (now() - this.start) / this.intervalNs;
      due = Number(elapsed < BigInt(this.count) ? elapsed : BigInt(this.count));
    }
    while (this.emitted < due) {
      this.emitted += 1;
      this.output += `${this.message} ${this.emitted}\n`;
    }
  }

  cancel(reason) {
    this.catchUp();
    if (this.finished()) return;
    this.cancelled = true;
    log('debug', `cancelled after ${this.emitted} ticks: ${reason ?? 'no reason given'}`);
  }

  subscribe() {
    this.catchUp();
    if (this.finished()) return subscribeDuration(0n);
    return subscribeInstant(this.start + BigInt(this.emitted + 1) * this.intervalNs);
  }

  done() {
    this.catchUp();
    if (this.cancelled) return { status: 'killed', detail: `after ${this.emitted} ticks` };
    if (this.emitted === this.count) return { status: 'completed', detail: `ticks: ${this.count}` };
    return undefined;
  }

  readOutput() {
    this.catchUp();
    const text = this.output;
    this.output = '';
    return text;
  }

  // Only asked of kinds whose descriptor takes input; this one does not.
  writeInput(_data, _close) {
    throw `${KIND} tasks take no input`;
  }
}

export const producer = {
  describe(config) {
    const defaultMessage = parseConfig(config);
    const schema = {
      type: 'object',
      properties: {
        count: { type: 'integer', minimum: 0, maximum: MAX_COUNT, default: 3, description: 'How many lines to emit.' },
        interval_ms: {
          type: 'integer', minimum: 0, maximum: MAX_INTERVAL_MS, default: 1000,
          description: 'Milliseconds between two lines.',
        },
        message: { type: 'string', default: defaultMessage, description: 'The text of each line, followed by its number.' },
      },
      additionalProperties: false,
    };
    // Never declare `run_in_background`: the host adds it.
    // Streams output; takes no input (the host offers no `interactive`).
    return {
      kind: KIND, description: DESCRIPTION, parameters: JSON.stringify(schema), streamsOutput: true, takesInput: false,
    };
  },

  label(config, args) {
    const { count, intervalMs } = parseArgs(args, parseConfig(config));
    return `${count} ticks every ${intervalMs} ms`;
  },

  run(config, args, _mode) {
    const { count, intervalMs, message } = parseArgs(args, parseConfig(config));
    return new Task(count, intervalMs, message);
  },

  Task,
};
