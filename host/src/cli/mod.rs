//! The `taskhost` command line.
//!
//! One module per subcommand; this file only parses and dispatches, so a
//! new subcommand is a new module plus one enum variant. Logs go to stderr
//! only (stdout is the MCP stream of `taskhost serve`, the console of
//! `taskhost dev` and the story of `taskhost demo`), filtered by `RUST_LOG`
//! (default `info`; `error` for the demo so its prose stays readable).

pub mod call;
pub mod check;
pub mod demo;
pub mod dev;
pub mod new;
pub mod out;
pub mod ps;
pub mod serve;
pub mod target;
pub mod trust;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "taskhost", version, about = "Background tasks for AI agents, with sandboxed producers")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve every tool over the Model Context Protocol (stdio by default).
    Serve(serve::ServeArgs),
    /// Interactive console for a producer developer: call a plugin's tool,
    /// list, read and kill its tasks, and reload it when its file changes.
    Dev(dev::DevArgs),
    /// Check a plugin against the contract (before compiling), load and
    /// describe it as `serve` would, and print its tool definition(s) as the
    /// model sees them.
    Check(check::CheckArgs),
    /// Call a plugin's tool once and print the answer; with --background,
    /// stream the task's output until it ends.
    Call(call::CallArgs),
    /// Create a producer plugin skeleton that builds and passes `check`.
    New(new::NewArgs),
    /// A short scripted run on the built-in plugins: background work,
    /// streamed output, a reload mid-flight, a kill, notices. No network.
    Demo(demo::DemoArgs),
    /// Trust a configuration or plugin file as it is now, so a server loads
    /// it from where its process trees can write; --list shows the records.
    Trust(trust::TrustArgs),
    /// Remove the trust records of files.
    Untrust(trust::UntrustArgs),
    /// List the tasks the task store holds, without a server (--all: finished ones too).
    Ps(ps::PsArgs),
}

/// Parses the command line, runs the subcommand, and reports its error.
pub fn main() -> ExitCode {
    return_large_buffers_to_the_system();
    let cli = Cli::parse();
    let default_filter = match cli.command {
        // The demo provokes a failed reload on purpose; its warning would
        // only repeat the narrated line.
        Command::Demo(_) => "error",
        // Their stdout is the answer; only problems belong on stderr.
        Command::Check(_)
        | Command::Call(_)
        | Command::New(_)
        | Command::Trust(_)
        | Command::Untrust(_)
        | Command::Ps(_) => "warn",
        _ => "info",
    };
    init_logging(default_filter);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("taskhost: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // `Ok(false)`: the command ran and reports failure through its exit code.
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(args).await.map(|()| true),
            Command::Dev(args) => dev::run(args).await.map(|()| true),
            Command::Check(args) => check::run(args).await.map(|()| true),
            Command::Call(args) => call::run(args).await.map(|called| called.ok),
            Command::New(args) => new::run(args).map(|()| true),
            Command::Demo(args) => demo::run(args).await.map(|()| true),
            Command::Trust(args) => trust::run(args).map(|()| true),
            Command::Untrust(args) => trust::run_untrust(args).map(|()| true),
            Command::Ps(args) => ps::run(args).map(|()| true),
        }
    });
    // A read of stdin blocked in the runtime's thread pool cannot be
    // interrupted; everything that matters is disposed by now.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        // The reader of the answer left: nothing to say, and no one to say it to.
        Err(error) if error.downcast_ref::<out::StdoutClosed>().is_some() => ExitCode::from(out::EXIT_STDOUT_CLOSED),
        Err(error) => {
            eprintln!("taskhost: error: {error:#}");
            // A usage mistake exits 2, like clap's own.
            if error.downcast_ref::<target::UsageError>().is_some() { ExitCode::from(2) } else { ExitCode::FAILURE }
        }
    }
}

fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).init();
}

/// Fixes glibc's mmap threshold at its default (128 KiB), which turns off
/// its sliding threshold. A server keeps many task output windows of a few
/// hundred KiB and frees them as tasks leave memory; with the sliding
/// threshold, the first such free raises it, every later window comes from
/// the heap, and the freed ones stay resident as fragments (measured: 50
/// owners × 110 tasks of 400 KB grew the server by 160–170 MiB instead of
/// 90–111 MiB, `memory_under_50_owners_of_110_tasks_stays_within_the_bound`).
/// Fixed, a buffer that large is its own mapping, returned when freed. Only
/// the command line does this; an embedder keeps its own allocator policy.
fn return_large_buffers_to_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; the command line
    // calls it first, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}
