//! The raw floor of the native core: executing a tiny program, and moving
//! data between host and device, through the Rust bindings alone.
//!
//! `cargo run --release --example execute_bench -- PLUGIN [ITERATIONS]`
//! prints one line of `key=value` pairs (µs and GB/s), read by
//! `bench/native_bench.exs`.

use std::time::Instant;

use pjrt::{Client, CompileOptions, ElementType, OptionValue, Plugin, Shape};

// The program it runs, shared with tests/cpu_plugin.rs.
const ADD: &str = include_str!("../tests/common/add.mlir");

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() -> pjrt::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: execute_bench PLUGIN [ITERATIONS]");
    let iterations: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(20_000);
    let plugin = Plugin::load(path)?;
    let client = Client::create(
        &plugin,
        &[("cpu_device_count".into(), OptionValue::Int64(1))],
    )?;
    let shape = Shape::new(ElementType::F32, vec![3])?;
    let exe = client
        .compile(ADD.as_bytes(), 0, &CompileOptions::default())?
        .with_input_shapes(vec![shape.clone(), shape.clone()]);
    let data: Vec<u8> = [1.0f32, 2.0, 3.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let a = client.buffer_from_host(&data, &shape, 0)?;

    let mut times = Vec::with_capacity(iterations);
    for i in 0..iterations + 2_000 {
        let start = Instant::now();
        let out = exe.execute(&[&a, &a], &[])?;
        out[0].wait()?;
        drop(out);
        if i >= 2_000 {
            times.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    times.sort_by(|x, y| x.total_cmp(y));

    let size = 256 << 20;
    let host: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let big = Shape::new(ElementType::U8, vec![size as i64])?;
    let mut back = vec![1u8; size];
    let (mut h2d, mut d2h, mut memcpy) = (0f64, 0f64, 0f64);
    for _ in 0..3 {
        let start = Instant::now();
        let buffer = client.buffer_from_host(&host, &big, 0)?;
        buffer.wait()?;
        h2d = h2d.max(size as f64 / start.elapsed().as_secs_f64() / 1e9);
        let start = Instant::now();
        buffer.copy_to_host(&mut back)?;
        d2h = d2h.max(size as f64 / start.elapsed().as_secs_f64() / 1e9);
        let start = Instant::now();
        back.copy_from_slice(&host);
        memcpy = memcpy.max(size as f64 / start.elapsed().as_secs_f64() / 1e9);
        std::hint::black_box(&back);
    }
    println!(
        "execute_median_us={:.3} execute_p99_us={:.3} h2d_gbps={h2d:.2} d2h_gbps={d2h:.2} memcpy_gbps={memcpy:.2}",
        percentile(&times, 0.5),
        percentile(&times, 0.99)
    );
    Ok(())
}
