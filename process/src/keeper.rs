//! The exec'd keeper: a process tree started without forking the host, by
//! `posix_spawn` of `/proc/self/exe` [`KEEPER_ARG`] (the warm keeper,
//! [`zygote`], is the same process started ahead of need).
//!
//! Why: `fork` copies every mapping of the host, thousands once wasmtime's
//! pool exists (0.7 ms with the default pool, 8 ms with 10 240 stores, 0.09 ms
//! for a small process); `posix_spawn` copies none, and the fresh process sets
//! up the namespaces and forks I and C exactly as a forked K does
//! ([`super::confine`]). A binary opts in by calling [`run_if_keeper`] first
//! thing in `main`; binaries that do not (test harnesses, embedders) fork K.
//!
//! Protocol (private to one binary, so unversioned): `argv` is `[exe,
//! KEEPER_ARG, ns_flags, loopback, lifeline_fd, landlock_fd, seccomp,
//! rlimit_nproc, rlimit_data, rlimit_nofile, rlimit_fsize, cgroups, paths...,
//! mounts, mount entries..., durable, cwd, program, "--", argv...]` (0 or -1
//! for "none"; mount entries as [`super::view::MountPlan::to_args`]; durable
//! `-`, or `<deadline>:<log cap>:<stdin 0|1>` for a durable tree's K, whose
//! duties' descriptors are [`DURABLE_FDS`] and whose secret is read from
//! [`SECRET_FD`], never an argument another process could read; it listens
//! on its socket itself, so that the socket's peer is K, and says so on
//! [`LISTENING_FD`]); the
//! environment is the command's; fds 0–2 are its stdin, stdout and stderr;
//! it already leads a session of its own.
//!
//! Invariants: the keeper writes nothing of its own to stdout or stderr (they
//! are the command's) except a `taskhost: …` line before exiting 126 when its
//! arguments are unusable; it never returns into `main`.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};

use super::confine::{Bounds, ChildPlan, ExecPlan, Forked};
use super::plan::{DurablePlan, SECRET_BYTES};
use super::view::MountPlan;

pub mod zygote;

/// The first argument that makes a binary that called [`run_if_keeper`] a
/// keeper.
pub const KEEPER_ARG: &str = "--taskhost-process-keeper";

/// Where an exec'd durable K finds its duties' descriptors, in the order of
/// [`crate::plan::DurablePlan::fds`] (a missing stdin is left out).
const DURABLE_FDS: [RawFd; 7] = [5, 6, 7, 8, 9, 10, 11];
/// A pipe holding the durable K's secret, read once and closed.
const SECRET_FD: RawFd = 12;
/// A pipe the durable K writes a byte to once its socket listens (see
/// [`Forked::listening`]).
const LISTENING_FD: RawFd = 13;
/// The lowest descriptor number no keeper target uses.
const FIRST_FREE_FD: RawFd = 14;

/// What a durable K's argument says besides its descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DurableArgs {
    deadline: libc::time_t,
    log_cap: u64,
    stdin: bool,
}

static EXEC_KEEPER: AtomicBool = AtomicBool::new(false);

/// In a keeper (started by [`spawn`]) or a warm keeper (started by
/// [`zygote`]): runs it and never returns. Otherwise records that
/// this binary can be started as a keeper, so process trees are spawned
/// without forking this process. Call it first in `main`, before any thread
/// starts.
pub fn run_if_keeper() {
    let mut args = std::env::args_os();
    match args.nth(1) {
        Some(arg) if arg == KEEPER_ARG => {
            let rest: Vec<OsString> = args.collect();
            keeper_main(rest)
        }
        Some(arg) if arg == zygote::ZYGOTE_ARG => zygote::zygote_main(),
        _ => {}
    }
    EXEC_KEEPER.store(true, Ordering::Relaxed);
}

/// Whether this binary opted in (see the module doc) and running it again
/// has not failed.
pub fn exec_keeper_available() -> bool {
    EXEC_KEEPER.load(Ordering::Relaxed)
}

/// Errors of `posix_spawn` that mean this binary cannot be executed again
/// here (as opposed to a transient shortage such as EAGAIN or ENOMEM).
pub(crate) fn cannot_exec(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EACCES | libc::ENOENT | libc::ENOEXEC | libc::EPERM | libc::ETXTBSY))
}

/// Falls back to forking K for the rest of this process's life.
pub(crate) fn disable_exec_keeper(error: &io::Error) {
    if EXEC_KEEPER.swap(false, Ordering::Relaxed) {
        tracing::warn!(
            %error,
            "cannot run this binary again as the process keeper; forking process trees instead (slower starts)"
        );
    }
}

fn keeper_main(args: Vec<OsString>) -> ! {
    let plan = plan_from_args(&args, std::env::vars_os().collect()).and_then(|(mut plan, durable)| {
        if let Some(durable) = durable {
            plan.durable = Some(take_up_durable(durable)?);
        }
        Ok(plan)
    });
    match plan {
        // SAFETY: a fresh, single-threaded process whose stdio and process
        // group `spawn` set up; `in_child` only ever execs or exits.
        Ok(plan) => unsafe { plan.in_child(0, 1, 2) },
        Err(error) => {
            eprintln!("taskhost: the process keeper cannot start: {error}");
            std::process::exit(126)
        }
    }
}

/// In a keeper about to become a durable tree's K (exec'd, or a warm
/// keeper that received such a plan): its duties from the descriptors
/// installed at [`DURABLE_FDS`], [`SECRET_FD`] and [`LISTENING_FD`]; it
/// listens on its socket and says so.
pub(crate) fn take_up_durable(args: DurableArgs) -> io::Result<DurablePlan> {
    let durable = durable_plan(args)?;
    // Listening here, not in the host: a client sees the process that
    // called listen as the socket's peer, and must see K.
    // SAFETY: listen on the bound socket K was handed.
    if unsafe { libc::listen(durable.socket.as_raw_fd(), 8) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut listening = std::fs::File::from(present(LISTENING_FD)?);
    match std::io::Write::write_all(&mut listening, b"l") {
        // The host that spawned it is gone (it answered the start, then
        // stopped): the tree is the next host's to adopt.
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => {}
        other => other?,
    }
    Ok(durable)
}

/// A durable K's duties, from the descriptors installed for it and the
/// secret in its pipe.
fn durable_plan(args: DurableArgs) -> io::Result<DurablePlan> {
    let [stdout, stderr, stdin, dir, stdout_log, stderr_log, socket] = DURABLE_FDS;
    let mut secret = [0u8; SECRET_BYTES];
    let mut pipe = std::fs::File::from(present(SECRET_FD)?);
    std::io::Read::read_exact(&mut pipe, &mut secret)?;
    drop(pipe);
    Ok(DurablePlan {
        stdout: present(stdout)?,
        stderr: present(stderr)?,
        stdout_w: None,
        stderr_w: None,
        stdin: {
            let slot = present(stdin)?;
            // Without a stdin pipe the slot holds /dev/null: closed here.
            args.stdin.then_some(slot)
        },
        dir: present(dir)?,
        stdout_log: present(stdout_log)?,
        stderr_log: present(stderr_log)?,
        socket: present(socket)?,
        secret,
        deadline: args.deadline,
        log_cap: args.log_cap,
    })
}

/// The descriptor [`spawn`] installed at `fd`, now owned here.
fn present(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD only inspects the descriptor.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("descriptor {fd} was not inherited")));
    }
    // SAFETY: the spawner installed it for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Rebuilds the plan from [`plan_args`]' list and the command's
/// environment, with a durable K's arguments if it is one.
pub(crate) fn plan_from_args(
    args: &[OsString],
    env: std::collections::BTreeMap<OsString, OsString>,
) -> io::Result<(ChildPlan, Option<DurableArgs>)> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("bad keeper argument: {what}"));
    let text = |i: usize| args.get(i).and_then(|a| a.to_str()).ok_or_else(|| bad("missing or not UTF-8"));
    let number = |i: usize| text(i)?.parse::<i32>().map_err(|_| bad("not a number"));
    let ns_flags = number(0)?;
    let loopback_up = number(1)? == 1;
    let lifeline = number(2)?;
    let landlock = number(3)?;
    let seccomp = number(4)? == 1;
    let limit = |i: usize| text(i)?.parse::<u64>().map_err(|_| bad("not a limit"));
    let (nproc, data, nofile, fsize) = (limit(5)?, limit(6)?, limit(7)?, limit(8)?);
    let n_cgroups = number(9)?.max(0) as usize;
    let cgroups = args.get(10..10 + n_cgroups).ok_or_else(|| bad("fewer cgroups than announced"))?;
    let cgroup_procs = cgroups
        .iter()
        .map(|a| std::ffi::CString::new(a.as_bytes()).map_err(|_| bad("a cgroup path holds a NUL byte")))
        .collect::<io::Result<Vec<_>>>()?;
    let bounds = Bounds { cgroup_procs, nproc, data, nofile, fsize };
    let n_mounts = number(10 + n_cgroups)?;
    let mut at = 11 + n_cgroups;
    let mounts = if n_mounts >= 0 {
        let n = n_mounts as usize;
        let entries = args.get(at..at + n).ok_or_else(|| bad("fewer mount entries than announced"))?;
        at += n;
        let (plan, used) = MountPlan::from_args(&entries.iter().map(|a| a.as_bytes()).collect::<Vec<_>>())?;
        if used != n {
            return Err(bad("the view is longer than announced"));
        }
        Some(plan)
    } else {
        None
    };
    let durable = match text(at)? {
        "-" => None,
        spec => {
            let mut parts = spec.split(':');
            let mut field = || parts.next().ok_or_else(|| bad("a short durable argument"));
            let deadline = field()?.parse::<libc::time_t>().map_err(|_| bad("the durable deadline"))?;
            let log_cap = field()?.parse::<u64>().map_err(|_| bad("the durable log cap"))?;
            let stdin = match field()? {
                "0" => false,
                "1" => true,
                _ => return Err(bad("the durable stdin flag")),
            };
            Some(DurableArgs { deadline, log_cap, stdin })
        }
    };
    at += 1;
    let cwd = args.get(at).ok_or_else(|| bad("no working directory"))?;
    let program = args.get(at + 1).ok_or_else(|| bad("no program"))?;
    if args.get(at + 2).is_none_or(|a| a != "--") {
        return Err(bad("no `--` before the command's argv"));
    }
    let argv: Vec<String> = args[at + 3..].iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let exec = ExecPlan::new(std::path::Path::new(program), &argv, &env)?;
    for fd in [lifeline, landlock].into_iter().filter(|fd| *fd >= 0) {
        // SAFETY: F_GETFD only inspects the descriptor.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("descriptor {fd} was not inherited")));
        }
    }
    // SAFETY: the spawner passed these descriptors to us; nothing else owns them.
    let landlock = (landlock >= 0).then(|| unsafe { OwnedFd::from_raw_fd(landlock) });
    let plan = ChildPlan::for_keeper(
        ns_flags,
        loopback_up,
        mounts,
        landlock,
        seccomp,
        lifeline,
        cwd.as_bytes(),
        exec,
        bounds,
    )?;
    Ok((plan, durable))
}

/// The keeper's arguments after [`KEEPER_ARG`] (see the module doc), with
/// `lifeline` and `landlock` as the descriptor numbers K will find them at
/// (-1: no Landlock ruleset). The warm keeper ([`zygote`]) sends the
/// same list over its socket.
pub(crate) fn plan_args(plan: &ChildPlan, lifeline: RawFd, landlock: RawFd) -> Vec<CString> {
    let mount_args = plan.mounts.as_ref().map(|m| m.to_args());
    let numbers = [
        plan.ns_flags.to_string(),
        u8::from(plan.loopback_up).to_string(),
        lifeline.to_string(),
        landlock.to_string(),
        u8::from(plan.seccomp.is_some()).to_string(),
        plan.bounds.nproc.to_string(),
        plan.bounds.data.to_string(),
        plan.bounds.nofile.to_string(),
        plan.bounds.fsize.to_string(),
        plan.bounds.cgroup_procs.len().to_string(),
    ];
    let mut argv: Vec<CString> = numbers.iter().map(|n| CString::new(n.as_str()).expect("digits")).collect();
    argv.extend(plan.bounds.cgroup_procs.iter().cloned());
    argv.push(CString::new(mount_args.as_ref().map_or(-1, |m| m.len() as i64).to_string()).expect("digits"));
    argv.extend(mount_args.into_iter().flatten());
    let durable = match &plan.durable {
        None => "-".to_owned(),
        Some(d) => format!("{}:{}:{}", d.deadline, d.log_cap, u8::from(d.stdin.is_some())),
    };
    argv.push(CString::new(durable).expect("digits"));
    argv.extend([plan.cwd.clone(), plan.exec.path.clone(), c"--".into()]);
    argv.extend(plan.exec.argv.iter().cloned());
    argv
}

/// Starts K as `/proc/self/exe` in keeper mode (see the module doc); returns
/// once its `exec` succeeded. `stdin`: the read end of the tree's stdin pipe,
/// or `None` for `/dev/null`.
///
/// A durable tree's K (`plan.durable`) gets the tree's stdout and stderr
/// (the pipes it copies into the logs), its duties' descriptors at
/// [`DURABLE_FDS`], its secret through a pipe at [`SECRET_FD`], no
/// lifeline, and [`LISTENING_FD`], whose other end is
/// [`Forked::listening`].
pub(crate) fn spawn(plan: &ChildPlan, stdin: Option<RawFd>) -> io::Result<Forked> {
    let (stdout, stdout_w) = super::confine::pipe()?;
    let (stderr, stderr_w) = super::confine::pipe()?;
    let lifeline_target = if plan.durable.is_some() { -1 } else { 3 };
    let landlock_target = if plan.landlock.is_some() { 4 } else { -1 };
    let mut argv: Vec<CString> = vec![c"taskhost-keeper".into(), CString::new(KEEPER_ARG).expect("no NUL")];
    argv.extend(plan_args(plan, lifeline_target, landlock_target));
    let (tree_out, tree_err) = plan.tree_output(&stdout_w, &stderr_w);
    let mut dups = vec![(stdin.unwrap_or(plan.devnull), 0), (tree_out, 1), (tree_err, 2)];
    if lifeline_target >= 0 {
        dups.push((plan.lifeline, lifeline_target));
    }
    dups.extend(plan.landlock.as_ref().map(|fd| (fd.as_raw_fd(), landlock_target)));
    let handover = plan.durable.as_ref().map(DurableHandover::new).transpose()?;
    if let Some(handover) = &handover {
        let targets = DURABLE_FDS.into_iter().chain([SECRET_FD, LISTENING_FD]);
        dups.extend(handover.sent_fds(plan.devnull).into_iter().zip(targets));
    }
    let pid = spawn_self(&argv, &plan.exec.envp_ptrs, &dups);
    // Our copies of the write ends close here: only the tree (and K) hold them.
    drop((stdout_w, stderr_w));
    Ok(Forked { pid: pid?, stdout, stderr, listening: handover.map(|h| h.listening) })
}

/// What a durable K is handed besides its plan's arguments: its duties'
/// descriptors, its secret in a pipe, and the write end of the pipe it says
/// it listens on (the host keeps the read end, [`Forked::listening`]).
pub(crate) struct DurableHandover {
    duties: [RawFd; 7],
    secret: OwnedFd,
    listening: OwnedFd,
    listening_w: OwnedFd,
}

impl DurableHandover {
    pub(crate) fn new(durable: &DurablePlan) -> io::Result<Self> {
        // 32 bytes fit a pipe's buffer: written whole before K reads it.
        let (secret, secret_w) = super::confine::pipe()?;
        std::io::Write::write_all(&mut std::fs::File::from(secret_w), &durable.secret)?;
        let (listening, listening_w) = super::confine::pipe()?;
        Ok(Self { duties: durable.fds(), secret, listening, listening_w })
    }

    /// The descriptors K gets, in the order of [`DURABLE_FDS`] then
    /// [`SECRET_FD`] and [`LISTENING_FD`]; a missing stdin's slot holds
    /// `devnull` (K closes it), so every K gets all nine.
    pub(crate) fn sent_fds(&self, devnull: RawFd) -> [RawFd; 9] {
        let mut fds = [devnull; 9];
        for (slot, fd) in fds.iter_mut().zip(self.duties) {
            if fd >= 0 {
                *slot = fd;
            }
        }
        fds[7] = self.secret.as_raw_fd();
        fds[8] = self.listening_w.as_raw_fd();
        fds
    }

    /// The host's end: readable once K listens.
    pub(crate) fn into_listening(self) -> OwnedFd {
        self.listening
    }
}

/// In a warm keeper: every received descriptor moved to a number above
/// every target ([`FIRST_FREE_FD`] and up), so installing one onto a target
/// never closes another (a received ruleset or pipe may sit on 5..=13).
pub(crate) fn above_all_targets(received: &[RawFd]) -> io::Result<Vec<RawFd>> {
    received
        .iter()
        .map(|&fd| {
            // SAFETY: F_DUPFD_CLOEXEC returns a fresh descriptor; `fd` is
            // ours and closed once copied.
            unsafe {
                let moved = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, FIRST_FREE_FD);
                if moved < 0 {
                    return Err(io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(moved)
            }
        })
        .collect()
}

/// In a warm keeper that received a durable plan: the nine descriptors of
/// [`DurableHandover::sent_fds`] (already above the targets, see
/// [`above_all_targets`]) installed at [`DURABLE_FDS`], [`SECRET_FD`] and
/// [`LISTENING_FD`].
pub(crate) fn install_received(duties: &[RawFd]) -> io::Result<()> {
    let targets = DURABLE_FDS.into_iter().chain([SECRET_FD, LISTENING_FD]);
    for (fd, target) in duties.iter().copied().zip(targets) {
        // SAFETY: dup2 of a descriptor we own onto a free target number,
        // then the copy is closed.
        unsafe {
            if libc::dup2(fd, target) < 0 {
                return Err(io::Error::last_os_error());
            }
            libc::close(fd);
        }
    }
    Ok(())
}

/// `posix_spawn` of `/proc/self/exe` with `argv` and `envp` (a
/// NULL-terminated array), in a session of its own, with no blocked
/// signals and every signal at its default, and `dups` (source, target)
/// installed as its only descriptors besides none (every other one of ours
/// is close-on-exec). Targets must be below [`FIRST_FREE_FD`].
pub(crate) fn spawn_self(
    argv: &[CString],
    envp: &[*const libc::c_char],
    dups: &[(RawFd, RawFd)],
) -> io::Result<libc::pid_t> {
    // Sources must not sit on a target number, or one dup2 would clobber
    // another's source: move any below FIRST_FREE_FD out of the way.
    let sources = dups.iter().map(|&(from, _)| above_targets(from)).collect::<io::Result<Vec<_>>>()?;
    let argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).chain([std::ptr::null()]).collect();
    // SAFETY: posix_spawn with initialised attribute and file-action objects
    // that are destroyed on every path; every pointer outlives the call.
    unsafe {
        let mut actions: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        check(libc::posix_spawn_file_actions_init(&mut actions))?;
        if let Err(error) = check(libc::posix_spawnattr_init(&mut attr)) {
            libc::posix_spawn_file_actions_destroy(&mut actions);
            return Err(error);
        }
        let result: io::Result<libc::pid_t> = (|| {
            for (source, &(_, to)) in sources.iter().zip(dups) {
                check(libc::posix_spawn_file_actions_adddup2(&mut actions, source.raw, to))?;
            }
            // Its own session (so it has no controlling terminal, and a
            // group kill cannot miss it once we return: the child calls
            // `setsid` before its exec, which posix_spawn waits for), no
            // blocked signals, every signal at its default.
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            check(libc::posix_spawnattr_setflags(
                &mut attr,
                (libc::POSIX_SPAWN_SETSID as libc::c_int | libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF)
                    as _,
            ))?;
            check(libc::posix_spawnattr_setsigmask(&mut attr, &none))?;
            check(libc::posix_spawnattr_setsigdefault(&mut attr, &all))?;
            let mut pid: libc::pid_t = 0;
            check(libc::posix_spawn(
                &mut pid,
                c"/proc/self/exe".as_ptr(),
                &actions,
                &attr,
                argv_ptrs.as_ptr() as *const *mut libc::c_char,
                envp.as_ptr() as *const *mut libc::c_char,
            ))?;
            Ok(pid)
        })();
        libc::posix_spawn_file_actions_destroy(&mut actions);
        libc::posix_spawnattr_destroy(&mut attr);
        result
    }
}

/// A descriptor number at or above [`FIRST_FREE_FD`]: the caller's, or a
/// close-on-exec duplicate (closed when dropped) when the caller's is below.
struct HighFd {
    raw: RawFd,
    _dup: Option<OwnedFd>,
}

fn above_targets(fd: RawFd) -> io::Result<HighFd> {
    if fd >= FIRST_FREE_FD {
        return Ok(HighFd { raw: fd, _dup: None });
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a fresh descriptor we then own.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, FIRST_FREE_FD) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is fresh and owned here.
    Ok(HighFd { raw: dup, _dup: Some(unsafe { OwnedFd::from_raw_fd(dup) }) })
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(rc)) }
}
