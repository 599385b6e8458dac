//! Tests of the bindings against the real CPU plugin (found as described in
//! `common/mod.rs`).

mod common;

use std::sync::Arc;

use common::{plugin, plugin_file};
use pjrt::debug_options::{debug_option_fields, registered_flag_names, FieldKind};
use pjrt::{
    Buffer, Client, CompileOptions, ElementType, Error, OptionOverride, OptionValue, Plugin, Shape,
};

// Adds two f32[3] (shared with examples/execute_bench.rs).
const ADD: &str = include_str!("common/add.mlir");

const ADD_DONATING: &str = r#"
module {
  func.func public @main(%a: tensor<3xf32> {tf.aliasing_output = 0 : i32}, %b: tensor<3xf32>) -> tensor<3xf32> {
    %0 = stablehlo.add %a, %b : tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}
"#;

const DOUBLE_DONATING: &str = r#"
module {
  func.func public @main(%a: tensor<2xf32> {tf.aliasing_output = 0 : i32}) -> tensor<2xf32> {
    %0 = stablehlo.add %a, %a : tensor<2xf32>
    return %0 : tensor<2xf32>
  }
}
"#;

const TWO_RESULTS: &str = r#"
module {
  func.func public @main(%a: tensor<2x2xi64>) -> (tensor<2x2xi64>, tensor<i1>) {
    %0 = stablehlo.multiply %a, %a : tensor<2x2xi64>
    %c = stablehlo.constant dense<0> : tensor<i64>
    %m = stablehlo.reduce(%a init: %c) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x2xi64>, tensor<i64>) -> tensor<i64>
    %1 = stablehlo.compare GT, %m, %c : (tensor<i64>, tensor<i64>) -> tensor<i1>
    return %0, %1 : tensor<2x2xi64>, tensor<i1>
  }
}
"#;

fn client(devices: i64) -> Arc<Client> {
    Client::create(
        &plugin(),
        &[("cpu_device_count".into(), OptionValue::Int64(devices))],
    )
    .expect("a CPU client")
}

fn f32_shape(dims: &[i64]) -> Shape {
    Shape::new(ElementType::F32, dims.to_vec()).unwrap()
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn read_f32(buffer: &Buffer) -> Vec<f32> {
    let mut bytes = vec![0u8; buffer.shape().byte_size().unwrap()];
    buffer.copy_to_host(&mut bytes).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn upload(client: &Arc<Client>, values: &[f32]) -> Buffer {
    client
        .buffer_from_host(&f32_bytes(values), &f32_shape(&[values.len() as i64]), 0)
        .unwrap()
}

fn compile(client: &Arc<Client>, mlir: &str, inputs: Vec<Shape>) -> pjrt::LoadedExecutable {
    compile_on(client, mlir, inputs, 0)
}

fn compile_on(
    client: &Arc<Client>,
    mlir: &str,
    inputs: Vec<Shape>,
    device: usize,
) -> pjrt::LoadedExecutable {
    client
        .compile(mlir.as_bytes(), device, &CompileOptions::default())
        .unwrap()
        .with_input_shapes(inputs)
}

#[test]
fn reports_version_and_devices() {
    let plugin = plugin();
    assert!(plugin.api_version() >= pjrt::MIN_API_VERSION);
    let one = client(1);
    assert_eq!(one.platform_name(), "cpu");
    assert_eq!(one.devices().len(), 1);
    assert_eq!(client(3).devices().len(), 3);
    assert!(matches!(one.device(1), Err(Error::InvalidArgument(_))));
}

#[test]
fn refuses_create_options_of_the_wrong_type() {
    let plugin = plugin();
    for bad in [
        OptionValue::String("1".into()),
        OptionValue::Float(1.0),
        OptionValue::Int64(0),
        OptionValue::Int64(-5),
    ] {
        let result = Client::create(&plugin, &[("cpu_device_count".into(), bad)]);
        assert!(matches!(result, Err(Error::InvalidArgument(_))));
    }
    let result = Client::create(&plugin, &[("asynchronous".into(), OptionValue::Int64(1))]);
    assert!(matches!(result, Err(Error::InvalidArgument(_))));
}

// CPU plugins differ on names they do not know: lammps-jax-pjrt-cpu refuses
// them, xla-cpu-pjrt and fastatomstruct-xla-cpu ignore them. Either is an
// answer, never an abort, whatever the value's type.
#[test]
fn unknown_create_options_are_ignored_or_refused() {
    let plugin = plugin();
    for value in [
        OptionValue::Int64(1),
        OptionValue::String("x".into()),
        OptionValue::Bool(true),
        OptionValue::Float(0.5),
    ] {
        match Client::create(&plugin, &[("bogus_option".into(), value)]) {
            Ok(client) => assert!(!client.devices().is_empty()),
            Err(error) => {
                assert!(error.is_argument_error(), "{error}");
                assert!(error.to_string().contains("bogus_option"), "{error}");
            }
        }
    }
}

#[test]
fn loading_twice_returns_the_same_plugin() {
    assert!(Arc::ptr_eq(&plugin(), &plugin()));
}

#[test]
fn compiles_and_executes() {
    let client = client(1);
    let exe = compile(&client, ADD, vec![f32_shape(&[3]), f32_shape(&[3])]);
    assert_eq!(exe.output_shapes(), &[f32_shape(&[3])]);
    let a = upload(&client, &[1.0, 2.0, 3.0]);
    let b = upload(&client, &[10.0, 20.0, 30.0]);
    let out = exe.execute(&[&a, &b], &[]).unwrap();
    assert_eq!(read_f32(&out[0]), vec![11.0, 22.0, 33.0]);
    // Inputs are untouched and can be used again.
    let again = exe.execute(&[&out[0], &b], &[]).unwrap();
    assert_eq!(read_f32(&again[0]), vec![21.0, 42.0, 63.0]);
}

#[test]
fn executes_programs_with_several_results_and_types() {
    let client = client(1);
    let input = Shape::new(ElementType::S64, vec![2, 2]).unwrap();
    let exe = compile(&client, TWO_RESULTS, vec![input.clone()]);
    assert_eq!(exe.output_shapes()[1].element_type, ElementType::Pred);
    let data: Vec<u8> = [1i64, -2, 3, 4]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let a = client.buffer_from_host(&data, &input, 0).unwrap();
    let out = exe.execute(&[&a], &[]).unwrap();
    let mut squares = vec![0u8; 32];
    out[0].copy_to_host(&mut squares).unwrap();
    let squares: Vec<i64> = squares
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(squares, vec![1, 4, 9, 16]);
    let mut positive = [0u8; 1];
    out[1].copy_to_host(&mut positive).unwrap();
    assert_eq!(positive, [1]);
}

#[test]
fn reads_a_prefix_and_rejects_oversized_reads() {
    let client = client(1);
    let a = upload(&client, &[1.0, 2.0, 3.0]);
    let mut first = [0u8; 4];
    a.copy_to_host(&mut first).unwrap();
    assert_eq!(f32::from_le_bytes(first), 1.0);
    let mut too_big = [0u8; 16];
    assert!(matches!(
        a.copy_to_host(&mut too_big),
        Err(Error::InvalidArgument(_))
    ));
}

/// XLA packs s4 two per byte on the device; the host gives and gets them
/// a byte each, and a copy never reads past the packed storage.
#[test]
fn sub_byte_types_are_packed_on_the_device_and_read_a_byte_each() {
    let client = client(1);
    let count = 1 << 22;
    let host: Vec<u8> = (0..count).map(|i| (i % 16) as u8).collect();
    let shape = Shape::new(ElementType::U4, vec![count as i64]).unwrap();
    let buffer = client.buffer_from_host(&host, &shape, 0).unwrap();
    assert_eq!(buffer.on_device_size().unwrap(), count / 2);
    assert_eq!(upload(&client, &[1.0]).on_device_size().unwrap(), 4);
    buffer.wait().unwrap();
    let mut raw = vec![0u8; count];
    assert!(!buffer.try_copy_from_host_memory(&mut raw).unwrap());
    let mut back = vec![0u8; count];
    buffer.copy_to_host(&mut back).unwrap();
    assert!(back == host);
}

#[test]
fn rejects_arguments_of_the_wrong_type_or_shape() {
    let client = client(1);
    let exe = compile(&client, ADD, vec![f32_shape(&[3]), f32_shape(&[3])]);
    let a = upload(&client, &[1.0, 2.0, 3.0]);
    let ints = client
        .buffer_from_host(
            &[0u8; 12],
            &Shape::new(ElementType::S32, vec![3]).unwrap(),
            0,
        )
        .unwrap();
    let matrix = client
        .buffer_from_host(&[0u8; 12], &f32_shape(&[1, 3]), 0)
        .unwrap();
    for bad in [&ints, &matrix] {
        match exe.execute(&[&a, bad], &[]) {
            Err(Error::InvalidArgument(message)) => assert!(message.contains("argument 1")),
            other => panic!("expected an argument error, got {:?}", other.err()),
        }
    }
    assert!(matches!(
        exe.execute(&[&a], &[]),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn rejects_binaries_of_the_wrong_size() {
    let client = client(1);
    let result = client.buffer_from_host(&[0u8; 8], &f32_shape(&[3]), 0);
    assert!(matches!(result, Err(Error::InvalidArgument(_))));
    assert!(Shape::new(ElementType::F32, vec![-1]).is_err());
    assert!(Shape::new(ElementType::F64, vec![i64::MAX, i64::MAX]).is_err());
}

#[test]
fn reports_invalid_programs() {
    let client = client(1);
    for bad in [
        "",
        "module {",
        "not mlir at all",
        "module { func.func @other() { return } }",
    ] {
        let err = client
            .compile(bad.as_bytes(), 0, &CompileOptions::default())
            .err()
            .expect("compilation fails");
        assert!(!err.to_string().is_empty());
    }
}

#[test]
fn refuses_zero_replicas_before_the_plugin_sees_them() {
    let client = client(1);
    let options = CompileOptions {
        num_replicas: 0,
        ..CompileOptions::default()
    };
    let result = client.compile(ADD.as_bytes(), 0, &options);
    assert!(matches!(result, Err(Error::InvalidArgument(_))));
    let huge = CompileOptions {
        num_replicas: i64::MAX,
        num_partitions: i64::MAX,
        ..CompileOptions::default()
    };
    let result = client.compile(ADD.as_bytes(), 0, &huge);
    assert!(matches!(result, Err(Error::InvalidArgument(_))));
}

/// Option overrides reach the plugin: a known one compiles, an unknown one
/// fails the compilation naming it.
#[test]
fn compile_option_overrides_reach_the_plugin() {
    let client = client(1);
    let with_override = |name: &str| CompileOptions {
        env_option_overrides: vec![(name.to_string(), OptionOverride::Bool(false))],
        ..CompileOptions::default()
    };
    let known = with_override("xla_cpu_use_xnnpack");
    client.compile(ADD.as_bytes(), 0, &known).unwrap();
    let unknown = with_override("xla_no_such_option");
    let error = client.compile(ADD.as_bytes(), 0, &unknown).err().unwrap();
    assert!(format!("{error}").contains("xla_no_such_option"), "{error}");
}

#[test]
fn deleted_buffers_fail_cleanly() {
    let client = client(1);
    let exe = compile(&client, ADD, vec![f32_shape(&[3]), f32_shape(&[3])]);
    let a = upload(&client, &[1.0, 2.0, 3.0]);
    assert!(a.delete().unwrap());
    assert!(!a.delete().unwrap());
    assert_eq!(
        exe.execute(&[&a, &a], &[]).err(),
        Some(Error::DeletedBuffer)
    );
    let mut bytes = [0u8; 12];
    assert_eq!(a.copy_to_host(&mut bytes).err(), Some(Error::DeletedBuffer));
    assert_eq!(a.wait().err(), Some(Error::DeletedBuffer));
    assert_eq!(a.is_ready().err(), Some(Error::DeletedBuffer));
    assert_eq!(
        Error::DeletedBuffer.to_string(),
        "called on deleted or donated buffer"
    );
}

/// Threads reading, copying and deleting the same buffers at once: every
/// read gets the data or `DeletedBuffer`, and the C heap stays intact (the
/// plugin's external reference list is not thread-safe by itself).
#[test]
fn buffers_are_safe_to_share_between_threads() {
    let client = client(1);
    let values: Vec<f32> = (0..50_000).map(|i| i as f32).collect();
    let expected = f32_bytes(&values);
    for _round in 0..20 {
        let shared = Arc::new(upload(&client, &values));
        std::thread::scope(|scope| {
            for thread in 0..8 {
                let shared = shared.clone();
                let expected = &expected;
                scope.spawn(move || {
                    for i in 0..50 {
                        if thread == 7 && i == 25 {
                            shared.delete().unwrap();
                        }
                        let mut bytes = vec![0u8; expected.len()];
                        match shared.copy_to_host(&mut bytes) {
                            Ok(()) => assert_eq!(&bytes, expected),
                            Err(error) => assert_eq!(error, Error::DeletedBuffer),
                        }
                        match shared.copy_to_device(0) {
                            Ok(copy) => assert_eq!(read_f32(&copy).len(), expected.len() / 4),
                            Err(error) => assert_eq!(error, Error::DeletedBuffer),
                        }
                    }
                });
            }
        });
        assert!(shared.is_deleted().unwrap());
    }
}

/// A C++ exception thrown by the plugin on the calling thread (here an
/// absl status accessed unchecked while XLA sizes a huge shape) becomes an
/// error, and the client stays usable.
#[test]
fn plugin_exceptions_become_errors() {
    const HUGE: &str = r#"
module {
  func.func public @main(%a: tensor<f32>) -> tensor<f32> {
    %0 = stablehlo.broadcast_in_dim %a, dims = [] : (tensor<f32>) -> tensor<3000000000x1000000000xf32>
    %c = stablehlo.constant dense<0.0> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %c) applies stablehlo.add across dimensions = [0, 1] : (tensor<3000000000x1000000000xf32>, tensor<f32>) -> tensor<f32>
    return %1 : tensor<f32>
  }
}
"#;
    let client = client(1);
    let error = client
        .compile(HUGE.as_bytes(), 0, &CompileOptions::default())
        .err()
        .unwrap();
    assert!(
        matches!(
            &error,
            Error::PluginException {
                function: "PJRT_Client_Compile",
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("C++ exception"), "{error}");
    // A plugin with its own C++ runtime (zml's builds) is caught by the
    // frame that catches any exception, which can only name its type.
    assert_eq!(
        error.to_string().contains("its own C++ runtime"),
        client.plugin().has_own_unwinder(),
        "{error}"
    );
    let exe = compile(&client, ADD, vec![f32_shape(&[3]), f32_shape(&[3])]);
    let a = upload(&client, &[1.0, 2.0, 3.0]);
    let out = exe.execute(&[&a, &a], &[]).unwrap();
    assert_eq!(read_f32(&out[0]), vec![2.0, 4.0, 6.0]);
}

#[test]
fn donates_only_when_asked() {
    let client = client(1);
    let exe = compile(
        &client,
        ADD_DONATING,
        vec![f32_shape(&[3]), f32_shape(&[3])],
    );
    let a = upload(&client, &[1.0, 2.0, 3.0]);
    let b = upload(&client, &[1.0, 1.0, 1.0]);
    let kept = exe.execute(&[&a, &b], &[]).unwrap();
    assert_eq!(read_f32(&kept[0]), vec![2.0, 3.0, 4.0]);
    assert!(!a.is_deleted().unwrap());
    let donated = exe.execute(&[&a, &b], &[0]).unwrap();
    assert_eq!(read_f32(&donated[0]), vec![2.0, 3.0, 4.0]);
    assert!(a.is_deleted().unwrap());
}

#[test]
fn runs_on_a_chosen_device_and_copies_between_devices() {
    let client = client(2);
    let shapes = vec![f32_shape(&[3]), f32_shape(&[3])];
    let exe = compile_on(&client, ADD, shapes.clone(), 1);
    assert_eq!(exe.device(), 1);
    let a = upload(&client, &[1.0, 2.0, 3.0]);
    let a1 = a.copy_to_device(1).unwrap();
    assert_eq!(a1.device(), 1);
    let out = exe.execute(&[&a1, &a1], &[]).unwrap();
    assert_eq!(out[0].device(), 1);
    assert_eq!(read_f32(&out[0]), vec![2.0, 4.0, 6.0]);
    // Arguments on another device than the executable's are refused.
    assert!(matches!(
        exe.execute(&[&a, &a1], &[]),
        Err(Error::InvalidArgument(_))
    ));
    let out_of_range = client.compile(ADD.as_bytes(), 2, &CompileOptions::default());
    assert!(matches!(out_of_range, Err(Error::InvalidArgument(_))));
}

#[test]
fn serializes_and_deserializes() {
    let client = client(1);
    let exe = compile(&client, ADD, vec![f32_shape(&[3]), f32_shape(&[3])]);
    let bytes = exe.serialize().unwrap();
    assert!(!bytes.is_empty());
    let loaded = client
        .deserialize(&bytes, 0)
        .unwrap()
        .with_input_shapes(vec![f32_shape(&[3]), f32_shape(&[3])]);
    let a = upload(&client, &[1.0, 2.0, 3.0]);
    let out = loaded.execute(&[&a, &a], &[]).unwrap();
    assert_eq!(read_f32(&out[0]), vec![2.0, 4.0, 6.0]);
    assert!(client.deserialize(b"garbage", 0).is_err());
    assert!(client.deserialize(b"", 0).is_err());
}

#[test]
fn buffers_from_another_client_are_refused() {
    let first = client(1);
    let second = client(1);
    let exe = compile(&first, ADD, vec![f32_shape(&[3]), f32_shape(&[3])]);
    let a = upload(&second, &[1.0, 2.0, 3.0]);
    assert!(matches!(
        exe.execute(&[&a, &a], &[]),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn plugin_errors_name_the_problem() {
    let missing = Plugin::load("/nonexistent/plugin.so").err().unwrap();
    assert!(matches!(missing, Error::PluginLoad { .. }));
    // A shared library that is not a PJRT plugin.
    let not_plugin = std::env::current_exe().unwrap();
    assert!(Plugin::load(not_plugin).is_err());
}

/// The CPU plugin does not track device memory: it answers UNIMPLEMENTED,
/// and a device out of range is refused before the plugin sees it.
#[test]
fn memory_stats_are_unimplemented_on_cpu() {
    let client = client(2);
    for device in 0..2 {
        match client.memory_stats(device) {
            Err(Error::Pjrt { code, .. }) => assert_eq!(code, 12),
            other => panic!("expected UNIMPLEMENTED, got {other:?}"),
        }
    }
    assert!(matches!(
        client.memory_stats(2),
        Err(Error::InvalidArgument(_))
    ));
}

/// Two partitions, each adding its half of the operands (`mhlo.sharding`
/// splits them in two along their only axis).
const SHARDED_ADD: &str = r#"
module @sharded attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%a: tensor<4xf32> {mhlo.sharding = "{devices=[2]0,1}"}, %b: tensor<4xf32> {mhlo.sharding = "{devices=[2]0,1}"}) -> (tensor<4xf32> {mhlo.sharding = "{devices=[2]0,1}"}) {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"#;

/// Two partitions: a sum over the split axis (the partitioner adds an
/// all-reduce) and an unannotated result, which comes out whole on both.
const SHARDED_SUM: &str = r#"
module @sharded attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%a: tensor<4xf32> {mhlo.sharding = "{devices=[2]0,1}"}) -> (tensor<f32>, tensor<4xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %0 = stablehlo.reduce(%a init: %z) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
    %1 = stablehlo.multiply %a, %a : tensor<4xf32>
    return %0, %1 : tensor<f32>, tensor<4xf32>
  }
}
"#;

fn spmd_options(partitions: i64) -> CompileOptions {
    CompileOptions {
        num_partitions: partitions,
        use_spmd_partitioning: true,
        ..CompileOptions::default()
    }
}

/// The CPU plugin runs SPMD programs: each device gets one argument list
/// with its part of the operands, and returns its part of the results.
#[test]
fn runs_spmd_programs_on_every_device() {
    let client = client(2);
    let exe = client
        .compile(SHARDED_ADD.as_bytes(), 0, &spmd_options(2))
        .unwrap()
        .with_input_shapes(vec![f32_shape(&[2]), f32_shape(&[2])]);
    assert_eq!(exe.devices(), &[0, 1]);
    assert_eq!(exe.output_shapes(), &[f32_shape(&[2])]);
    let a0 = upload(&client, &[1.0, 2.0]);
    let a1 = upload(&client, &[3.0, 4.0]).copy_to_device(1).unwrap();
    let out = exe
        .execute_on_devices(&[&[&a0, &a0], &[&a1, &a1]], &[])
        .unwrap();
    assert_eq!(read_f32(&out[0][0]), vec![2.0, 4.0]);
    assert_eq!(out[1][0].device(), 1);
    assert_eq!(read_f32(&out[1][0]), vec![6.0, 8.0]);

    let exe = client
        .compile(SHARDED_SUM.as_bytes(), 0, &spmd_options(2))
        .unwrap()
        .with_input_shapes(vec![f32_shape(&[2])]);
    let out = exe.execute_on_devices(&[&[&a0], &[&a1]], &[]).unwrap();
    for device in &out {
        assert_eq!(read_f32(&device[0]), vec![10.0]);
        assert_eq!(read_f32(&device[1]), vec![1.0, 4.0, 9.0, 16.0]);
    }
}

/// An execution with a deleted argument, kept or donated, on one device
/// or on several (whose parts meet in an all-reduce), fails with
/// `DeletedBuffer`, and the executable still runs afterwards.
#[test]
fn executing_with_a_deleted_argument_reports_a_deleted_buffer() {
    let client = client(2);
    let exe = compile(
        &client,
        ADD_DONATING,
        vec![f32_shape(&[3]), f32_shape(&[3])],
    );
    let live = upload(&client, &[1.0, 2.0, 3.0]);
    let deleted = upload(&client, &[1.0, 1.0, 1.0]);
    assert!(deleted.delete().unwrap());
    for donatable in [&[][..], &[0], &[0, 1]] {
        assert_eq!(
            exe.execute(&[&deleted, &live], donatable).err(),
            Some(Error::DeletedBuffer)
        );
        assert_eq!(
            exe.execute(&[&live, &deleted], donatable).err(),
            Some(Error::DeletedBuffer)
        );
    }
    assert!(!live.is_deleted().unwrap());
    let out = exe.execute(&[&live, &live], &[]).unwrap();
    assert_eq!(read_f32(&out[0]), vec![2.0, 4.0, 6.0]);

    let sum = client
        .compile(SHARDED_SUM.as_bytes(), 0, &spmd_options(2))
        .unwrap()
        .with_input_shapes(vec![f32_shape(&[2])]);
    let a0 = upload(&client, &[1.0, 2.0]);
    let a1 = a0.copy_to_device(1).unwrap();
    let gone = a0.copy_to_device(1).unwrap();
    assert!(gone.delete().unwrap());
    assert_eq!(
        sum.execute_on_devices(&[&[&a0], &[&gone]], &[]).err(),
        Some(Error::DeletedBuffer)
    );
    let out = sum.execute_on_devices(&[&[&a0], &[&a1]], &[]).unwrap();
    assert_eq!(read_f32(&out[1][0]), vec![6.0]);
}

/// A deletion, or a run donating the buffer, racing a launch on several
/// devices: before it, the launch refuses the argument; after it, the run
/// computes (and a donating run that comes while the launch takes the
/// buffer fails). Never in between, where the other device's part would
/// wait in the all-reduce for a part that never starts until XLA aborts
/// the process (it did within a few hundred rounds before deletion waited
/// for launches).
#[test]
fn deleting_an_argument_during_a_launch_on_several_devices() {
    let client = client(2);
    let sum = client
        .compile(SHARDED_SUM.as_bytes(), 0, &spmd_options(2))
        .unwrap()
        .with_input_shapes(vec![f32_shape(&[2])]);
    let donating = compile_on(&client, DOUBLE_DONATING, vec![f32_shape(&[2])], 1);
    let (mut ran, mut refused) = (0, 0);
    for round in 0..4000u64 {
        let a0 = upload(&client, &[1.0, 2.0]);
        let a1 = a0.copy_to_device(1).unwrap();
        a1.wait().unwrap();
        let result = std::thread::scope(|scope| {
            scope.spawn(|| {
                // A varying delay puts the deletion before, during or after the launch.
                for i in 0..(round * 7919) % 20_000 {
                    std::hint::black_box(i);
                }
                if round % 2 == 0 {
                    a1.try_delete()
                        .unwrap()
                        .unwrap_or_else(|| a1.delete().unwrap());
                } else if let Err(error) = donating.execute(&[&a1], &[0]) {
                    let busy = format!("{error}").contains("is donated");
                    assert!(error == Error::DeletedBuffer || busy, "{error}");
                }
            });
            sum.execute_on_devices(&[&[&a0], &[&a1]], &[])
        });
        match result {
            Ok(out) => {
                assert_eq!(read_f32(&out[0][0]), vec![6.0]);
                ran += 1;
            }
            Err(error) => {
                assert_eq!(error, Error::DeletedBuffer);
                refused += 1;
            }
        }
    }
    assert!(ran > 0 && refused > 0, "ran {ran}, refused {refused}");
}

/// Reads racing a deletion: each read gets the data or `DeletedBuffer`.
/// The plugin took an external reference on a buffer deleted after the
/// read's liveness check by reading freed memory (a segfault) before
/// deletion waited for reads.
#[test]
fn reading_a_buffer_while_it_is_deleted() {
    let client = client(1);
    let values: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let expected = f32_bytes(&values);
    for round in 0..3_000u64 {
        let buffer = upload(&client, &values);
        buffer.wait().unwrap();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| loop {
                    let mut bytes = vec![0u8; expected.len()];
                    match buffer.copy_to_host(&mut bytes) {
                        Ok(()) => assert_eq!(bytes, expected),
                        Err(error) => {
                            assert_eq!(error, Error::DeletedBuffer);
                            break;
                        }
                    }
                });
            }
            for i in 0..(round * 7919) % 5_000 {
                std::hint::black_box(i);
            }
            buffer.delete().unwrap();
        });
    }
}

/// Programs with collectives on two clients at once. The CPU plugin meets
/// the parts of a launch by its launch id, over the whole process: with the
/// same id for every launch, two clients' parts met each other and XLA
/// aborted ("Unexpected number of participants"). Each launch on several
/// devices now has an id of its own.
#[test]
fn collectives_of_two_clients_run_at_once() {
    let clients = [client(2), client(2)];
    std::thread::scope(|scope| {
        for client in &clients {
            scope.spawn(move || {
                let sum = client
                    .compile(SHARDED_SUM.as_bytes(), 0, &spmd_options(2))
                    .unwrap()
                    .with_input_shapes(vec![f32_shape(&[2])]);
                let a0 = upload(client, &[1.0, 2.0]);
                let a1 = a0.copy_to_device(1).unwrap();
                for _ in 0..2000 {
                    let out = sum.execute_on_devices(&[&[&a0], &[&a1]], &[]).unwrap();
                    assert_eq!(read_f32(&out[1][0]), vec![6.0]);
                }
            });
        }
    });
}

fn refused<T>(result: Result<T, Error>) -> bool {
    matches!(result, Err(Error::InvalidArgument(_)))
}

/// A program of several devices takes exactly one argument list per device,
/// each on its device; the plugin is never asked otherwise.
#[test]
fn multi_device_runs_take_one_list_per_device() {
    let client = client(2);
    let exe = client
        .compile(SHARDED_ADD.as_bytes(), 0, &spmd_options(2))
        .unwrap()
        .with_input_shapes(vec![f32_shape(&[2]), f32_shape(&[2])]);
    let a0 = upload(&client, &[1.0, 2.0]);
    let a1 = a0.copy_to_device(1).unwrap();
    assert!(refused(exe.execute(&[&a0, &a0], &[])));
    assert!(refused(exe.execute_on_devices(&[&[&a0, &a0]], &[])));
    assert!(refused(exe.execute_on_devices(
        &[&[&a0, &a0], &[&a1, &a1], &[&a1, &a1]],
        &[]
    )));
    // Each list on its own device.
    assert!(refused(
        exe.execute_on_devices(&[&[&a0, &a0], &[&a0, &a0]], &[])
    ));
    // Several partitions need SPMD partitioning, and devices enough.
    let no_spmd = CompileOptions {
        num_partitions: 2,
        ..CompileOptions::default()
    };
    assert!(client.compile(SHARDED_ADD.as_bytes(), 0, &no_spmd).is_err());
    let single = self::client(1);
    assert!(refused(single.compile(
        SHARDED_ADD.as_bytes(),
        0,
        &spmd_options(2)
    )));
}

/// The compiler options read from the CPU plugin's file: their names,
/// types and enum values, and which of them have an `XLA_FLAGS` flag.
#[test]
fn reads_the_cpu_plugins_options() {
    let path = plugin_file();
    let fields = debug_option_fields(&path).unwrap().unwrap();
    let find = |name: &str| fields.iter().find(|f| f.name == name).unwrap();
    assert_eq!(find("xla_cpu_use_xnnpack").kind, FieldKind::Bool);
    assert_eq!(
        find("xla_cpu_parallel_codegen_split_count").kind,
        FieldKind::Int32
    );
    assert!(find("xla_disable_hlo_passes").repeated);
    let FieldKind::Enum(values) = &find("xla_step_marker_location").kind else {
        panic!("not an enum");
    };
    assert!(values.contains(&("STEP_MARK_AT_ENTRY".to_string(), 0)));
    let flags = registered_flag_names(&path).unwrap();
    assert!(flags.contains("xla_cpu_use_xnnpack"));
    assert!(flags.contains("xla_dump_to"));
}

#[test]
fn views_read_memory_in_place_and_call_back_once_when_dropped() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    let client = client(1);
    // 64-byte aligned memory, as the CPU plugin asks of a view.
    #[repr(align(64))]
    struct Aligned([f32; 3]);
    let memory = Box::new(Aligned([1.0, 2.0, 3.0]));
    let data = Box::into_raw(memory);
    let deleted = Arc::new(AtomicUsize::new(0));
    let on_delete = {
        let deleted = deleted.clone();
        let address = data as usize;
        Box::new(move || {
            deleted.fetch_add(1, Ordering::SeqCst);
            // SAFETY: the box leaked above, freed once, when the view is done.
            drop(unsafe { Box::from_raw(address as *mut Aligned) });
        })
    };
    // SAFETY: the memory lives until on_delete frees it.
    let view = unsafe {
        client
            .view_of_memory(data.cast(), &f32_shape(&[3]), 0, on_delete)
            .unwrap()
    };
    assert_eq!(read_f32(&view), vec![1.0, 2.0, 3.0]);

    // A write to the memory shows through the view: it is not a copy.
    // SAFETY: nothing reads the view meanwhile.
    unsafe { (*data).0[1] = 20.0 };
    let exe = compile(&client, ADD, vec![f32_shape(&[3]), f32_shape(&[3])]);
    let ten = upload(&client, &[10.0, 10.0, 10.0]);
    let out = exe.execute(&[&view, &ten], &[]).unwrap();
    assert_eq!(read_f32(&out[0]), vec![11.0, 30.0, 13.0]);

    assert_eq!(deleted.load(Ordering::SeqCst), 0);
    drop(view);
    assert_eq!(deleted.load(Ordering::SeqCst), 1);

    // A view that cannot be made calls back at once.
    let failed = {
        let deleted = deleted.clone();
        Box::new(move || {
            deleted.fetch_add(1, Ordering::SeqCst);
        })
    };
    let mut scratch = Aligned([0.0; 3]);
    let result = unsafe {
        client.view_of_memory(scratch.0.as_mut_ptr().cast(), &f32_shape(&[3]), 7, failed)
    };
    assert!(result.is_err());
    assert_eq!(deleted.load(Ordering::SeqCst), 2);

    // The plugin refuses memory it cannot use as is (misaligned here).
    let refused = {
        let deleted = deleted.clone();
        Box::new(move || {
            deleted.fetch_add(1, Ordering::SeqCst);
        })
    };
    let mut wide = Aligned([0.0; 3]);
    let misaligned = unsafe { wide.0.as_mut_ptr().add(1).cast() };
    let result = unsafe { client.view_of_memory(misaligned, &f32_shape(&[2]), 0, refused) };
    assert!(result.is_err(), "{:?}", result.map(|_| ()));
    assert_eq!(deleted.load(Ordering::SeqCst), 3);
}
