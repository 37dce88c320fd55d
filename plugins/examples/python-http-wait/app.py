"""python-http-wait: the Python twin of plugins/examples/http_wait (componentize-py).

A background task that polls a URL (GET) every interval_ms until a condition
holds: the status (any 2xx unless `status` is given) and, optionally, a JSON
field (`json_pointer` equal to `equals`). One line per poll, a `changed:` line
when what it sees changes, `completed` when the condition holds, `failed` at
timeout_ms. It reaches the network only through the standard
`wasi:http/outgoing-handler` (the `http-plugin` world), which the host serves
only to an instance granted `[producer.grants.http]`.

The execution model (see `wit/producer.wit`): every export returns at once.
A poll is a small state machine advanced from `subscribe` and `done`, which
hands the host the pollable of what it waits for (the next poll's instant,
the response, the body stream). A pollable the host holds is a child of the
request or stream it came from, so resources are released only in
`subscribe` and `done`, never in `cancel` or `read_output`.
"""

import json
from typing import Optional

import wit_world
from componentize_py_types import Err, Ok
from wit_world.exports import producer
from wit_world.imports import monotonic_clock, outgoing_handler, poll, streams
from wit_world.imports import wasi_http_types as http
from wit_world.imports.taskhost_producer_types import Descriptor, Outcome, RunMode, TerminalStatus

KIND = "python_http_wait"
DESCRIPTION = (
    "Polls a URL (GET) every interval_ms until the status (any 2xx unless `status` is given) and, if given, "
    "the JSON field `json_pointer` equal to `equals` hold. One line per poll; a line starting `changed:` "
    "whenever what it sees changes. Completes when the condition holds; fails at timeout_ms "
    "(a Python plugin)."
)
NANOS_PER_MILLI = 1_000_000
MAX_BODY_BYTES = 1024 * 1024
SCHEMA = {
    "type": "object",
    "properties": {
        "url": {"type": "string", "description": "The http:// or https:// URL to GET."},
        "status": {"type": "integer", "minimum": 100, "maximum": 599,
                   "description": "The status that must be answered. Without it, any 2xx."},
        "json_pointer": {"type": "string", "description": "A JSON pointer (e.g. \"/state\") into the JSON body."},
        "equals": {"description": "The value the json_pointer field must have."},
        "interval_ms": {"type": "integer", "minimum": 100, "maximum": 3_600_000, "default": 5000,
                        "description": "Milliseconds between the starts of two polls."},
        "timeout_ms": {"type": "integer", "minimum": 1000, "maximum": 86_400_000, "default": 600_000,
                       "description": "Milliseconds after the start at which the task fails."},
    },
    "required": ["url"],
    "additionalProperties": False,
}


def parse_args(args: str) -> dict:
    """The arguments, already validated by the host against the schema."""
    try:
        value = json.loads(args)
    except ValueError as error:
        raise Err(f"invalid arguments: {error}")
    if ("json_pointer" in value) != ("equals" in value):
        raise Err("invalid arguments: json_pointer and equals go together: give both or neither")
    scheme, sep, rest = value["url"].partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise Err(f"invalid arguments: url {value['url']!r} must start with http:// or https://")
    slash = rest.find("/")
    authority, path = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
    if not authority or "@" in authority:
        raise Err(f"invalid arguments: url {value['url']!r} needs a host (and no user info)")
    value["target"] = (scheme.lower() == "https", authority, path.split("#")[0])
    value.setdefault("interval_ms", 5000)
    value.setdefault("timeout_ms", 600_000)
    return value


def pointer(document, path: str):
    """RFC 6901: the value at `path`, or a KeyError."""
    if path == "":
        return document
    for token in path.lstrip("/").split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(document, list):
            document = document[int(token)]
        elif isinstance(document, dict):
            document = document[token]
        else:
            raise KeyError(token)
    return document


def describe_error(code) -> str:
    if isinstance(code, http.ErrorCode_InternalError) and code.value:
        return code.value[:200]
    return type(code).__name__.removeprefix("ErrorCode_")


class Producer(wit_world.exports.Producer):
    def describe(self, config: str) -> Descriptor:
        # Never declare `run_in_background`: the host adds it. Streams output.
        return Descriptor(KIND, DESCRIPTION, json.dumps(SCHEMA), True, False)

    def label(self, config: str, args: str) -> str:
        return f"wait for {parse_args(args)['url']}"

    def run(self, config: str, args: str, mode: RunMode) -> producer.Task:
        return Wait(parse_args(args))


class Wait(producer.Task):
    """One task. It runs in its own instance, so its state lives here."""

    def __init__(self, args: dict):
        self.args = args
        self.start = monotonic_clock.now()
        self.deadline = self.start + args["timeout_ms"] * NANOS_PER_MILLI
        self.interval = args["interval_ms"] * NANOS_PER_MILLI
        self.due = self.start  # the next poll's instant, while none is in flight
        self.future = None  # the response awaited
        self.reading = None  # (response, body, stream, status, bytes) while the body is read
        self.polls = 0
        self.last_seen = None
        self.cancelled = False
        self.outcome = None
        self.output = []

    # Releasing: children before parents, and only from subscribe/done.
    def release(self) -> None:
        if self.reading is not None:
            response, body, stream, _, _ = self.reading
            for resource in (stream, body, response):
                resource.__exit__(None, None, None)
            self.reading = None
        if self.future is not None:
            self.future.__exit__(None, None, None)
            self.future = None

    def end(self, status: TerminalStatus, detail: str) -> None:
        self.release()
        self.outcome = Outcome(status, detail, None)

    def send(self, now: int):
        secure, authority, path = self.args["target"]
        request = http.OutgoingRequest(http.Fields())
        request.set_method(http.Method_Get())
        request.set_scheme(http.Scheme_Https() if secure else http.Scheme_Http())
        request.set_authority(authority)
        request.set_path_with_query(path)
        options = http.RequestOptions()
        # Ask the host to give up at the deadline (it never waits longer than its grant allows).
        try:
            options.set_first_byte_timeout(self.deadline - now)
            options.set_between_bytes_timeout(self.deadline - now)
        except Err:
            pass
        return outgoing_handler.handle(request, options)

    def record(self, seen: str, note: str, holds: bool, now: int) -> None:
        self.polls += 1
        self.output.append(f"poll {self.polls} at {(now - self.start) // NANOS_PER_MILLI} ms: {seen}, {note}\n")
        if self.last_seen is not None and self.last_seen != seen:
            self.output.append(f"changed: {self.last_seen} -> {seen}\n")
        self.last_seen = seen
        self.release()
        if holds:
            self.end(TerminalStatus.COMPLETED, f"condition held at poll {self.polls}")
        else:
            self.due = max(self.start + self.polls * self.interval, now)

    def judge(self, status: int, body: bytes, now: int) -> None:
        wanted = self.args.get("status")
        holds = status == wanted if wanted is not None else 200 <= status < 300
        seen = f"status {status}"
        if "json_pointer" in self.args:
            path = self.args["json_pointer"]
            try:
                value = pointer(json.loads(body), path)
                holds = holds and value == self.args["equals"]
                seen += f", {path} = {json.dumps(value)[:200]}"
            except ValueError:
                holds = False
                seen += ", body is not JSON"
            except (KeyError, IndexError):
                holds = False
                seen += f", {path} missing"
        self.record(seen, f"{len(body)} bytes: {'holds' if holds else 'not yet'}", holds, now)

    def advance(self) -> None:
        """Moves the task on as far as it can go without waiting."""
        while self.outcome is None:
            now = monotonic_clock.now()
            if self.cancelled:
                return self.end(TerminalStatus.KILLED, f"cancelled after {self.polls} polls")
            if now >= self.deadline:
                self.output.append(f"deadline: the condition did not hold within {self.args['timeout_ms']} ms\n")
                last = f"; last seen: {self.last_seen}" if self.last_seen else ""
                return self.end(TerminalStatus.FAILED, f"timed out after {self.polls} polls{last}")
            if self.reading is not None:
                response, body, stream, status, data = self.reading
                try:
                    chunk = stream.read(min(64 * 1024, MAX_BODY_BYTES - len(data)))
                except Err as error:
                    if isinstance(error.value, streams.StreamError_Closed):
                        self.judge(status, bytes(data), now)
                        continue
                    self.record("error: reading the body failed", "not yet", False, now)
                    continue
                if not chunk:
                    return  # wait on the stream
                data.extend(chunk)
                if len(data) >= MAX_BODY_BYTES:
                    self.judge(status, bytes(data), now)
                continue
            if self.future is not None:
                result = self.future.get()
                if result is None:
                    return  # wait on the response
                inner = result.value
                if isinstance(result, Ok) and isinstance(inner, Ok):
                    response = inner.value
                    body = response.consume()
                    self.reading = (response, body, body.stream(), response.status(), bytearray())
                    self.future.__exit__(None, None, None)
                    self.future = None
                else:
                    code = inner.value if isinstance(result, Ok) else None
                    self.record(f"error: {describe_error(code)}", "not yet", False, now)
                continue
            if now < self.due:
                return  # wait for the next poll
            try:
                self.future = self.send(now)
            except Err as error:
                self.record(f"error: {describe_error(error.value)}", "not yet", False, now)

    def cancel(self, reason: Optional[str]) -> None:
        # Only a flag: the host may hold a pollable that is a child of the request.
        self.cancelled = True

    def subscribe(self) -> poll.Pollable:
        self.advance()
        if self.outcome is not None:
            return monotonic_clock.subscribe_duration(0)
        if self.reading is not None:
            return self.reading[2].subscribe()
        if self.future is not None:
            return self.future.subscribe()
        return monotonic_clock.subscribe_instant(min(self.due, self.deadline))

    def done(self) -> Optional[Outcome]:
        self.advance()
        return self.outcome

    def read_output(self) -> str:
        text = "".join(self.output)
        self.output.clear()
        return text

    def write_input(self, data: bytes, close: bool) -> None:
        raise Err(f"{KIND} tasks take no input")
