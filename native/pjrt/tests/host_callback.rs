//! Tests of the host-callback bridge against the real CPU plugin (found as
//! described in `common/mod.rs`).

mod common;
mod recorder;

use std::sync::Arc;
use std::time::Duration;

use pjrt::host_callback::{self, ArgView, HostCallback, RetView};
use pjrt::{Buffer, Client, CompileOptions, ElementType, OptionValue, Shape};

use recorder::{bytes, f32s, Recorder};

/// The FFI target name the programs below call.
const TARGET: &str = "pjrt_test_host_callback";

/// Sends `a * 2` to site 7, then receives a tensor<3xf32> from site 8 and
/// adds it to `a`.
const ROUND_TRIP: &str = r#"
module {
  func.func public @main(%chain: tensor<ui64>, %a: tensor<3xf32>) -> (tensor<3xf32>, tensor<ui64>) {
    %two = stablehlo.constant dense<2.0> : tensor<3xf32>
    %d = stablehlo.multiply %a, %two : tensor<3xf32>
    %s7 = stablehlo.constant dense<7> : tensor<ui32>
    %c1 = "stablehlo.custom_call"(%chain, %s7, %d) {call_target_name = "pjrt_test_host_callback", api_version = 4 : i32, has_side_effect = true, backend_config = {}} : (tensor<ui64>, tensor<ui32>, tensor<3xf32>) -> tensor<ui64>
    %s8 = stablehlo.constant dense<8> : tensor<ui32>
    %r:2 = "stablehlo.custom_call"(%c1, %s8) {call_target_name = "pjrt_test_host_callback", api_version = 4 : i32, has_side_effect = true, backend_config = {}} : (tensor<ui64>, tensor<ui32>) -> (tensor<ui64>, tensor<3xf32>)
    %sum = stablehlo.add %a, %r#1 : tensor<3xf32>
    return %sum, %r#0 : tensor<3xf32>, tensor<ui64>
  }
}
"#;

fn client() -> Arc<Client> {
    let plugin = common::plugin();
    host_callback::install(&plugin, "cpu", TARGET).unwrap();
    host_callback::install(&plugin, "cpu", TARGET).unwrap();
    Client::create(
        &plugin,
        &[("cpu_device_count".into(), OptionValue::Int64(1))],
    )
    .unwrap()
}

fn run(client: &Arc<Client>, session: u64) -> pjrt::Result<Vec<f32>> {
    let exe = client
        .compile(ROUND_TRIP.as_bytes(), 0, &CompileOptions::default())?
        .with_input_shapes(vec![
            Shape::new(ElementType::U64, vec![]).unwrap(),
            Shape::new(ElementType::F32, vec![3]).unwrap(),
        ]);
    let chain = client.buffer_from_host(
        &session.to_ne_bytes(),
        &Shape::new(ElementType::U64, vec![]).unwrap(),
        0,
    )?;
    let a = client.buffer_from_host(
        &bytes(&[1.0, 2.0, 3.0]),
        &Shape::new(ElementType::F32, vec![3]).unwrap(),
        0,
    )?;
    let out = exe.execute(&[&chain, &a], &[])?;
    read(&out[0])
}

fn read(buffer: &Buffer) -> pjrt::Result<Vec<f32>> {
    buffer.wait()?;
    let mut data = vec![0u8; buffer.shape().byte_size()?];
    buffer.copy_to_host(&mut data)?;
    Ok(f32s(&data))
}

#[test]
fn hands_operands_out_and_results_in() {
    let client = client();
    let recorder = Arc::new(Recorder::default());
    let session = host_callback::register_session(recorder.clone());
    let out = run(&client, session.id()).unwrap();
    assert_eq!(out, vec![101.0, 202.0, 303.0]);
    let seen = recorder.seen.lock().unwrap();
    assert_eq!(seen.as_slice(), &[(7, vec![3], vec![2.0, 4.0, 6.0])]);
}

struct Failing(bool);

impl HostCallback for Failing {
    fn call(&self, _: u32, _: &[ArgView<'_>], _: &mut [RetView<'_>]) -> Result<(), String> {
        if self.0 {
            panic!("boom from a callback");
        }
        Err("refused by the host".into())
    }
}

#[test]
fn errors_and_panics_fail_the_execution_with_their_message() {
    let client = client();
    for (panics, expected) in [
        (false, "refused by the host"),
        (true, "boom from a callback"),
    ] {
        let session = host_callback::register_session(Arc::new(Failing(panics)));
        let err = run(&client, session.id()).unwrap_err().to_string();
        assert!(err.contains(expected), "{err}");
    }
    // The client still works afterwards.
    let session = host_callback::register_session(Arc::new(Recorder::default()));
    assert_eq!(
        run(&client, session.id()).unwrap(),
        vec![101.0, 202.0, 303.0]
    );
}

#[test]
fn a_closed_session_fails_instead_of_hanging() {
    let client = client();
    let session = host_callback::register_session(Arc::new(Recorder::default()));
    let id = session.id();
    drop(session);
    let err = run(&client, id).unwrap_err().to_string();
    assert!(err.contains("closed"), "{err}");
}

struct Blocking(crossbeam_channel::Receiver<Vec<u8>>);

impl HostCallback for Blocking {
    fn call(&self, _: u32, _: &[ArgView<'_>], rets: &mut [RetView<'_>]) -> Result<(), String> {
        if let Some(ret) = rets.first_mut() {
            let data = self
                .0
                .recv_timeout(Duration::from_secs(10))
                .map_err(|e| e.to_string())?;
            ret.bytes.copy_from_slice(&data);
        }
        Ok(())
    }
}

#[test]
fn a_callback_may_wait_for_another_thread() {
    let client = client();
    let (tx, rx) = crossbeam_channel::bounded(1);
    let session = host_callback::register_session(Arc::new(Blocking(rx)));
    let id = session.id();
    let runner = std::thread::spawn(move || run(&client, id));
    std::thread::sleep(Duration::from_millis(50));
    tx.send(bytes(&[1.0, 1.0, 1.0])).unwrap();
    assert_eq!(runner.join().unwrap().unwrap(), vec![2.0, 3.0, 4.0]);
    drop(session);
    assert!(host_callback::session_count() < 100);
}
