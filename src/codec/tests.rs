//! Unit tests of the codec names, layouts, codebooks, rotations and reference codec.

use super::lloyd::{codebook, erf, erfc};
use super::rotation::*;
use super::*;

const DIMS: [u32; 4] = [64, 96, 128, 256];

fn all_codecs() -> Vec<Codec> {
    Codec::valid_names()
        .iter()
        .map(|n| Codec::parse(n).unwrap())
        .collect()
}

fn unit_gaussian(g: &mut GaussianStream, d: usize) -> Vec<f64> {
    loop {
        let v: Vec<f64> = (0..d).map(|_| g.next_gaussian()).collect();
        let n = norm(&v);
        if n > 0.0 {
            return v.iter().map(|x| x / n).collect();
        }
    }
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

// ----------------------------------------------------------------------------- erf / lloyd

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

// ----------------------------------------------------------------------------- names

#[test]
fn codec_names_round_trip() {
    for c in all_codecs() {
        assert_eq!(Codec::parse(&c.name()).unwrap(), c);
    }
    assert_eq!(Codec::parse("turbo3").unwrap(), Codec::turbo(3));
    assert_eq!(
        Codec::parse("iso3b").unwrap(),
        Codec::iso(3).with_scale(ScaleMode::Block32)
    );
    assert_eq!(
        Codec::parse("rotor3+qjl").unwrap(),
        Codec::rotor(3).with_qjl(true)
    );
    for bad in [
        "",
        "q3",
        "turbo5",
        "turbo",
        "turbo33",
        "iso3bb",
        "none+qjl",
        "q8+qjl",
        "turbo0",
        "rotor3+QJL",
        "3",
    ] {
        assert!(
            matches!(Codec::parse(bad), Err(KvqError::UnknownCodec { .. })),
            "{bad}"
        );
    }
}

#[test]
fn cache_names_parse_and_round_trip() {
    let p = |s: &str| KvCodecs::parse(s).unwrap();
    assert_eq!(p("none"), KvCodecs::NONE);
    assert_eq!(
        p("k_iso3"),
        KvCodecs {
            k: Codec::iso(3),
            v: Codec::NONE
        }
    );
    assert_eq!(
        p("k_rotor4"),
        KvCodecs {
            k: Codec::rotor(4),
            v: Codec::NONE
        }
    );
    assert_eq!(
        p("k_turbo3+qjl"),
        KvCodecs {
            k: Codec::turbo(3).with_qjl(true),
            v: Codec::NONE
        }
    );
    assert_eq!(
        p("rotor3_sym"),
        KvCodecs {
            k: Codec::rotor(3),
            v: Codec::rotor(3)
        }
    );
    assert_eq!(
        p("turbo3+qjl_sym"),
        KvCodecs {
            k: Codec::turbo(3).with_qjl(true),
            v: Codec::turbo(3)
        }
    );
    assert_eq!(
        p("q8_sym"),
        KvCodecs {
            k: Codec::Q8,
            v: Codec::Q8
        }
    );
    assert_eq!(
        p("k=iso3, v=q8"),
        KvCodecs {
            k: Codec::iso(3),
            v: Codec::Q8
        }
    );
    assert_eq!(
        p("v=q4,k=turbo4"),
        KvCodecs {
            k: Codec::turbo(4),
            v: Codec::Q4
        }
    );
    for n in KvCodecs::valid_names().iter().chain(&KvCodecs::all_names()) {
        let kv = p(n);
        assert_eq!(p(&kv.name()), kv, "{n}");
        assert_eq!(&kv.name(), n);
        for d in DIMS {
            kv.check_head_dim(d).unwrap();
        }
    }
    let general = p("k=q4,v=iso3");
    assert_eq!(general.name(), "k=q4,v=iso3");
    assert_eq!(p("k=none,v=turbo2").name(), "k=none,v=turbo2");
    let all = KvCodecs::all_names();
    assert_eq!(all.len(), 20);
    assert!(all.contains(&"k_turbo3+qjl".to_string()) && all.contains(&"iso4_sym".to_string()));
    for bad in [
        "",
        "k_none",
        "none_sym",
        "iso3",
        "k_iso5",
        "q8sym",
        "k=iso3",
        "k=iso3,v=iso3,v=q8",
        "x=iso3,v=q8",
        "k_",
    ] {
        match KvCodecs::parse(bad) {
            Err(KvqError::UnknownCodec { name, valid }) => {
                assert_eq!(name, bad);
                assert!(
                    valid.contains("k_iso3") && valid.contains("turbo3+qjl"),
                    "{valid}"
                );
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert!(matches!(
        KvCodecs::parse("k=iso3,v=iso3+qjl"),
        Err(KvqError::InvalidSpec(_))
    ));
}

// ----------------------------------------------------------------------------- layouts

#[test]
fn layouts_at_128_match_the_contract() {
    let words = |n: &str| Codec::parse(n).unwrap().row_words(128);
    assert_eq!(words("none"), 64);
    assert_eq!(words("q8"), 34);
    assert_eq!(words("q4"), 18);
    assert_eq!(words("turbo3"), 13);
    assert_eq!(words("iso3"), 13);
    assert_eq!(words("rotor3"), 13);
    assert_eq!(words("iso3b"), 14);
    assert_eq!(words("rotor3b"), 15);
    assert_eq!(words("turbo3+qjl"), 18);
    assert_eq!(Codec::Q8.bits_per_value(128), 8.5);
    assert_eq!(Codec::Q4.bits_per_value(128), 4.5);
    assert_eq!(Codec::turbo(3).bits_per_value(128), 3.25);
    assert!(Codec::rotor(3).bits_per_value(128) <= 3.5);
    let r = Codec::rotor(3).layout(128).unwrap();
    assert_eq!(
        (r.n_codes, r.side_offset_bits, r.n_side, r.used_bits()),
        (129, 400, 1, 416)
    );
    let q = Codec::turbo(3).with_qjl(true).layout(128).unwrap();
    assert_eq!(q.qjl_offset_bits, Some(416));
    assert_eq!(
        (q.qjl_bits, q.qjl_norm_offset_bits, q.used_bits()),
        (128, 544, 560)
    );
    let s = Codec::Q8.layout(128).unwrap();
    assert_eq!(
        (
            s.n_codes,
            s.code_bits,
            s.side_offset_bits,
            s.n_side,
            s.side_block
        ),
        (128, 8, 1024, 4, 32)
    );
}

#[test]
fn layouts_at_every_dim() {
    for c in all_codecs() {
        for d in DIMS {
            let l = c
                .layout(d)
                .unwrap_or_else(|e| panic!("{} at {d}: {e}", c.name()));
            let n_codes = if c.kind == CodecKind::Rotor {
                3 * d.div_ceil(3)
            } else {
                d
            };
            assert_eq!(l.n_codes, n_codes);
            assert_eq!(l.code_bits, c.bits as u32);
            assert_eq!(
                l.side_offset_bits,
                (n_codes * l.code_bits).div_ceil(16) * 16
            );
            let n_side = match (c.kind, c.scale) {
                (CodecKind::None, _) => 0,
                (CodecKind::Sym, _) | (_, ScaleMode::Block32) => n_codes.div_ceil(32),
                _ => 1,
            };
            assert_eq!(l.n_side, n_side);
            let side_end = l.side_offset_bits + 16 * n_side;
            if c.qjl {
                let off = side_end.div_ceil(32) * 32;
                assert_eq!(l.qjl_offset_bits, Some(off));
                assert_eq!(l.qjl_bits, d);
                assert_eq!(l.qjl_norm_offset_bits, (off + d).div_ceil(16) * 16);
            } else {
                assert_eq!(l.qjl_offset_bits, None);
            }
            assert_eq!(l.words, l.used_bits().div_ceil(32));
            assert_eq!(c.row_words(d), l.words);
            assert_eq!(c.bits_per_value(d), l.words as f64 * 32.0 / d as f64);
        }
    }
}

#[test]
fn unsupported_dims_are_typed_errors() {
    let e = |c: Codec, d| matches!(c.layout(d), Err(KvqError::UnsupportedHeadDim { .. }));
    assert!(e(Codec::Q8, 40));
    assert!(e(Codec::turbo(3), 80));
    assert!(!e(Codec::iso(3), 40) && !e(Codec::rotor(3), 40));
    assert!(e(Codec::iso(3), 42) && e(Codec::NONE, 512) && e(Codec::rotor(3), 0));
    let bogus = Codec {
        kind: CodecKind::Sym,
        bits: 3,
        qjl: false,
        scale: ScaleMode::Block32,
    };
    assert!(matches!(bogus.layout(128), Err(KvqError::InvalidSpec(_))));
}

// ----------------------------------------------------------------------------- bits + codecs

#[test]
fn bit_helpers_round_trip_across_words() {
    let mut row = vec![0u32; 8];
    let mut expect = Vec::new();
    let mut off = 0;
    let mut rng = SplitMix64::new(3);
    for b in [3u32, 5, 1, 16, 7, 32, 2, 13, 4, 31, 9] {
        let v = (rng.next_u64() as u32) & if b == 32 { u32::MAX } else { (1 << b) - 1 };
        put_bits(&mut row, off, b, v);
        expect.push((off, b, v));
        off += b;
    }
    for (o, b, v) in &expect {
        assert_eq!(get_bits(&row, *o, *b), *v);
    }
    // Overwrite clears old bits; row bit k is bit k % 32 of word k / 32.
    let mut r2 = vec![u32::MAX; 2];
    put_bits(&mut r2, 30, 4, 0b0101);
    assert_eq!(r2, vec![0x7FFF_FFFF, 0xFFFF_FFFD]);
    let r3 = [0x0000_0001u32, 0x8000_0000];
    assert_eq!(get_bits(&r3, 0, 1), 1);
    assert_eq!(get_bits(&r3, 63, 1), 1);
    assert_eq!(get_bits(&r3, 62, 1), 0);
}

#[test]
fn none_and_sym_encode_exactly() {
    let x: Vec<f32> = (0..128).map(|i| (i as f32 * 0.71).sin() * 3.0).collect();
    let none = CodecRef::new(Codec::NONE, 128, 0).unwrap();
    let row = none.encode(&x);
    assert_eq!(row.len(), 64);
    assert_eq!(row[0] & 0xFFFF, half::f16::from_f32(x[0]).to_bits() as u32);
    assert_eq!(row[0] >> 16, half::f16::from_f32(x[1]).to_bits() as u32);
    for (a, b) in none.decode(&row).iter().zip(&x) {
        assert_eq!(*a, half::f16::from_f32(*b).to_f64());
    }
    for (c, qmax) in [(Codec::Q8, 127.0), (Codec::Q4, 7.0)] {
        let r = CodecRef::new(c, 128, 0).unwrap();
        let row = r.encode(&x);
        let scales = r.scales(&row);
        assert_eq!(scales.len(), 4);
        for (j, s) in scales.iter().enumerate() {
            let absmax = x[32 * j..32 * j + 32]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs())) as f64;
            assert_eq!(*s, half::f16::from_f64(absmax / qmax).to_f64());
        }
        let dec = r.decode(&row);
        for (i, (a, b)) in dec.iter().zip(&x).enumerate() {
            let s = scales[i / 32];
            assert!(
                (a - *b as f64).abs() <= 0.5 * s * 1.01 + 1e-12,
                "{} {i}",
                c.name()
            );
            let u = get_bits(&row, i as u32 * c.bits as u32, c.bits as u32) as i64;
            let cc = ((*b as f64) / s).round().clamp(-qmax, qmax) as i64;
            assert_eq!(u - (1 << (c.bits - 1)), cc);
        }
    }
    // All-zero block: scale 0, codes at the bias.
    let r = CodecRef::new(Codec::Q4, 64, 0).unwrap();
    let row = r.encode(&[0.0; 64]);
    assert_eq!(r.scales(&row), vec![0.0, 0.0]);
    assert!(r.codes(&row).iter().all(|&u| u == 8));
}

#[test]
fn rotated_codecs_follow_the_contract() {
    let mut g = GaussianStream::new(17);
    for c in all_codecs().into_iter().filter(|c| c.kind.is_rotated()) {
        for d in DIMS {
            let r = CodecRef::new(c, d, 1234).unwrap();
            let l = *r.layout();
            let x: Vec<f64> = (0..d).map(|_| g.next_gaussian() * 0.3).collect();
            let xf = to_f32(&x);
            let xd: Vec<f64> = xf.iter().map(|&v| v as f64).collect();
            let row = r.encode(&xf);
            assert_eq!(row.len(), l.words as usize);
            // Unused tail bits are zero.
            for k in l.used_bits()..32 * l.words {
                assert_eq!(get_bits(&row, k, 1), 0);
            }
            // Rotation is orthonormal and invertible.
            let y = r.rotate(&xd);
            assert_eq!(y.len(), l.n_codes as usize);
            assert!((norm(&y) - norm(&xd)).abs() < 1e-5 * norm(&xd));
            let back = r.unrotate(&y);
            for (a, b) in back.iter().zip(&xd) {
                assert!((a - b).abs() < 1e-5);
            }
            // Scales.
            let scales = r.scales(&row);
            let expect: Vec<f64> = match c.scale {
                ScaleMode::PerVector => vec![norm(&xd) / (d as f64).sqrt()],
                ScaleMode::Block32 => y
                    .chunks(32)
                    .map(|b| (b.iter().map(|v| v * v).sum::<f64>() / b.len() as f64).sqrt())
                    .collect(),
            };
            assert_eq!(scales.len(), expect.len());
            for (s, e) in scales.iter().zip(&expect) {
                assert_eq!(*s, half::f16::from_f64(*e).to_f64());
            }
            // Codes: nearest level of y / s (f16 s).
            let cb = codebook(c.bits);
            let lv = r.levels();
            for (i, k) in r.codes(&row).iter().enumerate() {
                let s = scales[i / l.side_block as usize];
                let t = y[i] / s;
                assert_eq!(*k, cb.quantize(t));
                if c.bits > 0 {
                    let best = (0..lv.len())
                        .min_by(|&a, &b| (lv[a] - t).abs().partial_cmp(&(lv[b] - t).abs()).unwrap())
                        .unwrap();
                    assert!(
                        best as u32 == *k
                            || ((lv[best] - t).abs() - (lv[*k as usize] - t).abs()).abs() < 1e-6
                    );
                }
            }
            // Decode = R^T (s * level).
            let yh = r.decode_rotated(&row);
            let xh = r.decode(&row);
            assert_eq!(xh.len(), d as usize);
            let xh2 = r.unrotate(&yh);
            assert_eq!(xh, xh2);
            if c.bits >= 3 {
                let rel =
                    norm(&x.iter().zip(&xh).map(|(a, b)| a - b).collect::<Vec<_>>()) / norm(&x);
                assert!(rel < 0.3, "{} d={d}: relative error {rel}", c.name());
            }
            // Row norm recovers ||x||.
            assert!((r.row_norm(&row) / norm(&xd) - 1.0).abs() < 2e-3);
        }
    }
}

#[test]
fn zero_vector_encodes_to_zero() {
    for c in all_codecs() {
        let r = CodecRef::new(c, 96, 5).unwrap();
        let row = r.encode(&[0.0; 96]);
        assert!(r.decode(&row).iter().all(|&v| v == 0.0), "{}", c.name());
        if c.kind.is_rotated() {
            assert!(r.codes(&row).iter().all(|&k| k == (1 << c.bits) / 2));
            let q = vec![1.0; 96];
            assert_eq!(r.ip_estimate(&row, &q), 0.0);
        }
    }
}

#[test]
fn same_seed_same_rows_different_seed_different_rows() {
    let x: Vec<f32> = (0..128).map(|i| (i as f32).cos()).collect();
    let a = CodecRef::new(Codec::iso(3), 128, 1).unwrap();
    let b = CodecRef::new(Codec::iso(3), 128, 1).unwrap();
    let c = CodecRef::new(Codec::iso(3), 128, 2).unwrap();
    assert_eq!(a.encode(&x), b.encode(&x));
    assert_ne!(a.encode(&x), c.encode(&x));
}

// ----------------------------------------------------------------------------- quality

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
/// Beta law; BACKGROUND's own 3-bit target is 0.0337). Measured on many S to keep the
/// sampling error (about ±0.4%) well inside the ±5% window.
#[test]
fn quality_qjl_4_bits() {
    check_qjl(4, 48, 4000);
}
