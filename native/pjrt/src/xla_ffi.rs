//! The XLA FFI: typed custom calls that an XLA program makes into this
//! process while it runs, through one door.
//!
//! A program calls a handler with
//!
//! ```text
//! %r:N = "stablehlo.custom_call"(%a, %b) {
//!   call_target_name = "my_target", api_version = 4 : i32,
//!   backend_config = {mode = 1 : i64}
//! } : (...) -> (...)
//! ```
//!
//! and `register::<H>(plugin, platform, "my_target")` makes `H::execute`
//! serve those calls: it is handed a `Call` with the operands (read-only
//! `Buffer`s), the results (writable `BufferMut`s), the attributes
//! (`backend_config`'s entries, see `Call::attr`) and, on CUDA, the call's
//! stream. What it returns (an `FfiError`, or a panic, caught here) fails
//! the execution with its message. Handlers run on a plugin thread (on the
//! CPU plugin, one of its compute threads).
//!
//! Everything unsafe about the C API is in this file: the structures of
//! xla/ffi/api/c_api.h and xla/pjrt/c/pjrt_c_api_ffi_extension.h, declared
//! by hand only as far as they are used (checked against the copy jaxlib
//! 0.11.2 ships in `jaxlib/include`, FFI API 0.4, and an older openxla/xla
//! copy, FFI API 0.1: the fields used here are the same), each read behind
//! an accessor that checks what the C side promises (non-null pointers,
//! `struct_size` before a slot of the API table is read), as `guard.rs`
//! does for calls into the plugin.
#![allow(non_camel_case_types)]

use std::any::TypeId;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::ffi::PJRT_Extension_Base;
use crate::plugin::Plugin;

// ---- The door ----

/// The platform a handler is registered for, and how its buffers are
/// reached there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Platform {
    /// CPU plugins: buffers are host memory.
    Host,
    /// CUDA plugins: buffers are device memory, used by kernels queued on
    /// the call's stream (`Call::cuda_stream`).
    Cuda,
}

impl Platform {
    /// The platform of a client whose `PJRT_Client_PlatformName` is `name`
    /// ("cpu" for XLA's CPU plugins, "cuda" for its CUDA plugins), or None
    /// for the others (ROCm, TPU, ...), which this module has no handler
    /// entry for yet.
    pub fn from_client_name(name: &str) -> Option<Platform> {
        match name.to_ascii_lowercase().as_str() {
            "cpu" | "host" => Some(Platform::Host),
            "cuda" => Some(Platform::Cuda),
            _ => None,
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
}

/// The status codes of XLA FFI errors (absl's; those a handler may want).
/// XLA turns them into the status the execution fails with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    Cancelled,
    InvalidArgument,
    FailedPrecondition,
    ResourceExhausted,
    Internal,
}

impl ErrorCode {
    /// `XLA_FFI_Error_Code` in c_api.h.
    fn raw(self) -> c_int {
        match self {
            ErrorCode::Cancelled => 1,
            ErrorCode::InvalidArgument => 3,
            ErrorCode::ResourceExhausted => 8,
            ErrorCode::FailedPrecondition => 9,
            ErrorCode::Internal => 13,
        }
    }
}

/// Why a handler failed: the execution fails with this status and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FfiError {
    pub code: ErrorCode,
    pub message: String,
}

impl FfiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> FfiError {
        FfiError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid_argument(message: impl Into<String>) -> FfiError {
        FfiError::new(ErrorCode::InvalidArgument, message)
    }
}

/// Errors of no particular kind are internal, as host callbacks' always were.
impl From<String> for FfiError {
    fn from(message: String) -> FfiError {
        FfiError::new(ErrorCode::Internal, message)
    }
}

impl From<&str> for FfiError {
    fn from(message: &str) -> FfiError {
        FfiError::from(message.to_string())
    }
}

/// A typed FFI handler. `execute` runs in the execute stage of each call;
/// the other stages (instantiate, prepare, initialize) succeed at once.
pub trait Handler: 'static {
    /// What the handler is called in messages ("host callback").
    const NAME: &'static str;

    /// Serves one call: reads `call.args`, fills `call.rets`.
    fn execute(call: &mut Call<'_>) -> std::result::Result<(), FfiError>;
}

/// Registers `H` with `plugin` as the FFI target `target` (the
/// `call_target_name` of the programs' custom calls) for `platform`.
/// Registering the same handler again does nothing; registering another
/// handler under a target name already taken in that plugin is an error.
pub fn register<H: Handler>(plugin: &Plugin, platform: Platform, target: &str) -> Result<()> {
    type Registered = HashMap<(PathBuf, Platform, String), TypeId>;
    static REGISTERED: OnceLock<Mutex<Registered>> = OnceLock::new();
    if target.is_empty() {
        return Err(Error::invalid("an XLA FFI target name must not be empty"));
    }
    let mut registered = REGISTERED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let key = (plugin.path().to_path_buf(), platform, target.to_string());
    match registered.get(&key) {
        Some(id) if *id == TypeId::of::<H>() => return Ok(()),
        Some(_) => {
            return Err(Error::invalid(format!(
                "the XLA FFI target {target} is already registered with another handler"
            )))
        }
        None => {}
    }
    let register = find_register_handler(plugin)?;
    let platform_name = platform.ffi_name();
    let mut args = PJRT_FFI_Register_Handler_Args {
        struct_size: std::mem::size_of::<PJRT_FFI_Register_Handler_Args>(),
        target_name: target.as_ptr().cast(),
        target_name_size: target.len(),
        handler: entry::<H>(platform) as *mut c_void,
        platform_name: platform_name.as_ptr().cast(),
        platform_name_size: platform_name.len(),
        // Not command-buffer compatible: XLA:GPU must not capture the call
        // in a CUDA graph (it would run once at capture, not per execution).
        traits: 0,
    };
    // SAFETY: the arguments follow the extension's struct; the strings are
    // passed with their lengths and copied by the plugin.
    plugin.check(unsafe { crate::guard::call("register_handler", register, &mut args) }?)?;
    registered.insert(key, TypeId::of::<H>());
    Ok(())
}

/// One call of a handler: its operands, its results (distinct from the
/// operands and from each other), its attributes and its platform.
pub struct Call<'a> {
    pub args: Vec<Buffer<'a>>,
    pub rets: Vec<BufferMut<'a>>,
    frame: &'a XLA_FFI_CallFrame,
    platform: Platform,
}

/// An operand: its XLA data type (`dtype`), dimensions and bytes
/// (row-major, as `EXLA.MLIR.Ops.custom_call/6` lays them out).
#[derive(Clone, Copy)]
pub struct Buffer<'a> {
    dtype: c_int,
    dims: &'a [i64],
    data: *mut u8,
    len: usize,
    platform: Platform,
    _bytes: PhantomData<&'a [u8]>,
}

/// A result, which the handler writes.
pub struct BufferMut<'a>(Buffer<'a>);

/// An attribute of the call (an entry of the custom call's
/// `backend_config` dictionary).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Attr<'a> {
    /// A scalar: `1 : i64`, `true`, `2.5 : f32`...
    Scalar(Scalar),
    /// A string's bytes.
    String(&'a [u8]),
    /// An array (`array<i64: 1, 2>`) or a dictionary: not decoded here.
    Other,
}

/// A scalar attribute, by its XLA data type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Pred(bool),
    S32(i32),
    S64(i64),
    U32(u32),
    U64(u64),
    F32(f32),
    F64(f64),
    /// Another type, by its `XLA_FFI_DataType` code.
    Other(i32),
}

impl Scalar {
    /// The value of an integer or boolean scalar.
    pub fn as_i64(self) -> Option<i64> {
        match self {
            Scalar::Pred(b) => Some(b as i64),
            Scalar::S32(v) => Some(v.into()),
            Scalar::S64(v) => Some(v),
            Scalar::U32(v) => Some(v.into()),
            Scalar::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }
}

/// The `XLA_FFI_DataType` codes of c_api.h (xla_data.proto's
/// `PrimitiveType`), as `Buffer::dtype` gives them.
pub mod dtype {
    pub const PRED: i32 = 1;
    pub const S8: i32 = 2;
    pub const S16: i32 = 3;
    pub const S32: i32 = 4;
    pub const S64: i32 = 5;
    pub const U8: i32 = 6;
    pub const U16: i32 = 7;
    pub const U32: i32 = 8;
    pub const U64: i32 = 9;
    pub const F16: i32 = 10;
    pub const F32: i32 = 11;
    pub const F64: i32 = 12;
    pub const C64: i32 = 15;
    pub const BF16: i32 = 16;
    pub const C128: i32 = 18;
}

impl<'a> Call<'a> {
    /// The platform the handler was registered for.
    pub fn platform(&self) -> Platform {
        self.platform
    }

    /// The attribute `name`, if the call has it.
    pub fn attr(&self, name: &str) -> Option<Attr<'a>> {
        let attrs = &self.frame.attrs;
        let n = usize::try_from(attrs.size).ok().filter(|n| *n > 0)?;
        if attrs.types.is_null() || attrs.names.is_null() || attrs.attrs.is_null() {
            return None;
        }
        // SAFETY: XLA passes `size` types, names and attributes, valid for
        // the call (checked non-null above).
        let (types, names, values) = unsafe {
            (
                std::slice::from_raw_parts(attrs.types, n),
                std::slice::from_raw_parts(attrs.names, n),
                std::slice::from_raw_parts(attrs.attrs, n),
            )
        };
        let index = names
            .iter()
            .position(|span| byte_span(*span) == Some(name.as_bytes()))?;
        let value = values[index];
        if value.is_null() {
            return None;
        }
        match types[index] {
            XLA_FFI_ATTR_SCALAR => {
                // SAFETY: a scalar attribute points to an XLA_FFI_Scalar.
                let scalar = unsafe { &*value.cast::<XLA_FFI_Scalar>() };
                Some(Attr::Scalar(read_scalar(scalar)))
            }
            XLA_FFI_ATTR_STRING => byte_span(value.cast::<XLA_FFI_ByteSpan>()).map(Attr::String),
            _ => Some(Attr::Other),
        }
    }

    /// The integer attribute `name` (an integer or boolean scalar).
    pub fn attr_i64(&self, name: &str) -> std::result::Result<i64, FfiError> {
        match self.attr(name) {
            Some(Attr::Scalar(scalar)) => scalar.as_i64(),
            _ => None,
        }
        .ok_or_else(|| {
            FfiError::invalid_argument(format!("the call has no integer attribute {name}"))
        })
    }

    /// The call's CUDA stream, from `XLA_FFI_Stream_Get` (a `CUstream` on
    /// the CUDA platform, c_api.h).
    pub fn cuda_stream(&self) -> std::result::Result<*mut c_void, FfiError> {
        if self.platform != Platform::Cuda {
            return Err("the call has no CUDA stream (not on CUDA)".into());
        }
        let api = Api::of(self.frame).ok_or("the call frame has no XLA FFI API")?;
        let get = api
            .stream_get()
            .ok_or("the XLA FFI API table has no XLA_FFI_Stream_Get")?;
        let mut args = XLA_FFI_Stream_Get_Args {
            struct_size: std::mem::size_of::<XLA_FFI_Stream_Get_Args>(),
            extension_start: std::ptr::null_mut(),
            ctx: self.frame.ctx,
            stream: std::ptr::null_mut(),
        };
        // SAFETY: the arguments follow c_api.h; XLA writes the stream.
        let error = unsafe { crate::guard::call("XLA_FFI_Stream_Get", get, &mut args) }
            .map_err(|e| e.to_string())?;
        if !error.is_null() {
            api.destroy_error(error);
            return Err("XLA_FFI_Stream_Get failed (no CUDA stream for the call)".into());
        }
        if args.stream.is_null() {
            // The null CUstream is CUDA's legacy default stream, which XLA's
            // non-blocking streams are not ordered with: copies there could
            // race the kernels, so refuse rather than guess.
            return Err("XLA_FFI_Stream_Get gave no CUDA stream".into());
        }
        Ok(args.stream)
    }
}

impl<'a> Buffer<'a> {
    /// The XLA data type code (see `dtype`).
    pub fn dtype(&self) -> i32 {
        self.dtype
    }

    pub fn dims(&self) -> &'a [i64] {
        self.dims
    }

    /// The size in bytes (sub-byte types packed).
    pub fn byte_len(&self) -> usize {
        self.len
    }

    /// The bytes, where they are host memory (on the host platform).
    pub fn host_bytes(&self) -> std::result::Result<&'a [u8], FfiError> {
        if self.platform != Platform::Host {
            return Err("the buffer is device memory, not host memory".into());
        }
        if self.len == 0 {
            return Ok(&[]);
        }
        // SAFETY: on the host, `data` holds `len` bytes (checked non-null
        // when decoded) that XLA keeps readable, and does not write, during
        // the call; results are distinct from operands.
        Ok(unsafe { std::slice::from_raw_parts(self.data, self.len) })
    }

    /// The buffer's address in its platform's memory (device memory on
    /// CUDA), for copies through that platform's own API.
    pub fn address(&self) -> usize {
        self.data as usize
    }
}

impl<'a> BufferMut<'a> {
    /// The result's type, dimensions, size and address.
    pub fn buffer(&self) -> &Buffer<'a> {
        &self.0
    }

    /// The bytes to write, where they are host memory (on the host).
    pub fn host_bytes_mut(&mut self) -> std::result::Result<&mut [u8], FfiError> {
        let raw = &self.0;
        if raw.platform != Platform::Host {
            return Err("the buffer is device memory, not host memory".into());
        }
        if raw.len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: result buffers are writable host memory of `len` bytes,
        // distinct from the operands and from each other, for the duration
        // of the call; the slice borrows `self` mutably, so it is the only
        // one into this result.
        Ok(unsafe { std::slice::from_raw_parts_mut(raw.data, raw.len) })
    }
}

/// The bytes of `count` elements of an XLA FFI data type in a buffer.
/// Sub-byte integers come packed, `8 / bits` elements per byte.
pub fn byte_len(dtype: i32, count: usize) -> std::result::Result<usize, String> {
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
            "XLA FFI calls do not support XLA data type {other}"
        )),
    }
}

// ---- Serving a call ----

/// The handler entry for `H` on `platform`: one function per handler and
/// platform, since the C API hands the entry nothing but the call frame.
fn entry<H: Handler>(platform: Platform) -> XLA_FFI_Handler {
    match platform {
        Platform::Host => host_entry::<H>,
        Platform::Cuda => cuda_entry::<H>,
    }
}

/// # Safety
/// XLA calls it with a call frame valid during the call (or null).
unsafe extern "C" fn host_entry<H: Handler>(frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
    // SAFETY: XLA passes a valid call frame (or null) for the call.
    unsafe { serve::<H>(frame, Platform::Host) }
}

/// # Safety
/// As `host_entry`.
unsafe extern "C" fn cuda_entry<H: Handler>(frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
    // SAFETY: XLA passes a valid call frame (or null) for the call.
    unsafe { serve::<H>(frame, Platform::Cuda) }
}

/// What every entry does: answer metadata queries, succeed at once in the
/// stages other than execute (instantiate, prepare, initialize, and the
/// command-buffer record stage of newer XLA, never used for a handler
/// without the command-buffer trait), and run `H::execute` in the execute
/// stage, turning its error or panic into an XLA FFI error.
///
/// # Safety
/// `frame` is null or a call frame XLA keeps valid during the call.
unsafe fn serve<H: Handler>(
    frame: *mut XLA_FFI_CallFrame,
    platform: Platform,
) -> *mut XLA_FFI_Error {
    if frame.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: XLA passes a valid call frame for the duration of the call.
    let frame = unsafe { &*frame };
    if answer_metadata(frame) || frame.stage != XLA_FFI_EXECUTION_STAGE_EXECUTE {
        return std::ptr::null_mut();
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let mut call = Call {
            args: buffers(&frame.args, "operands", platform)?,
            rets: buffers(&frame.rets, "results", platform)?
                .into_iter()
                .map(BufferMut)
                .collect(),
            frame,
            platform,
        };
        H::execute(&mut call)
    }));
    let error = match outcome {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(error)) => error,
        Err(panic) => FfiError::from(format!("{} panicked: {}", H::NAME, panic_message(&panic))),
    };
    Api::of(frame).map_or(std::ptr::null_mut(), |api| api.create_error(&error))
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

/// Answers XLA's metadata query (FFI API version 0.1, no traits), if the
/// frame is one. XLA versions differ on whether `XLA_FFI_Metadata` has an
/// `extension_start` field; its `struct_size` tells which layout the
/// caller uses.
fn answer_metadata(frame: &XLA_FFI_CallFrame) -> bool {
    let ext = frame.extension_start;
    // SAFETY: a non-null extension_start points to the extension XLA
    // attached to the frame, which begins with XLA_FFI_Extension_Base.
    if ext.is_null() || unsafe { (*ext).type_ } != XLA_FFI_EXTENSION_METADATA {
        return false;
    }
    // SAFETY: an extension of the metadata type is a metadata extension.
    let metadata = unsafe { (*ext.cast::<XLA_FFI_Metadata_Extension>()).metadata }.cast::<u8>();
    if metadata.is_null() {
        return true;
    }
    // SAFETY: XLA_FFI_Metadata begins with its struct_size.
    let struct_size = unsafe { metadata.cast::<usize>().read_unaligned() };
    let version_size = std::mem::size_of::<XLA_FFI_Api_Version>();
    let with_extension = 2 * std::mem::size_of::<usize>() + version_size + 4;
    let version_offset = if struct_size >= with_extension {
        2 * std::mem::size_of::<usize>()
    } else {
        std::mem::size_of::<usize>()
    };
    // SAFETY: `struct_size` says which layout the struct has; both have an
    // XLA_FFI_Api_Version at `version_offset` followed by the traits, which
    // XLA lets the handler write.
    unsafe {
        let version = metadata.add(version_offset).cast::<XLA_FFI_Api_Version>();
        std::ptr::addr_of_mut!((*version).major_version).write_unaligned(0);
        std::ptr::addr_of_mut!((*version).minor_version).write_unaligned(1);
        metadata
            .add(version_offset + version_size)
            .cast::<u32>()
            .write_unaligned(0);
    }
    true
}

/// The bytes of a byte span (a name or a string attribute), or None where
/// the span or its bytes are null.
fn byte_span<'a>(span: *const XLA_FFI_ByteSpan) -> Option<&'a [u8]> {
    if span.is_null() {
        return None;
    }
    // SAFETY: XLA's spans (non-null) are valid for the call.
    let span = unsafe { &*span };
    if span.len == 0 {
        return Some(&[]);
    }
    if span.ptr.is_null() {
        return None;
    }
    // SAFETY: a span holds `len` readable bytes at `ptr`.
    Some(unsafe { std::slice::from_raw_parts(span.ptr.cast::<u8>(), span.len) })
}

fn read_scalar(scalar: &XLA_FFI_Scalar) -> Scalar {
    let value = scalar.value;
    if value.is_null() {
        return Scalar::Other(scalar.dtype);
    }
    // SAFETY: a scalar's value points to one value of its dtype.
    unsafe {
        match scalar.dtype {
            dtype::PRED => Scalar::Pred(value.cast::<u8>().read() != 0),
            dtype::S32 => Scalar::S32(value.cast::<i32>().read_unaligned()),
            dtype::S64 => Scalar::S64(value.cast::<i64>().read_unaligned()),
            dtype::U32 => Scalar::U32(value.cast::<u32>().read_unaligned()),
            dtype::U64 => Scalar::U64(value.cast::<u64>().read_unaligned()),
            dtype::F32 => Scalar::F32(value.cast::<f32>().read_unaligned()),
            dtype::F64 => Scalar::F64(value.cast::<f64>().read_unaligned()),
            other => Scalar::Other(other),
        }
    }
}

/// The buffers of a call frame's operand or result list.
fn buffers<'a>(
    list: &'a XLA_FFI_List,
    what: &str,
    platform: Platform,
) -> std::result::Result<Vec<Buffer<'a>>, FfiError> {
    let n = usize::try_from(list.size).map_err(|_| format!("bad {what} count"))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    if list.types.is_null() || list.items.is_null() {
        return Err(format!("the call frame has no {what}").into());
    }
    // SAFETY: XLA passes `size` types and items, valid for the call.
    let (types, items) = unsafe {
        (
            std::slice::from_raw_parts(list.types, n),
            std::slice::from_raw_parts(list.items, n),
        )
    };
    let mut out = Vec::with_capacity(n);
    for (ty, item) in types.iter().zip(items) {
        if *ty != XLA_FFI_BUFFER || item.is_null() {
            return Err(format!("the call's {what} must be buffers").into());
        }
        // SAFETY: an item of the buffer type is an XLA_FFI_Buffer.
        let buffer = unsafe { &*item.cast::<XLA_FFI_Buffer>() };
        let rank = usize::try_from(buffer.rank).map_err(|_| "bad rank".to_string())?;
        let dims = if rank == 0 || buffer.dims.is_null() {
            &[][..]
        } else {
            // SAFETY: a buffer has `rank` dimensions.
            unsafe { std::slice::from_raw_parts(buffer.dims, rank) }
        };
        let count: i64 = dims.iter().product();
        let count = usize::try_from(count).map_err(|_| "bad dimensions".to_string())?;
        let len = byte_len(buffer.dtype, count)?;
        if len > 0 && buffer.data.is_null() {
            return Err(format!("one of the call's {what} has no data").into());
        }
        out.push(Buffer {
            dtype: buffer.dtype,
            dims,
            data: buffer.data.cast(),
            len,
            platform,
            _bytes: PhantomData,
        });
    }
    Ok(out)
}

/// The caller's `XLA_FFI_Api` table, whose slots are read only after its
/// `struct_size` says it has them (an older XLA's table may be shorter than
/// `XLA_FFI_Api_Head`), and only through raw pointers.
#[derive(Clone, Copy)]
struct Api(*const XLA_FFI_Api_Head);

macro_rules! slot {
    ($api:expr, $field:ident) => {{
        let end = std::mem::offset_of!(XLA_FFI_Api_Head, $field) + std::mem::size_of::<usize>();
        // SAFETY: `Api` holds a non-null table valid for the call, which
        // begins with its struct_size; the slot is read only when the table
        // is long enough to hold it.
        unsafe {
            if std::ptr::addr_of!((*$api.0).struct_size).read() >= end {
                std::ptr::addr_of!((*$api.0).$field).read()
            } else {
                None
            }
        }
    }};
}

impl Api {
    fn of(frame: &XLA_FFI_CallFrame) -> Option<Api> {
        (!frame.api.is_null()).then_some(Api(frame.api))
    }

    fn stream_get(self) -> Option<XLA_FFI_Stream_Get> {
        slot!(self, stream_get)
    }

    /// An XLA error for `error` (null where the table cannot make one:
    /// the call then succeeds, which only an XLA without Error_Create
    /// could cause).
    fn create_error(self, error: &FfiError) -> *mut XLA_FFI_Error {
        let Some(create) = slot!(self, error_create) else {
            return std::ptr::null_mut();
        };
        let text = CString::new(error.message.replace('\0', " ")).unwrap_or_default();
        let mut args = XLA_FFI_Error_Create_Args {
            struct_size: std::mem::size_of::<XLA_FFI_Error_Create_Args>(),
            extension_start: std::ptr::null_mut(),
            message: text.as_ptr(),
            errc: error.code.raw(),
        };
        // SAFETY: XLA copies the message into the error it creates.
        unsafe { crate::guard::call("XLA_FFI_Error_Create", create, &mut args) }
            .unwrap_or(std::ptr::null_mut())
    }

    /// Destroys an error an XLA FFI API function returned (leaks it where
    /// the table has no XLA_FFI_Error_Destroy).
    fn destroy_error(self, error: *mut XLA_FFI_Error) {
        if let Some(destroy) = slot!(self, error_destroy) {
            let mut args = XLA_FFI_Error_Destroy_Args {
                struct_size: std::mem::size_of::<XLA_FFI_Error_Destroy_Args>(),
                extension_start: std::ptr::null_mut(),
                error,
            };
            // SAFETY: the arguments follow c_api.h; `error` is XLA's, handed
            // over to be destroyed, once.
            let _ = unsafe { crate::guard::call_void("XLA_FFI_Error_Destroy", destroy, &mut args) };
        }
    }
}

fn find_register_handler(plugin: &Plugin) -> Result<PJRT_FFI_Register_Handler> {
    let unsupported = || {
        Error::invalid(format!(
            "the plugin {} cannot run XLA FFI calls such as host callbacks \
             (no PJRT FFI extension with register_handler)",
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
struct XLA_FFI_ByteSpan {
    ptr: *const c_char,
    len: usize,
}

#[repr(C)]
struct XLA_FFI_Scalar {
    dtype: c_int,
    value: *mut c_void,
}

#[repr(C)]
struct XLA_FFI_Attrs {
    struct_size: usize,
    extension_start: *mut XLA_FFI_Extension_Base,
    size: i64,
    types: *const c_int,
    names: *const *const XLA_FFI_ByteSpan,
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
const XLA_FFI_ATTR_SCALAR: c_int = 3;
const XLA_FFI_ATTR_STRING: c_int = 4;
const XLA_FFI_EXECUTION_STAGE_EXECUTE: c_int = 3;

// ---- PJRT FFI extension (xla/pjrt/c/pjrt_c_api_ffi_extension.h) ----

/// `PJRT_Extension_Type_FFI` in the PJRT extension enum.
const PJRT_EXTENSION_TYPE_FFI: c_int = 5;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn the_platform_comes_from_the_client_name() {
        for name in ["cpu", "CPU", "host"] {
            assert_eq!(Platform::from_client_name(name), Some(Platform::Host));
        }
        assert_eq!(Platform::from_client_name("cuda"), Some(Platform::Cuda));
        assert_eq!(Platform::from_client_name("rocm"), None);
        assert_eq!(Platform::Host.ffi_name(), "Host");
        assert_eq!(Platform::Cuda.ffi_name(), "CUDA");
    }

    struct Nothing;

    impl Handler for Nothing {
        const NAME: &'static str = "nothing";
        fn execute(_: &mut Call<'_>) -> std::result::Result<(), FfiError> {
            Ok(())
        }
    }

    #[test]
    fn each_platform_has_its_own_entry() {
        assert_ne!(
            entry::<Nothing>(Platform::Host) as usize,
            entry::<Nothing>(Platform::Cuda) as usize
        );
    }

    /// The offsets the entries rely on, on 64-bit hosts, as the field order
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
        // XLA_FFI_Attrs: struct_size, extension_start, size, types, names, attrs.
        assert_eq!(offset_of!(XLA_FFI_Attrs, names), 32);
        assert_eq!(size_of::<XLA_FFI_Attrs>(), 48);
        // XLA_FFI_Scalar: dtype, value; XLA_FFI_ByteSpan: ptr, len.
        assert_eq!(offset_of!(XLA_FFI_Scalar, value), 8);
        assert_eq!(size_of::<XLA_FFI_ByteSpan>(), 16);
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

    fn empty_list() -> XLA_FFI_List {
        XLA_FFI_List {
            struct_size: size_of::<XLA_FFI_List>(),
            extension_start: std::ptr::null_mut(),
            size: 0,
            types: std::ptr::null(),
            items: std::ptr::null(),
        }
    }

    /// A frame with `api`, `attrs` and no buffers.
    fn frame(api: *const XLA_FFI_Api_Head, attrs: XLA_FFI_Attrs) -> XLA_FFI_CallFrame {
        XLA_FFI_CallFrame {
            struct_size: size_of::<XLA_FFI_CallFrame>(),
            extension_start: std::ptr::null_mut(),
            api,
            ctx: std::ptr::null_mut(),
            stage: XLA_FFI_EXECUTION_STAGE_EXECUTE,
            args: empty_list(),
            rets: empty_list(),
            attrs,
        }
    }

    fn no_attrs() -> XLA_FFI_Attrs {
        XLA_FFI_Attrs {
            struct_size: size_of::<XLA_FFI_Attrs>(),
            extension_start: std::ptr::null_mut(),
            size: 0,
            types: std::ptr::null(),
            names: std::ptr::null(),
            attrs: std::ptr::null(),
        }
    }

    fn call<'a>(frame: &'a XLA_FFI_CallFrame, platform: Platform) -> Call<'a> {
        Call {
            args: Vec::new(),
            rets: Vec::new(),
            frame,
            platform,
        }
    }

    #[test]
    fn a_short_api_table_has_no_stream_get() {
        // A table that ends after Error_Create: the stream slot is not read.
        // SAFETY: the head is plain data (pointers and options of function
        // pointers), for which all zeros is valid.
        let mut head: XLA_FFI_Api_Head = unsafe { std::mem::zeroed() };
        head.struct_size = offset_of!(XLA_FFI_Api_Head, error_create) + size_of::<usize>();
        let frame = frame(&head, no_attrs());
        let err = call(&frame, Platform::Cuda).cuda_stream().unwrap_err();
        assert!(err.message.contains("has no XLA_FFI_Stream_Get"), "{err:?}");
        let err = call(&frame, Platform::Host).cuda_stream().unwrap_err();
        assert!(err.message.contains("not on CUDA"), "{err:?}");
    }

    #[test]
    fn attributes_are_found_by_name() {
        let (mode_name, label_name) = ("mode", "label");
        let spans = [
            XLA_FFI_ByteSpan {
                ptr: label_name.as_ptr().cast(),
                len: label_name.len(),
            },
            XLA_FFI_ByteSpan {
                ptr: mode_name.as_ptr().cast(),
                len: mode_name.len(),
            },
        ];
        let names: [*const XLA_FFI_ByteSpan; 2] = [&spans[0], &spans[1]];
        let text = "qr";
        let mut label = XLA_FFI_ByteSpan {
            ptr: text.as_ptr().cast(),
            len: text.len(),
        };
        let mut value = 2i64;
        let mut mode = XLA_FFI_Scalar {
            dtype: dtype::S64,
            value: (&mut value as *mut i64).cast(),
        };
        let types = [XLA_FFI_ATTR_STRING, XLA_FFI_ATTR_SCALAR];
        let values: [*mut c_void; 2] = [
            (&mut label as *mut XLA_FFI_ByteSpan).cast(),
            (&mut mode as *mut XLA_FFI_Scalar).cast(),
        ];
        let attrs = XLA_FFI_Attrs {
            size: 2,
            types: types.as_ptr(),
            names: names.as_ptr(),
            attrs: values.as_ptr(),
            ..no_attrs()
        };
        let frame = frame(std::ptr::null(), attrs);
        let call = call(&frame, Platform::Host);
        assert_eq!(call.attr("mode"), Some(Attr::Scalar(Scalar::S64(2))));
        assert_eq!(call.attr_i64("mode"), Ok(2));
        assert_eq!(call.attr("label"), Some(Attr::String(b"qr")));
        assert_eq!(call.attr("other"), None);
        assert!(call.attr_i64("label").is_err());
    }

    #[test]
    fn byte_lengths_pack_sub_byte_types() {
        assert_eq!(byte_len(dtype::F32, 3), Ok(12));
        assert_eq!(byte_len(dtype::C128, 2), Ok(32));
        assert_eq!(byte_len(21, 3), Ok(2));
        assert!(byte_len(17, 1).is_err());
    }
}
