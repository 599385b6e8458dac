//! What the VM's halt must wait for.
//!
//! `erlang:halt/1` ends the process with `exit()`, which runs the C++ exit
//! handlers of the plugins: they free global tables (MLIR's and LLVM's
//! registries, oneDNN's) that a compile or a run on one of `pool`'s
//! threads may be using at that moment, and the VM then dies of a
//! segfault or "pure virtual method called" instead of exiting with the
//! status it was given (seen in one script in five that called
//! `System.halt/1` while the background warm-up of the CPU plugin was
//! compiling). An orderly exit waits in Elixir (`EXLA.Application`); a
//! halt is caught here.
//!
//! OTP 26 (NIF API 2.17) lets a NIF library install a callback that the
//! halt calls before `exit()` (`enif_set_option(env, ERL_NIF_OPT_ON_HALT,
//! callback)`, only from the library's load). The function is looked up
//! in the running VM, so the same library also loads on OTP 25, where a
//! halt waits for nothing.

use std::ffi::{c_int, c_void};
use std::time::Duration;

/// `ERL_NIF_OPT_ON_HALT` of `erl_nif.h`.
const ERL_NIF_OPT_ON_HALT: c_int = 2;

/// How long a halt waits for the work under way, at most: as long as an
/// orderly exit waits (`EXLA.Application.await_native_work/1`).
const HALT_TIMEOUT: Duration = Duration::from_secs(10);

type SetOption = unsafe extern "C" fn(*mut c_void, c_int, ...) -> c_int;

extern "C" fn on_halt(_priv_data: *mut c_void) {
    // Nothing may unwind into the VM.
    let ended = std::panic::catch_unwind(|| crate::pool::on_halt(HALT_TIMEOUT)).unwrap_or(false);
    if !ended {
        tracing::warn!(target: "exla::halt", "the VM halts while native work is still running");
    }
}

/// Installs `on_halt`, from the library's load callback, where the VM has
/// the option (OTP 26 and later); elsewhere a halt waits for nothing. (No
/// event says which: at load, before Elixir sets the level, only warnings
/// pass, and this is no fault.)
pub fn install(env: rustler::Env) {
    // SAFETY: the VM's own symbols; `enif_set_option` has this signature
    // wherever it exists, and is called from the load callback as required.
    unsafe {
        let this = libloading::os::unix::Library::this();
        if let Ok(set_option) = this.get::<SetOption>(b"enif_set_option\0") {
            let callback: extern "C" fn(*mut c_void) = on_halt;
            set_option(env.as_c_arg() as *mut c_void, ERL_NIF_OPT_ON_HALT, callback);
        }
    }
}
