//! The standard MCP headers over HTTP (SEP-2243): `Mcp-Method` mirrors the
//! JSON-RPC method and `Mcp-Name` the request's name (a tool's or prompt's
//! `params.name`, a resource's `params.uri`, a task's `params.taskId`), so a
//! load balancer or gateway can route without reading the body. A request
//! whose headers disagree with its body is refused: an intermediary routed
//! it on a name the server would not act on.
//!
//! Invariants: headers are optional (clients that predate them are
//! served); present, they must match exactly, after the `=?base64?…?=`
//! decoding the SEP defines for values that are not plain ASCII.

use axum::http::HeaderMap;
use base64::Engine as _;
use serde_json::Value;

/// The JSON-RPC error code of a header that disagrees with the body.
pub const HEADER_MISMATCH: i32 = -32001;

/// The name `Mcp-Name` mirrors for `method`, if it has one.
fn named(method: &str, message: &Value) -> Option<String> {
    let params = &message["params"];
    let field = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => "uri",
        "tasks/get" | "tasks/result" | "tasks/cancel" => "taskId",
        _ => return None,
    };
    params[field].as_str().map(str::to_string)
}

/// A header's value, decoded when it is a `=?base64?…?=` sentinel.
fn decoded(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?;
    match text.strip_prefix("=?base64?").and_then(|rest| rest.strip_suffix("?=")) {
        Some(encoded) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(text.to_string()),
    }
}

/// Checks `Mcp-Method` and `Mcp-Name` against the request; the refusal
/// names the header and both values.
pub fn check(headers: &HeaderMap, method: &str, message: &Value) -> Result<(), String> {
    if let Some(header) = headers.get("mcp-method") {
        let value = decoded(header.as_bytes());
        if value.as_deref() != Some(method) {
            return Err(format!(
                "Header mismatch: Mcp-Method is {:?} but the request's method is {method:?}",
                value.unwrap_or_default()
            ));
        }
    }
    if let Some(header) = headers.get("mcp-name") {
        let value = decoded(header.as_bytes());
        let body = named(method, message);
        if body.is_none() || value != body {
            return Err(format!(
                "Header mismatch: Mcp-Name is {:?} but the request names {:?}",
                value.unwrap_or_default(),
                body.unwrap_or_default()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn matching_or_missing_headers_pass_and_mismatches_are_named() {
        let call = json!({"params": {"name": "bash"}});
        assert!(check(&HeaderMap::new(), "tools/call", &call).is_ok());
        assert!(check(&headers(&[("mcp-method", "tools/call"), ("mcp-name", "bash")]), "tools/call", &call).is_ok());
        let error = check(&headers(&[("mcp-name", "ticker")]), "tools/call", &call).unwrap_err();
        assert!(error.contains("Mcp-Name is \"ticker\"") && error.contains("\"bash\""), "{error}");
        let error = check(&headers(&[("mcp-method", "tools/list")]), "tools/call", &call).unwrap_err();
        assert!(error.contains("Mcp-Method"), "{error}");
        let task = json!({"params": {"taskId": "bash-7"}});
        assert!(check(&headers(&[("mcp-name", "bash-7")]), "tasks/get", &task).is_ok());
        assert!(check(&headers(&[("mcp-name", "bash-8")]), "tasks/get", &task).is_err());
        // A name a method has none of is a mismatch too.
        assert!(check(&headers(&[("mcp-name", "x")]), "tools/list", &json!({})).is_err());
    }

    #[test]
    fn base64_values_are_decoded() {
        let unicode = json!({"params": {"name": "tööl"}});
        let encoded = format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode("tööl"));
        assert!(check(&headers(&[("mcp-name", encoded.as_str())]), "tools/call", &unicode).is_ok());
    }
}
