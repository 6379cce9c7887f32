//! Robustness (issue #5): non-finite K/V inputs, and no panic from any call sequence (the soak
//! test is tests/soak.rs, alone in its process so that its memory measure sees only itself).

mod common;

use common::{Rng, ctx, read_f32};
use kvq::{CacheSpec, InputType, KvCache, KvCodecs, KvqError};
use proptest::prelude::*;

const D: u32 = 64;
const KVH: u32 = 2;
const QH: u32 = 4;
const BATCH: u32 = 2;

fn buffer_with(data: &[u8], usage: wgpu::BufferUsages) -> wgpu::Buffer {
    let b = ctx().device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: data.len() as u64,
        usage: usage | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    ctx().queue.write_buffer(&b, 0, data);
    b
}

/// One fused step of `layer` with f16 K/V inputs (the step kernel's encoders), output read back.
fn step_f16(cache: &mut KvCache, layer: u32, k: &[f32], v: &[f32], q: &[f32]) -> Vec<f32> {
    let half = |x: &[f32]| -> Vec<u16> {
        x.iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect()
    };
    let st = wgpu::BufferUsages::STORAGE;
    let kb = buffer_with(bytemuck::cast_slice(&half(k)), st);
    let vb = buffer_with(bytemuck::cast_slice(&half(v)), st);
    let qb = buffer_with(bytemuck::cast_slice(q), st);
    let ob = buffer_with(
        bytemuck::cast_slice(&vec![f32::NAN; q.len()]),
        st | wgpu::BufferUsages::COPY_SRC,
    );
    let io = cache
        .step_io(&kb, &vb, 1, InputType::F16, &qb, &ob)
        .unwrap();
    let mut enc = ctx().device.create_command_encoder(&Default::default());
    cache.step(&mut enc, layer, &io).unwrap();
    ctx().queue.submit([enc.finish()]);
    read_f32(ctx(), &ob, q.len())
}

/// Index of value `i` of (sequence `b`, token `t`, head `h`) in `[batch, n, kv_heads, D]`.
fn at(n: usize, b: usize, t: usize, h: usize, i: usize) -> usize {
    ((b * n + t) * KVH as usize + h) * D as usize + i
}

/// Layer 0 gets clean data, layer 1 the same with NaN/±Inf in a few values of sequence 0, layer
/// 2 the same with 0 in their place. Documented behaviour (KvCache::append): a non-finite input
/// value is stored as 0 would be, so layers 1 and 2 must be bit-identical, every output finite,
/// and sequence 1 of layer 1 bit-identical to the clean layer 0.
fn non_finite_case(codec: &str) {
    let spec = CacheSpec::new(3, QH, KVH, D, 16)
        .with_batch(BATCH)
        .with_codecs(KvCodecs::parse(codec).unwrap());
    let mut cache = KvCache::new(ctx(), spec).unwrap();
    let mut rng = Rng::new(0x5eed ^ codec.len() as u64);
    let n = 5;
    let per = (BATCH * n * KVH * D) as usize;
    let (k0, v0) = (rng.normals(per, 1.0), rng.normals(per, 1.0));
    let bad = [
        (true, at(n as usize, 0, 2, 0, 3), f32::NAN),
        (true, at(n as usize, 0, 2, 1, 40), f32::NEG_INFINITY),
        (false, at(n as usize, 0, 2, 0, 7), f32::INFINITY),
        (false, at(n as usize, 0, 4, 1, 63), f32::NAN),
    ];
    let with = |fill: Option<f32>| {
        let (mut k, mut v) = (k0.clone(), v0.clone());
        for &(is_k, i, x) in &bad {
            let side = if is_k { &mut k } else { &mut v };
            side[i] = fill.unwrap_or(x);
        }
        (k, v)
    };
    let (k1, v1) = with(None);
    let (k2, v2) = with(Some(0.0));
    cache.append_host(0, &k0, &v0).unwrap();
    cache.append_host(1, &k1, &v1).unwrap();
    cache.append_host(2, &k2, &v2).unwrap();

    let qn = (BATCH * QH * D) as usize;
    let half = qn / 2;
    let check = |outs: &[Vec<f32>], what: &str| {
        let finite = |o: &[f32]| o.iter().all(|x| x.is_finite());
        let as_zero = outs[1] == outs[2];
        let seq1 = outs[1][half..] == outs[0][half..];
        let seq0_max = outs[1][..half].iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(
            finite(&outs[0]) && finite(&outs[1]) && finite(&outs[2]) && as_zero && seq1,
            "{codec} {what}: all finite {}, non-finite inputs act as 0 {as_zero}, \
             sequence 1 unaffected {seq1}, max |out| of sequence 0 {seq0_max}",
            outs.iter().all(|o| finite(o)),
        );
    };
    let q = rng.normals(qn, 1.0);
    let outs: Vec<_> = (0..3).map(|l| cache.attend_host(l, &q).unwrap()).collect();
    check(&outs, "after prefill");
    let rows: Vec<_> = (0..3).map(|l| cache.read_rows(l).unwrap()).collect();
    assert_eq!(rows[1], rows[2], "{codec}: stored rows");

    // Fused steps with f16 inputs, the second with NaN/Inf in sequence 0 (also a later token).
    for s in 0..3 {
        let per = (BATCH * KVH * D) as usize;
        let (k, v, q) = (
            rng.normals(per, 1.0),
            rng.normals(per, 1.0),
            rng.normals(qn, 1.0),
        );
        let (mut kb, mut vb, mut kz, mut vz) = (k.clone(), v.clone(), k.clone(), v.clone());
        if s == 1 {
            kb[5] = f32::INFINITY;
            vb[D as usize + 9] = f32::NAN;
            kz[5] = 0.0;
            vz[D as usize + 9] = 0.0;
        }
        let outs = vec![
            step_f16(&mut cache, 0, &k, &v, &q),
            step_f16(&mut cache, 1, &kb, &vb, &q),
            step_f16(&mut cache, 2, &kz, &vz, &q),
        ];
        check(&outs, &format!("step {s}"));
    }
    let rows: Vec<_> = (0..3).map(|l| cache.read_rows(l).unwrap()).collect();
    assert_eq!(rows[1], rows[2], "{codec}: stored rows after steps");
}

#[test]
fn non_finite_inputs_none() {
    non_finite_case("none");
}

#[test]
fn non_finite_inputs_q8() {
    non_finite_case("q8_sym");
}

#[test]
fn non_finite_inputs_turbo3() {
    non_finite_case("turbo3_sym");
}

/// A call of the public API, with arguments that may be out of range.
#[derive(Clone, Debug)]
enum Op {
    Append { layer: u32, n: u32 },
    Attend { layer: u32 },
    Truncate { seq: u32, len: u32 },
    Reset { seq: u32 },
    Len { layer: u32, seq: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    // Layer and sequence indices up to one past the largest shape (2 layers, batch 3); token
    // counts mostly small, sometimes up to past the largest capacity (200).
    let n = prop_oneof![3 => 0u32..4, 1 => 0u32..=202];
    prop_oneof![
        4 => (0u32..3, n).prop_map(|(layer, n)| Op::Append { layer, n }),
        2 => (0u32..3).prop_map(|layer| Op::Attend { layer }),
        1 => (0u32..4, 0u32..=202).prop_map(|(seq, len)| Op::Truncate { seq, len }),
        1 => (0u32..4).prop_map(|seq| Op::Reset { seq }),
        1 => (0u32..3, 0u32..4).prop_map(|(layer, seq)| Op::Len { layer, seq }),
    ]
}

/// Runs `ops` on one cache of the given shape against a host model of the lengths: every call
/// must return what the model predicts (Ok or the typed error), a refused call must change
/// nothing, and the GPU's lengths must equal the model's at the end.
fn run_ops(shape: (u32, u32, u32, u32, u32, u32, usize, Option<u32>), ops: &[Op]) {
    let (d, kvh, gqa, capacity, batch, layers, codec, window) = shape;
    let codec = ["none", "q8_sym", "k_q4", "turbo3_sym"][codec];
    let mut spec = CacheSpec::new(layers, kvh * gqa, kvh, d, capacity)
        .with_batch(batch)
        .with_codecs(KvCodecs::parse(codec).unwrap());
    // A sliding window (a ring that never fills) on some shapes.
    spec.window = window.map(|w| 1 + w % capacity);
    let ring = spec.window.is_some();
    // Whether appending n tokens to a sequence at l must be refused.
    let too_many = |l: u32, n: u32| !ring && l + n > capacity;
    // Whether cutting a sequence at cur back to len loses a token the window at len needs.
    let lost = |cur: u32, len: u32| {
        spec.window
            .is_some_and(|w| len > 0 && len.saturating_sub(w) < cur.saturating_sub(capacity))
    };
    let t0 = std::time::Instant::now();
    let made = KvCache::new(ctx(), spec.clone());
    eprintln!(
        "case {codec} head_dim {d}, kv_heads {kvh}, gqa {gqa}, capacity {capacity}, batch {batch}, \
         layers {layers}, window {:?}: cache in {:.1} s, {} ops",
        spec.window,
        t0.elapsed().as_secs_f64(),
        ops.len()
    );
    let mut cache = match made {
        Ok(c) => c,
        // A shape a codec cannot serve is a typed error, which is all this test asks.
        Err(KvqError::UnsupportedHeadDim { .. } | KvqError::InvalidSpec(_)) => return,
        Err(e) => panic!("{spec:?}: {e}"),
    };
    let mut lens = vec![vec![0u32; batch as usize]; layers as usize];
    let mut rng = Rng::new(u64::from(d * 1000 + capacity) ^ (ops.len() as u64) << 32);
    let per_tok = (batch * kvh * d) as usize;
    let qn = (batch * kvh * gqa * d) as usize;
    for op in ops {
        match *op {
            Op::Append { layer, n } => {
                let k = rng.normals(per_tok * n as usize, 1.0);
                let v = rng.normals(per_tok * n as usize, 1.0);
                let refused =
                    layer < layers && n > 0 && lens[layer as usize].iter().any(|&l| too_many(l, n));
                let before = refused.then(|| cache.read_rows(layer).unwrap());
                let r = cache.append_host(layer, &k, &v);
                if let Some(before) = before {
                    assert_eq!(
                        cache.read_rows(layer).unwrap(),
                        before,
                        "refused {op:?} wrote"
                    );
                }
                if layer >= layers {
                    assert!(matches!(r, Err(KvqError::LayerOutOfRange { .. })), "{r:?}");
                } else if n == 0 {
                    assert!(matches!(r, Err(KvqError::WrongLength { .. })), "{r:?}");
                } else if lens[layer as usize].iter().any(|&l| too_many(l, n)) {
                    assert!(matches!(r, Err(KvqError::CapacityExceeded { .. })), "{r:?}");
                } else {
                    r.unwrap();
                    lens[layer as usize].iter_mut().for_each(|l| *l += n);
                }
            }
            Op::Attend { layer } => {
                let r = cache.attend_host(layer, &rng.normals(qn, 1.0));
                if layer >= layers {
                    assert!(matches!(r, Err(KvqError::LayerOutOfRange { .. })), "{r:?}");
                } else if lens[layer as usize].contains(&0) {
                    assert!(matches!(r, Err(KvqError::EmptySequence { .. })), "{r:?}");
                } else {
                    let out = r.unwrap();
                    assert_eq!(out.len(), qn);
                    assert!(out.iter().all(|x| x.is_finite()));
                }
            }
            Op::Truncate { seq, len } => {
                let r = cache.truncate(seq, len);
                if seq >= batch {
                    assert!(
                        matches!(r, Err(KvqError::SequenceOutOfRange { .. })),
                        "{r:?}"
                    );
                } else if lens
                    .iter()
                    .any(|l| len > l[seq as usize] || lost(l[seq as usize], len))
                {
                    assert!(matches!(r, Err(KvqError::InvalidArgument(_))), "{r:?}");
                } else {
                    r.unwrap();
                    lens.iter_mut().for_each(|l| l[seq as usize] = len);
                }
            }
            Op::Reset { seq } => {
                let r = cache.reset(seq);
                if seq >= batch {
                    assert!(
                        matches!(r, Err(KvqError::SequenceOutOfRange { .. })),
                        "{r:?}"
                    );
                } else {
                    r.unwrap();
                    lens.iter_mut().for_each(|l| l[seq as usize] = 0);
                }
            }
            Op::Len { layer, seq } => {
                let r = cache.len(layer, seq);
                if layer >= layers {
                    assert!(matches!(r, Err(KvqError::LayerOutOfRange { .. })), "{r:?}");
                } else if seq >= batch {
                    assert!(
                        matches!(r, Err(KvqError::SequenceOutOfRange { .. })),
                        "{r:?}"
                    );
                } else {
                    assert_eq!(r.unwrap(), lens[layer as usize][seq as usize]);
                }
            }
        }
        for (l, seqs) in lens.iter().enumerate() {
            for (b, &len) in seqs.iter().enumerate() {
                assert_eq!(cache.len(l as u32, b as u32).unwrap(), len, "after {op:?}");
            }
        }
        assert_eq!(cache.is_empty(), lens.iter().flatten().all(|&l| l == 0));
    }
    let (gpu, overflow) = cache.read_gpu_lengths().unwrap();
    assert_eq!(gpu, lens.concat(), "GPU lengths after {ops:?}");
    assert!(
        overflow.iter().all(|&f| f == 0),
        "overflow flags {overflow:?}"
    );
}

fn proptest_cases() -> u32 {
    std::env::var("KVQ_PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(32)
}

proptest! {
    // 32 cases (KVQ_PROPTEST_CASES=N for more): the shapes differ in capacity, batch, layers
    // and splits, which the kernels read at run time, and in head_dim and GQA ratio, of which
    // there are 16 pairs: a case compiles kernels only for a pair no earlier case had.
    #![proptest_config(ProptestConfig::with_cases(proptest_cases()))]
    #[test]
    fn public_api_never_panics(
        shape in (
            prop::sample::select(vec![32u32, 64, 96, 128]),
            1u32..=4,
            1u32..=8,
            1u32..=200,
            1u32..=3,
            1u32..=2,
            0usize..4,
            prop::option::of(0u32..200),
        ),
        ops in prop::collection::vec(op(), 1..24),
    ) {
        run_ops(shape, &ops);
    }
}

/// Shapes whose counts overflow 32-bit arithmetic are typed errors, not overflow panics.
#[test]
fn huge_shapes_are_typed_errors() {
    let specs = [
        CacheSpec::new(100_000, 1, 1, 32, 1).with_batch(65_535),
        CacheSpec::new(u32::MAX, 8, 1, 256, 1).with_batch(3),
        CacheSpec::new(1, 8, 1, 256, u32::MAX).with_batch(65_535),
        CacheSpec::new(1, 1, 1, 32, u32::MAX),
    ];
    for spec in specs {
        match KvCache::new(ctx(), spec.clone()) {
            Err(e) => eprintln!(
                "{} layers, batch {}, capacity {}: {e}",
                spec.layers, spec.batch, spec.capacity
            ),
            Ok(_) => panic!("{spec:?} was accepted"),
        }
    }
}

/// Codec `none` stores a finite value past f16's range as ±65504 (not ±Inf, which would make the
/// sequence's output NaN); the quantized codecs' scales already saturate.
#[test]
fn out_of_f16_range_saturates() {
    let spec = CacheSpec::new(1, 2, 1, 64, 8);
    let mut cache = KvCache::new(ctx(), spec).unwrap();
    let mut rng = Rng::new(3);
    for t in 0..3 {
        let (mut k, mut v) = (rng.normals(64, 1.0), rng.normals(64, 1.0));
        if t == 1 {
            (k[3], v[4]) = (1e6, -1e30);
        }
        cache.append_host(0, &k, &v).unwrap();
    }
    let out = cache.attend_host(0, &rng.normals(128, 1.0)).unwrap();
    assert!(out.iter().all(|x| x.is_finite()), "{out:?}");
    let (k, v) = cache.read_rows(0).unwrap();
    // Row 1 of each store, 32 words of two halves; values 3 and 4 are in words 1 and 2.
    assert_eq!(k[32 + 1] >> 16, 0x7bff, "K 1e6 stored as f16 65504");
    assert_eq!(v[32 + 2] & 0xffff, 0xfbff, "V -1e30 stored as f16 -65504");
}
