//! Lloyd–Max scalar quantizers for the standard normal distribution N(0, 1).
//!
//! The codebooks are *computed* here by Lloyd iteration in `f64` (boundaries = midpoints of
//! neighbouring levels, levels = conditional means of their bins), with the bin masses and
//! moments taken in closed form from the normal pdf and an `erf`/`erfc` implemented in this
//! file (accurate to about 1e-15). The tests (`src/codec/tests/math.rs`) check the result, to
//! 1e-5, against a table of the Gaussian Lloyd–Max levels, boundaries and MSE for 1–4 bits
//! (the quantizer of S. P. Lloyd, "Least squares quantization in PCM", IEEE Trans. Inf.
//! Theory, 1982, and J. Max, "Quantizing for minimum distortion", IRE Trans. Inf. Theory,
//! 1960, which tabulates it for the Gaussian), the scalar quantizer TurboQuant (Zandieh et al.,
//! 2025, arXiv 2504.19874) applies to each rotated coordinate.
//!
//! The rotated codecs scale each coordinate by the row's stored scale `s` and quantize
//! `y / s` against these boundaries. The CPU reference and the GPU both use the values
//! rounded to `f32` ([`Codebook::levels_f32`], [`Codebook::boundaries_f32`]), so they compare
//! against exactly the same thresholds.

use std::sync::OnceLock;

/// A Lloyd–Max quantizer for N(0, 1).
#[derive(Clone, Debug, PartialEq)]
pub struct Codebook {
    /// Bits per code; the codebook has `2^bits` levels.
    pub bits: u8,
    /// Reconstruction levels, ascending (`2^bits` values, antisymmetric about 0). Code `k`
    /// reconstructs to `levels[k]`; codes below `2^(bits-1)` are the negative levels.
    pub levels: Vec<f64>,
    /// Decision boundaries, ascending (`2^bits - 1` values; the middle one is exactly 0).
    /// A value `t` gets the code `#{j : boundaries[j] <= t}` (a value exactly on a boundary
    /// goes to the upper bin).
    pub boundaries: Vec<f64>,
    /// Mean squared error `E[(X - Q(X))^2]` for `X ~ N(0, 1)`.
    pub mse: f64,
}

impl Codebook {
    /// The levels rounded to `f32`: the values the GPU gets and the CPU reference uses.
    pub fn levels_f32(&self) -> Vec<f32> {
        self.levels.iter().map(|&v| v as f32).collect()
    }

    /// The boundaries rounded to `f32`: the values the GPU gets and the CPU reference uses.
    pub fn boundaries_f32(&self) -> Vec<f32> {
        self.boundaries.iter().map(|&v| v as f32).collect()
    }

    /// The code of `t` (in units of the standard deviation) against the `f32`-rounded
    /// boundaries: the number of boundaries `<= t`.
    pub fn quantize(&self, t: f64) -> u32 {
        self.boundaries.partition_point(|&b| (b as f32 as f64) <= t) as u32
    }
}

/// Largest number of bits [`codebook`] serves.
pub const MAX_BITS: u8 = 4;

/// The Lloyd–Max codebook for N(0, 1) with `bits` bits (0..=4), computed once and cached.
///
/// `bits == 0` is the degenerate one-level quantizer (level 0, MSE 1), used by the QJL-only
/// quality configuration (`turbo0+qjl`).
///
/// # Panics
/// If `bits > 4` (no codec uses more than 4 bits per rotated code).
pub fn codebook(bits: u8) -> &'static Codebook {
    static BOOKS: [OnceLock<Codebook>; MAX_BITS as usize + 1] =
        [const { OnceLock::new() }; MAX_BITS as usize + 1];
    assert!(
        bits <= MAX_BITS,
        "Lloyd–Max codebooks exist for 0..=4 bits, not {bits}"
    );
    BOOKS[bits as usize].get_or_init(|| lloyd_max(bits))
}

/// The edges of bin `i` given the `n - 1` inner boundaries (outer bins are unbounded).
fn bin_edges(boundaries: &[f64], i: usize) -> (f64, f64) {
    let a = if i == 0 {
        f64::NEG_INFINITY
    } else {
        boundaries[i - 1]
    };
    let b = if i == boundaries.len() {
        f64::INFINITY
    } else {
        boundaries[i]
    };
    (a, b)
}

/// Runs Lloyd iteration for N(0, 1) with `2^bits` levels until the levels move by less than
/// 1e-15 (or 200 000 iterations pass).
pub fn lloyd_max(bits: u8) -> Codebook {
    let n = 1usize << bits;
    if n == 1 {
        return Codebook {
            bits,
            levels: vec![0.0],
            boundaries: vec![],
            mse: 1.0,
        };
    }
    // Start from evenly spaced levels on [-2, 2]; the Gaussian is log-concave, so Lloyd
    // iteration converges to the unique optimum from any start.
    let mut levels: Vec<f64> = (0..n)
        .map(|i| -2.0 + 4.0 * (i as f64 + 0.5) / n as f64)
        .collect();
    let mut boundaries = vec![0.0; n - 1];
    for _ in 0..200_000 {
        for j in 0..n - 1 {
            boundaries[j] = 0.5 * (levels[j] + levels[j + 1]);
        }
        let mut delta: f64 = 0.0;
        for (i, level) in levels.iter_mut().enumerate() {
            let (a, b) = bin_edges(&boundaries, i);
            let c = bin_first_moment(a, b) / bin_mass(a, b);
            delta = delta.max((c - *level).abs());
            *level = c;
        }
        if delta < 1e-15 {
            break;
        }
    }
    // Enforce exact antisymmetry (the iteration keeps it up to rounding).
    for i in 0..n / 2 {
        let v = 0.5 * (levels[n - 1 - i] - levels[i]);
        levels[i] = -v;
        levels[n - 1 - i] = v;
    }
    for j in 0..n - 1 {
        boundaries[j] = 0.5 * (levels[j] + levels[j + 1]);
    }
    boundaries[n / 2 - 1] = 0.0;
    let mut mse = 0.0;
    for (i, &c) in levels.iter().enumerate() {
        let (a, b) = bin_edges(&boundaries, i);
        mse += bin_second_moment(a, b) - 2.0 * c * bin_first_moment(a, b) + c * c * bin_mass(a, b);
    }
    Codebook {
        bits,
        levels,
        boundaries,
        mse,
    }
}

const SQRT_PI: f64 = 1.772_453_850_905_516;
const SQRT_2: f64 = std::f64::consts::SQRT_2;

/// The standard normal pdf φ(x) (0 at ±∞).
pub fn normal_pdf(x: f64) -> f64 {
    if x.is_infinite() {
        0.0
    } else {
        (-0.5 * x * x).exp() / (SQRT_2 * SQRT_PI)
    }
}

/// The standard normal cdf Φ(x) = erfc(−x/√2)/2.
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x / SQRT_2)
}

/// P(a <= X < b) for X ~ N(0, 1), computed from the tail that avoids cancellation.
fn bin_mass(a: f64, b: f64) -> f64 {
    if a >= 0.0 {
        // Upper tail: Q(a) - Q(b) with Q(x) = erfc(x/√2)/2.
        0.5 * (erfc(a / SQRT_2) - erfc(b / SQRT_2))
    } else {
        normal_cdf(b) - normal_cdf(a)
    }
}

/// ∫_a^b x φ(x) dx = φ(a) − φ(b).
fn bin_first_moment(a: f64, b: f64) -> f64 {
    normal_pdf(a) - normal_pdf(b)
}

/// ∫_a^b x² φ(x) dx = P(a, b) + a φ(a) − b φ(b).
fn bin_second_moment(a: f64, b: f64) -> f64 {
    let term = |x: f64| {
        if x.is_infinite() {
            0.0
        } else {
            x * normal_pdf(x)
        }
    };
    bin_mass(a, b) + term(a) - term(b)
}

/// The error function, accurate to about 1e-15 (absolute).
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 0.0 {
        return -erf(-x);
    }
    if x < 2.5 {
        erf_series(x)
    } else {
        1.0 - erfc_cf(x)
    }
}

/// The complementary error function 1 − erf(x), accurate to about 1e-15 (absolute) and,
/// for x ≥ 2.5, to about 1e-15 relative.
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 0.0 {
        return 2.0 - erfc(-x);
    }
    if x < 2.5 {
        1.0 - erf_series(x)
    } else {
        erfc_cf(x)
    }
}

/// erf(x) = 2/√π · e^{−x²} · Σ_{n≥0} 2^n x^{2n+1} / (2n+1)!!  (all terms positive, x ≥ 0).
fn erf_series(x: f64) -> f64 {
    let x2 = x * x;
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0;
    loop {
        n += 1.0;
        term *= 2.0 * x2 / (2.0 * n + 1.0);
        sum += term;
        if term <= 1e-17 * sum {
            break;
        }
    }
    2.0 / SQRT_PI * (-x2).exp() * sum
}

/// erfc(x) = e^{−x²}/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + …)))) by the modified Lentz
/// algorithm (x ≥ 2.5 here, where it converges quickly).
fn erfc_cf(x: f64) -> f64 {
    if x.is_infinite() {
        return 0.0;
    }
    let tiny = 1e-300;
    let mut f = x;
    let mut c = x;
    let mut d = 0.0;
    for n in 1..1000 {
        let a = n as f64 * 0.5;
        d = x + a * d;
        if d.abs() < tiny {
            d = tiny;
        }
        c = x + a / c;
        if c.abs() < tiny {
            c = tiny;
        }
        d = 1.0 / d;
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    (-x * x).exp() / (SQRT_PI * f)
}
