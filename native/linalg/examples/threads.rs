//! How the decompositions' run time depends on threads: each kernel on one
//! thread (faer's `Par::Seq`) and on a pool of one thread per core
//! (`Par::rayon`), at several sizes, f32 and f64, reading and writing the
//! matrices as the FFI handlers do. Run with
//! `cargo run --release -p exla_linalg --example threads [kernel|size]...`
//! (all by default); it prints the
//! median of several runs of each, alternating the two.

use std::time::Instant;

use exla_linalg::kernels::{self, Elem};
use faer::{Mat, Par};

fn random(n: usize, seed: &mut u64) -> Vec<f64> {
    (0..n * n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

fn bytes<T: Elem>(values: &[f64]) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * T::BYTES];
    for (v, chunk) in values.iter().zip(out.chunks_exact_mut(T::BYTES)) {
        T::real_value(*v).write(chunk);
    }
    out
}

type Kernel<T> = fn(Mat<T>, Par, &mut [u8]);

fn kernel<T: Elem>(name: &str) -> Kernel<T> {
    match name {
        "qr" => |a, par, out| {
            let (q, r) = kernels::qr(a, false, par);
            kernels::write_matrix(&q, out);
            kernels::write_matrix(&r, out);
        },
        "eigh" => |a, par, out| {
            let (_, v) = kernels::eigh(a, par);
            kernels::write_matrix(&v, out);
        },
        "svd" => |a, par, out| {
            let (u, _, _) = kernels::svd(a, false, par);
            kernels::write_matrix(&u, out);
        },
        "cholesky" => |a, par, out| {
            let l = kernels::cholesky(a, par);
            kernels::write_matrix(&l, out);
        },
        _ => |a, par, out| {
            let (_, l, _) = kernels::lu(a, par);
            kernels::write_matrix(&l, out);
        },
    }
}

fn time<T: Elem>(name: &str, input: &[u8], n: usize, par: Par, pool: &rayon::ThreadPool) -> f64 {
    let f = kernel::<T>(name);
    let mut out = vec![0u8; n * n * T::BYTES];
    let start = Instant::now();
    match par {
        // on the calling thread, as a serial kernel runs
        Par::Seq => f(kernels::read_matrix::<T>(input, n, n), par, &mut out),
        _ => pool.install(|| f(kernels::read_matrix::<T>(input, n, n), par, &mut out)),
    }
    start.elapsed().as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn run<T: Elem>(label: &str, pool: &rayon::ThreadPool, only: &[String]) {
    let threads = pool.current_num_threads();
    for name in ["qr", "eigh", "svd", "cholesky", "lu"] {
        for n in [8, 64, 128, 256, 512, 1024] {
            let size = n.to_string();
            let names = only.iter().filter(|o| o.parse::<usize>().is_err());
            let sizes = only.iter().filter(|o| o.parse::<usize>().is_ok());
            if names.clone().count() > 0 && !names.clone().any(|o| o == name)
                || sizes.clone().count() > 0 && !sizes.clone().any(|o| *o == size)
            {
                continue;
            }
            let mut seed = 7;
            let mut values = random(n, &mut seed);
            if name == "eigh" || name == "cholesky" {
                let a = values.clone();
                for i in 0..n {
                    for j in 0..n {
                        values[i * n + j] = a[i * n + j] + a[j * n + i];
                    }
                    values[i * n + i] += if name == "cholesky" {
                        2.0 * n as f64
                    } else {
                        0.0
                    };
                }
            }
            let input = bytes::<T>(&values);
            let reps = if n >= 512 {
                5
            } else if n <= 8 {
                1001
            } else {
                15
            };
            let (mut one, mut many) = (vec![], vec![]);
            for _ in 0..reps {
                one.push(time::<T>(name, &input, n, Par::Seq, pool));
                many.push(time::<T>(name, &input, n, Par::rayon(threads), pool));
            }
            let (one, many) = (median(one), median(many));
            println!(
                "{label} {name:8} {n:5}: 1 thread {one:9.3} ms, {threads} threads {many:9.3} ms ({:.2}x)",
                one / many
            );
        }
    }
}

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    // Arguments, if any, keep only the kernels and sizes they name.
    let only: Vec<String> = std::env::args().skip(1).collect();
    run::<f32>("f32", &pool, &only);
    run::<f64>("f64", &pool, &only);
}
