//! The error function, the Lloyd–Max codebooks and the rotations.

use super::*;

#[test]
fn erf_matches_known_values() {
    let cases = [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (2.4, 0.999_311_486_103_354_9),
        (3.0, 0.999_977_909_503_001_4),
    ];
    for (x, e) in cases {
        assert!((erf(x) - e).abs() < 2e-15, "erf({x}) = {} vs {e}", erf(x));
        assert!((erf(-x) + e).abs() < 2e-15);
    }
    let tails = [
        (3.0, 2.209_049_699_858_544e-5),
        (5.0, 1.537_459_794_428_035e-12),
        (2.5, 4.069_520_174_449_59e-4),
    ];
    for (x, e) in tails {
        assert!(
            ((erfc(x) - e) / e).abs() < 1e-13,
            "erfc({x}) = {} vs {e}",
            erfc(x)
        );
    }
    assert_eq!(erf(0.0), 0.0);
}

#[test]
fn lloyd_max_matches_background_table() {
    let table: [(&[f64], &[f64], f64); 4] = [
        (&[0.797885], &[0.0], 0.363380),
        (&[0.452780, 1.510418], &[0.0, 0.981599], 0.117482),
        (
            &[0.245094, 0.756005, 1.343909, 2.151946],
            &[0.0, 0.500550, 1.049957, 1.747927],
            0.034548,
        ),
        (
            &[
                0.12839503, 0.38804830, 0.65675912, 0.94234046, 1.25623120, 1.61804639, 2.06901723,
                2.73258957,
            ],
            &[
                0.0, 0.258222, 0.522404, 0.799550, 1.099286, 1.437139, 1.843532, 2.400803,
            ],
            0.009501,
        ),
    ];
    for (i, (cents, bounds, mse)) in table.iter().enumerate() {
        let bits = i as u8 + 1;
        let cb = codebook(bits);
        let n = 1usize << bits;
        assert_eq!(cb.levels.len(), n);
        assert_eq!(cb.boundaries.len(), n - 1);
        assert!(cb.levels.windows(2).all(|w| w[0] < w[1]));
        assert!(cb.boundaries.windows(2).all(|w| w[0] < w[1]));
        for (k, c) in cents.iter().enumerate() {
            assert!(
                (cb.levels[n / 2 + k] - c).abs() < 1e-5,
                "{bits}b level {k}: {} vs {c}",
                cb.levels[n / 2 + k]
            );
            assert_eq!(cb.levels[n / 2 - 1 - k], -cb.levels[n / 2 + k]);
        }
        for (k, b) in bounds.iter().enumerate() {
            let got = cb.boundaries[n / 2 - 1 + k];
            assert!((got - b).abs() < 1e-5, "{bits}b boundary {k}: {got} vs {b}");
        }
        assert!(
            (cb.mse - mse).abs() < 1e-5,
            "{bits}b mse {} vs {mse}",
            cb.mse
        );
    }
    assert_eq!(codebook(0).levels, vec![0.0]);
}

#[test]
fn quantize_ties_go_up() {
    let cb = codebook(3);
    for (j, b) in cb.boundaries_f32().iter().enumerate() {
        assert_eq!(cb.quantize(*b as f64), j as u32 + 1);
        assert_eq!(cb.quantize(*b as f64 - 1e-9), j as u32);
    }
    assert_eq!(cb.quantize(0.0), 4);
}

// ----------------------------------------------------------------------------- rotations

/// Cl(3,0) geometric product of full multivectors. Component index = blade bitmask
/// (bit 0 = e1, bit 1 = e2, bit 2 = e3): [1, e1, e2, e12, e3, e13, e23, e123].
fn geometric_product(a: &[f64; 8], b: &[f64; 8]) -> [f64; 8] {
    fn reorder_sign(a: usize, b: usize) -> f64 {
        let mut a = a >> 1;
        let mut swaps = 0;
        while a != 0 {
            swaps += (a & b).count_ones();
            a >>= 1;
        }
        if swaps % 2 == 0 { 1.0 } else { -1.0 }
    }
    let mut out = [0.0; 8];
    for i in 0..8 {
        for j in 0..8 {
            out[i ^ j] += reorder_sign(i, j) * a[i] * b[j];
        }
    }
    out
}

#[test]
fn geometric_product_basics() {
    let e = |k: usize| {
        let mut v = [0.0; 8];
        v[k] = 1.0;
        v
    };
    // e1 e2 = e12, e2 e1 = -e12, e1 e1 = 1, e12 e12 = -1.
    assert_eq!(geometric_product(&e(1), &e(2)), e(3));
    assert_eq!(geometric_product(&e(2), &e(1)).map(|v| -v), e(3));
    assert_eq!(geometric_product(&e(1), &e(1)), e(0));
    assert_eq!(geometric_product(&e(3), &e(3)).map(|v| -v), e(0));
}

#[test]
fn rotor_matrix_equals_clifford_sandwich() {
    let mut g = GaussianStream::new(99);
    let mut h = GaussianStream::new(98);
    let extra: Vec<[f64; 4]> = (0..50)
        .map(|_| {
            let v = [
                h.next_gaussian(),
                h.next_gaussian(),
                h.next_gaussian(),
                h.next_gaussian(),
            ];
            let n = v.iter().map(|c| c * c).sum::<f64>().sqrt();
            v.map(|c| c / n)
        })
        .collect();
    for rotor in rotors(7, 96).into_iter().chain(extra) {
        let [s, b12, b13, b23] = rotor;
        // Blade bitmasks: e12 = 3, e13 = 5, e23 = 6.
        let mut r = [0.0; 8];
        r[0] = s;
        r[3] = b12;
        r[5] = b13;
        r[6] = b23;
        let mut rrev = r;
        for k in [3, 5, 6] {
            rrev[k] = -rrev[k];
        }
        let m = rotor_matrix(rotor);
        for _ in 0..4 {
            let v3 = [g.next_gaussian(), g.next_gaussian(), g.next_gaussian()];
            let mut v = [0.0; 8];
            v[1] = v3[0];
            v[2] = v3[1];
            v[4] = v3[2];
            let out = geometric_product(&geometric_product(&r, &v), &rrev);
            let mv = [
                m[0] * v3[0] + m[1] * v3[1] + m[2] * v3[2],
                m[3] * v3[0] + m[4] * v3[1] + m[5] * v3[2],
                m[6] * v3[0] + m[7] * v3[1] + m[8] * v3[2],
            ];
            for (k, idx) in [1usize, 2, 4].iter().enumerate() {
                assert!(
                    (out[*idx] - mv[k]).abs() < 1e-12,
                    "sandwich {out:?} vs matrix {mv:?}"
                );
            }
            for idx in [0usize, 3, 5, 6, 7] {
                assert!(
                    out[idx].abs() < 1e-12,
                    "sandwich left the vector grade: {out:?}"
                );
            }
        }
    }
}

fn assert_orthonormal(rows: usize, m: &[f64]) {
    for i in 0..rows {
        for j in 0..rows {
            let d: f64 = (0..rows).map(|k| m[i * rows + k] * m[j * rows + k]).sum();
            let e = if i == j { 1.0 } else { 0.0 };
            assert!((d - e).abs() < 1e-6, "not orthonormal: ({i},{j}) = {d}");
        }
    }
}

#[test]
fn rotor_and_iso_matrices_are_orthonormal() {
    for d in [64usize, 96, 128, 256] {
        let rm = rotor_matrices(3, d);
        assert_eq!(rm.len(), d.div_ceil(3));
        for m in &rm {
            assert_orthonormal(3, &m.map(f64::from));
            // A proper rotation: determinant +1.
            let m = m.map(f64::from);
            let det = m[0] * (m[4] * m[8] - m[5] * m[7]) - m[1] * (m[3] * m[8] - m[5] * m[6])
                + m[2] * (m[3] * m[7] - m[4] * m[6]);
            assert!((det - 1.0).abs() < 1e-6);
        }
        let im = iso_matrices(3, d);
        assert_eq!(im.len(), d / 4);
        for m in &im {
            assert_orthonormal(4, &m.map(f64::from));
        }
    }
}

#[test]
fn iso_matrix_is_hamilton_product() {
    let qs = iso_quaternions(11, 128);
    let ms = iso_matrices(11, 128);
    let mut g = GaussianStream::new(5);
    for (q, m) in qs.iter().zip(&ms) {
        let qd = q.map(f64::from);
        let v = [
            g.next_gaussian(),
            g.next_gaussian(),
            g.next_gaussian(),
            g.next_gaussian(),
        ];
        let h = hamilton(qd, v);
        let mut x = v.to_vec();
        iso_forward(std::slice::from_ref(m), &mut x);
        for k in 0..4 {
            assert!((h[k] - x[k]).abs() < 1e-12);
        }
        // Inverse = conj(q) ⊗ v'.
        let conj = [qd[0], -qd[1], -qd[2], -qd[3]];
        let back = hamilton(conj, h);
        let mut y = x.clone();
        iso_inverse(std::slice::from_ref(m), &mut y);
        for k in 0..4 {
            assert!((back[k] - y[k]).abs() < 1e-12);
            assert!((y[k] - v[k]).abs() < 1e-6);
        }
        assert!((qd.iter().map(|c| c * c).sum::<f64>() - 1.0).abs() < 1e-6);
    }
}

#[test]
fn hadamard_blocks_and_turbo_orthogonality() {
    assert_eq!(hadamard_blocks(96), vec![(0, 64), (64, 32)]);
    assert_eq!(hadamard_blocks(128), vec![(0, 128)]);
    assert_eq!(hadamard_blocks(224), vec![(0, 128), (128, 64), (192, 32)]);
    for d in [64usize, 96, 128, 256] {
        let signs = turbo_signs(1, d);
        assert!(signs.iter().all(|&s| s == 1.0 || s == -1.0));
        let plus = signs.iter().filter(|&&s| s > 0.0).count();
        assert!(plus > d / 4 && plus < 3 * d / 4);
        // Columns of the transform are orthonormal.
        let mut cols = Vec::new();
        for i in 0..d {
            let mut e = vec![0.0; d];
            e[i] = 1.0;
            turbo_forward(&signs, &mut e);
            cols.push(e);
        }
        for i in 0..d {
            for j in 0..d {
                let p = dot(&cols[i], &cols[j]);
                assert!((p - if i == j { 1.0 } else { 0.0 }).abs() < 1e-12);
            }
        }
        let mut g = GaussianStream::new(2);
        let x: Vec<f64> = (0..d).map(|_| g.next_gaussian()).collect();
        let mut y = x.clone();
        turbo_forward(&signs, &mut y);
        turbo_inverse(&signs, &mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-12);
        }
    }
}

#[test]
fn hadamard_matches_definition() {
    let mut x: Vec<f64> = (0..32).map(|i| (i as f64 * 0.37).sin()).collect();
    let orig = x.clone();
    fwht_orthonormal(&mut x);
    for (i, xi) in x.iter().enumerate() {
        let e: f64 = (0..32)
            .map(|j| {
                if (i & j).count_ones() % 2 == 0 {
                    orig[j]
                } else {
                    -orig[j]
                }
            })
            .sum::<f64>()
            / 32f64.sqrt();
        assert!((xi - e).abs() < 1e-12);
    }
}

#[test]
fn streams_are_deterministic_and_distinct() {
    assert_eq!(turbo_signs(42, 128), turbo_signs(42, 128));
    assert_ne!(turbo_signs(42, 128), turbo_signs(43, 128));
    assert_eq!(rotor_matrices(42, 128), rotor_matrices(42, 128));
    assert_eq!(qjl_matrix(42, 8, 16), qjl_matrix(42, 8, 16));
    // Known SplitMix64 output for seed 0 (reference implementation).
    let mut r = SplitMix64::new(0);
    assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
    // QJL matrix moments.
    let s = qjl_matrix(1, 128, 128);
    let mean = s.iter().map(|&v| v as f64).sum::<f64>() / s.len() as f64;
    let var = s.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / s.len() as f64;
    assert!(
        mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
        "mean {mean} var {var}"
    );
    // Prefix property: a smaller d draws a prefix of the same stream.
    assert_eq!(&rotor_matrices(9, 128)[..10], &rotor_matrices(9, 30)[..]);
}
