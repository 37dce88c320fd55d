//! `[tasks]`: the settings of the registry and the control tools, as the
//! configuration file spells them (milliseconds, 0 for "none").
//!
//! Invariant: [`TasksSettings::validate`] accepts exactly the settings
//! [`crate::Host::new`] can run with; every refusal names the key.

use std::time::Duration;

use serde::Deserialize;

use crate::tasks::{OutputLimits, RegistryConfig};
use crate::tools::control::ControlToolsConfig;

/// `[tasks]`: the registry and the control tools.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct TasksSettings {
    pub max_live_tasks_per_owner: usize,
    /// 0 waits forever for a cancelled task during teardown.
    pub teardown_timeout_ms: u64,
    pub wait_timeout_ms: u64,
    pub max_wait_timeout_ms: u64,
    /// Finished tasks kept per owner; older reported ones are dropped.
    pub max_finished_tasks_per_owner: usize,
    /// Output of a stream task kept in memory (its last bytes).
    pub output_memory_bytes: usize,
    /// Output of every stream task kept in memory together; beyond it the
    /// oldest finished tasks' output (then the oldest live ones') lives in
    /// their log files only.
    pub output_memory_total_bytes: usize,
    /// Output of a stream task kept in its spill file (its first bytes), 0
    /// for none.
    pub output_spill_bytes: u64,
    /// The most one consuming `task_output` read returns.
    pub output_read_bytes: usize,
    /// Time to live of a background task whose start names none
    /// (`ttl_ms`), in milliseconds; 0 (the default) for none. A task its
    /// owner has not read for this long is stopped, after one notice.
    pub default_ttl_ms: u64,
    /// The same for a stable owner's task (an HTTP token, `serve --owner`),
    /// which outlives its connection and the server; 0 for none. Default: a
    /// day.
    pub stable_owner_ttl_ms: u64,
}

impl Default for TasksSettings {
    fn default() -> Self {
        let registry = RegistryConfig::default();
        let control = ControlToolsConfig::default();
        Self {
            max_live_tasks_per_owner: registry.max_live_tasks_per_owner,
            teardown_timeout_ms: registry.teardown_timeout.map_or(0, |t| t.as_millis() as u64),
            wait_timeout_ms: control.wait_timeout_ms,
            max_wait_timeout_ms: control.max_wait_timeout_ms,
            max_finished_tasks_per_owner: registry.max_finished_tasks_per_owner,
            output_memory_bytes: registry.output.memory_bytes,
            output_memory_total_bytes: registry.output.memory_total_bytes,
            output_spill_bytes: registry.output.spill_bytes,
            output_read_bytes: registry.output.read_bytes,
            default_ttl_ms: registry.default_ttl.map_or(0, |t| t.as_millis() as u64),
            stable_owner_ttl_ms: registry.stable_owner_ttl.map_or(0, |t| t.as_millis() as u64),
        }
    }
}

impl TasksSettings {
    pub fn registry(&self) -> RegistryConfig {
        RegistryConfig {
            max_live_tasks_per_owner: self.max_live_tasks_per_owner,
            teardown_timeout: (self.teardown_timeout_ms > 0).then(|| Duration::from_millis(self.teardown_timeout_ms)),
            max_finished_tasks_per_owner: self.max_finished_tasks_per_owner,
            // Where log files go, the host sets (each owner's own directory).
            output: OutputLimits::new(self.output_memory_bytes, self.output_spill_bytes, self.output_read_bytes)
                .with_memory_total_bytes(self.output_memory_total_bytes),
            default_ttl: (self.default_ttl_ms > 0).then(|| Duration::from_millis(self.default_ttl_ms)),
            stable_owner_ttl: (self.stable_owner_ttl_ms > 0).then(|| Duration::from_millis(self.stable_owner_ttl_ms)),
        }
    }

    pub fn control_tools(&self) -> ControlToolsConfig {
        ControlToolsConfig { wait_timeout_ms: self.wait_timeout_ms, max_wait_timeout_ms: self.max_wait_timeout_ms }
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.control_tools().validate().map_err(|e| anyhow::anyhow!("[tasks] {e}"))?;
        for (key, ms) in [("default_ttl_ms", self.default_ttl_ms), ("stable_owner_ttl_ms", self.stable_owner_ttl_ms)] {
            anyhow::ensure!(
                ms == 0 || crate::tasks::TTL_MS_RANGE.contains(&ms),
                "[tasks] {key} must be 0 (none) or from {} to {} (milliseconds)",
                crate::tasks::TTL_MS_RANGE.start(),
                crate::tasks::TTL_MS_RANGE.end()
            );
        }
        anyhow::ensure!(self.max_live_tasks_per_owner > 0, "[tasks] max_live_tasks_per_owner must be at least 1");
        anyhow::ensure!(
            self.max_finished_tasks_per_owner > 0,
            "[tasks] max_finished_tasks_per_owner must be at least 1 (the finished tasks each owner keeps)"
        );
        anyhow::ensure!(
            (4096..=(64 << 20)).contains(&self.output_memory_bytes),
            "[tasks] output_memory_bytes must be from 4096 to 67108864 (the output kept in memory per task)"
        );
        anyhow::ensure!(
            self.output_memory_total_bytes >= self.output_memory_bytes,
            "[tasks] output_memory_total_bytes must be at least output_memory_bytes ({}): the output of every task \
             kept in memory together holds at least one task's",
            self.output_memory_bytes
        );
        anyhow::ensure!(
            (1024..=self.output_memory_bytes).contains(&self.output_read_bytes),
            "[tasks] output_read_bytes must be from 1024 to output_memory_bytes ({})",
            self.output_memory_bytes
        );
        anyhow::ensure!(
            self.output_spill_bytes <= 1 << 40,
            "[tasks] output_spill_bytes must be at most 1099511627776 (1 TiB); 0 keeps no spill file"
        );
        Ok(())
    }
}
