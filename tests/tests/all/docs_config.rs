//! Every TOML block of the user guide (README.md, docs/mcp.md,
//! docs/dashboard.md and docs/cluster.md) parses with
//! the real configuration parser (`Config::parse`: unknown keys refused,
//! every value validated), so an example a user copies is never refused.

use std::path::Path;

use taskhost::config::Config;

/// The ```toml blocks of a Markdown file: (first line number, text). A block
/// whose info string says more (```` ```toml another-program ````, e.g. a
/// client's own configuration file) is not taskhost's and is left out.
fn toml_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (number, line) in markdown.lines().enumerate() {
        match &mut current {
            None if line.trim() == "```toml" => current = Some((number + 2, String::new())),
            Some(_) if line.trim_start().starts_with("```") => blocks.extend(current.take()),
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    blocks
}

#[test]
fn every_toml_block_of_the_guide_is_a_valid_configuration() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    let mut problems = Vec::new();
    for file in ["README.md", "docs/mcp.md", "docs/dashboard.md", "docs/cluster.md"] {
        let markdown = std::fs::read_to_string(root.join(file)).unwrap();
        for (line, text) in toml_blocks(&markdown) {
            checked += 1;
            if let Err(error) = Config::parse(&text) {
                problems.push(format!("{file}:{line}: {error:#}\n{text}"));
            }
        }
    }
    assert!(checked >= 3, "only {checked} TOML blocks found: is the guide's fence still ```toml?");
    assert!(problems.is_empty(), "TOML blocks the configuration parser refuses:\n{}", problems.join("\n"));
}

#[test]
fn the_block_finder_finds_blocks_and_the_parser_refuses_a_typo() {
    let blocks = toml_blocks(
        "text\n```toml\n[serve]\nmax_argument_bytes = 1\n```\n```sh\nx\n```\n```toml codex\n[mcp_servers.x]\n```\n",
    );
    assert_eq!(blocks, [(3, "[serve]\nmax_argument_bytes = 1\n".to_string())]);
    assert!(Config::parse("[serve]\nmax_argument_byte = 1\n").is_err());
}
