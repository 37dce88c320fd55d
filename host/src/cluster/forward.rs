//! Any node serves any owner: a control call about a task another node
//! runs (`task_output`, `task_kill`, `task_wait`, `task_input`) is
//! forwarded to that node over NATS request/reply and answered there as
//! the same owner; `task_list` gathers the owner's listing from every live
//! node. Each answer carries the completion notices that node holds unread
//! for the owner, so an owner is told on whichever node it calls.
//!
//! Invariants:
//! - Only a stable owner's calls are forwarded (an HTTP token, `serve
//!   --owner`): its session is the same on every node, and the owner fence
//!   is checked by the node that runs the task, as for a local call.
//! - A forwarded call and its answer are each at most [`MAX_MESSAGE_BYTES`];
//!   a node that does not answer within the call's own wait plus
//!   [`ANSWER_WITHIN`] is reported with "cluster unavailable, retry".
//! - The subjects (`taskhost.<cluster>.node.<node>.call`) are for taskhost
//!   nodes only: NATS permissions must keep every other client off them
//!   (docs/cluster.md).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use taskhost_core::agents::Agent;
use taskhost_core::ids::TaskId;
use taskhost_core::tasks::TaskError;
use taskhost_core::tools::{CallContext, ToolOutput};

use super::bucket::RETRY_WITHIN;
use super::config::Placement;
use super::membership::{LIST_WITHIN, Membership};
use super::record::{Record, task_key};

/// The largest forwarded call or answer (NATS's default payload limit).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// The most a consuming read may take at once on a cluster (`[tasks]
/// output_read_bytes`): its answer, JSON-escaped (at most 6 bytes a byte),
/// fits in one message with room for the notices.
pub const MAX_FORWARDED_READ_BYTES: usize = 128 * 1024;
/// How long a node has to answer beyond the call's own wait: the store
/// call the answer may make, and the answer's way back.
pub const ANSWER_WITHIN: Duration = super::store::CALL_TIMEOUT.saturating_add(Duration::from_secs(5));
/// How long one try of a forwarded call waits beyond the call's own wait.
const TRY_WITHIN: Duration = Duration::from_secs(2);
/// The task locations a node keeps (task → the node running it); all are
/// dropped when it is full.
const MAX_LOCATED: usize = 65_536;
/// The pause before a forwarded call is asked again.
const ASK_AGAIN_AFTER: Duration = Duration::from_millis(100);
/// The answers a node keeps for calls asked again.
const KEPT_ANSWERS: usize = 1_024;
/// The longest wait a forwarded call may ask for.
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// The control tools that name tasks by id.
const BY_ID: [&str; 4] = ["task_output", "task_kill", "task_wait", "task_input"];

#[derive(Serialize, Deserialize)]
struct ForwardedCall {
    /// The call's token: a call asked again (its answer was lost with a
    /// NATS node) gets the first answer, never a second run.
    #[serde(default)]
    request: String,
    session: String,
    tool: String,
    arguments: Value,
}

impl ForwardedAnswer {
    fn with_data(data: Value) -> Self {
        Self { text: String::new(), is_error: false, notices: Vec::new(), started: None, data: Some(data) }
    }

    fn error(text: String) -> Self {
        Self { text, is_error: true, notices: Vec::new(), started: None, data: None }
    }
}

#[derive(Clone, Serialize, Deserialize)]
struct ForwardedAnswer {
    text: String,
    is_error: bool,
    /// Completion notices the answering node held unread for the owner.
    #[serde(default)]
    notices: Vec<String>,
    /// The task a forwarded start registered.
    #[serde(default)]
    started: Option<String>,
    /// A typed answer (a dashboard call's), besides the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data: Option<Value>,
}

/// A forwarded call's answer, as the caller's node serves it.
pub struct Forwarded {
    pub output: ToolOutput,
    pub notices: Vec<String>,
    /// The typed answer, when the call has one (a dashboard call's).
    pub data: Option<Value>,
}

/// The subject node `node` answers forwarded calls on.
fn call_subject(cluster: &str, node: &str) -> String {
    format!("taskhost.{cluster}.node.{node}.call")
}

/// A producer tool's background start (what `spread` places).
fn is_background_start(tool: &str, arguments: &Value) -> bool {
    !taskhost_core::tools::RESERVED_TOOL_NAMES.contains(&tool) && arguments["run_in_background"] == Value::Bool(true)
}

/// The ids a control call names.
fn named_ids(tool: &str, arguments: &Value) -> Vec<String> {
    match tool {
        "task_wait" => arguments["task_ids"]
            .as_array()
            .map(|ids| ids.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default(),
        _ => arguments["task_id"].as_str().map(str::to_string).into_iter().collect(),
    }
}

impl Membership {
    /// Answers `owner`'s call of `tool` elsewhere when it must be: a
    /// control call whose tasks another node runs (forwarded there), or a
    /// listing (this node's `local` listing joined by every other live
    /// node's). `None`: serve it here as usual.
    pub async fn route(
        self: &Arc<Self>,
        owner: &Agent,
        tool: &str,
        arguments: &Value,
        host: &taskhost_core::Host,
    ) -> Option<Forwarded> {
        if !owner.is_durable() {
            return None;
        }
        if tool == "task_list" {
            return Some(self.list_everywhere(owner, host).await);
        }
        if self.placement == Placement::Spread && is_background_start(tool, arguments) {
            let node = self.place(tool).await;
            if node == self.node {
                return None;
            }
            // At most once: a start asked again is answered from its first run.
            return Some(
                self.forward(&node, owner, tool, arguments.clone(), Duration::ZERO, ANSWER_WITHIN + RETRY_WITHIN).await,
            );
        }
        if !BY_ID.contains(&tool) {
            return None;
        }
        let ids = named_ids(tool, arguments);
        let unknown_here =
            |id: &String| matches!(host.registry().get(&TaskId::new(id.clone()), None), Err(TaskError::UnknownTask(_)));
        if ids.is_empty() || !ids.iter().all(unknown_here) {
            return None;
        }
        let answer = self.forward_by_id(owner, tool, arguments, &ids, true).await;
        // The node a task was cached on no longer has it (the cluster
        // settled it elsewhere): asked again where its record now says.
        if answer.output.is_error && answer.output.text.starts_with("unknown task id") {
            self.forget_located(&ids);
            return Some(self.forward_by_id(owner, tool, arguments, &ids, false).await);
        }
        if answer.output.is_error {
            self.forget_located(&ids);
        }
        Some(answer)
    }

    /// Forwards a call naming `ids` to the node that runs them (found in
    /// the cache when `cached`, else in their records).
    async fn forward_by_id(
        self: &Arc<Self>,
        owner: &Agent,
        tool: &str,
        arguments: &Value,
        ids: &[String],
        cached: bool,
    ) -> Forwarded {
        let mut nodes = Vec::new();
        for id in ids {
            let known =
                cached.then(|| self.located.lock().unwrap_or_else(|e| e.into_inner()).get(id).cloned()).flatten();
            let found = match known {
                Some(node) => Ok(Some(node)),
                None => self.node_of(id).await,
            };
            match found {
                Ok(Some(node)) if node != self.node => {
                    self.remember_located(id, &node);
                    nodes.push(node);
                }
                // Unknown everywhere, or this node's (it left this node's
                // registry): nothing to forward.
                Ok(_) => return refusal(TaskError::UnknownTask(TaskId::new(id.clone())).to_string()),
                Err(error) => return refusal(error),
            }
        }
        nodes.dedup();
        if nodes.len() > 1 {
            return refusal(format!(
                "the tasks {} run on different nodes ({}): wait for each node's tasks in a call of its own",
                ids.join(", "),
                nodes.join(", ")
            ));
        }
        let wait = arguments["timeout_ms"].as_u64().map_or(Duration::ZERO, Duration::from_millis).min(MAX_WAIT);
        self.forward(&nodes[0], owner, tool, arguments.clone(), wait, wait + ANSWER_WITHIN + RETRY_WITHIN).await
    }

    fn remember_located(&self, id: &str, node: &str) {
        let mut located = self.located.lock().unwrap_or_else(|e| e.into_inner());
        if located.len() >= MAX_LOCATED {
            located.clear();
        }
        located.insert(id.to_string(), node.to_string());
    }

    fn forget_located(&self, ids: &[String]) {
        let mut located = self.located.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            located.remove(id);
        }
    }

    /// The node whose record names task `id`, if any.
    pub(super) async fn node_of(self: &Arc<Self>, id: &str) -> Result<Option<String>, String> {
        let membership = self.clone();
        let key = task_key(&TaskId::new(id.to_string()));
        let read = self.on_client(async move { membership.bucket.read(&key).await }).await;
        match read.map_err(|error| error.to_string()).and_then(|read| read) {
            Ok(Some((value, _))) => Ok(Record::parse(id, &value).ok().map(|record| record.node)),
            Ok(None) => Ok(None),
            Err(error) => Err(format!("cluster unavailable, retry: reading the record of {id}: {error}")),
        }
    }

    /// Forwards one call to `node` (which may wait `wait` itself) and waits
    /// for its answer at most `within`, asking again meanwhile.
    pub(super) async fn forward(
        self: &Arc<Self>,
        node: &str,
        owner: &Agent,
        tool: &str,
        arguments: Value,
        wait: Duration,
        within: Duration,
    ) -> Forwarded {
        let call = ForwardedCall {
            request: super::record::write_token(),
            session: owner.session().as_str().to_string(),
            tool: tool.to_string(),
            arguments,
        };
        let payload: bytes::Bytes = serde_json::to_vec(&call).expect("a call serializes").into();
        if payload.len() > MAX_MESSAGE_BYTES {
            return refusal(format!(
                "the call is too large to forward to node {node} (over {MAX_MESSAGE_BYTES} bytes)"
            ));
        }
        let subject = call_subject(&self.cluster, node);
        let client = self.bucket.client();

        let span = tracing::debug_span!("forwarded call", node = %self.node, to = node, tool, owner = %owner.session());
        // Asked again with the same token while NATS recovers (a node of it
        // died, a reconnection): the answering node runs the call once.
        // Asked from the caller's runtime: a request only waits on the
        // client's connection task (no store call blocks here), and the hop
        // to the client's thread would cost two thread wake-ups a call.
        let asked: Result<_, async_nats::RequestError> = tracing::Instrument::instrument(
            async move {
                let deadline = tokio::time::Instant::now() + within;
                loop {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    // Short tries: a try whose request or answer was lost
                    // with a NATS node is asked again soon (the token makes
                    // that safe), not after the whole allowance.
                    let request =
                        async_nats::Request::new().payload(payload.clone()).timeout(Some(left.min(wait + TRY_WITHIN)));
                    match client.send_request(subject.clone(), request).await {
                        Ok(message) => return Ok(message),
                        Err(error) if left > ASK_AGAIN_AFTER => {
                            tracing::debug!(%error, "a forwarded call is asked again");
                            tokio::time::sleep(ASK_AGAIN_AFTER).await;
                        }
                        Err(error) => return Err(error),
                    }
                }
            },
            span,
        )
        .await;
        let message = match asked {
            Ok(message) => message,
            Err(error) => {
                return refusal(format!(
                    "cluster unavailable, retry: node {node}, which runs the task, did not answer ({error})"
                ));
            }
        };
        match serde_json::from_slice::<ForwardedAnswer>(&message.payload) {
            Ok(answer) => {
                let mut output = tool_output(answer.text, answer.is_error);
                output.started = answer.started.map(TaskId::new);
                Forwarded { output, notices: answer.notices, data: answer.data }
            }
            Err(error) => refusal(format!("node {node} answered with something unreadable ({error})")),
        }
    }

    /// The other nodes the roster names and no node fenced; `None` when
    /// the roster cannot be read.
    pub(super) async fn other_live_nodes(self: &Arc<Self>) -> Option<Vec<String>> {
        let membership = self.clone();
        match self.on_client(async move { super::roster::read(&membership.bucket).await }).await {
            Ok(Ok(roster)) => Some(
                roster
                    .nodes
                    .into_iter()
                    .filter(|(name, entry)| name != &self.node && entry.fenced_by.is_none())
                    .map(|(name, _)| name)
                    .collect(),
            ),
            _ => None,
        }
    }

    /// This node's listing for `owner`, then every other live node's.
    async fn list_everywhere(self: &Arc<Self>, owner: &Agent, host: &taskhost_core::Host) -> Forwarded {
        let local =
            host.call_tool("task_list", Value::Object(Default::default()), &CallContext::for_agent(owner)).await;
        let local = match local {
            Ok(output) => output,
            Err(error) => return refusal(error.to_string()),
        };
        let Some(others) = self.other_live_nodes().await else {
            return refusal("cluster unavailable, retry: the roster could not be read".into());
        };
        let empty = "(no background tasks)";
        let mut lines: Vec<String> = local.text.lines().filter(|line| *line != empty).map(str::to_string).collect();
        let mut notices = Vec::new();
        let asked = others.iter().map(|node| {
            self.forward(node, owner, "task_list", Value::Object(Default::default()), Duration::ZERO, LIST_WITHIN)
        });
        for (node, answer) in others.iter().zip(futures::future::join_all(asked).await) {
            if answer.output.is_error {
                lines.push(format!("(node {node} did not list its tasks: {})", answer.output.text));
            } else {
                lines.extend(answer.output.text.lines().filter(|line| *line != empty).map(str::to_string));
            }
            notices.extend(answer.notices);
        }
        if lines.is_empty() {
            lines.push(empty.to_string());
        }
        Forwarded { output: ToolOutput::ok(lines.join("\n")), notices, data: None }
    }

    /// Answers the calls other nodes forward to this one, on the host's
    /// runtime, until the client closes.
    pub fn answer_forwarded_calls(self: &Arc<Self>, host: taskhost_core::Host, runtime: tokio::runtime::Handle) {
        let membership = self.clone();
        let client = self.bucket.client();
        let subject = call_subject(&self.cluster, &self.node);
        self.client.spawn(async move {
            let mut calls = match client.subscribe(subject.clone()).await {
                Ok(calls) => calls,
                Err(error) => {
                    tracing::error!(node = %membership.node, %error, "cannot answer forwarded calls");
                    return;
                }
            };
            let owners = Arc::new(RemoteOwners::default());
            let answers = Arc::new(Answers::default());
            while let Some(message) = calls.next().await {
                let Some(reply) = message.reply.clone() else { continue };
                let (host, client, owners, answers) = (host.clone(), client.clone(), owners.clone(), answers.clone());
                let membership = membership.clone();
                runtime.spawn(async move {
                    let answer = match serde_json::from_slice::<ForwardedCall>(&message.payload) {
                        Err(error) => ForwardedAnswer::error(format!("an unreadable forwarded call: {error}")),
                        // As for a call of its own: a node that cannot
                        // confirm its membership reports nothing (nor
                        // hands over notices the cluster may have given
                        // another node to tell).
                        Ok(_) if let Err(refusal) = membership.confirm().await => ForwardedAnswer::error(refusal),
                        Ok(call) if call.tool == super::dashboard::DASHBOARD_CALL => {
                            let once = answers.slot(&call.request);
                            let answer = async {
                                match membership.answer_dashboard(call.arguments).await {
                                    Ok(data) => ForwardedAnswer::with_data(data),
                                    Err(text) => ForwardedAnswer::error(text),
                                }
                            };
                            once.get_or_init(|| answer).await.clone()
                        }
                        Ok(call) => {
                            let once = answers.slot(&call.request);
                            once.get_or_init(|| answer_call(&host, &owners, call)).await.clone()
                        }
                    };
                    let mut bytes = serde_json::to_vec(&answer).expect("an answer serializes");
                    if bytes.len() > MAX_MESSAGE_BYTES {
                        let too_large = ForwardedAnswer {
                            notices: answer.notices,
                            started: answer.started,
                            ..ForwardedAnswer::error(format!(
                                "the answer is too large to forward (over {MAX_MESSAGE_BYTES} bytes): ask for less (a view with fewer lines)"
                            ))
                        };
                        bytes = serde_json::to_vec(&too_large).expect("an answer serializes");
                    }
                    if let Err(error) = client.publish(reply, bytes.into()).await {
                        tracing::warn!(%error, "a forwarded call's answer could not be sent");
                    }
                });
            }
        });
    }
}

/// The answers to the latest [`KEPT_ANSWERS`] forwarded calls, by token: a
/// call asked again waits for, or gets, the first one's answer.
/// One kept answer, filled by the call's first run.
type AnswerSlot = Arc<tokio::sync::OnceCell<ForwardedAnswer>>;

#[derive(Default)]
struct Answers(std::sync::Mutex<KeptAnswers>);

/// The slots by token, and the tokens oldest first.
#[derive(Default)]
struct KeptAnswers {
    slots: std::collections::HashMap<String, AnswerSlot>,
    order: std::collections::VecDeque<String>,
}

impl Answers {
    fn slot(&self, request: &str) -> AnswerSlot {
        if request.is_empty() {
            return Arc::default();
        }
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let KeptAnswers { slots, order } = &mut *kept;
        if let Some(slot) = slots.get(request) {
            return slot.clone();
        }
        if order.len() >= KEPT_ANSWERS
            && let Some(oldest) = order.pop_front()
        {
            slots.remove(&oldest);
        }
        order.push_back(request.to_string());
        slots.entry(request.to_string()).or_default().clone()
    }
}

/// The agents this node made for owners whose calls arrive forwarded (one
/// per session, kept for the server's life, like a token's).
#[derive(Default)]
struct RemoteOwners(std::sync::Mutex<std::collections::HashMap<String, Agent>>);

impl RemoteOwners {
    /// The owner `session` here: its live stable agent (a token's, an
    /// `--owner` connection's), else one made for forwarded calls.
    fn agent(&self, host: &taskhost_core::Host, session: &str) -> Result<(Agent, bool), String> {
        let live = host.agents().durable_of(session).into_iter().next();
        if let Some(agent) = live {
            return Ok((agent, false));
        }
        let mut made = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(agent) = made.get(session).filter(|agent| agent.is_live()) {
            return Ok((agent.clone(), true));
        }
        let agent = host
            .create_durable_agent(format!("cluster:{session}").as_str(), session)
            .map_err(|error| format!("the owner {session} cannot be served here: {error}"))?;
        made.insert(session.to_string(), agent.clone());
        Ok((agent, true))
    }
}

async fn answer_call(host: &taskhost_core::Host, owners: &RemoteOwners, call: ForwardedCall) -> ForwardedAnswer {
    let take_notices = call.tool == super::notices::TAKE_NOTICES;
    let answered = take_notices || call.tool == "task_list" || BY_ID.contains(&call.tool.as_str());
    if !answered && !is_background_start(&call.tool, &call.arguments) {
        return ForwardedAnswer::error(format!("{} is not a call another node forwards", call.tool));
    }
    let agent = match owners.agent(host, &call.session) {
        Ok((agent, _)) => agent,
        Err(text) => return ForwardedAnswer::error(text),
    };
    if take_notices {
        let notices: Vec<String> = agent.take_unread().into_iter().map(|message| message.text).collect();
        tracing::debug!(owner = %call.session, count = notices.len(), "notices handed to the owner's node");
        return ForwardedAnswer { text: String::new(), is_error: false, notices, started: None, data: None };
    }
    let span = tracing::info_span!("forwarded call", owner = %call.session, tool = %call.tool);
    let output = tracing::Instrument::instrument(
        host.call_tool(&call.tool, call.arguments, &CallContext::for_agent(&agent)),
        span,
    )
    .await;
    let notices = agent.take_unread().into_iter().map(|message| message.text).collect();
    match output {
        Ok(output) => ForwardedAnswer {
            text: output.text,
            is_error: output.is_error,
            notices,
            started: output.started.map(|id| id.as_str().to_string()),
            data: None,
        },
        Err(error) => ForwardedAnswer { notices, ..ForwardedAnswer::error(error.to_string()) },
    }
}

fn refusal(text: String) -> Forwarded {
    Forwarded { output: tool_output(text, true), notices: Vec::new(), data: None }
}

fn tool_output(text: String, is_error: bool) -> ToolOutput {
    let mut output = ToolOutput::ok(text);
    output.is_error = is_error;
    output
}
