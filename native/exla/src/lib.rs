//! EXLA's NIF: a thin, typed layer over the `pjrt` bindings.
//!
//! Each PJRT handle is one resource type. No call holds a normal scheduler
//! for more than about a millisecond: calls that only enqueue work or touch
//! a few bytes run on normal schedulers, those that may block (loading a
//! plugin, creating a client, large transfers, waiting for results) on
//! dirty schedulers, and compiles and long programs on the native threads
//! of `pool`, which reply by message. The Elixir side picks the variant
//! (`EXLA.DeviceBuffer` by a transfer's size, `EXLA.Executable` by the
//! program).

#[macro_use]
mod schedule;

mod buffer;
mod callback;
mod cancel;
mod client;
mod diagnostics;
mod error;
mod executable;
#[cfg(feature = "fault-injection")]
mod fault;
mod halt;
mod host_heap;
mod ipc;
mod memory;
mod pool;
mod resource;
mod term;
mod xla_options;

mod atoms {
    rustler::atoms! { large_buffer_bytes }
}

/// `info` is the map `EXLA.NIF` loads the library with: the facts of
/// `EXLA.Placement` that the native side applies too.
fn load(env: rustler::Env, info: rustler::Term) -> bool {
    let Ok(large) = info
        .map_get(atoms::large_buffer_bytes())
        .and_then(|bytes| bytes.decode::<usize>())
    else {
        return false;
    };
    buffer::set_large_bytes(large);
    diagnostics::install();
    halt::install(env);
    true
}

rustler::init!("Elixir.EXLA.NIF", load = load);
