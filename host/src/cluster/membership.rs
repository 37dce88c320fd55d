//! This node's membership of the cluster: its claim on its name in the
//! roster, its heartbeat, the lease that lets it report its tasks, and what
//! it does when the others declared it gone.
//!
//! Invariants:
//! - A name is served by one process at a time: a claim is refused while
//!   another process holds the name and beats ([`Membership::claim`]).
//! - The lease: this node answers a call only within
//!   [`LEASE_SHARE`] of `node_timeout_ms` after its last beat was sent
//!   (renewing it first when it lapsed, e.g. after a SIGSTOP). Another node
//!   declares it gone only after seeing no beat for the whole timeout, so a
//!   node never reports a task running after the others settled it.
//! - A node that finds itself fenced (declared gone) serves nothing until
//!   it has settled its live tasks `lost` (told only where its store write
//!   won: see `taskhost_core`'s first-wins settlement), killed every process
//!   tree it kept, and claimed its name again under a new session.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use taskhost_core::Host;
use tokio::time::Instant;

use super::bucket::Bucket;
use super::roster::{self, NodeEntry};
use super::sweep;

/// The share of `node_timeout_ms` a beat's lease lasts (the rest is the
/// margin between this node's lease and another's verdict).
pub const LEASE_SHARE: f64 = 0.75;
/// Beats per `node_timeout_ms`.
pub const BEATS_PER_TIMEOUT: u32 = 4;
/// The longest a call waits for a renewal of a lapsed lease.
const RENEW_WITHIN: Duration = Duration::from_secs(5);
/// How long a node has to list its tasks for another's listing (`task_list`,
/// a dashboard): a node that died and is not declared gone yet is left out
/// of the listing, and named, rather than holding it.
pub(super) const LIST_WITHIN: Duration = Duration::from_secs(3);

/// What the node serves once the host is built: the host whose registry
/// loses its tasks when the node is fenced, the directory of its durable
/// trees, and the runtime the host lives on.
struct Serving {
    host: Host,
    trees_root: Option<PathBuf>,
    runtime: tokio::runtime::Handle,
}

struct Lease {
    session: String,
    /// When the lease lapses (a beat renews it).
    until: Instant,
    /// Set while the node is settling its tasks after it was fenced.
    rejoining: bool,
}

/// This node's membership. See the module invariants.
pub struct Membership {
    pub(super) node: String,
    /// The cluster's name (the `<name>` of `taskhost-<name>`).
    pub(super) cluster: String,
    pub(super) timeout: Duration,
    pub(super) placement: super::config::Placement,
    /// Where other nodes' tasks run, as their records said (see
    /// [`super::forward`]).
    pub(super) located: Mutex<std::collections::HashMap<String, String>>,
    /// This node's live tasks and served tools, counted on the host's
    /// runtime for the beats to carry.
    pub(super) load: Mutex<Option<(u64, Vec<String>)>>,
    /// Starts this node placed on each node since it last saw that node beat.
    pub(super) placed: Mutex<Placed>,
    labels: std::collections::BTreeMap<String, String>,
    /// Whether stable owners' output is copied to the output stream
    /// (`[cluster] output_stream_bytes` > 0).
    pub(super) copy_output: bool,
    pub(super) bucket: Bucket,
    /// The cluster client's runtime (every NATS call runs there).
    pub(super) client: tokio::runtime::Handle,
    lease: Mutex<Lease>,
    serving: OnceLock<Serving>,
    /// Held by the one rejoin in progress.
    rejoin: tokio::sync::Mutex<()>,
    /// Which other nodes hold unread notices for which owners (the
    /// cluster's notice hints).
    pub(super) hints: Hints,
    /// Hints at the ends of this node's tasks while it serves.
    pub(super) hinting: OnceLock<taskhost_core::tasks::ListenerGuard>,
    /// Answers other nodes' dashboards, once this node serves one
    /// ([`super::dashboard`] sets it).
    pub(super) dashboard: OnceLock<DashboardHook>,
}

/// A node's dashboard as other nodes' asks reach it: the ask's JSON in,
/// the answer's JSON out (typed in `dashboard.rs`; kept as JSON here so the
/// membership depends on no caller's types).
pub type DashboardHook = Arc<
    dyn Fn(serde_json::Value) -> futures::future::BoxFuture<'static, Result<serde_json::Value, String>> + Send + Sync,
>;

/// The sessions whose notice hints a node keeps.
pub const MAX_HINTED_SESSIONS: usize = 4_096;

/// The notice hints this node heard: session → the nodes that hold unread
/// notices for it.
#[derive(Default)]
pub struct Hints(Mutex<std::collections::HashMap<String, std::collections::BTreeSet<String>>>);

impl Hints {
    /// `node` holds notices for `session` (all hints dropped when full).
    pub fn add(&self, session: String, node: String) {
        let mut hints = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if hints.len() >= MAX_HINTED_SESSIONS && !hints.contains_key(&session) {
            hints.clear();
        }
        hints.entry(session).or_default().insert(node);
    }

    /// The nodes hinted for `session`, forgotten here.
    pub fn take(&self, session: &str) -> std::collections::BTreeSet<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(session).unwrap_or_default()
    }
}

/// The starts this node sent each node since it last saw that node beat.
#[derive(Default)]
pub struct Placed {
    /// node → (the beat seen, starts sent since).
    pub(super) since_beat: std::collections::HashMap<String, (u64, u64)>,
    /// Turns through tied nodes.
    pub(super) turn: usize,
}

/// Why a beat did not renew the lease.
enum Missed {
    /// Another node declared this one gone, or another process claimed it.
    Fenced,
    /// NATS did not answer.
    Unreachable(String),
}

impl Membership {
    /// Claims `node` in the roster for this process, then beats for it.
    ///
    /// - A name nobody holds, or whose holder is gone (its process died on
    ///   this machine, or it stopped beating for `timeout`), is taken: the
    ///   records naming it are this process's to restore.
    /// - A name declared gone whose live records were not all settled yet
    ///   has them settled first (by this node, as any node would).
    /// - A name whose holder beats is refused, naming the holder.
    pub async fn claim(
        bucket: Bucket,
        client: tokio::runtime::Handle,
        node: &str,
        timeout: Duration,
        placement: super::config::Placement,
        labels: std::collections::BTreeMap<String, String>,
        copy_output: bool,
    ) -> anyhow::Result<Arc<Self>> {
        let session = super::record::write_token();
        let cluster = bucket.name().strip_prefix("taskhost-").unwrap_or(bucket.name()).to_string();
        let membership = Arc::new(Self {
            node: node.to_string(),
            cluster,
            timeout,
            placement,
            placed: Mutex::default(),
            load: Mutex::default(),
            located: Mutex::default(),
            labels,
            copy_output,
            bucket,
            client,
            lease: Mutex::new(Lease { session: session.clone(), until: Instant::now(), rejoining: false }),
            serving: OnceLock::new(),
            rejoin: tokio::sync::Mutex::new(()),
            hints: Default::default(),
            hinting: OnceLock::new(),
            dashboard: OnceLock::new(),
        });
        let claiming = membership.clone();
        membership.on_client(async move { claiming.claim_name(&session).await }).await??;
        membership.clone().start_beating();
        Ok(membership)
    }

    /// Runs `work` on the cluster client's runtime and waits for it.
    pub(super) async fn on_client<T: Send + 'static>(
        &self,
        work: impl std::future::Future<Output = T> + Send + 'static,
    ) -> anyhow::Result<T> {
        self.client.spawn(work).await.map_err(|error| anyhow::anyhow!("the cluster client's task failed: {error}"))
    }

    /// Claims the name for `session` (see [`Self::claim`]).
    async fn claim_name(&self, session: &str) -> anyhow::Result<()> {
        let mut watched: Option<(NodeEntry, Instant)> = None;
        loop {
            let current = roster::read(&self.bucket).await.map_err(anyhow::Error::msg)?;
            let held = current.nodes.get(&self.node).cloned();
            match &held {
                Some(entry) if entry.fenced_by.is_some() && !entry.swept => {
                    // Declared gone, its records not all settled yet.
                    let settler = entry.fenced_by.clone().unwrap_or_default();
                    let settled = sweep::sweep(&self.bucket, &self.node, &self.node, self.timeout_ms()).await?;
                    tracing::warn!(node = %self.node, declared_by = %settler, settled = settled.len(), "this node's name was declared gone; its live records are settled");
                }
                Some(entry) if entry.fenced_by.is_none() && entry.session != session && !entry.process_is_gone() => {
                    // Held by another process: taken only once it stops beating.
                    let same_beat = watched.as_ref().is_some_and(|(seen, _)| seen.pulse() == entry.pulse());
                    if watched.is_some() && !same_beat {
                        anyhow::bail!(
                            "the node name {:?} is in use: pid {} on {} beats for it in the cluster; give this server another [cluster] node name, or stop that one",
                            self.node,
                            entry.pid,
                            entry.host
                        );
                    }
                    let since = watched.get_or_insert_with(|| (entry.clone(), Instant::now())).1;
                    if since.elapsed() < self.timeout {
                        tracing::info!(node = %self.node, holder_pid = entry.pid, holder_host = %entry.host, "the node name is held; waiting to see whether its holder still beats");
                        tokio::time::sleep(self.beat_interval()).await;
                        continue;
                    }
                }
                _ => {}
            }
            let mine = NodeEntry::of_this_process(session, &self.labels);
            let expected = held.clone();
            let swept_now = held.as_ref().is_some_and(|entry| entry.fenced_by.is_some() && !entry.swept);
            let claimed = roster::update(&self.bucket, "claiming the node name", |roster| {
                let now = roster.nodes.get(&self.node);
                // Only over the entry decided on above (plus its sweep).
                let unchanged = match (now, &expected) {
                    (None, None) => true,
                    (Some(now), Some(seen)) => now.pulse() == seen.pulse() && (now.fenced_by == seen.fenced_by),
                    _ => false,
                };
                if !unchanged {
                    return Ok(None);
                }
                roster.nodes.insert(self.node.clone(), mine.clone());
                Ok(Some(()))
            })
            .await?;
            if claimed.is_some() {
                self.lease().until = Instant::now() + self.lease_length();
                tracing::info!(node = %self.node, session, after_sweep = swept_now, "the node name is claimed");
                return Ok(());
            }
        }
    }

    fn lease(&self) -> std::sync::MutexGuard<'_, Lease> {
        self.lease.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn timeout_ms(&self) -> u64 {
        u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX)
    }

    pub(super) fn beat_interval(&self) -> Duration {
        self.timeout / BEATS_PER_TIMEOUT
    }

    fn lease_length(&self) -> Duration {
        self.timeout.mul_f64(LEASE_SHARE)
    }

    /// Whether this node holds its lease now (and is not rejoining).
    pub(super) fn holds_lease(&self) -> bool {
        let lease = self.lease();
        !lease.rejoining && Instant::now() < lease.until
    }

    /// This process's session (its claim's token).
    pub(super) fn session(&self) -> String {
        self.lease().session.clone()
    }

    /// Hands the membership what it acts on once the host is built: the
    /// host whose registry it settles when fenced, and the durable trees'
    /// directory it kills trees in; and counts the host's load for the
    /// beats. False when it serves a host already.
    pub fn serve(self: &Arc<Self>, host: Host, trees_root: Option<PathBuf>) -> bool {
        let runtime = tokio::runtime::Handle::current();
        let first = self.serving.set(Serving { host: host.clone(), trees_root, runtime: runtime.clone() }).is_ok();
        if first {
            // Stable owners' output is copied to the cluster's output stream.
            if self.copy_output {
                let replica =
                    super::output::StreamReplica::start(self.bucket.jetstream().clone(), &self.cluster, &self.client);
                host.registry().replicate_output(replica);
            }
            // The first count, carried by a beat at once: until then the
            // others do not know which tools this node serves.
            let tools: Vec<String> = host.tool_definitions().into_iter().map(|tool| tool.name).collect();
            let live = u64::try_from(host.registry().live_count()).unwrap_or(u64::MAX);
            *self.load.lock().unwrap_or_else(|e| e.into_inner()) = Some((live, tools));
            let beating = self.clone();
            self.client.spawn(async move {
                if let Err(Missed::Unreachable(error)) = beating.beat().await {
                    tracing::warn!(node = %beating.node, %error, "a heartbeat could not be written");
                }
            });
            let membership = Arc::downgrade(self);
            let interval = self.beat_interval();
            runtime.spawn(async move {
                let mut ticks = tokio::time::interval(interval);
                loop {
                    ticks.tick().await;
                    let Some(membership) = membership.upgrade() else { return };
                    let counting = host.clone();
                    let counted = tokio::task::spawn_blocking(move || {
                        let live = u64::try_from(counting.registry().live_count()).unwrap_or(u64::MAX);
                        let tools: Vec<String> =
                            counting.tool_definitions().into_iter().map(|tool| tool.name).collect();
                        (live, tools)
                    })
                    .await;
                    if let Ok(counted) = counted {
                        *membership.load.lock().unwrap_or_else(|e| e.into_inner()) = Some(counted);
                    }
                }
            });
        }
        first
    }

    /// Hands the host ended records another node's sweep settled for this
    /// one (run on the host's runtime, never the client's: the registry
    /// calls the store, which waits on the client).
    pub(super) fn take_in(
        &self,
        tasks: Vec<(taskhost_core::tasks::store::StoredTask, Option<taskhost_core::tasks::replica::ReplayedOutput>)>,
    ) {
        if tasks.is_empty() {
            return;
        }
        match self.serving.get() {
            Some(serving) => {
                let host = serving.host.clone();
                let sessions: std::collections::BTreeSet<String> = tasks
                    .iter()
                    .filter_map(|(task, _)| task.owner.as_ref().filter(|owner| owner.durable))
                    .map(|owner| owner.session.as_str().to_string())
                    .collect();
                let taking = serving.runtime.spawn_blocking(move || host.take_in_ended_with_output(tasks));
                // Their owners, wherever connected, hear that this node
                // now holds their notices (once they are held).
                let hinting = self.hinter();
                serving.runtime.spawn(async move {
                    if taking.await.is_ok() {
                        for session in sessions {
                            hinting.hint(&session);
                        }
                    }
                });
            }
            None => tracing::warn!(
                tasks = tasks.len(),
                "settled records arrived before the host was built; they are loaded at the next start"
            ),
        }
    }

    /// Lets go of the ended tasks whose records the node that declared
    /// this one gone took over: their owners' calls go there (forwarded),
    /// so no task is served from two nodes with two read cursors.
    async fn release_taken_over(&self, host: &Host) {
        let ended: Vec<taskhost_core::ids::TaskId> = host
            .registry()
            .list_all()
            .into_iter()
            .filter(|task| task.status.is_terminal())
            .map(|task| task.id)
            .collect();
        let (bucket, node) = (self.bucket.clone(), self.node.clone());
        let found = self.on_client(async move { sweep::taken_over(&bucket, &node, ended).await }).await;
        match found.map_err(|error| error.to_string()).and_then(|found| found.map_err(|error| error.to_string())) {
            Ok(taken) => {
                let ids: Vec<_> = taken.iter().map(|task| task.id.clone()).collect();
                let released = host.registry().release_ended(&ids);
                // An end noticed here but recorded untold (the node was
                // fenced before the store heard): the node that took it
                // over tells it, so the notice waiting here is taken back.
                let mut retracted = 0;
                for task in taken.iter().filter(|task| task.untold) {
                    let Some(session) = task.session.as_deref() else { continue };
                    for agent in host.agents().durable_of(session) {
                        retracted += agent.retract_unread_about(&task.id);
                    }
                }
                tracing::info!(node = %self.node, released, retracted, "tasks another node took over are let go");
            }
            Err(error) => {
                tracing::warn!(node = %self.node, %error, "the tasks another node took over could not be found; they stay")
            }
        }
    }

    /// One beat: renews this session's entry unless it was fenced.
    async fn beat(&self) -> Result<(), Missed> {
        let session = self.session();
        let sent = Instant::now();
        // What placement reads, as last counted on the host's runtime (never
        // here: the registry holds its lock while it waits on this runtime).
        let load = self.load.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let renewed = roster::update(&self.bucket, "beating", |roster| match roster.nodes.get_mut(&self.node) {
            Some(entry) if entry.session == session && entry.fenced_by.is_none() => {
                entry.beat += 1;
                if let Some((live, tools)) = &load {
                    entry.live = *live;
                    entry.tools.clone_from(tools);
                }
                Ok(Some(()))
            }
            _ => Ok(None),
        })
        .await
        .map_err(|error| Missed::Unreachable(error.0))?;
        match renewed {
            Some(_) => {
                let mut lease = self.lease();
                if lease.session == session {
                    lease.until = sent + self.lease_length();
                }
                Ok(())
            }
            None => Err(Missed::Fenced),
        }
    }

    /// Beats every [`Self::beat_interval`] on the client's runtime; a beat
    /// that finds the node fenced starts the rejoin on the host's runtime.
    fn start_beating(self: Arc<Self>) {
        let client = self.client.clone();
        client.spawn(async move {
            let mut ticks = tokio::time::interval(self.beat_interval());
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match self.beat().await {
                    Ok(()) => {}
                    Err(Missed::Unreachable(error)) => {
                        tracing::warn!(node = %self.node, %error, "a heartbeat could not be written");
                    }
                    Err(Missed::Fenced) => {
                        if let Some(serving) = self.serving.get() {
                            let membership = self.clone();
                            serving.runtime.spawn(async move { membership.rejoin().await });
                        }
                    }
                }
            }
        });
    }

    /// Answers whether this node may serve a call now: within its lease,
    /// or after renewing it. A node found fenced rejoins first (settling
    /// its tasks); one that cannot reach NATS past its lease refuses.
    pub async fn confirm(self: &Arc<Self>) -> Result<(), String> {
        loop {
            {
                let lease = self.lease();
                if lease.rejoining {
                    return Err(format!(
                        "cluster unavailable, retry: node {} is settling its tasks after the cluster declared it gone",
                        self.node
                    ));
                }
                if Instant::now() < lease.until {
                    return Ok(());
                }
            }
            let membership = self.clone();
            let beat = self.on_client(async move { tokio::time::timeout(RENEW_WITHIN, membership.beat()).await }).await;
            match beat {
                Ok(Ok(Ok(()))) => return Ok(()),
                Ok(Ok(Err(Missed::Fenced))) => self.clone().rejoin().await,
                Ok(Ok(Err(Missed::Unreachable(error)))) => {
                    return Err(format!(
                        "cluster unavailable, retry: node {} cannot confirm it is still a member of the cluster ({error})",
                        self.node
                    ));
                }
                Ok(Err(_)) | Err(_) => {
                    return Err(format!(
                        "cluster unavailable, retry: node {} got no answer from NATS within {} s",
                        self.node,
                        RENEW_WITHIN.as_secs()
                    ));
                }
            }
        }
    }

    /// Whether the roster still names `session` as this node's, unfenced.
    async fn still_member(self: &Arc<Self>, session: &str) -> bool {
        let membership = self.clone();
        let entry = self
            .on_client(async move { roster::read(&membership.bucket).await })
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(|roster| roster.nodes.get(&self.node).cloned());
        entry.is_some_and(|entry| entry.session == session && entry.fenced_by.is_none())
    }

    /// After the cluster declared this node gone: settles its live tasks
    /// `lost`, kills every process tree it kept, and claims its name again
    /// under a new session. Serves nothing meanwhile.
    async fn rejoin(self: Arc<Self>) {
        let _one = self.rejoin.lock().await;
        let (held, fenced_session) = {
            let lease = self.lease();
            (Instant::now() < lease.until && !lease.rejoining, lease.session.clone())
        };
        // Rejoined already by the call that held the lock before?
        if held && self.still_member(&fenced_session).await {
            return;
        }
        self.lease().rejoining = true;
        tracing::error!(node = %self.node, "the cluster declared this node gone (it was silent too long): its tasks are settled lost and its process trees killed before it serves again");
        let detail = format!(
            "its node {} was silent for over {} s (no heartbeat), so the cluster settled its tasks; its process tree was killed and it was not run again",
            self.node,
            self.timeout_ms().div_ceil(1000)
        );
        if let Some(serving) = self.serving.get() {
            let lost = serving.host.registry().lose_live_tasks(&detail).await;
            let killed = serving.trees_root.as_deref().map_or(0, crate::durable_tasks::kill_every_tree);
            tracing::warn!(node = %self.node, lost, killed, "this node's tasks are settled lost");
            self.release_taken_over(&serving.host).await;
        }
        let session = super::record::write_token();
        loop {
            let membership = self.clone();
            let claiming = session.clone();
            match self.on_client(async move { membership.claim_name(&claiming).await }).await {
                Ok(Ok(())) => break,
                Ok(Err(error)) | Err(error) => {
                    tracing::error!(node = %self.node, error = %format!("{error:#}"), "rejoining the cluster failed; trying again");
                    tokio::time::sleep(self.beat_interval()).await;
                }
            }
        }
        let mut lease = self.lease();
        lease.session = session;
        lease.rejoining = false;
        tracing::info!(node = %self.node, old_session = %fenced_session, "this node rejoined the cluster");
    }
}
