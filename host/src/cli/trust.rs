//! `taskhost trust <file>...`, `taskhost trust --list`, `taskhost untrust
//! <file>...`: the files a server may load from where its process trees can
//! write ([`crate::state::trust`]).
//!
//! Model: `trust` reads each file once, records its canonical path and the
//! SHA-256 of those bytes in the default state directory, and prints both.
//! A configuration is parsed first (a broken one is not recorded), and the
//! `.wasm` plugins it names are recorded with it, as they are now: the user
//! vouches for what is there, so checking comes first. `untrust` removes
//! records (by the file's canonical path, or the recorded path of a file
//! that is gone). `--list` prints every record and whether its file still
//! matches.
//!
//! Exit codes: 0 done, 1 a file could not be read, parsed or recorded.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::out::outln;
use crate::config::Config;
use crate::state::StateDir;
use crate::state::trust::{FileKind, TrustStore, sha256_hex};

#[derive(Debug, clap::Args)]
#[command(after_help = "\
A configuration or plugin that lies where the server's process trees can write (its working \
directory, a grant's working_dirs or read_write_paths) is loaded only once trusted with exactly \
its current contents; an edit needs a new `taskhost trust`. Records live in \
$XDG_STATE_HOME/taskhost/trust.json (else ~/.local/state/taskhost/trust.json).")]
pub struct TrustArgs {
    /// Configuration files (`.toml`; the `.wasm` plugins they name are
    /// trusted with them) or plugin files (`.wasm`) to trust as they are now.
    #[arg(required_unless_present = "list", conflicts_with = "list")]
    pub files: Vec<PathBuf>,
    /// Print every record and whether its file still matches it.
    #[arg(long)]
    pub list: bool,
}

#[derive(Debug, clap::Args)]
pub struct UntrustArgs {
    /// Files whose records to remove.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

fn store() -> anyhow::Result<TrustStore> {
    Ok(TrustStore::new(&StateDir::open_default()?))
}

pub fn run(args: TrustArgs) -> anyhow::Result<()> {
    let store = store()?;
    if args.list {
        return list(&store);
    }
    for file in &args.files {
        let kind = FileKind::of(file);
        let (canonical, bytes) = read(file)?;
        if kind == FileKind::Config {
            // Parsed from the very bytes recorded; a broken file is not trusted.
            let text = String::from_utf8(bytes.clone())
                .map_err(|_| anyhow::anyhow!("configuration {} is not UTF-8 text", file.display()))?;
            let mut config = Config::parse(&text).with_context(|| format!("in configuration {}", file.display()))?;
            config.source = Some(canonical.clone());
            record(&store, &canonical, &bytes, kind, None)?;
            for plugin in config.plugin_files() {
                match read(&plugin) {
                    Ok((path, bytes)) => record(&store, &path, &bytes, FileKind::Plugin, Some(&canonical))?,
                    Err(err) => eprintln!(
                        "taskhost: {err:#}; not trusted: run `taskhost trust {}` once it is built",
                        plugin.display()
                    ),
                }
            }
        } else {
            record(&store, &canonical, &bytes, kind, None)?;
        }
    }
    Ok(())
}

pub fn run_untrust(args: UntrustArgs) -> anyhow::Result<()> {
    let store = store()?;
    for file in &args.files {
        let path = file.canonicalize().unwrap_or_else(|_| std::path::absolute(file).unwrap_or_else(|_| file.clone()));
        match store.untrust(&path)? {
            Some(record) => outln!("untrusted {} {}", record.kind.noun(), record.path)?,
            None => anyhow::bail!("{} has no trust record (see `taskhost trust --list`)", path.display()),
        }
    }
    Ok(())
}

fn read(file: &Path) -> anyhow::Result<(PathBuf, Vec<u8>)> {
    let canonical = file.canonicalize().with_context(|| format!("cannot find {}", file.display()))?;
    let bytes = std::fs::read(&canonical).with_context(|| format!("cannot read {}", canonical.display()))?;
    Ok((canonical, bytes))
}

fn record(
    store: &TrustStore,
    path: &Path,
    bytes: &[u8],
    kind: FileKind,
    named_by: Option<&Path>,
) -> anyhow::Result<()> {
    let sha256 = sha256_hex(bytes);
    let previous = store.trust(path, &sha256, kind)?;
    let was = match previous {
        Some(previous) if previous.sha256 == sha256 => ", unchanged".to_string(),
        Some(previous) => format!(", replacing {}", &previous.sha256[..12.min(previous.sha256.len())]),
        None => String::new(),
    };
    let by = named_by.map(|config| format!(" (named by {})", config.display())).unwrap_or_default();
    outln!("trusted {} {}{by}: sha256 {sha256}{was}", kind.noun(), path.display())
}

fn list(store: &TrustStore) -> anyhow::Result<()> {
    let records = store.records()?;
    if records.is_empty() {
        outln!("no trusted files ({})", store.file().display())?;
    }
    for record in records {
        let state = match std::fs::read(&record.path) {
            Ok(bytes) if sha256_hex(&bytes) == record.sha256 => "ok",
            Ok(_) => "changed",
            Err(_) => "missing",
        };
        outln!(
            "{state:<8} {:<13} {}  {}",
            record.kind.noun(),
            &record.sha256[..12.min(record.sha256.len())],
            record.path
        )?;
    }
    Ok(())
}
