//! Parsing the JSON texts the host hands to a plugin into serde types.
//!
//! `describe`, `label` and `run` receive the instance config and the tool
//! arguments as JSON text. The host validates the arguments against the
//! schema from `describe` before `label`/`run`, but a plugin should still
//! parse strictly (`#[serde(deny_unknown_fields)]`, defaults with
//! `#[serde(default)]`): the error strings returned here go back to the
//! model or the operator verbatim, so they say what was wrong.

use serde::de::DeserializeOwned;

/// Parses tool arguments. The error reads `invalid arguments: <reason>`.
///
/// ```ignore
/// #[derive(serde::Deserialize)]
/// #[serde(deny_unknown_fields)]
/// struct Args { #[serde(default = "three")] count: u32 }
/// let args: Args = parse_args(&args_json)?;
/// ```
pub fn parse_args<T: DeserializeOwned>(args: &str) -> Result<T, String> {
    parse("arguments", args)
}

/// Parses the instance config (the `config` table of the producer's entry in
/// `taskhost.toml`, as JSON). An empty text counts as `{}`. The error reads
/// `invalid config: <reason>`.
pub fn parse_config<T: DeserializeOwned>(config: &str) -> Result<T, String> {
    parse("config", config)
}

fn parse<T: DeserializeOwned>(what: &str, text: &str) -> Result<T, String> {
    // The host sends `{}` when there is nothing, but an empty string is the
    // obvious thing for a hand-written test or another host to send.
    let text = if text.trim().is_empty() { "{}" } else { text };
    serde_json::from_str(text).map_err(|error| format!("invalid {what}: {error}"))
}
