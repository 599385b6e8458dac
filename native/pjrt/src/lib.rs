//! Safe bindings to the PJRT C API.
//!
//! Plugins are shared libraries exporting `GetPjrtApi`; they are loaded at run
//! time (`Plugin::load`), their API version is checked before any function is
//! called, and every handle is an owned Rust value released exactly once.

mod buffer;
mod client;
mod compile_options;
mod cuda;
pub mod debug_options;
mod error;
mod event;
mod executable;
pub mod ffi;
mod guard;
pub mod host_callback;
mod library;
mod plugin;
mod types;
pub mod xla_ffi;

pub use buffer::Buffer;
pub use client::{Client, Device, MemoryStats, OptionValue};
pub use compile_options::{CompileOptions, OptionOverride};
pub use error::{Error, Result};
pub use event::Event;
pub use executable::LoadedExecutable;
/// The checks a plugin file passes before `dlopen` (see `Plugin::load`):
/// `Err` says why the file is truncated, corrupt or of a foreign format.
pub use library::check as check_plugin_file;
/// Loads a library a plugin needs before the plugin, with its symbols
/// global (see `library::load_global`).
pub use library::load_global as load_library_global;
pub use plugin::{Plugin, MIN_API_VERSION};
pub use types::{ElementType, Shape};
