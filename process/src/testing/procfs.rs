//! Finding test processes through `/proc`, never through taskhost's own
//! bookkeeping: a leak test is only worth something if it looks where the
//! kernel keeps the truth.
//!
//! A test marks every process it causes with an environment variable
//! (`NAME=VALUE`) that no other process on the machine carries; children
//! inherit it, including ones that `setsid`, `nohup` or double-fork.

use std::time::{Duration, Instant};

/// A bash command that leaves a `setsid` daemon, a `nohup` one and a
/// double-forked orphan, says `started`, then blocks (bash execs its last
/// command): four processes that inherit the command's environment.
pub const ESCAPEES: &str =
    "setsid sleep 1000 & nohup sleep 1000 >/dev/null 2>&1 & ( (sleep 1000 &) & ); echo started; sleep 1000";

/// A numeric field of `/proc/<pid>/stat`, counted from the one after the
/// parenthesised command (`state` is 0, `ppid` 1, `pgrp` 2, …).
pub fn stat_field(pid: u32, index: usize) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(index)?.parse().ok()
}

/// The parent of `pid`.
pub fn parent(pid: u32) -> Option<u32> {
    stat_field(pid, 1)
}

/// Every pid in `/proc`.
pub fn all_pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries.flatten().filter_map(|e| e.file_name().to_string_lossy().parse().ok()).collect()
}

/// `pid`'s parent, grandparent, … up to (excluding) pid 0.
pub fn ancestors(pid: u32) -> Vec<u32> {
    let mut chain = Vec::new();
    let mut at = pid;
    while let Some(up) = parent(at).filter(|p| *p != 0) {
        chain.push(up);
        at = up;
    }
    chain
}

/// The command line of `pid`, arguments joined by spaces.
pub fn cmdline(pid: u32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw).trim_end_matches('\0').replace('\0', " ")
}

/// A unique environment variable that marks a test's processes.
#[derive(Clone, Debug)]
pub struct ProcessMark {
    pub name: String,
    pub value: String,
}

impl ProcessMark {
    /// The variable's name (a grant must let the tests set it).
    pub const NAME: &str = "TASKHOST_TEST_MARK";

    /// `TASKHOST_TEST_MARK=<tag>-<pid of the test process>`.
    pub fn new(tag: &str) -> Self {
        Self::with_value(format!("{tag}-{}", std::process::id()))
    }

    /// `TASKHOST_TEST_MARK=<value>`: a mark another process chose.
    pub fn with_value(value: String) -> Self {
        Self { name: Self::NAME.to_string(), value }
    }

    /// `export NAME=VALUE; `: a prefix for a shell command that marks every
    /// process the command starts after it.
    pub fn export(&self) -> String {
        format!("export {}={}; ", self.name, self.value)
    }

    /// The pids of live processes carrying the mark in their environment.
    /// Zombies have an empty environ and do not count: they hold nothing.
    pub fn pids(&self) -> Vec<u32> {
        let needle = format!("{}={}", self.name, self.value).into_bytes();
        all_pids()
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|environ| environ.split(|b| *b == 0).any(|var| var == needle.as_slice()))
            })
            .collect()
    }

    /// Waits (up to `within`) until at least `n` marked processes are alive.
    pub async fn await_at_least(&self, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.pids().len() < n {
            assert!(Instant::now() < deadline, "expected {n} marked processes, found {:?}", self.pids());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (up to `within`) until no marked process is alive; fails naming
    /// the survivors and their command lines.
    pub async fn assert_none_within(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                let described: Vec<String> = pids.iter().map(|pid| format!("{pid} {:?}", cmdline(*pid))).collect();
                panic!("leaked processes: {described:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
