//! Compiling, running and serializing programs.
//!
//! Where each call runs is decided by `EXLA.Executable` (see the README's
//! "Where native calls run"); these functions only obey. Compiling runs on
//! the big-stack threads of `pool::compiles()`, (de)serializing on those of
//! `pool::serializes()`, and both reply by message; a run is one of three
//! NIFs: on the calling process's scheduler, on a dirty CPU scheduler, or
//! on a thread of `pool::runs()`.

use std::sync::Arc;
use std::time::Instant;

use rustler::{Atom, Binary, Encoder, Env, NewBinary, ResourceArc, Term};

use crate::buffer::{shape, BufferResource};
use crate::cancel::{self, Run};
use crate::client::ClientResource;
use crate::diagnostics::millis;
use crate::error::{Error, NifResult};
use crate::memory::Ledger;
use crate::pool::{self, OffThread, SlowToDrop};

/// An executable and the memory ledger of its client, where its outputs
/// are counted. Destroyed on the drop thread (see `pool::OffThread`).
pub struct ExecutableResource {
    pub handle: OffThread<pjrt::LoadedExecutable>,
    ledger: Arc<Ledger>,
    /// The bytes a loaded executable was loaded from, which serializing it
    /// gives back: the CPU plugin serializes a loaded executable without
    /// its compiled code (4.9 of 10.6 KB for a small MLP), which then
    /// loads but fails to run ("Function add_tanh_fusion not found").
    loaded_from: Option<Vec<u8>>,
}

impl SlowToDrop for pjrt::LoadedExecutable {
    /// 0.03 ms for a tiny program, 0.6 ms for an MLP training step.
    fn slow_to_drop(&self) -> bool {
        true
    }
}

#[rustler::resource_impl]
impl rustler::Resource for ExecutableResource {}

impl ExecutableResource {
    /// An executable of `client` whose runs are checked against `inputs`.
    fn new(
        executable: pjrt::LoadedExecutable,
        inputs: Vec<pjrt::Shape>,
        client: &ClientResource,
        loaded_from: Option<Vec<u8>>,
    ) -> ResourceArc<ExecutableResource> {
        ResourceArc::new(ExecutableResource {
            handle: OffThread::new(executable.with_input_shapes(inputs)),
            ledger: client.ledger.clone(),
            loaded_from,
        })
    }
}

type ShapeSpec = (i32, Vec<i64>);

fn shapes(specs: Vec<ShapeSpec>) -> NifResult<Vec<pjrt::Shape>> {
    specs
        .into_iter()
        .map(|(code, dims)| shape(code, dims))
        .collect()
}

/// Compiles on a compile thread; replies `{reference, result}`. Itself on
/// a dirty scheduler: it copies the program text, which may take megabytes.
#[rustler::nif(schedule = "DirtyIo")]
#[allow(clippy::too_many_arguments)]
fn executable_compile<'a>(
    env: Env<'a>,
    client: ResourceArc<ClientResource>,
    mlir: Binary,
    input_shapes: Vec<ShapeSpec>,
    device: usize,
    num_replicas: i64,
    num_partitions: i64,
    shardy: bool,
    reference: Term<'a>,
) -> NifResult<Atom> {
    let inputs = shapes(input_shapes)?;
    let options = client.compile_options(num_replicas, num_partitions, shardy);
    let mlir = mlir.as_slice().to_vec();
    pool::reply_later(env, pool::compiles(), reference, move || {
        let started = Instant::now();
        let executable = client
            .handle
            .compile(&mlir, device, &options)
            .inspect_err(|error| {
                tracing::debug!(target: "exla::compile", %error, "compilation failed");
            })?;
        tracing::info!(
            target: "exla::compile",
            device,
            mlir_bytes = mlir.len(),
            duration_ms = millis(started),
            "compiled a program"
        );
        Ok(ExecutableResource::new(executable, inputs, &client, None))
    })
}

#[rustler::nif]
fn executable_output_shapes(executable: ResourceArc<ExecutableResource>) -> Vec<ShapeSpec> {
    executable
        .handle
        .output_shapes()
        .iter()
        .map(|s| (s.element_type.code(), s.dims.clone()))
        .collect()
}

type Buffers = Vec<ResourceArc<BufferResource>>;

/// Gives up the arguments at the positions in `donatable` once an
/// execution has taken them. Before the outputs are counted: an output
/// that reuses a donated buffer takes no new memory. The execution has
/// happened by then, so a failure to delete one is logged, not returned:
/// failing the run would drop its outputs and skip the arguments after it.
/// Such an argument stays counted until its resource is dropped.
///
/// After a launch that `failed`, only those it took nonetheless (deleted by
/// the plugin: an execution that failed as it ran, such as a run stopped by
/// its check, see `cancel`), so that they stop counting; those it refused
/// before taking them stay as they are.
fn give_up_donated(arguments: &[ResourceArc<BufferResource>], donatable: &[usize], failed: bool) {
    for (position, argument) in donatable
        .iter()
        .filter_map(|&i| Some((i, arguments.get(i)?)))
    {
        if failed && !argument.handle.is_deleted().unwrap_or(false) {
            continue;
        }
        if let Err(error) = argument.give_up() {
            tracing::warn!(
                target: "exla::run",
                position,
                error = %error.0,
                "could not delete a donated argument after the run"
            );
        }
    }
}

/// The outputs of one device, counted in the executable's ledger.
fn wrap_outputs(executable: &ExecutableResource, outputs: Vec<pjrt::Buffer>) -> Buffers {
    outputs
        .into_iter()
        .map(|b| BufferResource::new(b, &executable.ledger))
        .collect()
}

/// Blocks until every output is computed; the first failure is returned.
fn wait_for<'a>(
    outputs: impl IntoIterator<Item = &'a ResourceArc<BufferResource>>,
) -> NifResult<()> {
    for output in outputs {
        output.handle.wait()?;
    }
    Ok(())
}

/// Refuses to donate a read-only view (an IPC import without write
/// permission): XLA would write to memory mapped read-only and fault.
fn refuse_read_only_donation(
    arguments: &[ResourceArc<BufferResource>],
    donatable: &[usize],
) -> NifResult<()> {
    let read_only = |&&i: &&usize| arguments.get(i).is_some_and(|b| b.read_only);
    match donatable.iter().find(read_only) {
        Some(position) => Err(Error::argument(format!(
            "argument {position} is a read-only view of shared memory (an IPC pointer \
             imported without write permission) and cannot be donated"
        ))),
        None => Ok(()),
    }
}

/// Enqueues one execution. Every argument at a position in `donatable` is
/// given up: the program reuses its memory for an output when it aliases
/// it, and it is deleted otherwise, so a donated argument always reads as
/// deleted afterwards. A program whose loops check whether they are still
/// wanted gets `run`'s id after the arguments (see `cancel`).
fn run(
    executable: &ExecutableResource,
    arguments: &[ResourceArc<BufferResource>],
    donatable: &[usize],
    run: Option<&Run>,
) -> NifResult<Buffers> {
    refuse_read_only_donation(arguments, donatable)?;
    let mut buffers: Vec<&pjrt::Buffer> = arguments.iter().map(|b| &*b.handle).collect();
    let id = match run {
        Some(run) => Some(cancel::id_buffer(
            &executable.handle,
            run,
            executable.handle.device(),
        )?),
        None => None,
    };
    buffers.extend(id.as_ref());
    let outputs = executable
        .handle
        .execute(&buffers, donatable)
        .inspect_err(|_| give_up_donated(arguments, donatable, true))?;
    give_up_donated(arguments, donatable, false);
    tracing::trace!(
        target: "exla::run",
        arguments = arguments.len(),
        donated = donatable.len(),
        outputs = outputs.len(),
        "ran a program"
    );
    Ok(wrap_outputs(executable, outputs))
}

/// Runs and waits for the outputs (on a native thread).
pub fn run_and_wait(
    executable: &ExecutableResource,
    arguments: &[ResourceArc<BufferResource>],
    donatable: &[usize],
    watched: Option<&Watched>,
) -> NifResult<Buffers> {
    let outputs = run(
        executable,
        arguments,
        donatable,
        watched.map(|(run, _)| &**run),
    )?;
    wait_for(&outputs)?;
    Ok(outputs)
}

/// The devices the executable runs on (indices in its client's devices),
/// in the order `executable_run_devices` takes argument lists.
#[rustler::nif]
fn executable_devices(executable: ResourceArc<ExecutableResource>) -> Vec<usize> {
    executable.handle.devices().to_vec()
}

/// A run that stops once the calling process is gone, with the monitor
/// of that process (see `cancel`), for programs whose loops check it.
pub type Watched = (std::sync::Arc<Run>, ResourceArc<cancel::Watch>);

/// The watch of a run of the calling process, when `checked` (the
/// program takes a run id, a fact Elixir keeps).
pub fn watch_caller(env: Env, checked: bool) -> Option<Watched> {
    checked.then(|| cancel::watch(env, &env.pid()))
}

/// Runs a program of several replicas or partitions on all its devices at
/// once (`lists[i]` on the i-th of `executable_devices`), on a thread of
/// the run pool: its parts may wait for each other in collectives. Waits
/// there for every output; replies `{reference, result}` with one list of
/// outputs per device. With `checked`, as `executable_run_async`.
#[rustler::nif]
fn executable_run_devices<'a>(
    env: Env<'a>,
    executable: ResourceArc<ExecutableResource>,
    lists: Vec<Vec<ResourceArc<BufferResource>>>,
    donatable: Vec<usize>,
    reference: Term<'a>,
    checked: bool,
) -> NifResult<Atom> {
    let watched = watch_caller(env, checked);
    pool::reply_later(env, pool::runs(), reference, move || {
        for list in &lists {
            refuse_read_only_donation(list, &donatable)?;
        }
        // Each device's part takes the run's id last.
        let ids = match &watched {
            Some((run, _)) => executable
                .handle
                .devices()
                .iter()
                .map(|&device| cancel::id_buffer(&executable.handle, run, device))
                .collect::<pjrt::Result<Vec<_>>>()?,
            None => Vec::new(),
        };
        let buffers: Vec<Vec<&pjrt::Buffer>> = lists
            .iter()
            .enumerate()
            .map(|(i, list)| list.iter().map(|b| &*b.handle).chain(ids.get(i)).collect())
            .collect();
        let arguments: Vec<&[&pjrt::Buffer]> = buffers.iter().map(|l| &l[..]).collect();
        let outputs = executable
            .handle
            .execute_on_devices(&arguments, &donatable)
            .inspect_err(|_| {
                for list in &lists {
                    give_up_donated(list, &donatable, true);
                }
            })?;
        for list in &lists {
            give_up_donated(list, &donatable, false);
        }
        let outputs: Vec<Buffers> = outputs
            .into_iter()
            .map(|device| wrap_outputs(&executable, device))
            .collect();
        wait_for(outputs.iter().flatten())?;
        Ok(outputs)
    })
}

scheduler_variants! {
    /// Enqueues an execution and returns its output buffers at once; their
    /// data is ready later (see `buffer_ready`/`buffer_await`). For tiny
    /// straight-line programs, which XLA:CPU runs inline in microseconds.
    fn executable_run;
    /// The same on a dirty CPU scheduler, for straight-line programs too
    /// large to run inline on a normal one.
    dirty "DirtyCpu" fn executable_run_dirty(
        executable: ResourceArc<ExecutableResource>,
        arguments: Vec<ResourceArc<BufferResource>>,
        donatable: Vec<usize>,
    ) -> NifResult<Vec<ResourceArc<BufferResource>>> {
        run(&executable, &arguments, &donatable, None)
    }
}

/// Runs on a thread of the run pool, for programs that may run long, and
/// waits there for the outputs; replies `{reference, result}`. With
/// `checked`, the program takes a run id last, and the run stops when the
/// calling process is gone (see `cancel`).
#[rustler::nif]
fn executable_run_async<'a>(
    env: Env<'a>,
    executable: ResourceArc<ExecutableResource>,
    arguments: Vec<ResourceArc<BufferResource>>,
    donatable: Vec<usize>,
    reference: Term<'a>,
    checked: bool,
) -> NifResult<Atom> {
    let watched = watch_caller(env, checked);
    pool::reply_later(env, pool::runs(), reference, move || {
        run_and_wait(&executable, &arguments, &donatable, watched.as_ref())
    })
}

/// A serialized executable on its way to the BEAM as a binary.
struct Serialized(Vec<u8>);

impl Encoder for Serialized {
    fn encode<'a>(&self, env: Env<'a>) -> Term<'a> {
        let mut binary = NewBinary::new(env, self.0.len());
        binary.as_mut_slice().copy_from_slice(&self.0);
        Binary::from(binary).encode(env)
    }
}

/// Serializes on a serialization thread; replies `{reference, binary}`.
#[rustler::nif]
fn executable_serialize<'a>(
    env: Env<'a>,
    executable: ResourceArc<ExecutableResource>,
    reference: Term<'a>,
) -> NifResult<Atom> {
    pool::reply_later(
        env,
        pool::serializes(),
        reference,
        move || match &executable.loaded_from {
            Some(bytes) => Ok(Serialized(bytes.clone())),
            None => Ok(Serialized(executable.handle.serialize()?)),
        },
    )
}

/// Loads on a serialization thread; replies `{reference, result}`. Itself on a
/// dirty scheduler: it copies the serialized executable (megabytes).
#[rustler::nif(schedule = "DirtyIo")]
fn executable_deserialize<'a>(
    env: Env<'a>,
    client: ResourceArc<ClientResource>,
    bytes: Binary,
    input_shapes: Vec<ShapeSpec>,
    device: usize,
    reference: Term<'a>,
) -> NifResult<Atom> {
    let inputs = shapes(input_shapes)?;
    let bytes = bytes.as_slice().to_vec();
    pool::reply_later(env, pool::serializes(), reference, move || {
        let started = Instant::now();
        let executable = client.handle.deserialize(&bytes, device).inspect_err(|error| {
            tracing::debug!(target: "exla::compile", %error, "loading a serialized executable failed");
        })?;
        tracing::info!(
            target: "exla::compile",
            device,
            bytes = bytes.len(),
            duration_ms = millis(started),
            "loaded a serialized executable"
        );
        Ok(ExecutableResource::new(
            executable,
            inputs,
            &client,
            Some(bytes),
        ))
    })
}
