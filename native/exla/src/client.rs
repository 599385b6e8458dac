//! Plugins and clients.

use std::sync::Arc;
use std::time::Instant;

use pjrt::xla_ffi::Platform;
use rustler::{Atom, NifMap, NifTaggedEnum, ResourceArc};

use crate::diagnostics::millis;
use crate::error::{Error, NifResult};
use crate::memory::{self, Ledger};

/// A loaded plugin.
pub struct PluginResource {
    pub handle: Arc<pjrt::Plugin>,
}

#[rustler::resource_impl]
impl rustler::Resource for PluginResource {}

/// A client, the XLA debug options (the client's `:xla_options`) that
/// every compilation on it overrides, and the ledger of its buffers'
/// memory (see `memory`).
pub struct ClientResource {
    pub handle: Arc<pjrt::Client>,
    compile_overrides: CompileOverrides,
    pub ledger: Arc<Ledger>,
    /// Whether the plugin has the run check of loops (see `cancel`).
    run_checks: bool,
}

type CompileOverrides = Vec<(String, pjrt::OptionOverride)>;

impl ClientResource {
    /// The options of a compilation on this client; `shardy` picks Shardy
    /// as the partitioner of a program of several partitions.
    pub fn compile_options(
        &self,
        num_replicas: i64,
        num_partitions: i64,
        shardy: bool,
    ) -> pjrt::CompileOptions {
        pjrt::CompileOptions {
            device_ordinal: -1,
            num_replicas,
            num_partitions,
            // Plugins refuse several partitions unless SPMD partitions them.
            use_spmd_partitioning: num_partitions > 1,
            use_shardy_partitioner: shardy && num_partitions > 1,
            env_option_overrides: self.compile_overrides.clone(),
        }
    }
}

#[rustler::resource_impl]
impl rustler::Resource for ClientResource {}

/// A create option, or an XLA option, as Elixir sends it: `{:int64, 1}`,
/// `{:float, 0.9}`, ...
#[derive(NifTaggedEnum)]
pub enum OptionValue {
    String(String),
    Int64(i64),
    Int64List(Vec<i64>),
    Float(f64),
    Bool(bool),
}

#[derive(NifMap)]
pub struct DeviceInfo {
    id: i32,
    kind: String,
}

#[derive(NifMap)]
pub struct ClientInfo {
    platform_name: String,
    platform_version: String,
    devices: Vec<DeviceInfo>,
    api_major: i32,
    api_minor: i32,
    run_checks: bool,
}

/// Sets a variable of the operating-system process's environment, where a
/// plugin reads its settings (its log levels) when it is loaded: the
/// BEAM's `os:putenv` changes only the BEAM's own copy. `EXLA.NativeLog`
/// decides the values, before each plugin is loaded.
#[rustler::nif]
fn os_env_put(name: String, value: String) -> NifResult<Atom> {
    if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
        return Err(Error::argument(format!(
            "invalid environment variable: {name:?}={value:?}"
        )));
    }
    // setenv is not safe against threads that read the environment at the
    // same moment; it runs only when the value changes (once per VM as a
    // rule), before the plugin that reads it exists.
    if std::env::var_os(&name).is_none_or(|current| current != *value) {
        std::env::set_var(&name, &value);
    }
    Ok(rustler::types::atom::ok())
}

#[rustler::nif(schedule = "DirtyIo")]
fn plugin_load(path: String) -> NifResult<ResourceArc<PluginResource>> {
    let started = Instant::now();
    let plugin = pjrt::Plugin::load(&path).inspect_err(|error| {
        // A file that exists but fails the checks before dlopen is an
        // integrity failure; other failures only raise.
        let file = std::path::Path::new(&path);
        match pjrt::check_plugin_file(file) {
            Err(reason) if file.is_file() => {
                crate::diagnostics::integrity_failure("plugin file", &path, &reason)
            }
            _ => tracing::debug!(target: "exla::plugin", path, %error, "could not load a PJRT plugin"),
        }
    })?;
    let (api_major, api_minor) = plugin.api_version();
    tracing::info!(
        target: "exla::plugin",
        path,
        api_major,
        api_minor,
        duration_ms = millis(started),
        "loaded a PJRT plugin"
    );
    Ok(ResourceArc::new(PluginResource { handle: plugin }))
}

/// Loads a library a plugin needs (a path, or a name the dynamic loader
/// searches for) with its symbols global: `{:ok, :ok}`, or `{:error,
/// {:runtime, reason}}` with the loader's reason. Which libraries, and in
/// what order, is decided in Elixir.
#[rustler::nif(schedule = "DirtyIo")]
fn library_load_global(library: String) -> NifResult<rustler::Atom> {
    let started = Instant::now();
    pjrt::load_library_global(&library)?;
    tracing::debug!(
        target: "exla::plugin",
        library,
        duration_ms = millis(started),
        "loaded a library for a plugin"
    );
    Ok(rustler::types::atom::ok())
}

/// Creates a client with the plugin's create options `options`; the XLA
/// debug options `xla_options` are kept for the client's compilations.
#[rustler::nif(schedule = "DirtyIo")]
fn client_create(
    plugin: ResourceArc<PluginResource>,
    options: Vec<(String, OptionValue)>,
    xla_options: Vec<(String, OptionValue)>,
) -> NifResult<ResourceArc<ClientResource>> {
    let options = options
        .into_iter()
        .map(|(name, value)| Ok((name, option_value(value)?)))
        .collect::<NifResult<Vec<_>>>()?;
    let overrides = xla_options
        .into_iter()
        .map(|(name, value)| Ok((name.clone(), option_override(&name, value)?)))
        .collect::<NifResult<Vec<_>>>()?;
    let started = Instant::now();
    let client = pjrt::Client::create(&plugin.handle, &options).inspect_err(|error| {
        tracing::debug!(target: "exla::client", %error, "could not create a PJRT client");
    })?;
    tracing::info!(
        target: "exla::client",
        platform = client.platform_name(),
        version = client.platform_version(),
        devices = client.devices().len(),
        duration_ms = millis(started),
        "created a PJRT client"
    );
    // The host's handlers (a check on a GPU would wait for the device at
    // every iteration, so loops there run without checks).
    let host = Platform::from_client_name(client.platform_name()) == Some(Platform::Host);
    if host {
        install_linalg(&plugin.handle);
    }
    let ledger = Ledger::new(client.devices().len());
    // A plugin without the XLA FFI runs loops without checks.
    let run_checks = host
        && crate::cancel::install(&plugin.handle)
            .inspect_err(|error| {
                tracing::debug!(target: "exla::client", %error, "runs of this client cannot be stopped");
            })
            .is_ok();
    Ok(ResourceArc::new(ClientResource {
        handle: client,
        compile_overrides: overrides,
        ledger,
        run_checks,
    }))
}

/// Registers the host's decompositions (`exla_linalg`) with a CPU
/// client's plugin, which `EXLA.Defn.Lowering.Decompositions` calls. A
/// plugin that cannot take them is told in a warning: its programs with
/// decompositions then fail to compile, naming the missing target.
fn install_linalg(plugin: &pjrt::Plugin) {
    if let Err(error) = exla_linalg::install(plugin) {
        tracing::warn!(
            target: "exla::client",
            %error,
            "could not register the native decompositions with the CPU plugin"
        );
    }
}

fn option_override(name: &str, value: OptionValue) -> NifResult<pjrt::OptionOverride> {
    Ok(match value {
        OptionValue::String(s) => pjrt::OptionOverride::String(s),
        OptionValue::Int64(i) => pjrt::OptionOverride::Int(i),
        OptionValue::Float(f) => pjrt::OptionOverride::Double(f),
        OptionValue::Bool(b) => pjrt::OptionOverride::Bool(b),
        OptionValue::Int64List(_) => {
            return Err(Error::argument(format!(
                "the XLA option {name} cannot be a list"
            )))
        }
    })
}

fn option_value(value: OptionValue) -> NifResult<pjrt::OptionValue> {
    Ok(match value {
        OptionValue::String(s) => pjrt::OptionValue::String(s),
        OptionValue::Int64(i) => pjrt::OptionValue::Int64(i),
        OptionValue::Int64List(l) => pjrt::OptionValue::Int64List(l),
        OptionValue::Float(f) if f.is_finite() && f.abs() <= f32::MAX as f64 => {
            pjrt::OptionValue::Float(f as f32)
        }
        OptionValue::Float(f) => {
            return Err(Error::argument(format!(
                "option value {f} does not fit a float"
            )))
        }
        OptionValue::Bool(b) => pjrt::OptionValue::Bool(b),
    })
}

#[rustler::nif]
fn client_info(client: ResourceArc<ClientResource>) -> ClientInfo {
    let run_checks = client.run_checks;
    let client = &client.handle;
    let (api_major, api_minor) = client.plugin().api_version();
    ClientInfo {
        api_major,
        api_minor,
        run_checks,
        platform_name: client.platform_name().to_string(),
        platform_version: client.platform_version().to_string(),
        devices: client
            .devices()
            .iter()
            .map(|d| DeviceInfo {
                id: d.id,
                kind: d.kind.clone(),
            })
            .collect(),
    }
}

/// Runs on a dirty scheduler: a plugin may take its allocator's locks.
#[rustler::nif(schedule = "DirtyIo")]
fn client_memory_statistics(client: ResourceArc<ClientResource>) -> NifResult<memory::Statistics> {
    memory::statistics(&client.handle, &client.ledger)
}

mod atoms {
    rustler::atoms! { ok }
}

#[rustler::nif]
fn client_reset_peak_memory(client: ResourceArc<ClientResource>) -> Atom {
    client.ledger.reset_peak();
    atoms::ok()
}
