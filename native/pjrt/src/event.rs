//! Events: completion of transfers and executions.

use std::sync::Arc;

use crate::error::Result;
use crate::ffi::{self, PJRT_Event};
use crate::plugin::{call, new_args, Plugin};

/// An owned `PJRT_Event`, destroyed exactly once on drop.
pub struct Event {
    plugin: Arc<Plugin>,
    raw: *mut PJRT_Event,
}

// SAFETY: PJRT events may be awaited and destroyed from any thread.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    /// Takes ownership of `raw`; `None` when the plugin returned no event.
    pub(crate) fn from_raw(plugin: &Arc<Plugin>, raw: *mut PJRT_Event) -> Option<Event> {
        (!raw.is_null()).then(|| Event {
            plugin: plugin.clone(),
            raw,
        })
    }

    /// Whether the event has completed (successfully or not), without blocking.
    pub fn is_ready(&self) -> Result<bool> {
        let mut args = new_args!(ffi::PJRT_Event_IsReady_Args, is_ready);
        args.event = self.raw;
        call!(self.plugin, PJRT_Event_IsReady, &mut args)?;
        Ok(args.is_ready)
    }

    /// Blocks until the event completes and returns its error, if any.
    pub fn wait(&self) -> Result<()> {
        let mut args = new_args!(ffi::PJRT_Event_Await_Args, event);
        args.event = self.raw;
        call!(self.plugin, PJRT_Event_Await, &mut args)
    }

    /// The error of a completed event (the event must be ready).
    pub fn error(&self) -> Result<()> {
        let mut args = new_args!(ffi::PJRT_Event_Error_Args, event);
        args.event = self.raw;
        call!(self.plugin, PJRT_Event_Error, &mut args)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let mut args = new_args!(ffi::PJRT_Event_Destroy_Args, event);
        args.event = self.raw;
        // A failure to destroy leaves nothing to recover; never panic in drop.
        let _ = (|| -> Result<()> { call!(self.plugin, PJRT_Event_Destroy, &mut args) })();
    }
}
