//! Exact tokens (`CacheSpec::with_exact`): each sequence's first `sink` and newest `recent`
//! tokens attended from their f16 copies, the rest through the codec. GPU attention against
//! f64 attention over the same mix: the exact positions' f16 inputs, the others' stored rows
//! decoded by the CPU reference, across the sink's end, the ring's wrap, split and segment
//! boundaries, the append paths, the fused step, chunks and truncation.

mod common;

use common::{Rng, attend_poisoned, ctx, rel_err, storage_buffer};
use kvq::codec::CodecRef;
use kvq::{CacheSpec, InputType, KvCache, KvCodecs, KvqError, Precision, reference};

const TOL: f64 = 1e-3;
/// What `Precision::Fast` (f16 products) promises against the reference.
const FAST_TOL: f64 = 1e-2;
/// How much worse (relative RMS error) a stored K row may encode `k - mean` than the CPU
/// reference's encoder: rounding-boundary ties, and the GPU encoding the f32 input where this
/// test keeps its f16 rounding.
const CODE_TOL: f64 = 0.01;

/// A cache with a host copy of every appended token (f16-rounded, `[len, kv_heads, d]` per
/// layer and sequence) and each sequence's `exact_lo` as the cache keeps it.
struct Checked {
    cache: KvCache,
    k: Vec<Vec<Vec<f64>>>,
    v: Vec<Vec<Vec<f64>>>,
    exact_lo: Vec<u32>,
    rng: Rng,
}

impl Checked {
    fn new(spec: CacheSpec, seed: u64) -> Checked {
        let (l, b) = (spec.layers as usize, spec.batch as usize);
        Checked {
            cache: KvCache::new(ctx(), spec).expect("cache"),
            k: vec![vec![Vec::new(); b]; l],
            v: vec![vec![Vec::new(); b]; l],
            exact_lo: vec![0; b],
            rng: Rng::new(seed),
        }
    }

    fn spec(&self) -> CacheSpec {
        self.cache.spec().clone()
    }

    /// `n` random tokens per sequence, `[batch, n, kv_heads, d]`, K heavier-tailed now and then.
    fn tokens(&mut self, n: usize) -> (Vec<f32>, Vec<f32>) {
        let s = self.spec();
        let len = s.batch as usize * n * (s.kv_heads * s.head_dim) as usize;
        // With K's mean removed, K gets channel means of its own (as real K has), up to 4.
        let d = s.head_dim as usize;
        let shift = |i: usize| {
            if s.exact.k_mean {
                4.0 * ((i % d) as f32 * 0.7).sin()
            } else {
                0.0
            }
        };
        let k = (0..len)
            .map(|i| self.rng.normal() * if i % 37 == 0 { 6.0 } else { 1.0 } + shift(i))
            .collect();
        (k, self.rng.normals(len, 1.0))
    }

    fn record(&mut self, layer: u32, k: &[f32], v: &[f32]) {
        let batch = self.spec().batch as usize;
        let per = k.len() / batch;
        for b in 0..batch {
            let r = b * per..(b + 1) * per;
            self.k[layer as usize][b].extend(reference::round_f16(&k[r.clone()]));
            self.v[layer as usize][b].extend(reference::round_f16(&v[r]));
        }
    }

    fn append(&mut self, layer: u32, n: usize) {
        let (k, v) = self.tokens(n);
        self.cache.append_host(layer, &k, &v).expect("append");
        self.record(layer, &k, &v);
    }

    fn len(&self, layer: u32, b: usize) -> usize {
        let s = self.spec();
        self.k[layer as usize][b].len() / (s.kv_heads * s.head_dim) as usize
    }

    /// K's mean over sequence b's sink (`[kv_heads, d]`) as the GPU takes it: the f16 rows
    /// summed in f32 in position order, then divided; zeros without `k_mean` or a full sink.
    fn k_mean(&self, layer: u32, b: usize) -> Vec<f64> {
        let s = self.spec();
        let (d, kvh, sink) = (
            s.head_dim as usize,
            s.kv_heads as usize,
            s.exact.sink as usize,
        );
        let mut mean = vec![0.0; kvh * d];
        if !s.exact.k_mean || self.len(layer, b) < sink {
            return mean;
        }
        let hk = &self.k[layer as usize][b];
        for (i, m) in mean.iter_mut().enumerate() {
            let sum = (0..sink).fold(0.0f32, |a, p| a + hk[p * kvh * d + i] as f32);
            *m = (sum / sink as f32) as f64;
        }
        mean
    }

    /// f64 attention of query `q` (`[q_heads, d]`) of sequence `b` over positions `0..end`,
    /// positions from `ring_lo` on (and the sink's) from their f16 copies, the others from the
    /// stored rows `rows` (read_rows) decoded (plus K's mean where the cache removes it); and
    /// each query head's log-sum-exp of its scaled scores.
    fn want(
        &self,
        layer: u32,
        b: usize,
        q: &[f32],
        end: usize,
        ring_lo: usize,
        rows: &(Vec<u32>, Vec<u32>),
    ) -> Vec<f64> {
        self.want_with_lse(layer, b, q, end, ring_lo, rows).0
    }

    fn want_with_lse(
        &self,
        layer: u32,
        b: usize,
        q: &[f32],
        end: usize,
        ring_lo: usize,
        rows: &(Vec<u32>, Vec<u32>),
    ) -> (Vec<f64>, Vec<f64>) {
        let s = self.spec();
        let (d, kvh, qh) = (s.head_dim as usize, s.kv_heads as usize, s.q_heads as usize);
        let kref = CodecRef::new(s.codecs.k, s.head_dim, s.seed).unwrap();
        let vref = CodecRef::new(s.codecs.v, s.head_dim, s.seed).unwrap();
        let (kw, vw) = (kref.layout().words as usize, vref.layout().words as usize);
        let row = |h: usize, t: usize| (b * kvh + h) * s.capacity as usize + t;
        let exact = |t: usize| t < s.exact.sink as usize || t >= ring_lo;
        let (hk, hv) = (&self.k[layer as usize][b], &self.v[layer as usize][b]);
        let mean = self.k_mean(layer, b);
        let mut k = Vec::with_capacity(end * kvh * d);
        let mut v = Vec::with_capacity(end * kvh * d);
        for t in 0..end {
            for h in 0..kvh {
                let at = (t * kvh + h) * d..(t * kvh + h + 1) * d;
                if exact(t) {
                    k.extend(&hk[at.clone()]);
                    v.extend(&hv[at]);
                } else {
                    let r = row(h, t);
                    let dec = kref.decode(&rows.0[r * kw..(r + 1) * kw]);
                    k.extend(
                        dec.iter()
                            .zip(&mean[h * d..(h + 1) * d])
                            .map(|(x, m)| x + m),
                    );
                    v.extend(vref.decode(&rows.1[r * vw..(r + 1) * vw]));
                }
            }
        }
        let qb: Vec<f64> = q.iter().map(|&x| x as f64).collect();
        let scale = s.softmax_scale() as f64;
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        let score = |qi: usize, h: usize, t: usize| {
            let qv = &qb[qi * d..(qi + 1) * d];
            if s.codecs.k.qjl && !exact(t) {
                let r = row(h, t);
                let ip = kref.ip_estimate(&rows.0[r * kw..(r + 1) * kw], qv);
                return scale * (ip + dot(qv, &mean[h * d..(h + 1) * d]));
            }
            scale * dot(qv, &k[(t * kvh + h) * d..(t * kvh + h + 1) * d])
        };
        let g = qh / kvh;
        let lse = (0..qh)
            .map(|qi| {
                let sc: Vec<f64> = (0..end).map(|t| score(qi, qi / g, t)).collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                m + sc.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
            })
            .collect();
        (reference::attention_with_scores(&v, qh, kvh, d, score), lse)
    }

    /// With K's mean removed: every stored K row past the sink encodes `k - mean` about as
    /// well as the CPU reference's encoder does (attention over the stored rows alone cannot
    /// tell what the encoder was given). The worst excess relative error over the rows.
    fn check_k_codes(&self, layer: u32) -> f64 {
        let s = self.spec();
        let (d, kvh) = (s.head_dim as usize, s.kv_heads as usize);
        let kref = CodecRef::new(s.codecs.k, s.head_dim, s.seed).unwrap();
        let kw = kref.layout().words as usize;
        let rows = self.cache.read_rows(layer).unwrap();
        let err = |dec: &[f64], x: &[f32]| {
            let (mut e, mut n) = (0.0, 0.0);
            for (a, &b) in dec.iter().zip(x) {
                e += (a - b as f64).powi(2);
                n += (b as f64).powi(2);
            }
            (e / n.max(1e-30)).sqrt()
        };
        let mut worst = 0.0f64;
        for b in 0..s.batch as usize {
            let mean = self.k_mean(layer, b);
            for t in s.exact.sink as usize..self.len(layer, b) {
                for h in 0..kvh {
                    let at = (t * kvh + h) * d;
                    let x: Vec<f32> = (0..d)
                        .map(|i| (self.k[layer as usize][b][at + i] - mean[h * d + i]) as f32)
                        .collect();
                    let r = (b * kvh + h) * s.capacity as usize + t;
                    let gpu = err(&kref.decode(&rows.0[r * kw..(r + 1) * kw]), &x);
                    let cpu = err(&kref.decode(&kref.encode(&x)), &x);
                    worst = worst.max(gpu - cpu);
                }
            }
        }
        worst
    }

    /// Caller buffers of fused steps of up to `n` tokens (K, V, query, output), zeroed.
    fn step_buffers(&self, n: usize) -> [wgpu::Buffer; 4] {
        let s = self.spec();
        let kv = s.batch as usize * n * (s.kv_heads * s.head_dim) as usize;
        let q = (s.batch * s.q_heads * s.head_dim) as usize;
        [kv, kv, q, q].map(|len| storage_buffer(ctx(), &vec![0.0; len]))
    }

    /// A fused step of `io`'s tokens on `layer` with random K/V written into `bufs` (from
    /// step_buffers); the worst relative error of a random query attended after it.
    fn step(&mut self, layer: u32, io: &kvq::StepIo, bufs: &[wgpu::Buffer; 4]) -> f64 {
        let (k, v) = self.tokens(io.tokens() as usize);
        ctx()
            .queue
            .write_buffer(&bufs[0], 0, bytemuck::cast_slice(&k));
        ctx()
            .queue
            .write_buffer(&bufs[1], 0, bytemuck::cast_slice(&v));
        let mut enc = ctx().device.create_command_encoder(&Default::default());
        self.cache.step(&mut enc, layer, io).unwrap();
        ctx().queue.submit([enc.finish()]);
        self.record(layer, &k, &v);
        self.check(layer)
    }

    /// The first ring position of sequence b holding `len` tokens (`KvCache`'s rule).
    fn ring_lo(&self, b: usize, len: usize) -> usize {
        let x = self.spec().exact;
        let lo = (x.sink as usize)
            .max(len.saturating_sub(x.recent as usize))
            .max(self.exact_lo[b] as usize);
        lo.min(len)
    }

    /// Attends a random query on `layer`; the worst relative error over the sequences.
    fn check(&mut self, layer: u32) -> f64 {
        let s = self.spec();
        let n = (s.q_heads * s.head_dim) as usize;
        let q = self.rng.normals(s.batch as usize * n, 1.5);
        let out = attend_poisoned(&self.cache, layer, &q);
        let rows = self.cache.read_rows(layer).unwrap();
        let mut worst = 0.0f64;
        for b in 0..s.batch as usize {
            let len = self.len(layer, b);
            let want = self.want(
                layer,
                b,
                &q[b * n..(b + 1) * n],
                len,
                self.ring_lo(b, len),
                &rows,
            );
            worst = worst.max(rel_err(&out[b * n..(b + 1) * n], &want));
        }
        worst
    }

    fn truncate(&mut self, b: usize, len: usize) {
        let s = self.spec();
        let per = (s.kv_heads * s.head_dim) as usize;
        let cur = self.len(0, b);
        self.cache.truncate(b as u32, len as u32).unwrap();
        let e = &mut self.exact_lo[b];
        *e = (len as u32).min((*e).max((cur as u32).saturating_sub(s.exact.ring())));
        for l in 0..s.layers as usize {
            self.k[l][b].truncate(len * per);
            self.v[l][b].truncate(len * per);
        }
    }
}

/// A cache of codecs `name`, head_dim `d`, GQA `g` (one KV head from 7 on, else two), 2
/// sequences, 3 splits and `sink` + `recent` exact tokens.
fn case_spec(name: &str, d: u32, g: u32, sink: u32, recent: u32) -> CacheSpec {
    let kvh = if g >= 7 { 1 } else { 2 };
    CacheSpec::new(1, kvh * g, kvh, d, 300)
        .with_codecs(KvCodecs::parse(name).unwrap())
        .with_splits(3)
        .with_batch(2)
        .with_exact(sink, recent)
}

/// Every codec family (QJL included), each head_dim and GQA ratio in turn, growing across the
/// sink's end, the ring's wraps, split boundaries and the wide append path, then cut back.
#[test]
fn exact_tokens_match_reference() {
    let cases = [
        ("q4_sym", 64, 8, 4, 8),
        ("turbo3_sym", 128, 4, 3, 5),
        ("k_rotor3", 96, 2, 1, 16),
        ("k=turbo2b+qjl,v=iso4", 256, 1, 4, 0),
        ("k=q8,v=rotor4", 128, 7, 0, 12),
        ("none", 64, 4, 2, 3),
    ];
    for (i, &(name, d, g, sink, recent)) in cases.iter().enumerate() {
        let mut c = Checked::new(case_spec(name, d, g, sink, recent), 100 + i as u64);
        let mut len = 0;
        for target in [1usize, 2, 5, 9, 17, 33, 70, 130, 259] {
            c.append(0, target - len);
            len = target;
            let e = c.check(0);
            assert!(e <= TOL, "{name} d={d} g={g} len={len}: rel err {e:e}");
        }
        // Cut back past the ring (its older slots overwritten), then grow again.
        c.truncate(0, 240);
        c.truncate(1, 3);
        for more in [1usize, 7, 30] {
            c.append(0, more);
            let e = c.check(0);
            assert!(e <= TOL, "{name} after truncate: rel err {e:e}");
        }
    }
}

/// Storage segments (the exact rows are written once, by the segment holding the position)
/// and fused decode steps, whose split 0 writes the new token's copy and attends it.
#[test]
fn exact_tokens_with_segments_and_fused_steps() {
    for name in ["turbo3_sym", "k=q4,v=none"] {
        let mut spec = CacheSpec::new(2, 8, 2, 128, 200)
            .with_codecs(KvCodecs::parse(name).unwrap())
            .with_splits(3)
            .with_batch(2)
            .with_exact(4, 8);
        spec.segment_tokens = Some(64);
        let mut c = Checked::new(spec, 7);
        c.append(1, 60);
        let bufs = c.step_buffers(1);
        let [kb, vb, qb, ob] = &bufs;
        let io = c.cache.step_io(kb, vb, 1, InputType::F32, qb, ob).unwrap();
        for step in 0..12 {
            let e = c.step(1, &io, &bufs);
            assert!(e <= TOL, "{name} step {step}: rel err {e:e}");
        }
    }
}

/// A chunk of new tokens: query i attends positions up to its own, the sink and the `recent`
/// positions up to its own exact, as a decode step at its position would, also in a chunk
/// longer than a slice (appended and attended slice by slice) across storage segments.
#[test]
fn exact_tokens_in_chunks() {
    // Each chunk by the split kernel, most by the prefill kernel too (its exact workgroup attends
    // the sink and the ring, its code workgroups mask each row's ring); a sink without a
    // ring too; some by the prefill kernel with f16 products (`fast`, to its own tolerance).
    let cases = [
        ("q4_sym", 5usize, None, 6),
        ("turbo4_sym", 20, None, 6),
        ("k_iso3", 3, None, 6),
        ("k=q8,v=turbo3", 150, Some(64), 6),
        ("k_turbo3+qjl", 70, None, 0),
        ("iso3_sym", 40, None, 0),
    ];
    // (The prefill kernel with f32 products on four of them: q4_sym takes it with f16
    // products below, k_iso3 with f16 products in k_mean_in_chunks; each cache compiles its
    // own kernels, lavapipe's cost.)
    let fast = [cases[0], cases[3], cases[4]].map(|c| (c, true, true, None));
    let tiled = |name: &str| !matches!(name, "q4_sym" | "k_iso3");
    // A chunk of fewer splits than the decode's (its partials packed by its own count, the
    // exact workgroup after them) across segments, by both kernels: the same kernels as
    // above, so lavapipe compiles nothing more.
    let fewer = [false, true].map(|prefill| (cases[3], prefill, false, Some(1)));
    for ((name, n, seg, recent), prefill, fast, chunk_splits) in cases
        .into_iter()
        .flat_map(|c| [(c, false, false, None), (c, true, false, None)])
        .filter(|&(c, prefill, _, _)| !prefill || tiled(c.0))
        .chain(fast)
        .chain(fewer)
    {
        let mut spec = CacheSpec::new(1, 8, 2, 64, 200)
            .with_codecs(KvCodecs::parse(name).unwrap())
            .with_splits(2)
            .with_exact(2, recent);
        spec.segment_tokens = seg;
        spec.chunk_splits = chunk_splits;
        if prefill {
            spec = spec.with_prefill_from(1);
        }
        spec = spec.with_precision(match fast {
            true => Precision::Fast,
            false => Precision::Exact,
        });
        let mut c = Checked::new(spec, 11);
        assert_eq!(c.cache.kernel_config().precision, c.spec().precision);
        c.append(0, 40);
        let (k, v) = c.tokens(n);
        let s = c.spec();
        let per_q = (s.q_heads * s.head_dim) as usize;
        let q = c.rng.normals(n * per_q, 1.5);
        let out = c.cache.chunk_host(0, &k, &v, &q).unwrap();
        c.record(0, &k, &v);
        let rows = c.cache.read_rows(0).unwrap();
        let total = c.len(0, 0);
        let mut worst = 0.0f64;
        for i in 0..n {
            let end = total - n + i + 1;
            let want = c.want(
                0,
                0,
                &q[i * per_q..(i + 1) * per_q],
                end,
                c.ring_lo(0, end),
                &rows,
            );
            worst = worst.max(rel_err(&out[i * per_q..(i + 1) * per_q], &want));
        }
        assert!(
            worst <= if fast { FAST_TOL } else { TOL },
            "{name} n={n} (prefill kernel: {prefill}, f16: {fast}, chunk splits \
             {chunk_splits:?}): rel err {worst:e}"
        );
    }
}

/// K's mean removed (`ExactTokens::k_mean`) in every family, K given channel means of its
/// own: the mean taken when an append or a fused step completes the sink (by the small and the
/// wide append path, in one segment and across several), recomputed after a cut below it.
#[test]
fn k_mean_matches_reference() {
    let cases = [
        ("k_iso3", 64, 4, 4, 8),
        ("k_rotor3", 96, 2, 5, 16),
        ("turbo3_sym", 128, 1, 3, 5),
        ("k=turbo2b+qjl,v=iso4", 256, 2, 4, 0),
        ("q4_sym", 64, 8, 2, 6),
        ("none", 64, 3, 1, 3),
    ];
    for (i, &(name, d, g, sink, recent)) in cases.iter().enumerate() {
        let spec = case_spec(name, d, g, sink, recent).with_k_mean();
        let mut c = Checked::new(spec.clone(), 200 + i as u64);
        let mut len = 0;
        for target in [1usize, 2, 5, 9, 17, 70, 259] {
            c.append(0, target - len);
            len = target;
            let e = c.check(0);
            assert!(e <= TOL, "{name} d={d} g={g} len={len}: rel err {e:e}");
        }
        let e = c.check_k_codes(0);
        assert!(e <= CODE_TOL, "{name}: K codes off by {e:e}");
        // Below the sink and back (the mean taken again, from other tokens).
        c.truncate(0, 1);
        c.truncate(1, 200);
        for more in [30usize, 2] {
            c.append(0, more);
            let e = c.check(0);
            assert!(e <= TOL, "{name} after truncate: rel err {e:e}");
        }
        let e = c.check_k_codes(0);
        assert!(e <= CODE_TOL, "{name} after truncate: K codes off by {e:e}");
        // The sink completed by one wide append, across storage segments.
        let mut spec = spec;
        spec.segment_tokens = Some(64);
        let mut c = Checked::new(spec, 300 + i as u64);
        c.append(0, 200);
        let e = c.check(0);
        assert!(e <= TOL, "{name} wide append over segments: rel err {e:e}");
        let e = c.check_k_codes(0);
        assert!(e <= CODE_TOL, "{name} wide append: K codes off by {e:e}");
    }
}

/// Fused steps that complete the sink (the exact workgroup stores the mean, split 0 computes
/// it for its own rows), then an append into later segments and steps again.
#[test]
fn k_mean_in_fused_steps() {
    for name in ["k_rotor3", "k=q4,v=none"] {
        let mut spec = CacheSpec::new(2, 8, 2, 128, 200)
            .with_codecs(KvCodecs::parse(name).unwrap())
            .with_splits(3)
            .with_batch(2)
            .with_exact(4, 8)
            .with_k_mean();
        spec.segment_tokens = Some(64);
        let mut c = Checked::new(spec, 17);
        c.append(1, 1);
        let bufs = c.step_buffers(2);
        let [kb, vb, qb, ob] = &bufs;
        for round in 0..2 {
            // Steps of two tokens, then of one (the first round crosses the sink).
            for (n, steps) in [(2u32, 3), (1, 4)] {
                let io = c.cache.step_io(kb, vb, n, InputType::F32, qb, ob).unwrap();
                for step in 0..steps {
                    let e = c.step(1, &io, &bufs);
                    assert!(
                        e <= TOL,
                        "{name} round {round} n={n} step {step}: rel err {e:e}"
                    );
                }
            }
            let e = c.check_k_codes(1);
            assert!(e <= CODE_TOL, "{name} round {round}: K codes off by {e:e}");
            c.append(1, 60);
        }
    }
}

/// A chunk that completes the sink: its queries' outputs and log-sum-exps (which add q . mean
/// back) against the reference.
#[test]
fn k_mean_in_chunks() {
    let cases = [
        ("k_iso3", 1usize, 20usize),
        ("turbo4_sym", 0, 7),
        ("q4_sym", 30, 5),
        ("k_rotor3", 2, 100),
    ];
    // Each by the split kernel; by the prefill kernel with f32 products the int and the
    // turbo ones, with f16 products (to their own tolerance) the iso and rotor ones (each
    // cache compiles its own kernels, lavapipe's cost).
    let fast = [cases[0], cases[3]].map(|c| (c, true, true));
    for ((name, pre, n), prefill, fast) in cases
        .into_iter()
        .flat_map(|c| [(c, false, false), (c, true, false)])
        .filter(|&(c, prefill, _)| !prefill || matches!(c.0, "turbo4_sym" | "q4_sym"))
        .chain(fast)
    {
        let mut spec = CacheSpec::new(1, 8, 2, 64, 200)
            .with_codecs(KvCodecs::parse(name).unwrap())
            .with_splits(2)
            .with_batch(2)
            .with_exact(4, 6)
            .with_k_mean();
        if prefill {
            spec = spec.with_prefill_from(1);
        }
        spec = spec.with_precision(match fast {
            true => Precision::Fast,
            false => Precision::Exact,
        });
        let mut c = Checked::new(spec, 23);
        assert_eq!(c.cache.kernel_config().precision, c.spec().precision);
        let tol = if fast { FAST_TOL } else { TOL };
        if pre > 0 {
            c.append(0, pre);
        }
        let (k, v) = c.tokens(n);
        let s = c.spec();
        let per_q = (s.q_heads * s.head_dim) as usize;
        let rows = 2 * n;
        let q = c.rng.normals(rows * per_q, 1.5);
        let gpu = c.cache.context().clone();
        let (kb, vb, qb) = (
            storage_buffer(&gpu, &k),
            storage_buffer(&gpu, &v),
            storage_buffer(&gpu, &q),
        );
        let ob = storage_buffer(&gpu, &vec![f32::NAN; q.len()]);
        let lb = storage_buffer(&gpu, &vec![f32::NAN; rows * s.q_heads as usize]);
        let io = c
            .cache
            .chunk_io_lse(&kb, &vb, n as u32, InputType::F32, &qb, &ob, &lb)
            .unwrap();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        c.cache.chunk(&mut enc, 0, &io).unwrap();
        gpu.queue.submit([enc.finish()]);
        let out = common::read_f32(&gpu, &ob, q.len());
        let lse = common::read_f32(&gpu, &lb, rows * s.q_heads as usize);
        c.record(0, &k, &v);
        let stored = c.cache.read_rows(0).unwrap();
        let (mut worst, mut worst_lse) = (0.0f64, 0.0f64);
        for b in 0..2 {
            let total = c.len(0, b);
            for i in 0..n {
                let end = total - n + i + 1;
                let r = (b * n + i) * per_q;
                let (want, want_lse) =
                    c.want_with_lse(0, b, &q[r..r + per_q], end, c.ring_lo(b, end), &stored);
                worst = worst.max(rel_err(&out[r..r + per_q], &want));
                let at = (b * n + i) * s.q_heads as usize;
                for (qh, w) in want_lse.iter().enumerate() {
                    worst_lse = worst_lse.max(common::lse_err(lse[at + qh], *w));
                }
            }
        }
        assert!(
            worst <= tol,
            "{name} n={n} (prefill: {prefill}, f16: {fast}): rel err {worst:e}"
        );
        assert!(
            worst_lse <= tol,
            "{name} n={n} (prefill: {prefill}, f16: {fast}): log-sum-exp error {worst_lse:e}"
        );
        let e = c.check_k_codes(0);
        assert!(e <= CODE_TOL, "{name} n={n}: K codes off by {e:e}");
    }
}

#[test]
fn exact_tokens_refused_where_unsupported() {
    let base = CacheSpec::new(1, 4, 2, 64, 100).with_exact(4, 8);
    let e = KvCache::new(ctx(), base.clone().with_window(50))
        .err()
        .unwrap();
    assert!(matches!(e, KvqError::InvalidSpec(_)), "{e}");
    let e = KvCache::new(ctx(), base.with_exact(4000, 100))
        .err()
        .unwrap();
    assert!(matches!(e, KvqError::InvalidSpec(_)), "{e}");
    let c = KvCache::new(ctx(), CacheSpec::new(2, 4, 2, 64, 100).with_exact(4, 8)).unwrap();
    // (4 + 8 + EXACT_CHUNK_SLICE) rows of K and V, 64 f16 each, per KV head, and a length
    // word, per layer.
    let rows = 12 + kvq::EXACT_CHUNK_SLICE as u64;
    assert_eq!(c.memory().exact, 2 * (2 * rows * 2 * 64 * 2 + 4));
    // K's mean needs a sink to be taken over; it costs 64 f32 per KV head and layer.
    let e = KvCache::new(
        ctx(),
        CacheSpec::new(1, 4, 2, 64, 100)
            .with_exact(0, 8)
            .with_k_mean(),
    )
    .err()
    .unwrap();
    assert!(matches!(e, KvqError::InvalidSpec(_)), "{e}");
    let c = KvCache::new(
        ctx(),
        CacheSpec::new(2, 4, 2, 64, 100)
            .with_exact(4, 8)
            .with_k_mean(),
    )
    .unwrap();
    assert_eq!(
        c.memory().exact,
        2 * (2 * rows * 2 * 64 * 2 + 4 + 2 * 64 * 4)
    );
}
