//! The few CUDA driver calls host callbacks need on a CUDA plugin.
//!
//! On the GPU, the buffers XLA hands an FFI handler live in device memory
//! and the kernels that produce the operands (and consume the results) are
//! queued, asynchronously, on the call's CUDA stream; the handler itself
//! runs on a host thread. So a host callback copies its operands to host
//! memory on that stream, waits for the stream, calls the callback, copies
//! the results back on the stream and waits again (see
//! `host_callback::run_cuda`).
//!
//! The driver (`libcuda.so.1`) comes with the NVIDIA driver, never with this
//! crate, and it is already loaded by the CUDA plugin when a handler runs:
//! it is opened here at run time with `libloading`, so nothing links
//! against CUDA and hosts without it are unaffected until a CUDA plugin is
//! used. Only the driver API is used (not the runtime's `cudaMemcpyAsync`),
//! because the driver is the one library every CUDA installation has.
//!
//! Signatures follow `cuda.h` of the CUDA driver API: `CUresult` is an int
//! enum (0 is `CUDA_SUCCESS`), `CUdeviceptr` is `unsigned long long` on
//! 64-bit hosts, `CUstream` and `CUcontext` are opaque pointers. XLA's FFI
//! stream for the CUDA platform is a `CUstream` (`XLA_FFI_Stream_Get` in
//! xla/ffi/api/c_api.h: "for CUDA platform it returns `CUstream` (same as
//! `cudaStream`)").

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// The driver library's name, as the NVIDIA driver installs it.
pub(crate) const DRIVER_LIBRARY: &str = "libcuda.so.1";

type CUresult = c_int;
pub(crate) type CUstream = *mut c_void;
type CUcontext = *mut c_void;
pub(crate) type CUdeviceptr = u64;

const CUDA_SUCCESS: CUresult = 0;

type MemcpyDtoHAsync = unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize, CUstream) -> CUresult;
type MemcpyHtoDAsync =
    unsafe extern "C" fn(CUdeviceptr, *const c_void, usize, CUstream) -> CUresult;
type StreamSynchronize = unsafe extern "C" fn(CUstream) -> CUresult;
type StreamGetCtx = unsafe extern "C" fn(CUstream, *mut CUcontext) -> CUresult;
type CtxGetCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
type CtxPushCurrent = unsafe extern "C" fn(CUcontext) -> CUresult;
type CtxPopCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
type GetErrorName = unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult;

/// The driver functions used, resolved once.
pub(crate) struct Driver {
    // Kept open for the life of the process: the function pointers below
    // point into it.
    _library: libloading::Library,
    memcpy_dtoh_async: MemcpyDtoHAsync,
    memcpy_htod_async: MemcpyHtoDAsync,
    stream_synchronize: StreamSynchronize,
    stream_get_ctx: StreamGetCtx,
    ctx_get_current: CtxGetCurrent,
    ctx_push_current: CtxPushCurrent,
    ctx_pop_current: CtxPopCurrent,
    get_error_name: Option<GetErrorName>,
}

/// The process's CUDA driver, loaded on first use; the error says why it
/// could not be (kept, so that every later call fails the same way).
pub(crate) fn driver() -> Result<&'static Driver, String> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| Driver::load(DRIVER_LIBRARY))
        .as_ref()
        .map_err(Clone::clone)
}

impl Driver {
    /// Opens `library` and resolves the functions used.
    pub(crate) fn load(library: &str) -> Result<Driver, String> {
        // SAFETY: opening the NVIDIA driver runs no initialisers with
        // preconditions; on a CUDA host the plugin has already opened it.
        let lib = unsafe { libloading::Library::new(library) }.map_err(|e| {
            format!(
                "host callbacks on CUDA need the CUDA driver library {library}, \
                 which could not be loaded: {e}"
            )
        })?;
        // The `_v2` names are the ones cuda.h maps the plain names to since
        // CUDA 3.2 (64-bit device pointers); the others have one version.
        // SAFETY: each symbol is looked up with the type cuda.h declares.
        unsafe {
            Ok(Driver {
                memcpy_dtoh_async: symbol(&lib, library, "cuMemcpyDtoHAsync_v2")?,
                memcpy_htod_async: symbol(&lib, library, "cuMemcpyHtoDAsync_v2")?,
                stream_synchronize: symbol(&lib, library, "cuStreamSynchronize")?,
                stream_get_ctx: symbol(&lib, library, "cuStreamGetCtx")?,
                ctx_get_current: symbol(&lib, library, "cuCtxGetCurrent")?,
                ctx_push_current: symbol(&lib, library, "cuCtxPushCurrent_v2")?,
                ctx_pop_current: symbol(&lib, library, "cuCtxPopCurrent_v2")?,
                get_error_name: symbol(&lib, library, "cuGetErrorName").ok(),
                _library: lib,
            })
        }
    }

    /// `Err` with the driver's name of a failed `result` of `what`.
    fn check(&self, what: &str, result: CUresult) -> Result<(), String> {
        if result == CUDA_SUCCESS {
            return Ok(());
        }
        let mut name: *const c_char = std::ptr::null();
        let named = match self.get_error_name {
            // SAFETY: cuGetErrorName writes a pointer to a static string.
            Some(f) => (unsafe { f(result, &mut name) }) == CUDA_SUCCESS && !name.is_null(),
            None => false,
        };
        let name = if named {
            // SAFETY: a static, terminated string (checked non-null above).
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        } else {
            "unknown CUDA error".to_string()
        };
        Err(format!(
            "host callback: {what} failed with CUDA error {result} ({name})"
        ))
    }

    /// Makes the context of `stream` current on this thread until the guard
    /// is dropped, unless it already is. XLA runs FFI handlers with its
    /// context current, so this is normally a no-op; it guards against a
    /// thread where it is not (the copies would fail with
    /// CUDA_ERROR_INVALID_CONTEXT). If the stream's context cannot be asked
    /// for, the current one is kept and the copies report what is wrong.
    pub(crate) fn enter_stream_context(
        &self,
        stream: CUstream,
    ) -> Result<ContextGuard<'_>, String> {
        let mut wanted: CUcontext = std::ptr::null_mut();
        // SAFETY: `stream` is the live stream XLA gave the handler.
        if unsafe { (self.stream_get_ctx)(stream, &mut wanted) } != CUDA_SUCCESS || wanted.is_null()
        {
            return Ok(ContextGuard {
                driver: self,
                pushed: false,
            });
        }
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: writes the calling thread's current context (or null).
        let known = unsafe { (self.ctx_get_current)(&mut current) } == CUDA_SUCCESS;
        if known && current == wanted {
            return Ok(ContextGuard {
                driver: self,
                pushed: false,
            });
        }
        // SAFETY: `wanted` is a live context (it owns the live stream).
        self.check("cuCtxPushCurrent", unsafe {
            (self.ctx_push_current)(wanted)
        })?;
        Ok(ContextGuard {
            driver: self,
            pushed: true,
        })
    }

    /// Queues a copy of `dst.len()` bytes from device address `src` into
    /// `dst` on `stream`. `dst` must stay alive and untouched until the
    /// stream is synchronised.
    ///
    /// # Safety
    /// `src` must be device memory of at least `dst.len()` bytes, valid
    /// until the stream is synchronised.
    pub(crate) unsafe fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: CUdeviceptr,
        stream: CUstream,
    ) -> Result<(), String> {
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: as the caller promises; `dst` is writable host memory.
        let result =
            unsafe { (self.memcpy_dtoh_async)(dst.as_mut_ptr().cast(), src, dst.len(), stream) };
        self.check("cuMemcpyDtoHAsync", result)
    }

    /// Queues a copy of `src` to device address `dst` on `stream`. `src`
    /// must stay alive and untouched until the stream is synchronised.
    ///
    /// # Safety
    /// `dst` must be device memory of at least `src.len()` writable bytes,
    /// valid until the stream is synchronised.
    pub(crate) unsafe fn copy_to_device(
        &self,
        dst: CUdeviceptr,
        src: &[u8],
        stream: CUstream,
    ) -> Result<(), String> {
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: as the caller promises; `src` is readable host memory.
        let result =
            unsafe { (self.memcpy_htod_async)(dst, src.as_ptr().cast(), src.len(), stream) };
        self.check("cuMemcpyHtoDAsync", result)
    }

    /// Waits until everything queued on `stream` has run.
    pub(crate) fn synchronize(&self, stream: CUstream) -> Result<(), String> {
        // SAFETY: `stream` is the live stream XLA gave the handler.
        let result = unsafe { (self.stream_synchronize)(stream) };
        self.check("cuStreamSynchronize", result)
    }
}

/// Pops the context `Driver::enter_stream_context` pushed, if it did.
pub(crate) struct ContextGuard<'a> {
    driver: &'a Driver,
    pushed: bool,
}

impl Drop for ContextGuard<'_> {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: pops the context pushed on this thread by `enter`.
            // Nothing useful can be done if it fails.
            let _ = unsafe { (self.driver.ctx_pop_current)(&mut popped) };
        }
    }
}

/// `name` from `lib`, typed as `T`, or an error naming both.
///
/// # Safety
/// `T` must be the function type the library's symbol has.
unsafe fn symbol<T: Copy>(
    lib: &libloading::Library,
    library: &str,
    name: &str,
) -> Result<T, String> {
    // SAFETY: as the caller promises.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("the CUDA driver library {library} has no {name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_driver_is_a_clear_error() {
        let err = Driver::load("libcuda-that-is-not-there.so.1")
            .err()
            .expect("no such library");
        assert!(
            err.contains("host callbacks on CUDA need the CUDA driver library"),
            "{err}"
        );
        assert!(err.contains("libcuda-that-is-not-there.so.1"), "{err}");
    }

    #[test]
    fn a_library_without_the_driver_functions_is_a_clear_error() {
        // The C library loads anywhere this test runs, and has no cu* symbols.
        let err = Driver::load("libc.so.6").err().expect("not a CUDA driver");
        assert!(err.contains("has no cuMemcpyDtoHAsync_v2"), "{err}");
    }

    #[test]
    fn the_process_driver_either_loads_or_says_why() {
        match driver() {
            Ok(_) => {}
            Err(err) => assert!(err.contains(DRIVER_LIBRARY), "{err}"),
        }
    }

    #[test]
    fn device_pointers_are_64_bit() {
        // CUdeviceptr is `unsigned long long` on 64-bit hosts (cuda.h).
        assert_eq!(std::mem::size_of::<CUdeviceptr>(), 8);
        assert_eq!(
            std::mem::size_of::<CUstream>(),
            std::mem::size_of::<usize>()
        );
    }
}
