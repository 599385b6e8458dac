//! Loading a PJRT plugin and calling into its function table.

use std::collections::HashMap;
use std::ffi::c_char;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::ffi::{self, args_size, PJRT_Api, PJRT_Error};
use crate::guard;

/// Oldest PJRT C API the bindings accept: the version their structs follow.
pub const MIN_API_VERSION: (i32, i32) = (ffi::PJRT_API_MAJOR, ffi::PJRT_API_MINOR);

/// A loaded plugin. Plugins are never unloaded: the library stays mapped for
/// the life of the process, because PJRT objects may outlive any handle to it.
pub struct Plugin {
    api: *const PJRT_Api,
    path: PathBuf,
    version: (i32, i32),
    /// Whether it unwinds with a C++ runtime of its own (see `guard::isolate`).
    own_unwinder: bool,
}

// SAFETY: the function table is immutable after GetPjrtApi returns and PJRT
// functions are thread-safe by contract.
unsafe impl Send for Plugin {}
unsafe impl Sync for Plugin {}

fn registry() -> &'static Mutex<HashMap<PathBuf, Arc<Plugin>>> {
    static PLUGINS: OnceLock<Mutex<HashMap<PathBuf, Arc<Plugin>>>> = OnceLock::new();
    PLUGINS.get_or_init(Default::default)
}

/// Builds a zeroed argument struct with its `struct_size` set.
macro_rules! new_args {
    ($ty:ty, $last:ident) => {{
        // SAFETY: every PJRT argument struct is plain data for which all-zero
        // bytes are valid (null pointers, zero sizes, false).
        let mut args: $ty = unsafe { std::mem::zeroed() };
        args.struct_size = $crate::ffi::args_size!($ty, $last);
        args
    }};
}
pub(crate) use new_args;

/// Calls a PJRT function by name after checking the table has it; a C++
/// exception it throws becomes an error (see `guard`).
macro_rules! call {
    ($plugin:expr, $func:ident, $args:expr) => {{
        let plugin: &$crate::plugin::Plugin = &$plugin;
        let f = plugin.function(
            std::mem::offset_of!($crate::ffi::PJRT_Api, $func),
            stringify!($func),
            plugin.api().$func,
        )?;
        // SAFETY: the arguments were built with `new_args!` and the handles in
        // them are alive for the duration of the call.
        plugin.check(unsafe { $crate::guard::call(stringify!($func), f, $args) }?)
    }};
}
pub(crate) use call;

impl Plugin {
    /// Loads the plugin at `path`, once per path for the process.
    pub fn load(path: impl AsRef<Path>) -> Result<Arc<Plugin>> {
        let path = path.as_ref();
        let load_error = |reason: String| Error::PluginLoad {
            path: path.display().to_string(),
            reason,
        };
        let canonical = path
            .canonicalize()
            .map_err(|e| load_error(format!("{e}")))?;
        let mut plugins = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(plugin) = plugins.get(&canonical) {
            return Ok(plugin.clone());
        }
        let plugin = Arc::new(Self::open(&canonical).map_err(|e| match e {
            Error::PluginLoad { reason, .. } => load_error(reason),
            other => other,
        })?);
        plugins.insert(canonical, plugin.clone());
        Ok(plugin)
    }

    fn open(path: &Path) -> Result<Plugin> {
        let load_error = |reason: String| Error::PluginLoad {
            path: path.display().to_string(),
            reason,
        };
        // A truncated or foreign file would crash the process inside dlopen.
        crate::library::check(path).map_err(load_error)?;
        // SAFETY: loading a shared library runs its initialisers; a PJRT
        // plugin is a library written for exactly this.
        let library =
            unsafe { libloading::Library::new(path) }.map_err(|e| load_error(format!("{e}")))?;
        // SAFETY: the symbol has the signature the PJRT C API defines.
        let get_api = unsafe { library.get::<ffi::GetPjrtApiFn>(b"GetPjrtApi\0") }
            .map_err(|_| load_error("it does not export GetPjrtApi: not a PJRT plugin".into()))?;
        let own_unwinder =
            guard::isolate(*get_api as *const std::ffi::c_void).map_err(load_error)?;
        // SAFETY: GetPjrtApi takes no arguments and returns a static table.
        let api = unsafe { guard::get_api(*get_api) }?;
        // Keep the library mapped forever (see `Plugin`).
        std::mem::forget(library);
        if api.is_null() {
            return Err(load_error("GetPjrtApi returned no function table".into()));
        }
        let plugin = Plugin {
            api,
            path: path.to_path_buf(),
            version: Self::read_version(api, path)?,
            own_unwinder,
        };
        plugin.initialize()?;
        Ok(plugin)
    }

    /// Reads and checks the version before any function pointer is touched.
    fn read_version(api: *const PJRT_Api, path: &Path) -> Result<(i32, i32)> {
        let load_error = |reason: String| Error::PluginLoad {
            path: path.display().to_string(),
            reason,
        };
        // SAFETY: every PJRT_Api begins with struct_size, extension_start and
        // the version struct; only those are read here.
        let struct_size = unsafe { std::ptr::addr_of!((*api).struct_size).read() };
        let version_end = std::mem::offset_of!(PJRT_Api, pjrt_api_version)
            + args_size!(ffi::PJRT_Api_Version, minor_version);
        if struct_size < version_end {
            return Err(load_error(format!(
                "its PJRT_Api is too small ({struct_size} bytes) to hold a version"
            )));
        }
        // SAFETY: struct_size covers the version fields (checked above).
        let version = unsafe { std::ptr::addr_of!((*api).pjrt_api_version).read() };
        let found = (version.major_version, version.minor_version);
        if found.0 != MIN_API_VERSION.0 || found.1 < MIN_API_VERSION.1 {
            return Err(Error::PluginTooOld {
                path: path.display().to_string(),
                found,
                required: MIN_API_VERSION,
            });
        }
        Ok(found)
    }

    fn initialize(&self) -> Result<()> {
        let mut args = new_args!(ffi::PJRT_Plugin_Initialize_Args, extension_start);
        call!(self, PJRT_Plugin_Initialize, &mut args)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the plugin carries its own C++ runtime and unwinder, so that
    /// its calls go through the frame that catches their exceptions
    /// (`guard::isolate`).
    pub fn has_own_unwinder(&self) -> bool {
        self.own_unwinder
    }

    /// The PJRT C API version the plugin implements.
    pub fn api_version(&self) -> (i32, i32) {
        self.version
    }

    pub(crate) fn api(&self) -> &PJRT_Api {
        // SAFETY: the table is static for the life of the process.
        unsafe { &*self.api }
    }

    /// Returns a function slot if the plugin's table is large enough to hold
    /// it and the slot is filled.
    pub(crate) fn function<F: Copy>(
        &self,
        offset: usize,
        name: &'static str,
        slot: Option<F>,
    ) -> Result<F> {
        let unsupported = Error::Unsupported {
            function: name,
            found: self.version,
        };
        if offset + std::mem::size_of::<usize>() > self.api().struct_size {
            return Err(unsupported);
        }
        slot.ok_or(unsupported)
    }

    /// Turns a returned `PJRT_Error*` into a `Result`, freeing the error.
    pub(crate) fn check(&self, error: *mut PJRT_Error) -> Result<()> {
        if error.is_null() {
            return Ok(());
        }
        Err(self.take_error(error))
    }

    pub(crate) fn take_error(&self, error: *mut PJRT_Error) -> Error {
        let api = self.api();
        let mut message_args = new_args!(ffi::PJRT_Error_Message_Args, message_size);
        message_args.error = error;
        let mut code_args = new_args!(ffi::PJRT_Error_GetCode_Args, code);
        code_args.error = error;
        let mut destroy_args = new_args!(ffi::PJRT_Error_Destroy_Args, error);
        destroy_args.error = error;
        // SAFETY: the three error functions are part of every PJRT version and
        // `error` is a live error owned by us until destroyed here.
        unsafe {
            let message = match api.PJRT_Error_Message {
                Some(f) => match guard::call_void("PJRT_Error_Message", f, &mut message_args) {
                    Ok(()) => string_from(message_args.message, message_args.message_size),
                    Err(thrown) => thrown.to_string(),
                },
                None => String::from("unknown PJRT error"),
            };
            let code = match api.PJRT_Error_GetCode {
                Some(f) => match guard::call("PJRT_Error_GetCode", f, &mut code_args) {
                    Ok(status) if status.is_null() => code_args.code,
                    _ => 2,
                },
                None => 2,
            };
            if let Some(f) = api.PJRT_Error_Destroy {
                let _ = guard::call_void("PJRT_Error_Destroy", f, &mut destroy_args);
            }
            Error::Pjrt { code, message }
        }
    }
}

/// Copies a (pointer, length) string owned by the plugin.
pub(crate) fn string_from(ptr: *const c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: PJRT guarantees `len` readable bytes at `ptr`.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_api(major: i32, minor: i32, struct_size: usize) -> Box<PJRT_Api> {
        // SAFETY: an all-zero table is valid (null extension, empty slots).
        let mut api: Box<PJRT_Api> = Box::new(unsafe { std::mem::zeroed() });
        api.struct_size = struct_size;
        api.pjrt_api_version.major_version = major;
        api.pjrt_api_version.minor_version = minor;
        api
    }

    #[test]
    fn refuses_old_plugins_naming_both_versions() {
        let api = fake_api(0, 40, std::mem::size_of::<PJRT_Api>());
        let err = Plugin::read_version(&*api, Path::new("old.so")).unwrap_err();
        assert_eq!(
            err,
            Error::PluginTooOld {
                path: "old.so".into(),
                found: (0, 40),
                required: MIN_API_VERSION
            }
        );
        let message = err.to_string();
        assert!(
            message.contains("0.40") && message.contains("0.81"),
            "{message}"
        );
    }

    #[test]
    fn refuses_other_major_versions_and_tiny_tables() {
        let api = fake_api(1, 0, std::mem::size_of::<PJRT_Api>());
        assert!(Plugin::read_version(&*api, Path::new("x.so")).is_err());
        let api = fake_api(0, 81, 8);
        assert!(matches!(
            Plugin::read_version(&*api, Path::new("x.so")),
            Err(Error::PluginLoad { .. })
        ));
    }

    #[test]
    fn accepts_newer_minor_versions() {
        let api = fake_api(0, 115, std::mem::size_of::<PJRT_Api>());
        assert_eq!(
            Plugin::read_version(&*api, Path::new("new.so")).unwrap(),
            (0, 115)
        );
    }

    #[test]
    fn checks_the_table_size_before_using_a_slot() {
        let plugin = Plugin {
            api: Box::leak(fake_api(0, 81, 64)),
            path: PathBuf::from("small.so"),
            version: (0, 81),
            own_unwinder: false,
        };
        let slot: Option<unsafe extern "C" fn()> = Some(dummy);
        let offset = std::mem::offset_of!(PJRT_Api, PJRT_Client_Compile);
        assert!(matches!(
            plugin.function(offset, "PJRT_Client_Compile", slot),
            Err(Error::Unsupported { .. })
        ));
        assert!(plugin.function(8, "first", slot).is_ok());
    }

    unsafe extern "C" fn dummy() {}
}
