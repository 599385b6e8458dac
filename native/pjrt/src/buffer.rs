//! Device buffers: reading, copying, deleting.

use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use crate::client::Client;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::ffi::{self, PJRT_Buffer};
use crate::plugin::{call, new_args};
use crate::types::Shape;

/// An owned `PJRT_Buffer`. Its shape and device are recorded when it is
/// made, so validating an argument costs no call into the plugin.
///
/// Any number of threads may use one buffer at once: reading, copying,
/// executing with it and deleting it are thread-safe in the plugins, except
/// for the external reference count (the C API keeps the references in an
/// unsynchronized vector), whose calls are serialized by `references`.
///
/// `holds` keeps deletion out of two places where the plugin does not
/// bear it. A launch on several devices holds it for reading from its
/// liveness check of the arguments until the plugin has taken them (an
/// argument deleted in between would start the other devices' parts,
/// which then wait for the missing one in their collectives until XLA
/// aborts the process), and so does an external reference, from its
/// liveness check until it is released (the plugin takes one on a deleted
/// buffer by reading freed memory: a segfault). Deletion, and a run
/// donating the buffer, hold it for writing.
pub struct Buffer {
    client: Arc<Client>,
    raw: *mut PJRT_Buffer,
    shape: Shape,
    device: usize,
    references: Mutex<()>,
    holds: RwLock<()>,
}

// SAFETY: PJRT buffers are thread-safe handles, apart from the external
// reference calls, which hold `references`.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    pub(crate) fn from_raw(
        client: &Arc<Client>,
        raw: *mut PJRT_Buffer,
        shape: Shape,
        device: usize,
    ) -> Buffer {
        Buffer {
            client: client.clone(),
            raw,
            shape,
            device,
            references: Mutex::new(()),
            holds: RwLock::new(()),
        }
    }

    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    pub(crate) fn raw(&self) -> *mut PJRT_Buffer {
        self.raw
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Index of the device in the client's addressable devices.
    pub fn device(&self) -> usize {
        self.device
    }

    pub fn is_deleted(&self) -> Result<bool> {
        let mut args = new_args!(ffi::PJRT_Buffer_IsDeleted_Args, is_deleted);
        args.buffer = self.raw;
        call!(self.client.plugin(), PJRT_Buffer_IsDeleted, &mut args)?;
        Ok(args.is_deleted)
    }

    /// Fails with `DeletedBuffer` if the buffer was deleted or donated.
    pub fn ensure_live(&self) -> Result<()> {
        if self.is_deleted()? {
            Err(Error::DeletedBuffer)
        } else {
            Ok(())
        }
    }

    /// The error to report for `error`, a failure of a call that used the
    /// buffer (see `explain`).
    pub(crate) fn explain(&self, error: Error) -> Error {
        explain(error, [self])
    }

    /// Frees the device memory now. Returns false if it was already gone.
    /// Waits for a launch on several devices that is taking the buffer,
    /// and for reads under way (see `holds`).
    pub fn delete(&self) -> Result<bool> {
        let _exclusive = self.holds.write().unwrap_or_else(|e| e.into_inner());
        self.delete_now()
    }

    /// `delete`, or `None` without waiting when a launch on several devices
    /// is taking the buffer or a read is under way.
    pub fn try_delete(&self) -> Result<Option<bool>> {
        match self.try_hold_exclusive() {
            Some(_exclusive) => self.delete_now().map(Some),
            None => Ok(None),
        }
    }

    /// Holds off deletion until the guard is dropped.
    pub(crate) fn hold_shared(&self) -> RwLockReadGuard<'_, ()> {
        self.holds.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds off launches on several devices and reads, as deletion does (a
    /// run that donates the buffer, which the plugin deletes, holds it so);
    /// `None` without waiting when one of those is under way.
    pub(crate) fn try_hold_exclusive(&self) -> Option<RwLockWriteGuard<'_, ()>> {
        match self.holds.try_write() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    fn delete_now(&self) -> Result<bool> {
        if self.is_deleted()? {
            return Ok(false);
        }
        let mut args = new_args!(ffi::PJRT_Buffer_Delete_Args, buffer);
        args.buffer = self.raw;
        call!(self.client.plugin(), PJRT_Buffer_Delete, &mut args)?;
        Ok(true)
    }

    fn ready_event(&self) -> Result<Event> {
        let mut args = new_args!(ffi::PJRT_Buffer_ReadyEvent_Args, event);
        args.buffer = self.raw;
        call!(self.client.plugin(), PJRT_Buffer_ReadyEvent, &mut args)?;
        Event::from_raw(self.client.plugin(), args.event)
            .ok_or_else(|| Error::invalid("the plugin returned no ready event"))
    }

    /// Whether the buffer's data is computed (errors of the computation
    /// that produces it are returned here).
    pub fn is_ready(&self) -> Result<bool> {
        let ready = || {
            let event = self.ready_event()?;
            if event.is_ready()? {
                event.error()?;
                Ok(true)
            } else {
                Ok(false)
            }
        };
        ready().map_err(|e| self.explain(e))
    }

    /// Blocks until the data is computed. No liveness check first: the
    /// ready event of a deleted buffer carries that error, which `explain`
    /// reports as `DeletedBuffer`.
    pub fn wait(&self) -> Result<()> {
        self.ready_event()
            .and_then(|event| event.wait())
            .map_err(|e| self.explain(e))
    }

    fn is_on_cpu(&self) -> Result<bool> {
        let mut args = new_args!(ffi::PJRT_Buffer_IsOnCpu_Args, is_on_cpu);
        args.buffer = self.raw;
        call!(self.client.plugin(), PJRT_Buffer_IsOnCpu, &mut args)?;
        Ok(args.is_on_cpu)
    }

    /// The address of the data of a buffer that lives in host memory, once
    /// it is computed, or `None` for a buffer on a device. The address is
    /// valid while the buffer is neither deleted nor donated.
    pub fn host_address(&self) -> Result<Option<usize>> {
        self.ensure_live()?;
        self.wait()?;
        if !self.is_on_cpu()? {
            return Ok(None);
        }
        self.unsafe_pointer().map(Some)
    }

    /// The address of the buffer's storage (for a buffer in host memory).
    fn unsafe_pointer(&self) -> Result<usize> {
        let mut args = new_args!(ffi::PJRT_Buffer_UnsafePointer_Args, buffer_pointer);
        args.buffer = self.raw;
        call!(self.client.plugin(), PJRT_Buffer_UnsafePointer, &mut args)
            .map_err(|e| self.explain(e))?;
        Ok(args.buffer_pointer)
    }

    /// The bytes the buffer's storage takes on its device. Plugins may lay
    /// data out otherwise than on the host: XLA packs sub-byte types (two
    /// s4 or four s2 per byte), which take a byte each on the host.
    pub fn on_device_size(&self) -> Result<usize> {
        let mut args = new_args!(
            ffi::PJRT_Buffer_OnDeviceSizeInBytes_Args,
            on_device_size_in_bytes
        );
        args.buffer = self.raw;
        call!(
            self.client.plugin(),
            PJRT_Buffer_OnDeviceSizeInBytes,
            &mut args
        )
        .map_err(|e| self.explain(e))?;
        Ok(args.on_device_size_in_bytes)
    }

    /// Copies the first `dst.len()` bytes of a ready buffer that lives in host
    /// memory, without a transfer: the bytes `copy_to_host` gives. Returns
    /// false (copying nothing) when the buffer is not ready, not in host
    /// memory, or stored otherwise than on the host (its storage is not the
    /// size of the host's, as for sub-byte types the plugin packs).
    pub fn try_copy_from_host_memory(&self, dst: &mut [u8]) -> Result<bool> {
        // Deletion and donation wait from the liveness check until the
        // external reference is released (see `holds`); the reference keeps
        // the memory alive while it is read.
        let hold = self.hold_shared();
        self.ensure_live()?;
        if !self.is_on_cpu()? || !self.is_ready()? {
            return Ok(false);
        }
        self.check_read_size(dst.len())?;
        // Only sub-byte types are stored otherwise than on the host; asking
        // for every read would add a plugin call to the smallest reads.
        if self.shape.element_type.sub_byte() && self.on_device_size()? != self.shape.byte_size()? {
            return Ok(false);
        }
        let _reference = self.external_reference(hold)?;
        let address = self.unsafe_pointer()?;
        if !dst.is_empty() && address != 0 {
            // SAFETY: the buffer's storage is byte_size >= dst.len() bytes at
            // this address, kept alive by the external reference.
            unsafe {
                std::ptr::copy_nonoverlapping(address as *const u8, dst.as_mut_ptr(), dst.len())
            }
        }
        Ok(true)
    }

    /// Takes an external reference, released when the guard is dropped,
    /// on a buffer found live under `hold`, which the guard keeps.
    fn external_reference<'a>(
        &'a self,
        hold: RwLockReadGuard<'a, ()>,
    ) -> Result<ExternalReference<'a>> {
        let mut inc = new_args!(ffi::PJRT_Buffer_IncreaseExternalReferenceCount_Args, buffer);
        inc.buffer = self.raw;
        {
            let _serial = self.references.lock().unwrap_or_else(|e| e.into_inner());
            call!(
                self.client.plugin(),
                PJRT_Buffer_IncreaseExternalReferenceCount,
                &mut inc
            )
        }
        .map_err(|e| self.explain(e))?;
        Ok(ExternalReference {
            buffer: self,
            _hold: hold,
        })
    }

    /// Copies the first `dst.len()` bytes to the host, blocking until done.
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        if self.try_copy_from_host_memory(dst)? {
            return Ok(());
        }
        self.check_read_size(dst.len())?;
        let full = self.shape.byte_size()?;
        if dst.len() == full {
            return self.transfer_to_host(dst);
        }
        // ToHostBuffer always writes the whole buffer.
        let mut whole = vec![0u8; full];
        self.transfer_to_host(&mut whole)?;
        dst.copy_from_slice(&whole[..dst.len()]);
        Ok(())
    }

    fn transfer_to_host(&self, dst: &mut [u8]) -> Result<()> {
        let mut args = new_args!(ffi::PJRT_Buffer_ToHostBuffer_Args, event);
        args.src = self.raw;
        args.dst = dst.as_mut_ptr().cast();
        args.dst_size = dst.len();
        call!(self.client.plugin(), PJRT_Buffer_ToHostBuffer, &mut args)
            .map_err(|e| self.explain(e))?;
        match Event::from_raw(self.client.plugin(), args.event) {
            Some(event) => event.wait().map_err(|e| self.explain(e)),
            None => Ok(()),
        }
    }

    fn check_read_size(&self, size: usize) -> Result<()> {
        let full = self.shape.byte_size()?;
        if size > full {
            return Err(Error::invalid(format!(
                "cannot read {size} bytes from a buffer of {full} bytes"
            )));
        }
        Ok(())
    }

    /// Copies the buffer to another device of the same client.
    pub fn copy_to_device(&self, device: usize) -> Result<Buffer> {
        self.ensure_live()?;
        let mut args = new_args!(ffi::PJRT_Buffer_CopyToDevice_Args, dst_buffer);
        args.buffer = self.raw;
        args.dst_device = self.client.device_raw(device)?;
        call!(self.client.plugin(), PJRT_Buffer_CopyToDevice, &mut args)
            .map_err(|e| self.explain(e))?;
        Ok(Buffer::from_raw(
            &self.client,
            args.dst_buffer,
            self.shape.clone(),
            device,
        ))
    }
}

/// The error to report for `error`, a failure of a call that used
/// `buffers`: `DeletedBuffer` when one of them was deleted (by another
/// thread, or donated by an execution), whatever the plugin said.
pub(crate) fn explain<'a>(error: Error, buffers: impl IntoIterator<Item = &'a Buffer>) -> Error {
    if buffers.into_iter().any(|b| b.is_deleted() == Ok(true)) {
        Error::DeletedBuffer
    } else {
        error
    }
}

/// An external reference on a buffer, released on drop.
struct ExternalReference<'a> {
    buffer: &'a Buffer,
    /// Released after the reference (fields drop after `drop`).
    _hold: RwLockReadGuard<'a, ()>,
}

impl Drop for ExternalReference<'_> {
    fn drop(&mut self) {
        let buffer = self.buffer;
        let mut dec = new_args!(ffi::PJRT_Buffer_DecreaseExternalReferenceCount_Args, buffer);
        dec.buffer = buffer.raw;
        let _serial = buffer.references.lock().unwrap_or_else(|e| e.into_inner());
        // Cannot fail: this guard holds a reference.
        let _ = (|| -> Result<()> {
            call!(
                buffer.client.plugin(),
                PJRT_Buffer_DecreaseExternalReferenceCount,
                &mut dec
            )
        })();
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut args = new_args!(ffi::PJRT_Buffer_Destroy_Args, buffer);
        args.buffer = self.raw;
        let _ =
            (|| -> Result<()> { call!(self.client.plugin(), PJRT_Buffer_Destroy, &mut args) })();
    }
}
