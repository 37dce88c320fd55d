//! A small scripted Agent Client Protocol agent for the `acp` subagent
//! backend's tests. It speaks ACP v1 over stdio (crate
//! `agent-client-protocol`, agent side) and answers each prompt by what it
//! contains:
//! - `hello`: two text chunks `Hello, ` `world.`, then `end_turn`;
//! - `max`: a chunk, then `max_tokens`; `refuse`: `refusal`;
//! - `env`: the names of its environment variables (sorted, comma-separated);
//! - `pid`: its process id; then it waits for `session/cancel`;
//! - `hang`: nothing until `session/cancel`, then `cancelled`;
//! - `deaf`: never answers, ignores `session/cancel`;
//! - `<prompt>; ready <socket>`: as `<prompt>`, then, once a `pid` or `deaf`
//!   reply is parked, a connection to the Unix socket (the test's event);
//! - `crash`: exits with status 3 mid-prompt.

use std::sync::{Arc, Mutex};

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, ContentChunk, InitializeRequest, InitializeResponse,
    NewSessionRequest, NewSessionResponse, PromptRequest, PromptResponse, SessionId, SessionNotification,
    SessionUpdate, StopReason, TextContent,
};
use agent_client_protocol::{Agent, ByteStreams, Client, Responder, V1};
use tokio_util::compat::{TokioAsyncReadCompatExt as _, TokioAsyncWriteCompatExt as _};

type Pending = Arc<Mutex<Vec<Responder<PromptResponse, V1>>>>;

fn chunk(session: &SessionId, text: &str) -> SessionNotification {
    SessionNotification::new(
        session.clone(),
        SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(TextContent::new(text)))),
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), agent_client_protocol::Error> {
    let cancellable: Pending = Arc::default();
    let deaf: Pending = Arc::default();
    let on_cancel = cancellable.clone();
    Agent
        .v1()
        .name("scripted-acp-agent")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                responder.respond(
                    InitializeResponse::new(request.protocol_version).agent_capabilities(AgentCapabilities::new()),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |_request: NewSessionRequest, responder, _cx| {
                responder.respond(NewSessionResponse::new(SessionId::new("scripted-session-1")))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder: Responder<PromptResponse, V1>, cx: ConnectionTo<Client>| {
                let prompt: String = request
                    .prompt
                    .iter()
                    .filter_map(|block| match block {
                        ContentBlock::Text(text) => Some(text.text.clone()),
                        _ => None,
                    })
                    .collect();
                let session = request.session_id.clone();
                eprintln!("scripted agent got prompt: {prompt}");
                // `<prompt>; ready <socket>`: once the prompt is handled (a
                // reply parked), connect to the test's socket, the event the
                // test waits on instead of sleeping.
                let (prompt, ready) = match prompt.split_once("; ready ") {
                    Some((prompt, socket)) => (prompt.to_string(), Some(socket.trim().to_string())),
                    None => (prompt, None),
                };
                let signal_ready = || {
                    if let Some(socket) = &ready {
                        let _ = std::os::unix::net::UnixStream::connect(socket);
                    }
                };
                if prompt.contains("hello") {
                    cx.send_notification(chunk(&session, "Hello, "))?;
                    cx.send_notification(chunk(&session, "world."))?;
                    responder.respond(PromptResponse::new(StopReason::EndTurn))
                } else if prompt.contains("max") {
                    cx.send_notification(chunk(&session, "trunc"))?;
                    responder.respond(PromptResponse::new(StopReason::MaxTokens))
                } else if prompt.contains("refuse") {
                    responder.respond(PromptResponse::new(StopReason::Refusal))
                } else if prompt.contains("env") {
                    let mut names: Vec<String> = std::env::vars().map(|(name, _)| name).collect();
                    names.sort();
                    cx.send_notification(chunk(&session, &names.join(",")))?;
                    responder.respond(PromptResponse::new(StopReason::EndTurn))
                } else if prompt.contains("pid") {
                    cx.send_notification(chunk(&session, &std::process::id().to_string()))?;
                    cancellable.lock().unwrap().push(responder);
                    signal_ready();
                    Ok(())
                } else if prompt.contains("hang") {
                    cancellable.lock().unwrap().push(responder);
                    Ok(())
                } else if prompt.contains("deaf") {
                    deaf.lock().unwrap().push(responder);
                    signal_ready();
                    Ok(())
                } else if prompt.contains("crash") {
                    std::process::exit(3);
                } else {
                    cx.send_notification(chunk(&session, &format!("echo: {prompt}")))?;
                    responder.respond(PromptResponse::new(StopReason::EndTurn))
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |_cancel: CancelNotification, _cx| {
                eprintln!("scripted agent got session/cancel");
                for responder in on_cancel.lock().unwrap().drain(..) {
                    responder.respond(PromptResponse::new(StopReason::Cancelled))?;
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(ByteStreams::new(tokio::io::stdout().compat_write(), tokio::io::stdin().compat()))
        .await
}
