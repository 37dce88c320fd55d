//! The typed producer API: a [`Producer`] with typed `Config` and `Args`, a
//! typed [`Task`], and [`export_producer!`](crate::export_producer) to
//! register them, instead of the raw [`Guest`] / [`GuestTask`] over JSON text.
//!
//! Model: [`Exported<P>`] implements the generated [`Guest`] for any
//! `P: Producer`, and [`ExportedTask<P>`] the generated [`GuestTask`] around
//! `P::Task`; the macro only names `Exported<P>` to the bindings' `export!`.
//! Invariants the adapter keeps, so every typed plugin keeps them:
//! - Each export parses the config once (`describe`, `label` and `run` each
//!   receive it; it is never parsed twice in one call), with an error that
//!   names the field (`invalid config: at `default_message`: ...`), and
//!   parses the arguments once into `P::Args` (`invalid arguments: ...`).
//! - The descriptor is `P::KIND`, `P::DESCRIPTION`, `P::STREAMS_OUTPUT`,
//!   `P::TAKES_INPUT` and the schema derived from `P::Args`
//!   ([`crate::schema::args_schema`], cleaned), adjusted per instance by
//!   [`Producer::adjust_schema`]. A schema that declares a host-owned
//!   property (`run_in_background`, `interactive`, `notify_on`) or is not an
//!   object schema refuses `describe` with what to change.
//! - `write_input` on a kind that does not take input is refused with
//!   [`no_input`](crate::no_input)`(P::KIND)` without reaching the task.

use core::marker::PhantomData;

use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::json::{parse_args, parse_config};
use crate::{Descriptor, Guest, GuestTask, Outcome, Pollable, RunMode};

/// One kind of task, with typed configuration and arguments.
///
/// Implement it on a unit struct and register it once, at the crate root,
/// with `taskhost_plugin_sdk::export_producer!(MyProducer);`.
pub trait Producer: 'static {
    /// The task kind (lowercase letters, digits, `_` and `-`); also the
    /// default tool name.
    const KIND: &'static str;
    /// What the model reads about the tool.
    const DESCRIPTION: &'static str;
    /// Whether output streams through `read_output` (consuming reads); when
    /// false, the result is `Outcome::output`.
    const STREAMS_OUTPUT: bool = true;
    /// Whether background tasks take input while they run (see the guide's
    /// section 5a); the host then calls [`Task::write_input`].
    const TAKES_INPUT: bool = false;

    /// The instance config (the `config` table of a `[[producer]]` entry);
    /// use [`NoConfig`] for none. Parse strictly:
    /// `#[serde(deny_unknown_fields)]`.
    type Config: DeserializeOwned;
    /// The tool arguments. Their JSON Schema, derived with
    /// `#[derive(JsonSchema)]`, is what the model sees: document each field
    /// with a doc comment and use `#[serde(deny_unknown_fields)]`. Never
    /// declare `run_in_background` (the host owns it).
    type Args: DeserializeOwned + JsonSchema;
    /// One running task.
    type Task: Task;

    /// Adjusts the derived schema for one instance, e.g. a default taken
    /// from the config. The default changes nothing.
    fn adjust_schema(config: &Self::Config, schema: &mut Value) {
        let _ = (config, schema);
    }

    /// What this task does, in one line (shown in `task_list`). Called
    /// before `run`; an error refuses the call. The default is the kind.
    fn label(config: &Self::Config, args: &Self::Args) -> Result<String, String> {
        let _ = (config, args);
        Ok(Self::KIND.to_owned())
    }

    /// Starts a task. Return at once: the host waits on
    /// [`Task::subscribe`]. An error refuses the call (release what you
    /// acquired first).
    fn run(config: Self::Config, args: Self::Args, mode: RunMode) -> Result<Self::Task, String>;
}

/// One running task of a [`Producer`]. Every method returns promptly; keep
/// mutable state in `Cell` / `RefCell` (a task is single-threaded).
pub trait Task: 'static {
    /// A pollable that is ready when `done` may have an outcome or output
    /// may be waiting (`time::ready_now()` once finished).
    fn subscribe(&self) -> Pollable;

    /// The outcome once the task has finished (at quiescence), else `None`.
    fn done(&self) -> Option<Outcome>;

    /// Stops the task: idempotent, and `done` must soon say `killed`.
    fn cancel(&self, reason: Option<String>);

    /// Everything produced since the previous call, never twice (stream
    /// kinds). The default is `""`, right for a final-output-only kind.
    fn read_output(&self) -> String {
        String::new()
    }

    /// Input from the model (`task_input`), only asked of kinds with
    /// `TAKES_INPUT` (the adapter refuses it for the others). The default
    /// refuses.
    fn write_input(&self, data: Vec<u8>, close: bool) -> Result<(), String> {
        let _ = (data, close);
        Err("this task takes no input".to_owned())
    }
}

/// The config of a producer that takes none: `{}` (or nothing), and any key
/// is refused by name.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoConfig {}

/// The raw [`Guest`] implementation of a [`Producer`]; named only by
/// [`export_producer!`](crate::export_producer).
pub struct Exported<P>(PhantomData<P>);

/// The raw [`GuestTask`] around a [`Producer`]'s task.
pub struct ExportedTask<P: Producer> {
    task: P::Task,
}

/// The cleaned, instance-adjusted schema of `P::Args` for `config`, checked.
pub fn descriptor<P: Producer>(config: &P::Config) -> Result<Descriptor, String> {
    let mut schema = crate::schema::args_schema::<P::Args>();
    P::adjust_schema(config, &mut schema);
    crate::schema::check_reserved(&schema, core::any::type_name::<P::Args>())?;
    let descriptor = Descriptor::new(P::KIND, P::DESCRIPTION, &schema, P::STREAMS_OUTPUT);
    Ok(if P::TAKES_INPUT { descriptor.taking_input() } else { descriptor })
}

impl<P: Producer> Guest for Exported<P> {
    type Task = ExportedTask<P>;

    fn describe(config: String) -> Result<Descriptor, String> {
        let config: P::Config = parse_config(&config)?;
        descriptor::<P>(&config)
    }

    fn label(config: String, args: String) -> Result<String, String> {
        let config: P::Config = parse_config(&config)?;
        let args: P::Args = parse_args(&args)?;
        P::label(&config, &args)
    }

    fn run(config: String, args: String, mode: RunMode) -> Result<crate::Task, String> {
        let config: P::Config = parse_config(&config)?;
        let args: P::Args = parse_args(&args)?;
        let task = P::run(config, args, mode)?;
        Ok(crate::Task::new(ExportedTask::<P> { task }))
    }
}

impl<P: Producer> GuestTask for ExportedTask<P> {
    fn cancel(&self, reason: Option<String>) {
        self.task.cancel(reason);
    }

    fn subscribe(&self) -> Pollable {
        self.task.subscribe()
    }

    fn done(&self) -> Option<Outcome> {
        self.task.done()
    }

    fn read_output(&self) -> String {
        self.task.read_output()
    }

    fn write_input(&self, data: Vec<u8>, close: bool) -> Result<(), String> {
        if !P::TAKES_INPUT {
            return Err(crate::no_input(P::KIND));
        }
        self.task.write_input(data, close)
    }
}

/// Registers a type implementing [`Producer`] as the plugin's `producer`
/// export. Invoke it exactly once, at the root of the plugin crate:
/// `taskhost_plugin_sdk::export_producer!(MyProducer);`
///
/// It implements the raw `Guest` / `GuestTask` through [`Exported`]; a
/// plugin uses either this macro or [`export!`](crate::export), not both.
#[macro_export]
macro_rules! export_producer {
    ($producer:ty) => {
        const _: () = {
            // The bindings' export macro takes a type name, not a path.
            type TaskhostExportedProducer = $crate::typed::Exported<$producer>;
            $crate::export!(TaskhostExportedProducer);
        };
    };
}

/// Everything a typed producer usually needs, in one `use`:
/// `use taskhost_plugin_sdk::typed::prelude::*;`
pub mod prelude {
    pub use super::{NoConfig, Producer, Task};
    pub use crate::output::OutputBuffer;
    pub use crate::{Outcome, Pollable, RunMode, TerminalStatus, log, time};
    pub use schemars::JsonSchema;
    pub use serde::Deserialize;
}
