//! The producer contract as names: the contract versions this host serves,
//! the export a plugin of each must provide, its functions, and the header
//! check that tells a component from anything else. What both the
//! pre-compile check ([`super::preflight`]) and the loader
//! ([`super::component`]) hold a plugin to, so they cannot drift.
//!
//! Invariant: a plugin's version is the version in the name of its
//! `taskhost:producer/producer@<version>` export; [`ContractVersion::of_export`]
//! is the one place that maps it to a minor the host serves (any patch of
//! 0.1 or 0.2, per the versioning policy in `wit/producer.wit`).

use anyhow::bail;

/// The export every plugin of the current contract provides.
pub const PRODUCER_EXPORT: &str = "taskhost:producer/producer@0.2.2";

/// The functions of the current `producer` interface, by their component
/// export names.
pub const CONTRACT_FUNCTIONS: &[&str] = &[
    "describe",
    "label",
    "run",
    "[method]task.cancel",
    "[method]task.subscribe",
    "[method]task.done",
    "[method]task.read-output",
    "[method]task.write-input",
];

/// The export of the frozen 0.1.0 contract.
pub const PRODUCER_EXPORT_V0_1: &str = "taskhost:producer/producer@0.1.0";

/// The functions of the 0.1.0 `producer` interface.
pub const CONTRACT_FUNCTIONS_V0_1: &[&str] = &[
    "describe",
    "label",
    "run",
    "[method]task.cancel",
    "[method]task.subscribe",
    "[method]task.done",
    "[method]task.read-output",
];

/// The prefix of every `producer` export name, before its version.
pub const PRODUCER_EXPORT_PREFIX: &str = "taskhost:producer/producer@";

/// A contract minor this host serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ContractVersion {
    /// `taskhost:producer@0.1.z`, frozen in `wit/v0.1.0/`.
    V0_1,
    /// `taskhost:producer@0.2.z`, the current `wit/`.
    V0_2,
}

impl ContractVersion {
    /// Every version served, oldest first.
    pub const ALL: [ContractVersion; 2] = [ContractVersion::V0_1, ContractVersion::V0_2];

    /// The newest version: what `wit/` is.
    pub const CURRENT: ContractVersion = ContractVersion::V0_2;

    /// `major.minor`, as the skew message says it (`0.1`).
    pub fn series(self) -> &'static str {
        match self {
            Self::V0_1 => "0.1",
            Self::V0_2 => "0.2",
        }
    }

    /// The full version of the WIT the host holds for it (`0.1.0`).
    pub fn wit_version(self) -> &'static str {
        match self {
            Self::V0_1 => "0.1.0",
            Self::V0_2 => "0.2.2",
        }
    }

    /// The `producer` export of this version's WIT.
    pub fn producer_export(self) -> &'static str {
        match self {
            Self::V0_1 => PRODUCER_EXPORT_V0_1,
            Self::V0_2 => PRODUCER_EXPORT,
        }
    }

    /// The functions of this version's `producer` interface.
    pub fn functions(self) -> &'static [&'static str] {
        match self {
            Self::V0_1 => CONTRACT_FUNCTIONS_V0_1,
            Self::V0_2 => CONTRACT_FUNCTIONS,
        }
    }

    /// The version a `major.minor.patch[-pre]` string belongs to, if served.
    pub fn of_version(version: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| in_series(version, v.series()))
    }

    /// The version of a `taskhost:producer/producer@<version>` export name.
    pub fn of_export(name: &str) -> Option<Self> {
        Self::of_version(name.strip_prefix(PRODUCER_EXPORT_PREFIX)?)
    }

    /// `0.1.x and 0.2.x`: what the host speaks, for messages.
    pub fn spoken() -> String {
        let all: Vec<String> = Self::ALL.iter().map(|v| format!("{}.x", v.series())).collect();
        all.join(" and ")
    }
}

impl std::fmt::Display for ContractVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "taskhost:producer@{}", self.wit_version())
    }
}

/// Whether `version` (a semantic version; pre-releases count) is
/// semver-compatible with the `major.minor` `series`: for 0.x the minor
/// must match, for 1.0 and later the major. A version that is not semver is
/// in no series.
pub(crate) fn in_series(version: &str, series: &str) -> bool {
    let (Ok(have), Ok(want)) = (semver::Version::parse(version), semver::Version::parse(&format!("{series}.0"))) else {
        return false;
    };
    have.major == want.major && (have.major != 0 || have.minor == want.minor)
}

/// Checks the header: WebAssembly at all, and a component, not a core module.
pub(crate) fn sniff(bytes: &[u8]) -> anyhow::Result<()> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        if bytes.len() >= 4 && &bytes[..4] == b"\0asm" {
            bail!("the file is truncated: it ends inside the WebAssembly header ({} bytes)", bytes.len());
        }
        bail!("not a WebAssembly file: it does not start with the `\\0asm` magic number");
    }
    match bytes[4..8] {
        [1, 0, 0, 0] => bail!(
            "this is a core WebAssembly module, not a component: build the plugin for the \
             `wasm32-wasip2` target (whose output is a component) or wrap the module with \
             `wasm-tools component new`"
        ),
        [_, _, 1, 0] => Ok(()),
        _ => bail!("unsupported WebAssembly version or layer {:02x?}: expected a component (WASI 0.2)", &bytes[4..8]),
    }
}
