//! Clients and their devices; compiling programs and creating buffers.

use std::ffi::c_char;
use std::sync::Arc;

use crate::buffer::Buffer;
use crate::compile_options::CompileOptions;
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

/// One addressable device of a client.
#[derive(Debug)]
pub struct Device {
    raw: *mut PJRT_Device,
    /// The runtime's global id of the device.
    pub id: i32,
    pub kind: String,
}

/// What a plugin reports about the memory of one device
/// (`PJRT_Device_MemoryStats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    pub bytes_in_use: i64,
    /// The most bytes in use so far, when the plugin tracks it.
    pub peak_bytes_in_use: Option<i64>,
}

/// An owned `PJRT_Client`, destroyed when the last handle (including every
/// buffer and executable made from it) is dropped.
pub struct Client {
    plugin: Arc<Plugin>,
    raw: *mut PJRT_Client,
    devices: Vec<Device>,
    platform_name: String,
    platform_version: String,
}

// SAFETY: PJRT clients are thread-safe; the device list is immutable.
unsafe impl Send for Client {}
unsafe impl Sync for Client {}

impl Client {
    /// Creates a client with typed create options.
    pub fn create(plugin: &Arc<Plugin>, options: &[(String, OptionValue)]) -> Result<Arc<Client>> {
        let named = NamedValues::new(options)?;
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
        };
        // If any query fails, dropping `client` destroys the PJRT client.
        client.platform_name = client.query_platform_name()?;
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

    /// The plugin's memory statistics of the device at `index`. Plugins
    /// may answer UNIMPLEMENTED (the CPU plugins do).
    pub fn memory_stats(&self, index: usize) -> Result<MemoryStats> {
        let mut args = new_args!(ffi::PJRT_Device_MemoryStats_Args, peak_pool_bytes_is_set);
        args.device = self.device_raw(index)?;
        call!(self.plugin, PJRT_Device_MemoryStats, &mut args)?;
        Ok(MemoryStats {
            bytes_in_use: args.bytes_in_use,
            peak_bytes_in_use: args
                .peak_bytes_in_use_is_set
                .then_some(args.peak_bytes_in_use),
        })
    }

    /// The index of the device `raw` in the addressable devices, if it is one.
    pub(crate) fn device_index(&self, raw: *mut PJRT_Device) -> Option<usize> {
        self.devices.iter().position(|d| d.raw == raw)
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
        let encoded = options.encode_for(ordinal)?;
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

    /// A buffer of `shape` on the device at `device` that is a view of the
    /// memory at `data`, not a copy: the plugin reads (and, for a donated
    /// argument, writes) it in place. `on_delete` runs once, when the plugin
    /// is done with the memory, or at once when no view could be made.
    ///
    /// # Safety
    ///
    /// `data` must hold `shape.byte_size()` bytes in memory the device can
    /// address, aligned as the plugin asks, and stay valid until `on_delete`
    /// runs.
    pub unsafe fn view_of_memory(
        self: &Arc<Self>,
        data: *mut u8,
        shape: &Shape,
        device: usize,
        on_delete: Box<dyn FnOnce() + Send>,
    ) -> Result<Buffer> {
        let mut args = new_args!(ffi::PJRT_Client_CreateViewOfDeviceBuffer_Args, memory);
        args.client = self.raw;
        args.device_buffer_ptr = data.cast();
        args.dims = shape.dims.as_ptr();
        args.num_dims = shape.dims.len();
        args.element_type = shape.element_type.code();
        let user_arg = Box::into_raw(Box::new(on_delete));
        args.on_delete_callback = Some(run_on_delete);
        args.on_delete_callback_arg = user_arg.cast();
        let made = self.device_raw(device).and_then(|raw| {
            args.device = raw;
            call!(self.plugin, PJRT_Client_CreateViewOfDeviceBuffer, &mut args)
        });
        match made {
            Ok(()) => Ok(Buffer::from_raw(self, args.buffer, shape.clone(), device)),
            Err(error) => {
                // No buffer holds the memory, so the plugin never calls back.
                run_on_delete(data.cast(), user_arg.cast());
                Err(error)
            }
        }
    }
}

/// The view's `on_delete_callback`: runs the closure boxed by
/// `view_of_memory`, once. A panic stops here, not in the plugin.
unsafe extern "C" fn run_on_delete(_data: *mut std::ffi::c_void, user_arg: *mut std::ffi::c_void) {
    // SAFETY: `user_arg` is the box made by `view_of_memory`, given to the
    // plugin, which calls back once.
    let on_delete = unsafe { Box::from_raw(user_arg.cast::<Box<dyn FnOnce() + Send>>()) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(on_delete));
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
