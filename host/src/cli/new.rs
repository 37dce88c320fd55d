//! `taskhost new <name> --lang rust|python|js`: a producer skeleton that
//! builds and passes `taskhost check` as written.
//!
//! Model: the skeleton is self-contained: it carries its own copy of this
//! host's `wit/` (embedded in the binary, so the contract version always
//! matches the host that wrote it) and generates its bindings from it with
//! the language's tool (`wit-bindgen` from crates.io, componentize-py from
//! the Python package index, ComponentizeJS from the npm registry, each at
//! the version this repository's examples are built and tested with); it
//! needs nothing from this repository. Every language writes the same
//! plugin: a streaming producer with cancel (numbered lines on a clock
//! pollable), the smallest plugin that shows the whole execution model.
//! The JavaScript skeleton's `package-lock.json` is the one of
//! `plugins/examples/js-ticker` with the name replaced, so `npm ci` installs
//! exactly the toolchain CI tests. Nothing existing is overwritten: the
//! target directory must not exist.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::target::usage;

mod templates;
use templates::*;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Lang {
    /// A Rust crate built for `wasm32-wasip2` with `wit-bindgen`.
    Rust,
    /// A Python module built with componentize-py.
    Python,
    /// A JavaScript module built with ComponentizeJS.
    Js,
}

/// The componentize-py version the Python skeleton and example are built with.
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";

#[derive(Debug, clap::Args)]
#[command(after_help = "Exit codes: 0 created; 1 the files could not be written; 2 a usage mistake.")]
pub struct NewArgs {
    /// The plugin's name: lowercase letters, digits and `-`, starting with a
    /// letter. Also its task kind and the directory it is created in.
    pub name: String,
    /// The language of the skeleton.
    #[arg(long, value_enum, default_value = "rust")]
    pub lang: Lang,
    /// Where to create it (default: `./<name>`).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// This host's contract, written into every skeleton.
const WIT: &[(&str, &str)] = &[
    ("producer.wit", include_str!("../../../wit/producer.wit")),
    ("process.wit", include_str!("../../../wit/process.wit")),
    ("subagents.wit", include_str!("../../../wit/subagents.wit")),
    ("deps/cli.wit", include_str!("../../../wit/deps/cli.wit")),
    ("deps/clocks.wit", include_str!("../../../wit/deps/clocks.wit")),
    ("deps/filesystem.wit", include_str!("../../../wit/deps/filesystem.wit")),
    ("deps/http.wit", include_str!("../../../wit/deps/http.wit")),
    ("deps/io.wit", include_str!("../../../wit/deps/io.wit")),
    ("deps/random.wit", include_str!("../../../wit/deps/random.wit")),
    ("deps/sockets.wit", include_str!("../../../wit/deps/sockets.wit")),
];

pub fn run(args: NewArgs) -> anyhow::Result<()> {
    let name = args.name.as_str();
    let valid = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-');
    if !valid {
        usage!(
            "{name:?} is not a plugin name: use lowercase letters, digits and `-`, starting with a letter \
             (at most 64 bytes), like `my-producer`"
        );
    }
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from(name));
    if dir.exists() {
        usage!("{} already exists: choose another name or --dir (nothing is overwritten)", dir.display());
    }
    let file = name.replace('-', "_");
    match args.lang {
        Lang::Rust => {
            write(&dir, "Cargo.toml", &CARGO_TOML.replace("{name}", name))?;
            write(&dir, "src/lib.rs", &LIB_RS.replace("{name}", name))?;
            write(&dir, "README.md", &README.replace("{name}", name).replace("{file}", &file))?;
            write(&dir, ".gitignore", "/target\n")?;
        }
        Lang::Python => {
            write(&dir, "app.py", &PY_APP.replace("{name}", name))?;
            let readme = PY_README.replace("{name}", name).replace("{componentize_py}", COMPONENTIZE_PY_VERSION);
            write(&dir, "README.md", &readme)?;
            write(&dir, ".gitignore", "*.wasm\n__pycache__/\n/bindings\n")?;
        }
        Lang::Js => {
            write(&dir, "src/index.js", &JS_INDEX.replace("{name}", name))?;
            write(&dir, "package.json", &JS_PACKAGE.replace("{name}", name))?;
            write(&dir, "package-lock.json", &js_lock(name))?;
            write(&dir, "README.md", &JS_README.replace("{name}", name))?;
            write(&dir, ".gitignore", "*.wasm\n/node_modules\n")?;
        }
    }
    for (path, text) in WIT {
        write(&dir, &format!("wit/{path}"), text)?;
    }
    println!("created {} ({:?})", dir.display(), args.lang);
    println!("  cd {}", dir.display());
    for step in build_steps(args.lang, name) {
        println!("  {step}");
    }
    Ok(())
}

/// The commands that build and check a new skeleton, from its directory.
pub fn build_steps(lang: Lang, name: &str) -> Vec<String> {
    let file = name.replace('-', "_");
    match lang {
        Lang::Rust => vec![
            "cargo build --release --target wasm32-wasip2".into(),
            format!("taskhost check target/wasm32-wasip2/release/{file}.wasm"),
        ],
        Lang::Python => vec![
            format!("python3 -m pip install componentize-py=={COMPONENTIZE_PY_VERSION}   # once"),
            format!("componentize-py -d wit -w process-plugin componentize app -o {name}.wasm"),
            format!("taskhost check {name}.wasm"),
        ],
        Lang::Js => vec!["npm ci".into(), "npm run build".into(), format!("taskhost check {name}.wasm")],
    }
}

fn write(dir: &Path, relative: &str, text: &str) -> anyhow::Result<()> {
    let path = dir.join(relative);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
}
