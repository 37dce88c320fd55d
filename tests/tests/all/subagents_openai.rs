//! The `openai` subagent backend against a chat-completions server started
//! in the test (axum on 127.0.0.1:0): a tool-call round in which the child
//! calls a host tool as itself, `reasoning_content` echoed back, the API key
//! from the named variable, an error status, max turns, and a slow reply
//! cancelled mid-request.

use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use taskhost::Host;
use taskhost::native::ticker::TickerProducer;
use taskhost::settings::TasksSettings;
use taskhost::subagents::config::SubagentsConfig;
use taskhost::subagents::{StartRequest, StopReason, Subagents};

const KEY_VAR: &str = "TASKHOST_TEST_OPENAI_KEY";

fn set_key() {
    static ONCE: Once = Once::new();
    // SAFETY: set once, before any test of this binary starts a request.
    ONCE.call_once(|| unsafe { std::env::set_var(KEY_VAR, "sk-test-123") });
}

/// What the fake server does with a request (by scenario), and what it saw.
#[derive(Clone)]
struct Server {
    scenario: &'static str,
    seen: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
    in_flight_dropped: Arc<Mutex<bool>>,
}

struct DropFlag(Arc<Mutex<bool>>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = true;
    }
}

async fn completions(State(server): State<Server>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    let turn = {
        let mut seen = server.seen.lock().unwrap();
        seen.push((headers, body.clone()));
        seen.len()
    };
    match (server.scenario, turn) {
        ("tools", 1) => Json(json!({
            "id": "r1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null, "reasoning_content": "I should tick twice.",
                "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "ticker", "arguments": "{\"count\": 2, \"interval_ms\": 5, \"message\": \"beat\"}"}}]
            }}],
            "usage": {"prompt_tokens": 1}
        }))
        .into_response(),
        ("tools", _) => Json(json!({
            "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": "The ticker beat twice.", "reasoning_content": "done"}}]
        }))
        .into_response(),
        ("error", _) => (StatusCode::SERVICE_UNAVAILABLE, "{\"error\":{\"message\":\"server overloaded\"}}").into_response(),
        ("length", _) => Json(json!({
            "choices": [{"finish_reason": "length", "message": {"role": "assistant", "content": "cut sho"}}]
        }))
        .into_response(),
        ("loop", _) => Json(json!({
            "choices": [{"finish_reason": "tool_calls", "message": {"role": "assistant", "content": "again",
                "tool_calls": [{"id": format!("c{turn}"), "type": "function", "function": {"name": "no_such_tool", "arguments": "{}"}}]}}]
        }))
        .into_response(),
        ("slow", _) => {
            let _flag = DropFlag(server.in_flight_dropped.clone());
            tokio::time::sleep(Duration::from_secs(60)).await;
            Json(json!({"choices": []})).into_response()
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn serve(scenario: &'static str) -> (String, Server) {
    let server = Server { scenario, seen: Arc::default(), in_flight_dropped: Arc::default() };
    let app =
        axum::Router::new().route("/v1/chat/completions", axum::routing::post(completions)).with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/v1"), server)
}

fn host_and_subagents(base_url: &str, extra: &str) -> (Host, Subagents) {
    set_key();
    let host = Host::new(&TasksSettings::default()).unwrap();
    host.add_producer_named("ticker", Arc::new(TickerProducer::new(&json!({})).unwrap())).expect("tool name is valid");
    let config: SubagentsConfig = toml::from_str(&format!(
        "[backends.llm]\nkind = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"test-model\"\n\
         api_key_env = \"{KEY_VAR}\"\nsystem_prompt = \"You are a child.\"\n{extra}"
    ))
    .unwrap();
    let subagents = Subagents::for_host(&host, &config).unwrap();
    (host, subagents)
}

fn request(prompt: &str) -> StartRequest {
    StartRequest { description: "test child".into(), prompt: prompt.into(), profile: Some("llm".into()) }
}

#[tokio::test]
async fn a_tool_call_round_echoes_reasoning_content_and_runs_the_tool_as_the_child() {
    let (url, server) = serve("tools").await;
    let (host, subagents) = host_and_subagents(&url, "");
    let run = subagents.start(request("tick twice")).unwrap();
    let child = run.child().clone();
    let result = tokio::time::timeout(Duration::from_secs(20), run.wait_result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
    assert_eq!(result.text, "The ticker beat twice.");
    run.dispose().await;
    assert!(host.agents().get(child.id()).is_none(), "the child agent was disposed");

    let seen = server.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    let (headers, first) = &seen[0];
    assert_eq!(headers["authorization"], "Bearer sk-test-123");
    assert_eq!(first["model"], "test-model");
    assert_eq!(first["messages"][0], json!({"role": "system", "content": "You are a child."}));
    assert_eq!(first["messages"][1], json!({"role": "user", "content": "tick twice"}));
    let tools: Vec<&str> =
        first["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert!(tools.contains(&"ticker") && tools.contains(&"task_output"), "{tools:?}");

    let (_, second) = &seen[1];
    let assistant = &second["messages"][2];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(assistant["reasoning_content"], "I should tick twice.", "unknown fields are sent back");
    assert_eq!(assistant["content"], Value::Null);
    assert_eq!(assistant["tool_calls"][0]["id"], "call_1");
    let tool = &second["messages"][3];
    assert_eq!(tool["role"], "tool");
    assert_eq!(tool["tool_call_id"], "call_1");
    assert_eq!(tool["content"], "beat 1\nbeat 2\n[status: completed, ticks: 2]");
    host.dispose().await;
}

#[tokio::test]
async fn an_error_status_ends_the_run_as_error_with_status_and_body() {
    let (url, _server) = serve("error").await;
    let (host, subagents) = host_and_subagents(&url, "");
    let run = subagents.start(request("anything")).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(20), run.wait_result()).await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Error);
    let detail = result.detail.unwrap();
    assert!(detail.contains("503") && detail.contains("server overloaded"), "{detail}");
    run.dispose().await;
    host.dispose().await;
}

#[tokio::test]
async fn length_maps_to_max_tokens_and_endless_tool_calls_stop_at_max_turns() {
    let (url, _server) = serve("length").await;
    let (host, subagents) = host_and_subagents(&url, "");
    let result = subagents.start(request("x")).unwrap().wait_result().await;
    assert_eq!((result.stop_reason, result.text.as_str()), (StopReason::MaxTokens, "cut sho"));
    host.dispose().await;

    let (url, server) = serve("loop").await;
    let (host, subagents) = host_and_subagents(&url, "max_turns = 3");
    let result = subagents.start(request("x")).unwrap().wait_result().await;
    assert_eq!(result.stop_reason, StopReason::Other("max-turns".into()), "{result:?}");
    let seen = server.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    let refused = &seen[2].1["messages"][5];
    assert_eq!(refused["role"], "tool");
    assert!(refused["content"].as_str().unwrap().contains("not available"), "{refused}");
    host.dispose().await;
}

#[tokio::test]
async fn cancelling_a_slow_reply_aborts_the_request_at_once() {
    let (url, server) = serve("slow").await;
    let (host, subagents) = host_and_subagents(&url, "");
    let run = subagents.start(request("take your time")).unwrap();
    for _ in 0..200 {
        if !server.seen.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(server.seen.lock().unwrap().len(), 1, "the request is in flight");
    let started = Instant::now();
    run.cancel(Some("parent moved on".into()));
    let result = tokio::time::timeout(Duration::from_secs(5), run.wait_result()).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert_eq!(result.detail.as_deref(), Some("parent moved on"));
    run.dispose().await;
    assert!(run.is_released());
    // The server sees the connection go away and drops its handler.
    for _ in 0..200 {
        if *server.in_flight_dropped.lock().unwrap() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(*server.in_flight_dropped.lock().unwrap(), "the in-flight request was aborted");
    host.dispose().await;
}
