//! The `taskhost` binary: everything lives in [`taskhost::cli`].

fn main() -> std::process::ExitCode {
    // Process trees start as this binary in keeper mode: never returns there.
    taskhost::process::keeper::run_if_keeper();
    taskhost::cli::main()
}
