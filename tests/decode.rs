//! GPU decode attention against the f64 reference, over f16 storage (codec `none`).

mod common;

use common::{Rng, attend_poisoned, ctx, rel_err};
use kvq::{CacheSpec, KvCache, reference};

const TOL: f64 = 1e-3;

/// A cache plus host copies of everything appended, to compute the reference.
struct Checked {
    cache: KvCache,
    /// [layer][seq] -> stored rows, [len, kv_heads, d], as f16-rounded f64.
    k: Vec<Vec<Vec<f64>>>,
    v: Vec<Vec<Vec<f64>>>,
    rng: Rng,
}

impl Checked {
    fn new(spec: CacheSpec, seed: u64) -> Checked {
        Self::new_on(ctx(), spec, seed)
    }

    fn new_on(gpu: &kvq::GpuContext, spec: CacheSpec, seed: u64) -> Checked {
        let (l, b) = (spec.layers as usize, spec.batch as usize);
        let cache = KvCache::new(gpu, spec).expect("cache");
        Checked {
            cache,
            k: vec![vec![Vec::new(); b]; l],
            v: vec![vec![Vec::new(); b]; l],
            rng: Rng::new(seed),
        }
    }

    fn append(&mut self, layer: u32, n: usize) {
        let s = self.cache.spec().clone();
        let per = (s.kv_heads * s.head_dim) as usize;
        let k = self.rng.normals(s.batch as usize * n * per, 1.0);
        let v = self.rng.normals(s.batch as usize * n * per, 1.0);
        self.cache.append_host(layer, &k, &v).expect("append");
        self.record(layer, &k, &v);
    }

    /// Keeps the host copy of appended tokens `[batch, n, kv_heads, d]`, rounded like f16.
    fn record(&mut self, layer: u32, k: &[f32], v: &[f32]) {
        let batch = self.cache.spec().batch as usize;
        let per_seq = k.len() / batch;
        for b in 0..batch {
            let r = b * per_seq..(b + 1) * per_seq;
            self.k[layer as usize][b].extend(reference::round_f16(&k[r.clone()]));
            self.v[layer as usize][b].extend(reference::round_f16(&v[r]));
        }
    }

    /// Attends a random query on `layer` and returns the max relative error of every sequence.
    fn check(&mut self, layer: u32) -> f64 {
        let s = self.cache.spec().clone();
        // Queries scaled up a little so the softmax is not flat.
        let q = self
            .rng
            .normals((s.batch * s.q_heads * s.head_dim) as usize, 2.0);
        let out = attend_poisoned(&self.cache, layer, &q);
        self.compare(layer, &q, &out)
    }

    /// Max relative error over every sequence of the GPU output `out` for query `q` (both
    /// `[batch, q_heads, d]`) against f64 attention over the host copy of `layer`.
    fn compare(&self, layer: u32, q: &[f32], out: &[f32]) -> f64 {
        let s = self.cache.spec();
        let n = (s.q_heads * s.head_dim) as usize;
        let mut worst = 0.0f64;
        for b in 0..s.batch as usize {
            let qb: Vec<f64> = q[b * n..(b + 1) * n].iter().map(|&x| x as f64).collect();
            let want = reference::attention(
                &qb,
                &self.k[layer as usize][b],
                &self.v[layer as usize][b],
                s.q_heads as usize,
                s.kv_heads as usize,
                s.head_dim as usize,
                s.softmax_scale() as f64,
            );
            let got = &out[b * n..(b + 1) * n];
            assert!(
                got.iter().all(|x| x.is_finite()),
                "non-finite output (poison survived?)"
            );
            worst = worst.max(rel_err(got, &want));
        }
        worst
    }
}

/// Every head_dim x GQA ratio, growing token by token across split and tile boundaries, with
/// every decode workgroup size in turn (in two tests, which run on parallel test threads).
#[test]
fn shapes_grid_matches_reference() {
    shapes_grid(&[64, 96]);
}

#[test]
fn shapes_grid_at_wide_heads_matches_reference() {
    shapes_grid(&[128, 256]);
}

fn shapes_grid(dims: &[u32]) {
    for &d in dims {
        let i = [64u32, 96, 128, 256].iter().position(|&x| x == d).unwrap();
        for (j, &g) in [1u32, 2, 4, 8].iter().enumerate() {
            let kvh = if g == 8 { 1 } else { 2 };
            // 3 splits of >= 32 tokens: boundaries at 32/64/96 then chunks of len/3.
            let mut spec = CacheSpec::new(1, kvh * g, kvh, d, 300).with_splits(3);
            spec.workgroup = Some([128, 64, 256][(i + j) % 3]);
            let mut c = Checked::new(spec, (d * 10 + g) as u64);
            let mut len = 0;
            for target in [
                1usize, 2, 31, 32, 33, 64, 65, 96, 97, 128, 129, 200, 257, 299, 300,
            ] {
                let n = target - len;
                if n > 0 {
                    c.append(0, n);
                }
                len = target;
                let e = c.check(0);
                assert!(e <= TOL, "d={d} g={g} len={len}: rel err {e:e}");
            }
        }
    }
}

/// Single-token steps after a prefill, over several layers with different data.
#[test]
fn prefill_then_steps_over_layers() {
    let spec = CacheSpec::new(3, 8, 2, 128, 700).with_splits(4);
    let mut c = Checked::new(spec, 7);
    for layer in 0..3 {
        c.append(layer, 500); // wide append path
    }
    for _ in 0..5 {
        for layer in 0..3 {
            c.append(layer, 1);
            let e = c.check(layer);
            assert!(e <= TOL, "layer {layer}: rel err {e:e}");
        }
    }
    assert_eq!(c.cache.len(2, 0).unwrap(), 505);
    let (gpu_lens, overflow) = c.cache.read_gpu_lengths().unwrap();
    assert_eq!(gpu_lens, vec![505, 505, 505]);
    assert!(overflow.iter().all(|&f| f == 0));
}

/// Capacity split across several storage buffers: appends straddle segment edges.
#[test]
fn segmented_store_matches_reference() {
    let mut spec = CacheSpec::new(2, 4, 2, 64, 230).with_splits(2);
    spec.segment_tokens = Some(64);
    let mut c = Checked::new(spec, 11);
    assert_eq!(c.cache.layout().segments, 4);
    for (i, n) in [45usize, 10, 1, 1, 70, 3, 100].into_iter().enumerate() {
        c.append(i as u32 % 2, n);
        c.append((i as u32 + 1) % 2, n);
        for layer in 0..2 {
            let e = c.check(layer);
            assert!(e <= TOL, "after chunk {i} layer {layer}: rel err {e:e}");
        }
    }
    assert_eq!(c.cache.len(0, 0).unwrap(), 230);
}

/// Several sequences in one cache, each with its own data.
#[test]
fn batch_of_sequences() {
    let spec = CacheSpec::new(1, 8, 4, 64, 256)
        .with_batch(3)
        .with_splits(2);
    let mut c = Checked::new(spec, 21);
    c.append(0, 100);
    for _ in 0..3 {
        c.append(0, 1);
        let e = c.check(0);
        assert!(e <= TOL, "rel err {e:e}");
    }
}

/// A custom softmax scale is honoured.
#[test]
fn custom_scale() {
    let mut spec = CacheSpec::new(1, 4, 4, 64, 64);
    spec.scale = Some(0.5);
    let mut c = Checked::new(spec, 5);
    c.append(0, 40);
    let e = c.check(0);
    assert!(e <= TOL, "rel err {e:e}");
}

/// Many splits: each reduce thread folds several passes of partials (the reduce takes 16 per
/// thread and pass over 256 / (D/4) lanes: 128 at D = 128, 256 at D = 64), with tokens in
/// splits of every pass.
#[test]
fn many_splits_match_reference() {
    for (d, splits, len) in [(128u32, 200u32, 6500usize), (64, 300, 9000), (96, 37, 1500)] {
        let spec = CacheSpec::new(1, 8, 2, d, len as u32).with_splits(splits);
        let mut c = Checked::new(spec, d as u64 + splits as u64);
        c.append(0, len - 1);
        c.append(0, 1);
        let e = c.check(0);
        assert!(e <= TOL, "d={d} splits={splits} len={len}: rel err {e:e}");
    }
}

/// The fused step (split writes the new rows, reduce commits the length) gives the same
/// attention as append + attend, across split and segment boundaries, for every shape kind.
#[test]
fn fused_step_matches_reference() {
    use kvq::InputType;
    // A private context: the test asserts on its transfer counters.
    let gpu = common::private_ctx();
    let (dev, queue) = (&gpu.device, &gpu.queue);
    // (.., prefill of layers 0 and 1, capacity). The last two cases reach whole 128-token
    // tiles per split (3 splits: 384 stored tokens per segment) with a tail split 0 takes
    // beside the new token: layer 0 of the first steps from 378 to 398 in one segment, its
    // layer 1 has a full first 512-token segment (whose split 0 takes a whole tile, no new
    // tokens); the second (2 sequences) steps across the segment boundary at 512 (tails of
    // 121-127 tokens, up to tail + new = one tile) and, on layer 1, from 890 in a segment
    // starting at 512.
    type Case = (u32, u32, u32, u32, Option<u32>, InputType, [usize; 2], u32);
    let cases: [Case; 5] = [
        (128, 4, 2, 1, None, InputType::F32, [90, 30], 200),
        (96, 8, 1, 2, Some(64), InputType::F16, [90, 30], 200),
        (64, 1, 4, 1, None, InputType::F16, [90, 30], 200),
        (128, 4, 2, 1, Some(512), InputType::F32, [378, 760], 800),
        (128, 4, 2, 2, Some(512), InputType::F32, [505, 890], 1024),
    ];
    for (d, g, kvh, batch, seg_tokens, input, pre, cap) in cases {
        let mut spec = CacheSpec::new(2, kvh * g, kvh, d, cap)
            .with_splits(3)
            .with_batch(batch);
        spec.segment_tokens = seg_tokens;
        let mut c = Checked::new_on(&gpu, spec, 100 + d as u64);
        c.append(0, pre[0]);
        c.append(1, pre[1]);
        let per = (batch * kvh * d) as usize;
        let qn = (batch * kvh * g * d) as usize;
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let mk = |bytes: usize| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes as u64,
                usage,
                mapped_at_creation: false,
            })
        };
        let (kb, vb, qb, ob) = (mk(per * 4), mk(per * 4), mk(qn * 4), mk(qn * 4));
        let io = c.cache.step_io(&kb, &vb, 1, input, &qb, &ob).unwrap();
        for step in 0..40 {
            let layer = step % 2;
            let k = c.rng.normals(per, 1.0);
            let v = c.rng.normals(per, 1.0);
            let q = c.rng.normals(qn, 2.0);
            let bytes = |x: &[f32]| -> Vec<u8> {
                match input {
                    InputType::F32 => bytemuck::cast_slice(x).to_vec(),
                    InputType::F16 => x
                        .iter()
                        .flat_map(|&f| half::f16::from_f32(f).to_le_bytes())
                        .collect(),
                }
            };
            queue.write_buffer(&kb, 0, &bytes(&k));
            queue.write_buffer(&vb, 0, &bytes(&v));
            queue.write_buffer(&qb, 0, bytemuck::cast_slice(&q));
            queue.write_buffer(&ob, 0, bytemuck::cast_slice(&vec![f32::NAN; qn]));
            let before = gpu.stats();
            let mut enc = dev.create_command_encoder(&Default::default());
            c.cache.step(&mut enc, layer, &io).unwrap();
            let delta = gpu.stats() - before;
            assert_eq!(
                (
                    delta.bytes_uploaded,
                    delta.bytes_downloaded,
                    delta.dispatches
                ),
                (0, 0, c.cache.layout().segments as u64 + 1)
            );
            queue.submit([enc.finish()]);
            c.record(layer, &k, &v);
            let out = common::read_f32(&gpu, &ob, qn);
            let e = c.compare(layer, &q, &out);
            assert!(e <= TOL, "d={d} g={g} step {step}: rel err {e:e}");
        }
        let (lens, overflow) = c.cache.read_gpu_lengths().unwrap();
        assert_eq!(
            lens,
            [
                vec![pre[0] as u32 + 20; batch as usize],
                vec![pre[1] as u32 + 20; batch as usize]
            ]
            .concat()
        );
        assert!(overflow.iter().all(|&f| f == 0));
    }
}

/// Truncation (speculative decoding) and reset (slot reuse): later appends overwrite the cut
/// rows and attention sees only what is kept; other sequences are untouched.
#[test]
fn truncate_and_reset_sequences() {
    let spec = CacheSpec::new(2, 4, 2, 64, 120)
        .with_batch(2)
        .with_splits(2);
    let mut c = Checked::new(spec, 55);
    for layer in 0..2 {
        c.append(layer, 70);
    }
    // Keep 40 tokens of sequence 1 in both layers.
    c.cache.truncate(1, 40).unwrap();
    for layer in 0..2 {
        let kept = 40 * 2 * 64;
        c.k[layer][1].truncate(kept);
        c.v[layer][1].truncate(kept);
    }
    assert!(
        c.cache.truncate(1, 41).is_err(),
        "growing by truncation must be refused"
    );
    assert!(c.cache.truncate(2, 0).is_err(), "sequence out of range");
    // Appends go to each sequence at its own length; the host helper appends to both.
    for layer in 0..2 {
        c.append(layer, 5);
        let e = c.check(layer);
        assert!(e <= TOL, "after truncate, layer {layer}: rel err {e:e}");
    }
    assert_eq!(c.cache.read_gpu_lengths().unwrap().0, vec![75, 45, 75, 45]);
    // Reset sequence 0 and reuse its slot.
    c.cache.reset(0).unwrap();
    for layer in 0..2u32 {
        c.k[layer as usize][0].clear();
        c.v[layer as usize][0].clear();
        c.append(layer, 3);
        let e = c.check(layer);
        assert!(e <= TOL, "after reset, layer {layer}: rel err {e:e}");
    }
    assert_eq!(c.cache.read_gpu_lengths().unwrap().0, vec![3, 48, 3, 48]);
}
