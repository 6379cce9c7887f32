//! Distortion and the QJL estimator against the published figures.

use super::*;

fn d_mse(codec: Codec, d: u32, samples: usize, seed: u64) -> f64 {
    let r = CodecRef::new(codec, d, seed).unwrap();
    let mut g = GaussianStream::new(seed ^ 0xABCD);
    let mut total = 0.0;
    for _ in 0..samples {
        let u = unit_gaussian(&mut g, d as usize);
        let row = r.encode(&to_f32(&u));
        let uh = r.decode(&row);
        total += u
            .iter()
            .zip(&uh)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f64>();
    }
    total / samples as f64
}

const MSE_TARGETS: [f64; 4] = [0.360, 0.115, 0.0337, 0.0092];

fn check_mse(kind: fn(u8) -> Codec) {
    for bits in 1..=4u8 {
        let c = kind(bits);
        let m = d_mse(c, 128, 1500, 77 + bits as u64);
        let t = MSE_TARGETS[bits as usize - 1];
        eprintln!(
            "{}: D_mse {m:.5} vs target {t} ({:+.2}%)",
            c.name(),
            100.0 * (m / t - 1.0)
        );
        assert!(
            (m / t - 1.0).abs() < 0.03,
            "{}: D_mse {m:.5} vs target {t} ({:+.1}%)",
            c.name(),
            100.0 * (m / t - 1.0)
        );
    }
}

#[test]
fn quality_turbo_d_mse() {
    check_mse(Codec::turbo);
}

#[test]
fn quality_rotor_d_mse() {
    check_mse(Codec::rotor);
}

#[test]
fn quality_iso_d_mse() {
    check_mse(Codec::iso);
}

/// QJL estimator statistics for `total_bits` bits ((total_bits − 1)-bit turbo MSE stage +
/// 1-bit QJL) at D = 128 over `seeds` QJL matrices with `per_seed` (x, q) pairs each:
/// (mean error, D·E[(est − true)²], D·E[predicted variance]) where the prediction is the
/// per-sample formula ((π/2)||q||²||x − x̂||² − <q, x − x̂>²)/m.
///
/// The target is an expectation over S too, and one fixed S moves the result by about 2.6%
/// (standard deviation across seeds at 3+1 bits), so several S are averaged.
fn qjl_stats(total_bits: u8, seeds: u64, per_seed: usize) -> (f64, f64, f64) {
    let d = 128usize;
    let c = Codec::turbo(total_bits - 1).with_qjl(true);
    let mut g = GaussianStream::new(5);
    let (mut sum, mut sum2, mut pred) = (0.0, 0.0, 0.0);
    for seed in 0..seeds {
        let r = CodecRef::new(c, d as u32, 5000 + seed).unwrap();
        for _ in 0..per_seed {
            let x = unit_gaussian(&mut g, d);
            let q = unit_gaussian(&mut g, d);
            let row = r.encode(&to_f32(&x));
            let err = r.ip_estimate(&row, &q) - dot(&q, &x);
            let res: Vec<f64> = x.iter().zip(r.decode(&row)).map(|(a, b)| a - b).collect();
            sum += err;
            sum2 += err * err;
            pred +=
                (std::f64::consts::FRAC_PI_2 * dot(&res, &res) - dot(&q, &res).powi(2)) / d as f64;
        }
    }
    let n = (seeds as usize * per_seed) as f64;
    (sum / n, d as f64 * sum2 / n, d as f64 * pred / n)
}

const QJL_TARGETS: [f64; 4] = [1.53, 0.567, 0.180, 0.051];

fn check_qjl(total_bits: u8, seeds: u64, per_seed: usize) {
    let (mean, dvar, pred) = qjl_stats(total_bits, seeds, per_seed);
    let t = QJL_TARGETS[total_bits as usize - 1];
    eprintln!(
        "{total_bits} bits: mean err {mean:+.5}, D·E[err²] {dvar:.5} vs {t} ({:+.2}%), formula {pred:.5}",
        100.0 * (dvar / t - 1.0)
    );
    assert!(mean.abs() < 0.005, "{total_bits} bits: mean error {mean}");
    // The estimator matches its own variance formula on the actual residuals.
    assert!(
        (dvar / pred - 1.0).abs() < 0.03,
        "{total_bits} bits: {dvar:.5} vs formula {pred:.5}"
    );
    assert!(
        (dvar / t - 1.0).abs() < 0.05,
        "{total_bits} bits: D·E[err²] {dvar:.4} vs {t} ({:+.1}%)",
        100.0 * (dvar / t - 1.0)
    );
}

#[test]
fn quality_qjl_1_to_3_bits() {
    for b in 1..=3 {
        check_qjl(b, 16, 2500);
    }
}

/// 4 bits (3-bit MSE stage + QJL): the expectation sits at about +4.4% of the 0.051 target
/// (48 x 4000 samples: 0.05327 ± 0.0002; the formula on the same residuals gives 0.05313),
/// because the target presumes a 3-bit stage with D_mse ≈ 0.0326 while the Gaussian
/// Lloyd–Max stage gives 0.0340 at D = 128 (0.03398 by numerical integration of the
/// Beta law; the 3-bit D_mse target QUALITY.md states is 0.0337). Measured on many S to keep the
/// sampling error (about ±0.4%) well inside the ±5% window.
#[test]
fn quality_qjl_4_bits() {
    check_qjl(4, 48, 4000);
}
