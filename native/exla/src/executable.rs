//! Compiling, running and serializing programs.

use rustler::{Binary, Env, OwnedBinary, ResourceArc};

use crate::buffer::{shape, BufferResource};
use crate::client::ClientResource;
use crate::error::{Error, NifResult};

pub struct ExecutableResource(pub pjrt::LoadedExecutable);

#[rustler::resource_impl]
impl rustler::Resource for ExecutableResource {}

type ShapeSpec = (i32, Vec<i64>);

fn shapes(specs: Vec<ShapeSpec>) -> NifResult<Vec<pjrt::Shape>> {
    specs
        .into_iter()
        .map(|(code, dims)| shape(code, dims))
        .collect()
}

#[rustler::nif(schedule = "DirtyCpu")]
fn executable_compile(
    client: ResourceArc<ClientResource>,
    mlir: Binary,
    input_shapes: Vec<ShapeSpec>,
    device: usize,
    num_replicas: i64,
    num_partitions: i64,
) -> NifResult<ResourceArc<ExecutableResource>> {
    let inputs = shapes(input_shapes)?;
    let options = pjrt::CompileOptions {
        device_ordinal: -1,
        num_replicas,
        num_partitions,
    };
    let executable = client.0.compile(mlir.as_slice(), device, &options)?;
    Ok(ResourceArc::new(ExecutableResource(
        executable.with_input_shapes(inputs),
    )))
}

#[rustler::nif]
fn executable_output_shapes(executable: ResourceArc<ExecutableResource>) -> Vec<ShapeSpec> {
    executable
        .0
        .output_shapes()
        .iter()
        .map(|s| (s.element_type.code(), s.dims.clone()))
        .collect()
}

/// Enqueues an execution and returns its output buffers at once; their data
/// is ready later (see `buffer_ready`/`buffer_await`).
#[rustler::nif]
fn executable_run(
    executable: ResourceArc<ExecutableResource>,
    arguments: Vec<ResourceArc<BufferResource>>,
    donatable: Vec<usize>,
) -> NifResult<Vec<ResourceArc<BufferResource>>> {
    let buffers: Vec<&pjrt::Buffer> = arguments.iter().map(|b| &b.0).collect();
    let outputs = executable.0.execute(&buffers, &donatable)?;
    Ok(outputs
        .into_iter()
        .map(|b| ResourceArc::new(BufferResource(b)))
        .collect())
}

#[rustler::nif(schedule = "DirtyCpu")]
fn executable_serialize<'a>(
    env: Env<'a>,
    executable: ResourceArc<ExecutableResource>,
) -> NifResult<Binary<'a>> {
    let bytes = executable.0.serialize()?;
    let mut out = OwnedBinary::new(bytes.len())
        .ok_or_else(|| Error::argument("could not allocate the serialized executable"))?;
    out.as_mut_slice().copy_from_slice(&bytes);
    Ok(out.release(env))
}

#[rustler::nif(schedule = "DirtyCpu")]
fn executable_deserialize(
    client: ResourceArc<ClientResource>,
    bytes: Binary,
    input_shapes: Vec<ShapeSpec>,
    device: usize,
) -> NifResult<ResourceArc<ExecutableResource>> {
    let inputs = shapes(input_shapes)?;
    let executable = client.0.deserialize(bytes.as_slice(), device)?;
    Ok(ResourceArc::new(ExecutableResource(
        executable.with_input_shapes(inputs),
    )))
}
