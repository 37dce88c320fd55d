//! The imports of the frozen `taskhost:producer@0.1.0` contract, served by
//! delegating to the current (0.2) implementations on the same views.
//!
//! Model: the 0.1 interfaces are a subset of the 0.2 ones with the same
//! meaning (0.2 only added stdin to `process`), so every 0.1 function here
//! converts its arguments, calls the 0.2 function of the same name, and
//! converts the result back. A 0.1 `spawn-request` becomes a 0.2 one with
//! `stdin: empty` (what 0.1 always gave: `/dev/null`).
//!
//! Invariant: no behaviour lives here. A fix to a capability is made once, in
//! its 0.2 module, and 0.1 plugins get it too; the resources (`process`,
//! `run`) are the same host types in both versions, so a store holds either.

use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::p2::DynPollable;

use super::log::LogView;
use super::process::ProcessView;
use super::subagents::SubagentsView;
use crate::plugin::bindings::v0_1::taskhost::producer as old;
use crate::plugin::bindings::v0_2::taskhost::producer as new;
use crate::plugin::resources::{ProcessResource, RunResource};

struct LogData;

impl HasData for LogData {
    type Data<'a> = LogView<'a>;
}

struct ProcessData;

impl HasData for ProcessData {
    type Data<'a> = ProcessView<'a>;
}

struct SubagentsData;

impl HasData for SubagentsData {
    type Data<'a> = SubagentsView<'a>;
}

/// Adds the 0.1 `host-log`, `process` and `subagents` interfaces.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    log: fn(&mut T) -> LogView<'_>,
    process: fn(&mut T) -> ProcessView<'_>,
    subagents: fn(&mut T) -> SubagentsView<'_>,
) -> wasmtime::Result<()> {
    old::host_log::add_to_linker::<T, LogData>(linker, log)?;
    old::process::add_to_linker::<T, ProcessData>(linker, process)?;
    old::subagents::add_to_linker::<T, SubagentsData>(linker, subagents)?;
    Ok(())
}

impl old::host_log::Host for LogView<'_> {
    async fn log(&mut self, level: old::host_log::Level, message: String) -> wasmtime::Result<()> {
        use old::host_log::Level as L;
        let level = match level {
            L::Trace => new::host_log::Level::Trace,
            L::Debug => new::host_log::Level::Debug,
            L::Info => new::host_log::Level::Info,
            L::Warn => new::host_log::Level::Warn,
            L::Error => new::host_log::Level::Error,
        };
        <Self as new::host_log::Host>::log(self, level, message).await
    }
}

fn chunk(chunk: new::process::OutputChunk) -> old::process::OutputChunk {
    old::process::OutputChunk {
        data: chunk.data,
        dropped: chunk.dropped,
        spill_path: chunk.spill_path,
        closed: chunk.closed,
    }
}

impl old::process::Host for ProcessView<'_> {
    async fn spawn(
        &mut self,
        request: old::process::SpawnRequest,
    ) -> wasmtime::Result<Result<Resource<ProcessResource>, String>> {
        let request = new::process::SpawnRequest {
            argv: request.argv,
            cwd: request.cwd,
            env: request.env,
            memory_cap: request.memory_cap,
            spill_cap: request.spill_cap,
            kill_grace_ms: request.kill_grace_ms,
            timeout_ms: request.timeout_ms,
            stdin: new::process::StdinMode::Empty,
        };
        <Self as new::process::Host>::spawn(self, request).await
    }

    async fn signal_name(&mut self, signal: i32) -> wasmtime::Result<String> {
        <Self as new::process::Host>::signal_name(self, signal).await
    }
}

impl old::process::HostProcess for ProcessView<'_> {
    async fn pid(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<u32> {
        <Self as new::process::HostProcess>::pid(self, this).await
    }

    async fn read_stdout(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<old::process::OutputChunk> {
        <Self as new::process::HostProcess>::read_stdout(self, this).await.map(chunk)
    }

    async fn read_stderr(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<old::process::OutputChunk> {
        <Self as new::process::HostProcess>::read_stderr(self, this).await.map(chunk)
    }

    async fn subscribe(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Resource<DynPollable>> {
        <Self as new::process::HostProcess>::subscribe(self, this).await
    }

    async fn subscribe_exit(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<Resource<DynPollable>> {
        <Self as new::process::HostProcess>::subscribe_exit(self, this).await
    }

    async fn exit_status(
        &mut self,
        this: Resource<ProcessResource>,
    ) -> wasmtime::Result<Option<old::process::ExitStatus>> {
        let status = <Self as new::process::HostProcess>::exit_status(self, this).await?;
        Ok(status.map(|status| match status {
            new::process::ExitStatus::Code(code) => old::process::ExitStatus::Code(code),
            new::process::ExitStatus::Signal(signal) => old::process::ExitStatus::Signal(signal),
        }))
    }

    async fn timed_out(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<bool> {
        <Self as new::process::HostProcess>::timed_out(self, this).await
    }

    async fn kill(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<()> {
        <Self as new::process::HostProcess>::kill(self, this).await
    }

    async fn drop(&mut self, this: Resource<ProcessResource>) -> wasmtime::Result<()> {
        <Self as new::process::HostProcess>::drop(self, this).await
    }
}

impl old::subagents::Host for SubagentsView<'_> {
    async fn start(
        &mut self,
        description: String,
        prompt: String,
        profile: Option<String>,
    ) -> wasmtime::Result<Result<Resource<RunResource>, String>> {
        <Self as new::subagents::Host>::start(self, description, prompt, profile).await
    }
}

impl old::subagents::HostRun for SubagentsView<'_> {
    async fn subscribe(&mut self, run: Resource<RunResource>) -> wasmtime::Result<Resource<DynPollable>> {
        <Self as new::subagents::HostRun>::subscribe(self, run).await
    }

    async fn result(&mut self, run: Resource<RunResource>) -> wasmtime::Result<Option<old::subagents::RunResult>> {
        use new::subagents::StopReason as S;
        use old::subagents::StopReason as O;
        let result = <Self as new::subagents::HostRun>::result(self, run).await?;
        Ok(result.map(|r| old::subagents::RunResult {
            text: r.text,
            stop_reason: match r.stop_reason {
                S::Completed => O::Completed,
                S::Aborted => O::Aborted,
                S::Error => O::Error,
                S::MaxTokens => O::MaxTokens,
                S::Refusal => O::Refusal,
                S::Other(other) => O::Other(other),
            },
            detail: r.detail,
        }))
    }

    async fn cancel(&mut self, run: Resource<RunResource>, reason: Option<String>) -> wasmtime::Result<()> {
        <Self as new::subagents::HostRun>::cancel(self, run, reason).await
    }

    async fn dispose(&mut self, run: Resource<RunResource>) -> wasmtime::Result<()> {
        <Self as new::subagents::HostRun>::dispose(self, run).await
    }

    async fn released(&mut self, run: Resource<RunResource>) -> wasmtime::Result<bool> {
        <Self as new::subagents::HostRun>::released(self, run).await
    }

    async fn drop(&mut self, run: Resource<RunResource>) -> wasmtime::Result<()> {
        <Self as new::subagents::HostRun>::drop(self, run).await
    }
}
