//! A bridge from XLA programs to the host: one typed XLA FFI custom call,
//! registered through the plugin's FFI extension under a target name the
//! caller picks (see `install`), that hands buffers to a Rust
//! `HostCallback` object while the program runs.
//!
//! In MLIR the call is (with the target name `my_host_callback`)
//!
//! ```text
//! %r:N = "stablehlo.custom_call"(%chain, %site, %a, %b) {
//!   call_target_name = "my_host_callback", api_version = 4 : i32,
//!   has_side_effect = true, backend_config = {}
//! } : (tensor<ui64>, tensor<ui32>, ...) -> (tensor<ui64>, ...)
//! ```
//!
//! * `%chain` is a `ui64` scalar holding the id of a *session* (see
//!   `register_session`). It is a runtime parameter of the program, so a
//!   cached executable can be run with a new session each time. The first
//!   result is the same id: threading it from call to call orders the calls.
//! * `%site` is a `ui32` constant naming the call site in the program.
//! * the other operands are handed to the callback as read-only byte views,
//!   and the other results as writable byte views it must fill.
//!
//! The handler runs on a plugin thread (on CPU, the thread that called
//! Execute). It never unwinds: a panic in a callback, a missing session or
//! a callback error becomes an XLA FFI error, which fails the execution with
//! its message. It is an `xla_ffi::Handler`, registered and served through
//! `xla_ffi.rs`, which holds the FFI C API and everything unsafe about it.
//!
//! On a CPU plugin the buffers are host memory and the handler reads and
//! writes them in place. On a CUDA plugin they are device memory written
//! and read by kernels queued on the call's stream: the handler copies
//! through host memory on that stream (see `run_cuda` and `cuda.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use crate::error::{Error, Result};
use crate::plugin::Plugin;
use crate::xla_ffi::{self, dtype, Buffer, BufferMut, Call, FfiError, Handler, Platform};

// ---- The callback interface ----

/// An operand handed to a callback: its XLA FFI data type code, its
/// dimensions and its bytes (row-major).
pub struct ArgView<'a> {
    pub dtype: i32,
    pub dims: &'a [i64],
    pub bytes: &'a [u8],
}

/// A result a callback must fill.
pub struct RetView<'a> {
    pub dtype: i32,
    pub dims: &'a [i64],
    pub bytes: &'a mut [u8],
}

/// The host side of a session. `call` runs on a plugin thread; it may block
/// (the program waits), but must return when the session is cancelled.
pub trait HostCallback: Send + Sync {
    fn call(
        &self,
        site: u32,
        args: &[ArgView<'_>],
        rets: &mut [RetView<'_>],
    ) -> std::result::Result<(), String>;
}

type Sessions = RwLock<HashMap<u64, Arc<dyn HostCallback>>>;

fn sessions() -> &'static Sessions {
    static SESSIONS: OnceLock<Sessions> = OnceLock::new();
    SESSIONS.get_or_init(Default::default)
}

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// A registered session; unregistered on drop (later calls then fail).
pub struct Session {
    id: u64,
}

impl Session {
    /// The id programs receive as their `%chain` parameter.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        sessions()
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// Registers `callback` under a fresh session id.
pub fn register_session(callback: Arc<dyn HostCallback>) -> Session {
    let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
    sessions()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, callback);
    Session { id }
}

/// Number of registered sessions (for leak checks).
pub fn session_count() -> usize {
    sessions().read().unwrap_or_else(|e| e.into_inner()).len()
}

/// Registers the handler with `plugin` as the FFI target `target`, the
/// `call_target_name` of the programs' custom calls, for the platform of
/// its clients: `client_platform` is a client's `platform_name()` ("cpu"
/// or "cuda"; other platforms have no way to stage buffers here yet, and an
/// error says so: ROCm would follow CUDA with HIP's equivalents).
/// Registering the same target with the same plugin again does nothing.
pub fn install(plugin: &Plugin, client_platform: &str, target: &str) -> Result<()> {
    if target.is_empty() {
        return Err(Error::invalid(
            "the host callback target name must not be empty",
        ));
    }
    let platform = platform_of(client_platform)?;
    if platform == Platform::Cuda {
        // Fail here, with the reason, rather than in every call.
        crate::cuda::driver().map_err(Error::invalid)?;
    }
    xla_ffi::register::<Bridge>(plugin, platform, target)
}

/// The platform of a client whose platform name is `name`, where host
/// callbacks can run.
fn platform_of(name: &str) -> Result<Platform> {
    Platform::from_client_name(name).ok_or_else(|| {
        Error::invalid(format!(
            "host callbacks (hooks, streams) are not supported on the {} platform yet \
             (only on cpu and cuda)",
            name.to_ascii_lowercase()
        ))
    })
}

/// The FFI handler of host callbacks.
struct Bridge;

impl Handler for Bridge {
    const NAME: &'static str = "host callback";

    fn execute(call: &mut Call<'_>) -> std::result::Result<(), FfiError> {
        check_signature(&call.args, &call.rets)?;
        match call.platform() {
            Platform::Host => run_host(call),
            Platform::Cuda => run_cuda(call),
        }
        .map_err(FfiError::from)
    }
}

/// Checks the operands and results every call has: `%chain` (ui64) and
/// `%site` (ui32) first, then at least the chain result (ui64).
fn check_signature(args: &[Buffer<'_>], rets: &[BufferMut<'_>]) -> std::result::Result<(), String> {
    if args.len() < 2 || rets.is_empty() {
        return Err("a host callback takes a chain and a site and returns a chain".into());
    }
    let (chain, site) = (&args[0], &args[1]);
    if chain.dtype() != dtype::U64
        || chain.byte_len() != 8
        || site.dtype() != dtype::U32
        || site.byte_len() != 4
    {
        return Err(
            "a host callback's chain must be a ui64 scalar and its site a ui32 scalar".into(),
        );
    }
    let first = rets[0].buffer();
    if first.dtype() != dtype::U64 || first.byte_len() != 8 {
        return Err("a host callback's first result must be a ui64 scalar".into());
    }
    Ok(())
}

/// The callback of session `id`, or why there is none.
fn session(id: u64) -> std::result::Result<Arc<dyn HostCallback>, String> {
    sessions()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&id)
        .cloned()
        .ok_or_else(|| format!("host callback session {id} is closed"))
}

/// Calls the session the chain names, given the call's buffers (for their
/// types and dimensions) and the host bytes of each: `inputs[i]` holds
/// `args[i]`'s, and `outputs[i]` receives `rets[i]`'s. The chain result
/// gets the chain's id; the callback fills the other results.
fn dispatch(
    args: &[Buffer<'_>],
    inputs: &[&[u8]],
    rets: &[&Buffer<'_>],
    outputs: Vec<&mut [u8]>,
) -> std::result::Result<(), String> {
    let id_bytes: [u8; 8] = inputs[0].try_into().map_err(|_| "bad chain")?;
    let id = u64::from_ne_bytes(id_bytes);
    let site = u32::from_ne_bytes(inputs[1].try_into().map_err(|_| "bad site")?);
    let mut outputs = outputs.into_iter();
    outputs
        .next()
        .ok_or("a host callback returns a chain")?
        .copy_from_slice(&id_bytes);
    let callback = session(id)?;
    let views: Vec<ArgView<'_>> = args[2..]
        .iter()
        .zip(&inputs[2..])
        .map(|(raw, host)| ArgView {
            dtype: raw.dtype(),
            dims: raw.dims(),
            bytes: host,
        })
        .collect();
    let mut outs: Vec<RetView<'_>> = rets[1..]
        .iter()
        .zip(outputs)
        .map(|(raw, host)| RetView {
            dtype: raw.dtype(),
            dims: raw.dims(),
            bytes: host,
        })
        .collect();
    callback.call(site, &views, &mut outs)
}

/// CPU: the buffers are host memory, read and written in place.
fn run_host(call: &mut Call<'_>) -> std::result::Result<(), String> {
    let inputs = call
        .args
        .iter()
        .map(Buffer::host_bytes)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| e.message)?;
    let shapes: Vec<Buffer<'_>> = call.rets.iter().map(|r| *r.buffer()).collect();
    let outputs = call
        .rets
        .iter_mut()
        .map(BufferMut::host_bytes_mut)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| e.message)?;
    dispatch(
        &call.args,
        &inputs,
        &shapes.iter().collect::<Vec<_>>(),
        outputs,
    )
}

/// CUDA: the buffers are device memory, written and read by kernels queued
/// on the call's stream. The operands are copied to host memory on that
/// stream (ordered after the kernels that produce them), the stream is
/// waited for, the callback runs on the host copies, and the results are
/// copied back on the stream, which is waited for again so that the host
/// copies outlive the transfers (later kernels on the stream are ordered
/// after them anyway).
fn run_cuda(call: &mut Call<'_>) -> std::result::Result<(), String> {
    let driver = crate::cuda::driver()?;
    let stream = call
        .cuda_stream()
        .map_err(|e| format!("host callback: {}", e.message))?;
    let _context = driver.enter_stream_context(stream)?;

    let mut inputs: Vec<Vec<u8>> = call
        .args
        .iter()
        .map(|raw| vec![0u8; raw.byte_len()])
        .collect();
    for (host, raw) in inputs.iter_mut().zip(&call.args) {
        // SAFETY: `raw` is device memory of `host.len()` bytes, live for
        // the call; the stream is synchronised below, before `host` is read.
        unsafe { driver.copy_to_host(host, raw.address() as crate::cuda::CUdeviceptr, stream) }?;
    }
    driver.synchronize(stream)?;

    let rets: Vec<&Buffer<'_>> = call.rets.iter().map(BufferMut::buffer).collect();
    let mut outputs: Vec<Vec<u8>> = rets.iter().map(|raw| vec![0u8; raw.byte_len()]).collect();
    let input_views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let output_views: Vec<&mut [u8]> = outputs.iter_mut().map(Vec::as_mut_slice).collect();
    dispatch(&call.args, &input_views, &rets, output_views)?;

    for (host, raw) in outputs.iter().zip(&rets) {
        // SAFETY: `raw` is writable device memory of `host.len()` bytes,
        // live for the call; `host` lives until the stream is synchronised.
        unsafe { driver.copy_to_device(raw.address() as crate::cuda::CUdeviceptr, host, stream) }?;
    }
    driver.synchronize(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_callbacks_run_on_cpu_and_cuda_clients() {
        for name in ["cpu", "CPU", "host"] {
            assert_eq!(platform_of(name).unwrap(), Platform::Host);
        }
        assert_eq!(platform_of("cuda").unwrap(), Platform::Cuda);
        for name in ["rocm", "tpu", "gpu"] {
            let err = platform_of(name).unwrap_err().to_string();
            assert!(
                err.contains(&format!("not supported on the {name} platform")),
                "{err}"
            );
        }
    }
}
