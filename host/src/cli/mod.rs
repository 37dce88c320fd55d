//! The `taskhost` command line.
//!
//! One module per subcommand; this file only parses and dispatches, so a
//! new subcommand is a new module plus one enum variant. Logs go to stderr
//! only (stdout is the MCP stream of `taskhost serve`, the console of
//! `taskhost dev` and the story of `taskhost demo`), filtered by `RUST_LOG`
//! (default `info`; `error` for the demo so its prose stays readable).

pub mod demo;
pub mod dev;
pub mod serve;

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
    /// A short scripted run on the built-in plugins: background work,
    /// streamed output, a reload mid-flight, a kill, notices. No network.
    Demo(demo::DemoArgs),
}

/// Parses the command line, runs the subcommand, and reports its error.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        // The demo provokes a failed reload on purpose; its warning would
        // only repeat the narrated line.
        Command::Demo(_) => "error",
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
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(args).await,
            Command::Dev(args) => dev::run(args).await,
            Command::Demo(args) => demo::run(args).await,
        }
    });
    // A read of stdin blocked in the runtime's thread pool cannot be
    // interrupted; everything that matters is disposed by now.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("taskhost: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).init();
}
