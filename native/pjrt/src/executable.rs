//! Compiled programs: running them and serializing them.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLockWriteGuard};

use crate::buffer::{explain, Buffer};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::ffi::{self, PJRT_Buffer, PJRT_Executable, PJRT_LoadedExecutable};
use crate::plugin::{call, new_args};
use crate::types::{ElementType, Shape};

/// An owned `PJRT_LoadedExecutable` with the shapes of its parameters and
/// results. The plugin does not check argument types or shapes, so every
/// execution is checked against `input_shapes` here.
///
/// A program of several replicas or partitions runs on several devices at
/// once (`devices`, in the order the plugin takes their argument lists);
/// its parameter and result shapes are those of one device's part.
pub struct LoadedExecutable {
    client: Arc<Client>,
    raw: *mut PJRT_LoadedExecutable,
    device: usize,
    devices: Vec<usize>,
    input_shapes: Vec<Shape>,
    output_shapes: Vec<Shape>,
}

// SAFETY: PJRT executables may be run from several threads at once.
unsafe impl Send for LoadedExecutable {}
unsafe impl Sync for LoadedExecutable {}

/// The unloaded view of an executable, destroyed on drop.
struct ExecutableView<'a> {
    client: &'a Client,
    raw: *mut PJRT_Executable,
}

impl Drop for ExecutableView<'_> {
    fn drop(&mut self) {
        let mut args = new_args!(ffi::PJRT_Executable_Destroy_Args, executable);
        args.executable = self.raw;
        let _ =
            (|| -> Result<()> { call!(self.client.plugin(), PJRT_Executable_Destroy, &mut args) })(
            );
    }
}

impl LoadedExecutable {
    pub(crate) fn from_raw(
        client: &Arc<Client>,
        raw: *mut PJRT_LoadedExecutable,
        device: usize,
    ) -> Result<LoadedExecutable> {
        let mut executable = LoadedExecutable {
            client: client.clone(),
            raw,
            device,
            devices: Vec::new(),
            input_shapes: Vec::new(),
            output_shapes: Vec::new(),
        };
        executable.output_shapes = executable.query_output_shapes()?;
        executable.devices = executable.query_devices()?;
        if let [only] = executable.devices[..] {
            if only != device {
                return Err(Error::invalid(format!(
                    "the executable runs on device {only}, not on device {device}"
                )));
            }
        }
        Ok(executable)
    }

    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// Index of the device the executable was compiled for and runs on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Indices (in the client's devices) of every device the executable
    /// runs on, in the order `execute_on_devices` takes argument lists: one
    /// device, unless it was compiled for several replicas or partitions.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// Declares the parameter shapes every execution is checked against.
    pub fn with_input_shapes(mut self, shapes: Vec<Shape>) -> LoadedExecutable {
        self.input_shapes = shapes;
        self
    }

    pub fn input_shapes(&self) -> &[Shape] {
        &self.input_shapes
    }

    pub fn output_shapes(&self) -> &[Shape] {
        &self.output_shapes
    }

    fn view(&self) -> Result<ExecutableView<'_>> {
        let mut args = new_args!(ffi::PJRT_LoadedExecutable_GetExecutable_Args, executable);
        args.loaded_executable = self.raw;
        call!(
            self.client.plugin(),
            PJRT_LoadedExecutable_GetExecutable,
            &mut args
        )?;
        Ok(ExecutableView {
            client: &self.client,
            raw: args.executable,
        })
    }

    /// The plugin's addressable devices of the executable, as indices in
    /// the client's device list.
    fn query_devices(&self) -> Result<Vec<usize>> {
        let mut args = new_args!(
            ffi::PJRT_LoadedExecutable_AddressableDevices_Args,
            num_addressable_devices
        );
        args.executable = self.raw;
        call!(
            self.client.plugin(),
            PJRT_LoadedExecutable_AddressableDevices,
            &mut args
        )?;
        // SAFETY: the executable owns this array for its lifetime.
        let raws =
            unsafe { slice_or_empty(args.addressable_devices, args.num_addressable_devices) };
        raws.iter()
            .map(|raw| {
                self.client.device_index(*raw).ok_or_else(|| {
                    Error::invalid("the executable runs on a device its client does not have")
                })
            })
            .collect()
    }

    fn query_output_shapes(&self) -> Result<Vec<Shape>> {
        let view = self.view()?;
        let plugin = self.client.plugin();
        let mut count = new_args!(ffi::PJRT_Executable_NumOutputs_Args, num_outputs);
        count.executable = view.raw;
        call!(plugin, PJRT_Executable_NumOutputs, &mut count)?;
        let n = count.num_outputs;
        let mut types = new_args!(
            ffi::PJRT_Executable_OutputElementTypes_Args,
            num_output_types
        );
        types.executable = view.raw;
        call!(plugin, PJRT_Executable_OutputElementTypes, &mut types)?;
        let mut dims = new_args!(ffi::PJRT_Executable_OutputDimensions_Args, dim_sizes);
        dims.executable = view.raw;
        call!(plugin, PJRT_Executable_OutputDimensions, &mut dims)?;
        if types.num_output_types != n || dims.num_outputs != n {
            return Err(Error::invalid(
                "the plugin reported inconsistent output counts",
            ));
        }
        // SAFETY: the executable owns these arrays until `view` is dropped.
        let (types, sizes) = unsafe {
            (
                slice_or_empty(types.output_types, n),
                slice_or_empty(dims.dim_sizes, n),
            )
        };
        let total: usize = sizes.iter().sum();
        // SAFETY: as above; `dims` holds the concatenated dimensions.
        let all_dims = unsafe { slice_or_empty(dims.dims, total) };
        let mut offset = 0;
        let mut shapes = Vec::with_capacity(n);
        for (code, size) in types.iter().zip(sizes) {
            let element_type = ElementType::from_code(*code).map_err(|_| {
                Error::invalid(format!(
                    "the program returns an element type (PJRT code {code}) EXLA does not support"
                ))
            })?;
            shapes.push(Shape {
                element_type,
                dims: all_dims[offset..offset + size].to_vec(),
            });
            offset += size;
        }
        Ok(shapes)
    }

    /// Checks the count, client, device, type and shape of each argument.
    /// Not whether it is live: that costs a plugin call per argument, and a
    /// plugin refuses a deleted argument itself, which `buffer::explain` then
    /// reports as `DeletedBuffer`.
    fn check_arguments(&self, args: &[&Buffer], device: usize) -> Result<()> {
        if args.len() != self.input_shapes.len() {
            return Err(Error::invalid(format!(
                "the executable expects {} argument(s), got {}",
                self.input_shapes.len(),
                args.len()
            )));
        }
        for (i, (arg, expected)) in args.iter().zip(&self.input_shapes).enumerate() {
            if !Arc::ptr_eq(arg.client(), &self.client) {
                return Err(Error::invalid(format!(
                    "argument {i} lives on another client than the executable"
                )));
            }
            if arg.device() != device {
                return Err(Error::invalid(format!(
                    "argument {i} lives on device {}, but the executable runs on device {device}",
                    arg.device()
                )));
            }
            if arg.shape() != expected {
                return Err(Error::invalid(format!(
                    "argument {i} has type {:?} and shape {:?}, but the executable expects type {:?} and shape {:?}",
                    arg.shape().element_type,
                    arg.shape().dims,
                    expected.element_type,
                    expected.dims
                )));
            }
        }
        Ok(())
    }

    /// Runs on the executable's device. Only arguments whose positions are
    /// in `donatable` may be donated (when the program aliases them).
    pub fn execute(&self, args: &[&Buffer], donatable: &[usize]) -> Result<Vec<Buffer>> {
        // The per-call path of every tiny program: one argument list, with
        // no allocation beyond the two pointer arrays the plugin reads.
        let [device] = self.devices[..] else {
            return Err(self.argument_lists_error(1));
        };
        self.check_arguments(args, device)?;
        // Once per buffer: one passed at two donated positions is the
        // plugin's to refuse.
        let mut donated: Vec<(usize, &Buffer)> = donated_arguments(args, donatable).collect();
        donated.sort_by_key(|(_, b)| b.raw() as usize);
        donated.dedup_by_key(|(_, b)| b.raw() as usize);
        let _donated = donated
            .into_iter()
            .map(|(position, arg)| hold_donated(position, arg))
            .collect::<Result<Vec<_>>>()?;
        let raw_args: Vec<*mut PJRT_Buffer> = args.iter().map(|b| b.raw()).collect();
        let mut outputs = vec![std::ptr::null_mut(); self.output_shapes.len()];
        self.launch(&[raw_args.as_ptr()], &[outputs.as_mut_ptr()], donatable, 0)
            .map_err(|e| explain(e, args.iter().copied()))?;
        Ok(self.wrap_outputs(outputs, device))
    }

    fn argument_lists_error(&self, given: usize) -> Error {
        Error::invalid(format!(
            "the executable runs on {} device(s) and takes one argument list per device, got {given}",
            self.devices.len()
        ))
    }

    /// Runs on every device of the executable at once: `lists[i]` are the
    /// arguments of `devices()[i]`, and the result has that device's
    /// outputs at the same position. The plugin requires exactly one list
    /// per device, which is checked here, like every argument.
    pub fn execute_on_devices(
        &self,
        lists: &[&[&Buffer]],
        donatable: &[usize],
    ) -> Result<Vec<Vec<Buffer>>> {
        if lists.len() != self.devices.len() {
            return Err(self.argument_lists_error(lists.len()));
        }
        for (args, device) in lists.iter().zip(&self.devices) {
            self.check_arguments(args, *device)?;
        }
        // Here every argument must be live before the plugin is called: it
        // starts the parts whose arguments it accepts, and those wait in
        // their collectives for a part that never starts, until XLA aborts
        // the process (after 40 s on the CPU plugin). Deletion waits for
        // the holds, from this check until the plugin has the arguments; a
        // buffer this launch may donate is held as a donating run holds it.
        // They are taken once per buffer, in address order, and only the
        // shared ones wait: two launches cannot wait for each other behind
        // a deletion.
        let donated: Vec<(usize, &Buffer)> = lists
            .iter()
            .flat_map(|args| donated_arguments(args, donatable))
            .collect();
        let mut unique: Vec<&Buffer> = lists.iter().flat_map(|args| args.iter().copied()).collect();
        unique.sort_by_key(|b| b.raw() as usize);
        unique.dedup_by_key(|b| b.raw() as usize);
        let (mut shared, mut exclusive) = (Vec::new(), Vec::new());
        for arg in unique {
            match donated.iter().find(|(_, d)| std::ptr::eq(*d, arg)) {
                Some(&(position, _)) => exclusive.push(hold_donated(position, arg)?),
                None => shared.push(arg.hold_shared()),
            }
            arg.ensure_live()?;
        }
        let raw_args: Vec<Vec<*mut PJRT_Buffer>> = lists
            .iter()
            .map(|args| args.iter().map(|b| b.raw()).collect())
            .collect();
        let arg_lists: Vec<*const *mut PJRT_Buffer> =
            raw_args.iter().map(|list| list.as_ptr()).collect();
        let mut outputs: Vec<Vec<*mut PJRT_Buffer>> = self
            .devices
            .iter()
            .map(|_| vec![std::ptr::null_mut(); self.output_shapes.len()])
            .collect();
        let output_lists: Vec<*mut *mut PJRT_Buffer> =
            outputs.iter_mut().map(|list| list.as_mut_ptr()).collect();
        self.launch(&arg_lists, &output_lists, donatable, next_launch_id())
            .map_err(|e| explain(e, lists.iter().flat_map(|args| args.iter().copied())))?;
        Ok(outputs
            .into_iter()
            .zip(&self.devices)
            .map(|(list, device)| self.wrap_outputs(list, *device))
            .collect())
    }

    /// Calls the plugin's Execute: `arg_lists[i]` points at the arguments
    /// of device `i` (checked by the caller), `output_lists[i]` at room for
    /// its outputs, which the plugin fills. `launch_id` is 0 for one
    /// device, `next_launch_id()` for several.
    fn launch(
        &self,
        arg_lists: &[*const *mut PJRT_Buffer],
        output_lists: &[*mut *mut PJRT_Buffer],
        donatable: &[usize],
        launch_id: c_int,
    ) -> Result<()> {
        let num_args = self.input_shapes.len();
        let kept: Vec<i64> = (0..num_args)
            .filter(|i| !donatable.contains(i))
            .map(|i| i as i64)
            .collect();
        let mut options = new_args!(ffi::PJRT_ExecuteOptions, incarnation_ids);
        options.non_donatable_input_indices = kept.as_ptr();
        options.num_non_donatable_input_indices = kept.len();
        options.launch_id = launch_id;
        let mut exec = new_args!(ffi::PJRT_LoadedExecutable_Execute_Args, execute_device);
        exec.executable = self.raw;
        exec.options = &mut options;
        exec.argument_lists = arg_lists.as_ptr();
        exec.num_devices = arg_lists.len();
        exec.num_args = num_args;
        exec.output_lists = output_lists.as_ptr();
        // execute_device stays null: the executable runs where it was
        // compiled for (the CPU plugin refuses other devices there).
        call!(
            self.client.plugin(),
            PJRT_LoadedExecutable_Execute,
            &mut exec
        )
        .map(|_| ())
    }

    fn wrap_outputs(&self, raws: Vec<*mut PJRT_Buffer>, device: usize) -> Vec<Buffer> {
        raws.into_iter()
            .zip(&self.output_shapes)
            .map(|(raw, shape)| Buffer::from_raw(&self.client, raw, shape.clone(), device))
            .collect()
    }

    /// The plugin's serialized form of the executable.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let view = self.view()?;
        let mut args = new_args!(
            ffi::PJRT_Executable_Serialize_Args,
            serialized_executable_deleter
        );
        args.executable = view.raw;
        call!(self.client.plugin(), PJRT_Executable_Serialize, &mut args)?;
        // SAFETY: the bytes stay valid until the deleter is called.
        let bytes = unsafe {
            slice_or_empty(
                args.serialized_bytes.cast::<u8>(),
                args.serialized_bytes_size,
            )
        }
        .to_vec();
        if let Some(deleter) = args.serialized_executable_deleter {
            // SAFETY: called once, on the object the plugin handed out.
            unsafe {
                crate::guard::call_void(
                    "serialized_executable_deleter",
                    deleter,
                    args.serialized_executable,
                )
            }?;
        }
        Ok(bytes)
    }
}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let mut args = new_args!(ffi::PJRT_LoadedExecutable_Destroy_Args, executable);
        args.executable = self.raw;
        let _ = (|| -> Result<()> {
            call!(
                self.client.plugin(),
                PJRT_LoadedExecutable_Destroy,
                &mut args
            )
        })();
    }
}

/// A slice over plugin-owned memory; null pointers become empty slices.
unsafe fn slice_or_empty<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if ptr.is_null() || len == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(ptr, len)
    }
}

/// The arguments at the `donatable` positions, with their positions.
fn donated_arguments<'a, 'b>(
    args: &'b [&'a Buffer],
    donatable: &'b [usize],
) -> impl Iterator<Item = (usize, &'a Buffer)> + 'b {
    donatable.iter().filter_map(|&i| Some((i, *args.get(i)?)))
}

/// Holds the argument at `position` for a run that may donate it (the
/// plugin deletes a donated buffer): neither a launch on several devices
/// nor a read may see it deleted after its liveness check (see `Buffer`).
/// They hold a buffer briefly, but a donating run may be on a scheduler of
/// the VM: it fails rather than wait.
fn hold_donated(position: usize, arg: &Buffer) -> Result<RwLockWriteGuard<'_, ()>> {
    arg.try_hold_exclusive().ok_or_else(|| {
        Error::invalid(format!(
            "argument {position} is donated, but another process is reading it \
             or running a program on several devices with it"
        ))
    })
}

/// An id for a launch on several devices, positive and different from
/// those of the launches that may run at the same time. The CPU plugin
/// meets the parts of a launch in its collectives by this id (its "run
/// id"), across the whole process: two clients' launches with the same id
/// met each other, and XLA aborted the process.
fn next_launch_id() -> c_int {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % c_int::MAX as u32;
    n as c_int + 1
}
