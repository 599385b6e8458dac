//! EXLA's decompositions on the host: QR, eigh, SVD, Cholesky and LU, and
//! the solve and determinant of LU, as XLA FFI custom calls, registered with a CPU plugin by `install` and
//! emitted by `EXLA.Defn.Lowering.Decompositions`. Each runs on the plugin's
//! thread that reaches the call, with no trip through the BEAM; the
//! decompositions themselves are faer's (`kernels.rs`).
//!
//! Every target takes a batch of matrices `[..., m, n]` of f32, f64, c64
//! or c128 (row-major, as `EXLA.MLIR.Ops.custom_call/6` lays them out; two
//! for solve, with the same batch), and returns its results for each
//! matrix of the batch:
//!
//! | target | attributes | results |
//! | --- | --- | --- |
//! | `exla_linalg_qr` | `complete` (0 or 1) | Q `[..., m, k]`, R `[..., k, n]`: k = m if complete, else min(m, n) |
//! | `exla_linalg_eigh` | | eigenvalues `[..., n]` (real), eigenvectors `[..., n, n]` |
//! | `exla_linalg_svd` | `full` (0 or 1) | U `[..., m, m or k]`, S `[..., k]` (real), Vᴴ `[..., n or k, n]` |
//! | `exla_linalg_cholesky` | | L `[..., n, n]` |
//! | `exla_linalg_lu` | | P, L, U `[..., n, n]` |
//! | `exla_linalg_solve` | | X `[..., n, k]` with A X = B, for A `[..., n, n]` and B `[..., n, k]` |
//! | `exla_linalg_determinant` | | `[...]` |
//!
//! The conventions (order, signs, bad input) are `kernels.rs`'s. Shapes and
//! types that do not fit fail the execution with an invalid-argument error
//! (the lowering never emits them).
//!
//! Floating point: the plugin's threads flush subnormals to zero, which
//! breaks some of faer's scaled arithmetic; a kernel runs with IEEE
//! subnormals (`float_env.rs`). The pool's threads turn flushing off as
//! they start (they would otherwise inherit the mode of the thread that
//! first asks for the pool).
//!
//! Threads: a kernel runs on the calling plugin thread, serially, unless
//! it is large enough to pay for threads (see `plan`): then on a pool of
//! this crate's own, one thread per core, either the matrices of a batch
//! spread over the pool, or one large matrix with faer's parallel code
//! (from each target's PARALLEL_FROM, measured). The calling thread waits
//! meanwhile, so a kernel keeps at most one thread per core busy.

mod float_env;
pub mod kernels;

use std::sync::OnceLock;

use faer::{Mat, Par};
use pjrt::xla_ffi::{self, dtype, Buffer, Call, FfiError, Handler, Platform};
use pjrt::Plugin;
use rayon::prelude::*;

pub use kernels::Elem;

/// Registers every decomposition with `plugin`, a CPU plugin, for the host
/// platform. Registering again does nothing.
pub fn install(plugin: &Plugin) -> pjrt::Result<()> {
    xla_ffi::register::<Kernel<Qr>>(plugin, Platform::Host, Qr::TARGET)?;
    xla_ffi::register::<Kernel<Eigh>>(plugin, Platform::Host, Eigh::TARGET)?;
    xla_ffi::register::<Kernel<Svd>>(plugin, Platform::Host, Svd::TARGET)?;
    xla_ffi::register::<Kernel<Cholesky>>(plugin, Platform::Host, Cholesky::TARGET)?;
    xla_ffi::register::<Kernel<Lu>>(plugin, Platform::Host, Lu::TARGET)?;
    xla_ffi::register::<Kernel<Solve>>(plugin, Platform::Host, Solve::TARGET)?;
    xla_ffi::register::<Kernel<Determinant>>(plugin, Platform::Host, Determinant::TARGET)
}

/// A decomposition served as an FFI target.
trait Decomposition: 'static {
    const TARGET: &'static str;
    /// How many operands it takes (each a batch of matrices, with the same
    /// batch dimensions and element type).
    const OPERANDS: usize = 1;
    /// What the call's attributes say (modes).
    type Options: Copy + Send + Sync + Default;

    fn options(_call: &Call<'_>) -> Result<Self::Options, FfiError> {
        Ok(Self::Options::default())
    }

    /// The results' dimensions after the batch dimensions, for operands of
    /// matrix dimensions `dims` (rows, columns), each with whether it holds
    /// real values (of the operands' precision) rather than their type.
    fn results(dims: &[(usize, usize)], options: Self::Options) -> Result<Vec<Output>, FfiError>;

    /// About how many floating-point operations one matrix takes.
    fn work(dims: &[(usize, usize)]) -> f64;

    /// From this size of one matrix (its smaller side) faer's parallel
    /// code runs it faster on two threads than on one, as measured with
    /// `examples/threads.rs` on 2 cores (bench/PERFORMANCE.md): below it a
    /// single matrix runs serially on the calling thread.
    const PARALLEL_FROM: usize;

    /// Decomposes `inputs` (one matrix of each operand) and writes each
    /// result, row-major, in `outs`.
    fn compute<T: Elem>(
        inputs: Vec<Mat<T>>,
        options: Self::Options,
        par: Par,
        outs: &mut [&mut [u8]],
    );
}

/// One result of a decomposition: its trailing dimensions and whether it
/// holds real values (of the input's precision) rather than the input's type.
struct Output {
    dims: Vec<usize>,
    real: bool,
}

fn same(dims: &[usize]) -> Output {
    Output {
        dims: dims.to_vec(),
        real: false,
    }
}

fn real(dims: &[usize]) -> Output {
    Output {
        dims: dims.to_vec(),
        real: true,
    }
}

/// The size of the square matrix `dims`.
fn square((m, n): (usize, usize), target: &str) -> Result<usize, FfiError> {
    if m == n {
        Ok(n)
    } else {
        Err(FfiError::invalid_argument(format!(
            "{target} takes square matrices, got {m}x{n}"
        )))
    }
}

/// The one input matrix of a one-operand decomposition.
fn one<T: Elem>(inputs: Vec<Mat<T>>) -> Mat<T> {
    inputs.into_iter().next().expect("one operand")
}

fn flag(call: &Call<'_>, name: &str) -> Result<bool, FfiError> {
    Ok(call.attr_i64(name)? != 0)
}

struct Qr;

impl Decomposition for Qr {
    const TARGET: &'static str = "exla_linalg_qr";
    // 256: 0.75x, 512: 1.0x, 1024: 1.2-1.45x
    const PARALLEL_FROM: usize = 640;
    type Options = bool;

    fn options(call: &Call<'_>) -> Result<bool, FfiError> {
        flag(call, "complete")
    }

    fn results(dims: &[(usize, usize)], complete: bool) -> Result<Vec<Output>, FfiError> {
        let (m, n) = dims[0];
        let k = if complete { m } else { m.min(n) };
        Ok(vec![same(&[m, k]), same(&[k, n])])
    }

    fn work(dims: &[(usize, usize)]) -> f64 {
        let (m, n) = dims[0];
        4.0 * (m * n) as f64 * m.min(n) as f64
    }

    fn compute<T: Elem>(inputs: Vec<Mat<T>>, complete: bool, par: Par, outs: &mut [&mut [u8]]) {
        let (q, r) = kernels::qr(one(inputs), complete, par);
        kernels::write_matrix(&q, outs[0]);
        kernels::write_matrix(&r, outs[1]);
    }
}

/// The largest matrices (by their smaller side) whose f32 and c64 eigh and
/// SVD are computed in their own type; larger ones are computed in f64 and
/// c128 and rounded once. faer's f32 eigensolvers lose orthonormality with
/// size faster than LAPACK's: max |VᵀV - I| was 3.8 (eigh) and 5.8 (SVD)
/// times JAX's at 64, 6 to 17 times from 96 on (bench/linalg_bench.exs;
/// issue 40 asks for at most 10), while in f64 they stay within JAX's f32
/// run time from there (bench/PERFORMANCE.md).
const NARROW_UP_TO: usize = 64;

struct Eigh;

impl Decomposition for Eigh {
    const TARGET: &'static str = "exla_linalg_eigh";
    // (f64) 128: 0.96x, 256: 1.2x, 1024: 1.8x
    const PARALLEL_FROM: usize = 160;
    type Options = ();

    fn results(dims: &[(usize, usize)], _: ()) -> Result<Vec<Output>, FfiError> {
        let n = square(dims[0], Self::TARGET)?;
        Ok(vec![real(&[n]), same(&[n, n])])
    }

    fn work(dims: &[(usize, usize)]) -> f64 {
        9.0 * (dims[0].1 as f64).powi(3)
    }

    fn compute<T: Elem>(inputs: Vec<Mat<T>>, _: (), par: Par, outs: &mut [&mut [u8]]) {
        let a = one(inputs);
        let wide = a.nrows() > NARROW_UP_TO;
        let (values, vectors) = kernels::eigh_in(a, wide, par);
        kernels::write_values(values, outs[0]);
        kernels::write_matrix(&vectors, outs[1]);
    }
}

struct Svd;

impl Decomposition for Svd {
    const TARGET: &'static str = "exla_linalg_svd";
    // (f64) 64: 0.94x, 128: 1.1x, 1024: 1.3x
    const PARALLEL_FROM: usize = 112;
    type Options = bool;

    fn options(call: &Call<'_>) -> Result<bool, FfiError> {
        flag(call, "full")
    }

    fn results(dims: &[(usize, usize)], full: bool) -> Result<Vec<Output>, FfiError> {
        let (m, n) = dims[0];
        let k = m.min(n);
        let (cols_u, rows_v) = if full { (m, n) } else { (k, k) };
        Ok(vec![same(&[m, cols_u]), real(&[k]), same(&[rows_v, n])])
    }

    fn work(dims: &[(usize, usize)]) -> f64 {
        let (m, n) = dims[0];
        let (big, small) = (m.max(n) as f64, m.min(n) as f64);
        12.0 * big * big * small + 10.0 * small.powi(3)
    }

    fn compute<T: Elem>(inputs: Vec<Mat<T>>, full: bool, par: Par, outs: &mut [&mut [u8]]) {
        let a = one(inputs);
        let wide = a.nrows().min(a.ncols()) > NARROW_UP_TO;
        let (u, s, vh) = kernels::svd_in(a, full, wide, par);
        kernels::write_matrix(&u, outs[0]);
        kernels::write_values(s, outs[1]);
        kernels::write_matrix(&vh, outs[2]);
    }
}

struct Cholesky;

impl Decomposition for Cholesky {
    const TARGET: &'static str = "exla_linalg_cholesky";
    // 256: 0.8-0.9x, 512: 1.0-1.07x, 1024: 1.3-1.5x
    const PARALLEL_FROM: usize = 512;
    type Options = ();

    fn results(dims: &[(usize, usize)], _: ()) -> Result<Vec<Output>, FfiError> {
        let n = square(dims[0], Self::TARGET)?;
        Ok(vec![same(&[n, n])])
    }

    fn work(dims: &[(usize, usize)]) -> f64 {
        (dims[0].1 as f64).powi(3) / 3.0
    }

    fn compute<T: Elem>(inputs: Vec<Mat<T>>, _: (), par: Par, outs: &mut [&mut [u8]]) {
        let l = kernels::cholesky(one(inputs), par);
        kernels::write_matrix(&l, outs[0]);
    }
}

struct Lu;

impl Decomposition for Lu {
    const TARGET: &'static str = "exla_linalg_lu";
    // 256: 0.8-0.9x, 512: 0.95-1.1x, 1024: 1.2x
    const PARALLEL_FROM: usize = 512;
    type Options = ();

    fn results(dims: &[(usize, usize)], _: ()) -> Result<Vec<Output>, FfiError> {
        let n = square(dims[0], Self::TARGET)?;
        Ok(vec![same(&[n, n]), same(&[n, n]), same(&[n, n])])
    }

    fn work(dims: &[(usize, usize)]) -> f64 {
        2.0 * (dims[0].1 as f64).powi(3) / 3.0
    }

    fn compute<T: Elem>(inputs: Vec<Mat<T>>, _: (), par: Par, outs: &mut [&mut [u8]]) {
        let (p, l, u) = kernels::lu(one(inputs), par);
        kernels::write_matrix(&p, outs[0]);
        kernels::write_matrix(&l, outs[1]);
        kernels::write_matrix(&u, outs[2]);
    }
}

struct Solve;

impl Decomposition for Solve {
    const TARGET: &'static str = "exla_linalg_solve";
    // (an LU)
    const PARALLEL_FROM: usize = Lu::PARALLEL_FROM;
    const OPERANDS: usize = 2;
    type Options = ();

    fn results(dims: &[(usize, usize)], _: ()) -> Result<Vec<Output>, FfiError> {
        let n = square(dims[0], Self::TARGET)?;
        let (rows, k) = dims[1];
        if rows != n {
            return Err(FfiError::invalid_argument(format!(
                "{}: B has {rows} rows, A {n}",
                Self::TARGET
            )));
        }
        Ok(vec![same(&[n, k])])
    }

    fn work(dims: &[(usize, usize)]) -> f64 {
        // the LU, then two triangular solves per column of B
        let n = dims[0].1 as f64;
        Lu::work(dims) + 2.0 * n * n * dims[1].1 as f64
    }

    fn compute<T: Elem>(inputs: Vec<Mat<T>>, _: (), par: Par, outs: &mut [&mut [u8]]) {
        let mut inputs = inputs.into_iter();
        let (a, b) = (inputs.next(), inputs.next());
        let (a, b) = (a.expect("two operands"), b.expect("two operands"));
        kernels::write_matrix(&kernels::solve(a, b, par), outs[0]);
    }
}

struct Determinant;

impl Decomposition for Determinant {
    const TARGET: &'static str = "exla_linalg_determinant";
    // (an LU)
    const PARALLEL_FROM: usize = Lu::PARALLEL_FROM;
    type Options = ();

    fn results(dims: &[(usize, usize)], _: ()) -> Result<Vec<Output>, FfiError> {
        square(dims[0], Self::TARGET)?;
        Ok(vec![same(&[])])
    }

    fn work(dims: &[(usize, usize)]) -> f64 {
        Lu::work(dims)
    }

    fn compute<T: Elem>(inputs: Vec<Mat<T>>, _: (), par: Par, outs: &mut [&mut [u8]]) {
        let det = kernels::determinant_wide(one(inputs), par);
        kernels::write_values([det], outs[0]);
    }
}

/// The FFI handler of a decomposition.
struct Kernel<D>(std::marker::PhantomData<D>);

impl<D: Decomposition> Handler for Kernel<D> {
    const NAME: &'static str = D::TARGET;

    fn execute(call: &mut Call<'_>) -> Result<(), FfiError> {
        if call.args.len() != D::OPERANDS {
            return Err(FfiError::invalid_argument(format!(
                "{} takes {} operand(s), got {}",
                D::TARGET,
                D::OPERANDS,
                call.args.len()
            )));
        }
        match call.args[0].dtype() {
            dtype::F32 => run::<D, f32>(call),
            dtype::F64 => run::<D, f64>(call),
            dtype::C64 => run::<D, faer::c32>(call),
            dtype::C128 => run::<D, faer::c64>(call),
            other => Err(FfiError::invalid_argument(format!(
                "{} takes f32, f64, c64 or c128 matrices, got XLA data type {other}",
                D::TARGET
            ))),
        }
    }
}

/// Decomposes each matrix of the operands, of element type `T`, into the
/// call's results, after checking their types and shapes.
fn run<D: Decomposition, T: Elem>(call: &mut Call<'_>) -> Result<(), FfiError> {
    let args: Vec<Buffer<'_>> = call.args.clone();
    let mut batch: Option<Vec<usize>> = None;
    let mut matrices = Vec::with_capacity(args.len());
    for arg in &args {
        let dims = dims(arg.dims())?;
        if arg.dtype() != T::DTYPE || dims.len() < 2 {
            return Err(FfiError::invalid_argument(format!(
                "{} takes batches of matrices of one type, got XLA data type {} with dimensions {dims:?}",
                D::TARGET,
                arg.dtype()
            )));
        }
        let (batch_dims, matrix) = dims.split_at(dims.len() - 2);
        if batch.get_or_insert_with(|| batch_dims.to_vec()) != batch_dims {
            return Err(FfiError::invalid_argument(format!(
                "{}: the operands' batch dimensions differ",
                D::TARGET
            )));
        }
        matrices.push((matrix[0], matrix[1]));
    }
    let batch_dims = batch.unwrap_or_default();
    let options = D::options(call)?;
    let outputs = D::results(&matrices, options)?;
    check_results::<T>(call, D::TARGET, &batch_dims, &outputs)?;
    let count: usize = batch_dims.iter().product();
    let inputs: Vec<Vec<&[u8]>> = args
        .iter()
        .map(|arg| Ok(chunks(arg.host_bytes()?, count)))
        .collect::<Result<_, FfiError>>()?;
    let mut per_matrix: Vec<Vec<&mut [u8]>> = (0..count).map(|_| Vec::new()).collect();
    for ret in call.rets.iter_mut() {
        for (b, chunk) in chunks_mut(ret.host_bytes_mut()?, count)
            .into_iter()
            .enumerate()
        {
            per_matrix[b].push(chunk);
        }
    }
    let decompose = |b: usize, outs: &mut Vec<&mut [u8]>, par: Par| {
        let mats = inputs
            .iter()
            .zip(&matrices)
            .map(|(chunks, &(m, n))| kernels::read_matrix::<T>(chunks[b], m, n))
            .collect();
        D::compute(mats, options, par, outs);
    };
    float_env::with_subnormals(|| {
        match plan(
            count,
            D::work(&matrices) * element_cost::<T>(),
            matrices[0].0.min(matrices[0].1) >= D::PARALLEL_FROM,
        ) {
            Plan::Serial => {
                for (b, outs) in per_matrix.iter_mut().enumerate() {
                    decompose(b, outs, Par::Seq);
                }
            }
            Plan::EachMatrixInParallel(pool) => pool.install(|| {
                let par = Par::rayon(pool.current_num_threads());
                for (b, outs) in per_matrix.iter_mut().enumerate() {
                    decompose(b, outs, par);
                }
            }),
            Plan::MatricesInParallel(pool) => pool.install(|| {
                per_matrix
                    .par_iter_mut()
                    .enumerate()
                    .for_each(|(b, outs)| decompose(b, outs, Par::Seq));
            }),
        }
    });
    Ok(())
}

fn dims(dims: &[i64]) -> Result<Vec<usize>, FfiError> {
    dims.iter()
        .map(|&d| usize::try_from(d).map_err(|_| FfiError::invalid_argument("bad dimensions")))
        .collect()
}

/// Checks that the call has the results `outputs` describes, after
/// `batch_dims`, of type `T` (or its real type).
fn check_results<T: Elem>(
    call: &Call<'_>,
    target: &str,
    batch_dims: &[usize],
    outputs: &[Output],
) -> Result<(), FfiError> {
    if call.rets.len() != outputs.len() {
        return Err(FfiError::invalid_argument(format!(
            "{target} returns {} results, the call has {}",
            outputs.len(),
            call.rets.len()
        )));
    }
    for (i, (ret, output)) in call.rets.iter().zip(outputs).enumerate() {
        let ret = ret.buffer();
        let want_type = if output.real {
            <T::Part as Elem>::DTYPE
        } else {
            T::DTYPE
        };
        let want_dims: Vec<usize> = batch_dims.iter().chain(&output.dims).copied().collect();
        if ret.dtype() != want_type || dims(ret.dims())? != want_dims {
            return Err(FfiError::invalid_argument(format!(
                "{target}: result {i} must be of XLA data type {want_type} with dimensions \
                 {want_dims:?}, got {} with {:?}",
                ret.dtype(),
                ret.dims()
            )));
        }
    }
    Ok(())
}

/// `bytes` cut into `count` equal parts (empty ones where it is empty).
fn chunks(bytes: &[u8], count: usize) -> Vec<&[u8]> {
    let size = bytes.len().checked_div(count).unwrap_or(0);
    (0..count)
        .map(|b| &bytes[b * size..(b + 1) * size])
        .collect()
}

fn chunks_mut(bytes: &mut [u8], count: usize) -> Vec<&mut [u8]> {
    let size = bytes.len().checked_div(count).unwrap_or(0);
    let mut rest = bytes;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(size);
        out.push(head);
        rest = tail;
    }
    out
}

/// A complex operation costs about four real ones.
fn element_cost<T: Elem>() -> f64 {
    if T::DTYPE == dtype::C64 || T::DTYPE == dtype::C128 {
        4.0
    } else {
        1.0
    }
}

/// How a batch is computed.
enum Plan {
    Serial,
    EachMatrixInParallel(&'static rayon::ThreadPool),
    MatricesInParallel(&'static rayon::ThreadPool),
}

/// Below this many operations in all, threads cost more than they save.
const SERIAL_WORK: f64 = 4.0e6;

/// The plan for `count` matrices of `work` operations each, `large` when
/// one matrix is large enough for faer's parallel code (PARALLEL_FROM).
/// A batch worth threads spreads its matrices over the pool, each serial:
/// that scales with the cores, where faer's parallel code on one matrix
/// gains 1.2 to 1.8 times on two. Below PARALLEL_FROM faer on threads is
/// slower than on one (a 256x256 QR: 1.35 ms on one thread, 1.8 ms on
/// two), so a single matrix that small runs on the calling thread.
fn plan(count: usize, work: f64, large: bool) -> Plan {
    let Some(pool) = pool() else {
        return Plan::Serial;
    };
    if count > 1 && count as f64 * work >= SERIAL_WORK {
        Plan::MatricesInParallel(pool)
    } else if large {
        Plan::EachMatrixInParallel(pool)
    } else {
        Plan::Serial
    }
}

/// The kernels' threads: one per core, made on first use; None on a single
/// core (or where threads cannot be made), where kernels run serially.
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        if threads < 2 {
            return None;
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("exla-linalg-{i}"))
            .start_handler(|_| float_env::allow_subnormals_on_this_thread())
            .build()
            .ok()
    })
    .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cut_batches_and_empty_buffers() {
        let bytes = [1u8, 2, 3, 4, 5, 6];
        assert_eq!(chunks(&bytes, 3), vec![&[1, 2][..], &[3, 4], &[5, 6]]);
        assert_eq!(chunks(&[], 2), vec![&[][..], &[]]);
        let mut empty: [u8; 0] = [];
        assert_eq!(chunks_mut(&mut empty, 2).len(), 2);
        assert!(chunks(&bytes, 0).is_empty());
    }

    #[test]
    fn small_work_runs_serially() {
        assert!(matches!(plan(1, 1000.0, false), Plan::Serial));
        assert!(matches!(plan(10, 1000.0, false), Plan::Serial));
        // a single matrix below PARALLEL_FROM, however much work
        assert!(matches!(plan(1, 1e9, false), Plan::Serial));
        if pool().is_some() {
            assert!(matches!(plan(1, 1e9, true), Plan::EachMatrixInParallel(_)));
            assert!(matches!(
                plan(10_000, 1e4, false),
                Plan::MatricesInParallel(_)
            ));
            assert!(matches!(plan(4, 1e9, true), Plan::MatricesInParallel(_)));
        }
    }

    #[test]
    fn results_follow_the_modes() {
        let dims = |outputs: Vec<Output>| outputs.into_iter().map(|o| o.dims).collect::<Vec<_>>();
        assert_eq!(
            dims(Qr::results(&[(5, 3)], false).unwrap()),
            [[5, 3], [3, 3]]
        );
        assert_eq!(
            dims(Qr::results(&[(5, 3)], true).unwrap()),
            [[5, 5], [5, 3]]
        );
        let svd = dims(Svd::results(&[(5, 3)], true).unwrap());
        assert_eq!(svd, vec![vec![5, 5], vec![3], vec![3, 3]]);
        assert!(Cholesky::results(&[(2, 3)], ()).is_err());
        assert_eq!(
            dims(Solve::results(&[(4, 4), (4, 2)], ()).unwrap()),
            [[4, 2]]
        );
        assert!(Solve::results(&[(4, 4), (3, 2)], ()).is_err());
        assert_eq!(
            dims(Determinant::results(&[(4, 4)], ()).unwrap()),
            [Vec::<usize>::new()]
        );
    }
}
