//! The JSON Schema of a typed producer's arguments, derived with `schemars`.
//!
//! Model: [`args_schema`] derives the schema of an `Args` type (JSON Schema
//! 2020-12, subschemas inlined so the model reads one self-contained object)
//! and [`clean`] turns it into what the model should see. Invariants of the
//! result:
//! - the root has no `$schema`, `title` or `description` (the tool's
//!   description is the producer's, not the Rust type's doc comment);
//! - no integer or number carries a `schemars` width `format` (`uint32`,
//!   `int64`, `double`, ...): validators ignore those formats and models
//!   need not read them; `minimum` / `maximum` say the range instead;
//! - every other keyword (`default`, `description`, `additionalProperties`
//!   from `#[serde(deny_unknown_fields)]`, `required`, ...) is kept as
//!   derived, and nothing is added.
//!
//! [`check_reserved`] refuses a schema that declares a property the host
//! owns (`run_in_background`, `interactive`, `notify_on`): the host adds
//! those itself and strips them before `label` / `run`.

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::Value;

/// Properties the host adds to every tool schema and strips before the
/// plugin sees the arguments. An `Args` type must not declare them.
pub const HOST_PROPERTIES: &[&str] = &["run_in_background", "interactive", "notify_on"];

/// The numeric `format`s `schemars` derives from Rust integer and float
/// widths (not JSON Schema formats a validator or a model uses).
const NUMERIC_FORMATS: &[&str] = &[
    "int", "int8", "int16", "int32", "int64", "int128", "uint", "uint8", "uint16", "uint32", "uint64", "uint128",
    "float", "double",
];

/// The cleaned schema of `T` as the model should see it (see the module
/// docs).
pub fn args_schema<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::draft2020_12()
        .for_deserialize()
        .with(|settings| {
            settings.meta_schema = None;
            settings.inline_subschemas = true;
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    clean(&mut schema);
    schema
}

/// Removes what the model need not see from a derived schema: the root's
/// `$schema`, `title` and `description`, and numeric width formats
/// everywhere.
pub fn clean(schema: &mut Value) {
    if let Some(root) = schema.as_object_mut() {
        for key in ["$schema", "title", "description"] {
            root.remove(key);
        }
    }
    strip_numeric_formats(schema);
}

fn strip_numeric_formats(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            let numeric = match object.get("type") {
                Some(Value::String(kind)) => is_numeric(kind),
                Some(Value::Array(kinds)) => kinds.iter().any(|k| k.as_str().is_some_and(is_numeric)),
                _ => false,
            };
            if numeric && object.get("format").and_then(Value::as_str).is_some_and(|f| NUMERIC_FORMATS.contains(&f)) {
                object.remove("format");
            }
            for (key, value) in object.iter_mut() {
                // `default`, `examples`, `const` and `enum` hold data, not schemas.
                if !matches!(key.as_str(), "default" | "examples" | "const" | "enum") {
                    strip_numeric_formats(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_numeric_formats),
        _ => {}
    }
}

fn is_numeric(kind: &str) -> bool {
    kind == "integer" || kind == "number"
}

/// Fails when the schema is not an object schema or declares a property the
/// host owns, with what to change.
pub fn check_reserved(schema: &Value, type_name: &str) -> Result<(), String> {
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(format!(
            "the arguments type {type_name} must derive an object schema (a struct with named fields), got {schema}"
        ));
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for name in HOST_PROPERTIES {
            if properties.contains_key(*name) {
                return Err(format!(
                    "the arguments type {type_name} declares `{name}`, which the host owns (it adds it to the tool's \
                     schema and strips it before label and run): remove that field"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    fn seven() -> u32 {
        7
    }

    /// Top doc comment: not part of the model's schema.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Args {
        /// How many.
        #[serde(default = "seven")]
        #[schemars(range(max = 10))]
        count: u32,
        /// Nested, inlined.
        #[serde(default)]
        inner: Option<Inner>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Inner {
        size: u64,
    }

    #[test]
    fn a_derived_schema_is_a_clean_self_contained_object() {
        let schema = args_schema::<Args>();
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "properties": {
                    "count": { "type": "integer", "minimum": 0, "maximum": 10, "default": 7, "description": "How many." },
                    "inner": {
                        "description": "Nested, inlined.",
                        "type": ["object", "null"],
                        "properties": { "size": { "type": "integer", "minimum": 0 } },
                        "required": ["size"]
                    }
                },
                "additionalProperties": false
            })
        );
        assert_eq!(check_reserved(&schema, "Args"), Ok(()));
    }

    #[test]
    fn host_owned_properties_are_refused() {
        let schema = json!({ "type": "object", "properties": { "run_in_background": { "type": "boolean" } } });
        let error = check_reserved(&schema, "Args").unwrap_err();
        assert!(error.contains("declares `run_in_background`, which the host owns"), "{error}");
        let error = check_reserved(&json!({ "type": "string" }), "Args").unwrap_err();
        assert!(error.contains("must derive an object schema"), "{error}");
    }

    #[test]
    fn only_numeric_width_formats_are_stripped() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "when": { "type": "string", "format": "date-time" },
                "n": { "type": ["integer", "null"], "format": "int64", "default": { "format": "uint8" } }
            }
        });
        clean(&mut schema);
        assert_eq!(schema["properties"]["when"]["format"], "date-time");
        assert_eq!(schema["properties"]["n"].get("format"), None);
        assert_eq!(schema["properties"]["n"]["default"]["format"], "uint8", "data is left alone");
    }
}
