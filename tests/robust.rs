//! Robustness (issue #5): non-finite K/V inputs, no panic from any call sequence, and a soak of
//! many decode steps with truncations and resets that must not grow memory.

mod common;

use common::{Rng, ctx, read_f32};
use kvq::{CacheSpec, InputType, KvCache, KvCodecs};

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
    let mut rng = Rng(0x5eed ^ codec.len() as u64);
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
