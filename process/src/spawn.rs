//! How a tree is started: [`ProcessHost::spawn_tree`] checks a request
//! against its grant, builds the environment and the confinement plan, forks
//! the tree (plain, followed by the host; or durable, kept by its keeper)
//! and hands it to its handle.
//!
//! Invariants: see the crate's; a tree whose handle cannot be made is
//! killed and reaped before the error is returned.

use super::*;

impl ProcessHost {
    pub(crate) fn spawn_tree(
        &self,
        owner: &Arc<OwnerSpill>,
        grant: &ProcessGrant,
        request: SpawnRequest,
        durable: Option<DurableSpawn>,
        parent: &tracing::Span,
    ) -> Result<Spawned, SpawnError> {
        let argv0 = request.argv.first().ok_or(Refusal::EmptyArgv)?.clone();
        // Resolved once: the working directory's check and the policy share them.
        let roots = grant.working_roots();
        let cwd = grant.check_cwd(&roots, request.cwd.as_deref())?;
        let program = grant.check_program(&argv0, &cwd)?;
        grant.check_arguments(&program, &request.argv)?;
        for (name, _) in &request.env {
            grant.check_env_name(name.as_ref())?;
        }
        let failed = |source: std::io::Error| SpawnError::Failed { program: argv0.clone(), source };
        let limits = &grant.limits;
        let memory_cap = request.memory_cap.map_or(limits.memory_cap_bytes, |c| c.min(limits.memory_cap_bytes)).max(1);
        let spill_cap = request.spill_cap.map_or(limits.spill_cap_bytes, |c| c.min(limits.spill_cap_bytes));
        let max_grace = Duration::from_millis(limits.kill_grace_ms);
        let grace = request.kill_grace.map_or(max_grace, |g| g.min(max_grace));

        let policy = self.spawn_cache.policy(fs_policy::PolicyInputs::new(
            grant,
            &roots,
            &self.protected,
            &self.write_protected,
        ));
        // In a view, a rule on the host's root reaches nothing: "read
        // everything" becomes a rule on the view's root, added by the keeper.
        let in_view = confine::support().mount_namespace;
        let found = if in_view {
            self.scanner
                .scan(&policy.read_write)
                .map_err(|why| failed(std::io::Error::new(std::io::ErrorKind::InvalidInput, why)))?
        } else {
            Default::default()
        };
        let read_root = in_view && policy.read.iter().any(|p| p == Path::new("/"));
        let host_read: Vec<PathBuf> =
            policy.read.iter().filter(|p| !(in_view && *p == Path::new("/"))).cloned().collect();
        let mut read_write = policy.landlock_read_write();
        read_write.extend(found.git_dirs.iter().cloned());
        let ruleset = landlock::ruleset(&host_read, &read_write).map_err(failed)?;
        let env = env::build_env(&grant.env, std::env::vars_os(), &request.env);
        let exec = confine::ExecPlan::new(&program, &request.argv, &env).map_err(failed)?;
        let spill = view::SpillView { hidden: &self.spill_dir, owner: owner.dir() };
        let limiter = self.limiter();
        // A durable tree outlives this server's cgroups: rlimits bound it.
        let cgroup = if durable.is_some() { None } else { limiter.tree(owner.dir()).map_err(failed)? };
        let (nproc, data) = match durable {
            Some(_) => (self.tree_limits.max_pids, self.tree_limits.max_memory_bytes),
            None => limiter.rlimits(),
        };
        let bounds = confine::Bounds {
            cgroup_procs: cgroup.as_ref().map_or_else(Vec::new, |c| c.procs_files().to_vec()),
            nproc,
            data,
            nofile: self.open_files,
            fsize: self.file_bytes,
        };
        let (mut plan, applied) = confine::ChildPlan::new(
            grant.pid_namespace,
            !grant.network,
            ruleset,
            read_root,
            confine::ViewInputs {
                cache: &self.spawn_cache,
                policy: &policy,
                found: &found,
                spill,
                tmpfs: limiter.tmpfs_sizes(),
            },
            &cwd,
            exec,
            bounds,
        )
        .map_err(failed)?;

        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let stdin_pipe = match request.stdin {
            StdinMode::Empty => None,
            StdinMode::Pipe => {
                stdin::ignore_sigpipe();
                Some(confine::pipe().map_err(failed)?)
            }
        };
        // Starting here, on the caller's thread, is safe: nothing in the tree
        // depends on this thread living on (see `confine`, the lifeline).
        let stdin_read = stdin_pipe.as_ref().map(|(read, _)| std::os::fd::AsRawFd::as_raw_fd(read));
        let durable_record = match &durable {
            Some(spec) => {
                let stdin_copy = match &stdin_pipe {
                    Some((_, write)) => Some(write.try_clone().map_err(failed)?),
                    None => None,
                };
                let (durable_plan, record) = self.durable_plan(spec, stdin_copy, spill_cap).map_err(failed)?;
                plan.durable = Some(durable_plan);
                Some(record)
            }
            None => None,
        };
        let forked = launch::start(&plan, stdin_read).map_err(failed)?;
        // K holds the durable tree's pipe ends, logs and socket now.
        plan.durable = None;
        // Only the tree holds the read end now.
        let stdin_write = stdin_pipe.map(|(_, write)| write);
        limiter.make_ahead_in_background(owner.dir());
        let pid = forked.pid as u32;
        let span = tracing::debug_span!(parent: parent, "process", id, pid, program = %program.display());
        let pidfd = match pidfd_open(pid) {
            Ok(fd) => fd,
            Err(e) => {
                // Without a pidfd we cannot supervise: do not leave it running.
                // SAFETY: our unreaped child's group, then our child.
                unsafe {
                    libc::kill(-forked.pid, libc::SIGKILL);
                    libc::waitpid(forked.pid, std::ptr::null_mut(), 0);
                }
                return Err(failed(e));
            }
        };
        if let Some(mut record) = durable_record {
            record.keeper_pid = pid;
            record.keeper_start_time = durable::start_time(pid).unwrap_or_default();
            tracing::debug!(parent: &span, dir = %record.dir.display(), "durable process started");
            return DurableProcess::spawned(record, pidfd, stdin_write, forked.listening)
                .map(Spawned::Durable)
                .map_err(|e| {
                    // Unwatched, it must not run on.
                    // SAFETY: our unreaped child's group, then our child.
                    unsafe {
                        libc::kill(-forked.pid, libc::SIGKILL);
                        libc::waitpid(forked.pid, std::ptr::null_mut(), 0);
                    }
                    failed(e)
                });
        }
        let (stdout, stderr) = (forked.stdout, forked.stderr);
        // A larger pipe lets a chatty command run ahead of the reader.
        // SAFETY: fcntl on a descriptor we own; failure only costs throughput.
        unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&stdout), libc::F_SETPIPE_SZ, 1 << 20) };
        {
            let _enter = span.enter();
            tracing::debug!(
                cwd = %cwd.display(),
                user_namespace = applied.user_namespace,
                pid_namespace = applied.pid_namespace,
                net_namespace = applied.net_namespace,
                ipc_namespace = applied.ipc_namespace,
                uts_namespace = applied.uts_namespace,
                cgroup_namespace = applied.cgroup_namespace,
                mount_namespace = applied.mount_namespace,
                fresh_proc = applied.fresh_proc,
                seccomp = applied.seccomp,
                landlock = applied.landlock,
                "process started"
            );
        }
        let started = handle::Process::start(handle::Started {
            id,
            pid: forked.pid,
            pidfd,
            stdout,
            stderr,
            stdin: stdin_write,
            memory_cap,
            spill_cap,
            spill_owner: owner.clone(),
            grace,
            timeout: request.timeout,
            applied,
            cgroup,
            span,
        });
        started.map(Spawned::Process).map_err(|e| {
            // Unsupervised, it must not run on.
            // SAFETY: our unreaped child's group, then our child.
            unsafe {
                libc::kill(-forked.pid, libc::SIGKILL);
                libc::waitpid(forked.pid, std::ptr::null_mut(), 0);
            }
            failed(e)
        })
    }
}

/// What [`ProcessHost::spawn_tree`] started.
pub(crate) enum Spawned {
    Process(Process),
    Durable(DurableProcess),
}

impl ProcessHost {
    /// Opens what K of a durable tree holds (see [`durable`]); the record's
    /// pid and start time are filled in once K exists.
    pub(crate) fn durable_plan(
        &self,
        spec: &DurableSpawn,
        stdin: Option<OwnedFd>,
        log_cap: u64,
    ) -> std::io::Result<(plan::DurablePlan, DurableRecord)> {
        // Resolved (`..`, links), as the view resolves the protected paths.
        let socket_dir = spec.socket.parent().unwrap_or(Path::new("/"));
        for path in [spec.dir.canonicalize()?, socket_dir.canonicalize()?] {
            if !durable::is_protected(&path, &self.protected) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{} is not under a protected path: trees could reach it", path.display()),
                ));
            }
        }
        let opened = durable::open(spec)?;
        let (stdout, stdout_w) = confine::pipe()?;
        let (stderr, stderr_w) = confine::pipe()?;
        let secret = durable::new_secret()?;
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime into a local.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        let ttl = libc::time_t::try_from(spec.ttl.as_secs().saturating_add(1)).unwrap_or(libc::time_t::MAX / 2);
        let plan = plan::DurablePlan {
            stdout,
            stderr,
            stdout_w: Some(stdout_w),
            stderr_w: Some(stderr_w),
            stdin,
            dir: opened.dir,
            stdout_log: opened.stdout_log,
            stderr_log: opened.stderr_log,
            socket: opened.socket,
            secret,
            deadline: now.tv_sec.saturating_add(ttl),
            log_cap,
        };
        let record = DurableRecord {
            dir: spec.dir.clone(),
            socket: spec.socket.clone(),
            secret,
            keeper_pid: 0,
            keeper_start_time: 0,
        };
        Ok((plan, record))
    }
}

pub(crate) fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own (pidfds are close-on-exec).
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
