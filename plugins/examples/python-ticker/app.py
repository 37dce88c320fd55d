"""python-ticker: a taskhost producer plugin in Python (componentize-py).

A task emits `<message> <i>` for i = 1..count, line i being due at
`start + i * interval_ms` (computed from the start, so it never drifts), and
stops when cancelled. The same behaviour as the Rust `plugins/ticker`.

The execution model (see `wit/producer.wit`): every export returns at once.
Never sleep or loop waiting: the host waits on the pollable `subscribe`
returns (a clock pollable here), then calls `done` and `read_output`. Nothing
runs between calls, so each call first emits every line due by now.
"""

import json
from typing import Optional

import wit_world
from componentize_py_types import Err
from wit_world.exports import producer
from wit_world.imports import host_log, monotonic_clock, poll
from wit_world.imports.types import Descriptor, Outcome, RunMode, TerminalStatus

KIND = "python-ticker"
DESCRIPTION = "Emits a numbered line every interval_ms milliseconds, count times (a Python plugin)."
MAX_COUNT = 100_000
MAX_INTERVAL_MS = 3_600_000
NANOS_PER_MILLI = 1_000_000


def parse_config(config: str) -> str:
    """The instance config: `{"default_message": "..."}`, all optional."""
    try:
        value = json.loads(config or "{}")
    except ValueError as error:
        raise Err(f"invalid config: {error}")
    if not isinstance(value, dict):
        raise Err("invalid config: expected a table")
    unknown = sorted(set(value) - {"default_message"})
    if unknown:
        raise Err(f"invalid config: unknown field {unknown[0]!r}, expected `default_message`")
    message = value.get("default_message", "tick")
    if not isinstance(message, str):
        raise Err("invalid config: default_message must be a string")
    return message


def parse_args(args: str, default_message: str):
    """The arguments, already validated by the host against the schema."""
    try:
        value = json.loads(args)
    except ValueError as error:
        raise Err(f"invalid arguments: {error}")
    count = value.get("count", 3)
    interval_ms = value.get("interval_ms", 1000)
    message = value.get("message", default_message)
    if not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
        raise Err(f"invalid arguments: count must be an integer from 0 to {MAX_COUNT}")
    if not isinstance(interval_ms, int) or not 0 <= interval_ms <= MAX_INTERVAL_MS:
        raise Err(f"invalid arguments: interval_ms must be an integer from 0 to {MAX_INTERVAL_MS}")
    return count, interval_ms, message


class Producer(wit_world.exports.Producer):
    def describe(self, config: str) -> Descriptor:
        default_message = parse_config(config)
        schema = {
            "type": "object",
            "properties": {
                "count": {"type": "integer", "minimum": 0, "maximum": MAX_COUNT, "default": 3,
                          "description": "How many lines to emit."},
                "interval_ms": {"type": "integer", "minimum": 0, "maximum": MAX_INTERVAL_MS,
                                "default": 1000, "description": "Milliseconds between two lines."},
                "message": {"type": "string", "default": default_message,
                            "description": "The text of each line, followed by its number."},
            },
            "additionalProperties": False,
        }
        # Never declare `run_in_background`: the host adds it. Streams output
        # (true); takes no input (false: the host offers no `interactive`).
        return Descriptor(KIND, DESCRIPTION, json.dumps(schema), True, False)

    def label(self, config: str, args: str) -> str:
        count, interval_ms, _ = parse_args(args, parse_config(config))
        return f"{count} ticks every {interval_ms} ms"

    def run(self, config: str, args: str, mode: RunMode) -> producer.Task:
        count, interval_ms, message = parse_args(args, parse_config(config))
        return Ticker(count, interval_ms * NANOS_PER_MILLI, message)


class Ticker(producer.Task):
    """One task. It runs in its own instance, so its state lives here."""

    def __init__(self, count: int, interval_ns: int, message: str):
        self.start = monotonic_clock.now()
        self.count = count
        self.interval_ns = interval_ns
        self.message = message
        self.emitted = 0
        self.cancelled = False
        self.output = []

    def finished(self) -> bool:
        return self.cancelled or self.emitted == self.count

    def catch_up(self) -> None:
        """Emits every line due by now and not yet emitted."""
        if self.finished():
            return
        if self.interval_ns == 0:
            due = self.count
        else:
            due = min((monotonic_clock.now() - self.start) // self.interval_ns, self.count)
        while self.emitted < due:
            self.emitted += 1
            self.output.append(f"{self.message} {self.emitted}\n")

    def cancel(self, reason: Optional[str]) -> None:
        self.catch_up()
        if self.finished():
            return
        self.cancelled = True
        host_log.log(host_log.Level.DEBUG, f"cancelled after {self.emitted} ticks: {reason or 'no reason given'}")

    def subscribe(self) -> poll.Pollable:
        self.catch_up()
        if self.finished():
            return monotonic_clock.subscribe_duration(0)
        return monotonic_clock.subscribe_instant(self.start + (self.emitted + 1) * self.interval_ns)

    def done(self) -> Optional[Outcome]:
        self.catch_up()
        if self.cancelled:
            return Outcome(TerminalStatus.KILLED, f"after {self.emitted} ticks", None)
        if self.emitted == self.count:
            return Outcome(TerminalStatus.COMPLETED, f"ticks: {self.count}", None)
        return None

    def read_output(self) -> str:
        self.catch_up()
        text = "".join(self.output)
        self.output.clear()
        return text

    def write_input(self, data: bytes, close: bool) -> None:
        # Only asked of kinds whose descriptor takes input; this one does not.
        raise Err(f"{KIND} tasks take no input")
