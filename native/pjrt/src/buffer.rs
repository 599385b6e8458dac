//! Device buffers: reading, copying, deleting.

use std::sync::Arc;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::ffi::{self, PJRT_Buffer};
use crate::plugin::{call, new_args};
use crate::types::Shape;

/// An owned `PJRT_Buffer`. Its shape and device are recorded when it is
/// made, so validating an argument costs no call into the plugin.
pub struct Buffer {
    client: Arc<Client>,
    raw: *mut PJRT_Buffer,
    shape: Shape,
    device: usize,
}

// SAFETY: PJRT buffers are thread-safe handles.
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

    /// Frees the device memory now. Returns false if it was already gone.
    pub fn delete(&self) -> Result<bool> {
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
        let event = self.ready_event()?;
        if event.is_ready()? {
            event.error()?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Blocks until the data is computed.
    pub fn wait(&self) -> Result<()> {
        self.ensure_live()?;
        self.ready_event()?.wait()
    }

    fn is_on_cpu(&self) -> Result<bool> {
        let mut args = new_args!(ffi::PJRT_Buffer_IsOnCpu_Args, is_on_cpu);
        args.buffer = self.raw;
        call!(self.client.plugin(), PJRT_Buffer_IsOnCpu, &mut args)?;
        Ok(args.is_on_cpu)
    }

    /// Copies the first `dst.len()` bytes of a ready buffer that lives in host
    /// memory, without a transfer. Returns false (copying nothing) when the
    /// buffer is not ready or not in host memory.
    pub fn try_copy_from_host_memory(&self, dst: &mut [u8]) -> Result<bool> {
        self.ensure_live()?;
        if !self.is_on_cpu()? || !self.is_ready()? {
            return Ok(false);
        }
        self.check_read_size(dst.len())?;
        let plugin = self.client.plugin();
        // An external reference keeps the memory alive, and stops donation,
        // while it is read even if another process deletes the buffer.
        let mut inc = new_args!(ffi::PJRT_Buffer_IncreaseExternalReferenceCount_Args, buffer);
        inc.buffer = self.raw;
        call!(plugin, PJRT_Buffer_IncreaseExternalReferenceCount, &mut inc)?;
        let mut ptr = new_args!(ffi::PJRT_Buffer_UnsafePointer_Args, buffer_pointer);
        ptr.buffer = self.raw;
        let copied = call!(plugin, PJRT_Buffer_UnsafePointer, &mut ptr).map(|_| {
            if !dst.is_empty() && ptr.buffer_pointer != 0 {
                // SAFETY: the buffer holds byte_size >= dst.len() bytes at this
                // address, kept alive by the external reference.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        ptr.buffer_pointer as *const u8,
                        dst.as_mut_ptr(),
                        dst.len(),
                    )
                }
            }
        });
        let mut dec = new_args!(ffi::PJRT_Buffer_DecreaseExternalReferenceCount_Args, buffer);
        dec.buffer = self.raw;
        call!(plugin, PJRT_Buffer_DecreaseExternalReferenceCount, &mut dec)?;
        copied.map(|_| true)
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
        call!(self.client.plugin(), PJRT_Buffer_ToHostBuffer, &mut args)?;
        match Event::from_raw(self.client.plugin(), args.event) {
            Some(event) => event.wait(),
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
        call!(self.client.plugin(), PJRT_Buffer_CopyToDevice, &mut args)?;
        Ok(Buffer::from_raw(
            &self.client,
            args.dst_buffer,
            self.shape.clone(),
            device,
        ))
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
