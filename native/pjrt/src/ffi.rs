//! Declarations of the PJRT C API, version 0.81 (`pjrt_c_api.h` as shipped in
//! the `xla-cpu-pjrt` 0.0.1 wheel), written by hand for what the bindings use.
//!
//! Every argument struct starts with `struct_size` and `extension_start`.
//! `struct_size` must be the C header's `PJRT_STRUCT_SIZE` (offset of the last
//! field plus its size, without trailing padding); `args_size!` computes it.
#![allow(non_camel_case_types, non_snake_case, dead_code)]

use std::ffi::{c_char, c_int, c_void};

/// Version of the C API these declarations follow.
pub const PJRT_API_MAJOR: i32 = 0;
pub const PJRT_API_MINOR: i32 = 81;

pub enum PJRT_Error {}
pub enum PJRT_Client {}
pub enum PJRT_Device {}
pub enum PJRT_DeviceDescription {}
pub enum PJRT_Memory {}
pub enum PJRT_Buffer {}
pub enum PJRT_Event {}
pub enum PJRT_Executable {}
pub enum PJRT_LoadedExecutable {}
pub enum PJRT_SerializedExecutable {}
pub enum PJRT_ExecuteContext {}
pub enum PJRT_Buffer_MemoryLayout {}
pub enum PJRT_SendCallbackInfo {}
pub enum PJRT_RecvCallbackInfo {}

/// `PJRT_STRUCT_SIZE(type, last_field)` of the C header.
macro_rules! args_size {
    ($ty:ty, $last:ident) => {{
        let probe = std::mem::MaybeUninit::<$ty>::uninit();
        let base = probe.as_ptr();
        // SAFETY: only the address of the field is computed, nothing is read.
        let field = unsafe { std::ptr::addr_of!((*base).$last) };
        fn size_of_pointee<T>(_: *const T) -> usize {
            std::mem::size_of::<T>()
        }
        std::mem::offset_of!($ty, $last) + size_of_pointee(field)
    }};
}
pub(crate) use args_size;

#[repr(C)]
pub struct PJRT_Extension_Base {
    pub struct_size: usize,
    pub type_: c_int,
    pub next: *mut PJRT_Extension_Base,
}

#[repr(C)]
pub struct PJRT_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub major_version: c_int,
    pub minor_version: c_int,
}

pub type PJRT_Error_Code = c_int;
pub const PJRT_ERROR_CODE_INVALID_ARGUMENT: PJRT_Error_Code = 3;

pub type PJRT_Buffer_Type = c_int;
pub type PJRT_HostBufferSemantics = c_int;
pub const PJRT_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL: PJRT_HostBufferSemantics = 0;

pub type PJRT_NamedValue_Type = c_int;
pub const PJRT_NAMED_VALUE_STRING: PJRT_NamedValue_Type = 0;
pub const PJRT_NAMED_VALUE_INT64: PJRT_NamedValue_Type = 1;
pub const PJRT_NAMED_VALUE_INT64_LIST: PJRT_NamedValue_Type = 2;
pub const PJRT_NAMED_VALUE_FLOAT: PJRT_NamedValue_Type = 3;
pub const PJRT_NAMED_VALUE_BOOL: PJRT_NamedValue_Type = 4;

pub type PJRT_Event_OnReadyCallback =
    Option<unsafe extern "C" fn(error: *mut PJRT_Error, user_arg: *mut c_void)>;

#[repr(C)]
#[derive(Clone, Copy)]
pub union PJRT_NamedValue_Value {
    pub string_value: *const c_char,
    pub int64_value: i64,
    pub int64_array_value: *const i64,
    pub float_value: f32,
    pub bool_value: bool,
}

#[repr(C)]
pub struct PJRT_NamedValue {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub name: *const c_char,
    pub name_size: usize,
    pub type_: PJRT_NamedValue_Type,
    pub value: PJRT_NamedValue_Value,
    pub value_size: usize,
}

#[repr(C)]
pub struct PJRT_Error_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub error: *mut PJRT_Error,
}

#[repr(C)]
pub struct PJRT_Error_Message_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub error: *const PJRT_Error,
    pub message: *const c_char,
    pub message_size: usize,
}

#[repr(C)]
pub struct PJRT_Error_GetCode_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub error: *const PJRT_Error,
    pub code: PJRT_Error_Code,
}

#[repr(C)]
pub struct PJRT_Plugin_Initialize_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
}

#[repr(C)]
pub struct PJRT_Plugin_Attributes_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub attributes: *const PJRT_NamedValue,
    pub num_attributes: usize,
}

#[repr(C)]
pub struct PJRT_Event_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
}

#[repr(C)]
pub struct PJRT_Event_IsReady_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
    pub is_ready: bool,
}

#[repr(C)]
pub struct PJRT_Event_Error_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
}

#[repr(C)]
pub struct PJRT_Event_Await_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
}

#[repr(C)]
pub struct PJRT_Event_OnReady_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
    pub callback: PJRT_Event_OnReadyCallback,
    pub user_arg: *mut c_void,
}

#[repr(C)]
pub struct PJRT_Client_Create_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub create_options: *const PJRT_NamedValue,
    pub num_options: usize,
    pub kv_get_callback: *mut c_void,
    pub kv_get_user_arg: *mut c_void,
    pub kv_put_callback: *mut c_void,
    pub kv_put_user_arg: *mut c_void,
    pub client: *mut PJRT_Client,
    pub kv_try_get_callback: *mut c_void,
    pub kv_try_get_user_arg: *mut c_void,
}

#[repr(C)]
pub struct PJRT_Client_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
}

#[repr(C)]
pub struct PJRT_Client_PlatformName_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub platform_name: *const c_char,
    pub platform_name_size: usize,
}

#[repr(C)]
pub struct PJRT_Client_PlatformVersion_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub platform_version: *const c_char,
    pub platform_version_size: usize,
}

#[repr(C)]
pub struct PJRT_Client_AddressableDevices_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub addressable_devices: *const *mut PJRT_Device,
    pub num_addressable_devices: usize,
}

#[repr(C)]
pub struct PJRT_Program {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub code: *mut c_char,
    pub code_size: usize,
    pub format: *const c_char,
    pub format_size: usize,
}

#[repr(C)]
pub struct PJRT_Client_Compile_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub program: *const PJRT_Program,
    pub compile_options: *const c_char,
    pub compile_options_size: usize,
    pub executable: *mut PJRT_LoadedExecutable,
}

#[repr(C)]
pub struct PJRT_Client_BufferFromHostBuffer_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub data: *const c_void,
    pub type_: PJRT_Buffer_Type,
    pub dims: *const i64,
    pub num_dims: usize,
    pub byte_strides: *const i64,
    pub num_byte_strides: usize,
    pub host_buffer_semantics: PJRT_HostBufferSemantics,
    pub device: *mut PJRT_Device,
    pub memory: *mut PJRT_Memory,
    pub device_layout: *mut PJRT_Buffer_MemoryLayout,
    pub done_with_host_buffer: *mut PJRT_Event,
    pub buffer: *mut PJRT_Buffer,
}

/// Called once when the view no longer needs the memory.
pub type PJRT_OnDeleteCallback =
    Option<unsafe extern "C" fn(device_buffer_ptr: *mut c_void, user_arg: *mut c_void)>;

#[repr(C)]
pub struct PJRT_Client_CreateViewOfDeviceBuffer_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub device_buffer_ptr: *mut c_void,
    pub dims: *const i64,
    pub num_dims: usize,
    pub element_type: PJRT_Buffer_Type,
    pub layout: *mut PJRT_Buffer_MemoryLayout,
    pub device: *mut PJRT_Device,
    pub on_delete_callback: PJRT_OnDeleteCallback,
    pub on_delete_callback_arg: *mut c_void,
    pub stream: isize,
    pub buffer: *mut PJRT_Buffer,
    /// Since 0.66; preferred over `device`. Null: the device's default memory.
    pub memory: *mut PJRT_Memory,
}

#[repr(C)]
pub struct PJRT_Device_GetDescription_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device: *mut PJRT_Device,
    pub device_description: *mut PJRT_DeviceDescription,
}

/// `*_is_set` flags say whether the plugin filled the field before them.
#[repr(C)]
pub struct PJRT_Device_MemoryStats_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device: *mut PJRT_Device,
    pub bytes_in_use: i64,
    pub peak_bytes_in_use: i64,
    pub peak_bytes_in_use_is_set: bool,
    pub num_allocs: i64,
    pub num_allocs_is_set: bool,
    pub largest_alloc_size: i64,
    pub largest_alloc_size_is_set: bool,
    pub bytes_limit: i64,
    pub bytes_limit_is_set: bool,
    pub bytes_reserved: i64,
    pub bytes_reserved_is_set: bool,
    pub peak_bytes_reserved: i64,
    pub peak_bytes_reserved_is_set: bool,
    pub bytes_reservable_limit: i64,
    pub bytes_reservable_limit_is_set: bool,
    pub largest_free_block_bytes: i64,
    pub largest_free_block_bytes_is_set: bool,
    pub pool_bytes: i64,
    pub pool_bytes_is_set: bool,
    pub peak_pool_bytes: i64,
    pub peak_pool_bytes_is_set: bool,
}

#[repr(C)]
pub struct PJRT_DeviceDescription_Id_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device_description: *mut PJRT_DeviceDescription,
    pub id: c_int,
}

#[repr(C)]
pub struct PJRT_DeviceDescription_Kind_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device_description: *mut PJRT_DeviceDescription,
    pub device_kind: *const c_char,
    pub device_kind_size: usize,
}

#[repr(C)]
pub struct PJRT_ExecuteOptions {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub send_callbacks: *mut *mut PJRT_SendCallbackInfo,
    pub recv_callbacks: *mut *mut PJRT_RecvCallbackInfo,
    pub num_send_ops: usize,
    pub num_recv_ops: usize,
    pub launch_id: c_int,
    pub non_donatable_input_indices: *const i64,
    pub num_non_donatable_input_indices: usize,
    pub context: *mut PJRT_ExecuteContext,
    pub call_location: *const c_char,
    pub num_tasks: usize,
    pub task_ids: *mut c_int,
    pub incarnation_ids: *mut i64,
}

#[repr(C)]
pub struct PJRT_LoadedExecutable_Execute_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_LoadedExecutable,
    pub options: *mut PJRT_ExecuteOptions,
    pub argument_lists: *const *const *mut PJRT_Buffer,
    pub num_devices: usize,
    pub num_args: usize,
    pub output_lists: *const *mut *mut PJRT_Buffer,
    pub device_complete_events: *mut *mut PJRT_Event,
    pub execute_device: *mut PJRT_Device,
}

#[repr(C)]
pub struct PJRT_LoadedExecutable_AddressableDevices_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_LoadedExecutable,
    pub addressable_devices: *const *mut PJRT_Device,
    pub num_addressable_devices: usize,
}

#[repr(C)]
pub struct PJRT_LoadedExecutable_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_LoadedExecutable,
}

#[repr(C)]
pub struct PJRT_LoadedExecutable_GetExecutable_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub loaded_executable: *mut PJRT_LoadedExecutable,
    pub executable: *mut PJRT_Executable,
}

#[repr(C)]
pub struct PJRT_Executable_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
}

#[repr(C)]
pub struct PJRT_Executable_NumOutputs_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub num_outputs: usize,
}

#[repr(C)]
pub struct PJRT_Executable_OutputElementTypes_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub output_types: *mut PJRT_Buffer_Type,
    pub num_output_types: usize,
}

#[repr(C)]
pub struct PJRT_Executable_OutputDimensions_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub num_outputs: usize,
    pub dims: *const i64,
    pub dim_sizes: *const usize,
}

#[repr(C)]
pub struct PJRT_Executable_Serialize_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *const PJRT_Executable,
    pub serialized_bytes: *const c_char,
    pub serialized_bytes_size: usize,
    pub serialized_executable: *mut PJRT_SerializedExecutable,
    pub serialized_executable_deleter:
        Option<unsafe extern "C" fn(exec: *mut PJRT_SerializedExecutable)>,
}

#[repr(C)]
pub struct PJRT_Executable_DeserializeAndLoad_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub serialized_executable: *const c_char,
    pub serialized_executable_size: usize,
    pub loaded_executable: *mut PJRT_LoadedExecutable,
    pub overridden_serialized_compile_options: *const c_char,
    pub overridden_serialized_compile_options_size: usize,
}

#[repr(C)]
pub struct PJRT_Buffer_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
}

#[repr(C)]
pub struct PJRT_Buffer_Delete_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
}

#[repr(C)]
pub struct PJRT_Buffer_IsDeleted_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub is_deleted: bool,
}

#[repr(C)]
pub struct PJRT_Buffer_CopyToDevice_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub dst_device: *mut PJRT_Device,
    pub dst_buffer: *mut PJRT_Buffer,
}

#[repr(C)]
pub struct PJRT_Buffer_ToHostBuffer_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub src: *mut PJRT_Buffer,
    pub host_layout: *mut PJRT_Buffer_MemoryLayout,
    pub dst: *mut c_void,
    pub dst_size: usize,
    pub event: *mut PJRT_Event,
}

#[repr(C)]
pub struct PJRT_Buffer_OnDeviceSizeInBytes_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub on_device_size_in_bytes: usize,
}

#[repr(C)]
pub struct PJRT_Buffer_IsOnCpu_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub is_on_cpu: bool,
}

#[repr(C)]
pub struct PJRT_Buffer_ReadyEvent_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub event: *mut PJRT_Event,
}

#[repr(C)]
pub struct PJRT_Buffer_UnsafePointer_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub buffer_pointer: usize,
}

#[repr(C)]
pub struct PJRT_Buffer_IncreaseExternalReferenceCount_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
}

#[repr(C)]
pub struct PJRT_Buffer_DecreaseExternalReferenceCount_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
}

/// The PJRT function table (`PJRT_Api`) of C API 0.81, field for field.
/// Functions the bindings call are typed; the others are opaque slots that
/// only keep the layout right.
#[repr(C)]
pub struct PJRT_Api {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub pjrt_api_version: PJRT_Api_Version,
    pub PJRT_Error_Destroy: Option<unsafe extern "C" fn(args: *mut PJRT_Error_Destroy_Args)>,
    pub PJRT_Error_Message: Option<unsafe extern "C" fn(args: *mut PJRT_Error_Message_Args)>,
    pub PJRT_Error_GetCode:
        Option<unsafe extern "C" fn(args: *mut PJRT_Error_GetCode_Args) -> *mut PJRT_Error>,
    pub PJRT_Plugin_Initialize:
        Option<unsafe extern "C" fn(args: *mut PJRT_Plugin_Initialize_Args) -> *mut PJRT_Error>,
    pub PJRT_Plugin_Attributes:
        Option<unsafe extern "C" fn(args: *mut PJRT_Plugin_Attributes_Args) -> *mut PJRT_Error>,
    pub PJRT_Event_Destroy:
        Option<unsafe extern "C" fn(args: *mut PJRT_Event_Destroy_Args) -> *mut PJRT_Error>,
    pub PJRT_Event_IsReady:
        Option<unsafe extern "C" fn(args: *mut PJRT_Event_IsReady_Args) -> *mut PJRT_Error>,
    pub PJRT_Event_Error:
        Option<unsafe extern "C" fn(args: *mut PJRT_Event_Error_Args) -> *mut PJRT_Error>,
    pub PJRT_Event_Await:
        Option<unsafe extern "C" fn(args: *mut PJRT_Event_Await_Args) -> *mut PJRT_Error>,
    pub PJRT_Event_OnReady:
        Option<unsafe extern "C" fn(args: *mut PJRT_Event_OnReady_Args) -> *mut PJRT_Error>,
    pub PJRT_Client_Create:
        Option<unsafe extern "C" fn(args: *mut PJRT_Client_Create_Args) -> *mut PJRT_Error>,
    pub PJRT_Client_Destroy:
        Option<unsafe extern "C" fn(args: *mut PJRT_Client_Destroy_Args) -> *mut PJRT_Error>,
    pub PJRT_Client_PlatformName:
        Option<unsafe extern "C" fn(args: *mut PJRT_Client_PlatformName_Args) -> *mut PJRT_Error>,
    pub PJRT_Client_ProcessIndex: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_PlatformVersion: Option<
        unsafe extern "C" fn(args: *mut PJRT_Client_PlatformVersion_Args) -> *mut PJRT_Error,
    >,
    pub PJRT_Client_Devices: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_AddressableDevices: Option<
        unsafe extern "C" fn(args: *mut PJRT_Client_AddressableDevices_Args) -> *mut PJRT_Error,
    >,
    pub PJRT_Client_LookupDevice: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_LookupAddressableDevice: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_AddressableMemories: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_Compile:
        Option<unsafe extern "C" fn(args: *mut PJRT_Client_Compile_Args) -> *mut PJRT_Error>,
    pub PJRT_Client_DefaultDeviceAssignment: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_BufferFromHostBuffer: Option<
        unsafe extern "C" fn(args: *mut PJRT_Client_BufferFromHostBuffer_Args) -> *mut PJRT_Error,
    >,
    pub PJRT_DeviceDescription_Id:
        Option<unsafe extern "C" fn(args: *mut PJRT_DeviceDescription_Id_Args) -> *mut PJRT_Error>,
    pub PJRT_DeviceDescription_ProcessIndex: Option<unsafe extern "C" fn()>,
    pub PJRT_DeviceDescription_Attributes: Option<unsafe extern "C" fn()>,
    pub PJRT_DeviceDescription_Kind: Option<
        unsafe extern "C" fn(args: *mut PJRT_DeviceDescription_Kind_Args) -> *mut PJRT_Error,
    >,
    pub PJRT_DeviceDescription_DebugString: Option<unsafe extern "C" fn()>,
    pub PJRT_DeviceDescription_ToString: Option<unsafe extern "C" fn()>,
    pub PJRT_Device_GetDescription:
        Option<unsafe extern "C" fn(args: *mut PJRT_Device_GetDescription_Args) -> *mut PJRT_Error>,
    pub PJRT_Device_IsAddressable: Option<unsafe extern "C" fn()>,
    pub PJRT_Device_LocalHardwareId: Option<unsafe extern "C" fn()>,
    pub PJRT_Device_AddressableMemories: Option<unsafe extern "C" fn()>,
    pub PJRT_Device_DefaultMemory: Option<unsafe extern "C" fn()>,
    pub PJRT_Device_MemoryStats:
        Option<unsafe extern "C" fn(args: *mut PJRT_Device_MemoryStats_Args) -> *mut PJRT_Error>,
    pub PJRT_Memory_Id: Option<unsafe extern "C" fn()>,
    pub PJRT_Memory_Kind: Option<unsafe extern "C" fn()>,
    pub PJRT_Memory_DebugString: Option<unsafe extern "C" fn()>,
    pub PJRT_Memory_ToString: Option<unsafe extern "C" fn()>,
    pub PJRT_Memory_AddressableByDevices: Option<unsafe extern "C" fn()>,
    pub PJRT_Executable_Destroy:
        Option<unsafe extern "C" fn(args: *mut PJRT_Executable_Destroy_Args) -> *mut PJRT_Error>,
    pub PJRT_Executable_Name: Option<unsafe extern "C" fn()>,
    pub PJRT_Executable_NumReplicas: Option<unsafe extern "C" fn()>,
    pub PJRT_Executable_NumPartitions: Option<unsafe extern "C" fn()>,
    pub PJRT_Executable_NumOutputs:
        Option<unsafe extern "C" fn(args: *mut PJRT_Executable_NumOutputs_Args) -> *mut PJRT_Error>,
    pub PJRT_Executable_SizeOfGeneratedCodeInBytes: Option<unsafe extern "C" fn()>,
    pub PJRT_Executable_GetCostAnalysis: Option<unsafe extern "C" fn()>,
    pub PJRT_Executable_OutputMemoryKinds: Option<unsafe extern "C" fn()>,
    pub PJRT_Executable_OptimizedProgram: Option<unsafe extern "C" fn()>,
    pub PJRT_Executable_Serialize:
        Option<unsafe extern "C" fn(args: *mut PJRT_Executable_Serialize_Args) -> *mut PJRT_Error>,
    pub PJRT_LoadedExecutable_Destroy: Option<
        unsafe extern "C" fn(args: *mut PJRT_LoadedExecutable_Destroy_Args) -> *mut PJRT_Error,
    >,
    pub PJRT_LoadedExecutable_GetExecutable: Option<
        unsafe extern "C" fn(
            args: *mut PJRT_LoadedExecutable_GetExecutable_Args,
        ) -> *mut PJRT_Error,
    >,
    pub PJRT_LoadedExecutable_AddressableDevices: Option<
        unsafe extern "C" fn(
            args: *mut PJRT_LoadedExecutable_AddressableDevices_Args,
        ) -> *mut PJRT_Error,
    >,
    pub PJRT_LoadedExecutable_Delete: Option<unsafe extern "C" fn()>,
    pub PJRT_LoadedExecutable_IsDeleted: Option<unsafe extern "C" fn()>,
    pub PJRT_LoadedExecutable_Execute: Option<
        unsafe extern "C" fn(args: *mut PJRT_LoadedExecutable_Execute_Args) -> *mut PJRT_Error,
    >,
    pub PJRT_Executable_DeserializeAndLoad: Option<
        unsafe extern "C" fn(args: *mut PJRT_Executable_DeserializeAndLoad_Args) -> *mut PJRT_Error,
    >,
    pub PJRT_LoadedExecutable_Fingerprint: Option<unsafe extern "C" fn()>,
    pub PJRT_Buffer_Destroy:
        Option<unsafe extern "C" fn(args: *mut PJRT_Buffer_Destroy_Args) -> *mut PJRT_Error>,
    pub PJRT_Buffer_ElementType: Option<unsafe extern "C" fn()>,
    pub PJRT_Buffer_Dimensions: Option<unsafe extern "C" fn()>,
    pub PJRT_Buffer_UnpaddedDimensions: Option<unsafe extern "C" fn()>,
    pub PJRT_Buffer_DynamicDimensionIndices: Option<unsafe extern "C" fn()>,
    pub PJRT_Buffer_GetMemoryLayout: Option<unsafe extern "C" fn()>,
    pub PJRT_Buffer_OnDeviceSizeInBytes: Option<
        unsafe extern "C" fn(args: *mut PJRT_Buffer_OnDeviceSizeInBytes_Args) -> *mut PJRT_Error,
    >,
    pub PJRT_Buffer_Device: Option<unsafe extern "C" fn()>,
    pub PJRT_Buffer_Memory: Option<unsafe extern "C" fn()>,
    pub PJRT_Buffer_Delete:
        Option<unsafe extern "C" fn(args: *mut PJRT_Buffer_Delete_Args) -> *mut PJRT_Error>,
    pub PJRT_Buffer_IsDeleted:
        Option<unsafe extern "C" fn(args: *mut PJRT_Buffer_IsDeleted_Args) -> *mut PJRT_Error>,
    pub PJRT_Buffer_CopyToDevice:
        Option<unsafe extern "C" fn(args: *mut PJRT_Buffer_CopyToDevice_Args) -> *mut PJRT_Error>,
    pub PJRT_Buffer_ToHostBuffer:
        Option<unsafe extern "C" fn(args: *mut PJRT_Buffer_ToHostBuffer_Args) -> *mut PJRT_Error>,
    pub PJRT_Buffer_IsOnCpu:
        Option<unsafe extern "C" fn(args: *mut PJRT_Buffer_IsOnCpu_Args) -> *mut PJRT_Error>,
    pub PJRT_Buffer_ReadyEvent:
        Option<unsafe extern "C" fn(args: *mut PJRT_Buffer_ReadyEvent_Args) -> *mut PJRT_Error>,
    pub PJRT_Buffer_UnsafePointer:
        Option<unsafe extern "C" fn(args: *mut PJRT_Buffer_UnsafePointer_Args) -> *mut PJRT_Error>,
    pub PJRT_Buffer_IncreaseExternalReferenceCount: Option<
        unsafe extern "C" fn(
            args: *mut PJRT_Buffer_IncreaseExternalReferenceCount_Args,
        ) -> *mut PJRT_Error,
    >,
    pub PJRT_Buffer_DecreaseExternalReferenceCount: Option<
        unsafe extern "C" fn(
            args: *mut PJRT_Buffer_DecreaseExternalReferenceCount_Args,
        ) -> *mut PJRT_Error,
    >,
    pub PJRT_Buffer_OpaqueDeviceMemoryDataPointer: Option<unsafe extern "C" fn()>,
    pub PJRT_CopyToDeviceStream_Destroy: Option<unsafe extern "C" fn()>,
    pub PJRT_CopyToDeviceStream_AddChunk: Option<unsafe extern "C" fn()>,
    pub PJRT_CopyToDeviceStream_TotalBytes: Option<unsafe extern "C" fn()>,
    pub PJRT_CopyToDeviceStream_GranuleSize: Option<unsafe extern "C" fn()>,
    pub PJRT_CopyToDeviceStream_CurrentBytes: Option<unsafe extern "C" fn()>,
    pub PJRT_TopologyDescription_Create: Option<unsafe extern "C" fn()>,
    pub PJRT_TopologyDescription_Destroy: Option<unsafe extern "C" fn()>,
    pub PJRT_TopologyDescription_PlatformName: Option<unsafe extern "C" fn()>,
    pub PJRT_TopologyDescription_PlatformVersion: Option<unsafe extern "C" fn()>,
    pub PJRT_TopologyDescription_GetDeviceDescriptions: Option<unsafe extern "C" fn()>,
    pub PJRT_TopologyDescription_Serialize: Option<unsafe extern "C" fn()>,
    pub PJRT_TopologyDescription_Attributes: Option<unsafe extern "C" fn()>,
    pub PJRT_Compile: Option<unsafe extern "C" fn()>,
    pub PJRT_Executable_OutputElementTypes: Option<
        unsafe extern "C" fn(args: *mut PJRT_Executable_OutputElementTypes_Args) -> *mut PJRT_Error,
    >,
    pub PJRT_Executable_OutputDimensions: Option<
        unsafe extern "C" fn(args: *mut PJRT_Executable_OutputDimensions_Args) -> *mut PJRT_Error,
    >,
    pub PJRT_Buffer_CopyToMemory: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_CreateViewOfDeviceBuffer: Option<
        unsafe extern "C" fn(
            args: *mut PJRT_Client_CreateViewOfDeviceBuffer_Args,
        ) -> *mut PJRT_Error,
    >,
    pub PJRT_Executable_Fingerprint: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_TopologyDescription: Option<unsafe extern "C" fn()>,
    pub PJRT_Executable_GetCompiledMemoryStats: Option<unsafe extern "C" fn()>,
    pub PJRT_Memory_Kind_Id: Option<unsafe extern "C" fn()>,
    pub PJRT_ExecuteContext_Create: Option<unsafe extern "C" fn()>,
    pub PJRT_ExecuteContext_Destroy: Option<unsafe extern "C" fn()>,
    pub PJRT_Buffer_CopyRawToHost: Option<unsafe extern "C" fn()>,
    pub PJRT_AsyncHostToDeviceTransferManager_Destroy: Option<unsafe extern "C" fn()>,
    pub PJRT_AsyncHostToDeviceTransferManager_TransferData: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_CreateBuffersForAsyncHostToDevice: Option<unsafe extern "C" fn()>,
    pub PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer: Option<unsafe extern "C" fn()>,
    pub PJRT_AsyncHostToDeviceTransferManager_Device: Option<unsafe extern "C" fn()>,
    pub PJRT_AsyncHostToDeviceTransferManager_BufferCount: Option<unsafe extern "C" fn()>,
    pub PJRT_AsyncHostToDeviceTransferManager_BufferSize: Option<unsafe extern "C" fn()>,
    pub PJRT_AsyncHostToDeviceTransferManager_SetBufferError: Option<unsafe extern "C" fn()>,
    pub PJRT_AsyncHostToDeviceTransferManager_AddMetadata: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_DmaMap: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_DmaUnmap: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_CreateUninitializedBuffer: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_UpdateGlobalProcessInfo: Option<unsafe extern "C" fn()>,
    pub PJRT_TopologyDescription_Deserialize: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_CreateAliasBuffer: Option<unsafe extern "C" fn()>,
    pub PJRT_Client_FulfillAliasBuffer: Option<unsafe extern "C" fn()>,
    pub PJRT_LoadedExecutable_GetDeviceAssignment: Option<unsafe extern "C" fn()>,
}

/// Signature of the one symbol a plugin exports.
pub type GetPjrtApiFn = unsafe extern "C" fn() -> *const PJRT_Api;
