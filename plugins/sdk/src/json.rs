//! Parsing the JSON texts the host hands to a plugin into serde types.
//!
//! `describe`, `label` and `run` receive the instance config and the tool
//! arguments as JSON text. The host validates the arguments against the
//! schema from `describe` before `label`/`run`, but a plugin should still
//! parse strictly (`#[serde(deny_unknown_fields)]`, defaults with
//! `#[serde(default)]`): the error strings returned here go back to the
//! model or the operator verbatim, so they say what was wrong: a value of
//! the wrong type is named by its path (`invalid config: at
//! `default_message`: invalid type: ...`), an unknown field by serde.

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
    let mut reader = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut reader).map_err(|error| {
        let mut path = error.path().to_string();
        let inner = error.into_inner().to_string();
        // An unknown field names itself: the path ends at its parent.
        if inner.starts_with("unknown field") {
            path = path.rsplit_once('.').map_or(".".to_owned(), |(parent, _)| parent.to_owned());
        }
        // The root (`.`) names nothing.
        if path == "." { format!("invalid {what}: {inner}") } else { format!("invalid {what}: at `{path}`: {inner}") }
    })?;
    reader.end().map_err(|error| format!("invalid {what}: {error}"))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Config {
        default_message: Option<String>,
        #[serde(default)]
        inner: Inner,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        #[serde(default)]
        size: u32,
    }

    #[test]
    fn errors_name_the_field() {
        let error = parse_config::<Config>(r#"{"default_message": 3}"#).unwrap_err();
        assert!(error.starts_with("invalid config: at `default_message`: invalid type: integer `3`"), "{error}");
        let error = parse_config::<Config>(r#"{"inner": {"size": "big"}}"#).unwrap_err();
        assert!(error.starts_with("invalid config: at `inner.size`: invalid type: string"), "{error}");
        let error = parse_config::<Config>(r#"{"nope": 1}"#).unwrap_err();
        assert!(error.starts_with("invalid config: unknown field `nope`"), "{error}");
        let error = parse_config::<Config>(r#"{"inner": {"nope": 1}}"#).unwrap_err();
        assert!(error.starts_with("invalid config: at `inner`: unknown field `nope`"), "{error}");
        let error = parse_args::<Config>(r#"{} x"#).unwrap_err();
        assert!(error.starts_with("invalid arguments: trailing characters"), "{error}");
        assert!(parse_config::<Config>("  ").is_ok(), "an empty text is {{}}");
    }
}
