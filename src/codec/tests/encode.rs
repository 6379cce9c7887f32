//! Bit packing and the reference encoders against the layout contract.

use super::*;

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
