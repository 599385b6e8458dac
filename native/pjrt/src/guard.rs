//! Every call into a plugin goes through here, so that a C++ exception it
//! throws on the calling thread becomes an `Error` instead of unwinding into
//! Rust (which aborts the process). The catching is done by a small C++ shim
//! (`cpp/guard.cc`); on the normal path it costs one extra indirect call.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::MaybeUninit;

use crate::error::{Error, Result};

extern "C" {
    fn pjrt_guard_call(
        f: *const c_void,
        args: *mut c_void,
        result: *mut *mut c_void,
        what: *mut c_char,
        capacity: usize,
    ) -> c_int;
    fn pjrt_guard_call_void(
        f: *const c_void,
        args: *mut c_void,
        what: *mut c_char,
        capacity: usize,
    ) -> c_int;
    fn pjrt_guard_get(
        f: *const c_void,
        result: *mut *const c_void,
        what: *mut c_char,
        capacity: usize,
    ) -> c_int;
    fn pjrt_guard_isolate(symbol: *const c_void) -> c_int;
}

/// Whether the loaded plugin holding `symbol` unwinds with an unwinder of its
/// own (a C++ runtime linked in statically), whose exceptions the shim's
/// catch cannot see. Its calls are then made through a frame that catches
/// any exception (`cpp/guard.cc`, on Linux x86_64; elsewhere such a plugin
/// is called as the others are, and an exception it throws ends the
/// process). Errors when the plugin's code cannot be found.
pub(crate) fn isolate(symbol: *const c_void) -> std::result::Result<bool, String> {
    // SAFETY: the shim only looks `symbol` up among the loaded objects.
    match unsafe { pjrt_guard_isolate(symbol) } {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err("its code could not be found among the loaded libraries".into()),
    }
}

/// Room for the message of a caught exception.
const WHAT_CAPACITY: usize = 1024;

/// Where the shim writes an exception's message. Left uninitialized: it is
/// only written, and read, when an exception was caught, and clearing 1 KiB
/// on every call would cost more than the call itself.
type What = MaybeUninit<[u8; WHAT_CAPACITY]>;

/// `value` when the shim returned `status` 0; otherwise the error for the
/// exception it caught in `function`.
///
/// # Safety
/// A non-zero `status` must mean the shim wrote a message into `what`.
unsafe fn outcome<T>(status: c_int, function: &'static str, what: &What, value: T) -> Result<T> {
    if status == 0 {
        return Ok(value);
    }
    // SAFETY: the shim always writes a terminated string when it catches.
    let what = unsafe { CStr::from_ptr(what.as_ptr().cast()) };
    Err(Error::PluginException {
        function,
        what: what.to_string_lossy().into_owned(),
    })
}

/// Calls `f(args)`, a plugin function named `function` for errors.
///
/// # Safety
/// `f` must be a live plugin function taking `args`, and `args` must be
/// valid for it for the duration of the call.
pub(crate) unsafe fn call<A, R>(
    function: &'static str,
    f: unsafe extern "C" fn(*mut A) -> *mut R,
    args: *mut A,
) -> Result<*mut R> {
    let mut result: *mut c_void = std::ptr::null_mut();
    let mut what = What::uninit();
    // SAFETY: the shim calls `f(args)` as is (every data pointer has the
    // same representation) and writes at most WHAT_CAPACITY bytes.
    let status = unsafe {
        pjrt_guard_call(
            f as *const c_void,
            args.cast(),
            &mut result,
            what.as_mut_ptr().cast(),
            WHAT_CAPACITY,
        )
    };
    // SAFETY: the shim writes `what` whenever it reports a catch.
    unsafe { outcome(status, function, &what, result.cast()) }
}

/// Calls `f(args)` for a plugin function that returns nothing.
///
/// # Safety
/// As for `call`.
pub(crate) unsafe fn call_void<A>(
    function: &'static str,
    f: unsafe extern "C" fn(*mut A),
    args: *mut A,
) -> Result<()> {
    let mut what = What::uninit();
    // SAFETY: as in `call`.
    let status = unsafe {
        pjrt_guard_call_void(
            f as *const c_void,
            args.cast(),
            what.as_mut_ptr().cast(),
            WHAT_CAPACITY,
        )
    };
    // SAFETY: as in `call`.
    unsafe { outcome(status, function, &what, ()) }
}

/// Calls a plugin's `GetPjrtApi`.
///
/// # Safety
/// `f` must be the plugin's `GetPjrtApi`.
pub(crate) unsafe fn get_api<T>(f: unsafe extern "C" fn() -> *const T) -> Result<*const T> {
    let mut result: *const c_void = std::ptr::null();
    let mut what = What::uninit();
    // SAFETY: as in `call`.
    let status = unsafe {
        pjrt_guard_get(
            f as *const c_void,
            &mut result,
            what.as_mut_ptr().cast(),
            WHAT_CAPACITY,
        )
    };
    // SAFETY: as in `call`.
    unsafe { outcome(status, "GetPjrtApi", &what, result.cast()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn double(x: *mut i32) -> *mut i32 {
        unsafe { *x *= 2 };
        x
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn turns_a_cpp_exception_into_an_error() {
        extern "C" {
            // libstdc++'s `std::__throw_bad_alloc()`: throws std::bad_alloc.
            #[link_name = "_ZSt17__throw_bad_allocv"]
            fn throw_bad_alloc(_: *mut c_void);
        }
        let error = unsafe { call_void("thrower", throw_bad_alloc, std::ptr::null_mut()) };
        assert_eq!(
            error,
            Err(Error::PluginException {
                function: "thrower",
                what: "std::bad_alloc".into()
            })
        );
    }

    // The frame that catches the exceptions of plugins with their own
    // unwinder catches any other, here libstdc++'s through the process's
    // unwinder, and frees it.
    #[cfg(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64"))]
    #[test]
    fn the_isolated_path_turns_an_exception_into_an_error() {
        extern "C" {
            #[link_name = "_ZSt17__throw_bad_allocv"]
            fn throw_bad_alloc(_: *mut c_void);
            fn pjrt_guard_call_isolated(
                f: *const c_void,
                args: *mut c_void,
                result: *mut *mut c_void,
                what: *mut c_char,
                capacity: usize,
            ) -> c_int;
        }
        let call = |f: *const c_void, args: *mut c_void| {
            let mut result = std::ptr::null_mut();
            let mut what = What::uninit();
            let status = unsafe {
                pjrt_guard_call_isolated(
                    f,
                    args,
                    &mut result,
                    what.as_mut_ptr().cast(),
                    WHAT_CAPACITY,
                )
            };
            unsafe { outcome(status, "isolated", &what, result) }
        };
        for _ in 0..3 {
            let error = call(throw_bad_alloc as *const c_void, std::ptr::null_mut());
            assert_eq!(
                error,
                Err(Error::PluginException {
                    function: "isolated",
                    what: "an exception thrown by a plugin with its own C++ runtime \
                           (its message cannot be read) of type std::bad_alloc"
                        .into()
                })
            );
        }
        let mut value = 21;
        let out = call(double as *const c_void, (&mut value as *mut i32).cast()).unwrap();
        assert_eq!(value, 42);
        assert_eq!(out, (&mut value as *mut i32).cast());
    }

    #[test]
    fn a_plugin_on_the_process_unwinder_is_not_isolated() {
        extern "C" {
            #[link_name = "_ZSt17__throw_bad_allocv"]
            fn throw_bad_alloc(_: *mut c_void);
        }
        assert_eq!(isolate(throw_bad_alloc as *const c_void), Ok(false));
    }

    #[test]
    fn passes_arguments_and_results_through() {
        let mut value = 21;
        let out = unsafe { call("double", double, &mut value) }.unwrap();
        assert_eq!(value, 42);
        assert_eq!(out, &mut value as *mut i32);
    }
}
