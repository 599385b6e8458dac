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
//! its message. The FFI C API structures are declared here by hand, only as
//! far as they are used; they follow xla/ffi/api/c_api.h (checked against
//! the copy jaxlib 0.11.2 ships in `jaxlib/include`, FFI API 0.4, and an
//! older openxla/xla copy, FFI API 0.1: the fields used here are the same).
//!
//! On a CPU plugin the buffers are host memory and the handler reads and
//! writes them in place. On a CUDA plugin they are device memory written
//! and read by kernels queued on the call's stream: the handler copies
//! through host memory on that stream (see `run_cuda` and `cuda.rs`).
#![allow(non_camel_case_types)]

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::error::{Error, Result};
use crate::ffi::PJRT_Extension_Base;
use crate::plugin::Plugin;

/// The platform a handler is registered for, from the PJRT client's
/// platform name, and how the handler reaches the buffers there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Platform {
    /// CPU plugins: buffers are host memory.
    Host,
    /// CUDA plugins: buffers are device memory, reached through the CUDA
    /// driver on the call's stream.
    Cuda,
}

impl Platform {
    /// The platform of a client whose `PJRT_Client_PlatformName` is `name`
    /// ("cpu" for XLA's CPU plugins, "cuda" for its CUDA plugins). Other
    /// platforms (ROCm, TPU, ...) have no way to stage buffers here yet: an
    /// error says so. ROCm would follow CUDA with HIP's equivalents.
    pub fn from_client_name(name: &str) -> Result<Platform> {
        match name.to_ascii_lowercase().as_str() {
            "cpu" | "host" => Ok(Platform::Host),
            "cuda" => Ok(Platform::Cuda),
            other => Err(Error::invalid(format!(
                "host callbacks (hooks, streams) are not supported on the {other} platform yet \
                 (only on cpu and cuda)"
            ))),
        }
    }

    /// XLA's FFI platform name. XLA canonicalises it case-insensitively
    /// (`PlatformUtil::CanonicalPlatformName` in
    /// xla/service/platform_util.cc: "cpu" and "host" are the same); "Host"
    /// is what this crate always registered on CPU, and "CUDA" is what
    /// jaxlib registers its GPU FFI handlers for
    /// (`XLA_FFI_REGISTER_HANDLER(..., "CUDA", ...)` in
    /// jaxlib/gpu/gpu_kernels.cc).
    pub fn ffi_name(self) -> &'static str {
        match self {
            Platform::Host => "Host",
            Platform::Cuda => "CUDA",
        }
    }

    /// The handler for this platform (one per platform, since one process
    /// may have a CPU and a CUDA plugin, each with its own FFI registry).
    fn handler(self) -> XLA_FFI_Handler {
        match self {
            Platform::Host => handler_host,
            Platform::Cuda => handler_cuda,
        }
    }
}

/// `PJRT_Extension_Type_FFI` in the PJRT extension enum.
const PJRT_EXTENSION_TYPE_FFI: c_int = 5;

// ---- XLA FFI C API (xla/ffi/api/c_api.h), the parts used here ----

#[repr(C)]
struct XLA_FFI_Extension_Base {
    struct_size: usize,
    type_: c_int,
    next: *mut XLA_FFI_Extension_Base,
}

const XLA_FFI_EXTENSION_METADATA: c_int = 1;

#[repr(C)]
struct XLA_FFI_Api_Version {
    struct_size: usize,
    extension_start: *mut XLA_FFI_Extension_Base,
    major_version: c_int,
    minor_version: c_int,
}

#[repr(C)]
struct XLA_FFI_Metadata_Extension {
    extension_base: XLA_FFI_Extension_Base,
    metadata: *mut c_void,
}

enum XLA_FFI_Error {}

#[repr(C)]
struct XLA_FFI_Error_Create_Args {
    struct_size: usize,
    extension_start: *mut XLA_FFI_Extension_Base,
    message: *const c_char,
    errc: c_int,
}

const XLA_FFI_ERROR_CODE_INTERNAL: c_int = 13;

type XLA_FFI_Error_Create =
    unsafe extern "C" fn(*mut XLA_FFI_Error_Create_Args) -> *mut XLA_FFI_Error;

#[repr(C)]
struct XLA_FFI_Error_Destroy_Args {
    struct_size: usize,
    extension_start: *mut XLA_FFI_Extension_Base,
    error: *mut XLA_FFI_Error,
}

type XLA_FFI_Error_Destroy = unsafe extern "C" fn(*mut XLA_FFI_Error_Destroy_Args);

#[repr(C)]
struct XLA_FFI_Stream_Get_Args {
    struct_size: usize,
    extension_start: *mut XLA_FFI_Extension_Base,
    ctx: *mut c_void,
    stream: *mut c_void,
}

type XLA_FFI_Stream_Get = unsafe extern "C" fn(*mut XLA_FFI_Stream_Get_Args) -> *mut XLA_FFI_Error;

type XLA_FFI_Handler = unsafe extern "C" fn(*mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error;

/// The head of `XLA_FFI_Api`, up to `XLA_FFI_Stream_Get`. In c_api.h the
/// functions follow `internal_api` in this order: Error_Create,
/// Error_GetMessage (Error_GetDetails in newer XLA, same slot),
/// Error_Destroy, Handler_Register, Stream_Get, then others not used here
/// (the same in openxla/xla's FFI API 0.1 and jaxlib 0.11.2's 0.4). Only
/// the slots used are typed; every slot is read only after `struct_size`
/// says the caller's table has it.
#[repr(C)]
struct XLA_FFI_Api_Head {
    struct_size: usize,
    extension_start: *mut XLA_FFI_Extension_Base,
    api_version: XLA_FFI_Api_Version,
    internal_api: *const c_void,
    error_create: Option<XLA_FFI_Error_Create>,
    error_get_message: *const c_void,
    error_destroy: Option<XLA_FFI_Error_Destroy>,
    handler_register: *const c_void,
    stream_get: Option<XLA_FFI_Stream_Get>,
}

#[repr(C)]
struct XLA_FFI_Buffer {
    struct_size: usize,
    extension_start: *mut XLA_FFI_Extension_Base,
    dtype: c_int,
    data: *mut c_void,
    rank: i64,
    dims: *const i64,
}

#[repr(C)]
struct XLA_FFI_List {
    struct_size: usize,
    extension_start: *mut XLA_FFI_Extension_Base,
    size: i64,
    types: *const c_int,
    items: *const *mut c_void,
}

#[repr(C)]
struct XLA_FFI_Attrs {
    struct_size: usize,
    extension_start: *mut XLA_FFI_Extension_Base,
    size: i64,
    types: *const c_int,
    names: *const c_void,
    attrs: *const *mut c_void,
}

#[repr(C)]
struct XLA_FFI_CallFrame {
    struct_size: usize,
    extension_start: *mut XLA_FFI_Extension_Base,
    api: *const XLA_FFI_Api_Head,
    ctx: *mut c_void,
    stage: c_int,
    args: XLA_FFI_List,
    rets: XLA_FFI_List,
    attrs: XLA_FFI_Attrs,
}

const XLA_FFI_BUFFER: c_int = 1;
const XLA_FFI_EXECUTION_STAGE_EXECUTE: c_int = 3;
const XLA_FFI_DATATYPE_U32: c_int = 8;
const XLA_FFI_DATATYPE_U64: c_int = 9;

// ---- PJRT FFI extension (xla/pjrt/c/pjrt_c_api_ffi_extension.h) ----

#[repr(C)]
struct PJRT_FFI_Register_Handler_Args {
    struct_size: usize,
    target_name: *const c_char,
    target_name_size: usize,
    handler: *mut c_void,
    platform_name: *const c_char,
    platform_name_size: usize,
    traits: u32,
}

type PJRT_FFI_Register_Handler =
    unsafe extern "C" fn(*mut PJRT_FFI_Register_Handler_Args) -> *mut crate::ffi::PJRT_Error;

#[repr(C)]
struct PJRT_FFI_Extension {
    base: PJRT_Extension_Base,
    type_id_register: *mut c_void,
    user_data_add: *mut c_void,
    register_handler: Option<PJRT_FFI_Register_Handler>,
}

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
/// its clients: `client_platform` is a client's `platform_name()` (see
/// `Platform::from_client_name`). Registering the same target with the
/// same plugin again does nothing.
pub fn install(plugin: &Plugin, client_platform: &str, target: &str) -> Result<()> {
    type Installed = HashSet<(PathBuf, Platform, String)>;
    static INSTALLED: OnceLock<Mutex<Installed>> = OnceLock::new();
    if target.is_empty() {
        return Err(Error::invalid(
            "the host callback target name must not be empty",
        ));
    }
    let platform = Platform::from_client_name(client_platform)?;
    if platform == Platform::Cuda {
        // Fail here, with the reason, rather than in every call.
        crate::cuda::driver().map_err(Error::invalid)?;
    }
    let mut installed = INSTALLED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let key = (plugin.path().to_path_buf(), platform, target.to_string());
    if installed.contains(&key) {
        return Ok(());
    }
    let register = find_register_handler(plugin)?;
    let platform_name = platform.ffi_name();
    let mut args = PJRT_FFI_Register_Handler_Args {
        struct_size: std::mem::size_of::<PJRT_FFI_Register_Handler_Args>(),
        target_name: target.as_ptr().cast(),
        target_name_size: target.len(),
        handler: platform.handler() as *mut c_void,
        platform_name: platform_name.as_ptr().cast(),
        platform_name_size: platform_name.len(),
        // Not command-buffer compatible: XLA:GPU must not capture the call
        // in a CUDA graph (it would run once at capture, not per execution).
        traits: 0,
    };
    // SAFETY: the arguments follow the extension's struct; the strings are
    // passed with their lengths and copied by the plugin.
    plugin.check(unsafe { crate::guard::call("register_handler", register, &mut args) }?)?;
    installed.insert(key);
    Ok(())
}

fn find_register_handler(plugin: &Plugin) -> Result<PJRT_FFI_Register_Handler> {
    let unsupported = || {
        Error::invalid(format!(
            "the plugin {} cannot run host callbacks (no PJRT FFI extension with register_handler)",
            plugin.path().display()
        ))
    };
    let mut ext = plugin.api().extension_start;
    while !ext.is_null() {
        // SAFETY: every extension begins with a PJRT_Extension_Base and the
        // list is static for the life of the plugin.
        let base = unsafe { &*ext };
        if base.type_ == PJRT_EXTENSION_TYPE_FFI {
            let needed = std::mem::offset_of!(PJRT_FFI_Extension, register_handler)
                + std::mem::size_of::<usize>();
            if base.struct_size < needed {
                return Err(unsupported());
            }
            // SAFETY: the extension is an FFI extension large enough to hold
            // the register_handler slot (checked above).
            let ffi = unsafe { &*ext.cast::<PJRT_FFI_Extension>() };
            return ffi.register_handler.ok_or_else(unsupported);
        }
        ext = base.next;
    }
    Err(unsupported())
}

// ---- The handlers ----

/// The handler registered for CPU plugins.
unsafe extern "C" fn handler_host(frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
    // SAFETY: XLA passes a valid call frame (or null) for the call.
    unsafe { serve(frame, run_host) }
}

/// The handler registered for CUDA plugins.
unsafe extern "C" fn handler_cuda(frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
    // SAFETY: XLA passes a valid call frame (or null) for the call.
    unsafe { serve(frame, run_cuda) }
}

/// What both handlers do: answer metadata queries, succeed at once in the
/// stages other than execute (instantiate, prepare, initialize, and the
/// command-buffer record stage of newer XLA, never used for a handler
/// without the command-buffer trait), and run `run` in the execute stage,
/// turning its error or panic into an XLA FFI error.
unsafe fn serve(
    frame: *mut XLA_FFI_CallFrame,
    run: unsafe fn(&XLA_FFI_CallFrame) -> std::result::Result<(), String>,
) -> *mut XLA_FFI_Error {
    if frame.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: XLA passes a valid call frame for the duration of the call.
    let frame = unsafe { &*frame };
    // SAFETY: as above; the extension list belongs to the frame.
    if unsafe { answer_metadata(frame) } {
        return std::ptr::null_mut();
    }
    if frame.stage != XLA_FFI_EXECUTION_STAGE_EXECUTE {
        return std::ptr::null_mut();
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the frame's buffers are valid during the call.
        unsafe { run(frame) }
    }));
    let message = match outcome {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(message)) => message,
        Err(panic) => format!("host callback panicked: {}", panic_message(&panic)),
    };
    // SAFETY: the frame's api pointer is valid during the call.
    unsafe { make_error(frame.api, &message) }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Answers XLA's metadata query (FFI API version 0.1, no traits). XLA
/// versions differ on whether `XLA_FFI_Metadata` has an `extension_start`
/// field; its `struct_size` tells which layout the caller uses.
unsafe fn answer_metadata(frame: &XLA_FFI_CallFrame) -> bool {
    let ext = frame.extension_start;
    if ext.is_null() || unsafe { (*ext).type_ } != XLA_FFI_EXTENSION_METADATA {
        return false;
    }
    let ext = ext.cast::<XLA_FFI_Metadata_Extension>();
    let metadata = unsafe { (*ext).metadata }.cast::<u8>();
    if metadata.is_null() {
        return true;
    }
    let struct_size = unsafe { metadata.cast::<usize>().read_unaligned() };
    let version_size = std::mem::size_of::<XLA_FFI_Api_Version>();
    let with_extension = 2 * std::mem::size_of::<usize>() + version_size + 4;
    let version_offset = if struct_size >= with_extension {
        2 * std::mem::size_of::<usize>()
    } else {
        std::mem::size_of::<usize>()
    };
    let version = unsafe { metadata.add(version_offset) }.cast::<XLA_FFI_Api_Version>();
    unsafe {
        (*version).major_version = 0;
        (*version).minor_version = 1;
        metadata
            .add(version_offset + version_size)
            .cast::<u32>()
            .write_unaligned(0);
    }
    true
}

/// Whether the caller's `XLA_FFI_Api` table (non-null) is at least `end`
/// bytes long: slots are read only below that, and only through raw
/// pointers, since `XLA_FFI_Api_Head` may be longer than an old table.
unsafe fn api_has(api: *const XLA_FFI_Api_Head, end: usize) -> bool {
    // SAFETY: every XLA_FFI_Api begins with its struct_size.
    unsafe { std::ptr::addr_of!((*api).struct_size).read() >= end }
}

unsafe fn make_error(api: *const XLA_FFI_Api_Head, message: &str) -> *mut XLA_FFI_Error {
    if api.is_null() {
        return std::ptr::null_mut();
    }
    let end = std::mem::offset_of!(XLA_FFI_Api_Head, error_create) + std::mem::size_of::<usize>();
    if !unsafe { api_has(api, end) } {
        return std::ptr::null_mut();
    }
    // SAFETY: the table holds this slot (checked above).
    let create = match unsafe { std::ptr::addr_of!((*api).error_create).read() } {
        Some(f) => f,
        None => return std::ptr::null_mut(),
    };
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let mut args = XLA_FFI_Error_Create_Args {
        struct_size: std::mem::size_of::<XLA_FFI_Error_Create_Args>(),
        extension_start: std::ptr::null_mut(),
        message: text.as_ptr(),
        errc: XLA_FFI_ERROR_CODE_INTERNAL,
    };
    // SAFETY: XLA copies the message into the error it creates.
    unsafe { crate::guard::call("XLA_FFI_Error_Create", create, &mut args) }
        .unwrap_or(std::ptr::null_mut())
}

/// The bytes of `count` elements of an XLA FFI data type in a callback's
/// buffer. Sub-byte integers come packed, `8 / bits` elements per byte.
fn byte_len(dtype: c_int, count: usize) -> std::result::Result<usize, String> {
    let bytes = |size: usize| {
        count
            .checked_mul(size)
            .ok_or_else(|| "bad dimensions".to_string())
    };
    match dtype {
        1 | 2 | 6 | 19 | 20 => bytes(1),  // pred, s8, u8, f8e5m2, f8e4m3fn
        3 | 7 | 10 | 16 => bytes(2),      // s16, u16, f16, bf16
        4 | 8 | 11 => bytes(4),           // s32, u32, f32
        5 | 9 | 12 | 15 => bytes(8),      // s64, u64, f64, c64
        18 => bytes(16),                  // c128
        21 | 22 => Ok(count.div_ceil(2)), // s4, u4
        26 | 27 => Ok(count.div_ceil(4)), // s2, u2
        other => Err(format!(
            "host callbacks do not support XLA data type {other}"
        )),
    }
}

struct RawBuffer<'a> {
    dtype: c_int,
    dims: &'a [i64],
    data: *mut u8,
    len: usize,
}

unsafe fn buffers<'a>(
    list: &'a XLA_FFI_List,
    what: &str,
) -> std::result::Result<Vec<RawBuffer<'a>>, String> {
    let n = usize::try_from(list.size).map_err(|_| format!("bad {what} count"))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    if list.types.is_null() || list.items.is_null() {
        return Err(format!("the call frame has no {what}"));
    }
    let types = unsafe { std::slice::from_raw_parts(list.types, n) };
    let items = unsafe { std::slice::from_raw_parts(list.items, n) };
    let mut out = Vec::with_capacity(n);
    for (ty, item) in types.iter().zip(items) {
        if *ty != XLA_FFI_BUFFER || item.is_null() {
            return Err(format!("host callback {what} must be buffers"));
        }
        let buffer = unsafe { &*item.cast::<XLA_FFI_Buffer>() };
        let rank = usize::try_from(buffer.rank).map_err(|_| "bad rank".to_string())?;
        let dims = if rank == 0 || buffer.dims.is_null() {
            &[][..]
        } else {
            unsafe { std::slice::from_raw_parts(buffer.dims, rank) }
        };
        let count: i64 = dims.iter().product();
        let count = usize::try_from(count).map_err(|_| "bad dimensions".to_string())?;
        let len = byte_len(buffer.dtype, count)?;
        if len > 0 && buffer.data.is_null() {
            return Err(format!("a host callback {what} has no data"));
        }
        out.push(RawBuffer {
            dtype: buffer.dtype,
            dims,
            data: buffer.data.cast(),
            len,
        });
    }
    Ok(out)
}

fn bytes<'a>(raw: &RawBuffer<'a>) -> &'a [u8] {
    if raw.len == 0 {
        &[]
    } else {
        // SAFETY: XLA owns `len` readable bytes at `data` during the call.
        unsafe { std::slice::from_raw_parts(raw.data, raw.len) }
    }
}

fn bytes_mut<'a>(raw: &RawBuffer<'a>) -> &'a mut [u8] {
    if raw.len == 0 {
        &mut []
    } else {
        // SAFETY: result buffers are writable, distinct from the operands
        // and from each other, for the duration of the call.
        unsafe { std::slice::from_raw_parts_mut(raw.data, raw.len) }
    }
}

/// Checks the operands and results every call has: `%chain` (ui64) and
/// `%site` (ui32) first, then at least the chain result (ui64).
fn check_signature(
    args: &[RawBuffer<'_>],
    rets: &[RawBuffer<'_>],
) -> std::result::Result<(), String> {
    if args.len() < 2 || rets.is_empty() {
        return Err("a host callback takes a chain and a site and returns a chain".into());
    }
    let (chain, site) = (&args[0], &args[1]);
    if chain.dtype != XLA_FFI_DATATYPE_U64
        || chain.len != 8
        || site.dtype != XLA_FFI_DATATYPE_U32
        || site.len != 4
    {
        return Err(
            "a host callback's chain must be a ui64 scalar and its site a ui32 scalar".into(),
        );
    }
    let first = &rets[0];
    if first.dtype != XLA_FFI_DATATYPE_U64 || first.len != 8 {
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
    args: &[RawBuffer<'_>],
    inputs: &[&[u8]],
    rets: &[RawBuffer<'_>],
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
            dtype: raw.dtype,
            dims: raw.dims,
            bytes: host,
        })
        .collect();
    let mut outs: Vec<RetView<'_>> = rets[1..]
        .iter()
        .zip(outputs)
        .map(|(raw, host)| RetView {
            dtype: raw.dtype,
            dims: raw.dims,
            bytes: host,
        })
        .collect();
    callback.call(site, &views, &mut outs)
}

/// CPU: the buffers are host memory, read and written in place.
unsafe fn run_host(frame: &XLA_FFI_CallFrame) -> std::result::Result<(), String> {
    let args = unsafe { buffers(&frame.args, "operands") }?;
    let rets = unsafe { buffers(&frame.rets, "results") }?;
    check_signature(&args, &rets)?;
    let inputs: Vec<&[u8]> = args.iter().map(bytes).collect();
    dispatch(&args, &inputs, &rets, rets.iter().map(bytes_mut).collect())
}

/// The call's CUDA stream, from `XLA_FFI_Stream_Get` (a `CUstream` on the
/// CUDA platform, c_api.h).
unsafe fn stream_of(
    frame: &XLA_FFI_CallFrame,
) -> std::result::Result<crate::cuda::CUstream, String> {
    let api = frame.api;
    if api.is_null() {
        return Err("host callback: the call frame has no XLA FFI API".into());
    }
    let end = std::mem::offset_of!(XLA_FFI_Api_Head, stream_get) + std::mem::size_of::<usize>();
    if !unsafe { api_has(api, end) } {
        return Err("host callback: the XLA FFI API table has no XLA_FFI_Stream_Get".into());
    }
    // SAFETY: the table holds this slot (checked above).
    let get = unsafe { std::ptr::addr_of!((*api).stream_get).read() }
        .ok_or("host callback: XLA_FFI_Stream_Get is null")?;
    let mut args = XLA_FFI_Stream_Get_Args {
        struct_size: std::mem::size_of::<XLA_FFI_Stream_Get_Args>(),
        extension_start: std::ptr::null_mut(),
        ctx: frame.ctx,
        stream: std::ptr::null_mut(),
    };
    // SAFETY: the arguments follow c_api.h; XLA writes the stream.
    let error = unsafe { crate::guard::call("XLA_FFI_Stream_Get", get, &mut args) }
        .map_err(|e| format!("host callback: {e}"))?;
    if !error.is_null() {
        // SAFETY: `error` is XLA's, handed over to be destroyed.
        unsafe { destroy_error(api, error) };
        return Err(
            "host callback: XLA_FFI_Stream_Get failed (no CUDA stream for the call)".into(),
        );
    }
    if args.stream.is_null() {
        // The null CUstream is CUDA's legacy default stream, which XLA's
        // non-blocking streams are not ordered with: copies there could
        // race the kernels, so refuse rather than guess.
        return Err("host callback: XLA_FFI_Stream_Get gave no CUDA stream".into());
    }
    Ok(args.stream)
}

/// Destroys an error an XLA FFI API function returned (leaks it where the
/// table has no XLA_FFI_Error_Destroy).
unsafe fn destroy_error(api: *const XLA_FFI_Api_Head, error: *mut XLA_FFI_Error) {
    let end = std::mem::offset_of!(XLA_FFI_Api_Head, error_destroy) + std::mem::size_of::<usize>();
    if !unsafe { api_has(api, end) } {
        return;
    }
    // SAFETY: the table holds this slot (checked above).
    if let Some(destroy) = unsafe { std::ptr::addr_of!((*api).error_destroy).read() } {
        let mut args = XLA_FFI_Error_Destroy_Args {
            struct_size: std::mem::size_of::<XLA_FFI_Error_Destroy_Args>(),
            extension_start: std::ptr::null_mut(),
            error,
        };
        // SAFETY: the arguments follow c_api.h; `error` is destroyed once.
        let _ = unsafe { crate::guard::call_void("XLA_FFI_Error_Destroy", destroy, &mut args) };
    }
}

/// CUDA: the buffers are device memory, written and read by kernels queued
/// on the call's stream. The operands are copied to host memory on that
/// stream (ordered after the kernels that produce them), the stream is
/// waited for, the callback runs on the host copies, and the results are
/// copied back on the stream, which is waited for again so that the host
/// copies outlive the transfers (later kernels on the stream are ordered
/// after them anyway).
unsafe fn run_cuda(frame: &XLA_FFI_CallFrame) -> std::result::Result<(), String> {
    let driver = crate::cuda::driver()?;
    let args = unsafe { buffers(&frame.args, "operands") }?;
    let rets = unsafe { buffers(&frame.rets, "results") }?;
    check_signature(&args, &rets)?;
    let stream = unsafe { stream_of(frame) }?;
    let _context = driver.enter_stream_context(stream)?;

    let mut inputs: Vec<Vec<u8>> = args.iter().map(|raw| vec![0u8; raw.len]).collect();
    for (host, raw) in inputs.iter_mut().zip(&args) {
        // SAFETY: `raw.data` is device memory of `raw.len` bytes, live for
        // the call; the stream is synchronised below, before `host` is read.
        unsafe { driver.copy_to_host(host, raw.data as crate::cuda::CUdeviceptr, stream) }?;
    }
    driver.synchronize(stream)?;

    let mut outputs: Vec<Vec<u8>> = rets.iter().map(|raw| vec![0u8; raw.len]).collect();
    let input_views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let output_views: Vec<&mut [u8]> = outputs.iter_mut().map(Vec::as_mut_slice).collect();
    dispatch(&args, &input_views, &rets, output_views)?;

    for (host, raw) in outputs.iter().zip(&rets) {
        // SAFETY: `raw.data` is writable device memory of `raw.len` bytes,
        // live for the call; `host` lives until the stream is synchronised.
        unsafe { driver.copy_to_device(raw.data as crate::cuda::CUdeviceptr, host, stream) }?;
    }
    driver.synchronize(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn the_platform_comes_from_the_client_name() {
        for name in ["cpu", "CPU", "host"] {
            assert_eq!(Platform::from_client_name(name).unwrap(), Platform::Host);
        }
        assert_eq!(Platform::from_client_name("cuda").unwrap(), Platform::Cuda);
        assert_eq!(Platform::Host.ffi_name(), "Host");
        assert_eq!(Platform::Cuda.ffi_name(), "CUDA");
        for name in ["rocm", "tpu", "gpu"] {
            let err = Platform::from_client_name(name).unwrap_err().to_string();
            assert!(
                err.contains(&format!("not supported on the {name} platform")),
                "{err}"
            );
        }
    }

    #[test]
    fn each_platform_has_its_own_handler() {
        assert_ne!(
            Platform::Host.handler() as usize,
            Platform::Cuda.handler() as usize
        );
    }

    /// The offsets the handlers rely on, on 64-bit hosts, as the field order
    /// of xla/ffi/api/c_api.h gives them (size_t and pointers 8 bytes, enums
    /// and ints 4).
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn ffi_layouts_follow_c_api_h() {
        // XLA_FFI_Api: struct_size, extension_start, api_version (24
        // bytes), internal_api, then Error_Create, Error_GetMessage (or
        // GetDetails), Error_Destroy, Handler_Register, Stream_Get.
        assert_eq!(size_of::<XLA_FFI_Api_Version>(), 24);
        assert_eq!(offset_of!(XLA_FFI_Api_Head, api_version), 16);
        assert_eq!(offset_of!(XLA_FFI_Api_Head, internal_api), 40);
        assert_eq!(offset_of!(XLA_FFI_Api_Head, error_create), 48);
        assert_eq!(offset_of!(XLA_FFI_Api_Head, error_get_message), 56);
        assert_eq!(offset_of!(XLA_FFI_Api_Head, error_destroy), 64);
        assert_eq!(offset_of!(XLA_FFI_Api_Head, handler_register), 72);
        assert_eq!(offset_of!(XLA_FFI_Api_Head, stream_get), 80);
        assert_eq!(size_of::<XLA_FFI_Api_Head>(), 88);
        // XLA_FFI_Stream_Get_Args: struct_size, extension_start, ctx, stream.
        assert_eq!(offset_of!(XLA_FFI_Stream_Get_Args, ctx), 16);
        assert_eq!(offset_of!(XLA_FFI_Stream_Get_Args, stream), 24);
        assert_eq!(size_of::<XLA_FFI_Stream_Get_Args>(), 32);
        // XLA_FFI_Error_Destroy_Args: struct_size, extension_start, error.
        assert_eq!(offset_of!(XLA_FFI_Error_Destroy_Args, error), 16);
        // XLA_FFI_CallFrame: struct_size, extension_start, api, ctx, stage,
        // then the args, rets and attrs structs.
        assert_eq!(offset_of!(XLA_FFI_CallFrame, api), 16);
        assert_eq!(offset_of!(XLA_FFI_CallFrame, ctx), 24);
        assert_eq!(offset_of!(XLA_FFI_CallFrame, stage), 32);
        assert_eq!(offset_of!(XLA_FFI_CallFrame, args), 40);
        assert_eq!(offset_of!(XLA_FFI_CallFrame, rets), 80);
        assert_eq!(offset_of!(XLA_FFI_CallFrame, attrs), 120);
        // XLA_FFI_Buffer: struct_size, extension_start, dtype, data, rank, dims.
        assert_eq!(offset_of!(XLA_FFI_Buffer, data), 24);
        assert_eq!(offset_of!(XLA_FFI_Buffer, dims), 40);
        // PJRT_FFI_Register_Handler_Args (pjrt_c_api_ffi_extension.h).
        assert_eq!(offset_of!(PJRT_FFI_Register_Handler_Args, handler), 24);
        assert_eq!(
            offset_of!(PJRT_FFI_Register_Handler_Args, platform_name),
            32
        );
        assert_eq!(offset_of!(PJRT_FFI_Register_Handler_Args, traits), 48);
    }

    #[test]
    fn a_short_api_table_has_no_stream_get() {
        // A table that ends after Error_Create: the stream slot is not read.
        let mut head: XLA_FFI_Api_Head = unsafe { std::mem::zeroed() };
        head.struct_size = offset_of!(XLA_FFI_Api_Head, error_create) + size_of::<usize>();
        let frame = XLA_FFI_CallFrame {
            struct_size: size_of::<XLA_FFI_CallFrame>(),
            extension_start: std::ptr::null_mut(),
            api: &head,
            ctx: std::ptr::null_mut(),
            stage: XLA_FFI_EXECUTION_STAGE_EXECUTE,
            args: unsafe { std::mem::zeroed() },
            rets: unsafe { std::mem::zeroed() },
            attrs: unsafe { std::mem::zeroed() },
        };
        let err = unsafe { stream_of(&frame) }.unwrap_err();
        assert!(err.contains("has no XLA_FFI_Stream_Get"), "{err}");
    }
}
