//! Device buffers: transfers in and out, copies, deletion.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustler::{Atom, Binary, Env, OwnedBinary, ResourceArc};

use crate::client::ClientResource;
use crate::error::{Error, NifResult};
use crate::memory::{Entry, Ledger};
use crate::pool::{OffThread, SlowToDrop};

/// A buffer and its entry in its client's memory ledger. Large buffers are
/// destroyed on the drop thread (see `pool::OffThread`).
pub struct BufferResource {
    pub handle: OffThread<pjrt::Buffer>,
    memory: Entry,
    /// What lives until the buffer's memory is freed: the shared memory
    /// objects exported from it (`ipc`), unlinked when dropped.
    attached: Mutex<Vec<Box<dyn Send>>>,
    /// A view of memory the process may only read: never donated.
    pub read_only: bool,
}

/// Buffers from this size on are destroyed on the drop thread. Freeing a
/// block the C heap mapped (above 32 MiB on the host) unmaps it: about
/// 50 µs per MiB. Smaller ones free in about a microsecond. The size is
/// `EXLA.Placement`'s, which also sends the deletion of such buffers to a
/// dirty scheduler: the NIF gets it when it loads (`set_large_bytes`).
static LARGE_BYTES: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Sets the size from which buffers are large (see `LARGE_BYTES`).
pub fn set_large_bytes(bytes: usize) {
    LARGE_BYTES.store(bytes, Ordering::Relaxed);
}

impl SlowToDrop for pjrt::Buffer {
    fn slow_to_drop(&self) -> bool {
        self.shape()
            .byte_size()
            .is_ok_and(|size| size >= LARGE_BYTES.load(Ordering::Relaxed))
    }
}

#[rustler::resource_impl]
impl rustler::Resource for BufferResource {}

impl BufferResource {
    /// Wraps a buffer just made, counting its bytes in `ledger`.
    pub fn new(buffer: pjrt::Buffer, ledger: &Arc<Ledger>) -> ResourceArc<BufferResource> {
        Self::new_view(buffer, ledger, false)
    }

    /// `new`, for a buffer that may be a view of memory it must not write.
    pub fn new_view(
        buffer: pjrt::Buffer,
        ledger: &Arc<Ledger>,
        read_only: bool,
    ) -> ResourceArc<BufferResource> {
        // Checked when the shape was made, so it cannot overflow here.
        let bytes = buffer.shape().byte_size().unwrap_or(0) as u64;
        let entry = ledger.entry(buffer.device(), bytes);
        ResourceArc::new(BufferResource {
            handle: OffThread::new(buffer),
            memory: entry,
            attached: Mutex::new(Vec::new()),
            read_only,
        })
    }

    /// Keeps `value` (a shared memory object exported from this buffer)
    /// until the buffer is freed; drops it at once if the buffer is freed
    /// already.
    pub fn keep_until_freed(&self, value: Box<dyn Send>) -> NifResult<()> {
        let mut attached = self.attached.lock().unwrap_or_else(|e| e.into_inner());
        // Under the lock, so a concurrent `give_up` either sees this value
        // or has already made the buffer read as deleted.
        self.handle.ensure_live()?;
        attached.push(value);
        Ok(())
    }

    fn drop_attached(&self) {
        self.attached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Frees the device memory now (unless it is gone already) and stops
    /// counting it. Returns whether this call freed it. Waits while a
    /// launch on several devices is taking the buffer.
    pub fn give_up(&self) -> NifResult<bool> {
        let deleted = self.handle.delete()?;
        self.memory.release();
        self.drop_attached();
        Ok(deleted)
    }

    /// `give_up`, or `None` without waiting when a launch on several
    /// devices is taking the buffer.
    fn try_give_up(&self) -> NifResult<Option<bool>> {
        let deleted = self.handle.try_delete()?;
        if deleted.is_some() {
            self.memory.release();
            self.drop_attached();
        }
        Ok(deleted)
    }
}

mod atoms {
    rustler::atoms! { ok, already_deallocated, busy }
}

pub fn shape(type_code: i32, dims: Vec<i64>) -> NifResult<pjrt::Shape> {
    Ok(pjrt::Shape::new(
        pjrt::ElementType::from_code(type_code)?,
        dims,
    )?)
}

scheduler_variants! {
    /// For small binaries: the copy is short enough for a normal scheduler.
    fn buffer_from_binary;
    /// For larger ones, which copy at page-fault speed.
    dirty "DirtyIo" fn buffer_from_binary_dirty(
        client: ResourceArc<ClientResource>,
        data: Binary,
        type_code: i32,
        dims: Vec<i64>,
        device: usize,
    ) -> NifResult<ResourceArc<BufferResource>> {
        let shape = shape(type_code, dims)?;
        let buffer = client
            .handle
            .buffer_from_host(data.as_slice(), &shape, device)?;
        Ok(BufferResource::new(buffer, &client.ledger))
    }
}

fn read_size(buffer: &pjrt::Buffer, limit: i64) -> NifResult<usize> {
    let full = buffer.shape().byte_size()?;
    Ok(match usize::try_from(limit) {
        Ok(limit) => limit.min(full),
        Err(_) => full,
    })
}

fn new_binary(size: usize) -> NifResult<OwnedBinary> {
    OwnedBinary::new(size)
        .ok_or_else(|| Error::argument(format!("could not allocate {size} bytes")))
}

/// Reads without blocking: returns `nil` when the data is not ready or not
/// in host memory. Runs on a normal scheduler: EXLA calls it only for reads
/// small enough to copy there (see `EXLA.Placement`).
#[rustler::nif]
fn buffer_read<'a>(
    env: Env<'a>,
    buffer: ResourceArc<BufferResource>,
    limit: i64,
) -> NifResult<Option<Binary<'a>>> {
    let size = read_size(&buffer.handle, limit)?;
    let mut out = new_binary(size)?;
    if buffer
        .handle
        .try_copy_from_host_memory(out.as_mut_slice())?
    {
        Ok(Some(out.release(env)))
    } else {
        Ok(None)
    }
}

/// Reads, waiting for the data to be computed.
#[rustler::nif(schedule = "DirtyIo")]
fn buffer_read_dirty<'a>(
    env: Env<'a>,
    buffer: ResourceArc<BufferResource>,
    limit: i64,
) -> NifResult<Binary<'a>> {
    let size = read_size(&buffer.handle, limit)?;
    buffer.handle.wait()?;
    let mut out = new_binary(size)?;
    buffer.handle.copy_to_host(out.as_mut_slice())?;
    Ok(out.release(env))
}

/// The address of the buffer's data in host memory (waiting for it to be
/// computed), or `nil` for a buffer on a device.
#[rustler::nif(schedule = "DirtyIo")]
fn buffer_host_address(buffer: ResourceArc<BufferResource>) -> NifResult<Option<u64>> {
    Ok(buffer.handle.host_address()?.map(|address| address as u64))
}

/// A new buffer with a copy of the `shape`'s bytes at `address` in this
/// process's memory (`Nx.from_pointer/5`), which the caller vouches for.
#[rustler::nif(schedule = "DirtyIo")]
fn buffer_from_address(
    client: ResourceArc<ClientResource>,
    address: u64,
    type_code: i32,
    dims: Vec<i64>,
    device: usize,
) -> NifResult<ResourceArc<BufferResource>> {
    let shape = shape(type_code, dims)?;
    let size = shape.byte_size()?;
    if address == 0 && size > 0 {
        return Err(Error::argument("the pointer's address is null"));
    }
    // SAFETY: the caller (Nx.from_pointer/5) gives the address of `size`
    // readable bytes of this process, alive for this copy.
    let data = if size == 0 {
        &[][..]
    } else {
        unsafe { std::slice::from_raw_parts(address as usize as *const u8, size) }
    };
    let buffer = client.handle.buffer_from_host(data, &shape, device)?;
    Ok(BufferResource::new(buffer, &client.ledger))
}

fn deleted(freed: bool) -> Atom {
    if freed {
        atoms::ok()
    } else {
        atoms::already_deallocated()
    }
}

/// Returns `busy` instead of waiting while a launch on several devices is
/// taking the buffer; Elixir then calls `buffer_delete_dirty`, which waits.
#[rustler::nif]
fn buffer_delete(buffer: ResourceArc<BufferResource>) -> NifResult<Atom> {
    Ok(buffer.try_give_up()?.map_or_else(atoms::busy, deleted))
}

/// Deleting frees the memory at once: for large buffers, on a dirty
/// scheduler (12 ms for 256 MiB on the host).
#[rustler::nif(schedule = "DirtyIo")]
fn buffer_delete_dirty(buffer: ResourceArc<BufferResource>) -> NifResult<Atom> {
    Ok(deleted(buffer.give_up()?))
}

/// Whether the data is computed; raises the computation's error if it failed.
#[rustler::nif]
fn buffer_ready(buffer: ResourceArc<BufferResource>) -> NifResult<bool> {
    // No liveness check first: the ready event of a deleted buffer carries
    // that error, which `is_ready` reports as a deleted buffer.
    Ok(buffer.handle.is_ready()?)
}

#[rustler::nif(schedule = "DirtyIo")]
fn buffer_await(buffers: Vec<ResourceArc<BufferResource>>) -> NifResult<Atom> {
    for buffer in &buffers {
        buffer.handle.wait()?;
    }
    Ok(atoms::ok())
}

#[rustler::nif(schedule = "DirtyIo")]
fn buffer_copy_to_device(
    buffer: ResourceArc<BufferResource>,
    device: usize,
) -> NifResult<ResourceArc<BufferResource>> {
    let copy = buffer.handle.copy_to_device(device)?;
    Ok(BufferResource::new(copy, buffer.memory.ledger()))
}
