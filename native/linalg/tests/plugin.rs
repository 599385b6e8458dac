//! The decompositions through the CPU plugin: programs that call the FFI
//! targets, compiled and run by the plugin (found as pjrt's tests find it),
//! against the kernels called directly.

#[path = "../../pjrt/tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use exla_linalg::kernels::{self, Elem};
use faer::{c64, Mat, Par};
use pjrt::{Buffer, Client, CompileOptions, ElementType, OptionValue, Shape};

fn client() -> Arc<Client> {
    let plugin = common::plugin();
    exla_linalg::install(&plugin).unwrap();
    exla_linalg::install(&plugin).unwrap();
    Client::create(
        &plugin,
        &[("cpu_device_count".into(), OptionValue::Int64(1))],
    )
    .unwrap()
}

/// A program calling `target` on operands of MLIR types `operands`, with
/// results of types `results` and the attributes `config`.
fn program(target: &str, operands: &[&str], results: &[&str], config: &str) -> String {
    let params: Vec<String> = operands
        .iter()
        .enumerate()
        .map(|(i, t)| format!("%a{i}: {t}"))
        .collect();
    let args: Vec<String> = (0..operands.len()).map(|i| format!("%a{i}")).collect();
    format!(
        r#"module {{
  func.func public @main({params}) -> ({results}) {{
    %r:{n} = "stablehlo.custom_call"({args}) {{call_target_name = "{target}", api_version = 4 : i32, backend_config = {{{config}}}}} : ({operands}) -> ({results})
    return {rets} : {results}
  }}
}}"#,
        params = params.join(", "),
        results = results.join(", "),
        n = results.len(),
        args = args.join(", "),
        operands = operands.join(", "),
        rets = (0..results.len())
            .map(|i| format!("%r#{i}"))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

fn run(
    client: &Arc<Client>,
    text: &str,
    inputs: &[(&[u8], ElementType, Vec<i64>)],
) -> pjrt::Result<Vec<Vec<u8>>> {
    let shapes: Vec<Shape> = inputs
        .iter()
        .map(|(_, t, dims)| Shape::new(*t, dims.clone()).unwrap())
        .collect();
    let exe = client
        .compile(text.as_bytes(), 0, &CompileOptions::default())?
        .with_input_shapes(shapes.clone());
    let buffers: Vec<Buffer> = inputs
        .iter()
        .zip(&shapes)
        .map(|((bytes, _, _), shape)| client.buffer_from_host(bytes, shape, 0))
        .collect::<pjrt::Result<_>>()?;
    let refs: Vec<&Buffer> = buffers.iter().collect();
    let outs = exe.execute(&refs, &[])?;
    outs.iter()
        .map(|b| {
            b.wait()?;
            let mut data = vec![0u8; b.shape().byte_size()?];
            b.copy_to_host(&mut data)?;
            Ok(data)
        })
        .collect()
}

fn bytes<T: Elem>(m: &Mat<T>) -> Vec<u8> {
    let mut out = vec![0u8; m.nrows() * m.ncols() * T::BYTES];
    kernels::write_matrix(m, &mut out);
    out
}

/// A complex matrix whose pivots have both parts below 1 and a squared
/// modulus above 1: faer's reciprocal of them goes through a subnormal,
/// which the plugin's threads flush to zero (see float_env.rs).
fn complex_matrix(n: usize) -> Mat<c64> {
    Mat::from_fn(n, n, |i, j| {
        if i == j {
            c64::new(0.9, 0.9)
        } else {
            c64::new(
                ((i * 7 + j * 3) % 11) as f64 / 50.0,
                ((i + 2 * j) % 5) as f64 / 40.0,
            )
        }
    })
}

fn max_diff(a: &Mat<c64>, b: &Mat<c64>) -> f64 {
    let mut worst: f64 = 0.0;
    for j in 0..a.ncols() {
        for i in 0..a.nrows() {
            let d = a[(i, j)] - b[(i, j)];
            worst = worst.max(d.re.abs().max(d.im.abs()));
        }
    }
    worst
}

#[test]
fn lu_and_solve_of_a_complex_matrix_through_the_plugin() {
    let client = client();
    let n = 5;
    let a = complex_matrix(n);
    let t = "tensor<5x5xcomplex<f64>>";
    let text = program("exla_linalg_lu", &[t], &[t, t, t], "");
    let outs = run(
        &client,
        &text,
        &[(&bytes(&a), ElementType::C128, vec![5, 5])],
    )
    .unwrap();
    let [p, l, u] = [0, 1, 2].map(|i| kernels::read_matrix::<c64>(&outs[i], n, n));
    assert!(max_diff(&(&p * &l * &u), &a) < 1e-12);
    let (kp, kl, ku) = kernels::lu(a.clone(), Par::Seq);
    assert_eq!((p, l, u), (kp, kl, ku));

    let b = Mat::from_fn(n, 2, |i, j| c64::new(i as f64, j as f64 - 1.0));
    let tb = "tensor<5x2xcomplex<f64>>";
    let text = program("exla_linalg_solve", &[t, tb], &[tb], "");
    let inputs = [
        (&bytes(&a)[..], ElementType::C128, vec![5, 5]),
        (&bytes(&b)[..], ElementType::C128, vec![5, 2]),
    ];
    let outs = run(&client, &text, &inputs).unwrap();
    let x = kernels::read_matrix::<c64>(&outs[0], n, 2);
    assert!(max_diff(&(&a * &x), &b) < 1e-12);
}

#[test]
fn attributes_choose_the_modes_and_bad_shapes_fail_the_run() {
    let client = client();
    let a = Mat::from_fn(5, 3, |i, j| ((i * 3 + j) % 7) as f32 - 3.0);
    let input = [(&bytes(&a)[..], ElementType::F32, vec![5, 3])];
    let t = "tensor<5x3xf32>";
    let text = program(
        "exla_linalg_qr",
        &[t],
        &["tensor<5x5xf32>", t],
        "complete = 1 : i64",
    );
    let outs = run(&client, &text, &input).unwrap();
    assert_eq!(outs[0].len(), 25 * 4);
    // a thin Q where the attribute asks for a complete one
    let text = program(
        "exla_linalg_qr",
        &[t],
        &[t, "tensor<3x3xf32>"],
        "complete = 1 : i64",
    );
    let err = run(&client, &text, &input).unwrap_err().to_string();
    assert!(err.contains("exla_linalg_qr: result 0 must be"), "{err}");
    let text = program("exla_linalg_qr", &[t], &[t, "tensor<3x3xf32>"], "");
    let err = run(&client, &text, &input).unwrap_err().to_string();
    assert!(err.contains("no integer attribute complete"), "{err}");
}

#[test]
fn every_target_is_registered() {
    let client = client();
    let a = Mat::from_fn(4, 4, |i, j| if i == j { 4.0f64 } else { 1.0 });
    let input = [(&bytes(&a)[..], ElementType::F64, vec![4, 4])];
    let t = "tensor<4x4xf64>";
    let v = "tensor<4xf64>";
    for (target, results, config) in [
        ("exla_linalg_qr", vec![t, t], "complete = 0 : i64"),
        ("exla_linalg_eigh", vec![v, t], ""),
        ("exla_linalg_svd", vec![t, v, t], "full = 1 : i64"),
        ("exla_linalg_cholesky", vec![t], ""),
        ("exla_linalg_lu", vec![t, t, t], ""),
        ("exla_linalg_determinant", vec!["tensor<f64>"], ""),
    ] {
        run(&client, &program(target, &[t], &results, config), &input).unwrap();
    }
    let b = Mat::from_fn(4, 1, |i, _| i as f64);
    let inputs = [
        input[0].clone(),
        (&bytes(&b)[..], ElementType::F64, vec![4, 1]),
    ];
    let solve = program(
        "exla_linalg_solve",
        &[t, "tensor<4x1xf64>"],
        &["tensor<4x1xf64>"],
        "",
    );
    run(&client, &solve, &inputs).unwrap();
}
