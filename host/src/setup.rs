//! Building a [`Host`] from a [`Config`]: the one place that turns
//! `[[producer]]` entries into served tools.
//!
//! Every `plugin` value a configuration may name is resolved in
//! [`build_producer`]; anything it does not know is an error that lists what
//! is supported, so a typo never serves a half-configured host.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::Host;
use crate::config::{Config, ProducerConfig};
use crate::producer::Producer;
use crate::tools::producer_tool::ProducerToolOptions;

/// The `plugin` values this build can serve.
pub const SUPPORTED_PLUGINS: &[&str] = &["native:ticker"];

/// Builds the producer a `[[producer]]` entry names.
pub fn build_producer(config: &ProducerConfig) -> anyhow::Result<Arc<dyn Producer>> {
    match config.plugin.as_str() {
        "native:ticker" => Ok(Arc::new(crate::native::ticker::TickerProducer::new(&config.config_json())?)),
        other => anyhow::bail!(
            "unsupported plugin {other:?} for tool {:?}; this build supports: {}",
            config.tool,
            SUPPORTED_PLUGINS.join(", ")
        ),
    }
}

/// A host serving the configuration's producers (or the defaults).
pub fn host_from_config(config: &Config) -> anyhow::Result<Host> {
    let host = Host::new(&config.tasks)?;
    for producer in config.effective_producers() {
        let built = build_producer(&producer).with_context(|| format!("[[producer]] {:?}", producer.tool))?;
        host.add_producer(
            built,
            ProducerToolOptions {
                name: producer.tool.clone(),
                background: producer.background,
                foreground_timeout: Duration::from_millis(producer.foreground_timeout_ms),
            },
        );
    }
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_serve_the_ticker_and_the_control_tools() {
        let host = host_from_config(&Config::default()).unwrap();
        let names: Vec<String> = host.tool_definitions().into_iter().map(|d| d.name).collect();
        assert_eq!(names, ["task_kill", "task_list", "task_output", "ticker"]);
    }

    #[test]
    fn an_unknown_plugin_names_what_is_supported() {
        let config = Config::parse("[[producer]]\ntool = \"x\"\nplugin = \"native:nope\"\n").unwrap();
        let error = format!("{:#}", host_from_config(&config).err().unwrap());
        assert!(error.contains("unsupported plugin \"native:nope\" for tool \"x\""), "{error}");
        assert!(error.contains("native:ticker"), "{error}");
    }
}
