//! The 2025-11-25 (experimental, "v1") MCP tasks, bridged onto the same
//! registry-backed MCP tasks as the 2026-07-28 extension ([`super::tasks`]).
//!
//! rmcp models only the 2026-07-28 extension, so this generation is served
//! by the framing layers in front of rmcp (the stdio gate and the HTTP
//! middleware), which call [`intercepts`] / [`answer`] for requests and
//! [`patch_result`] for rmcp's answers:
//!
//! - A connection speaks v1 when its `initialize` negotiated `2025-11-25`
//!   (on HTTP: the `MCP-Protocol-Version: 2025-11-25` header, or the
//!   `initialize` body itself).
//! - Its `initialize` result gains the `tasks` capability (`list`, `cancel`,
//!   `requests.tools.call`); its `tools/list` marks every producer tool that
//!   allows background runs with `execution.taskSupport: "optional"`.
//! - `tools/call` with `params.task` starts the call as a registry background
//!   task of the caller and answers `{task}` at once; `tasks/get`,
//!   `tasks/list`, `tasks/cancel` report and kill it; `tasks/result` waits
//!   for it and returns the final tool result with the
//!   `io.modelcontextprotocol/related-task` metadata.
//!
//! Invariants: the same fence as everywhere (an owner sees only its own
//! tasks); a task started on one generation is the same registry task on
//! the other (`task_list`, `task_kill` see it).

use serde_json::{Value, json};

use super::McpServer;
use super::jsonrpc::{INTERNAL_ERROR, INVALID_PARAMS, Rejection};
use taskhost_core::agents::Agent;
use taskhost_core::tools::producer_tool::RUN_IN_BACKGROUND;

/// The protocol revision this bridge speaks.
pub const PROTOCOL: &str = "2025-11-25";

const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// Whether the bridge answers this request of a v1 connection (rather than rmcp).
pub fn intercepts(method: &str, message: &Value) -> bool {
    match method {
        "tasks/get" | "tasks/result" | "tasks/list" | "tasks/cancel" => true,
        "tools/call" => message["params"].get("task").is_some_and(|task| !task.is_null()),
        _ => false,
    }
}

/// Adds what a v1 client needs to see to rmcp's answer to `method`.
pub fn patch_result(server: &McpServer, method: &str, result: &mut Value) {
    match method {
        "initialize" => {
            if let Some(capabilities) = result.get_mut("capabilities").and_then(Value::as_object_mut) {
                capabilities
                    .insert("tasks".into(), json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}));
            }
        }
        "tools/list" => {
            let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) else { return };
            let backgroundable = backgroundable_tools(server);
            for tool in tools {
                let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
                if backgroundable.iter().any(|candidate| candidate == name)
                    && let Some(tool) = tool.as_object_mut()
                {
                    tool.insert("execution".into(), json!({"taskSupport": "optional"}));
                }
            }
        }
        _ => {}
    }
}

fn backgroundable_tools(server: &McpServer) -> Vec<String> {
    server
        .host()
        .tool_definitions()
        .into_iter()
        .filter(|definition| definition.input_schema["properties"].get(RUN_IN_BACKGROUND).is_some())
        .map(|definition| definition.name)
        .collect()
}

/// Answers one intercepted request of `owner`: the JSON-RPC `result`, or an
/// error to send with the request's id.
pub async fn answer(
    server: &McpServer,
    owner: &Agent,
    id: &Value,
    method: &str,
    message: &Value,
) -> Result<Value, Rejection> {
    let params = &message["params"];
    let registry = server.host().registry();
    let refused = |error: rmcp::ErrorData| Rejection::new(id.clone(), error.code.0, error.message.to_string());
    let task_id = || params["taskId"].as_str().unwrap_or_default();
    if let Err(refusal) = server.confirm_membership().await {
        return Err(Rejection::new(id.clone(), INTERNAL_ERROR, refusal));
    }
    match method {
        "tools/call" => {
            let name = params["name"].as_str().unwrap_or_default();
            if !backgroundable_tools(server).iter().any(|tool| tool == name) {
                return Err(Rejection::new(
                    id.clone(),
                    INVALID_PARAMS,
                    format!(
                        "Invalid params for tools/call: tool {name:?} does not run as a task (its execution.taskSupport \
                         is not \"optional\"); call it without params.task"
                    ),
                ));
            }
            let arguments = params.get("arguments").and_then(Value::as_object).cloned();
            if let Err(refusal) = server.check_argument_size(name, arguments.as_ref()) {
                return Err(Rejection::new(id.clone(), INVALID_PARAMS, refusal));
            }
            let mut arguments = arguments.unwrap_or_default();
            arguments.insert(RUN_IN_BACKGROUND.to_string(), true.into());
            let call = taskhost_core::tools::CallContext::for_agent(owner);
            match server.start_task(owner, name, arguments, &call).await {
                Ok(created) => {
                    let view = server.tasks.view(registry, owner, &created.task.task_id).map_err(refused)?;
                    Ok(json!({"task": view.to_v1()}))
                }
                Err(Ok(output)) => Err(Rejection::new(id.clone(), INTERNAL_ERROR, output.text)),
                Err(Err(error)) => Err(Rejection::new(id.clone(), INVALID_PARAMS, error.to_string())),
            }
        }
        "tasks/get" => Ok(server.tasks.view(registry, owner, task_id()).map_err(refused)?.to_v1()),
        "tasks/list" => {
            let tasks: Vec<Value> = server.tasks.list(registry, owner).iter().map(|view| view.to_v1()).collect();
            Ok(json!({"tasks": tasks}))
        }
        "tasks/cancel" => {
            let view = server.tasks.view(registry, owner, task_id()).map_err(refused)?;
            if view.status != "working" {
                return Err(Rejection::new(
                    id.clone(),
                    INVALID_PARAMS,
                    format!("task {} is already {}; only a working task can be cancelled", view.id, view.status),
                ));
            }
            server.tasks.cancel(registry, owner, task_id()).await.map_err(refused)?;
            // The kill is awaited by the collector; report the settled state.
            let (view, _) = server.tasks.result(registry, owner, task_id()).await.map_err(refused)?;
            Ok(view.to_v1())
        }
        "tasks/result" => {
            let (view, result) = server.tasks.result(registry, owner, task_id()).await.map_err(refused)?;
            let mut result = serde_json::to_value(result).unwrap_or_else(|_| json!({}));
            if let Some(object) = result.as_object_mut() {
                object.insert("_meta".into(), json!({ RELATED_TASK: {"taskId": view.id.to_string()} }));
            }
            Ok(result)
        }
        other => Err(Rejection::new(id.clone(), INVALID_PARAMS, format!("{other} is not a tasks request"))),
    }
}
