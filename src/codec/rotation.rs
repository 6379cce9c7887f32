//! Deterministic rotations (and the QJL matrix) generated from a `u64` seed.
//!
//! # Random streams (the exact recipe)
//! Every array here comes from a [`SplitMix64`] generator started at `seed ^ STREAM_*`, one
//! stream per use ([`STREAM_TURBO`], [`STREAM_ROTOR`], [`STREAM_ISO`], [`STREAM_QJL`]), so
//! the turbo signs, rotors, quaternions and QJL matrix of one seed are independent.
//!
//! * `SplitMix64::next_u64`: `state += 0x9E3779B97F4A7C15; z = state;
//!   z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
//!   z ^ (z >> 31)` (wrapping arithmetic).
//! * Uniform in (0, 1]: `((next_u64() >> 11) + 1) * 2^-53`.
//! * Gaussians ([`GaussianStream`]), Box–Muller in pairs: draw `u1` then `u2` uniform,
//!   `r = sqrt(-2 ln u1)`, emit `r cos(2π u2)` first and `r sin(2π u2)` second.
//! * Turbo signs: element `i` is `-1` when the top bit of the `i`-th `next_u64()` is set,
//!   else `+1`.
//! * Rotor groups: 4 Gaussians per group in the order `(s, b12, b13, b23)`, normalized in f64.
//! * Iso groups: 4 Gaussians per group in the order `(w, x, y, z)`, normalized in f64.
//! * QJL: `m * d` Gaussians, row-major (`S[j][i]` is draw `j * d + i`).
//!
//! The arrays are rounded to `f32` (what the GPU gets); the CPU reference converts those
//! `f32` values back to `f64` and rotates with exactly them. The GPU side calls these
//! functions and uploads the results rather than re-deriving them; for iso it uploads the
//! quaternions and builds `L(q)` from them, whose entries are exactly theirs with signs.

/// Stream selector xor-ed into the seed for the turbo signs.
pub const STREAM_TURBO: u64 = 0x5455_5242_4f00_0001;
/// Stream selector xor-ed into the seed for the rotor rotors.
pub const STREAM_ROTOR: u64 = 0x524f_544f_5200_0002;
/// Stream selector xor-ed into the seed for the iso quaternions.
pub const STREAM_ISO: u64 = 0x4953_4f00_0000_0003;
/// Stream selector xor-ed into the seed for the QJL matrix.
pub const STREAM_QJL: u64 = 0x514a_4c00_0000_0004;

/// The SplitMix64 generator (Steele, Lea, Flood 2014).
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose state starts at `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform value in (0, 1]: `((next_u64() >> 11) + 1) * 2^-53`.
    pub fn next_f64(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Standard normal draws by Box–Muller over a [`SplitMix64`] stream (see the module docs).
#[derive(Clone, Debug)]
pub struct GaussianStream {
    rng: SplitMix64,
    spare: Option<f64>,
}

impl GaussianStream {
    /// A Gaussian stream over `SplitMix64::new(seed)`.
    pub fn new(seed: u64) -> Self {
        GaussianStream {
            rng: SplitMix64::new(seed),
            spare: None,
        }
    }

    /// The next N(0, 1) draw.
    pub fn next_gaussian(&mut self) -> f64 {
        if let Some(v) = self.spare.take() {
            return v;
        }
        let u1 = self.rng.next_f64();
        let u2 = self.rng.next_f64();
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (2.0 * std::f64::consts::PI * u2).sin_cos();
        self.spare = Some(r * s);
        r * c
    }
}

// ---------------------------------------------------------------------------------------
// Turbo: randomized Hadamard transform.
// ---------------------------------------------------------------------------------------

/// The turbo codec's random signs (`+1.0` / `-1.0`, length `d`).
pub fn turbo_signs(seed: u64, d: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed ^ STREAM_TURBO);
    (0..d)
        .map(|_| if rng.next_u64() >> 63 == 1 { -1.0 } else { 1.0 })
        .collect()
}

/// The Walsh–Hadamard blocks `(start, len)` of the binary decomposition of `d`, largest
/// first (`96 -> [(0, 64), (64, 32)]`, `128 -> [(0, 128)]`).
pub fn hadamard_blocks(d: usize) -> Vec<(usize, usize)> {
    let mut blocks = Vec::new();
    let mut start = 0;
    for bit in (0..usize::BITS).rev() {
        let len = 1usize << bit;
        if d & len != 0 {
            blocks.push((start, len));
            start += len;
        }
    }
    blocks
}

/// In-place orthonormal Walsh–Hadamard transform (Sylvester / natural order:
/// `H[i][j] = (-1)^popcount(i & j) / sqrt(len)`); `x.len()` must be a power of two. It is
/// its own inverse.
pub fn fwht_orthonormal(x: &mut [f64]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let mut h = 1;
    while h < n {
        for i in (0..n).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (x[j], x[j + h]);
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
        h *= 2;
    }
    let norm = 1.0 / (n as f64).sqrt();
    for v in x.iter_mut() {
        *v *= norm;
    }
}

/// Turbo forward rotation in place: `x_i *= signs_i`, then [`fwht_orthonormal`] on every
/// block of [`hadamard_blocks`].
pub fn turbo_forward(signs: &[f32], x: &mut [f64]) {
    for (v, &s) in x.iter_mut().zip(signs) {
        *v *= s as f64;
    }
    for (start, len) in hadamard_blocks(x.len()) {
        fwht_orthonormal(&mut x[start..start + len]);
    }
}

/// Turbo inverse rotation in place (the transpose of [`turbo_forward`]).
pub fn turbo_inverse(signs: &[f32], y: &mut [f64]) {
    for (start, len) in hadamard_blocks(y.len()) {
        fwht_orthonormal(&mut y[start..start + len]);
    }
    for (v, &s) in y.iter_mut().zip(signs) {
        *v *= s as f64;
    }
}

// ---------------------------------------------------------------------------------------
// Rotor: per-group Cl(3,0) rotors, applied as 3x3 matrices.
// ---------------------------------------------------------------------------------------

/// The unit rotors `(s, b12, b13, b23)` (f64, before rounding) of the `ceil(d/3)` groups.
pub fn rotors(seed: u64, d: usize) -> Vec<[f64; 4]> {
    let mut g = GaussianStream::new(seed ^ STREAM_ROTOR);
    (0..d.div_ceil(3))
        .map(|_| normalized4(draw4(&mut g)))
        .collect()
}

/// The rotation matrix (row-major) of the sandwich `v -> R v R~` for the unit rotor
/// `R = s + b12 e12 + b13 e13 + b23 e23`: the matrix of the quaternion
/// `(w, x, y, z) = (s, -b23, b13, -b12)`.
pub fn rotor_matrix(rotor: [f64; 4]) -> [f64; 9] {
    let [s, b12, b13, b23] = rotor;
    let (w, x, y, z) = (s, -b23, b13, -b12);
    [
        1.0 - 2.0 * (y * y + z * z),
        2.0 * (x * y - w * z),
        2.0 * (x * z + w * y),
        2.0 * (x * y + w * z),
        1.0 - 2.0 * (x * x + z * z),
        2.0 * (y * z - w * x),
        2.0 * (x * z - w * y),
        2.0 * (y * z + w * x),
        1.0 - 2.0 * (x * x + y * y),
    ]
}

/// The rotor codec's per-group 3x3 matrices (row-major, `f32`), one per group of 3
/// coordinates (`ceil(d/3)` groups; the input is zero-padded to `3 * ceil(d/3)`).
/// Forward `y = M v`, inverse `v = M^T y`.
pub fn rotor_matrices(seed: u64, d: usize) -> Vec<[f32; 9]> {
    rotors(seed, d)
        .into_iter()
        .map(|r| rotor_matrix(r).map(|v| v as f32))
        .collect()
}

/// Rotor forward rotation in place on a padded vector (`x.len() == 3 * mats.len()`).
pub fn rotor_forward(mats: &[[f32; 9]], x: &mut [f64]) {
    for (m, v) in mats.iter().zip(x.chunks_exact_mut(3)) {
        let m = m.map(|c| c as f64);
        let (a, b, c) = (v[0], v[1], v[2]);
        v[0] = m[0] * a + m[1] * b + m[2] * c;
        v[1] = m[3] * a + m[4] * b + m[5] * c;
        v[2] = m[6] * a + m[7] * b + m[8] * c;
    }
}

/// Rotor inverse rotation in place (the transpose of every group's matrix).
pub fn rotor_inverse(mats: &[[f32; 9]], y: &mut [f64]) {
    for (m, v) in mats.iter().zip(y.chunks_exact_mut(3)) {
        let m = m.map(|c| c as f64);
        let (a, b, c) = (v[0], v[1], v[2]);
        v[0] = m[0] * a + m[3] * b + m[6] * c;
        v[1] = m[1] * a + m[4] * b + m[7] * c;
        v[2] = m[2] * a + m[5] * b + m[8] * c;
    }
}

// ---------------------------------------------------------------------------------------
// Iso: per-group unit quaternions, left multiplication.
// ---------------------------------------------------------------------------------------

/// The Hamilton product `a ⊗ b` of quaternions `(w, x, y, z)`.
pub fn hamilton(a: [f64; 4], b: [f64; 4]) -> [f64; 4] {
    let [aw, ax, ay, az] = a;
    let [bw, bx, by, bz] = b;
    [
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    ]
}

/// The iso codec's per-group unit quaternions `(w, x, y, z)` (`d / 4` groups, `f32`).
pub fn iso_quaternions(seed: u64, d: usize) -> Vec<[f32; 4]> {
    let mut g = GaussianStream::new(seed ^ STREAM_ISO);
    (0..d / 4)
        .map(|_| normalized4(draw4(&mut g)).map(|v| v as f32))
        .collect()
}

/// The row-major 4x4 matrix `L(q)` with `L(q) v = q ⊗ v` (`v` as the quaternion
/// `(w, x, y, z)` of 4 consecutive coordinates). Its transpose is `L(conj q)`.
pub fn quat_left_matrix(q: [f32; 4]) -> [f32; 16] {
    let [w, x, y, z] = q;
    [w, -x, -y, -z, x, w, -z, y, y, z, w, -x, z, -y, x, w]
}

/// The iso codec's per-group left-multiplication matrices (row-major `f32`, built from the
/// `f32` quaternions of [`iso_quaternions`], so they hold exactly those values with signs).
pub fn iso_matrices(seed: u64, d: usize) -> Vec<[f32; 16]> {
    iso_quaternions(seed, d)
        .into_iter()
        .map(quat_left_matrix)
        .collect()
}

/// Iso forward rotation in place: `v' = M v` per group of 4 (`x.len() == 4 * mats.len()`).
pub fn iso_forward(mats: &[[f32; 16]], x: &mut [f64]) {
    for (m, v) in mats.iter().zip(x.chunks_exact_mut(4)) {
        let a = [v[0], v[1], v[2], v[3]];
        for (r, out) in v.iter_mut().enumerate() {
            *out = (0..4).map(|c| m[4 * r + c] as f64 * a[c]).sum();
        }
    }
}

/// Iso inverse rotation in place: `v = M^T v'` per group of 4 (that is `conj(q) ⊗ v'`).
pub fn iso_inverse(mats: &[[f32; 16]], y: &mut [f64]) {
    for (m, v) in mats.iter().zip(y.chunks_exact_mut(4)) {
        let a = [v[0], v[1], v[2], v[3]];
        for (r, out) in v.iter_mut().enumerate() {
            *out = (0..4).map(|c| m[4 * c + r] as f64 * a[c]).sum();
        }
    }
}

// ---------------------------------------------------------------------------------------
// QJL sketch matrix.
// ---------------------------------------------------------------------------------------

/// The QJL sketch matrix `S`: `m x d`, row-major, i.i.d. N(0, 1) (`f32`).
pub fn qjl_matrix(seed: u64, m: usize, d: usize) -> Vec<f32> {
    let mut g = GaussianStream::new(seed ^ STREAM_QJL);
    (0..m * d).map(|_| g.next_gaussian() as f32).collect()
}

/// Four Gaussians in stream order (array elements are evaluated left to right).
fn draw4(g: &mut GaussianStream) -> [f64; 4] {
    [
        g.next_gaussian(),
        g.next_gaussian(),
        g.next_gaussian(),
        g.next_gaussian(),
    ]
}

fn normalized4(v: [f64; 4]) -> [f64; 4] {
    let n = v.iter().map(|c| c * c).sum::<f64>().sqrt();
    if n == 0.0 {
        [1.0, 0.0, 0.0, 0.0]
    } else {
        v.map(|c| c / n)
    }
}
