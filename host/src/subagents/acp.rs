//! The `acp` backend: any Agent Client Protocol agent as a child process.
//!
//! Model: each run spawns the configured argv (its own process group, stdin
//! and stdout piped as the ACP transport, stderr logged), then speaks ACP v1
//! as the client (crate `agent-client-protocol`): `initialize`,
//! `session/new` (in `cwd`), one `session/prompt` with the child's prompt.
//! The final text is the concatenation of the `agent_message_chunk` text
//! updates of the session; the prompt response's stop reason maps as
//! `end_turn` → completed, `cancelled` → aborted, `max_tokens` →
//! max-tokens, `refusal` → refusal, `max_turn_requests` and anything newer →
//! other. Permission requests are answered `cancelled` unless the config
//! allows them (then with the first allow option).
//!
//! Invariants:
//! - The agent's environment is the host's with every variable whose name
//!   contains `KEY`, `TOKEN`, `SECRET` or `PASSWORD` removed, except those
//!   listed in `pass_env`; `env` entries are set last and win.
//! - Cancel sends `session/cancel` and keeps reading until the agent answers
//!   the prompt (normally `cancelled`); an agent that does not answer within
//!   `cancel_grace_ms` is dropped by the run driver.
//! - The whole process group is killed (SIGKILL) when the run ends for any
//!   reason — answered, failed, or its future dropped — so by the time the
//!   run is disposed no agent process is left.
//! - Transport or protocol failures end the run as `error` with the
//!   failure and the tail of the agent's stderr.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::util::MatchDispatch;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, ContentChunk, InitializeRequest, PermissionOptionKind, RequestPermissionOutcome,
    RequestPermissionRequest, RequestPermissionResponse, SelectedPermissionOutcome, SessionNotification, SessionUpdate,
    StopReason as AcpStopReason,
};
use agent_client_protocol::v1::{SessionMessage, SessionSetup};
use agent_client_protocol::{ByteStreams, Client, Responder};
use tokio::io::AsyncBufReadExt as _;
use tokio_util::compat::{TokioAsyncReadCompatExt as _, TokioAsyncWriteCompatExt as _};

use super::config::AcpConfig;
use super::{Backend, ChildContext, RunResult, StopReason};

/// Substrings of variable names scrubbed from the agent's environment.
pub const SCRUBBED_ENV_PATTERNS: &[&str] = &["KEY", "TOKEN", "SECRET", "PASSWORD"];

pub struct AcpBackend {
    config: AcpConfig,
}

impl AcpBackend {
    pub fn new(config: AcpConfig) -> Self {
        Self { config }
    }
}

/// The environment of the agent process (see the module invariants).
pub fn agent_env(ambient: impl IntoIterator<Item = (String, String)>, config: &AcpConfig) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = ambient
        .into_iter()
        .filter(|(name, _)| {
            let upper = name.to_uppercase();
            config.pass_env.contains(name) || !SCRUBBED_ENV_PATTERNS.iter().any(|pattern| upper.contains(pattern))
        })
        .collect();
    env.extend(config.env.clone());
    env
}

/// Maps an ACP stop reason.
pub fn stop_reason_of(reason: AcpStopReason) -> StopReason {
    match reason {
        AcpStopReason::EndTurn => StopReason::Completed,
        AcpStopReason::Cancelled => StopReason::Aborted,
        AcpStopReason::MaxTokens => StopReason::MaxTokens,
        AcpStopReason::Refusal => StopReason::Refusal,
        AcpStopReason::MaxTurnRequests => StopReason::Other("max-turn-requests".into()),
        other => StopReason::Other(
            serde_json::to_value(other)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| format!("{other:?}")),
        ),
    }
}

/// Kills the agent's process group when dropped, and reaps the agent.
struct ProcessGuard {
    child: Option<tokio::process::Child>,
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        if let Some(pid) = child.id() {
            // The agent leads its own process group (`process_group(0)`).
            // SAFETY: kill(2) with a negative pid signals that group; no memory is touched.
            unsafe {
                libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
            }
        }
        let _ = child.start_kill();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let _ = child.wait().await;
                });
            }
            Err(_) => {
                let _ = child.try_wait();
            }
        }
    }
}

#[async_trait::async_trait]
impl Backend for AcpBackend {
    fn kind(&self) -> &'static str {
        "acp"
    }

    fn cancel_grace(&self) -> Duration {
        Duration::from_millis(self.config.cancel_grace_ms)
    }

    async fn run(&self, child: ChildContext) -> RunResult {
        let program = &self.config.command[0];
        let cwd = match &self.config.cwd {
            Some(cwd) => cwd.clone(),
            None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
        };
        let cwd = if cwd.is_absolute() { cwd } else { std::env::current_dir().unwrap_or_default().join(cwd) };
        let mut command = tokio::process::Command::new(program);
        command
            .args(&self.config.command[1..])
            .env_clear()
            .envs(agent_env(std::env::vars(), &self.config))
            .current_dir(&cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut process = match command.spawn() {
            Ok(process) => process,
            Err(error) => return RunResult::error(format!("cannot start the ACP agent {program:?}: {error}")),
        };
        tracing::info!(pid = process.id(), program = %program, "ACP agent started");
        let stdin = process.stdin.take().expect("stdin is piped");
        let stdout = process.stdout.take().expect("stdout is piped");
        let stderr_tail = Arc::new(Mutex::new(String::new()));
        if let Some(stderr) = process.stderr.take() {
            let tail = stderr_tail.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(target: "taskhost::subagents::acp", "agent stderr: {line}");
                    let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                    tail.push_str(&line);
                    tail.push('\n');
                    if tail.len() > 1000 {
                        let cut = tail.len() - 1000;
                        let cut = (cut..tail.len()).find(|i| tail.is_char_boundary(*i)).unwrap_or(0);
                        tail.drain(..cut);
                    }
                }
            });
        }
        let _guard = ProcessGuard { child: Some(process) };

        let transport = ByteStreams::new(stdin.compat_write(), stdout.compat());
        let allow = self.config.allow_permissions;
        let prompt = child.prompt.clone();
        let child = &child;
        let outcome = Client
            .v1()
            .connect_with(transport, async move |connection| {
                connection.send_request(InitializeRequest::new(ProtocolVersion::V1)).block_task().await?;
                let SessionSetup { mut session, .. } = connection.build_session(&cwd).block_task().start_session().await?;
                tracing::debug!(acp_session = %session.session_id(), "ACP session created");
                session.send_prompt(prompt)?;
                let mut text = String::new();
                let mut cancel_sent = false;
                loop {
                    let update = tokio::select! {
                        update = session.read_update() => update?,
                        () = child.cancelled(), if !cancel_sent => {
                            cancel_sent = true;
                            tracing::debug!("sending session/cancel");
                            session.connection().send_notification(CancelNotification::new(session.session_id().clone()))?;
                            continue;
                        }
                    };
                    match update {
                        SessionMessage::Message(dispatch) => MatchDispatch::new(dispatch.into_raw())
                            .if_notification(async |notification: SessionNotification| {
                                if let SessionUpdate::AgentMessageChunk(ContentChunk {
                                    content: ContentBlock::Text(chunk),
                                    ..
                                }) = notification.update
                                {
                                    text.push_str(&chunk.text);
                                }
                                Ok(())
                            })
                            .await
                            .if_request(
                                async |request: RequestPermissionRequest,
                                       responder: Responder<RequestPermissionResponse>| {
                                    let selected = allow
                                        .then(|| {
                                            request.options.iter().find(|option| {
                                                matches!(
                                                    option.kind,
                                                    PermissionOptionKind::AllowOnce | PermissionOptionKind::AllowAlways
                                                )
                                            })
                                        })
                                        .flatten();
                                    let outcome = match selected {
                                        Some(option) => RequestPermissionOutcome::Selected(
                                            SelectedPermissionOutcome::new(option.option_id.clone()),
                                        ),
                                        None => RequestPermissionOutcome::Cancelled,
                                    };
                                    responder.respond(RequestPermissionResponse::new(outcome))
                                },
                            )
                            .await
                            .otherwise_ignore()?,
                        SessionMessage::PromptResponse(response) => {
                            let response = response?;
                            return Ok((text, response.stop_reason));
                        }
                        _ => {}
                    }
                }
            })
            .await;
        match outcome {
            Ok((text, reason)) => RunResult::stopped(text, stop_reason_of(reason)),
            Err(error) => {
                let tail = stderr_tail.lock().unwrap_or_else(|e| e.into_inner()).trim().to_string();
                let mut detail = format!("ACP agent {program:?}: {error}");
                if !tail.is_empty() {
                    detail.push_str(&format!(" (stderr: {tail})"));
                }
                RunResult::error(detail)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_scrubbed_unless_passed_or_set() {
        let config = AcpConfig {
            command: vec!["agent".into()],
            cwd: None,
            env: BTreeMap::from([("MY_TOKEN".to_string(), "explicit".to_string())]),
            pass_env: vec!["ANTHROPIC_API_KEY".into()],
            allow_permissions: false,
            cancel_grace_ms: 100,
        };
        let ambient = [
            ("PATH", "/bin"),
            ("OPENAI_API_KEY", "x"),
            ("ANTHROPIC_API_KEY", "y"),
            ("github_token", "z"),
            ("DB_PASSWORD", "p"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("MY_TOKEN", "ambient"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let env = agent_env(ambient, &config);
        assert_eq!(
            env.into_iter().collect::<Vec<_>>(),
            [("ANTHROPIC_API_KEY", "y"), ("MY_TOKEN", "explicit"), ("PATH", "/bin")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
        );
    }

    #[test]
    fn acp_stop_reasons_map() {
        assert_eq!(stop_reason_of(AcpStopReason::EndTurn), StopReason::Completed);
        assert_eq!(stop_reason_of(AcpStopReason::Cancelled), StopReason::Aborted);
        assert_eq!(stop_reason_of(AcpStopReason::MaxTokens), StopReason::MaxTokens);
        assert_eq!(stop_reason_of(AcpStopReason::Refusal), StopReason::Refusal);
        assert_eq!(stop_reason_of(AcpStopReason::MaxTurnRequests), StopReason::Other("max-turn-requests".into()));
    }
}
