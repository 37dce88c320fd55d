//! `[subagents]`: the named backends child runs are started on (example on
//! [`SubagentsConfig`]). A subagent tool instance picks one with `profile = "<name>"` in its
//! `[[producer]] config`; a start that names none uses `default_backend`.
//!
//! Invariants:
//! - With no `[subagents]` table at all, the one backend is `scripted` with no replies (it
//!   answers `<description>: done`), so the demo and the tests need no network and no key.
//! - Every table denies unknown keys; [`SubagentsConfig::validate`] checks what can be
//!   checked offline.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

/// The name of the backend used when nothing else is configured.
pub const DEFAULT_BACKEND: &str = "default";

/// `[subagents]`.
///
/// ```toml
/// [subagents]
/// default_backend = "offline"          # used when a start names no profile
///
/// [subagents.backends.offline]
/// kind = "scripted"
/// [[subagents.backends.offline.replies]]
/// when = "ticker"                      # first reply whose `when` occurs in the prompt
/// text = "started: {tool_results}"
/// delay_ms = 50
/// stop_reason = "completed"            # completed | aborted | error | max-tokens | refusal | anything
/// tool_calls = [{ tool = "ticker", args = { count = 100, interval_ms = 50, run_in_background = true } }]
///
/// [subagents.backends.deepseek]
/// kind = "openai"
/// base_url = "https://api.deepseek.com/v1"
/// model = "deepseek-chat"
/// api_key_env = "DEEPSEEK_API_KEY"
/// max_turns = 8
///
/// [subagents.backends.claude]
/// kind = "acp"
/// command = ["claude-code-acp"]
/// pass_env = ["ANTHROPIC_API_KEY"]
/// ```
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SubagentsConfig {
    /// The backend a start without a profile uses. Default: the only backend
    /// when there is exactly one, else `default`.
    pub default_backend: Option<String>,
    /// Named backends (profiles).
    pub backends: BTreeMap<String, BackendConfig>,
}

/// One backend, by `kind`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum BackendConfig {
    Scripted(ScriptedConfig),
    Openai(OpenAiConfig),
    Acp(AcpConfig),
}

impl BackendConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Scripted(_) => "scripted",
            Self::Openai(_) => "openai",
            Self::Acp(_) => "acp",
        }
    }
}

/// `kind = "scripted"`: deterministic, offline replies.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ScriptedConfig {
    /// Tried in order; the first whose `when` occurs in the prompt (or that
    /// has no `when`) answers. No match: `<description>: done`, completed.
    pub replies: Vec<ScriptedReply>,
}

/// One scripted reply.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScriptedReply {
    /// A substring of the prompt that selects this reply.
    #[serde(default)]
    pub when: Option<String>,
    /// The final text. `{description}`, `{prompt}` and `{tool_results}` (the
    /// tool outputs, one per line) are substituted. Default `<description>: done`
    /// for a completed reply, empty for any other stop reason.
    #[serde(default)]
    pub text: Option<String>,
    /// How long the child "thinks" before answering (cancellable).
    #[serde(default)]
    pub delay_ms: u64,
    /// `completed` (default), `aborted`, `error`, `max-tokens`, `refusal`, or
    /// any other string (an unknown reason).
    #[serde(default = "completed")]
    pub stop_reason: String,
    /// Extra detail for the stop reason.
    #[serde(default)]
    pub detail: Option<String>,
    /// Host tools the child calls, as its own agent, before answering.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedToolCall>,
}

fn completed() -> String {
    "completed".into()
}

/// A tool call a scripted child makes.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScriptedToolCall {
    pub tool: String,
    #[serde(default)]
    pub args: serde_json::Value,
}

/// `kind = "openai"`: an OpenAI-compatible chat-completions endpoint.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    /// Up to and including the version, e.g. `https://api.deepseek.com/v1`;
    /// requests go to `<base_url>/chat/completions`.
    pub base_url: String,
    pub model: String,
    /// The environment variable holding the API key (sent as a bearer
    /// token). None: no Authorization header (local servers).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Model requests per run before it stops as `max-turns`.
    #[serde(default = "default_max_turns")]
    pub max_turns: u32,
    /// The system message of every child.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// `max_tokens` of each request.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Host tools the child may call. None: every host tool.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Per-request timeout.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

fn default_max_turns() -> u32 {
    8
}

fn default_request_timeout_ms() -> u64 {
    300_000
}

/// `kind = "acp"`: an Agent Client Protocol agent run as a child process.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AcpConfig {
    /// The agent's argv.
    pub command: Vec<String>,
    /// Working directory of the process and of the ACP session. Default: the
    /// host's current directory.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Variables set for the agent (win over everything).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Ambient variables passed through although their names look like
    /// credentials (`KEY`, `TOKEN`, `SECRET`, `PASSWORD` are scrubbed otherwise).
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Answer the agent's permission requests with the first allow option
    /// (default: every request is answered `cancelled`).
    #[serde(default)]
    pub allow_permissions: bool,
    /// How long cancel waits for the agent's own `cancelled` answer before
    /// the process is killed.
    #[serde(default = "default_cancel_grace_ms")]
    pub cancel_grace_ms: u64,
}

fn default_cancel_grace_ms() -> u64 {
    3_000
}

impl SubagentsConfig {
    /// The backend used for `profile` (None: the default backend).
    pub fn default_backend_name(&self) -> String {
        if let Some(name) = &self.default_backend {
            return name.clone();
        }
        if self.backends.len() == 1 {
            return self.backends.keys().next().cloned().unwrap_or_default();
        }
        DEFAULT_BACKEND.to_string()
    }

    /// The backends with the implicit offline default filled in.
    pub fn effective_backends(&self) -> BTreeMap<String, BackendConfig> {
        let mut backends = self.backends.clone();
        if backends.is_empty() {
            backends.insert(DEFAULT_BACKEND.into(), BackendConfig::Scripted(ScriptedConfig::default()));
        }
        backends
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        let backends = self.effective_backends();
        let default = self.default_backend_name();
        anyhow::ensure!(
            backends.contains_key(&default) || self.default_backend.is_none() && self.backends.len() > 1,
            "[subagents] default_backend = {default:?} names no backend; configured: {}",
            backends.keys().cloned().collect::<Vec<_>>().join(", ")
        );
        for (name, backend) in &backends {
            let at = format!("[subagents.backends.{name}]");
            match backend {
                BackendConfig::Scripted(scripted) => {
                    for (i, reply) in scripted.replies.iter().enumerate() {
                        for call in &reply.tool_calls {
                            anyhow::ensure!(
                                call.args.is_null() || call.args.is_object(),
                                "{at} replies[{i}]: tool call {:?} args must be a table",
                                call.tool
                            );
                        }
                    }
                }
                BackendConfig::Openai(openai) => {
                    anyhow::ensure!(
                        openai.base_url.starts_with("http://") || openai.base_url.starts_with("https://"),
                        "{at} base_url must start with http:// or https://, got {:?}",
                        openai.base_url
                    );
                    anyhow::ensure!(!openai.model.trim().is_empty(), "{at} model is empty");
                    anyhow::ensure!(openai.max_turns > 0, "{at} max_turns must be at least 1");
                    anyhow::ensure!(openai.request_timeout_ms > 0, "{at} request_timeout_ms must be positive");
                    if let Some(var) = &openai.api_key_env {
                        anyhow::ensure!(!var.is_empty(), "{at} api_key_env is empty");
                    }
                }
                BackendConfig::Acp(acp) => {
                    anyhow::ensure!(
                        acp.command.first().is_some_and(|program| !program.is_empty()),
                        "{at} command must name the agent program, e.g. command = [\"my-agent\", \"--acp\"]"
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> anyhow::Result<SubagentsConfig> {
        let config: SubagentsConfig = toml::from_str(text)?;
        config.validate()?;
        Ok(config)
    }

    #[test]
    fn empty_config_has_the_offline_default() {
        let config = parse("").unwrap();
        assert_eq!(config.default_backend_name(), "default");
        assert!(matches!(config.effective_backends()["default"], BackendConfig::Scripted(_)));
    }

    #[test]
    fn backends_parse_and_validate() {
        let config = parse(
            r#"
            default_backend = "ds"
            [backends.ds]
            kind = "openai"
            base_url = "https://api.deepseek.com/v1"
            model = "deepseek-chat"
            api_key_env = "DEEPSEEK_API_KEY"
            [backends.offline]
            kind = "scripted"
            replies = [{ text = "hi", stop_reason = "refusal" }]
            [backends.claude]
            kind = "acp"
            command = ["claude-code-acp"]
            "#,
        )
        .unwrap();
        assert_eq!(config.default_backend_name(), "ds");
        assert_eq!(config.backends.len(), 3);
    }

    #[test]
    fn errors_name_the_problem() {
        let typo = parse("[backends.x]\nkind = \"scripted\"\nreplys = []").unwrap_err().to_string();
        assert!(typo.contains("unknown field `replys`"), "{typo}");
        let kind = parse("[backends.x]\nkind = \"grpc\"").unwrap_err().to_string();
        assert!(kind.contains("unknown variant `grpc`"), "{kind}");
        let url = parse("[backends.x]\nkind = \"openai\"\nbase_url = \"api\"\nmodel = \"m\"").unwrap_err().to_string();
        assert!(url.contains("base_url must start with http"), "{url}");
        let default = parse("default_backend = \"nope\"").unwrap_err().to_string();
        assert!(default.contains("names no backend"), "{default}");
        let acp = parse("[backends.x]\nkind = \"acp\"\ncommand = []").unwrap_err().to_string();
        assert!(acp.contains("command must name the agent program"), "{acp}");
    }
}

/// `[producer.grants.subagents]`: a producer instance may start child agent
/// runs, on the backends it names (`backends = ["fast"]`; none named: every
/// configured backend). Without it the `subagents` import refuses every start.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SubagentsGrant {
    /// The `[subagents.backends]` names this instance may use.
    #[serde(default)]
    pub backends: Vec<String>,
}
