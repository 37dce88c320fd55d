//! The system-prompt section that teaches the background-task habit.
//!
//! Per-tool descriptions cannot teach a habit that spans calls; this section
//! does. Hosts put it in their system prompt; `taskhost serve` sends it as
//! the MCP server's `instructions`.

/// The background-task section of a system prompt.
pub const BACKGROUND_TASKS_SECTION: &str = "\
# Background tasks
Some tools can run work in the background (`run_in_background: true`). Such a call returns a task id at once while the work goes on.
- Keep track of every task id you get back. `task_list` shows your tasks and their status if you lose track.
- You are told in this session when a background task finishes. Do not busy-poll a task or sleep waiting for it: keep working on steps that do not depend on it, and do not start a second task that duplicates work already running.
- Read a task's output with `task_output`. For commands it returns only what is new since your last read. Pass `wait: true` only when you are blocked on the result and have nothing else to do.
- Before you give your final answer, collect the output of every task that matters to it with `task_output`. Do not answer while a relevant task is still running.
- To look at a task's output without consuming it, pass `view: \"tail\"`, `\"head\"` or `\"all\"` to `task_output` (with `lines`, or `grep` for a regex); your next plain read still returns everything new.
- To wait for whichever of several tasks finishes first, call `task_wait` with their ids instead of waiting on each in turn.
- A command that needs input later (a prompt, a REPL): start it with `run_in_background: true, interactive: true`, then send lines with `task_input`.
- To be told when a task reaches a point (a server is ready, a test fails) without polling, start it with `notify_on: {\"pattern\": \"<regex>\"}`; `stalled_ms` tells you when it has printed nothing for that long.
- A call that runs long moves to the background by itself: its answer then ends with `[still running after <N> s: moved to the background as task <id>. ...]`. Treat that id like any other.
- Stop tasks that no longer matter with `task_kill`.";
