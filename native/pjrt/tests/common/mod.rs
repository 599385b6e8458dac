//! Where the integration tests find the CPU plugin.
//!
//! The first of these that is set wins: `PJRT_PLUGIN_PATH`, then
//! `EXLA_PJRT_PLUGIN_HOST`, then the place EXLA installs the plugin (as
//! `EXLA.Plugin.cpu_plugin_path/1` computes it), so that `cargo test` works
//! wherever `mix test` or `.ci/run` has run once.

use std::path::PathBuf;
use std::sync::Arc;

use pjrt::Plugin;

// The plugin's pin, the one EXLA.Plugin.Install and .ci/run read: the
// install folder and the library's name come from it.
const PIN: &str = include_str!("../../../../lib/exla/plugin/cpu_plugin.pin");

/// The value of the pin's line `key value`.
fn pin_field(key: &str) -> &'static str {
    PIN.lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(name, _)| *name == key)
        .map(|(_, value)| value.trim())
        .unwrap_or_else(|| panic!("cpu_plugin.pin has no `{key}` line"))
}

/// The CPU plugin, loaded; panics with how to get it when it is missing.
pub fn plugin() -> Arc<Plugin> {
    Plugin::load(plugin_file()).expect("the CPU plugin loads")
}

/// The CPU plugin's file; panics with how to get it when it is missing.
pub fn plugin_file() -> PathBuf {
    let path = plugin_path();
    if !path.is_file() {
        panic!(
            "the CPU PJRT plugin is not at {}.\n\
             Install it as EXLA does: run `mix test` (or `.ci/run`) once, or \
             `mix run -e 'EXLA.Plugin.install!()'`; or point PJRT_PLUGIN_PATH at \
             an xla_cpu_pjrt.so.",
            path.display()
        );
    }
    path
}

fn plugin_path() -> PathBuf {
    for variable in ["PJRT_PLUGIN_PATH", "EXLA_PJRT_PLUGIN_HOST"] {
        if let Some(path) = non_empty_env(variable) {
            return PathBuf::from(path);
        }
    }
    let dir = format!(
        "{}-{}-{}",
        pin_field("package"),
        pin_field("version"),
        std::env::consts::ARCH
    );
    let member = pin_field("member");
    let library = member.rsplit('/').next().unwrap_or(member);
    exla_cache_dir().join("plugins").join(dir).join(library)
}

/// EXLA's cache directory: `EXLA_CACHE_DIR`, else Erlang's user cache
/// directory for "exla" (`:filename.basedir(:user_cache, "exla")`).
fn exla_cache_dir() -> PathBuf {
    if let Some(dir) = non_empty_env("EXLA_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let home = || PathBuf::from(non_empty_env("HOME").unwrap_or_default());
    if cfg!(target_os = "macos") {
        return home().join("Library/Caches/exla");
    }
    match non_empty_env("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir).join("exla"),
        None => home().join(".cache/exla"),
    }
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}
