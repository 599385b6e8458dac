//! The decompositions of one matrix, on faer's column-major matrices, with
//! the conventions EXLA gives them:
//!
//! * QR: Householder (LAPACK's geqrf), with R's diagonal real and
//!   non-negative (Q's columns and R's rows turned to make it so), as Nx's
//!   own QR gives it for real input;
//! * eigh: eigenvalues by decreasing magnitude (the order of EXLA 0.13.1's
//!   host eigh; stable among equal magnitudes, which keep faer's ascending
//!   order), each eigenvector turned so that its entry of largest magnitude
//!   (the first of equals) is real and positive. The input is made
//!   Hermitian first, (A + Aᴴ) / 2, as JAX does;
//! * SVD: singular values non-increasing; each pair of singular vectors is
//!   turned so that the entry of largest magnitude of the right one (a row
//!   of Vᴴ) is real and positive, and each column of U beyond the singular
//!   values (with full matrices) so that its own is. A zero matrix gives
//!   identities;
//! * Cholesky: the lower factor, with a real positive diagonal; a matrix
//!   that is not positive definite gives NaN everywhere (as JAX's does);
//! * LU: partial pivoting (LAPACK's getrf), A = P . L . U with L unit lower
//!   triangular.
//!
//! Where the input holds a NaN or an infinity, eigh and the SVD (iterative
//! methods, which would not converge) give NaN everywhere; QR and LU
//! propagate them as their arithmetic does.

use faer::diag::Diag;
use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::{cholesky, evd, householder, lu, qr, svd};
use faer::prelude::default;
use faer::{c32, c64, Conj, Mat, MatMut, MatRef, Par};

/// The element types the kernels compute in: XLA's f32, f64, c64 and c128.
pub trait Elem:
    faer::traits::ComplexField
    + Copy
    + Send
    + Sync
    + 'static
    + std::ops::Mul<Output = Self>
    + std::ops::Sub<Output = Self>
{
    /// The real type of the same precision (itself for real types).
    type Part: Elem<Part = Self::Part> + faer::traits::RealField;
    /// The type of twice the precision, or itself for f64 and c128.
    type Wide: Elem<Part = <Self::Part as Elem>::Wide>;
    /// Whether `Wide` is wider than this type (f32 and c64).
    const NARROW: bool;
    /// `XLA_FFI_DataType` code.
    const DTYPE: i32;
    /// Size in bytes.
    const BYTES: usize;

    fn read(bytes: &[u8]) -> Self;
    fn write(self, bytes: &mut [u8]);
    fn from_real(real: Self::Part) -> Self;
    fn real_part(self) -> Self::Part;
    fn magnitude(self) -> f64;
    fn finite(self) -> bool;
    /// The unit-modulus factor that turns `self` real and positive when it
    /// multiplies it (conj(self) / |self|), or 1 for 0.
    fn unphase(self) -> Self;
    fn times(self, other: Self) -> Self {
        self * other
    }
    fn minus(self, other: Self) -> Self {
        self - other
    }
    fn inverse(self) -> Self;
    /// |re| + |im|, which LU pivots on (as LAPACK and faer do).
    fn magnitude1(self) -> f64;
    fn conjugate(self) -> Self;
    fn nan() -> Self;
    fn zero() -> Self;
    fn one() -> Self;
    /// (a + conj(b)) / 2.
    fn hermitian_mean(a: Self, b: Self) -> Self;
    /// An f64 as this type's real part (for determinants' signs).
    fn real_value(value: f64) -> Self;
    fn widen(self) -> Self::Wide;
    /// Rounds a wide value to this type.
    fn narrow(wide: Self::Wide) -> Self;
}

macro_rules! real_elem {
    ($t:ty, $wide:ty, $code:expr) => {
        impl Elem for $t {
            type Part = $t;
            type Wide = $wide;
            const NARROW: bool = std::mem::size_of::<$t>() < std::mem::size_of::<$wide>();
            const DTYPE: i32 = $code;
            const BYTES: usize = std::mem::size_of::<$t>();

            #[inline]

            fn read(bytes: &[u8]) -> Self {
                <$t>::from_ne_bytes(bytes[..Self::BYTES].try_into().unwrap())
            }
            #[inline]
            fn write(self, bytes: &mut [u8]) {
                bytes[..Self::BYTES].copy_from_slice(&self.to_ne_bytes());
            }
            #[inline]
            fn from_real(real: Self) -> Self {
                real
            }
            #[inline]
            fn real_part(self) -> Self {
                self
            }
            #[inline]
            fn magnitude(self) -> f64 {
                (self as f64).abs()
            }
            #[inline]
            fn finite(self) -> bool {
                self.is_finite()
            }
            #[inline]
            fn unphase(self) -> Self {
                if self < 0.0 {
                    -1.0
                } else {
                    1.0
                }
            }
            #[inline]
            fn inverse(self) -> Self {
                1.0 / self
            }
            #[inline]
            fn magnitude1(self) -> f64 {
                (self as f64).abs()
            }
            #[inline]
            fn conjugate(self) -> Self {
                self
            }
            #[inline]
            fn nan() -> Self {
                <$t>::NAN
            }
            #[inline]
            fn zero() -> Self {
                0.0
            }
            #[inline]
            fn one() -> Self {
                1.0
            }
            #[inline]
            fn hermitian_mean(a: Self, b: Self) -> Self {
                (a + b) * 0.5
            }
            #[inline]
            fn real_value(value: f64) -> Self {
                value as $t
            }
            #[inline]
            fn widen(self) -> $wide {
                self as $wide
            }
            #[inline]
            fn narrow(wide: $wide) -> Self {
                wide as $t
            }
        }
    };
}

real_elem!(f32, f64, pjrt::xla_ffi::dtype::F32);
real_elem!(f64, f64, pjrt::xla_ffi::dtype::F64);

macro_rules! complex_elem {
    ($t:ty, $r:ty, $wide:ty, $code:expr) => {
        impl Elem for $t {
            type Part = $r;
            type Wide = $wide;
            const NARROW: bool = std::mem::size_of::<$t>() < std::mem::size_of::<$wide>();
            const DTYPE: i32 = $code;
            const BYTES: usize = 2 * std::mem::size_of::<$r>();

            #[inline]

            fn read(bytes: &[u8]) -> Self {
                let half = Self::BYTES / 2;
                <$t>::new(<$r>::read(bytes), <$r>::read(&bytes[half..]))
            }
            #[inline]
            fn write(self, bytes: &mut [u8]) {
                let half = Self::BYTES / 2;
                self.re.write(bytes);
                self.im.write(&mut bytes[half..]);
            }
            #[inline]
            fn from_real(real: $r) -> Self {
                <$t>::new(real, 0.0)
            }
            #[inline]
            fn real_part(self) -> $r {
                self.re
            }
            #[inline]
            fn magnitude(self) -> f64 {
                (self.re as f64).hypot(self.im as f64)
            }
            #[inline]
            fn finite(self) -> bool {
                self.re.is_finite() && self.im.is_finite()
            }
            #[inline]
            fn unphase(self) -> Self {
                let norm = self.re.hypot(self.im);
                if norm == 0.0 {
                    <$t>::new(1.0, 0.0)
                } else {
                    <$t>::new(self.re / norm, -self.im / norm)
                }
            }
            #[inline]
            fn inverse(self) -> Self {
                <$t>::new(1.0, 0.0) / self
            }
            #[inline]
            fn magnitude1(self) -> f64 {
                (self.re as f64).abs() + (self.im as f64).abs()
            }
            #[inline]
            fn conjugate(self) -> Self {
                <$t>::new(self.re, -self.im)
            }
            #[inline]
            fn nan() -> Self {
                <$t>::new(<$r>::NAN, <$r>::NAN)
            }
            #[inline]
            fn zero() -> Self {
                <$t>::new(0.0, 0.0)
            }
            #[inline]
            fn one() -> Self {
                <$t>::new(1.0, 0.0)
            }
            #[inline]
            fn hermitian_mean(a: Self, b: Self) -> Self {
                <$t>::new((a.re + b.re) * 0.5, (a.im - b.im) * 0.5)
            }
            #[inline]
            fn real_value(value: f64) -> Self {
                <$t>::new(value as $r, 0.0)
            }
            #[inline]
            fn widen(self) -> $wide {
                <$wide>::new(self.re.widen(), self.im.widen())
            }
            #[inline]
            fn narrow(wide: $wide) -> Self {
                <$t>::new(<$r>::narrow(wide.re), <$r>::narrow(wide.im))
            }
        }
    };
}

complex_elem!(c32, f32, c64, pjrt::xla_ffi::dtype::C64);
complex_elem!(c64, f64, c64, pjrt::xla_ffi::dtype::C128);

/// Side of the square tiles in which matrices are copied between row-major
/// bytes and faer's column-major matrices: one side of the copy strides by
/// a row, and a tile keeps those lines in the L1 cache. Rows of a power of
/// two bytes map to the same cache sets, so a tile has no more rows than a
/// set has ways (8 to 12): with 32, copying a 1024 x 1024 f32 matrix in and
/// out took a quarter of its Cholesky decomposition's time, with 8 a tenth
/// (`examples/threads.rs` under perf).
const TILE: usize = 8;

/// The tiles of a `rows` x `cols` matrix: (rows, columns) ranges.
fn tiles(
    rows: usize,
    cols: usize,
) -> impl Iterator<Item = (std::ops::Range<usize>, std::ops::Range<usize>)> {
    (0..rows).step_by(TILE).flat_map(move |i0| {
        (0..cols)
            .step_by(TILE)
            .map(move |j0| (i0..(i0 + TILE).min(rows), j0..(j0 + TILE).min(cols)))
    })
}

/// A row-major `rows` x `cols` matrix of `T` in `bytes`, copied into a
/// column-major one (faer's decompositions prefer it).
pub fn read_matrix<T: Elem>(bytes: &[u8], rows: usize, cols: usize) -> Mat<T> {
    let mut matrix = Mat::<T>::zeros(rows, cols);
    let row_bytes = cols * T::BYTES;
    for (tile_rows, tile_cols) in tiles(rows, cols) {
        for j in tile_cols {
            let column = matrix.col_as_slice_mut(j);
            for i in tile_rows.clone() {
                column[i] = T::read(&bytes[i * row_bytes + j * T::BYTES..]);
            }
        }
    }
    matrix
}

/// Writes `matrix` row-major into `bytes`.
pub fn write_matrix<T: Elem>(matrix: &Mat<T>, bytes: &mut [u8]) {
    let row_bytes = matrix.ncols() * T::BYTES;
    for (tile_rows, tile_cols) in tiles(matrix.nrows(), matrix.ncols()) {
        for j in tile_cols {
            let column = matrix.col_as_slice(j);
            for i in tile_rows.clone() {
                column[i].write(&mut bytes[i * row_bytes + j * T::BYTES..]);
            }
        }
    }
}

/// Writes `values` into `bytes`.
pub fn write_values<T: Elem>(values: impl IntoIterator<Item = T>, bytes: &mut [u8]) {
    for (value, out) in values.into_iter().zip(bytes.chunks_exact_mut(T::BYTES)) {
        value.write(out);
    }
}

fn all_finite<T: Elem>(a: MatRef<'_, T>) -> bool {
    (0..a.ncols()).all(|j| (0..a.nrows()).all(|i| a[(i, j)].finite()))
}

fn all_zero<T: Elem>(a: MatRef<'_, T>) -> bool {
    (0..a.ncols()).all(|j| (0..a.nrows()).all(|i| a[(i, j)].magnitude() == 0.0))
}

/// The index of the entry of largest magnitude of column `j` (the first of
/// equals).
fn largest_in_column<T: Elem>(m: MatRef<'_, T>, j: usize) -> usize {
    let mut best = 0;
    let mut magnitude = -1.0;
    for i in 0..m.nrows() {
        let value = m[(i, j)].magnitude();
        if value > magnitude {
            best = i;
            magnitude = value;
        }
    }
    best
}

fn scale_column<T: Elem>(m: MatMut<'_, T>, j: usize, factor: T) {
    let mut m = m;
    for i in 0..m.nrows() {
        let value = m[(i, j)];
        m[(i, j)] = value.times(factor);
    }
}

/// The QR decomposition of the m x n matrix `a`: Q (m x k) and R (k x n),
/// where k is m with `complete`, else min(m, n).
pub fn qr<T: Elem>(a: Mat<T>, complete: bool, par: Par) -> (Mat<T>, Mat<T>) {
    let (m, n) = a.shape();
    let size = m.min(n);
    let k = if complete { m } else { size };
    let mut a = a;
    if size == 0 {
        return (Mat::identity(m, k), Mat::zeros(k, n));
    }
    let block = qr::no_pivoting::factor::recommended_block_size::<T>(m, n);
    let mut coeff = Mat::<T>::zeros(block, size);
    let scratch = qr::no_pivoting::factor::qr_in_place_scratch::<T>(m, n, block, par, default())
        .or(
            householder::apply_block_householder_sequence_on_the_left_in_place_scratch::<T>(
                m, block, k,
            ),
        );
    let mut memory = MemBuffer::new(scratch);
    let stack = MemStack::new(&mut memory);
    qr::no_pivoting::factor::qr_in_place(a.as_mut(), coeff.as_mut(), par, stack, default());
    // The reflectors: below the diagonal of the first `size` columns, with
    // a unit diagonal.
    let basis = Mat::from_fn(m, size, |i, j| match i.cmp(&j) {
        std::cmp::Ordering::Greater => a[(i, j)],
        std::cmp::Ordering::Equal => T::one(),
        std::cmp::Ordering::Less => T::zero(),
    });
    let mut q = Mat::<T>::identity(m, k);
    householder::apply_block_householder_sequence_on_the_left_in_place_with_conj(
        basis.as_ref(),
        coeff.as_ref(),
        Conj::No,
        q.as_mut(),
        par,
        stack,
    );
    let mut r = Mat::from_fn(k, n, |i, j| if i <= j { a[(i, j)] } else { T::zero() });
    // Turn row j of R (and column j of Q) so that R[j][j] is real and
    // non-negative, where reflector j did something: faer marks one that
    // did not (a column already zero below the diagonal) with an infinite
    // factor, and such a step keeps its entry, as Nx's Householder steps
    // do. With no more rows than columns, the last row's step reflects
    // nothing, in faer as in Nx (an empty column below, or one Nx padded
    // with zeros): its turn is the product of the others' conjugates, so
    // that Q keeps the determinant of Nx's product of reflectors, which
    // gives Nx's Q and R for every real matrix of full rank.
    let mut product = T::one();
    for j in 0..size {
        let trivial = !coeff[(j % block, j)].finite();
        let turn = if m <= n && j == m - 1 {
            product.conjugate()
        } else if trivial {
            T::one()
        } else {
            r[(j, j)].unphase()
        };
        product = product.times(turn);
        if turn != T::one() {
            for c in j..n {
                r[(j, c)] = r[(j, c)].times(turn);
            }
            scale_column(q.as_mut(), j, turn.conjugate());
            if !(trivial || m <= n && j == m - 1) {
                // exactly real (the product leaves rounding in the imaginary part)
                r[(j, j)] = T::from_real(r[(j, j)].real_part());
            }
        }
    }
    (q, r)
}

/// The eigendecomposition of the Hermitian part of the n x n matrix `a`:
/// eigenvalues (real) and eigenvectors (columns).
pub fn eigh<T: Elem>(a: Mat<T>, par: Par) -> (Vec<T::Part>, Mat<T>) {
    let n = a.nrows();
    if !all_finite(a.as_ref()) {
        return (vec![T::Part::nan(); n], Mat::full(n, n, T::nan()));
    }
    let hermitian = Mat::from_fn(n, n, |i, j| T::hermitian_mean(a[(i, j)], a[(j, i)]));
    let mut values = Diag::<T>::zeros(n);
    let mut vectors = Mat::<T>::zeros(n, n);
    let scratch =
        evd::self_adjoint_evd_scratch::<T>(n, evd::ComputeEigenvectors::Yes, par, default());
    let mut memory = MemBuffer::new(scratch);
    let outcome = evd::self_adjoint_evd(
        hermitian.as_ref(),
        values.as_mut(),
        Some(vectors.as_mut()),
        par,
        MemStack::new(&mut memory),
        default(),
    );
    if outcome.is_err() {
        return (vec![T::Part::nan(); n], Mat::full(n, n, T::nan()));
    }
    let values: Vec<T::Part> = values
        .column_vector()
        .iter()
        .map(|&v| v.real_part())
        .collect();
    // faer gives them ascending: by decreasing magnitude, stable.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&x, &y| {
        values[y]
            .magnitude()
            .partial_cmp(&values[x].magnitude())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let sorted_values = order.iter().map(|&i| values[i]).collect();
    let mut sorted = Mat::from_fn(n, n, |i, j| vectors[(i, order[j])]);
    for j in 0..n {
        let turn = sorted[(largest_in_column(sorted.as_ref(), j), j)].unphase();
        scale_column(sorted.as_mut(), j, turn);
    }
    (sorted_values, sorted)
}

/// `eigh`, computed in the wide type and rounded once where `wide` (f32 and
/// c64 only).
pub fn eigh_in<T: Elem>(a: Mat<T>, wide: bool, par: Par) -> (Vec<T::Part>, Mat<T>) {
    if !(wide && T::NARROW) {
        return eigh(a, par);
    }
    let (values, vectors) = eigh(widened(&a), par);
    let values = values.into_iter().map(<T::Part as Elem>::narrow).collect();
    (values, narrowed(&vectors))
}

/// `svd`, computed in the wide type and rounded once where `wide` (f32 and
/// c64 only), with the singular values under the rank floor made zero.
pub fn svd_in<T: Elem>(
    a: Mat<T>,
    full: bool,
    wide: bool,
    par: Par,
) -> (Mat<T>, Vec<T::Part>, Mat<T>) {
    let (m, n) = a.shape();
    let (u, mut s, vh) = if wide && T::NARROW {
        let (u, s, vh) = svd(widened(&a), full, par);
        let s = s.into_iter().map(<T::Part as Elem>::narrow).collect();
        (narrowed(&u), s, narrowed(&vh))
    } else {
        svd(a, full, par)
    };
    zero_under_rank_floor(&mut s, m.max(n));
    (u, s, vh)
}

/// Makes zero the singular values at or under max(m, n) x eps x the
/// largest, eps that of the result's type: numpy's and LAPACK's bound of
/// the numerical rank, under which a value is rounding (any SVD's backward
/// error is about eps x the largest). Nx's own SVD gives exact zeros for
/// such matrices (a centred 4x6 matrix: 0.0 where faer gives 6e-8), and
/// Nx.LinAlg.pinv, which drops values under an absolute 1e-10 only,
/// depends on it: with 6e-8 inverted, the least squares of Scholar's
/// LinearRegression on more features than samples came out wrong by 0.5.
fn zero_under_rank_floor<R: Elem>(s: &mut [R], size: usize) {
    let eps = if R::BYTES == 4 {
        f64::from(f32::EPSILON)
    } else {
        f64::EPSILON
    };
    let largest = s.iter().map(|v| v.magnitude()).fold(0.0, f64::max);
    let floor = size as f64 * eps * largest;
    for v in s.iter_mut() {
        if v.magnitude() <= floor {
            *v = R::zero();
        }
    }
}

fn widened<T: Elem>(a: &Mat<T>) -> Mat<T::Wide> {
    Mat::from_fn(a.nrows(), a.ncols(), |i, j| a[(i, j)].widen())
}

fn narrowed<T: Elem>(a: &Mat<T::Wide>) -> Mat<T> {
    Mat::from_fn(a.nrows(), a.ncols(), |i, j| T::narrow(a[(i, j)]))
}

/// The singular value decomposition of the m x n matrix `a`: U (m x m with
/// `full`, else m x k), the k = min(m, n) singular values and Vᴴ (n x n
/// with `full`, else k x n).
pub fn svd<T: Elem>(a: Mat<T>, full: bool, par: Par) -> (Mat<T>, Vec<T::Part>, Mat<T>) {
    let (m, n) = a.shape();
    let k = m.min(n);
    let (cols_u, rows_v) = if full { (m, n) } else { (k, k) };
    if !all_finite(a.as_ref()) {
        return (
            Mat::full(m, cols_u, T::nan()),
            vec![T::Part::nan(); k],
            Mat::full(rows_v, n, T::nan()),
        );
    }
    if k == 0 || all_zero(a.as_ref()) {
        return (
            Mat::identity(m, cols_u),
            vec![T::Part::zero(); k],
            Mat::identity(rows_v, n),
        );
    }
    let mode = if full {
        svd::ComputeSvdVectors::Full
    } else {
        svd::ComputeSvdVectors::Thin
    };
    let mut s = Diag::<T>::zeros(k);
    let mut u = Mat::<T>::zeros(m, cols_u);
    let mut v = Mat::<T>::zeros(n, rows_v);
    let scratch = svd::svd_scratch::<T>(m, n, mode, mode, par, default());
    let mut memory = MemBuffer::new(scratch);
    let outcome = svd::svd(
        a.as_ref(),
        s.as_mut(),
        Some(u.as_mut()),
        Some(v.as_mut()),
        par,
        MemStack::new(&mut memory),
        default(),
    );
    if outcome.is_err() {
        return (
            Mat::full(m, cols_u, T::nan()),
            vec![T::Part::nan(); k],
            Mat::full(rows_v, n, T::nan()),
        );
    }
    let s: Vec<T::Part> = s.column_vector().iter().map(|&v| v.real_part()).collect();
    // Vᴴ's row j is conj(V's column j): its largest entry is made real and
    // positive by turning V's column by the conjugate factor, and U's
    // column j turns with it, so that U S Vᴴ is unchanged.
    for j in 0..rows_v {
        let turn = v[(largest_in_column(v.as_ref(), j), j)].unphase();
        scale_column(v.as_mut(), j, turn);
        if j < k {
            scale_column(u.as_mut(), j, turn);
        }
    }
    for j in k..cols_u {
        let turn = u[(largest_in_column(u.as_ref(), j), j)].unphase();
        scale_column(u.as_mut(), j, turn);
    }
    let vh = Mat::from_fn(rows_v, n, |i, j| v[(j, i)].conjugate());
    (u, s, vh)
}

/// The lower Cholesky factor of the n x n matrix `a` (its lower triangle is
/// read), or NaN everywhere when it is not positive definite.
pub fn cholesky<T: Elem>(a: Mat<T>, par: Par) -> Mat<T> {
    let n = a.nrows();
    let mut l = Mat::from_fn(n, n, |i, j| if i >= j { a[(i, j)] } else { T::zero() });
    let scratch = cholesky::llt::factor::cholesky_in_place_scratch::<T>(n, par, default());
    let mut memory = MemBuffer::new(scratch);
    let outcome = cholesky::llt::factor::cholesky_in_place(
        l.as_mut(),
        default(),
        par,
        MemStack::new(&mut memory),
        default(),
    );
    if outcome.is_err() || !all_finite(l.as_ref()) {
        return Mat::full(n, n, T::nan());
    }
    // faer works in the strict upper triangle too; the diagonal is real
    // (a complex one may hold rounding in its imaginary part).
    for j in 0..n {
        for i in 0..j {
            l[(i, j)] = T::zero();
        }
        l[(j, j)] = T::from_real(l[(j, j)].real_part());
    }
    l
}

/// A matrix factored by LU with partial pivoting: L (strictly below the
/// diagonal, unit diagonal implied) and U in one matrix, P A = L U with row
/// i of P A row `perm[i]` of A, and the number of row swaps.
pub struct Lu<T: Elem> {
    lu: Mat<T>,
    perm: Vec<usize>,
    perm_inv: Vec<usize>,
    swaps: usize,
}

/// Factors the n x n matrix `a` by LU with partial pivoting (LAPACK's
/// getrf: the largest |re| + |im| of the column, the first of equals; a
/// zero pivot leaves the column below it alone).
pub fn factor_lu<T: Elem>(a: Mat<T>, par: Par) -> Lu<T> {
    let n = a.nrows();
    let finite = all_finite(a.as_ref());
    let mut lu = a.clone();
    let mut perm = vec![0usize; n];
    let mut perm_inv = vec![0usize; n];
    let scratch =
        lu::partial_pivoting::factor::lu_in_place_scratch::<usize, T>(n, n, par, default());
    let mut memory = MemBuffer::new(scratch);
    let (info, _) = lu::partial_pivoting::factor::lu_in_place(
        lu.as_mut(),
        &mut perm,
        &mut perm_inv,
        par,
        MemStack::new(&mut memory),
        default(),
    );
    let mut swaps = info.transposition_count;
    if finite && !all_finite(lu.as_ref()) {
        // A zero pivot: faer divides by it, LAPACK's getrf skips the column
        // (all zeros below the pivot) and goes on, as this does.
        lu = a;
        swaps = unblocked_lu(lu.as_mut(), &mut perm);
        for (i, &row) in perm.iter().enumerate() {
            perm_inv[row] = i;
        }
    }
    Lu {
        lu,
        perm,
        perm_inv,
        swaps,
    }
}

/// The LU decomposition with partial pivoting of the n x n matrix `a`:
/// P, L and U with A = P . L . U.
pub fn lu<T: Elem>(a: Mat<T>, par: Par) -> (Mat<T>, Mat<T>, Mat<T>) {
    let n = a.nrows();
    let Lu { lu, perm, .. } = factor_lu(a, par);
    let l = Mat::from_fn(n, n, |i, j| match i.cmp(&j) {
        std::cmp::Ordering::Greater => lu[(i, j)],
        std::cmp::Ordering::Equal => T::one(),
        std::cmp::Ordering::Less => T::zero(),
    });
    let u = Mat::from_fn(n, n, |i, j| if i <= j { lu[(i, j)] } else { T::zero() });
    // P A = L U: A = Pᵀ L U.
    let mut p = Mat::<T>::zeros(n, n);
    for (i, &row) in perm.iter().enumerate() {
        p[(row, i)] = T::one();
    }
    (p, l, u)
}

/// X with A X = B, for the n x n matrix `a` and the n x k matrix `b`, by
/// LU with partial pivoting (LAPACK's gesv). A singular A gives infinities
/// and NaN.
pub fn solve<T: Elem>(a: Mat<T>, b: Mat<T>, par: Par) -> Mat<T> {
    let (n, k) = b.shape();
    let factors = factor_lu(a, par);
    let mut x = b;
    let perm = faer::perm::PermRef::new_checked(&factors.perm, &factors.perm_inv, n);
    let scratch = lu::partial_pivoting::solve::solve_in_place_scratch::<usize, T>(n, k, par);
    let mut memory = MemBuffer::new(scratch);
    lu::partial_pivoting::solve::solve_in_place(
        factors.lu.as_ref(),
        factors.lu.as_ref(),
        perm,
        x.as_mut(),
        par,
        MemStack::new(&mut memory),
    );
    x
}

/// The determinant of the n x n matrix `a`: the product of U's diagonal,
/// signed by the row swaps (0 for a zero pivot).
pub fn determinant<T: Elem>(a: Mat<T>, par: Par) -> T {
    let factors = factor_lu(a, par);
    let sign = if factors.swaps % 2 == 0 { 1.0 } else { -1.0 };
    (0..factors.lu.nrows()).fold(T::real_value(sign), |product, i| {
        product.times(factors.lu[(i, i)])
    })
}

/// `determinant`, of f32 and c64 matrices computed in f64 and c128 and
/// rounded once: in f32 the determinant of a 256x256 matrix was 2.4e-7
/// from the exact one, JAX's 1.3e-8 (the loss is in the f32 LU, not in the
/// product of its diagonal).
pub fn determinant_wide<T: Elem>(a: Mat<T>, par: Par) -> T {
    if T::NARROW {
        T::narrow(determinant(widened(&a), par))
    } else {
        determinant(a, par)
    }
}

/// LAPACK's unblocked getrf (getf2) in place, pivoting on the largest
/// |re| + |im| (the first of equals) and skipping the elimination below a
/// zero pivot. Fills `perm` as faer does; returns the number of swaps.
fn unblocked_lu<T: Elem>(a: MatMut<'_, T>, perm: &mut [usize]) -> usize {
    let mut a = a;
    let n = a.nrows();
    let mut swaps = 0;
    for (i, p) in perm.iter_mut().enumerate() {
        *p = i;
    }
    for k in 0..n {
        let mut pivot = k;
        let mut largest = -1.0;
        for i in k..n {
            let value = a[(i, k)].magnitude1();
            if value > largest {
                largest = value;
                pivot = i;
            }
        }
        if pivot != k {
            for j in 0..n {
                let tmp = a[(k, j)];
                a[(k, j)] = a[(pivot, j)];
                a[(pivot, j)] = tmp;
            }
            perm.swap(k, pivot);
            swaps += 1;
        }
        let head = a[(k, k)];
        if head.magnitude() == 0.0 {
            continue;
        }
        let inverse = head.inverse();
        for i in k + 1..n {
            let factor = a[(i, k)].times(inverse);
            a[(i, k)] = factor;
            for j in k + 1..n {
                let value = a[(i, j)].minus(factor.times(a[(k, j)]));
                a[(i, j)] = value;
            }
        }
    }
    swaps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(rows: usize, cols: usize, seed: u64) -> Mat<f64> {
        let mut state = seed;
        Mat::from_fn(rows, cols, |_, _| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
    }

    fn max_diff(a: MatRef<'_, f64>, b: MatRef<'_, f64>) -> f64 {
        let mut worst: f64 = 0.0;
        for j in 0..a.ncols() {
            for i in 0..a.nrows() {
                worst = worst.max((a[(i, j)] - b[(i, j)]).abs());
            }
        }
        worst
    }

    fn orthonormality(q: MatRef<'_, f64>) -> f64 {
        let gram = q.transpose() * q;
        max_diff(
            gram.as_ref(),
            Mat::<f64>::identity(q.ncols(), q.ncols()).as_ref(),
        )
    }

    #[test]
    fn qr_reconstructs_with_a_non_negative_diagonal() {
        for (m, n, complete) in [(5, 3, false), (5, 3, true), (3, 5, false), (4, 4, true)] {
            let a = matrix(m, n, 7);
            let (q, r) = qr(a.clone(), complete, Par::Seq);
            assert_eq!(q.shape(), (m, if complete { m } else { m.min(n) }));
            assert!(max_diff((&q * &r).as_ref(), a.as_ref()) < 1e-12);
            assert!(orthonormality(q.as_ref()) < 1e-12);
            // (the last of a square or wide matrix keeps the determinant's sign)
            for j in 0..m.min(n) - usize::from(m <= n) {
                assert!(r[(j, j)] >= 0.0);
            }
        }
    }

    #[test]
    fn eigh_orders_by_decreasing_magnitude() {
        let a = matrix(6, 6, 3);
        let sym = Mat::from_fn(6, 6, |i, j| a[(i, j)] + a[(j, i)]);
        let (values, vectors) = eigh(sym.clone(), Par::Seq);
        for w in values.windows(2) {
            assert!(w[0].abs() >= w[1].abs());
        }
        let lambda = Mat::from_fn(6, 6, |i, j| if i == j { values[i] } else { 0.0 });
        let back = &vectors * &lambda * vectors.transpose();
        assert!(max_diff(back.as_ref(), sym.as_ref()) < 1e-12);
        assert!(orthonormality(vectors.as_ref()) < 1e-12);
    }

    #[test]
    fn svd_reconstructs_and_zero_gives_identities() {
        for (m, n) in [(8, 6), (6, 8), (5, 5)] {
            let a = matrix(m, n, 11);
            let (u, s, vh) = svd(a.clone(), false, Par::Seq);
            let k = m.min(n);
            let sigma = Mat::from_fn(k, k, |i, j| if i == j { s[i] } else { 0.0 });
            assert!(max_diff((&u * &sigma * &vh).as_ref(), a.as_ref()) < 1e-12);
            let (u, _, vh) = svd(a, true, Par::Seq);
            assert!(orthonormality(u.as_ref()) < 1e-12);
            assert!(orthonormality(vh.transpose()) < 1e-12);
        }
        let (u, s, vh) = svd(Mat::<f64>::zeros(4, 3), true, Par::Seq);
        assert_eq!(u, Mat::<f64>::identity(4, 4));
        assert_eq!(vh, Mat::<f64>::identity(3, 3));
        assert_eq!(s, vec![0.0; 3]);
    }

    #[test]
    fn svd_of_a_rank_deficient_matrix_gives_exact_zeros() {
        // rank 2 (the third row is the sum of the first two), in f32 and
        // f32 computed in f64: the last value is rounding, made zero; a
        // small but significant value (1e-4 of the largest) stays.
        let a = Mat::from_fn(3, 4, |i, j| {
            let (x, y) = ((j + 1) as f32, ((j * j) % 5) as f32);
            [x, y, x + y][i]
        });
        for wide in [false, true] {
            let (u, s, vh) = svd_in(a.clone(), false, wide, Par::Seq);
            assert!(s[1] > 0.0);
            assert_eq!(s[2], 0.0);
            let sigma = Mat::from_fn(3, 3, |i, j| if i == j { s[i] } else { 0.0 });
            let back = &u * &sigma * &vh;
            for (i, j) in (0..3).flat_map(|i| (0..4).map(move |j| (i, j))) {
                assert!((back[(i, j)] - a[(i, j)]).abs() < 1e-5);
            }
        }
        let d = Mat::from_fn(3, 3, |i, j| if i == j { [1.0, 1e-2, 1e-4][i] } else { 0.0 });
        let (_, s, _) = svd_in(d, false, false, Par::Seq);
        assert_eq!(s, vec![1.0, 1e-2, 1e-4]);
    }

    #[test]
    fn lu_gives_a_equal_to_p_l_u() {
        let a = matrix(5, 5, 5);
        let (p, l, u) = lu(a.clone(), Par::Seq);
        assert!(max_diff((&p * &l * &u).as_ref(), a.as_ref()) < 1e-12);
    }

    #[test]
    fn solve_and_determinant_through_lu() {
        let a = matrix(6, 6, 8);
        let b = matrix(6, 2, 9);
        let x = solve(a.clone(), b.clone(), Par::Seq);
        assert!(max_diff((&a * &x).as_ref(), b.as_ref()) < 1e-12);
        let swap = Mat::from_fn(2, 2, |i, j| if i == j { 0.0f64 } else { 3.0 });
        assert_eq!(determinant(swap, Par::Seq), -9.0);
        let singular = Mat::from_fn(3, 3, |i, _| i as f64);
        assert_eq!(determinant(singular, Par::Seq), 0.0);
    }

    #[test]
    fn cholesky_of_an_indefinite_matrix_is_nan() {
        let a = Mat::from_fn(2, 2, |i, j| if i == j { 1.0f64 } else { 2.0 });
        assert!(cholesky(a, Par::Seq)[(0, 0)].is_nan());
        let spd = Mat::from_fn(2, 2, |i, j| if i == j { 4.0 } else { 2.0 });
        let l = cholesky(spd.clone(), Par::Seq);
        assert!(max_diff((&l * l.transpose()).as_ref(), spd.as_ref()) < 1e-12);
    }
}
