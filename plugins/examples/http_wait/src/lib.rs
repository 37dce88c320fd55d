//! `http_wait`: a background task that polls a URL until a condition holds
//! (a status code, a JSON field, a regex over the body), one output line per
//! poll, a `changed:` line when what it sees changes, `completed` when the
//! condition holds and `failed` at its deadline.
//!
//! It is the plugin guide's worked example of a kind the host knows nothing
//! about: it reaches the network only through the standard
//! `wasi:http/outgoing-handler`, which the host serves to it because its
//! `[[producer]]` entry grants `[producer.grants.http]` (the origins, and any
//! credential the host adds on the way out, are the operator's, never the
//! plugin's).
//!
//! Invariants:
//! - Nothing blocks: a poll is a state machine ([`Phase`]) advanced from
//!   `subscribe` and `done`, and `subscribe` hands the host the pollable of
//!   whatever it waits for (the next poll's instant, the response, the body
//!   stream). Resources are dropped only there, never in `cancel` or
//!   `read_output`, which run while the host holds a pollable that is a
//!   child of them.
//! - Polls are due at `start + n * interval`, so they do not drift; a poll
//!   still in flight when the next is due delays it, never overlaps it.
//! - Each request asks the host to give up at the task's deadline
//!   (`first-byte` and `between-bytes` timeouts), so a slow server cannot
//!   keep the task past it.
//! - A body is read up to [`MAX_BODY_BYTES`]; the host bounds it too
//!   (`max_response_bytes`).

use core::cell::RefCell;
use core::fmt::Write as _;

use taskhost_plugin_sdk::serde_json::{self, Value};
use taskhost_plugin_sdk::time::{self, Instant};
use taskhost_plugin_sdk::typed::prelude::*;
use taskhost_plugin_sdk::wasip2::http::outgoing_handler;
use taskhost_plugin_sdk::wasip2::http::types::{
    ErrorCode, FutureIncomingResponse, IncomingBody, IncomingResponse, Method, OutgoingRequest, RequestOptions, Scheme,
};
use taskhost_plugin_sdk::wasip2::io::streams::{InputStream, StreamError};

const NANOS_PER_MILLI: u64 = 1_000_000;
const MIN_INTERVAL_MS: u64 = 100;
const MAX_INTERVAL_MS: u64 = 3_600_000;
const DEFAULT_INTERVAL_MS: u64 = 5_000;
const MIN_TIMEOUT_MS: u64 = 1_000;
const MAX_TIMEOUT_MS: u64 = 86_400_000;
const DEFAULT_TIMEOUT_MS: u64 = 600_000;
/// The most of a response body a poll looks at; the rest is not read.
const MAX_BODY_BYTES: usize = 1024 * 1024;
/// The longest observed value a line quotes.
const MAX_SHOWN_CHARS: usize = 200;
const READ_CHUNK_BYTES: u64 = 64 * 1024;

/// The tool arguments; their derived schema is the tool's (an optional
/// field has no `default` in it: leaving it out is how it is not asked for).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct WaitArgs {
    /// The http:// or https:// URL to GET. Only origins the operator granted are reachable.
    url: String,
    /// The status code that must be answered. Without it, any 2xx status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u16", range(min = 100, max = 599))]
    status: Option<u16>,
    /// A JSON pointer (RFC 6901, e.g. "/status") into the JSON body, whose value must equal `equals`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    json_pointer: Option<String>,
    /// The value the `json_pointer` field must have (any JSON value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    equals: Option<Value>,
    /// A regular expression that must match somewhere in the body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    body_regex: Option<String>,
    /// Milliseconds between the starts of two polls.
    #[serde(default = "default_interval_ms")]
    #[schemars(range(min = MIN_INTERVAL_MS, max = MAX_INTERVAL_MS))]
    interval_ms: u64,
    /// Milliseconds after the start at which the task fails if the condition never held.
    #[serde(default = "default_timeout_ms")]
    #[schemars(range(min = MIN_TIMEOUT_MS, max = MAX_TIMEOUT_MS))]
    timeout_ms: u64,
}

fn default_interval_ms() -> u64 {
    DEFAULT_INTERVAL_MS
}

fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}

/// Where the request goes, split for `wasi:http`.
#[derive(Debug, Clone)]
struct Target {
    https: bool,
    authority: String,
    path_with_query: String,
}

/// What must hold, checked against each response.
#[derive(Debug)]
struct Condition {
    status: Option<u16>,
    json: Option<(String, Value)>,
    body_regex: Option<regex_lite::Regex>,
}

impl WaitArgs {
    /// Checks the arguments (the host validated them against the schema;
    /// checking again keeps the plugin correct on its own).
    fn check(&self) -> Result<(Target, Condition), String> {
        if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&self.interval_ms) {
            return Err(format!("interval_ms must be {MIN_INTERVAL_MS}..={MAX_INTERVAL_MS}, got {}", self.interval_ms));
        }
        if !(MIN_TIMEOUT_MS..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(format!("timeout_ms must be {MIN_TIMEOUT_MS}..={MAX_TIMEOUT_MS}, got {}", self.timeout_ms));
        }
        if let Some(status) = self.status.filter(|s| !(100..=599).contains(s)) {
            return Err(format!("status must be 100..=599, got {status}"));
        }
        let json = match (&self.json_pointer, &self.equals) {
            (Some(pointer), Some(value)) => {
                if !(pointer.is_empty() || pointer.starts_with('/')) {
                    return Err(format!("json_pointer must be empty or start with '/', got {pointer:?}"));
                }
                Some((pointer.clone(), value.clone()))
            }
            (None, None) => None,
            _ => return Err("json_pointer and equals go together: give both or neither".to_owned()),
        };
        let body_regex = match &self.body_regex {
            Some(pattern) => Some(
                regex_lite::Regex::new(pattern).map_err(|e| format!("body_regex {pattern:?} is not a regex: {e}"))?,
            ),
            None => None,
        };
        Ok((parse_url(&self.url)?, Condition { status: self.status, json, body_regex }))
    }
}

fn parse_url(url: &str) -> Result<Target, String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| format!("url {url:?} has no scheme"))?;
    let https = match scheme.to_ascii_lowercase().as_str() {
        "http" => false,
        "https" => true,
        other => return Err(format!("url {url:?}: the scheme must be http or https, not {other}")),
    };
    let (authority, path_with_query) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_owned()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_owned()),
    };
    // A fragment is the client's, never sent.
    let path_with_query = path_with_query.split('#').next().unwrap_or("/").to_owned();
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("url {url:?} needs a host (and no user info)"));
    }
    Ok(Target { https, authority: authority.to_owned(), path_with_query })
}

/// What one poll saw: the thing the condition is about, in a few words.
#[derive(Debug)]
struct Observation {
    /// What changed-detection compares (no byte counts, no timings).
    state: String,
    /// Extra words for this poll's line only.
    note: String,
    holds: bool,
}

impl Condition {
    fn judge(&self, status: u16, body: &[u8], truncated: bool) -> Observation {
        let mut state = format!("status {status}");
        let mut holds = match self.status {
            Some(wanted) => status == wanted,
            None => (200..300).contains(&status),
        };
        if let Some((pointer, wanted)) = &self.json {
            let seen = match serde_json::from_slice::<Value>(body) {
                Ok(document) => match document.pointer(pointer) {
                    Some(value) => {
                        holds &= value == wanted;
                        format!("{pointer} = {}", shown(&value.to_string()))
                    }
                    None => {
                        holds = false;
                        format!("{pointer} missing")
                    }
                },
                Err(_) => {
                    holds = false;
                    "body is not JSON".to_owned()
                }
            };
            let _ = write!(state, ", {seen}");
        }
        if let Some(regex) = &self.body_regex {
            let text = String::from_utf8_lossy(body);
            let matched = regex.is_match(&text);
            holds &= matched;
            let _ = write!(state, ", body {} /{}/", if matched { "matches" } else { "does not match" }, regex.as_str());
        }
        let note = if truncated {
            format!("{} bytes (only the first {MAX_BODY_BYTES} read)", body.len())
        } else {
            format!("{} bytes", body.len())
        };
        Observation { state, note, holds }
    }
}

/// `text` cut to [`MAX_SHOWN_CHARS`] characters, on one line.
fn shown(text: &str) -> String {
    let mut out: String = text.chars().take(MAX_SHOWN_CHARS).map(|c| if c.is_control() { ' ' } else { c }).collect();
    if text.chars().count() > MAX_SHOWN_CHARS {
        out.push('…');
    }
    out
}

/// A wasi:http error in words, with the host's text when it gave one.
fn describe_error(error: &ErrorCode) -> String {
    match error {
        ErrorCode::InternalError(Some(text)) => shown(text),
        ErrorCode::DnsError(payload) => {
            format!("DNS error{}", payload.rcode.as_deref().map(|r| format!(" ({r})")).unwrap_or_default())
        }
        other => shown(&format!("{other:?}")),
    }
}

struct HttpWait;

impl Producer for HttpWait {
    const KIND: &'static str = "http_wait";
    const DESCRIPTION: &'static str = "Polls a URL (GET) every interval_ms until a condition holds: the status (any 2xx \
         unless `status` is given), a JSON field (`json_pointer` and `equals`) and/or a regex over the body \
         (`body_regex`). One line per poll; a line starting `changed:` whenever what it sees changes (start it with \
         notify_on {\"pattern\": \"^changed:\"} to be told). Completes when the condition holds; fails at \
         timeout_ms. Only origins the operator granted are reachable.";

    type Config = NoConfig;
    type Args = WaitArgs;
    type Task = WaitTask;

    fn label(_config: &NoConfig, args: &WaitArgs) -> Result<String, String> {
        args.check()?;
        Ok(format!("wait for {}", args.url))
    }

    fn run(_config: NoConfig, args: WaitArgs, _mode: RunMode) -> Result<WaitTask, String> {
        let (target, condition) = args.check()?;
        let start = time::now();
        Ok(WaitTask {
            target,
            condition,
            interval_ns: args.interval_ms * NANOS_PER_MILLI,
            start,
            deadline: start + args.timeout_ms * NANOS_PER_MILLI,
            timeout_ms: args.timeout_ms,
            state: RefCell::new(State { phase: Phase::Due(start), ..State::default() }),
        })
    }
}

/// One task. The plan is fixed at `run`; only `state` changes.
struct WaitTask {
    target: Target,
    condition: Condition,
    interval_ns: u64,
    start: Instant,
    deadline: Instant,
    timeout_ms: u64,
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    phase: Phase,
    /// Polls finished so far.
    polls: u32,
    /// What the previous poll saw (its `state`), for the `changed:` line.
    last_seen: Option<String>,
    cancelled: bool,
    output: OutputBuffer,
}

/// Where the current poll is. Field order is drop order: a stream before
/// its body, a body before its response.
#[derive(Default)]
enum Phase {
    /// The next poll starts at this instant.
    Due(Instant),
    /// The request is sent; its response is awaited.
    Requesting(FutureIncomingResponse),
    /// The response came; its body is being read.
    Reading(Box<Reading>),
    /// The task has its outcome.
    Ended(Outcome),
    /// Only while a transition is under way.
    #[default]
    Moving,
}

struct Reading {
    stream: InputStream,
    _body: IncomingBody,
    _response: IncomingResponse,
    status: u16,
    bytes: Vec<u8>,
}

/// What `advance` found.
enum Step {
    /// Moved on: look again.
    Again,
    /// Nothing to do until the phase's pollable is ready.
    Wait,
}

impl WaitTask {
    /// Moves the task on as far as it can go without waiting.
    fn advance(&self, state: &mut State) {
        loop {
            let now = time::now();
            let phase = core::mem::take(&mut state.phase);
            let (phase, step) = self.step(state, phase, now);
            state.phase = phase;
            if let Step::Wait = step {
                return;
            }
        }
    }

    fn step(&self, state: &mut State, phase: Phase, now: Instant) -> (Phase, Step) {
        if matches!(phase, Phase::Ended(_)) {
            return (phase, Step::Wait);
        }
        if state.cancelled {
            let detail = format!("cancelled after {} polls", state.polls);
            return (Phase::Ended(Outcome::killed().with_detail(detail)), Step::Again);
        }
        if now >= self.deadline {
            let _ = writeln!(state.output, "deadline: the condition did not hold within {} ms", self.timeout_ms);
            let detail = match &state.last_seen {
                Some(seen) => format!("timed out after {} polls; last seen: {seen}", state.polls),
                None => format!("timed out after {} polls", state.polls),
            };
            return (Phase::Ended(Outcome::failed().with_detail(detail)), Step::Again);
        }
        match phase {
            Phase::Due(at) if now < at => (Phase::Due(at), Step::Wait),
            Phase::Due(_) => match self.send(now) {
                Ok(future) => (Phase::Requesting(future), Step::Again),
                Err(error) => (self.observed_error(state, &describe_error(&error), now), Step::Again),
            },
            Phase::Requesting(future) => match future.get() {
                None => (Phase::Requesting(future), Step::Wait),
                Some(Ok(Ok(response))) => match Self::open_body(response) {
                    Ok(reading) => (Phase::Reading(Box::new(reading)), Step::Again),
                    Err(why) => (self.observed_error(state, why, now), Step::Again),
                },
                Some(Ok(Err(error))) => (self.observed_error(state, &describe_error(&error), now), Step::Again),
                Some(Err(())) => (self.observed_error(state, "the response was taken twice", now), Step::Again),
            },
            Phase::Reading(mut reading) => loop {
                if reading.bytes.len() >= MAX_BODY_BYTES {
                    break (self.observed(state, &reading, true, now), Step::Again);
                }
                let room = (MAX_BODY_BYTES - reading.bytes.len()) as u64;
                match reading.stream.read(room.min(READ_CHUNK_BYTES)) {
                    Ok(chunk) if chunk.is_empty() => break (Phase::Reading(reading), Step::Wait),
                    Ok(chunk) => reading.bytes.extend_from_slice(&chunk),
                    Err(StreamError::Closed) => break (self.observed(state, &reading, false, now), Step::Again),
                    Err(StreamError::LastOperationFailed(error)) => {
                        let why = match taskhost_plugin_sdk::wasip2::http::types::http_error_code(&error) {
                            Some(code) => describe_error(&code),
                            None => shown(&error.to_debug_string()),
                        };
                        break (self.observed_error(state, &format!("reading the body: {why}"), now), Step::Again);
                    }
                }
            },
            Phase::Ended(_) | Phase::Moving => unreachable!("handled above, or never left in place"),
        }
    }

    /// Sends one GET, asking the host to give up at the deadline.
    fn send(&self, now: Instant) -> Result<FutureIncomingResponse, ErrorCode> {
        let request = OutgoingRequest::new(taskhost_plugin_sdk::wasip2::http::types::Fields::new());
        let bad = |what: &str| ErrorCode::InternalError(Some(format!("the request's {what} was refused")));
        request.set_method(&Method::Get).map_err(|()| bad("method"))?;
        let scheme = if self.target.https { Scheme::Https } else { Scheme::Http };
        request.set_scheme(Some(&scheme)).map_err(|()| bad("scheme"))?;
        request.set_authority(Some(&self.target.authority)).map_err(|()| bad("authority"))?;
        request.set_path_with_query(Some(&self.target.path_with_query)).map_err(|()| bad("path"))?;
        let options = RequestOptions::new();
        let left = self.deadline.saturating_sub(now);
        // The host may not support a timeout; it bounds every request itself.
        let _ = options.set_first_byte_timeout(Some(left));
        let _ = options.set_between_bytes_timeout(Some(left));
        outgoing_handler::handle(request, Some(options))
    }

    fn open_body(response: IncomingResponse) -> Result<Reading, &'static str> {
        let status = response.status();
        let body = response.consume().map_err(|()| "the body was taken twice")?;
        let stream = body.stream().map_err(|()| "the body stream was taken twice")?;
        Ok(Reading { stream, _body: body, _response: response, status, bytes: Vec::new() })
    }

    /// A poll that got a response: its line, a `changed:` line if what it
    /// sees changed, and the next phase.
    fn observed(&self, state: &mut State, reading: &Reading, truncated: bool, now: Instant) -> Phase {
        let observation = self.condition.judge(reading.status, &reading.bytes, truncated);
        let verdict = if observation.holds { "holds" } else { "not yet" };
        self.record(state, observation.state, &format!("{}: {verdict}", observation.note), now);
        if observation.holds {
            let detail = format!("condition held at poll {}", state.polls);
            return Phase::Ended(Outcome::completed().with_detail(detail));
        }
        self.next_poll(state, now)
    }

    /// A poll that got no response: the error is what it saw.
    fn observed_error(&self, state: &mut State, error: &str, now: Instant) -> Phase {
        self.record(state, format!("error: {error}"), "not yet", now);
        self.next_poll(state, now)
    }

    fn record(&self, state: &mut State, seen: String, note: &str, now: Instant) {
        state.polls += 1;
        let elapsed_ms = now.saturating_sub(self.start) / NANOS_PER_MILLI;
        let _ = writeln!(state.output, "poll {} at {elapsed_ms} ms: {seen}, {note}", state.polls);
        if let Some(previous) = state.last_seen.as_ref().filter(|previous| **previous != seen) {
            let _ = writeln!(state.output, "changed: {previous} -> {seen}");
        }
        state.last_seen = Some(seen);
    }

    /// The next poll: due `polls * interval` after the start, or now if a
    /// slow poll made it late.
    fn next_poll(&self, state: &State, now: Instant) -> Phase {
        let due = self.start.saturating_add(u64::from(state.polls).saturating_mul(self.interval_ns));
        Phase::Due(due.max(now))
    }
}

impl Task for WaitTask {
    fn cancel(&self, _reason: Option<String>) {
        // Only a flag: the host holds a pollable that may be a child of the
        // request in flight, so nothing is dropped until `subscribe`/`done`.
        self.state.borrow_mut().cancelled = true;
    }

    fn subscribe(&self) -> Pollable {
        let mut state = self.state.borrow_mut();
        self.advance(&mut state);
        match &state.phase {
            Phase::Due(at) => time::at((*at).min(self.deadline)),
            Phase::Requesting(future) => future.subscribe().into(),
            Phase::Reading(reading) => reading.stream.subscribe().into(),
            Phase::Ended(_) | Phase::Moving => time::ready_now(),
        }
    }

    fn done(&self) -> Option<Outcome> {
        let mut state = self.state.borrow_mut();
        self.advance(&mut state);
        match &state.phase {
            Phase::Ended(outcome) => Some(outcome.clone()),
            _ => None,
        }
    }

    fn read_output(&self) -> String {
        self.state.borrow_mut().output.take()
    }
}

taskhost_plugin_sdk::export_producer!(HttpWait);

// The condition and URL handling are pure, so they are tested natively:
// `cargo test --manifest-path plugins/Cargo.toml -p http-wait`.
#[cfg(test)]
mod tests {
    use super::*;

    fn condition(status: Option<u16>, json: Option<(&str, Value)>, regex: Option<&str>) -> Condition {
        Condition {
            status,
            json: json.map(|(p, v)| (p.to_owned(), v)),
            body_regex: regex.map(|r| regex_lite::Regex::new(r).unwrap()),
        }
    }

    #[test]
    fn without_a_status_any_2xx_holds() {
        let any = condition(None, None, None);
        assert!(any.judge(204, b"", false).holds);
        assert!(!any.judge(503, b"", false).holds);
        assert_eq!(any.judge(503, b"down", false).state, "status 503");
        assert!(condition(Some(404), None, None).judge(404, b"", false).holds);
    }

    #[test]
    fn a_json_field_must_equal_the_value() {
        let green = condition(None, Some(("/run/state", Value::from("green"))), None);
        let seen = green.judge(200, br#"{"run":{"state":"pending"}}"#, false);
        assert!(!seen.holds);
        assert_eq!(seen.state, r#"status 200, /run/state = "pending""#);
        assert!(green.judge(200, br#"{"run":{"state":"green"}}"#, false).holds);
        assert_eq!(green.judge(200, b"<html>", false).state, "status 200, body is not JSON");
        assert_eq!(green.judge(200, b"{}", false).state, "status 200, /run/state missing");
        assert!(!green.judge(500, br#"{"run":{"state":"green"}}"#, false).holds);
    }

    #[test]
    fn a_regex_must_match_the_body() {
        let ready = condition(None, None, Some("ready: (yes|true)"));
        assert!(ready.judge(200, b"status\nready: yes\n", false).holds);
        let seen = ready.judge(200, b"ready: no", false);
        assert!(!seen.holds);
        assert_eq!(seen.state, "status 200, body does not match /ready: (yes|true)/");
    }

    #[test]
    fn urls_split_into_scheme_authority_and_path() {
        let t = parse_url("https://ci.example.com:8443/api/runs/7?x=1#frag").unwrap();
        assert!(t.https);
        assert_eq!((t.authority.as_str(), t.path_with_query.as_str()), ("ci.example.com:8443", "/api/runs/7?x=1"));
        let t = parse_url("http://127.0.0.1:9").unwrap();
        assert_eq!(t.path_with_query, "/");
        assert_eq!(parse_url("http://h?q=1").unwrap().path_with_query, "/?q=1");
        assert!(parse_url("ftp://h/").is_err());
        assert!(parse_url("http://user@h/").is_err());
        assert!(parse_url("h/path").is_err());
    }

    #[test]
    fn long_values_are_cut_to_one_line() {
        let long = "x".repeat(500);
        assert_eq!(shown(&long).chars().count(), MAX_SHOWN_CHARS + 1);
        assert_eq!(shown("a\nb"), "a b");
    }
}
