//! Plugins and clients.

use std::sync::Arc;

use rustler::{NifMap, NifTaggedEnum, ResourceArc};

use crate::error::{Error, NifResult};

pub struct PluginResource(pub Arc<pjrt::Plugin>);

#[rustler::resource_impl]
impl rustler::Resource for PluginResource {}

pub struct ClientResource(pub Arc<pjrt::Client>);

#[rustler::resource_impl]
impl rustler::Resource for ClientResource {}

/// A create option as Elixir sends it: `{:int64, 1}`, `{:float, 0.9}`, ...
#[derive(NifTaggedEnum)]
pub enum OptionValue {
    String(String),
    Int64(i64),
    Int64List(Vec<i64>),
    Float(f64),
    Bool(bool),
}

#[derive(NifMap)]
pub struct PluginInfo {
    api_major: i32,
    api_minor: i32,
    path: String,
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
}

#[rustler::nif(schedule = "DirtyIo")]
fn plugin_load(path: String) -> NifResult<ResourceArc<PluginResource>> {
    // Plugins log INFO lines to stderr through absl and read this once when
    // loaded; keep warnings and errors unless the user chose a level. The
    // BEAM's os:putenv does not reach the C environment, so it is set here.
    if std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "1");
    }
    let plugin = pjrt::Plugin::load(&path)?;
    Ok(ResourceArc::new(PluginResource(plugin)))
}

#[rustler::nif]
fn plugin_info(plugin: ResourceArc<PluginResource>) -> PluginInfo {
    let (api_major, api_minor) = plugin.0.api_version();
    PluginInfo {
        api_major,
        api_minor,
        path: plugin.0.path().display().to_string(),
    }
}

#[rustler::nif(schedule = "DirtyIo")]
fn client_create(
    plugin: ResourceArc<PluginResource>,
    options: Vec<(String, OptionValue)>,
) -> NifResult<ResourceArc<ClientResource>> {
    let options = options
        .into_iter()
        .map(|(name, value)| Ok((name, option_value(value)?)))
        .collect::<NifResult<Vec<_>>>()?;
    let client = pjrt::Client::create(&plugin.0, &options)?;
    Ok(ResourceArc::new(ClientResource(client)))
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
    let client = &client.0;
    ClientInfo {
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
