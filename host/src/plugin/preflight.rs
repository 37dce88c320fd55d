//! The contract check that runs before a plugin is compiled.
//!
//! Model: [`preflight`] decodes the component's type information (its
//! imports and exports, by name, with the WIT package versions in them)
//! with `wit-parser`, without compiling or running anything, and refuses a
//! component that cannot work here with a message that says what to change:
//! an import taskhost does not provide (naming it, and the build flag when a
//! known toolchain adds it by default), a contract version skew ("built
//! against taskhost:producer@0.3.0; this host speaks 0.1.x and 0.2.x"), a missing
//! `producer` export or contract function. Compiling a large component
//! (Python, JavaScript) takes seconds; this takes milliseconds.
//!
//! Invariants: it only refuses what the full load would refuse too (the
//! linker and the signature checks in [`super::component`] stay the
//! authority, and catch type mismatches within a compatible version); a
//! component it cannot decode is left to the compiler, whose messages tell
//! truncated and corrupt files apart. Every problem found is reported, one
//! per line, not only the first.

use std::fmt::Write as _;

use anyhow::bail;

use super::contract::{ContractVersion, PRODUCER_EXPORT, PRODUCER_EXPORT_PREFIX, in_series};

/// The WIT package of the contract.
pub const CONTRACT_PACKAGE: &str = "taskhost:producer";

/// The taskhost interfaces a plugin may import (at a version the host
/// serves, [`ContractVersion::ALL`]).
pub const CONTRACT_IMPORTS: &[&str] = &["types", "host-log", "process", "subagents"];

/// The WASI 0.2 packages the host links (sandboxed, see [`super::state`]).
pub const WASI_PACKAGES: &[&str] = &["io", "clocks", "random", "cli", "filesystem", "sockets"];

/// The WASI version series the host links.
pub const WASI_SERIES: &str = "0.2";

/// What the pre-compile check learned about a component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preflight {
    /// Every import, by its full name (`wasi:io/poll@0.2.0`).
    pub imports: Vec<String>,
    /// Every export, by its full name.
    pub exports: Vec<String>,
    /// The version of the contract the component was built against (the
    /// version in its `producer` export name, e.g. `0.1.0`).
    pub contract_version: String,
}

/// A full interface name split into its parts: `ns:pkg/iface@version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Name<'a> {
    namespace: &'a str,
    package: &'a str,
    interface: Option<&'a str>,
    version: Option<&'a str>,
}

impl<'a> Name<'a> {
    fn parse(full: &'a str) -> Option<Self> {
        let (path, version) = match full.split_once('@') {
            Some((path, version)) => (path, Some(version)),
            None => (full, None),
        };
        let (namespace, rest) = path.split_once(':')?;
        let (package, interface) = match rest.split_once('/') {
            Some((package, interface)) => (package, Some(interface)),
            None => (rest, None),
        };
        Some(Self { namespace, package, interface, version })
    }

    fn package_id(&self) -> String {
        match self.version {
            Some(version) => format!("{}:{}@{version}", self.namespace, self.package),
            None => format!("{}:{}", self.namespace, self.package),
        }
    }
}

/// Checks a component's imports and exports against the `plugin` world,
/// without compiling it. `Ok(None)` when the bytes could not be decoded
/// (left to the compiler to explain).
pub fn preflight(bytes: &[u8]) -> anyhow::Result<Option<Preflight>> {
    // A core module or a text file decodes as something else: say what it is.
    super::contract::sniff(bytes)?;
    let decoded = match wit_parser::decoding::decode(bytes) {
        Ok(decoded) => decoded,
        Err(err) => {
            tracing::debug!(error = %format!("{err:#}"), "cannot decode the component's types; the compiler will say why");
            return Ok(None);
        }
    };
    let wit_parser::decoding::DecodedWasm::Component(resolve, world) = decoded else {
        bail!(
            "this file is a WIT package encoded as WebAssembly, not a component: build the plugin \
             itself (e.g. `cargo build --target wasm32-wasip2`)"
        );
    };
    let world = &resolve.worlds[world];
    let key_name = |key: &wit_parser::WorldKey| match key {
        wit_parser::WorldKey::Name(name) => name.clone(),
        wit_parser::WorldKey::Interface(id) => resolve.id_of(*id).unwrap_or_else(|| "<unnamed interface>".into()),
    };
    let imports: Vec<String> = world.imports.keys().map(key_name).collect();
    let exports: Vec<String> = world.exports.keys().map(key_name).collect();

    // The contract version first: a skew explains every other mismatch.
    let skewed = imports
        .iter()
        .chain(&exports)
        .filter_map(|full| Name::parse(full))
        .filter(|name| name.namespace == "taskhost" && name.package == "producer")
        .map(|name| name.version)
        .find(|version| !version.is_some_and(|v| ContractVersion::of_version(v).is_some()));
    if let Some(version) = skewed {
        let built = match version {
            Some(version) => format!("{CONTRACT_PACKAGE}@{version}"),
            None => format!("an unversioned {CONTRACT_PACKAGE}"),
        };
        bail!(
            "the component was built against {built}; this host speaks {} \
             (newest: {PRODUCER_EXPORT}): build the plugin against the `wit/` of this taskhost, or serve it \
             with a taskhost that speaks its version",
            ContractVersion::spoken()
        );
    }

    let mut problems = String::new();
    for full in &imports {
        if let Some(problem) = import_problem(full) {
            let _ = writeln!(problems, "- {problem}");
        }
    }

    let producer = world.exports.iter().find_map(|(key, item)| {
        let name = key_name(key);
        let parsed = Name::parse(&name)?;
        let is_producer =
            parsed.namespace == "taskhost" && parsed.package == "producer" && parsed.interface == Some("producer");
        match item {
            wit_parser::WorldItem::Interface { id, .. } if is_producer => {
                Some((parsed.version.unwrap_or("").to_string(), *id))
            }
            _ => None,
        }
    });
    let contract_version = match producer {
        None => {
            let listed = if exports.is_empty() {
                "nothing".to_string()
            } else {
                exports.iter().map(|e| format!("`{e}`")).collect::<Vec<_>>().join(", ")
            };
            let _ = writeln!(
                problems,
                "- the component does not export `{PRODUCER_EXPORT}`, so it is not a taskhost producer \
                 (world `taskhost:producer/plugin`); it exports {listed}. Generate the bindings for the \
                 `plugin` world of `wit/producer.wit` and export the `producer` interface"
            );
            String::new()
        }
        Some((version, id)) => {
            let contract = ContractVersion::of_version(&version).unwrap_or(ContractVersion::CURRENT);
            let functions = &resolve.interfaces[id].functions;
            let missing: Vec<String> = contract
                .functions()
                .iter()
                .filter(|f| !functions.contains_key(**f))
                .map(|f| format!("`{f}`"))
                .collect();
            if !missing.is_empty() {
                let _ = writeln!(
                    problems,
                    "- the export `{PRODUCER_EXPORT_PREFIX}{version}` lacks {} of the contract: implement \
                     every function of the `producer` interface",
                    missing.join(", ")
                );
            }
            version
        }
    };

    if !problems.is_empty() {
        let count = problems.lines().count();
        bail!(
            "the component does not fit the taskhost `plugin` world ({count} problem{}):\n{}",
            if count == 1 { "" } else { "s" },
            problems.trim_end()
        );
    }
    Ok(Some(Preflight { imports, exports, contract_version }))
}

/// The contract from which an ungranted `taskhost:producer` capability
/// import refuses a plugin at load (it brought the narrower world
/// `process-plugin`, so importing `subagents` means wanting it).
pub const GATED_AT_LOAD_SINCE: &str = "0.2.2";

/// A capability a plugin reaches only when its configuration grants it,
/// told by the imports that use it: a plugin importing one it is not granted
/// is refused when it loads, not when it first calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatedCapability {
    /// `taskhost:producer/subagents`: start child agent runs.
    Subagents,
    /// `wasi:http` (0.2.x): outbound HTTP requests.
    Http,
}

impl GatedCapability {
    /// The capability `full` (an import name) belongs to, if it is gated at
    /// load. A plugin built against a contract before
    /// [`GATED_AT_LOAD_SINCE`] imports `subagents` whether it uses it or not
    /// (toolchains such as componentize-py and jco import their whole world,
    /// and no narrower world existed): it keeps loading, and an ungranted
    /// call is refused when it is made.
    pub fn of_import(full: &str) -> Option<Self> {
        let name = Name::parse(full)?;
        let before_gate = name
            .version
            .and_then(|v| semver::Version::parse(v).ok())
            .is_some_and(|version| version < semver::Version::parse(GATED_AT_LOAD_SINCE).expect("a version"));
        match (name.namespace, name.package, name.interface) {
            ("taskhost", "producer", Some("subagents")) if !before_gate => Some(Self::Subagents),
            ("wasi", "http", _) => Some(Self::Http),
            _ => None,
        }
    }

    /// The configuration table that grants it.
    pub fn grant_table(self) -> &'static str {
        match self {
            Self::Subagents => "[producer.grants.subagents]",
            Self::Http => "[producer.grants.http]",
        }
    }

    /// What to write in [`Self::grant_table`], or do instead.
    fn hint(self) -> &'static str {
        match self {
            Self::Subagents => "with the backends it may use, e.g. `grants.subagents = { backends = [\"claude\"] }`",
            Self::Http => {
                "with the origins it may reach, e.g. `grants.http = { origins = [\"https://api.example.com\"] }`; \
                 a component that does not mean to use HTTP should not import it (ComponentizeJS adds it by \
                 default: build with `-d http -d fetch-event`)"
            }
        }
    }
}

/// Refuses a component whose imports need a capability `granted` says its
/// configuration does not grant, naming each import and the grant to add.
/// Imports of capabilities that are not gated are left to [`preflight`].
pub fn check_grants(imports: &[String], granted: impl Fn(GatedCapability) -> bool) -> anyhow::Result<()> {
    let mut problems = String::new();
    let mut seen = Vec::new();
    for full in imports {
        let Some(capability) = GatedCapability::of_import(full) else { continue };
        if granted(capability) || seen.contains(&capability) {
            continue;
        }
        seen.push(capability);
        let _ = writeln!(
            problems,
            "- it imports `{full}`, which its configuration does not grant: add {} to its \
             [[producer]] entry ({})",
            capability.grant_table(),
            capability.hint()
        );
    }
    if problems.is_empty() {
        return Ok(());
    }
    bail!("the plugin needs a capability it is not granted:\n{}", problems.trim_end())
}

/// The imports of a component, by full name, from its type information
/// alone (no compiling); `None` when it cannot be decoded (the compiler
/// will say why).
pub fn imports_of(bytes: &[u8]) -> Option<Vec<String>> {
    let wit_parser::decoding::DecodedWasm::Component(resolve, world) = wit_parser::decoding::decode(bytes).ok()? else {
        return None;
    };
    let world = &resolve.worlds[world];
    Some(
        world
            .imports
            .keys()
            .map(|key| match key {
                wit_parser::WorldKey::Name(name) => name.clone(),
                wit_parser::WorldKey::Interface(id) => {
                    resolve.id_of(*id).unwrap_or_else(|| "<unnamed interface>".into())
                }
            })
            .collect(),
    )
}

/// What is wrong with importing `full`, if anything.
fn import_problem(full: &str) -> Option<String> {
    let provided = super::host::PROVIDED_IMPORTS;
    let Some(name) = Name::parse(full) else {
        return Some(format!(
            "the component imports `{full}` (a bare name, not a WIT interface), which taskhost does not \
             provide; taskhost provides {provided}"
        ));
    };
    match (name.namespace, name.package) {
        ("wasi", "http") => match (name.interface, name.version) {
            (Some("outgoing-handler" | "types"), Some(version)) if in_series(version, WASI_SERIES) => None,
            (Some("incoming-handler"), _) => Some(format!(
                "the component imports `{full}`: a plugin may make requests (`wasi:http/outgoing-handler`, \
                 with [producer.grants.http]) but serves none"
            )),
            _ => Some(format!(
                "the component imports `{full}` ({}); this host serves wasi:http/outgoing-handler and \
                 wasi:http/types at {WASI_SERIES}.x",
                name.package_id()
            )),
        },
        ("wasi", package) if WASI_PACKAGES.contains(&package) => match name.version {
            Some(version) if in_series(version, WASI_SERIES) => None,
            _ => Some(format!(
                "the component imports `{full}` ({}); this host speaks WASI {WASI_SERIES}.x: build for \
                 WASI 0.2 (Rust: the `wasm32-wasip2` target)",
                name.package_id()
            )),
        },
        ("taskhost", "producer") => match name.interface {
            Some(interface) if CONTRACT_IMPORTS.contains(&interface) => None,
            _ => Some(format!(
                "the component imports `{full}`, which this host does not provide: the contract's \
                 imports are {}",
                CONTRACT_IMPORTS.iter().map(|i| format!("`{i}`")).collect::<Vec<_>>().join(", ")
            )),
        },
        _ => Some(format!(
            "the component imports `{full}`, which taskhost does not provide; taskhost provides {provided}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's contract constants are the parsed WIT of every version it
    /// serves (`wit/` for the current one, `wit/v<version>/` for frozen
    /// ones): the producer export and its functions, the taskhost interfaces
    /// a plugin may import, the contract and WASI versions. A WIT change that
    /// the constants (and so the checks and messages) do not follow fails
    /// here.
    #[test]
    fn the_contract_constants_match_the_parsed_wit() {
        for contract in ContractVersion::ALL {
            let dir = match contract {
                ContractVersion::CURRENT => concat!(env!("CARGO_MANIFEST_DIR"), "/../wit").to_string(),
                frozen => format!("{}/../wit/v{}", env!("CARGO_MANIFEST_DIR"), frozen.wit_version()),
            };
            check_constants_against(contract, &dir);
        }
        assert_eq!(ContractVersion::CURRENT, *ContractVersion::ALL.last().unwrap());
        assert_eq!(ContractVersion::spoken(), "0.1.x and 0.2.x");
    }

    fn check_constants_against(contract: ContractVersion, dir: &str) {
        let mut resolve = wit_parser::Resolve::new();
        let (package, _) = resolve.push_dir(dir).unwrap_or_else(|e| panic!("{dir} parses: {e:#}"));
        let world = resolve.select_world(&[package], Some("plugin")).expect("the plugin world");
        let world = &resolve.worlds[world];
        let name_of = |key: &wit_parser::WorldKey| match key {
            wit_parser::WorldKey::Name(name) => name.clone(),
            wit_parser::WorldKey::Interface(id) => resolve.id_of(*id).expect("named interface"),
        };

        let exports: Vec<String> = world.exports.keys().map(name_of).collect();
        assert_eq!(exports, [contract.producer_export()], "the world's exports in {dir}");
        assert_eq!(ContractVersion::of_export(contract.producer_export()), Some(contract));
        let producer = world.exports.values().next().unwrap();
        let wit_parser::WorldItem::Interface { id, .. } = producer else { panic!("producer is an interface") };
        let functions: Vec<&str> = resolve.interfaces[*id].functions.keys().map(String::as_str).collect();
        let mut expected = contract.functions().to_vec();
        let mut got = functions.clone();
        expected.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, expected, "the producer interface's functions in {dir}");

        let package_version = resolve.packages[package].name.version.as_ref().expect("versioned").to_string();
        assert_eq!(package_version, contract.wit_version(), "{dir}");
        assert!(in_series(&package_version, contract.series()), "{package_version} vs {}", contract.series());
        assert!(contract.producer_export().ends_with(&format!("@{package_version}")), "{contract}");

        // Every import of the world (and what it pulls in) is one the
        // pre-compile check accepts and the linker provides, and every
        // taskhost interface the check accepts exists in the package.
        let imports: Vec<String> = world.imports.keys().map(name_of).collect();
        for import in &imports {
            if let Some(problem) = import_problem(import) {
                panic!("the world's own import {import} would be refused: {problem}");
            }
            // `types` holds only types: nothing to link.
            if import.starts_with("taskhost:") && !import.starts_with("taskhost:producer/types@") {
                assert!(
                    crate::plugin::host::PROVIDED_IMPORTS.contains(import.as_str()),
                    "PROVIDED_IMPORTS does not name {import}"
                );
            }
        }
        let defined: Vec<&str> =
            resolve.packages[package].interfaces.keys().map(String::as_str).filter(|i| *i != "producer").collect();
        let mut accepted = CONTRACT_IMPORTS.to_vec();
        accepted.sort_unstable();
        let mut defined_sorted = defined.clone();
        defined_sorted.sort_unstable();
        assert_eq!(defined_sorted, accepted, "the package's importable interfaces in {dir}");
        for dep in resolve.packages.iter().map(|(_, p)| &p.name).filter(|n| n.namespace == "wasi") {
            // `wasi:http` is linked for a plugin granted it (`check_grants`).
            assert!(
                WASI_PACKAGES.contains(&dep.name.as_str()) || dep.name == "http",
                "{dir}/deps has wasi:{} the host does not link",
                dep.name
            );
            let version = dep.version.as_ref().expect("versioned").to_string();
            assert!(in_series(&version, WASI_SERIES), "wasi:{}@{version}", dep.name);
        }
    }

    #[test]
    fn versions_are_matched_by_semver_series() {
        assert!(in_series("0.1.0", "0.1"));
        assert!(in_series("0.1.7", "0.1"));
        assert!(in_series("0.1.0-rc.1", "0.1"));
        assert!(!in_series("0.2.0", "0.1"));
        assert!(!in_series("1.0.0", "0.1"));
        assert!(in_series("0.2.12", "0.2"));
        assert!(!in_series("0.3.0", "0.2"));
        assert!(!in_series("garbage", "0.2"));
        assert!(!in_series("0.2", "0.2"), "not a semantic version");
        assert!(in_series("1.4.0", "1.0") && !in_series("2.0.0", "1.0"));
    }

    #[test]
    fn an_ungranted_capability_is_named_with_its_grant() {
        let imports = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let subagents = imports(&["wasi:io/poll@0.2.0", "taskhost:producer/subagents@0.2.2"]);
        check_grants(&subagents, |_| true).expect("granted");
        let refused = format!("{:#}", check_grants(&subagents, |_| false).unwrap_err());
        assert!(
            refused.contains("`taskhost:producer/subagents@0.2.2`")
                && refused.contains("add [producer.grants.subagents]"),
            "{refused}"
        );
        // A later patch's import is the same capability, named once.
        let both = imports(&["taskhost:producer/subagents@0.2.2", "taskhost:producer/subagents@0.2.9"]);
        let refused = format!("{:#}", check_grants(&both, |_| false).unwrap_err());
        assert_eq!(refused.matches("add [producer.grants.subagents]").count(), 1, "{refused}");
        // Imports of capabilities that are not gated need no grant.
        check_grants(&imports(&["taskhost:producer/host-log@0.2.2", "wasi:cli/stdout@0.2.0"]), |_| false)
            .expect("nothing gated");
        // Plugins built before the gate (whose toolchains imported the whole
        // world, with no narrower one to target) keep loading.
        let older = imports(&["taskhost:producer/subagents@0.1.0", "taskhost:producer/subagents@0.2.1"]);
        check_grants(&older, |_| false).expect("refused at the call, not at load");
    }

    #[test]
    fn import_problems_name_the_import_and_the_fix() {
        assert_eq!(import_problem("wasi:io/poll@0.2.0"), None);
        assert_eq!(import_problem("wasi:clocks/monotonic-clock@0.2.12"), None);
        assert_eq!(import_problem("taskhost:producer/host-log@0.1.0"), None);
        assert_eq!(import_problem("taskhost:producer/process@0.2.0"), None);
        // wasi:http is served (to a plugin granted it: [`check_grants`]).
        assert_eq!(import_problem("wasi:http/types@0.2.3"), None);
        assert_eq!(import_problem("wasi:http/outgoing-handler@0.2.12"), None);
        let http_p3 = import_problem("wasi:http/types@0.3.0").unwrap();
        assert!(http_p3.contains("wasi:http/types at 0.2.x"), "{http_p3}");
        let serve = import_problem("wasi:http/incoming-handler@0.2.0").unwrap();
        assert!(serve.contains("serves none"), "{serve}");
        let refused = format!("{:#}", check_grants(&["wasi:http/types@0.2.3".into()], |_| false).unwrap_err());
        assert!(
            refused.contains("add [producer.grants.http]") && refused.contains("-d http -d fetch-event"),
            "{refused}"
        );
        let p3 = import_problem("wasi:io/poll@0.3.0").unwrap();
        assert!(p3.contains("this host speaks WASI 0.2.x"), "{p3}");
        let other = import_problem("acme:kv/store@1.0.0").unwrap();
        assert!(other.contains("`acme:kv/store@1.0.0`, which taskhost does not provide"), "{other}");
        let bare = import_problem("frobnicate").unwrap();
        assert!(bare.contains("bare name"), "{bare}");
    }
}
