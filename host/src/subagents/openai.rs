//! The `openai` backend: an OpenAI-compatible chat-completions agent loop
//! (OpenAI, DeepSeek, local servers).
//!
//! Model: the child starts from `[system?, user(prompt)]` and the host's
//! tools (the allowlist of the config) as `tools`. Each turn is one
//! `POST <base_url>/chat/completions`; an assistant message with
//! `tool_calls` makes the child call those host tools as its own agent
//! ([`ChildContext::call_tool`]) and append one `tool` message per call; any
//! other answer ends the run, mapped from `finish_reason` (`stop` →
//! completed, `length` → max-tokens, `content_filter` or a `refusal` →
//! refusal, anything else → other). After `max_turns` requests the run stops
//! as `other(max-turns)`.
//!
//! Invariants:
//! - The wire types are hand-written and keep every field they do not name
//!   (`#[serde(flatten)] extra`): an assistant message goes back into the
//!   history exactly as it came, so provider fields such as DeepSeek's
//!   `reasoning_content` are echoed as those APIs require.
//! - A non-success HTTP status ends the run as `error` with the status and
//!   an excerpt of the body; transport and decoding failures likewise.
//! - Cancellation drops the in-flight request (the connection is closed)
//!   and ends the run `aborted` at once.
//! - The API key is read from the named environment variable at each run
//!   and is never logged.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::config::OpenAiConfig;
use super::{Backend, ChildContext, RunResult, StopReason};

/// One chat message, as sent and as received.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Message {
    pub role: String,
    /// Text (or an array of content parts); `null` on a tool-calling turn.
    #[serde(default)]
    pub content: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Every other field (`reasoning_content`, `refusal`, `name`, ...), kept
    /// and sent back verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Message {
    fn text(role: &str, text: &str) -> Self {
        Self { role: role.into(), content: Some(Value::String(text.into())), ..Self::default() }
    }

    /// The text of `content`: the string, or the text parts joined.
    pub fn content_text(&self) -> String {
        match &self.content {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Array(parts)) => {
                parts.iter().filter_map(|part| part.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("")
            }
            _ => String::new(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text of the arguments.
    #[serde(default)]
    pub arguments: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: &'a [Message],
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct ChatResponse {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(flatten)]
    _extra: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    message: Message,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(flatten)]
    _extra: Map<String, Value>,
}

pub struct OpenAiBackend {
    config: OpenAiConfig,
    http: reqwest::Client,
    endpoint: String,
}

impl OpenAiBackend {
    pub fn new(config: OpenAiConfig) -> anyhow::Result<Self> {
        let http = crate::http_client::builder()
            .timeout(Duration::from_millis(config.request_timeout_ms))
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the HTTP client: {e}"))?;
        let endpoint = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        Ok(Self { config, http, endpoint })
    }

    async fn turn(&self, key: Option<&str>, messages: &[Message], tools: &[Value]) -> Result<Choice, String> {
        let body = ChatRequest {
            model: &self.config.model,
            messages,
            tools: tools.to_vec(),
            max_tokens: self.config.max_tokens,
        };
        let mut request = self.http.post(&self.endpoint).json(&body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| format!("request to {} failed: {e}", self.endpoint))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| format!("reading the response failed ({status}): {e}"))?;
        if !status.is_success() {
            return Err(format!("HTTP {status} from {}: {}", self.endpoint, excerpt(&text, 500)));
        }
        let parsed: ChatResponse = serde_json::from_str(&text)
            .map_err(|e| format!("invalid chat-completions response ({e}): {}", excerpt(&text, 300)))?;
        parsed.choices.into_iter().next().ok_or_else(|| format!("response without choices: {}", excerpt(&text, 300)))
    }
}

/// The first `max` characters of `text`, marked when cut.
fn excerpt(text: &str, max: usize) -> String {
    let mut out: String = text.chars().take(max).collect();
    if out.len() < text.len() {
        out.push('…');
    }
    out
}

/// Maps a final (non-tool-calling) assistant answer to a run result.
fn final_result(message: &Message, finish_reason: Option<&str>) -> RunResult {
    let text = message.content_text();
    if let Some(refusal) = message.extra.get("refusal").and_then(Value::as_str) {
        return RunResult::stopped(if text.is_empty() { refusal.to_string() } else { text }, StopReason::Refusal);
    }
    let reason = match finish_reason {
        None | Some("stop") => StopReason::Completed,
        Some("length") => StopReason::MaxTokens,
        Some("content_filter") => StopReason::Refusal,
        Some(other) => StopReason::Other(other.to_string()),
    };
    RunResult::stopped(text, reason)
}

#[async_trait::async_trait]
impl Backend for OpenAiBackend {
    fn kind(&self) -> &'static str {
        "openai"
    }

    async fn run(&self, child: ChildContext) -> RunResult {
        let key = match &self.config.api_key_env {
            None => None,
            Some(var) => match std::env::var(var) {
                Ok(key) if !key.is_empty() => Some(key),
                _ => return RunResult::error(format!("the API key variable {var} is not set")),
            },
        };
        let definitions = child.tool_definitions(self.config.tools.as_deref());
        let tools: Vec<Value> = definitions
            .iter()
            .map(|d| {
                json!({"type": "function", "function": {
                    "name": d.name, "description": d.description, "parameters": d.input_schema,
                }})
            })
            .collect();
        let mut messages = Vec::new();
        if let Some(system) = &self.config.system_prompt {
            messages.push(Message::text("system", system));
        }
        messages.push(Message::text("user", &child.prompt));
        let mut last_text = String::new();
        for turn in 1..=self.config.max_turns {
            let choice = tokio::select! {
                choice = self.turn(key.as_deref(), &messages, &tools) => choice,
                () = child.cancelled() => return RunResult::aborted(None),
            };
            let choice = match choice {
                Ok(choice) => choice,
                Err(detail) => {
                    return RunResult { text: last_text, stop_reason: StopReason::Error, detail: Some(detail) };
                }
            };
            tracing::debug!(turn, finish_reason = ?choice.finish_reason, tool_calls = choice.message.tool_calls.len(), "model turn");
            last_text = choice.message.content_text();
            let calls = choice.message.tool_calls.clone();
            if calls.is_empty() {
                return final_result(&choice.message, choice.finish_reason.as_deref());
            }
            // The assistant message goes back verbatim, unknown fields included.
            messages.push(choice.message);
            for call in calls {
                let allowed = definitions.iter().any(|d| d.name == call.function.name);
                let content = if !allowed {
                    format!("ERROR: tool {:?} is not available to this agent", call.function.name)
                } else {
                    let args = if call.function.arguments.trim().is_empty() {
                        Ok(json!({}))
                    } else {
                        serde_json::from_str::<Value>(&call.function.arguments)
                    };
                    match args {
                        Err(e) => format!("ERROR: the arguments are not valid JSON: {e}"),
                        Ok(args) => tokio::select! {
                            result = child.call_tool(&call.function.name, args) => match result {
                                Ok(output) if output.is_error => format!("ERROR: {}", output.text),
                                Ok(output) => output.text,
                                Err(error) => format!("ERROR: {error}"),
                            },
                            () = child.cancelled() => return RunResult::aborted(None),
                        },
                    }
                };
                tracing::debug!(tool = %call.function.name, "child tool call answered");
                messages.push(Message {
                    role: "tool".into(),
                    content: Some(Value::String(content)),
                    tool_call_id: Some(call.id),
                    ..Message::default()
                });
            }
        }
        RunResult {
            text: last_text,
            stop_reason: StopReason::Other("max-turns".into()),
            detail: Some(format!("stopped after {} model requests", self.config.max_turns)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_survive_a_round_trip() {
        let wire = json!({
            "role": "assistant", "content": null, "reasoning_content": "think",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}, "index": 0}]
        });
        let message: Message = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(message.extra["reasoning_content"], "think");
        assert_eq!(serde_json::to_value(&message).unwrap(), wire);
    }

    #[test]
    fn finish_reasons_map_to_stop_reasons() {
        let m = Message::text("assistant", "hi");
        assert_eq!(final_result(&m, Some("stop")).stop_reason, StopReason::Completed);
        assert_eq!(final_result(&m, Some("length")).stop_reason, StopReason::MaxTokens);
        assert_eq!(final_result(&m, Some("content_filter")).stop_reason, StopReason::Refusal);
        assert_eq!(
            final_result(&m, Some("insufficient_system_resource")).stop_reason.as_str(),
            "insufficient_system_resource"
        );
        let mut refused = Message::text("assistant", "");
        refused.extra.insert("refusal".into(), json!("no"));
        assert_eq!(final_result(&refused, Some("stop")), RunResult::stopped("no", StopReason::Refusal));
    }
}
