//! The host-wide bound on output kept in memory (issue 30, item 4), through
//! the registry's API: beyond `memory_total_bytes`, the oldest finished
//! tasks' output (then the oldest live tasks') lives in their log files only,
//! and reads and views still return every byte from there.

use std::time::Duration;

use taskhost_core::agents::AgentRegistry;
use taskhost_core::native::scripted::ScriptedTask;
use taskhost_core::tasks::*;

fn lines(task: usize, count: usize) -> String {
    (1..=count).map(|n| format!("task {task} line {n:05}\n")).collect()
}

#[tokio::test(start_paused = true)]
async fn output_beyond_the_bound_lives_in_log_files_and_stays_readable() {
    let dir = std::env::temp_dir().join(format!("taskhost-output-memory-{}", std::process::id()));
    let limit = 64 * 1024;
    let config = RegistryConfig {
        output: OutputLimits::new(8 * 1024, 1 << 20, 4 * 1024).with_memory_total_bytes(limit).with_spill_dir(Some(dir)),
        max_finished_tasks_per_owner: 1000,
        ..RegistryConfig::default()
    };
    let agents = AgentRegistry::new();
    let registry = TaskRegistry::new(agents.clone(), config);
    let _surface = registry.attach_surface("test");
    let agent = agents.create("a", "s-a").unwrap();
    let mut ids = Vec::new();
    let mut events = registry.subscribe();
    for task in 0..40 {
        let scripted = ScriptedTask::new(true);
        let spec = TaskStart::new("bash", format!("task {task}"), scripted.runner()).with_owner(Some(agent.clone()));
        let id = registry.start(spec).await.unwrap();
        // 20 KB each, in pieces, as a command prints it.
        let output = lines(task, 1000);
        for piece in output.as_bytes().chunks(4000) {
            scripted.push_output(std::str::from_utf8(piece).unwrap());
        }
        scripted.settle(TaskOutcome::completed(None));
        loop {
            match tokio::time::timeout(Duration::from_secs(10), events.recv()).await.unwrap().unwrap() {
                TaskEvent::Settled { task } if task.id == id => break,
                _ => {}
            }
        }
        assert!(
            registry.output_memory_bytes() <= limit,
            "after task {task}: {} bytes in memory, over the bound of {limit}",
            registry.output_memory_bytes()
        );
        ids.push(id);
    }
    // 800 KB of output printed; the memory holds at most the bound, and the
    // oldest task's output is whole, from its file.
    let first = &ids[0];
    let view = ViewRequest { kind: ViewKind::Lines { from: 1, to: 1000 }, lines: 0, grep: None };
    let mut whole = String::new();
    let mut from = 1;
    while from <= 1000 {
        let request = ViewRequest { kind: ViewKind::Lines { from, to: 1000 }, ..view.clone() };
        let (page, _) = registry.view(first, Some(&agent), &request).await.unwrap();
        let shown: Vec<&str> = page.lines().filter(|l| !l.starts_with("[view cut")).collect();
        assert!(!shown.is_empty(), "{page}");
        for line in &shown {
            whole.push_str(line);
            whole.push('\n');
        }
        from += shown.len() as u64;
    }
    assert_eq!(whole, lines(0, 1000));
    let read = registry.read(first, Some(&agent)).await.unwrap();
    let (note, rest) = read.text.split_once('\n').unwrap();
    assert!(note.contains("your commands can read them in the full output: "), "{note}");
    assert!(lines(0, 1000).ends_with(rest), "the latest output, from the file");
    assert!(registry.output_memory_bytes() <= limit);
    registry.dispose().await;
    assert_eq!(registry.output_memory_bytes(), 0, "every log released its memory");
}

/// Live tasks' output leaves memory too when no finished task's is left to
/// go (the oldest first), and goes on into its file: reads return it.
#[tokio::test(start_paused = true)]
async fn live_output_leaves_memory_last_and_keeps_streaming_into_its_file() {
    let dir = std::env::temp_dir().join(format!("taskhost-output-memory-live-{}", std::process::id()));
    let limit = 16 * 1024;
    let config = RegistryConfig {
        output: OutputLimits::new(8 * 1024, 1 << 20, 64 * 1024 / 8)
            .with_memory_total_bytes(limit)
            .with_spill_dir(Some(dir)),
        ..RegistryConfig::default()
    };
    let agents = AgentRegistry::new();
    let registry = TaskRegistry::new(agents.clone(), config);
    let _surface = registry.attach_surface("test");
    let mut tasks = Vec::new();
    for task in 0..4 {
        let scripted = ScriptedTask::new(true);
        let spec = TaskStart::new("bash", format!("live {task}"), scripted.runner()).with_owner(None);
        let id = registry.start(spec).await.unwrap();
        scripted.push_output(&lines(task, 300));
        // The read pulls the output in (the bound is enforced then) and
        // consumes it: 6 000 bytes each, 24 000 in all, over the bound.
        assert_eq!(registry.read(&id, None).await.unwrap().text, lines(task, 300));
        assert!(registry.output_memory_bytes() <= limit, "{}", registry.output_memory_bytes());
        tasks.push((id, scripted));
    }
    let (id, scripted) = &tasks[0];
    scripted.push_output("after\n");
    let read = registry.read(id, None).await.unwrap();
    assert_eq!(read.text, "after\n");
    registry.dispose().await;
}
