//! The JSON-RPC gate every client message passes before rmcp sees it, on
//! stdio and on HTTP alike.
//!
//! rmcp drops what it cannot deserialize (a client then waits forever),
//! answers some shapes without their `id`, and files a known method with
//! malformed params under "method not found". The gate decides instead, so
//! that every request gets exactly one answer carrying its id:
//!
//! - `-32700` (id `null`): not JSON — bad syntax, invalid UTF-8 (also inside
//!   a string), a lone surrogate escape, nesting deeper than [`MAX_DEPTH`].
//! - `-32600`: JSON that is not a JSON-RPC 2.0 message (a batch, a
//!   non-object, a wrong `jsonrpc`, a `method` that is not a string, an `id`
//!   that is not a string or an integer), with the id whenever it is readable.
//! - `-32601`: a method this server does not implement.
//! - `-32602`: a known method whose params are malformed; the message names
//!   the field (`params.arguments must be an object ...`).
//!
//! What passes is converted to rmcp's own message type here, so rmcp never
//! receives a message it would drop.

use rmcp::model::ClientJsonRpcMessage;
use serde_json::Value;

/// The deepest nesting of arrays and objects accepted in one message.
/// Tool arguments are flat records in practice; serde_json itself stops at
/// 128, and a depth cap checked before parsing bounds the work per message.
pub const MAX_DEPTH: usize = 64;

pub const PARSE_ERROR: i32 = -32700;
pub const INVALID_REQUEST: i32 = -32600;
pub const METHOD_NOT_FOUND: i32 = -32601;
pub const INVALID_PARAMS: i32 = -32602;
pub const INTERNAL_ERROR: i32 = -32603;
/// A per-connection bound was hit (requests in flight, connections); the
/// message names the bound.
pub const LIMIT_EXCEEDED: i32 = -32000;

/// The methods rmcp implements for a server, plus the 2025-11-25 tasks
/// methods the bridge answers ([`super::tasks_v1`]).
const KNOWN_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "tools/list",
    "tools/call",
    "tasks/get",
    "tasks/result",
    "tasks/list",
    "tasks/cancel",
    "tasks/update",
    "completion/complete",
    "logging/setLevel",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "resources/directory/read",
    "subscriptions/listen",
    "skills/list",
    "skills/get",
];

/// A JSON-RPC error answer built by the gate.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// The request's id, or `null` when it could not be read.
    pub id: Value,
    pub code: i32,
    pub message: String,
}

impl Rejection {
    pub fn new(id: Value, code: i32, message: impl Into<String>) -> Self {
        Self { id, code, message: message.into() }
    }

    pub fn to_value(&self) -> Value {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {"code": self.code, "message": self.message},
        })
    }

    /// The answer as one newline-terminated line.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(&self.to_value()).expect("a JSON value serializes");
        line.push(b'\n');
        line
    }
}

/// A message that passed the gate.
#[derive(Debug)]
pub enum Checked {
    Request {
        id: Value,
        method: String,
        message: Value,
    },
    Notification {
        method: String,
        message: Value,
    },
    /// A response or error from the client (to a server request).
    Response {
        message: Value,
    },
}

/// Checks one message (a stdio line without its newline, an HTTP body).
pub fn check(bytes: &[u8]) -> Result<Checked, Rejection> {
    if nesting_exceeds(bytes, MAX_DEPTH) {
        return Err(Rejection::new(
            Value::Null,
            PARSE_ERROR,
            format!("Parse error: the message nests arrays/objects deeper than {MAX_DEPTH} levels; flatten it"),
        ));
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|error| {
        Rejection::new(
            Value::Null,
            PARSE_ERROR,
            format!(
                "Parse error: the message is not valid JSON ({error}); it was ignored. \
                 Send one UTF-8 JSON-RPC message per line."
            ),
        )
    })?;
    let Value::Object(object) = &value else {
        let what = if value.is_array() {
            "a batch (JSON array); batches are not supported, send one message at a time".to_string()
        } else {
            format!("{}, not a JSON-RPC object", kind(&value))
        };
        return Err(Rejection::new(Value::Null, INVALID_REQUEST, format!("Invalid request: the message is {what}")));
    };
    // The id is echoed whenever it is a valid one, whatever else is wrong.
    let id = match object.get("id") {
        None => None,
        Some(id @ Value::String(_)) => Some(id.clone()),
        Some(Value::Number(number)) if number.is_i64() => Some(Value::Number(number.clone())),
        Some(other) => {
            let echoed = if other.is_number() { other.clone() } else { Value::Null };
            // A client error report without an id is a response, not a request.
            if !(other.is_null() && object.contains_key("error") && !object.contains_key("method")) {
                return Err(Rejection::new(
                    echoed,
                    INVALID_REQUEST,
                    format!("Invalid request: id must be a string or an integer, got {}", kind(other)),
                ));
            }
            None
        }
    };
    let echo = id.clone().unwrap_or(Value::Null);
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(Rejection::new(echo, INVALID_REQUEST, "Invalid request: \"jsonrpc\" must be \"2.0\""));
    }
    let Some(method) = object.get("method") else {
        if object.contains_key("result") || object.contains_key("error") {
            return Ok(Checked::Response { message: value });
        }
        return Err(Rejection::new(
            echo,
            INVALID_REQUEST,
            "Invalid request: a message needs a \"method\" (request or notification) \
             or a \"result\"/\"error\" (response)",
        ));
    };
    let Some(method) = method.as_str().map(str::to_string) else {
        return Err(Rejection::new(
            echo,
            INVALID_REQUEST,
            format!("Invalid request: \"method\" must be a string, got {}", kind(method)),
        ));
    };
    let Some(id) = id else {
        return Ok(Checked::Notification { method, message: value });
    };
    if !KNOWN_METHODS.contains(&method.as_str()) {
        return Err(Rejection::new(
            id,
            METHOD_NOT_FOUND,
            format!(
                "Method not found: {method:?}; this server implements initialize, ping, tools/list, tools/call and tasks/*"
            ),
        ));
    }
    check_params(&method, object.get("params").filter(|params| !params.is_null())).map_err(|message| {
        Rejection::new(id.clone(), INVALID_PARAMS, format!("Invalid params for {method}: {message}"))
    })?;
    Ok(Checked::Request { id, method, message: value })
}

/// Converts a checked message to rmcp's type. A request rmcp still cannot
/// read is answered here (`-32602`, its id) rather than dropped there.
pub fn to_rmcp(checked_id: Option<&Value>, method: &str, message: Value) -> Result<ClientJsonRpcMessage, Rejection> {
    serde_json::from_value(message).map_err(|error| {
        Rejection::new(
            checked_id.cloned().unwrap_or(Value::Null),
            INVALID_PARAMS,
            format!("Invalid params for {method}: {error}"),
        )
    })
}

/// Field-level checks of the methods clients get wrong most, with messages
/// that say what to send instead.
fn check_params(method: &str, params: Option<&Value>) -> Result<(), String> {
    let object = match params {
        None => None,
        Some(Value::Object(object)) => Some(object),
        Some(other) => return Err(format!("params must be an object, got {}", kind(other))),
    };
    let required = |field: &str, what: &str| -> Result<(), String> {
        let Some(object) = object else {
            return Err(format!("params is missing; send params.{field} ({what})"));
        };
        match object.get(field) {
            None | Some(Value::Null) => Err(format!("params.{field} is missing; give {what}")),
            Some(Value::String(_)) => Ok(()),
            Some(other) => Err(format!("params.{field} must be a string ({what}), got {}", kind(other))),
        }
    };
    let optional_object = |field: &str, what: &str| -> Result<(), String> {
        match object.and_then(|object| object.get(field)) {
            None | Some(Value::Null) | Some(Value::Object(_)) => Ok(()),
            Some(other) => Err(format!("params.{field} must be an object ({what}), got {}", kind(other))),
        }
    };
    let optional_string = |field: &str| -> Result<(), String> {
        match object.and_then(|object| object.get(field)) {
            None | Some(Value::Null) | Some(Value::String(_)) => Ok(()),
            Some(other) => Err(format!("params.{field} must be a string, got {}", kind(other))),
        }
    };
    match method {
        "tools/call" => {
            required("name", "the tool's name as a string")?;
            optional_object("arguments", "the tool's arguments by name")?;
            optional_object("task", "task metadata such as {\"ttl\": 60000}")
        }
        "tasks/get" | "tasks/result" | "tasks/cancel" => required("taskId", "the task's id as a string"),
        "tools/list" | "tasks/list" | "prompts/list" | "resources/list" | "resources/templates/list" => {
            optional_string("cursor")
        }
        "initialize" => {
            required("protocolVersion", "the protocol version the client speaks, like \"2025-11-25\"")?;
            if object.is_some_and(|object| !object.get("capabilities").is_some_and(Value::is_object)) {
                return Err("params.capabilities must be an object (may be empty)".into());
            }
            if object.is_some_and(|object| !object.get("clientInfo").is_some_and(Value::is_object)) {
                return Err("params.clientInfo must be an object like {\"name\": ..., \"version\": ...}".into());
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Whether arrays/objects nest deeper than `limit`, by a scan that skips
/// strings (a `[` inside a string is not nesting). Cheap, and runs before
/// any parser recursion.
fn nesting_exceeds(bytes: &[u8], limit: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &byte in bytes {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rejected(bytes: &[u8]) -> Rejection {
        check(bytes).expect_err("rejected")
    }

    #[test]
    fn unparsable_messages_are_parse_errors_with_a_null_id() {
        for bytes in [
            &b"not json"[..],
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"x\":\"\xff\xfe\"}",
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"\ud800"}}"#,
        ] {
            let rejection = rejected(bytes);
            assert_eq!((rejection.id.clone(), rejection.code), (Value::Null, PARSE_ERROR), "{rejection:?}");
        }
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let rejection = rejected(deep.as_bytes());
        assert_eq!(rejection.code, PARSE_ERROR);
        assert!(rejection.message.contains("deeper than 64 levels"), "{}", rejection.message);
        // Brackets inside strings are not nesting.
        let text = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"s":"{}"}}}}"#, "[".repeat(200));
        assert!(check(text.as_bytes()).is_ok());
    }

    #[test]
    fn invalid_requests_keep_their_readable_id() {
        let rejection = rejected(br#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#);
        assert_eq!((rejection.id, rejection.code), (json!(7), INVALID_REQUEST));
        let rejection = rejected(br#"{"jsonrpc":"2.0","id":"a","method":5}"#);
        assert_eq!((rejection.id, rejection.code), (json!("a"), INVALID_REQUEST));
        let rejection = rejected(br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#);
        assert_eq!((rejection.id, rejection.code), (Value::Null, INVALID_REQUEST));
        assert!(rejection.message.contains("batches are not supported"));
        let rejection = rejected(br#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#);
        assert_eq!((rejection.id, rejection.code), (Value::Null, INVALID_REQUEST));
    }

    #[test]
    fn malformed_params_name_the_field() {
        let cases = [
            (json!({"name": "bash", "arguments": [1]}), "params.arguments must be an object"),
            (json!({"name": "bash", "arguments": "x"}), "params.arguments must be an object"),
            (json!({"name": 5}), "params.name must be a string"),
            (json!({"arguments": {}}), "params.name is missing"),
        ];
        for (params, expected) in cases {
            let message = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params});
            let rejection = rejected(message.to_string().as_bytes());
            assert_eq!((rejection.id, rejection.code), (json!(3), INVALID_PARAMS));
            assert!(rejection.message.contains(expected), "{}", rejection.message);
        }
        let rejection = rejected(br#"{"jsonrpc":"2.0","id":4,"method":"tools/call"}"#);
        assert!(rejection.message.contains("params is missing"), "{}", rejection.message);
        let rejection = rejected(br#"{"jsonrpc":"2.0","id":4,"method":"nope/nope","params":{}}"#);
        assert_eq!((rejection.id, rejection.code), (json!(4), METHOD_NOT_FOUND));
    }

    #[test]
    fn well_formed_messages_pass_and_convert() {
        let Checked::Request { id, method, message } =
            check(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).unwrap()
        else {
            panic!("a request")
        };
        assert_eq!((id.clone(), method.as_str()), (json!(1), "tools/list"));
        to_rmcp(Some(&id), &method, message).unwrap();
        assert!(matches!(
            check(br#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#).unwrap(),
            Checked::Notification { .. }
        ));
        assert!(matches!(check(br#"{"jsonrpc":"2.0","id":9,"result":{}}"#).unwrap(), Checked::Response { .. }));
    }
}
