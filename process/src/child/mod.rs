//! Everything that runs in a tree's processes between `fork` (or the
//! keeper's fresh `exec`) and the command's `execve`: the keeper K, the
//! init I, the command's last steps, and the probe's children.
//!
//! Invariant: code here allocates nothing, takes no lock and calls only
//! async-signal-safe functions (plain syscalls on data prepared before the
//! fork: C strings, fixed arrays, the BPF program). A forked child of a
//! multi-threaded host may find the allocator's or any other lock held by a
//! thread that no longer exists in it. Every `unsafe fn` here says in its
//! `# Safety` section in which process it may run. A step that fails ends
//! the set-up through [`exit::fail`] (exit 126 with a message on the tree's
//! own stderr); nothing here returns an error the host could see.
//!
//! - [`tree`]: K, I and the command (namespaces, limits, the status relay).
//! - [`mounts`]: the mount namespace's set-up (K's part and I's).
//! - [`lockdown`]: `no_new_privs`, Landlock, capabilities, seccomp.
//! - [`probe`]: the probe's children (what the kernel allows).
//! - [`sys`]: descriptors and `errno`.
//! - [`exit`]: how a failed set-up ends.

pub(crate) mod durable;
pub(crate) mod exit;
mod lockdown;
mod mounts;
pub(crate) mod probe;
mod sys;
mod tree;
