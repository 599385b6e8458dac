//! Fault injection for the host-callback tests: makes the Rust side of a
//! session panic on purpose, to check that such panics become Elixir errors
//! and leave the VM and the client usable (nothing else makes the handler
//! or the replying NIF panic).
//!
//! Compiled only with the `fault-injection` cargo feature, which the test
//! environment's build enables (the NIF compiler, `mix/compile_exla_native.exs`);
//! other builds neither export the NIF nor keep the registry of armed faults.

use std::sync::{Mutex, OnceLock};

use rustler::{Atom, LocalPid};

use crate::error::{Error, NifResult};

mod atoms {
    rustler::atoms! { ok, handler, reply }
}

/// Where an injected panic happens.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// In the FFI handler, on the plugin thread, at the session's next call.
    Handler,
    /// In the NIF that answers the session's next receiving call site
    /// (`callback_push`), on the calling process's scheduler thread.
    Reply,
}

/// The fault armed for one session, fired at most once.
pub struct Slot(Mutex<Option<Fault>>);

impl Slot {
    /// Takes the fault armed for `owner`'s next session, if any.
    pub fn armed_for(owner: LocalPid) -> Slot {
        let mut armed = armed().lock().unwrap_or_else(|e| e.into_inner());
        let fault = armed
            .iter()
            .position(|(pid, _)| *pid == owner)
            .map(|index| armed.swap_remove(index).1);
        Slot(Mutex::new(fault))
    }

    /// Panics if `fault` is the one armed here (and disarms it).
    pub fn fire(&self, fault: Fault, what: &str) {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if *slot == Some(fault) {
            *slot = None;
            drop(slot);
            panic!("injected panic in {what}");
        }
    }
}

/// Faults armed for the next session of each owner process.
fn armed() -> &'static Mutex<Vec<(LocalPid, Fault)>> {
    static ARMED: OnceLock<Mutex<Vec<(LocalPid, Fault)>>> = OnceLock::new();
    ARMED.get_or_init(Default::default)
}

/// Makes the next host-callback session that `owner` opens panic once:
///
/// * `:handler` - the FFI handler panics at the session's next call site
///   (the execution fails with the panic's message);
/// * `:reply` - `callback_push/2` panics when it answers the session's
///   next receiving call site (rustler raises `:nif_panicked` in the
///   caller, and the closed session fails the execution).
///
/// Arming again for the same owner adds another fault for its following
/// session.
#[rustler::nif]
fn callback_inject_panic(owner: LocalPid, at: Atom) -> NifResult<Atom> {
    let fault = if at == atoms::handler() {
        Fault::Handler
    } else if at == atoms::reply() {
        Fault::Reply
    } else {
        return Err(Error::argument(
            "the injected panic must be at :handler or :reply",
        ));
    };
    armed()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((owner, fault));
    Ok(atoms::ok())
}
