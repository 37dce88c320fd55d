//! The `taskhost` binary: everything lives in [`taskhost::cli`].

fn main() -> std::process::ExitCode {
    taskhost::cli::main()
}
