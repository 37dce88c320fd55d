//! The cluster: `taskhost serve` nodes sharing one task registry on NATS
//! JetStream (`[cluster]` in `taskhost.toml`, or `serve --cluster URL`).
//! Without `[cluster]` nothing here runs: one machine, the SQLite store.
//!
//! - [`config`]: `[cluster]`, checked at load.
//! - [`connect`]: joining NATS (credentials, TLS), refusing anonymous servers.
//! - [`store`]: [`store::ClusterStore`], the [`TaskStore`] on a key-value bucket.
//! - [`bucket`]: the key-value bucket and its compare-and-set write.
//! - [`ids`]: the id counters every node shares.
//! - [`record`]: a task record as the bucket holds it.
//! - [`roster`]: the nodes that joined, their heartbeats and fences.
//! - [`membership`]: this node's claim on its name, its heartbeat and lease,
//!   and its rejoin after the others declared it gone.
//! - [`watch`]: declaring a silent node gone; [`sweep`]: settling its tasks.
//! - [`output`]: stable owners' output in a JetStream stream, replayed by
//!   the node that takes a gone node's task in.
//! - [`forward`]: control calls about another node's tasks, answered there;
//!   [`placement`]: which node runs a start under `placement = "spread"`;
//!   [`notices`]: an owner told on the node it calls of ends settled on others.
//!
//! Invariants: `taskhost-core` knows nothing of NATS (the seam is
//! [`TaskStore`]); the NATS secrets are read by the server only, never put
//! in a task's environment, and lie among the paths no process tree may
//! read ([`crate::config::Config::protected_paths`]).

pub mod bucket;
pub mod config;
pub mod connect;
pub mod dashboard;
pub mod forward;
pub mod ids;
pub mod membership;
pub mod notices;
pub mod output;
pub mod placement;
pub mod record;
pub mod roster;
pub mod store;
pub mod sweep;
pub mod watch;

use std::sync::Arc;

use taskhost_core::tasks::store::TaskStore;

/// Joins the cluster `settings` names: opens its registry and claims this
/// node's name in its roster (refused while another process beats for it),
/// then beats and watches the other nodes until the store is dropped.
pub async fn join(
    settings: &config::ClusterSettings,
) -> anyhow::Result<(Arc<dyn TaskStore>, Arc<membership::Membership>)> {
    settings.check_servers().map_err(anyhow::Error::msg)?;
    let node = settings.node_name();
    let span = tracing::info_span!("cluster", cluster = %settings.name, node = %node);
    let _entered = span.enter();
    let (owned, name) = (settings.clone(), node.clone());
    let store = store::ClusterStore::open(
        move || async move { connect::connect(&owned, &name).await },
        &settings.bucket(),
        &node,
    )
    .await?;
    let copy_output = settings.output_stream_bytes > 0;
    if copy_output {
        let (js, cluster, bucket) = (store.bucket().jetstream().clone(), settings.name.clone(), settings.bucket());
        let max_bytes = i64::try_from(settings.output_stream_bytes).unwrap_or(i64::MAX);
        store
            .client_runtime()
            .spawn(async move { output::open_stream(&js, &cluster, &bucket, max_bytes).await })
            .await
            .map_err(|error| anyhow::anyhow!("opening the output stream: {error}"))??;
    } else {
        tracing::info!("[cluster] output_stream_bytes = 0: stable owners' output stays on its node");
    }
    let membership = membership::Membership::claim(
        store.bucket().clone(),
        store.client_runtime().clone(),
        &node,
        std::time::Duration::from_millis(settings.node_timeout_ms),
        settings.placement,
        settings.labels.clone(),
        copy_output,
    )
    .await?;
    watch::start(membership.clone());
    tracing::info!(store = %store.describe(), "the registry is the cluster's");
    Ok((store::shared(store), membership))
}

/// Makes the joined node serve `host`: its membership settles the host's
/// tasks if the cluster declares the node gone (killing the trees under
/// `trees_root`), its beats carry the host's load, and it answers the
/// calls other nodes forward to it.
pub fn serve(
    membership: &Arc<membership::Membership>,
    host: taskhost_core::Host,
    trees_root: Option<std::path::PathBuf>,
) {
    if membership.serve(host.clone(), trees_root) {
        // Owners connected elsewhere hear of the notices held here.
        membership.start_hinting(&host);
        membership.answer_forwarded_calls(host, tokio::runtime::Handle::current());
    }
}
