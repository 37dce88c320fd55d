use std::sync::Arc;

use super::*;
use crate::ids::TaskId;

/// A fresh private directory for one test's log files.
fn files(tag: &str) -> Arc<dyn OutputFiles> {
    let parent = std::env::temp_dir().join(format!("taskhost-output-test-{tag}-{}", std::process::id()));
    Arc::new(PrivateOutputDir { dir: create_private_dir(&parent).unwrap() })
}

fn log_with(limits: OutputLimits, files: Option<&Arc<dyn OutputFiles>>) -> OutputLog {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let task = TaskId::new(format!("bash-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    let target = files.map(|files| FileTarget { files: files.clone(), owner: None, task });
    OutputLog::new(Arc::new(limits), Arc::default(), target)
}

fn limits(memory: usize, spill: u64, read: usize) -> OutputLimits {
    OutputLimits::new(memory, spill, read)
}

fn view(log: &OutputLog, kind: ViewKind, lines: usize, grep: Option<&str>) -> String {
    log.view(&ViewRequest { kind, lines, grep: grep.map(|g| regex::Regex::new(g).unwrap()) })
}

fn numbered(from: usize, to: usize) -> String {
    (from..=to).map(|n| format!("line {n}\n")).collect()
}

fn path_of(log: &OutputLog) -> std::path::PathBuf {
    log.file_part().expect("a log file").0.path().to_path_buf()
}

#[test]
fn views_in_memory_never_move_the_cursor() {
    let mut log = log_with(limits(1 << 20, 0, 1 << 20), None);
    log.append(&numbered(1, 100), None, None);
    assert_eq!(view(&log, ViewKind::Tail, 2, None), "line 99\nline 100");
    assert_eq!(view(&log, ViewKind::Head, 2, None), "line 1\nline 2");
    assert_eq!(
        view(&log, ViewKind::All, 0, Some("^line 5")),
        "5: line 5\n50: line 50\n51: line 51\n52: line 52\n53: line 53\n54: line 54\n55: line 55\n56: line 56\n57: line 57\n58: line 58\n59: line 59"
    );
    assert_eq!(view(&log, ViewKind::Tail, 1, Some("^line 5")), "59: line 59");
    assert_eq!(view(&log, ViewKind::Tail, 3, Some("nothing")), "(no matching lines)");
    assert_eq!(view(&log, ViewKind::Lines { from: 7, to: 9 }, 0, None), "line 7\nline 8\nline 9");
    assert_eq!(view(&log, ViewKind::Lines { from: 101, to: 200 }, 0, None), "(no line 101 yet)");
    assert_eq!(log.take_new(), numbered(1, 100));
    assert_eq!(log.take_new(), "");
    log.append("partial", None, None);
    assert_eq!(view(&log, ViewKind::Tail, 1, None), "partial");
    assert_eq!(log.take_new(), "partial");
}

#[test]
fn the_file_keeps_what_the_window_lost() {
    let files = files("window");
    let path;
    {
        let mut log = log_with(limits(100, 1 << 20, 100), Some(&files));
        for n in 1..=1000 {
            log.append(&format!("line {n}\n"), None, None);
        }
        path = path_of(&log);
        assert!(path.exists());
        assert_eq!(view(&log, ViewKind::Head, 3, None), "line 1\nline 2\nline 3");
        assert_eq!(view(&log, ViewKind::Tail, 2, None), "line 999\nline 1000");
        // More lines than the window holds: read through the file.
        assert_eq!(view(&log, ViewKind::Tail, 30, None).lines().next(), Some("line 971"));
        assert_eq!(view(&log, ViewKind::All, 0, Some("^line 77$")), "77: line 77");
        assert_eq!(view(&log, ViewKind::Lines { from: 500, to: 502 }, 0, None), "line 500\nline 501\nline 502");
        let read = log.take_new();
        assert!(read.ends_with("line 1000\n"), "{read}");
    }
    assert!(!path.exists(), "the file goes with the log");
}

/// Issue 30, item 1: a read that skips names the bytes, their lines, the
/// `lines` view and the file; both give back exactly what was skipped.
#[test]
fn a_skipping_read_names_the_way_back_to_every_byte() {
    let files = files("skip");
    let mut log = log_with(limits(4096, 1 << 20, 1024), Some(&files));
    let printed = numbered(1, 500);
    log.append(&printed, None, None);
    let read = log.take_new();
    let (note, rest) = read.split_once('\n').unwrap();
    let path = path_of(&log);
    let skipped_bytes = printed.len() - rest.len();
    let last_skipped = printed[..skipped_bytes].lines().count();
    assert_eq!(
        note,
        format!(
            "[{skipped_bytes} bytes of output skipped here (lines 1-{last_skipped}); task_output with view \"lines\", \
             from 1, to {last_skipped} shows them; your commands can read them in the full output: {}]",
            path.display()
        )
    );
    assert!(printed.ends_with(rest) && rest.starts_with("line "), "the read resumes at a whole line: {rest:?}");
    // The view gives the skipped lines back, a page at a time.
    let mut again = String::new();
    let mut from = 1;
    while from <= last_skipped as u64 {
        let page = view(&log, ViewKind::Lines { from, to: last_skipped as u64 }, 0, None);
        let shown: Vec<&str> = page.lines().filter(|l| !l.starts_with("[view cut")).collect();
        for line in &shown {
            again.push_str(line);
            again.push('\n');
        }
        from += shown.len() as u64;
    }
    assert_eq!(again, printed[..skipped_bytes]);
    // The file holds them, byte for byte.
    assert_eq!(std::fs::read(&path).unwrap()[..skipped_bytes], printed.as_bytes()[..skipped_bytes]);

    // A small output skipped by a read: the file is made for the read.
    let mut log = log_with(limits(1 << 20, 1 << 20, 1024), Some(&files));
    let small = "x".repeat(1500);
    log.append(&small, None, None);
    let read = log.take_new();
    assert!(
        read.starts_with("[476 bytes of output skipped here (lines 1-1); task_output with view \"lines\""),
        "{read}"
    );
    assert_eq!(std::fs::read_to_string(path_of(&log)).unwrap(), small);
}

#[test]
fn without_a_file_views_and_reads_say_what_was_not_kept() {
    let mut log = log_with(limits(64, 0, 64), None);
    log.append(&numbered(1, 50), None, None);
    let all = view(&log, ViewKind::All, 0, Some("line"));
    assert!(all.starts_with("[") && all.contains("not kept"), "{all}");
    assert!(all.ends_with("50: line 50"), "{all}");
    assert_eq!(view(&log, ViewKind::Tail, 1, Some("line")), "50: line 50");
    let read = log.take_new();
    // The window still has a few of the skipped bytes: the rest is said lost.
    assert!(read.starts_with("[335 bytes of output skipped here (lines 1-43); task_output with view \"lines\", from 1, to 43 shows them; 327 of them were not kept]\nline 44\n"), "{read}");
    assert!(read.ends_with("line 50\n"), "{read}");
}

#[test]
fn lines_are_reported_to_the_pattern_whole_and_capped() {
    let mut log = log_with(limits(1 << 20, 0, 1 << 20), None);
    let mut seen = Vec::new();
    log.append("ab", None, Some(&mut |line: &str| seen.push(line.to_string())));
    log.append("c\nd\n", None, Some(&mut |line: &str| seen.push(line.to_string())));
    log.append(&"x".repeat(10_000), None, Some(&mut |line: &str| seen.push(line.to_string())));
    log.append("\n", None, Some(&mut |line: &str| seen.push(line.len().to_string())));
    assert_eq!(seen, vec!["abc".to_string(), "d".to_string(), LINE_LIMIT.to_string()]);
}

/// A `lines` view shows lines exactly (no 4 KiB cut), stops at its byte
/// cap and says where to continue.
#[test]
fn a_lines_view_is_exact_and_says_where_to_continue() {
    let mut log = log_with(limits(1 << 20, 0, 1 << 20), None);
    let long = "y".repeat(10_000);
    log.append(&format!("{long}\n"), None, None);
    for _ in 0..20 {
        log.append(&format!("{long}\n"), None, None);
    }
    let page = view(&log, ViewKind::Lines { from: 1, to: 21 }, 0, None);
    let lines: Vec<&str> = page.lines().collect();
    assert!(lines[..lines.len() - 1].iter().all(|l| *l == long), "whole lines");
    assert_eq!(
        *lines.last().unwrap(),
        format!("[view cut at {VIEW_LIMIT} bytes: continue with view \"lines\" from {}]", lines.len())
    );
}

/// Issue 30, item 4: a log that left memory serves reads, views and peeks
/// from its file, takes new output there, and holds no memory.
#[test]
fn an_evicted_log_reads_from_its_file_and_holds_no_memory() {
    let files = files("evict");
    let meter = Arc::new(MemoryMeter::default());
    let target = FileTarget { files: files.clone(), owner: None, task: TaskId::new("bash-2") };
    let mut log = OutputLog::new(Arc::new(limits(1 << 20, 1 << 20, 1 << 20)), meter.clone(), Some(target));
    log.append(&numbered(1, 10), None, None);
    assert_eq!(log.take_new(), numbered(1, 10));
    log.append(&numbered(11, 20), None, None);
    assert!(meter.used() > 0);
    log.evict();
    assert_eq!(meter.used(), 0, "no window any more");
    log.append(&numbered(21, 30), None, None);
    assert_eq!(meter.used(), 0, "new output goes to the file only");
    assert_eq!(log.take_new(), numbered(11, 30), "the unread output, from the file");
    assert_eq!(view(&log, ViewKind::Tail, 2, None), "line 29\nline 30");
    assert_eq!(view(&log, ViewKind::Lines { from: 5, to: 6 }, 0, None), "line 5\nline 6");
    let (tail, start) = log.since(0, 16);
    assert_eq!((tail.as_str(), start), ("line 29\nline 30\n", numbered(1, 30).len() as u64 - 16));
    drop(log);
    assert_eq!(meter.used(), 0);
}

/// Issue 30, item 6: a read that begins inside stderr says so first; one
/// that begins where stderr begins shows the header once; stdout after
/// stderr needs no header.
#[test]
fn a_read_that_begins_in_stderr_starts_with_its_header() {
    let mut log = log_with(limits(1 << 20, 0, 1 << 20), None);
    log.append("out\n", None, None);
    log.append("[stderr]\nerr 1\n", Some("[stderr]"), None);
    assert_eq!(log.take_new(), "out\n[stderr]\nerr 1\n");
    log.append("err 2\n", Some("[stderr]"), None);
    assert_eq!(log.take_new(), "[stderr]\nerr 2\n", "continues stderr");
    log.append("[stdout]\nout 2\n", None, None);
    assert_eq!(log.take_new(), "[stdout]\nout 2\n");
    log.append("out 3\n", None, None);
    assert_eq!(log.take_new(), "out 3\n", "stdout needs no header");
    // A read the cap cut inside stderr.
    let mut log = log_with(limits(1 << 20, 0, 20), None);
    log.append("[stderr]\n", Some("[stderr]"), None);
    log.append(&numbered(1, 30), Some("[stderr]"), None);
    let read = log.take_new();
    let after_note = read.split_once("]\n").unwrap().1;
    assert!(after_note.starts_with("[stderr]\nline "), "{read}");
}

/// A file cut by its budget: the read and the views say what was not kept.
#[test]
fn output_past_a_full_file_is_said_to_be_lost_once_out_of_memory() {
    let files = files("full");
    let mut log = log_with(limits(64, 100, 64), Some(&files));
    log.append(&numbered(1, 40), None, None);
    log.evict();
    let read = log.take_new();
    assert!(read.contains("bytes of output were not kept here]"), "{read}");
    let all = view(&log, ViewKind::All, 0, None);
    assert!(all.starts_with("line 1\n") && all.contains("were not kept here]"), "{all}");
}

/// A `lines` view far into a large file reads from a line mark near it, and
/// shows exactly the lines asked for.
#[test]
fn a_lines_view_far_into_the_file_starts_near_its_line() {
    let files = files("marks");
    let mut log = log_with(limits(4096, 64 << 20, 4096), Some(&files));
    let printed = numbered(1, 200_000);
    for piece in printed.as_bytes().chunks(70_000) {
        log.append(std::str::from_utf8(piece).unwrap(), None, None);
    }
    let (offset, line) = log.file_start_for(150_000);
    assert!(line > 140_000 && line <= 150_000, "a mark near line 150000: line {line}");
    assert_eq!(offset as usize, numbered(1, (line - 1) as usize).len(), "the mark is where line {line} starts");
    assert_eq!(view(&log, ViewKind::Lines { from: 150_000, to: 150_001 }, 0, None), "line 150000\nline 150001");
    assert_eq!(view(&log, ViewKind::Lines { from: 1, to: 1 }, 0, None), "line 1");
}

/// A log out of memory still serves a range of lines past its first mark.
#[test]
fn an_evicted_log_serves_lines_far_into_its_file() {
    let files = files("evict-lines");
    let mut log = log_with(limits(256 * 1024, 64 << 20, 64 * 1024), Some(&files));
    let printed: String = (1..=4000).map(|n| format!("{n:099}\n")).collect();
    for piece in printed.as_bytes().chunks(65_536) {
        log.append(std::str::from_utf8(piece).unwrap(), None, None);
    }
    log.evict();
    let expected: String = (3990..=4000).map(|n| format!("{n:099}\n")).collect();
    assert_eq!(view(&log, ViewKind::Lines { from: 3990, to: 4000 }, 0, None), expected.trim_end());
}
