//! The architecture invariants `ARCHITECTURE.md` states, checked on the
//! sources, so a change that breaks one fails CI instead of being found by
//! the next reader.
//!
//! - **No module cycle** in any crate: at every level of a crate's module
//!   tree, the dependencies between sibling modules form a DAG. A module's
//!   use of its own parent or children is structure, not a dependency, so
//!   it is not counted; a use of anything else counts for the two siblings
//!   below the lowest common ancestor (`plugin::host::process` naming
//!   `plugin::bindings` is the edge `host → bindings` inside `plugin`).
//!   References are `crate::…` and `super::…` paths outside comments and
//!   outside the file's trailing `#[cfg(test)] mod tests` block.
//! - **One name per type in `taskhost`**: its own modules name the other
//!   workspace crates' items by those crates' paths (`taskhost_core::tasks`),
//!   never through the root's re-exports for embedders (`crate::tasks`), so
//!   the crate boundary shows in every `use`.
//! - **`taskhost-core` stands alone**: no plugin runtime, network stack or
//!   libc in its dependencies (also stated by `cargo tree`, which CI runs).
//! - **Every fixture plugin is used by some test.**
//! - **Guest crate names are unique across the guest workspaces**
//!   (`plugins/`, `tests/fixtures/`): their builds share one target
//!   directory, where each component is named after its crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is in the workspace").to_path_buf()
}

/// Every `.rs` file under `src`, by module path (`[]` is the crate root).
fn modules(src: &Path) -> BTreeMap<Vec<String>, String> {
    let mut found = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap();
            let mut parts: Vec<String> =
                relative.with_extension("").iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|last| last == "mod" || last == "lib" || last == "main") {
                parts.pop();
            }
            // Binaries (`src/bin/*`, `main.rs`) are crates of their own.
            if parts.first().is_some_and(|first| first == "bin") || relative == Path::new("main.rs") {
                continue;
            }
            found.insert(parts, std::fs::read_to_string(&path).unwrap());
        }
    }
    found
}

/// The code of a file without comments, string contents and its trailing
/// unit-test module.
fn code(text: &str) -> String {
    let text = match text.find("\n#[cfg(test)]\nmod tests {") {
        Some(cut) => &text[..cut],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            // A char literal holding a quote or a backslash.
            '\'' if matches!(chars.peek(), Some('"') | Some('\\')) => {
                let mut lookahead = chars.clone();
                let quoted = lookahead.next();
                let escaped = quoted == Some('\\');
                if escaped {
                    lookahead.next();
                }
                if lookahead.next() == Some('\'') {
                    chars = lookahead;
                    out.push_str("' '");
                } else {
                    out.push(c);
                }
            }
            // A raw string `r#"…"#`: up to the same number of hashes.
            'r' if chars.peek() == Some(&'#') => {
                let mut hashes = 0;
                while chars.peek() == Some(&'#') {
                    chars.next();
                    hashes += 1;
                }
                if chars.peek() == Some(&'"') {
                    chars.next();
                    let closing: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                    let mut seen = String::new();
                    for c in chars.by_ref() {
                        seen.push(c);
                        if seen.ends_with(&closing) {
                            break;
                        }
                    }
                    out.push_str("\"\"");
                } else {
                    out.push('r');
                    out.extend(std::iter::repeat_n('#', hashes));
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        break;
                    }
                }
                out.push_str("\"\"");
            }
            c => out.push(c),
        }
    }
    out
}

/// The module paths a file refers to, resolved against the crate's modules
/// (the longest prefix of each path that is a module).
fn references(from: &[String], text: &str, known: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let code = code(text);
    let mut paths: Vec<Vec<String>> = Vec::new();
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if !code.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let at_word = i == 0 || !is_ident(bytes[i - 1]) && bytes[i - 1] != b':';
        let rest = &code[i..];
        let (base, skip) = if at_word && rest.starts_with("crate::") {
            (Vec::new(), "crate::".len())
        } else if at_word && rest.starts_with("super::") {
            let mut base = from.to_vec();
            let mut skip = 0;
            while code[i + skip..].starts_with("super::") {
                base.pop();
                skip += "super::".len();
            }
            (base, skip)
        } else {
            i += 1;
            continue;
        };
        i += skip;
        // `crate::a::b::Item` or `crate::{a::X, b}`: collect each path.
        let mut segments = base.clone();
        let mut j = i;
        loop {
            let start = j;
            while j < bytes.len() && is_ident(bytes[j]) {
                j += 1;
            }
            if j > start {
                segments.push(code[start..j].to_string());
            }
            if code[j..].starts_with("::") && j > start {
                j += 2;
                continue;
            }
            if code[j..].starts_with('{') && j == start {
                // A group: each comma-separated head is a path of its own.
                let close = code[j..].find('}').map_or(code.len(), |k| j + k);
                for item in code[j + 1..close].split(',') {
                    let head: Vec<String> = item
                        .trim()
                        .split("::")
                        .map(|s| s.trim().trim_start_matches('{').trim().to_string())
                        .take_while(|s| !s.is_empty() && s.bytes().all(is_ident))
                        .collect();
                    let mut path = segments.clone();
                    path.extend(head);
                    paths.push(path);
                }
                j = close;
                break;
            }
            paths.push(segments.clone());
            break;
        }
        i = j.max(i + 1);
    }
    paths
        .into_iter()
        .map(|path| {
            let mut module = path;
            while !known.contains(&module) {
                module.pop();
            }
            module
        })
        .collect()
}

/// Sibling edges `(parent, from child, to child)` a reference makes, if any.
fn sibling_edge(from: &[String], to: &[String]) -> Option<(Vec<String>, String, String)> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if common == from.len() || common == to.len() {
        return None; // an ancestor or a descendant: structure, not a dependency
    }
    Some((from[..common].to_vec(), from[common].clone(), to[common].clone()))
}

/// One cycle among the siblings of each parent, as `a → b → a`.
fn cycles(edges: &BTreeSet<(Vec<String>, String, String)>) -> Vec<String> {
    let mut by_parent: BTreeMap<&Vec<String>, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
    for (parent, from, to) in edges {
        by_parent.entry(parent).or_default().entry(from).or_default().insert(to);
    }
    let mut found = Vec::new();
    for (parent, graph) in by_parent {
        // Depth-first search with colours; report the first back edge's cycle.
        let mut state: BTreeMap<&str, u8> = BTreeMap::new();
        fn visit<'a>(
            node: &'a str,
            graph: &BTreeMap<&'a str, BTreeSet<&'a str>>,
            state: &mut BTreeMap<&'a str, u8>,
            path: &mut Vec<&'a str>,
        ) -> Option<Vec<&'a str>> {
            state.insert(node, 1);
            path.push(node);
            for next in graph.get(node).into_iter().flatten() {
                match state.get(next) {
                    Some(1) => {
                        let start = path.iter().position(|n| n == next).unwrap();
                        let mut cycle = path[start..].to_vec();
                        cycle.push(next);
                        return Some(cycle);
                    }
                    Some(_) => {}
                    None => {
                        if let Some(cycle) = visit(next, graph, state, path) {
                            return Some(cycle);
                        }
                    }
                }
            }
            path.pop();
            state.insert(node, 2);
            None
        }
        for node in graph.keys() {
            if state.contains_key(node) {
                continue;
            }
            if let Some(cycle) = visit(node, &graph, &mut state, &mut Vec::new()) {
                let parent = if parent.is_empty() { "crate".to_string() } else { parent.join("::") };
                found.push(format!("in {parent}: {}", cycle.join(" → ")));
                break;
            }
        }
    }
    found
}

fn module_cycles(crate_src: &Path) -> Vec<String> {
    let modules = modules(crate_src);
    let known: BTreeSet<Vec<String>> = modules.keys().cloned().collect();
    let mut edges = BTreeSet::new();
    for (module, text) in &modules {
        for target in references(module, text, &known) {
            edges.extend(sibling_edge(module, &target));
        }
    }
    cycles(&edges)
}

#[test]
fn no_crate_has_a_module_cycle() {
    let root = workspace();
    let mut problems = Vec::new();
    for krate in ["core", "process", "host", "tests", "build-support"] {
        for cycle in module_cycles(&root.join(krate).join("src")) {
            problems.push(format!("{krate}/src: {cycle}"));
        }
    }
    assert!(
        problems.is_empty(),
        "module cycles (break each one: move the shared piece below both, or invert the dependency; \
         see ARCHITECTURE.md):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    // The check itself must be able to fail: two siblings naming each other,
    // through a `use` group and a plain path, and a child's use of its
    // parent that is not a cycle.
    let known: BTreeSet<Vec<String>> =
        [vec![], vec!["a".to_string()], vec!["b".to_string()], vec!["b".to_string(), "c".to_string()]]
            .into_iter()
            .collect();
    let a = references(&["a".to_string()], "use crate::{b::c::Thing, x};\n// crate::nothing\n", &known);
    assert_eq!(a, [vec!["b".to_string(), "c".to_string()], vec![]].into_iter().collect());
    let c =
        references(&["b".to_string(), "c".to_string()], "fn f() { super::super::a::go(); super::helper(); }", &known);
    assert_eq!(c, [vec!["a".to_string()], vec!["b".to_string()]].into_iter().collect());
    let mut edges = BTreeSet::new();
    for (from, targets) in [(vec!["a".to_string()], a), (vec!["b".to_string(), "c".to_string()], c)] {
        for target in targets {
            edges.extend(sibling_edge(&from, &target));
        }
    }
    assert_eq!(cycles(&edges), ["in crate: a → b → a"]);
}

/// The names `taskhost`'s root re-exports from the other workspace crates
/// (`pub use taskhost_core::{Host, tasks, …}`, `pub use taskhost_process as
/// process`).
fn reexported_names(lib_rs: &str) -> Vec<String> {
    let code = code(lib_rs);
    let mut names = Vec::new();
    for statement in code.split(';') {
        let Some(path) = statement.trim().strip_prefix("pub use ") else { continue };
        if !(path.starts_with("taskhost_core") || path.starts_with("taskhost_process")) {
            continue;
        }
        if let Some((_, alias)) = path.split_once(" as ") {
            names.push(alias.trim().to_string());
        } else if let Some(group) = path.split_once('{').and_then(|(_, rest)| rest.split_once('}')) {
            names.extend(group.0.split(',').map(|name| name.trim().to_string()).filter(|name| !name.is_empty()));
        } else if let Some(last) = path.rsplit("::").next() {
            names.push(last.trim().to_string());
        }
    }
    names
}

/// `crate::<name>` paths in `text` (outside comments and strings) for any of
/// `names`.
fn uses_of_reexports(text: &str, names: &[String]) -> Vec<String> {
    let code = code(text);
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if code[..at].chars().next_back().is_some_and(|c| is_ident(c) || c == ':') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        if names.contains(&name) {
            found.push(format!("crate::{name}"));
        }
    }
    found
}

#[test]
fn taskhost_names_the_other_crates_by_their_own_paths() {
    let src = workspace().join("host/src");
    let names = reexported_names(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    assert!(
        ["tasks", "Host", "process"].iter().all(|name| names.contains(&name.to_string())),
        "host/src/lib.rs's re-exports not found: {names:?}"
    );
    let mut problems = Vec::new();
    for (module, text) in modules(&src) {
        for used in uses_of_reexports(&text, &names) {
            problems.push(format!("host/src/{}: {used}", module.join("/")));
        }
    }
    assert!(
        problems.is_empty(),
        "taskhost's modules name a re-export instead of its crate (write `taskhost_core::…` or \
         `taskhost_process::…`; the re-exports are for embedders):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_reexport_check_finds_a_use() {
    let names = reexported_names(
        "pub use taskhost_core::{Host, tasks};\npub use taskhost_process as process;\npub use crate::x::Y;\n",
    );
    assert_eq!(names, ["Host", "tasks", "process"]);
    let text = "use crate::tasks::TaskId;\nfn f(h: &crate::Host) { taskhost_core::tasks::go(); crate::plugin::x(); }\n\
                // crate::process in a comment\nconst S: &str = \"crate::process\";\n";
    assert_eq!(uses_of_reexports(text, &names), ["crate::tasks", "crate::Host"]);
}

#[test]
fn every_fixture_plugin_is_used_by_a_test() {
    // `fixtures.rs` (generated) names each built fixture `<NAME>_PATH`.
    let generated = std::fs::read_to_string(concat!(env!("OUT_DIR"), "/fixtures.rs")).unwrap();
    let constants: Vec<&str> = generated
        .split("pub const ")
        .skip(1)
        .filter_map(|rest| rest.split(':').next())
        .filter(|name| name.ends_with("_PATH"))
        .collect();
    assert!(!constants.is_empty(), "no fixtures found in {generated}");
    let suites = modules(&workspace().join("tests/tests/all"));
    let unused: Vec<&&str> =
        constants.iter().filter(|constant| !suites.values().any(|text| code(text).contains(**constant))).collect();
    assert!(unused.is_empty(), "fixture plugins no test uses (use them or remove them): {unused:?}");
}

/// The `members` of the Cargo workspace at `dir`, by package name.
fn guest_packages(dir: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let list = manifest.split("members = [").nth(1).and_then(|rest| rest.split(']').next()).unwrap();
    list.split(',')
        .map(|member| member.trim().trim_matches('"'))
        .filter(|member| !member.is_empty())
        .map(|member| {
            let package = std::fs::read_to_string(dir.join(member).join("Cargo.toml")).unwrap();
            let name = package.lines().find_map(|line| line.strip_prefix("name = ")).unwrap();
            name.trim().trim_matches('"').to_string()
        })
        .collect()
}

#[test]
fn guest_crate_names_are_unique_across_guest_workspaces() {
    let plugins = guest_packages(&workspace().join("plugins"));
    let fixtures = guest_packages(&workspace().join("tests/fixtures"));
    assert!(
        plugins.contains(&"bash".to_string()) && fixtures.contains(&"misbehave".to_string()),
        "{plugins:?} {fixtures:?}"
    );
    let shared: Vec<&String> = fixtures.iter().filter(|name| plugins.contains(name)).collect();
    assert!(
        shared.is_empty(),
        "guest crates named in both plugins/ and tests/fixtures/ (their components would overwrite \
         each other in the shared guest target directory; rename one): {shared:?}"
    );
}
