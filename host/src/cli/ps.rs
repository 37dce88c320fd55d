//! `taskhost ps`: the tasks the store holds, read without a server (what
//! runs, who owns it, since when), as a table or JSON.
//!
//! Invariant: read-only: the store is opened read-only, nothing is claimed,
//! settled or deleted, and a running server's writes are seen as of their
//! last commit.

use std::path::PathBuf;
use std::time::SystemTime;

use anyhow::Context as _;
use taskhost_core::tasks::store::StoredTask;

use crate::cli::serve::load_config;
use crate::state::StateDir;
use crate::state::store::{STORE_FILE, read_all};

#[derive(Debug, clap::Args)]
pub struct PsArgs {
    /// Configuration file (its `[state] dir`) [default: ./taskhost.toml if present]
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Every record, finished ones too (default: running and stopping only)
    #[arg(long)]
    pub all: bool,
    /// One JSON array of records instead of the table
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: PsArgs) -> anyhow::Result<()> {
    let (config, _) = load_config(args.config.as_deref())?;
    let state = StateDir::open_configured(&config.state)?;
    let file = state.file(STORE_FILE);
    let tasks: Vec<StoredTask> = if file.exists() {
        read_all(&file)?.into_iter().filter(|task| args.all || !task.status.is_terminal()).collect()
    } else {
        Vec::new()
    };
    let now = SystemTime::now();
    let age = |task: &StoredTask| now.duration_since(task.started_at).map_or(0, |d| d.as_secs());
    let text = if args.json {
        let records: Vec<serde_json::Value> = tasks
            .iter()
            .map(|task| {
                serde_json::json!({
                    "id": task.id.as_str(),
                    "kind": task.kind,
                    "owner": task.owner.as_ref().map(|o| o.session.as_str()),
                    "stable_owner": task.owner.as_ref().is_some_and(|o| o.durable),
                    "status": task.status.as_str(),
                    "detail": task.detail,
                    "age_s": age(task),
                    "label": task.label,
                })
            })
            .collect();
        serde_json::to_string_pretty(&records).context("writing JSON")? + "\n"
    } else if tasks.is_empty() {
        format!("(no {}tasks in {})\n", if args.all { "" } else { "live " }, file.display())
    } else {
        let mut text = format!("{:<16} {:<20} {:<10} {:>8}  {}\n", "ID", "OWNER", "STATUS", "AGE", "COMMAND OR LABEL");
        for task in &tasks {
            let owner = task.owner.as_ref().map_or("-", |o| o.session.as_str());
            let label: String = task.label.chars().take(80).map(|c| if c.is_control() { ' ' } else { c }).collect();
            text.push_str(&format!(
                "{:<16} {:<20} {:<10} {:>7}s  {label}\n",
                task.id.as_str(),
                owner,
                task.status.as_str(),
                age(task)
            ));
        }
        text
    };
    crate::cli::out::write(&text)
}
