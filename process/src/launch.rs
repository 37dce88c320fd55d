//! How a tree's keeper K comes to exist: the one place that chooses between
//! handing the plan to a warm keeper started ahead of need
//! ([`crate::zygote`]), re-running this binary as a keeper
//! ([`crate::keeper`]) and forking K from the host ([`crate::confine`]).
//!
//! Model: a binary that opted in ([`crate::keeper::run_if_keeper`]) hands the
//! plan to the waiting zygote, which becomes K (no `exec` waited for);
//! without one (none ready, a plan over [`crate::zygote::MAX_PLAN_BYTES`], a
//! failed hand-off) it is started again as K, which spares the host a `fork`
//! of its (large) address space; any other binary forks K. All three run the
//! same set-up code ([`ChildPlan`]), so the tree and its guarantees are the
//! same. A durable tree's K takes the same path: its duties' descriptors and
//! secret are handed over with the plan ([`keeper::DurableHandover`]), and
//! only a forked one listens before the start returns (the others say so on
//! `Forked::listening`, which the first request to K waits for).
//!
//! Invariant: each choice degrades once and says so: when the binary cannot
//! be run again (a noexec mount, a sandbox that forbids exec of it), every
//! later start forks; when zygotes keep failing their hand-off, every later
//! start execs its keeper.

use std::io;
use std::os::fd::RawFd;

use crate::confine::{ChildPlan, Forked};
use crate::keeper::{self, zygote};

/// Starts the tree described by `plan` and returns as soon as K exists: the
/// tree sets itself up concurrently, and failures from then on reach the
/// process's stderr and exit code 126 (set-up) or 127 (exec), as shells do.
/// `stdin`: the read end of the tree's stdin pipe, or `None` for `/dev/null`.
pub(crate) fn start(plan: &ChildPlan, stdin: Option<RawFd>) -> io::Result<Forked> {
    if keeper::exec_keeper_available()
        && let Some(forked) = zygote::start(plan, stdin)?
    {
        return Ok(forked);
    }
    exec_or_fork(plan, stdin)
}

/// K as this binary started again ([`keeper::spawn`]), or forked when it
/// cannot be.
fn exec_or_fork(plan: &ChildPlan, stdin: Option<RawFd>) -> io::Result<Forked> {
    if !keeper::exec_keeper_available() {
        return plan.fork(stdin);
    }
    match keeper::spawn(plan, stdin) {
        Err(error) if keeper::cannot_exec(&error) => {
            keeper::disable_exec_keeper(&error);
            plan.fork(stdin)
        }
        other => other,
    }
}
