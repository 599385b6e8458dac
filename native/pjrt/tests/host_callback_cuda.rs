//! Host callbacks on a CUDA plugin. Runs only where `PJRT_CUDA_PLUGIN_PATH`
//! names a CUDA PJRT plugin (`.../jax_plugins/xla_cuda13/xla_cuda_plugin.so`,
//! with the NVIDIA libraries it needs on `LD_LIBRARY_PATH`) and a GPU is
//! present; elsewhere each test returns at once.
//!
//! The programs make the callbacks' operands with kernels and use their
//! results in kernels, so a missing copy or a missing wait on the stream
//! shows up as wrong values.

mod recorder;

use std::sync::{Arc, OnceLock};

use pjrt::host_callback::{self, ArgView, HostCallback, RetView};
use pjrt::{Buffer, Client, CompileOptions, ElementType, OptionValue, Plugin, Shape};

use recorder::{bytes, f32s, reply, Recorder};

const TARGET: &str = "pjrt_test_host_callback_cuda";

/// Sends `a * 2` to site 7, then receives a tensor<Nxf32> from site 8 and
/// adds it to `a`, then sends the sum to site 9.
fn round_trip(n: usize) -> String {
    format!(
        r#"
module {{
  func.func public @main(%chain: tensor<ui64>, %a: tensor<{n}xf32>) -> (tensor<{n}xf32>, tensor<ui64>) {{
    %two = stablehlo.constant dense<2.0> : tensor<{n}xf32>
    %d = stablehlo.multiply %a, %two : tensor<{n}xf32>
    %s7 = stablehlo.constant dense<7> : tensor<ui32>
    %c1 = "stablehlo.custom_call"(%chain, %s7, %d) {{call_target_name = "{TARGET}", api_version = 4 : i32, has_side_effect = true, backend_config = {{}}}} : (tensor<ui64>, tensor<ui32>, tensor<{n}xf32>) -> tensor<ui64>
    %s8 = stablehlo.constant dense<8> : tensor<ui32>
    %r:2 = "stablehlo.custom_call"(%c1, %s8) {{call_target_name = "{TARGET}", api_version = 4 : i32, has_side_effect = true, backend_config = {{}}}} : (tensor<ui64>, tensor<ui32>) -> (tensor<ui64>, tensor<{n}xf32>)
    %sum = stablehlo.add %a, %r#1 : tensor<{n}xf32>
    %s9 = stablehlo.constant dense<9> : tensor<ui32>
    %c3 = "stablehlo.custom_call"(%r#0, %s9, %sum) {{call_target_name = "{TARGET}", api_version = 4 : i32, has_side_effect = true, backend_config = {{}}}} : (tensor<ui64>, tensor<ui32>, tensor<{n}xf32>) -> tensor<ui64>
    return %sum, %c3 : tensor<{n}xf32>, tensor<ui64>
  }}
}}
"#
    )
}

fn client() -> Option<Arc<Client>> {
    static CLIENT: OnceLock<Option<Arc<Client>>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let path = std::env::var("PJRT_CUDA_PLUGIN_PATH")
                .ok()
                .filter(|p| !p.is_empty())?;
            let plugin = Plugin::load(path).expect("the CUDA plugin loads");
            let client =
                Client::create(&plugin, &[("preallocate".into(), OptionValue::Bool(false))])
                    .expect("a CUDA client");
            eprintln!(
                "platform {} ({}), {} device(s)",
                client.platform_name(),
                client.platform_version(),
                client.devices().len()
            );
            host_callback::install(&plugin, client.platform_name(), TARGET).unwrap();
            host_callback::install(&plugin, client.platform_name(), TARGET).unwrap();
            Some(client)
        })
        .clone()
}

fn run(client: &Arc<Client>, session: u64, a: &[f32]) -> pjrt::Result<(Vec<f32>, u64)> {
    let n = a.len();
    let exe = client
        .compile(round_trip(n).as_bytes(), 0, &CompileOptions::default())?
        .with_input_shapes(vec![
            Shape::new(ElementType::U64, vec![]).unwrap(),
            Shape::new(ElementType::F32, vec![n as i64]).unwrap(),
        ]);
    let chain = client.buffer_from_host(
        &session.to_ne_bytes(),
        &Shape::new(ElementType::U64, vec![]).unwrap(),
        0,
    )?;
    let a = client.buffer_from_host(
        &bytes(a),
        &Shape::new(ElementType::F32, vec![n as i64]).unwrap(),
        0,
    )?;
    let out = exe.execute(&[&chain, &a], &[])?;
    let sum = f32s(&read(&out[0])?);
    let id = u64::from_ne_bytes(read(&out[1])?.try_into().unwrap());
    Ok((sum, id))
}

fn read(buffer: &Buffer) -> pjrt::Result<Vec<u8>> {
    buffer.wait()?;
    let mut data = vec![0u8; buffer.shape().byte_size()?];
    buffer.copy_to_host(&mut data)?;
    Ok(data)
}

fn check(client: &Arc<Client>, a: &[f32]) {
    let n = a.len();
    let recorder = Arc::new(Recorder::default());
    let session = host_callback::register_session(recorder.clone());
    let (sum, id) = run(client, session.id(), a).unwrap();
    assert_eq!(id, session.id());
    let expected: Vec<f32> = a.iter().zip(reply(n)).map(|(x, r)| x + r).collect();
    assert_eq!(sum, expected);
    let seen = recorder.seen.lock().unwrap();
    let doubled: Vec<f32> = a.iter().map(|x| x * 2.0).collect();
    assert_eq!(
        seen.len(),
        2,
        "sites seen: {:?}",
        seen.iter().map(|s| s.0).collect::<Vec<_>>()
    );
    assert_eq!(seen[0], (7, vec![n as i64], doubled));
    assert_eq!(seen[1], (9, vec![n as i64], expected));
}

#[test]
fn cuda_round_trips_through_the_host() {
    let Some(client) = client() else {
        eprintln!("skipped: PJRT_CUDA_PLUGIN_PATH is not set");
        return;
    };
    check(&client, &[1.0, 2.0, 3.0]);
    // Large enough that a copy not waited for would be seen half done.
    let big: Vec<f32> = (0..(1 << 22)).map(|i| (i % 7919) as f32).collect();
    for _ in 0..3 {
        check(&client, &big);
    }
}

struct Failing;

impl HostCallback for Failing {
    fn call(&self, _: u32, _: &[ArgView<'_>], _: &mut [RetView<'_>]) -> Result<(), String> {
        Err("refused by the host".into())
    }
}

#[test]
fn cuda_errors_fail_the_execution_and_the_client_goes_on() {
    let Some(client) = client() else {
        eprintln!("skipped: PJRT_CUDA_PLUGIN_PATH is not set");
        return;
    };
    let session = host_callback::register_session(Arc::new(Failing));
    let err = run(&client, session.id(), &[1.0, 2.0])
        .unwrap_err()
        .to_string();
    assert!(err.contains("refused by the host"), "{err}");
    let closed = host_callback::register_session(Arc::new(Failing));
    let id = closed.id();
    drop(closed);
    let err = run(&client, id, &[1.0, 2.0]).unwrap_err().to_string();
    assert!(err.contains("closed"), "{err}");
    check(&client, &[4.0, 5.0]);
}

/// Answers site 8 with what another thread sends, as a stream's input
/// does; records nothing.
struct Blocking(crossbeam_channel::Receiver<Vec<f32>>);

impl HostCallback for Blocking {
    fn call(&self, _: u32, _: &[ArgView<'_>], rets: &mut [RetView<'_>]) -> Result<(), String> {
        if let Some(ret) = rets.first_mut() {
            let data = self
                .0
                .recv_timeout(std::time::Duration::from_secs(30))
                .map_err(|e| e.to_string())?;
            ret.bytes.copy_from_slice(&bytes(&data));
        }
        Ok(())
    }
}

#[test]
fn cuda_callbacks_may_wait_for_another_thread() {
    let Some(client) = client() else {
        eprintln!("skipped: PJRT_CUDA_PLUGIN_PATH is not set");
        return;
    };
    let (tx, rx) = crossbeam_channel::bounded(1);
    let session = host_callback::register_session(Arc::new(Blocking(rx)));
    let id = session.id();
    let runner = {
        let client = client.clone();
        std::thread::spawn(move || run(&client, id, &[1.0, 2.0, 3.0]))
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    tx.send(vec![10.0, 20.0, 30.0]).unwrap();
    let (sum, chain) = runner.join().unwrap().unwrap();
    assert_eq!(sum, vec![11.0, 22.0, 33.0]);
    assert_eq!(chain, id);
}
