//! Host IPC pointers (`Nx.to_pointer(t, mode: :ipc)`): a tensor in host
//! memory shared with other OS processes through a POSIX shared memory
//! object, named by the pointer's handle.
//!
//! Exporting copies the buffer into a new object, which lives until the
//! exporting buffer is freed (deallocated, donated or collected) or the
//! process exits: then its name goes away, and the memory with the last
//! mapping of it. A crashed process leaves its objects behind. Importing
//! maps the object and makes a buffer that is a view of those pages, not a
//! copy: writes through one importer's mapping show through every other's.
//!
//! On Linux a shared memory object is a file in `/dev/shm` (what the C
//! library's `shm_open` opens), so std's files do the opening, sizing,
//! permissions and unlinking; only `mmap` is declared here. Other systems
//! get an error naming what they lack.

use std::ffi::{c_int, c_void};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};

use rustler::ResourceArc;

use crate::buffer::{shape, BufferResource};
use crate::client::ClientResource;
use crate::error::{Error, NifResult};

/// Where the C library keeps shared memory objects, or why there is none.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn shm_dir() -> NifResult<PathBuf> {
    Ok(PathBuf::from("/dev/shm"))
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn shm_dir() -> NifResult<PathBuf> {
    Err(Error::argument(format!(
        "host IPC pointers (mode: :ipc) need POSIX shared memory in /dev/shm, \
         which EXLA supports on 64-bit Linux only, not on {}",
        std::env::consts::OS
    )))
}

/// The path of the object named `handle`; a name is one path component,
/// with or without the leading slash `shm_open` takes (Python's
/// `multiprocessing.shared_memory` names have one).
fn object_path(handle: &str) -> NifResult<PathBuf> {
    let handle = handle.strip_prefix('/').unwrap_or(handle);
    let bad = handle.is_empty()
        || handle == "."
        || handle == ".."
        || handle.contains(['/', '\0'])
        || handle.len() > 255;
    if bad {
        return Err(Error::argument(format!(
            "invalid IPC handle {handle:?}: expected the name of a shared memory object"
        )));
    }
    Ok(shm_dir()?.join(handle))
}

/// An object this process exported, unlinked when dropped, or when the
/// process exits first (the VM does not free resources when it halts).
struct Export {
    path: PathBuf,
}

/// The objects of live exports, for `unlink_at_exit`.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

extern "C" {
    // Registered by a shared library, it runs at exit or when the library
    // is unloaded, whichever comes first.
    fn atexit(f: extern "C" fn()) -> c_int;
}

extern "C" fn unlink_at_exit() {
    // A thread that held the lock at exit may have left it poisoned or
    // held: the objects then stay, as after a crash.
    if let Ok(live) = LIVE.try_lock() {
        for path in live.iter() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Export {
    fn new(path: PathBuf) -> Export {
        static AT_EXIT: Once = Once::new();
        // SAFETY: registers a function of this library, which never panics.
        AT_EXIT.call_once(|| unsafe {
            atexit(unlink_at_exit);
        });
        live().push(path.clone());
        Export { path }
    }
}

fn live() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Export {
    fn drop(&mut self) {
        live().retain(|path| path != &self.path);
        // Already gone if someone removed it by hand: nothing to undo.
        let _ = std::fs::remove_file(&self.path);
    }
}

const PROT_READ: c_int = 1;
const PROT_WRITE: c_int = 2;
const MAP_SHARED: c_int = 1;

extern "C" {
    fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        offset: i64,
    ) -> *mut c_void;
    fn munmap(addr: *mut c_void, len: usize) -> c_int;
}

/// A shared mapping of a whole object, unmapped when dropped.
struct Mapping {
    address: usize,
    len: usize,
}

impl Mapping {
    fn new(file: &File, len: usize, writable: bool) -> NifResult<Mapping> {
        use std::os::fd::AsRawFd;
        let prot = if writable {
            PROT_READ | PROT_WRITE
        } else {
            PROT_READ
        };
        // SAFETY: a fresh mapping of `len` (> 0) bytes of an open file; the
        // kernel picks the address. The file may be closed afterwards.
        let address = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                prot,
                MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if address as isize == -1 {
            let reason = std::io::Error::last_os_error();
            return Err(Error::argument(format!(
                "could not map the shared memory: {reason}"
            )));
        }
        Ok(Mapping {
            address: address as usize,
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once, here.
        unsafe { munmap(self.address as *mut c_void, self.len) };
    }
}

static EXPORTS: AtomicU64 = AtomicU64::new(0);

/// Copies a buffer in host memory into a new shared memory object with
/// the given permission bits, which it keeps until the buffer is freed.
/// Returns the object's name and size. The object holds the host's layout
/// (`copy_to_host`): sub-byte types take a byte per element.
#[rustler::nif(schedule = "DirtyIo")]
fn buffer_export_ipc(
    buffer: ResourceArc<BufferResource>,
    permissions: u32,
) -> NifResult<(String, u64)> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if buffer.handle.host_address()?.is_none() {
        return Err(Error::argument(
            "host IPC pointers (mode: :ipc) need a buffer in host memory",
        ));
    }
    let size = buffer.handle.shape().byte_size()?;
    let count = EXPORTS.fetch_add(1, Ordering::Relaxed);
    let name = format!("exla:ipc:{}:{count}", std::process::id());
    let path = object_path(&name)?;
    let io = |what: &str, e: std::io::Error| {
        Error::argument(format!("could not {what} the shared memory {name:?}: {e}"))
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| io("create", e))?;
    let export = Export::new(path);
    file.set_len(size as u64).map_err(|e| io("size", e))?;
    if size > 0 {
        let mapping = Mapping::new(&file, size, true)?;
        // SAFETY: the mapping is `size` writable bytes, alive for this copy.
        let target = unsafe { std::slice::from_raw_parts_mut(mapping.address as *mut u8, size) };
        buffer.handle.copy_to_host(target)?;
    }
    // Set after the copy, and exactly: the mode given to open is masked by
    // the umask, and a read-only mode would refuse our own writes.
    file.set_permissions(std::fs::Permissions::from_mode(permissions))
        .map_err(|e| io("set the permissions of", e))?;
    buffer.keep_until_freed(Box::new(export))?;
    Ok((name, size as u64))
}

/// A buffer that is a view of the shared memory object `handle`, mapped
/// writable where its permissions let this process write, else read-only;
/// a copy of it where the plugin stores the type otherwise than the host.
#[rustler::nif(schedule = "DirtyIo")]
fn buffer_import_ipc(
    client: ResourceArc<ClientResource>,
    handle: String,
    type_code: i32,
    dims: Vec<i64>,
    device: usize,
) -> NifResult<ResourceArc<BufferResource>> {
    let shape = shape(type_code, dims)?;
    let size = shape.byte_size()?;
    let path = object_path(&handle)?;
    let open = |write: bool| File::options().read(true).write(write).open(&path);
    let (file, writable) = match open(true) {
        Ok(file) => (file, true),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            (open(false).map_err(|e| open_error(&handle, e))?, false)
        }
        Err(e) => return Err(open_error(&handle, e)),
    };
    let found = file.metadata().map_err(|e| open_error(&handle, e))?.len();
    if found != size as u64 {
        return Err(Error::argument(format!(
            "the IPC handle {handle:?} holds {found} bytes, but the tensor takes {size}"
        )));
    }
    let (buffer, read_only) = if size == 0 {
        (client.handle.buffer_from_host(&[], &shape, device)?, false)
    } else {
        let mapping = Mapping::new(&file, size, writable)?;
        let data = mapping.address as *mut u8;
        // SAFETY: the mapping holds `size` bytes, page-aligned, and lives
        // until the plugin calls `on_delete`, which unmaps it.
        let view = unsafe {
            client
                .handle
                .view_of_memory(data, &shape, device, Box::new(move || drop(mapping)))?
        };
        if view.on_device_size()? == size {
            (view, !writable)
        } else {
            // The object holds the host's layout (sub-byte types one per
            // byte, see `buffer_export_ipc`), which the plugin stores
            // otherwise (packed): a copy, made while the view keeps the
            // mapping.
            // SAFETY: the mapping holds `size` bytes, alive with `view`.
            let bytes = unsafe { std::slice::from_raw_parts(data, size) };
            (
                client.handle.buffer_from_host(bytes, &shape, device)?,
                false,
            )
        }
    };
    Ok(BufferResource::new_view(buffer, &client.ledger, read_only))
}

fn open_error(handle: &str, e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::NotFound => Error::argument(format!(
            "no shared memory object for the IPC handle {handle:?}: it was never exported \
             or its tensor has been freed"
        )),
        _ => Error::argument(format!("could not open the IPC handle {handle:?}: {e}")),
    }
}
