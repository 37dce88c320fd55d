//! The `taskhost` command line.
//!
//! One module per subcommand; this file only parses and dispatches, so a
//! new subcommand is a new module plus one enum variant. Logs go to stderr
//! only (stdout is the MCP stream of `taskhost serve`), filtered by
//! `RUST_LOG` (default `info`).

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
}

/// Parses the command line, runs the subcommand, and reports its error.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
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

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false).init();
}
