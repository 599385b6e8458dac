//! Tests of the XLA FFI door (`pjrt::xla_ffi`) against the real CPU plugin:
//! a handler registered under a target name reads its operands and its
//! attributes, writes its results, and fails the execution with its error.

mod common;

use std::sync::Arc;

use pjrt::xla_ffi::{self, dtype, Attr, Call, ErrorCode, FfiError, Handler, Platform};
use pjrt::{Client, CompileOptions, ElementType, OptionValue, Shape};

/// Multiplies a f32 vector by the `scale` attribute, or fails as the `fail`
/// attribute says (0: no, 1: an error, 2: a panic).
struct Scale;

impl Handler for Scale {
    const NAME: &'static str = "scale test handler";

    fn execute(call: &mut Call<'_>) -> Result<(), FfiError> {
        match call.attr_i64("fail")? {
            1 => return Err(FfiError::invalid_argument("refused: fail = 1")),
            2 => panic!("boom from a handler"),
            _ => {}
        }
        let scale = call.attr_i64("scale")? as f32;
        assert_eq!(call.attr("label"), Some(Attr::String(b"twice")));
        let input = call.args[0];
        if input.dtype() != dtype::F32 {
            return Err(FfiError::new(ErrorCode::Internal, "not f32"));
        }
        let bytes = input.host_bytes()?;
        let out = call.rets[0].host_bytes_mut()?;
        for (o, i) in out.chunks_exact_mut(4).zip(bytes.chunks_exact(4)) {
            let v = f32::from_ne_bytes(i.try_into().unwrap()) * scale;
            o.copy_from_slice(&v.to_ne_bytes());
        }
        Ok(())
    }
}

/// Another handler, to check that a target name is not taken twice.
struct Other;

impl Handler for Other {
    const NAME: &'static str = "other";

    fn execute(_: &mut Call<'_>) -> Result<(), FfiError> {
        Ok(())
    }
}

const TARGET: &str = "pjrt_test_xla_ffi_scale";

fn program(fail: i64) -> String {
    format!(
        r#"
module {{
  func.func public @main(%a: tensor<3xf32>) -> tensor<3xf32> {{
    %r = "stablehlo.custom_call"(%a) {{call_target_name = "{TARGET}", api_version = 4 : i32, backend_config = {{scale = 2 : i64, label = "twice", fail = {fail} : i64}}}} : (tensor<3xf32>) -> tensor<3xf32>
    return %r : tensor<3xf32>
  }}
}}
"#
    )
}

fn client() -> Arc<Client> {
    let plugin = common::plugin();
    xla_ffi::register::<Scale>(&plugin, Platform::Host, TARGET).unwrap();
    xla_ffi::register::<Scale>(&plugin, Platform::Host, TARGET).unwrap();
    Client::create(
        &plugin,
        &[("cpu_device_count".into(), OptionValue::Int64(1))],
    )
    .unwrap()
}

fn run(client: &Arc<Client>, fail: i64) -> pjrt::Result<Vec<f32>> {
    let shape = Shape::new(ElementType::F32, vec![3]).unwrap();
    let exe = client
        .compile(program(fail).as_bytes(), 0, &CompileOptions::default())?
        .with_input_shapes(vec![shape.clone()]);
    let input: Vec<u8> = [1.0f32, 2.0, 3.0]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let a = client.buffer_from_host(&input, &shape, 0)?;
    let out = exe.execute(&[&a], &[])?;
    out[0].wait()?;
    let mut data = vec![0u8; 12];
    out[0].copy_to_host(&mut data)?;
    Ok(data
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect())
}

#[test]
fn a_handler_reads_operands_and_attributes_and_writes_results() {
    let client = client();
    assert_eq!(run(&client, 0).unwrap(), vec![2.0, 4.0, 6.0]);
}

#[test]
fn errors_and_panics_fail_the_execution_with_their_message() {
    let client = client();
    let err = run(&client, 1).unwrap_err().to_string();
    assert!(err.contains("refused: fail = 1"), "{err}");
    let err = run(&client, 2).unwrap_err().to_string();
    assert!(
        err.contains("scale test handler panicked: boom from a handler"),
        "{err}"
    );
    assert_eq!(run(&client, 0).unwrap(), vec![2.0, 4.0, 6.0]);
}

#[test]
fn a_target_name_serves_one_handler() {
    let plugin = common::plugin();
    xla_ffi::register::<Scale>(&plugin, Platform::Host, TARGET).unwrap();
    let err = xla_ffi::register::<Other>(&plugin, Platform::Host, TARGET)
        .unwrap_err()
        .to_string();
    assert!(err.contains("already registered"), "{err}");
    let err = xla_ffi::register::<Other>(&plugin, Platform::Host, "")
        .unwrap_err()
        .to_string();
    assert!(err.contains("must not be empty"), "{err}");
}
