//! The one error type of the bindings.

use std::fmt;

/// Everything that can go wrong in a PJRT call, with a message a user can act on.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// The plugin returned an error: its status code and message.
    Pjrt { code: i32, message: String },
    /// The plugin file could not be opened or has no `GetPjrtApi`.
    PluginLoad { path: String, reason: String },
    /// A library a plugin needs could not be loaded: the loader's (or the
    /// file check's) reason, which is the whole message.
    LibraryLoad { library: String, reason: String },
    /// The plugin implements an older PJRT C API than the bindings need.
    PluginTooOld {
        path: String,
        found: (i32, i32),
        required: (i32, i32),
    },
    /// The plugin's function table lacks a function the call needs.
    Unsupported {
        function: &'static str,
        found: (i32, i32),
    },
    /// Input rejected before it reached the plugin.
    InvalidArgument(String),
    /// The buffer was deallocated, or donated to an earlier execution.
    DeletedBuffer,
    /// A plugin function threw a C++ exception (caught before it reached
    /// Rust): the function and the exception's message.
    PluginException {
        function: &'static str,
        what: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Whether the fault lies with the caller's input rather than the runtime.
    /// A deleted buffer is a runtime error, as it is in EXLA (another
    /// process may have deallocated it).
    pub fn is_argument_error(&self) -> bool {
        match self {
            Error::InvalidArgument(_) => true,
            Error::Pjrt { code, .. } => *code == crate::ffi::PJRT_ERROR_CODE_INVALID_ARGUMENT,
            _ => false,
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::InvalidArgument(message.into())
    }
}

/// Names of the status codes, as absl prints them.
fn code_name(code: i32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("UNKNOWN")
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Pjrt { code, message } => write!(f, "{}: {}", code_name(*code), message),
            Error::PluginLoad { path, reason } => {
                write!(f, "could not load PJRT plugin {path}: {reason}")
            }
            Error::LibraryLoad { reason, .. } => f.write_str(reason),
            Error::PluginTooOld {
                path,
                found,
                required,
            } => write!(
                f,
                "PJRT plugin {path} implements PJRT C API {}.{}, but EXLA needs {}.{} or newer; \
                 install a newer plugin",
                found.0, found.1, required.0, required.1
            ),
            Error::Unsupported { function, found } => write!(
                f,
                "the PJRT plugin (C API {}.{}) does not provide {function}",
                found.0, found.1
            ),
            Error::InvalidArgument(message) => f.write_str(message),
            Error::DeletedBuffer => f.write_str("called on deleted or donated buffer"),
            Error::PluginException { function, what } => write!(
                f,
                "the PJRT plugin threw a C++ exception in {function}: {what}"
            ),
        }
    }
}

impl std::error::Error for Error {}
