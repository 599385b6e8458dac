//! Clients and their devices; compiling programs and creating buffers.

use std::ffi::c_char;
use std::sync::Arc;

use crate::buffer::Buffer;
use crate::compile_options::{CompileOptions, OptionOverride};
use crate::error::{Error, Result};
use crate::executable::LoadedExecutable;
use crate::ffi::{self, PJRT_Client, PJRT_Device};
use crate::plugin::{call, new_args, string_from, Plugin};
use crate::types::Shape;

/// A typed value for `PJRT_Client_Create`. Plugins abort on a value of the
/// wrong type, so callers must pick the variant the plugin documents.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    String(String),
    Int64(i64),
    Int64List(Vec<i64>),
    Float(f32),
    Bool(bool),
}

/// Create options whose type is known across the CPU and GPU plugins. The
/// CPU plugins abort the process when one of these has another type, so a
/// mismatch is refused before the plugin sees it. Unknown names pass through.
const KNOWN_OPTION_TYPES: &[(&str, OptionKind)] = &[
    ("cpu_device_count", OptionKind::Int64),
    ("asynchronous", OptionKind::Bool),
    ("preallocate", OptionKind::Bool),
    ("memory_fraction", OptionKind::Float),
    ("allocator", OptionKind::String),
    ("visible_devices", OptionKind::Int64List),
    ("node_id", OptionKind::Int64),
    ("num_nodes", OptionKind::Int64),
    ("platform_name", OptionKind::String),
    ("collective_memory_size", OptionKind::Int64),
    ("should_stage_host_to_device_transfers", OptionKind::Bool),
    ("enable_mock_nccl", OptionKind::Bool),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OptionKind {
    String,
    Int64,
    Int64List,
    Float,
    Bool,
}

impl OptionValue {
    fn kind(&self) -> OptionKind {
        match self {
            OptionValue::String(_) => OptionKind::String,
            OptionValue::Int64(_) => OptionKind::Int64,
            OptionValue::Int64List(_) => OptionKind::Int64List,
            OptionValue::Float(_) => OptionKind::Float,
            OptionValue::Bool(_) => OptionKind::Bool,
        }
    }
}

fn check_option(name: &str, value: &OptionValue) -> Result<()> {
    let known = KNOWN_OPTION_TYPES.iter().find(|(known, _)| *known == name);
    match known {
        Some((_, kind)) if *kind != value.kind() => Err(Error::invalid(format!(
            "client option {name} must be of type {kind:?}, got {:?}",
            value.kind()
        ))),
        _ if name == "cpu_device_count" && !matches!(value, OptionValue::Int64(1..=1024)) => {
            Err(Error::invalid(format!(
                "cpu_device_count must be between 1 and 1024, got {value:?}"
            )))
        }
        _ => Ok(()),
    }
}

/// Create options whose name starts with this prefix are not given to the
/// plugin: the rest of the name is an XLA `DebugOptions` field (such as
/// `xla_cpu_use_xnnpack`) that every compilation on the client overrides
/// with the value (through `CompileOptionsProto.env_option_overrides`).
pub const COMPILE_OPTION_PREFIX: &str = "compile:";

/// Named create options, and named compile option overrides.
type CreateOptions = Vec<(String, OptionValue)>;
type CompileOverrides = Vec<(String, OptionOverride)>;

/// Splits the compile option overrides from the plugin's create options.
fn split_compile_options(
    options: &[(String, OptionValue)],
) -> Result<(CreateOptions, CompileOverrides)> {
    let mut create = Vec::with_capacity(options.len());
    let mut compile = Vec::new();
    for (name, value) in options {
        let Some(field) = name.strip_prefix(COMPILE_OPTION_PREFIX) else {
            create.push((name.clone(), value.clone()));
            continue;
        };
        if field.is_empty() {
            return Err(Error::invalid(format!(
                "the compile option {name:?} lacks a field name"
            )));
        }
        let value = match value {
            OptionValue::String(s) => OptionOverride::String(s.clone()),
            OptionValue::Int64(i) => OptionOverride::Int(*i),
            OptionValue::Float(f) => OptionOverride::Double(f64::from(*f)),
            OptionValue::Bool(b) => OptionOverride::Bool(*b),
            OptionValue::Int64List(_) => {
                return Err(Error::invalid(format!(
                    "the compile option {name:?} cannot be a list"
                )))
            }
        };
        compile.retain(|(known, _): &(String, OptionOverride)| known != field);
        compile.push((field.to_string(), value));
    }
    Ok((create, compile))
}

/// One addressable device of a client.
#[derive(Debug)]
pub struct Device {
    raw: *mut PJRT_Device,
    /// The runtime's global id of the device.
    pub id: i32,
    pub kind: String,
}

/// An owned `PJRT_Client`, destroyed when the last handle (including every
/// buffer and executable made from it) is dropped.
pub struct Client {
    plugin: Arc<Plugin>,
    raw: *mut PJRT_Client,
    devices: Vec<Device>,
    platform_name: String,
    platform_version: String,
    compile_overrides: CompileOverrides,
}

// SAFETY: PJRT clients are thread-safe; the device list is immutable.
unsafe impl Send for Client {}
unsafe impl Sync for Client {}

impl Client {
    /// Creates a client with typed create options. Options named
    /// `compile:<field>` are compile option overrides (see
    /// `COMPILE_OPTION_PREFIX`), kept by the client instead.
    pub fn create(plugin: &Arc<Plugin>, options: &[(String, OptionValue)]) -> Result<Arc<Client>> {
        let (options, compile_overrides) = split_compile_options(options)?;
        let named = NamedValues::new(&options)?;
        let mut args = new_args!(ffi::PJRT_Client_Create_Args, kv_try_get_user_arg);
        args.create_options = named.values.as_ptr();
        args.num_options = named.values.len();
        call!(plugin, PJRT_Client_Create, &mut args)?;
        let mut client = Client {
            plugin: plugin.clone(),
            raw: args.client,
            devices: Vec::new(),
            platform_name: String::new(),
            platform_version: String::new(),
            compile_overrides,
        };
        // If any query fails, dropping `client` destroys the PJRT client.
        client.platform_name = client.query_platform_name()?;
        if client.platform_name.eq_ignore_ascii_case("cpu") {
            host_heap::keep_freed_memory();
        }
        client.platform_version = client.query_platform_version()?;
        client.devices = client.query_devices()?;
        Ok(Arc::new(client))
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    pub fn platform_name(&self) -> &str {
        &self.platform_name
    }

    pub fn platform_version(&self) -> &str {
        &self.platform_version
    }

    /// The XLA debug options every compilation on this client overrides.
    pub fn compile_overrides(&self) -> &[(String, OptionOverride)] {
        &self.compile_overrides
    }

    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The device at `index` in the addressable devices, or a clear error.
    pub fn device(&self, index: usize) -> Result<&Device> {
        self.devices.get(index).ok_or_else(|| {
            Error::invalid(format!(
                "device id {index} is out of range: the client has {} device(s)",
                self.devices.len()
            ))
        })
    }

    pub(crate) fn device_raw(&self, index: usize) -> Result<*mut PJRT_Device> {
        self.device(index).map(|d| d.raw)
    }

    fn query_platform_name(&self) -> Result<String> {
        let mut args = new_args!(ffi::PJRT_Client_PlatformName_Args, platform_name_size);
        args.client = self.raw;
        call!(self.plugin, PJRT_Client_PlatformName, &mut args)?;
        Ok(string_from(args.platform_name, args.platform_name_size))
    }

    fn query_platform_version(&self) -> Result<String> {
        let mut args = new_args!(ffi::PJRT_Client_PlatformVersion_Args, platform_version_size);
        args.client = self.raw;
        call!(self.plugin, PJRT_Client_PlatformVersion, &mut args)?;
        Ok(string_from(
            args.platform_version,
            args.platform_version_size,
        ))
    }

    fn query_devices(&self) -> Result<Vec<Device>> {
        let mut args = new_args!(
            ffi::PJRT_Client_AddressableDevices_Args,
            num_addressable_devices
        );
        args.client = self.raw;
        call!(self.plugin, PJRT_Client_AddressableDevices, &mut args)?;
        let raws: &[*mut PJRT_Device] = if args.num_addressable_devices == 0 {
            &[]
        } else {
            // SAFETY: the client owns this array for its lifetime.
            unsafe {
                std::slice::from_raw_parts(args.addressable_devices, args.num_addressable_devices)
            }
        };
        raws.iter().map(|raw| self.describe_device(*raw)).collect()
    }

    fn describe_device(&self, raw: *mut PJRT_Device) -> Result<Device> {
        let mut desc = new_args!(ffi::PJRT_Device_GetDescription_Args, device_description);
        desc.device = raw;
        call!(self.plugin, PJRT_Device_GetDescription, &mut desc)?;
        let mut id = new_args!(ffi::PJRT_DeviceDescription_Id_Args, id);
        id.device_description = desc.device_description;
        call!(self.plugin, PJRT_DeviceDescription_Id, &mut id)?;
        let mut kind = new_args!(ffi::PJRT_DeviceDescription_Kind_Args, device_kind_size);
        kind.device_description = desc.device_description;
        call!(self.plugin, PJRT_DeviceDescription_Kind, &mut kind)?;
        Ok(Device {
            raw,
            id: id.id,
            kind: string_from(kind.device_kind, kind.device_kind_size),
        })
    }

    /// Compiles StableHLO MLIR text (format "mlir") for the device at index
    /// `device`.
    pub fn compile(
        self: &Arc<Self>,
        mlir: &[u8],
        device: usize,
        options: &CompileOptions,
    ) -> Result<LoadedExecutable> {
        if mlir.is_empty() {
            return Err(Error::invalid("the MLIR program is empty"));
        }
        let ordinal = i64::from(self.device(device)?.id);
        // XLA builds a device assignment of replicas x partitions before it
        // looks at anything else; huge counts would exhaust memory.
        let devices = self.devices.len() as i64;
        if options.num_replicas.saturating_mul(options.num_partitions) > devices {
            return Err(Error::invalid(format!(
                "num_replicas ({}) times num_partitions ({}) exceeds the {devices} device(s) of the client",
                options.num_replicas, options.num_partitions
            )));
        }
        let encoded = CompileOptions {
            device_ordinal: ordinal,
            ..*options
        }
        .encode_with_overrides(&self.compile_overrides)?;
        let format = b"mlir";
        let mut program = new_args!(ffi::PJRT_Program, format_size);
        // The plugin only reads `code` when compiling.
        program.code = mlir.as_ptr() as *mut c_char;
        program.code_size = mlir.len();
        program.format = format.as_ptr().cast();
        program.format_size = format.len();
        let mut args = new_args!(ffi::PJRT_Client_Compile_Args, executable);
        args.client = self.raw;
        args.program = &program;
        args.compile_options = encoded.as_ptr().cast();
        args.compile_options_size = encoded.len();
        call!(self.plugin, PJRT_Client_Compile, &mut args)?;
        LoadedExecutable::from_raw(self, args.executable, device)
    }

    /// Loads an executable serialized by `Executable::serialize`, to run on
    /// the device at index `device` (the one it was compiled for).
    pub fn deserialize(self: &Arc<Self>, bytes: &[u8], device: usize) -> Result<LoadedExecutable> {
        self.device(device)?;
        if bytes.is_empty() {
            return Err(Error::invalid("the serialized executable is empty"));
        }
        let mut args = new_args!(
            ffi::PJRT_Executable_DeserializeAndLoad_Args,
            overridden_serialized_compile_options_size
        );
        args.client = self.raw;
        args.serialized_executable = bytes.as_ptr().cast();
        args.serialized_executable_size = bytes.len();
        call!(self.plugin, PJRT_Executable_DeserializeAndLoad, &mut args)?;
        LoadedExecutable::from_raw(self, args.loaded_executable, device)
    }

    /// Copies `data` into a new buffer of `shape` on the device at `device`.
    pub fn buffer_from_host(
        self: &Arc<Self>,
        data: &[u8],
        shape: &Shape,
        device: usize,
    ) -> Result<Buffer> {
        let expected = shape.byte_size()?;
        if data.len() != expected {
            return Err(Error::invalid(format!(
                "expected {expected} bytes for a tensor of shape {:?} and type {:?}, got {}",
                shape.dims,
                shape.element_type,
                data.len()
            )));
        }
        let mut args = new_args!(ffi::PJRT_Client_BufferFromHostBuffer_Args, buffer);
        args.client = self.raw;
        args.data = data.as_ptr().cast();
        args.type_ = shape.element_type.code();
        args.dims = shape.dims.as_ptr();
        args.num_dims = shape.dims.len();
        // The data is copied during the call, so the BEAM may move or free
        // the binary right after.
        args.host_buffer_semantics = ffi::PJRT_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL;
        args.device = self.device_raw(device)?;
        call!(self.plugin, PJRT_Client_BufferFromHostBuffer, &mut args)?;
        // Owning the event destroys it; with this semantics it is already done.
        drop(crate::event::Event::from_raw(
            &self.plugin,
            args.done_with_host_buffer,
        ));
        Ok(Buffer::from_raw(self, args.buffer, shape.clone(), device))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut args = new_args!(ffi::PJRT_Client_Destroy_Args, client);
        args.client = self.raw;
        let _ = (|| -> Result<()> { call!(self.plugin, PJRT_Client_Destroy, &mut args) })();
    }
}

/// Create options laid out as `PJRT_NamedValue`s, with the storage they
/// point into.
struct NamedValues {
    values: Vec<ffi::PJRT_NamedValue>,
    _names: Vec<Vec<u8>>,
    _lists: Vec<Vec<i64>>,
}

impl NamedValues {
    fn new(options: &[(String, OptionValue)]) -> Result<NamedValues> {
        let mut names = Vec::with_capacity(options.len());
        let mut lists = Vec::new();
        let mut values = Vec::with_capacity(options.len());
        for (name, value) in options {
            if name.is_empty() {
                return Err(Error::invalid("client option names must not be empty"));
            }
            check_option(name, value)?;
            let mut nv = new_args!(ffi::PJRT_NamedValue, value_size);
            let name_bytes = name.as_bytes().to_vec();
            nv.name = name_bytes.as_ptr().cast();
            nv.name_size = name_bytes.len();
            names.push(name_bytes);
            match value {
                OptionValue::String(s) => {
                    let bytes = s.as_bytes().to_vec();
                    nv.type_ = ffi::PJRT_NAMED_VALUE_STRING;
                    nv.value.string_value = bytes.as_ptr().cast();
                    nv.value_size = bytes.len();
                    names.push(bytes);
                }
                OptionValue::Int64(i) => {
                    nv.type_ = ffi::PJRT_NAMED_VALUE_INT64;
                    nv.value.int64_value = *i;
                    nv.value_size = 1;
                }
                OptionValue::Int64List(list) => {
                    let list = list.clone();
                    nv.type_ = ffi::PJRT_NAMED_VALUE_INT64_LIST;
                    nv.value.int64_array_value = list.as_ptr();
                    nv.value_size = list.len();
                    lists.push(list);
                }
                OptionValue::Float(f) => {
                    nv.type_ = ffi::PJRT_NAMED_VALUE_FLOAT;
                    nv.value.float_value = *f;
                    nv.value_size = 1;
                }
                OptionValue::Bool(b) => {
                    nv.type_ = ffi::PJRT_NAMED_VALUE_BOOL;
                    nv.value.bool_value = *b;
                    nv.value_size = 1;
                }
            }
            values.push(nv);
        }
        // Moving a Vec<u8> into `names` keeps its heap pointer stable.
        Ok(NamedValues {
            values,
            _names: names,
            _lists: lists,
        })
    }
}

/// The CPU plugins allocate device buffers, and each execution's temporary
/// buffer, with the C library's `malloc`.
///
/// glibc serves blocks of at least `M_MMAP_THRESHOLD` bytes with their own
/// `mmap` and returns them with `munmap` on free. It normally raises that
/// threshold (up to 32 MiB) as such blocks are freed, so a program that
/// allocates the same sizes again and again soon reuses warm heap memory.
/// The Erlang VM disables that adaptation at start-up (it sets
/// `M_TRIM_THRESHOLD` and `M_TOP_PAD` with `mallopt`), which leaves the
/// threshold at 128 KiB: every execution then maps, page-faults and unmaps
/// all of its large buffers. For a 784-512-512-10 MLP training step that is
/// about 1,500 page faults and 3 ms of kernel time per step.
///
/// `keep_freed_memory` sets the values glibc's own adaptation would reach:
/// blocks up to 32 MiB come from the heap, and the heap keeps up to 64 MiB
/// of free memory at its top. It runs once per process, and not at all when
/// the environment sets `EXLA_HOST_MALLOC_TUNING=false`.
mod host_heap {
    use std::sync::Once;

    /// The opt-out environment variable.
    pub const ENV: &str = "EXLA_HOST_MALLOC_TUNING";
    /// glibc's largest adaptive mmap threshold on 64-bit targets.
    pub const MMAP_THRESHOLD: i32 = 32 * 1024 * 1024;
    /// glibc's adaptive trim threshold: twice the mmap threshold.
    pub const TRIM_THRESHOLD: i32 = 2 * MMAP_THRESHOLD;

    static TUNE: Once = Once::new();

    pub fn keep_freed_memory() {
        TUNE.call_once(|| {
            if enabled(std::env::var(ENV).ok().as_deref()) {
                set_thresholds();
            }
        });
    }

    pub fn enabled(value: Option<&str>) -> bool {
        !matches!(
            value.map(|v| v.trim().to_ascii_lowercase()).as_deref(),
            Some("false" | "0" | "no" | "off")
        )
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn set_thresholds() {
        use std::ffi::c_int;

        // From glibc's <malloc.h>.
        const M_TRIM_THRESHOLD: c_int = -1;
        const M_MMAP_THRESHOLD: c_int = -3;

        extern "C" {
            fn mallopt(param: c_int, value: c_int) -> c_int;
        }

        // SAFETY: mallopt only updates glibc's allocator parameters, under
        // its own lock; both values are within the ranges it accepts.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }

    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    fn set_thresholds() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_options_are_split_from_create_options() {
        let options = vec![
            ("cpu_device_count".to_string(), OptionValue::Int64(2)),
            ("compile:xla_a".to_string(), OptionValue::Bool(true)),
            ("compile:xla_b".to_string(), OptionValue::Float(0.5)),
            ("compile:xla_a".to_string(), OptionValue::Bool(false)),
        ];
        let (create, compile) = split_compile_options(&options).unwrap();
        assert_eq!(create, vec![options[0].clone()]);
        assert_eq!(
            compile,
            vec![
                ("xla_b".to_string(), OptionOverride::Double(0.5)),
                ("xla_a".to_string(), OptionOverride::Bool(false)),
            ]
        );
        for bad in [
            ("compile:".to_string(), OptionValue::Bool(true)),
            ("compile:xla_c".to_string(), OptionValue::Int64List(vec![1])),
        ] {
            assert!(matches!(
                split_compile_options(&[bad]),
                Err(Error::InvalidArgument(_))
            ));
        }
    }

    /// Compile option overrides reach the plugin: a known one compiles, an
    /// unknown one fails the compilation naming it. Needs the CPU plugin at
    /// `PJRT_PLUGIN_PATH`; skipped without it.
    #[test]
    fn compile_overrides_reach_the_plugin() {
        let Ok(path) = std::env::var("PJRT_PLUGIN_PATH") else {
            return;
        };
        let plugin = Plugin::load(path).unwrap();
        let add = "module {\n  func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n    \
                   %0 = stablehlo.add %a, %a : tensor<2xf32>\n    return %0 : tensor<2xf32>\n  }\n}\n";
        let create = |name: &str| {
            let options = [
                ("cpu_device_count".to_string(), OptionValue::Int64(1)),
                (name.to_string(), OptionValue::Bool(false)),
            ];
            Client::create(&plugin, &options).unwrap()
        };
        let good = create("compile:xla_cpu_use_xnnpack");
        assert_eq!(good.compile_overrides().len(), 1);
        good.compile(add.as_bytes(), 0, &CompileOptions::default())
            .unwrap();
        let bad = create("compile:xla_no_such_option");
        let error = bad
            .compile(add.as_bytes(), 0, &CompileOptions::default())
            .err()
            .unwrap();
        assert!(format!("{error}").contains("xla_no_such_option"), "{error}");
    }

    #[test]
    fn host_heap_tuning_is_on_unless_turned_off() {
        for value in [None, Some(""), Some("true"), Some("1")] {
            assert!(host_heap::enabled(value), "{value:?}");
        }
        for value in ["false", "0", "no", "OFF", " False "] {
            assert!(!host_heap::enabled(Some(value)), "{value}");
        }
    }

    #[test]
    fn host_heap_thresholds_are_glibc_adaptive_limits() {
        assert_eq!(host_heap::MMAP_THRESHOLD, 32 << 20);
        assert_eq!(host_heap::TRIM_THRESHOLD, 64 << 20);
        host_heap::keep_freed_memory();
        // Idempotent.
        host_heap::keep_freed_memory();
    }
}
