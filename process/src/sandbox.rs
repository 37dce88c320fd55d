//! What a tree may not do once it runs: no capabilities, `no_new_privs`
//! and a seccomp filter (its filesystem view is [`crate::view`]'s).
//!
//! ## Model
//! The BPF program is built once per host process ([`SeccompPrograms::build`])
//! and installed by [`crate::child`] in I (or the command itself without a
//! PID namespace) as the last step before the command, after
//! `no_new_privs`, Landlock and dropping every capability. From there on no
//! process of the tree can undo a mount, gain a capability, or call the
//! refused syscalls.
//!
//! Invariants: the tree's mounts are owned by its user namespace, so only a
//! process with `CAP_SYS_ADMIN` in it could undo them, and nothing past the
//! lock-down has capabilities (the filter refuses the mount calls besides).

/// The seccomp filter of every tree: refuses (EPERM) the calls that reach
/// other processes' memory, the kernel's key rings, BPF, perf, modules,
/// kexec, mounts, namespaces of others, and new user namespaces; `clone3`
/// gets ENOSYS (its flags cannot be inspected) so libc falls back to
/// `clone`, whose flags can.
pub(crate) struct SeccompPrograms {
    pub(crate) programs: Vec<seccompiler::BpfProgram>,
}

impl std::fmt::Debug for SeccompPrograms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeccompPrograms").field("programs", &self.programs.len()).finish()
    }
}

/// Syscalls the tree may never make.
const REFUSED_SYSCALLS: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_setns,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

impl SeccompPrograms {
    /// Builds the filter for this architecture; `None` where seccompiler
    /// has no target for it (the probe reports seccomp off then).
    pub(crate) fn build() -> Option<Self> {
        use seccompiler::{
            SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
        };
        use std::collections::BTreeMap;
        let arch: seccompiler::TargetArch = std::env::consts::ARCH.try_into().ok()?;
        let mut rules: BTreeMap<i64, Vec<SeccompRule>> = REFUSED_SYSCALLS.iter().map(|&nr| (nr, Vec::new())).collect();
        let new_user = |arg| {
            SeccompRule::new(vec![
                SeccompCondition::new(
                    arg,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(libc::CLONE_NEWUSER as u64),
                    libc::CLONE_NEWUSER as u64,
                )
                .ok()?,
            ])
            .ok()
        };
        rules.insert(libc::SYS_unshare, vec![new_user(0)?]);
        rules.insert(libc::SYS_clone, vec![new_user(0)?]);
        let refuse =
            SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch).ok()?;
        let clone3 = SeccompFilter::new(
            [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )
        .ok()?;
        let programs = vec![refuse.try_into().ok()?, clone3.try_into().ok()?];
        Some(Self { programs })
    }
}
