//! GPU codecs against the CPU reference: encode produces the reference's rows, and attention
//! over the quantized store matches f64 attention over the dequantized store.

mod common;

use common::{Rng, attend_poisoned, ctx, reference_over_rows, rel_err};
use kvq::codec::CodecRef;
use kvq::{CacheSpec, KvCache, KvCodecs};

const TOL: f64 = 1e-3;

/// Appends `n` random tokens to `layer` and returns them ([batch, n, kv_heads, d]).
fn append(cache: &mut KvCache, rng: &mut Rng, layer: u32, n: usize) {
    let s = cache.spec().clone();
    let len = s.batch as usize * n * (s.kv_heads * s.head_dim) as usize;
    // Heavier-tailed than Gaussian now and then, so block scales differ.
    let k: Vec<f32> = (0..len)
        .map(|i| rng.normal() * if i % 37 == 0 { 6.0 } else { 1.0 })
        .collect();
    let v = rng.normals(len, 1.0);
    cache.append_host(layer, &k, &v).expect("append");
}

/// Max relative error of GPU attention on `layer` against f64 attention over the GPU's own
/// stored rows decoded by the CPU reference (the rows themselves are checked against the
/// reference encoder in `encode_matches_reference`).
fn check_attention(cache: &KvCache, rng: &mut Rng, layer: u32) -> f64 {
    let s = cache.spec().clone();
    let (krows, vrows) = cache.read_rows(layer).unwrap();
    let n = (s.q_heads * s.head_dim) as usize;
    let q = rng.normals(s.batch as usize * n, 1.5);
    let out = attend_poisoned(cache, layer, &q);
    let mut worst = 0.0f64;
    for b in 0..s.batch as usize {
        let len = cache.len(layer, b as u32).unwrap() as usize;
        let slots: Vec<usize> = (0..len).collect();
        let qb = &q[b * n..(b + 1) * n];
        let want = reference_over_rows(&s, &krows, &vrows, b, &slots, qb);
        worst = worst.max(rel_err(&out[b * n..(b + 1) * n], &want));
    }
    worst
}

/// A cache of `name` at head_dim `d` (2 KV heads, capacity 80) holding 70 random tokens (the
/// wide append path) then 1 more (the small path) whose K is the first token's with the first
/// head's row zeroed when `zero_row`. Returns the cache, the 70 tokens' K and V, and the last
/// token's K and V.
fn filled_cache(
    name: &str,
    d: u32,
    seed: u64,
    zero_row: bool,
) -> (KvCache, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let spec = CacheSpec::new(1, 4, 2, d, 80)
        .with_codecs(KvCodecs::parse(name).unwrap())
        .with_splits(2);
    let mut cache = KvCache::new(ctx(), spec).unwrap();
    let mut rng = Rng::new(seed);
    let len = 70 * 2 * d as usize;
    let k: Vec<f32> = (0..len)
        .map(|i| rng.normal() * if i % 29 == 0 { 8.0 } else { 1.0 })
        .collect();
    let v = rng.normals(len, 1.0);
    cache.append_host(0, &k, &v).unwrap();
    let mut k1 = k[..2 * d as usize].to_vec();
    if zero_row {
        k1[..d as usize].iter_mut().for_each(|x| *x = 0.0);
    }
    let v1 = v[..2 * d as usize].to_vec();
    cache.append_host(0, &k1, &v1).unwrap();
    (cache, k, v, k1, v1)
}

#[test]
fn encode_matches_reference() {
    encode_sym(&["q8_sym", "q4_sym"]);
}

#[test]
fn encode_of_mixed_int_codecs_matches_reference() {
    encode_sym(&["k=q4,v=q8"]);
}

/// The GPU's q8/q4 rows of `names` at every head_dim are the reference encoder's.
fn encode_sym(names: &[&str]) {
    for &name in names {
        for d in [64u32, 96, 128, 256] {
            let (cache, k, v, _, _) = filled_cache(name, d, d as u64 + 1, false);
            let (spec, codecs, n) = (cache.spec().clone(), cache.spec().codecs, 70);
            let (krows, vrows) = cache.read_rows(0).unwrap();
            let kref = CodecRef::new(codecs.k, d, spec.seed).unwrap();
            let vref = CodecRef::new(codecs.v, d, spec.seed).unwrap();
            let (kw, vw) = (kref.layout().words as usize, vref.layout().words as usize);
            let (mut rows, mut differ) = (0, 0);
            for t in 0..=n {
                let src = if t < n { t } else { 0 };
                for h in 0..2usize {
                    let x = (src * 2 + h) * d as usize..(src * 2 + h + 1) * d as usize;
                    let r = h * 80 + t;
                    rows += 2;
                    let want = kref.encode(&k[x.clone()]);
                    if krows[r * kw..(r + 1) * kw] != want[..] && std::env::var("KVQ_DEBUG").is_ok()
                    {
                        let got = &krows[r * kw..(r + 1) * kw];
                        for w in 0..kw {
                            if got[w] != want[w] {
                                eprintln!(
                                    "{name} d={d} row {r} word {w}: gpu {:08x} ref {:08x}",
                                    got[w], want[w]
                                );
                                let xs = &k[x.clone()];
                                let blk = w / 8;
                                let amax = xs[blk * 32..blk * 32 + 32]
                                    .iter()
                                    .fold(0f32, |m, v| m.max(v.abs()));
                                let sc = kref.scales(&want)[blk];
                                for j in 0..4 {
                                    let xv = xs[(w % 8) * 4 + blk * 32 + j];
                                    eprintln!(
                                        "   x={xv} amax={amax} scale={sc} t={}",
                                        xv as f64 / sc
                                    );
                                }
                            }
                        }
                    }
                    differ += (krows[r * kw..(r + 1) * kw] != want[..]) as usize;
                    differ += (vrows[r * vw..(r + 1) * vw] != vref.encode(&v[x])[..]) as usize;
                }
            }
            // Ties at exact rounding boundaries may differ between f32 and f64 arithmetic.
            assert!(
                differ * 1000 <= rows,
                "{name} d={d}: {differ} of {rows} rows differ from the reference encoder"
            );
        }
    }
}

/// The codec pairings of the attention tests: each on some of the four shapes, rotating so
/// every shape and GQA ratio meets several codecs. (head_dim, the GQA ratio and the codecs
/// are in the kernels' text: each pairing of the cross product would be kernels of its own.)
const ATTENTION_CODECS: [&str; 14] = [
    "q8_sym",
    "q4_sym",
    "k_q8",
    "k_q4",
    "k=none,v=q4",
    "k=q4,v=q8",
    "turbo3_sym",
    "rotor3_sym",
    "iso4_sym",
    "k=turbo2b,v=rotor4b",
    "k=iso3b+qjl,v=none",
    "k=rotor4+qjl,v=turbo4",
    "k=q8,v=iso3",
    "k_turbo3+qjl",
];

/// Attention over the store of `ATTENTION_CODECS[range]` matches f64 attention over it.
fn attention_over_quantized_store(range: std::ops::Range<usize>) {
    let shapes = [(64u32, 8u32), (96, 2), (128, 4), (256, 1)];
    for (i, name) in ATTENTION_CODECS.into_iter().enumerate() {
        if !range.contains(&i) {
            continue;
        }
        // Two shapes each for the sym codecs; one (rotating) for the rotated codecs, which
        // share their readers and so meet every shape between them.
        let picks = if i < 6 {
            vec![shapes[i % 4], shapes[(i + 1) % 4]]
        } else {
            vec![shapes[i % 4]]
        };
        for (pi, &(d, g)) in picks.iter().enumerate() {
            let codecs = KvCodecs::parse(name).unwrap();
            let kvh = if g == 8 { 1 } else { 2 };
            // The second shape with 2 splits: at 259 tokens each split then holds a full tile
            // of 128 (the V loop's full-tile batch, KernelConfig::v_batch_full).
            let spec = CacheSpec::new(2, kvh * g, kvh, d, 260)
                .with_codecs(codecs)
                .with_splits(3 - pi as u32);
            let mut cache = KvCache::new(ctx(), spec).unwrap();
            let mut rng = Rng::new(d as u64 * 7 + g as u64);
            let mut len = 0;
            for target in [1usize, 33, 130, 259] {
                append(&mut cache, &mut rng, 1, target - len);
                len = target;
                let e = check_attention(&cache, &mut rng, 1);
                assert!(e <= TOL, "{name} d={d} g={g} len={len}: rel err {e:e}");
            }
        }
    }
}

// Split in three, which run on parallel test threads.
#[test]
fn attention_over_int_codecs_matches_reference() {
    attention_over_quantized_store(0..6);
}

#[test]
fn attention_over_rotated_codecs_matches_reference() {
    attention_over_quantized_store(6..10);
}

#[test]
fn attention_over_qjl_and_mixed_codecs_matches_reference() {
    attention_over_quantized_store(10..14);
}

/// The fused step encodes the new rows inside the split kernel: same rows, same attention.
#[test]
fn fused_step_with_quantized_codecs() {
    use kvq::InputType;
    let dev = &ctx().device;
    for name in [
        "q8_sym",
        "k=q4,v=none",
        "turbo3_sym",
        "k=rotor3b+qjl,v=iso4",
    ] {
        let codecs = KvCodecs::parse(name).unwrap();
        let mut spec = CacheSpec::new(1, 8, 2, 128, 150)
            .with_codecs(codecs)
            .with_splits(3)
            .with_batch(2);
        spec.segment_tokens = Some(64);
        let mut cache = KvCache::new(ctx(), spec).unwrap();
        let mut rng = Rng::new(77);
        append(&mut cache, &mut rng, 0, 60);
        let per = 2 * 2 * 128;
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let mk = |n: usize| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: n as u64 * 4,
                usage,
                mapped_at_creation: false,
            })
        };
        let (kb, vb, qb, ob) = (mk(per), mk(per), mk(2 * 8 * 128), mk(2 * 8 * 128));
        let io = cache
            .step_io(&kb, &vb, 1, InputType::F32, &qb, &ob)
            .unwrap();
        for _ in 0..10 {
            ctx()
                .queue
                .write_buffer(&kb, 0, bytemuck::cast_slice(&rng.normals(per, 1.0)));
            ctx()
                .queue
                .write_buffer(&vb, 0, bytemuck::cast_slice(&rng.normals(per, 1.0)));
            let mut enc = dev.create_command_encoder(&Default::default());
            cache.step(&mut enc, 0, &io).unwrap();
            ctx().queue.submit([enc.finish()]);
            let e = check_attention(&cache, &mut rng, 0);
            assert!(e <= TOL, "{name}: rel err {e:e}");
        }
        assert_eq!(cache.read_gpu_lengths().unwrap().0, vec![70, 70]);
    }
}

/// Whether `t` lies within a rounding hair of one of the codebook's f32 boundaries (where
/// f32 GPU arithmetic and the f64 reference may fairly pick neighbouring codes).
fn near_boundary(bits: u8, t: f64) -> bool {
    kvq::codec::codebook(bits)
        .boundaries_f32()
        .iter()
        .any(|&b| (t - b as f64).abs() <= 1e-4 * t.abs().max(1.0))
}

/// Compares one GPU row with the reference encoding of `x`. Returns false only for a real
/// difference: a code, sign bit or scale that differs without the reference value sitting at
/// a rounding boundary. Ties are counted in `ties`.
fn row_matches(r: &CodecRef, x: &[f32], got: &[u32], ties: &mut usize) -> bool {
    let want = r.encode(x);
    if got == want.as_slice() {
        return true;
    }
    *ties += 1;
    let (gs, ws) = (r.scales(got), r.scales(&want));
    for (a, b) in gs.iter().zip(&ws) {
        // One f16 step apart at most (the norm rounded differently in f32).
        if (a - b).abs() > b.abs() * 1.0e-3 + 1e-7 {
            return false;
        }
    }
    if gs != ws {
        return true; // every code may shift with the scale; attention tests cover the row
    }
    let l = r.layout();
    let xd: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let y = r.rotate(&xd);
    let block = l.side_block as usize;
    for (i, (cg, cw)) in r.codes(got).iter().zip(r.codes(&want)).enumerate() {
        if *cg != cw {
            let s = ws[i / block];
            let t = if s > 0.0 { y[i] / s } else { 0.0 };
            if cg.abs_diff(cw) != 1 || !near_boundary(r.codec().bits, t) {
                eprintln!("code {i}: gpu {cg} ref {cw} t {t}");
                return false;
            }
        }
    }
    if let Some(off) = l.qjl_offset_bits {
        // Sign bits of S r may flip only where (S r)_j is ~0.
        let xhat = r.decode(&want);
        let n = xd.iter().map(|v| v * v).sum::<f64>().sqrt();
        let res: Vec<f64> = xd.iter().zip(&xhat).map(|(a, b)| (a - b) / n).collect();
        let sr = r.qjl_project(&res);
        let rn = res.iter().map(|v| v * v).sum::<f64>().sqrt();
        for (j, v) in sr.iter().enumerate() {
            let bit = |row: &[u32]| kvq::codec::get_bits(row, off + j as u32, 1);
            if bit(got) != bit(&want) && v.abs() > 1e-4 * rn.max(1e-30) * 10.0 {
                eprintln!("qjl bit {j}: (S r)_j = {v}");
                return false;
            }
        }
        let half = |row: &[u32]| kvq::codec::get_bits(row, l.qjl_norm_offset_bits, 16);
        let (a, b) = (half(got) as i32, half(&want) as i32);
        if (a - b).abs() > 1 {
            return false;
        }
    }
    true
}

/// Rotated codecs (turbo, rotor, iso; per-vector and per-block scales; QJL): the GPU encoder
/// (small, wide and fused-step paths) writes the reference's rows, ties at boundaries aside.
#[test]
fn rotated_encode_matches_reference() {
    rotated_encode(&[
        ("turbo3_sym", 128u32),
        ("turbo2_sym", 96),
        ("rotor3_sym", 128),
        ("rotor4b_sym", 64),
        ("iso4_sym", 256),
        ("iso3b_sym", 128),
    ]);
}

/// As `rotated_encode_matches_reference`, with a QJL K (apart: its encoders compile slowly).
#[test]
fn rotated_encode_with_qjl_matches_reference() {
    rotated_encode(&[
        ("k=turbo4b+qjl,v=rotor2", 64),
        ("k=rotor3+qjl,v=iso1", 96),
        ("k=iso3+qjl,v=turbo1b", 128),
    ]);
}

fn rotated_encode(names: &[(&str, u32)]) {
    for &(name, d) in names {
        // The small path's token has a zero row (scale 0).
        let (cache, k, v, k1, _) = filled_cache(name, d, d as u64 + 5, true);
        let (spec, codecs, n) = (cache.spec().clone(), cache.spec().codecs, 70);
        let (krows, vrows) = cache.read_rows(0).unwrap();
        let kref = CodecRef::new(codecs.k, d, spec.seed).unwrap();
        let vref = CodecRef::new(codecs.v, d, spec.seed).unwrap();
        let (kw, vw) = (kref.layout().words as usize, vref.layout().words as usize);
        let (mut rows, mut ties) = (0, 0);
        for t in 0..=n {
            for h in 0..2usize {
                let x = |src: &[f32]| {
                    let i = if t < n { t * 2 + h } else { h };
                    src[i * d as usize..(i + 1) * d as usize].to_vec()
                };
                let kx = if t < n { x(&k) } else { x(&k1) };
                let r = h * 80 + t;
                rows += 2;
                assert!(
                    row_matches(&kref, &kx, &krows[r * kw..(r + 1) * kw], &mut ties),
                    "{name} d={d}: K row {r} differs from the reference"
                );
                assert!(
                    row_matches(&vref, &x(&v), &vrows[r * vw..(r + 1) * vw], &mut ties),
                    "{name} d={d}: V row {r} differs from the reference"
                );
            }
        }
        assert!(
            ties * 20 <= rows,
            "{name} d={d}: {ties} of {rows} rows differ (at boundaries) from the reference"
        );
    }
}
