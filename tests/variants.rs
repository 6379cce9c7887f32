//! The attention today's models use, on the GPU against the f64 reference (`kvq::reference::
//! Heads`) over the rows the GPU stored, with poisoned outputs and log-sum-exps:
//!
//! - sink logits (from a host slice and from a GPU buffer) and a logit softcap, alone and
//!   together and over a sliding window, each with every codec family (`none`, sym `q8`,
//!   rotated `turbo3`, a QJL K `turbo3+qjl`), through the separate attend, the fused step, and
//!   chunks by the split and the prefill kernel (with their log-sum-exps), over storage
//!   segments, odd lengths and wrapped rings;
//! - a window per layer: local rings of their own beside a global layer, each wrapping, with
//!   chunks longer than a ring's slack and a rollback within each ring's rule (and one past
//!   it refused, typed), with every codec family; a bad list of windows refused, typed;
//! - GQA groups past the 8 heads one split workgroup serves: 16 (two row groups; `none` and a
//!   QJL K) and multi-query 71 (nine, the last short; sym and rotated), with sinks and a cap;
//! - head sizes that are no multiple of 32: 80 (`none`, multi-head), 40 (`iso3`, with exact
//!   tokens) and 72 (`rotor3`), with sinks and a cap; the shapes refused, typed, by rule;
//! - a Gemma-3-shaped cache with a window per layer at 32k: under a third of the memory.
//!
//! Each codec family's cases share one shape (head_dim 64, GQA 4), so its kernels compile
//! once for all of them: the options are uniforms, not kernel text.

mod common;

use common::{
    Kept, Rng, attend_poisoned, ctx, lse_err, read_f32, rel_err, step_poisoned, storage_buffer,
};
use kvq::codec::CodecRef;
use kvq::reference::{Attended, Heads};
use kvq::{CacheSpec, InputType, KvCache, KvCodecs, Precision, SinkLogits};

const TOL: f64 = 1e-3;

/// The relative error f16 products ([`Precision::Fast`], the matrix prefill kernel's) promise
/// against the reference over the stored rows (as tests/chunk.rs holds them to).
const FAST_TOL: f64 = 1e-2;

/// A cache and its test state: the sink logits it was given (also where they came from a
/// GPU buffer) and every token appended, to check the ring holds the right ones.
struct Model {
    cache: KvCache,
    sinks: Option<Vec<f32>>,
    kept: Kept,
    rng: Rng,
}

impl Model {
    /// A cache of `spec`; `sinks` (`[layers, q_heads]`) go in from a GPU buffer where
    /// `sinks_on_gpu`, else from the host.
    fn new(spec: CacheSpec, sinks: Option<Vec<f32>>, sinks_on_gpu: bool, seed: u64) -> Model {
        Model::on(ctx(), spec, sinks, sinks_on_gpu, seed)
    }

    /// [`Model::new`] on `gpu` (a context of the tests' device with other matrix units).
    fn on(
        gpu: &kvq::GpuContext,
        mut spec: CacheSpec,
        sinks: Option<Vec<f32>>,
        sinks_on_gpu: bool,
        seed: u64,
    ) -> Model {
        if let Some(s) = &sinks {
            spec.sink_logits = Some(match sinks_on_gpu {
                true => SinkLogits::Buffer(storage_buffer(ctx(), s)),
                false => SinkLogits::Host(s.clone()),
            });
        }
        Model {
            kept: Kept::new(spec.layers, spec.batch),
            cache: KvCache::new(gpu, spec).expect("cache"),
            sinks,
            rng: Rng::new(seed),
        }
    }

    fn spec(&self) -> CacheSpec {
        self.cache.spec().clone()
    }

    /// Random K and V of `n` tokens, `[batch, n, kv_heads, d]`, recorded as `layer`'s newest.
    fn tokens(&mut self, layer: u32, n: usize) -> (Vec<f32>, Vec<f32>) {
        let s = self.spec();
        let per = (s.kv_heads * s.head_dim) as usize;
        let k = self.rng.normals(s.batch as usize * n * per, 1.0);
        let v = self.rng.normals(k.len(), 1.0);
        self.kept.record(layer, n, &k, &v);
        (k, v)
    }

    /// Cuts sequence `seq` back to `len` tokens in every layer.
    fn truncate(&mut self, seq: u32, len: u32) {
        self.cache.truncate(seq, len).expect("truncate");
        self.kept.truncate(seq, len);
    }

    fn append(&mut self, layer: u32, n: usize) {
        let (k, v) = self.tokens(layer, n);
        self.cache.append_host(layer, &k, &v).expect("append");
    }

    /// Queries of `rows` tokens per sequence, large enough that a softcap bites.
    fn queries(&mut self, rows: u32) -> Vec<f32> {
        let s = self.spec();
        self.rng
            .normals((s.batch * rows * s.q_heads * s.head_dim) as usize, 3.0)
    }

    /// A fused step of `n` tokens into `layer`: the worst error of its output.
    fn step(&mut self, layer: u32, n: usize) -> f64 {
        let (k, v) = self.tokens(layer, n);
        let q = self.queries(1);
        let out = step_poisoned(&mut self.cache, layer, n as u32, &k, &v, &q);
        self.worst(layer, 1, &q, &out, None).0
    }

    /// Attends a query over `layer` (the separate attend): the worst error.
    fn attend(&mut self, layer: u32) -> f64 {
        let q = self.queries(1);
        let out = attend_poisoned(&self.cache, layer, &q);
        self.worst(layer, 1, &q, &out, None).0
    }

    /// A chunk of `n` tokens into `layer` with each row's log-sum-exp: the worst errors of
    /// the outputs and of the log-sum-exps.
    fn chunk(&mut self, layer: u32, n: u32) -> (f64, f64) {
        let s = self.spec();
        let (k, v) = self.tokens(layer, n as usize);
        let q = self.queries(n);
        let rows = (s.batch * n * s.q_heads) as usize;
        let mk = |d: &[f32]| storage_buffer(ctx(), d);
        let (kb, vb, qb) = (mk(&k), mk(&v), mk(&q));
        let (ob, lb) = (mk(&vec![f32::NAN; q.len()]), mk(&vec![f32::NAN; rows]));
        let io = self
            .cache
            .chunk_io_lse(&kb, &vb, n, InputType::F32, &qb, &ob, &lb)
            .expect("chunk_io");
        let mut enc = ctx().device.create_command_encoder(&Default::default());
        self.cache.chunk(&mut enc, layer, &io).expect("chunk");
        ctx().queue.submit([enc.finish()]);
        let out = read_f32(ctx(), &ob, q.len());
        let lse = read_f32(ctx(), &lb, rows);
        self.worst(layer, n, &q, &out, Some(&lse))
    }

    /// Layer `layer`'s heads as the reference computes them (the sink logits from the host
    /// copy, wherever the cache took them from).
    fn heads(&self, layer: u32) -> Heads {
        let mut s = self.spec();
        s.sink_logits = self.sinks.clone().map(SinkLogits::Host);
        Heads::for_layer(&s, layer).expect("heads")
    }

    /// Worst errors of `out` (and `lse`) for the last `n` positions of each sequence of
    /// `layer` (queries `q`, `[batch, n, q_heads, d]`): f64 attention over the GPU's rows of
    /// the positions each attends (its window's, at their ring slots), decoded by the CPU
    /// codecs (a QJL K through its estimator); also checks that those slots hold those
    /// positions' tokens.
    fn worst(&self, layer: u32, n: u32, q: &[f32], out: &[f32], lse: Option<&[f32]>) -> (f64, f64) {
        let s = self.spec();
        let (krows, vrows) = self.cache.read_rows(layer).expect("rows");
        let heads = self.heads(layer);
        let (d, dv) = (s.head_dim as usize, s.v_width() as usize);
        let (qh, kvh) = (s.q_heads as usize, s.kv_heads as usize);
        let kref = CodecRef::new(s.codecs.k, s.head_dim, s.seed).unwrap();
        let vref = CodecRef::new(s.codecs.v, s.v_width(), s.seed).unwrap();
        let (kw, vw) = (kref.layout().words as usize, vref.layout().words as usize);
        let cap = s.layer_capacity(layer) as usize;
        let ring = s.layer_window(layer).is_some();
        let (mut worst, mut worst_lse) = (0.0f64, 0.0f64);
        for b in 0..s.batch as usize {
            let len = self.cache.len(layer, b as u32).unwrap() as usize;
            assert_eq!(len, self.kept.k[layer as usize][b].len());
            for i in 0..n as usize {
                let pos = len - n as usize + i;
                let lo = s
                    .layer_window(layer)
                    .map_or(0, |w| (pos + 1).saturating_sub(w as usize));
                let slot = |p: usize| if ring { p % cap } else { p };
                let row = |h: usize, p: usize| (b * kvh + h) * cap + slot(p);
                // Each position's rows: the GPU's, or where a later position of a chunk
                // attended in slices has since taken its ring slot, the CPU encoder's of its
                // token (what the GPU held when that slice was attended).
                let (mut kr, mut vr) = (Vec::new(), Vec::new());
                for p in lo..=pos {
                    for h in 0..kvh {
                        let (x, y) = (
                            &self.kept.k[layer as usize][b][p][h * d..(h + 1) * d],
                            &self.kept.v[layer as usize][b][p][h * dv..(h + 1) * dv],
                        );
                        if ring && p + cap < len {
                            kr.push(kref.encode(x));
                            vr.push(vref.encode(y));
                            continue;
                        }
                        let r = row(h, p);
                        let (krow, vrow) =
                            (&krows[r * kw..(r + 1) * kw], &vrows[r * vw..(r + 1) * vw]);
                        // The slot holds position p's token (a misplaced row is another
                        // random vector: cosine about 0).
                        let kd = kref.decode(krow);
                        let dot: f64 = kd.iter().zip(x).map(|(a, &b)| a * b as f64).sum();
                        let nn: f64 = kd.iter().map(|a| a * a).sum::<f64>().sqrt()
                            * x.iter().map(|&a| (a as f64).powi(2)).sum::<f64>().sqrt();
                        assert!(
                            dot > 0.8 * nn,
                            "layer {layer} seq {b} head {h}: slot {} of position {p} holds another token",
                            slot(p)
                        );
                        kr.push(krow.to_vec());
                        vr.push(vrow.to_vec());
                    }
                }
                // Exact tokens (CacheSpec::with_exact): the sink and the newest `recent`
                // positions up to the query's own are attended as their f16 copies.
                let ex = s.exact;
                let is_exact =
                    |p: usize| ex.any() && (p < ex.sink as usize || p + ex.recent as usize > pos);
                let (mut k, mut v) = (Vec::new(), Vec::new());
                for (t, (a, c)) in kr.iter().zip(&vr).enumerate() {
                    let (p, h) = (lo + t / kvh, t % kvh);
                    if is_exact(p) {
                        k.extend(kvq::reference::round_f16(
                            &self.kept.k[layer as usize][b][p][h * d..(h + 1) * d],
                        ));
                        v.extend(kvq::reference::round_f16(
                            &self.kept.v[layer as usize][b][p][h * dv..(h + 1) * dv],
                        ));
                    } else {
                        k.extend(kref.decode(a));
                        v.extend(vref.decode(c));
                    }
                }
                let at = (b * n as usize + i) * qh;
                let qi: Vec<f64> = q[at * d..(at + qh) * d].iter().map(|&x| x as f64).collect();
                let want: Attended = if s.codecs.k.qjl {
                    heads.attend_scores(&v, |hq, h, t| {
                        let qv = &qi[hq * d..(hq + 1) * d];
                        let dot = match is_exact(lo + t) {
                            true => k[(t * kvh + h) * d..][..d]
                                .iter()
                                .zip(qv)
                                .map(|(a, b)| a * b)
                                .sum(),
                            false => kref.ip_estimate(&kr[t * kvh + h], qv),
                        };
                        heads.scale * dot
                    })
                } else {
                    heads.attend(&qi, &k, &v)
                };
                worst = worst.max(rel_err(&out[at * d..(at + qh) * d], &want.out));
                if let Some(l) = lse {
                    for h in 0..qh {
                        worst_lse = worst_lse.max(lse_err(l[at + h], want.lse[h]));
                    }
                }
            }
        }
        (worst, worst_lse)
    }
}

/// One layer of `codecs` at head_dim 64, 8 query heads over 2 KV heads, 2 sequences, 3
/// splits, storage segments of 64 tokens, chunks of at least 48 new tokens by the prefill
/// kernel (f32 products, held to the same tolerance as the split kernel).
fn base(codecs: &str, layers: u32, capacity: u32) -> CacheSpec {
    heads(codecs, layers, 8, 2, capacity)
}

/// [`base`] with `q_heads` over `kv_heads`.
fn heads(codecs: &str, layers: u32, q_heads: u32, kv_heads: u32, capacity: u32) -> CacheSpec {
    shape(codecs, layers, q_heads, kv_heads, 64, capacity)
}

/// [`heads`] of width `d`.
fn shape(
    codecs: &str,
    layers: u32,
    q_heads: u32,
    kv_heads: u32,
    d: u32,
    capacity: u32,
) -> CacheSpec {
    let mut s = CacheSpec::new(layers, q_heads, kv_heads, d, capacity)
        .with_codecs(KvCodecs::parse(codecs).unwrap())
        .with_batch(2)
        .with_splits(3)
        .with_prefill_from(48)
        .with_precision(Precision::Exact);
    s.segment_tokens = Some(64);
    s
}

/// Appends, attends, fused steps and chunks (split and prefill kernel) of odd lengths over
/// every layer of `m`, each output (and log-sum-exp) against the reference.
fn exercise(m: &mut Model, what: &str) {
    let layers = m.spec().layers;
    for layer in 0..layers {
        m.append(layer, 45);
        let mut errs = vec![("attend", m.attend(layer)), ("step 1", m.step(layer, 1))];
        errs.push(("step 3", m.step(layer, 3)));
        let (c, l) = m.chunk(layer, 17);
        errs.extend([("chunk 17", c), ("chunk 17 lse", l)]);
        let (c, l) = m.chunk(layer, 61);
        errs.extend([("chunk 61 (prefill)", c), ("chunk 61 lse", l)]);
        errs.push(("attend", m.attend(layer)));
        // Past 160 tokens: a ring of 160 slots wraps inside the chunk.
        let (c, l) = m.chunk(layer, 41);
        errs.extend([("chunk 41", c), ("chunk 41 lse", l)]);
        errs.push(("step 1", m.step(layer, 1)));
        for (call, e) in errs {
            assert!(e <= TOL, "{what} layer {layer} {call}: error {e:.2e}");
        }
    }
}

/// Every option with `codecs`: sink logits (from the host; from a GPU buffer for the QJL K),
/// a softcap, both; both over one sliding window whose ring wraps.
fn every_option(codecs: &str, seed: u64) {
    let mut rng = Rng::new(seed);
    let sinks = rng.normals(8, 2.0);
    let on_gpu = codecs.contains("qjl");
    let cases = [
        ("sinks", base(codecs, 1, 300), Some(sinks.clone())),
        ("softcap", base(codecs, 1, 300).with_softcap(2.5), None),
        (
            "sinks + softcap",
            base(codecs, 1, 300).with_softcap(1.5),
            Some(sinks.clone()),
        ),
        (
            "sinks + softcap + window",
            base(codecs, 1, 160).with_window(90).with_softcap(4.0),
            Some(sinks.clone()),
        ),
    ];
    for (what, spec, sinks) in cases {
        let mut m = Model::new(spec, sinks, on_gpu, seed + 1);
        exercise(&mut m, &format!("{codecs} {what}"));
    }
}

/// A window per layer with `codecs` (local rings of 64 and 128 slots that wrap many times
/// beside a global layer, chunks longer than the rings' slack, then a rollback within each
/// ring's rule), with sink logits and a softcap.
fn window_per_layer(codecs: &str, seed: u64) {
    let mut rng = Rng::new(seed);
    let on_gpu = codecs.contains("qjl");
    // A window per layer: 40 (a ring of 64 slots), global, 77 (128 slots); slack 24 makes
    // a chunk of more than 25 tokens go in slices, of 20 tokens and more by the prefill
    // kernel.
    let spec = base(codecs, 3, 300)
        .with_layer_windows(vec![Some(40), None, Some(77)])
        .with_window_slack(24)
        .with_softcap(3.0)
        .with_prefill_from(20);
    assert_eq!(
        (0..3).map(|l| spec.layer_capacity(l)).collect::<Vec<_>>(),
        [64, 300, 128]
    );
    let all_sinks = rng.normals(24, 2.0);
    let mut m = Model::new(spec, Some(all_sinks), on_gpu, seed + 2);
    let what = format!("{codecs} window per layer");
    exercise(&mut m, &what);
    // Roll every layer back 5 tokens (layer 0's ring allows 64 - 40 = 24), then on.
    let len = m.cache.len(0, 1).unwrap();
    m.truncate(1, len - 5);
    for layer in 0..3 {
        let errs = [
            ("step 1 after a rollback", m.step(layer, 1)),
            ("attend", m.attend(layer)),
        ];
        for (call, e) in errs {
            assert!(e <= TOL, "{what} layer {layer} {call}: error {e:.2e}");
        }
        // A chunk (past its layer's slack) after it, and one more step: the other sequence is
        // 5 tokens ahead.
        let (c, l) = m.chunk(layer, 29);
        assert!(
            c.max(l) <= TOL,
            "{what} layer {layer} chunk 29: {c:.2e} {l:.2e}"
        );
    }
    // Layer 0 keeps 64 slots: a rollback of 25 needs a position its ring overwrote.
    let len = m.cache.len(0, 0).unwrap();
    let e = m.cache.truncate(0, len - 25).unwrap_err();
    assert!(
        matches!(&e, kvq::KvqError::InvalidArgument(msg) if msg.contains("layer 0") && msg.contains("ring of 64")),
        "{e}"
    );
    assert_eq!(m.cache.len(2, 0).unwrap(), len);
}

#[test]
fn every_option_with_none() {
    every_option("none", 7);
}

#[test]
fn every_option_with_sym_q8() {
    every_option("q8_sym", 17);
}

#[test]
fn every_option_with_rotated_turbo3() {
    every_option("turbo3_sym", 27);
}

#[test]
fn every_option_with_a_qjl_k() {
    every_option("k_turbo3+qjl", 37);
}

#[test]
fn a_window_per_layer_with_every_codec_family() {
    for (i, codecs) in ["none", "q8_sym", "turbo3_sym", "k_turbo3+qjl"]
        .into_iter()
        .enumerate()
    {
        window_per_layer(codecs, 91 + 10 * i as u64);
    }
}

#[test]
fn a_bad_window_per_layer_is_refused_typed() {
    // Each bad list is refused by KvCache::new as an invalid spec, naming what is wrong.
    let cases = [
        (vec![Some(40)], "1 entries for 2 layers"),
        (vec![Some(40), None, None], "3 entries for 2 layers"),
        (vec![None, Some(0)], "layer 1's window 0"),
        (vec![Some(301), None], "301"),
    ];
    for (windows, says) in cases {
        let spec = base("q8_sym", 2, 300).with_layer_windows(windows.clone());
        let e = KvCache::new(ctx(), spec).err().expect("refused");
        assert!(
            matches!(&e, kvq::KvqError::InvalidSpec(m) if m.contains(says)),
            "{windows:?}: {e}"
        );
    }
    // Not beside one window for every layer.
    let spec = base("q8_sym", 2, 300)
        .with_window(40)
        .with_layer_windows(vec![Some(40), None]);
    let e = KvCache::new(ctx(), spec).err().expect("refused");
    assert!(
        matches!(&e, kvq::KvqError::InvalidSpec(m) if m.contains("both")),
        "{e}"
    );
}

/// A GQA group of `q_heads / kv_heads` query heads, more than the 8 one split workgroup
/// serves, spread over row groups: every call of [`exercise`] with sink logits and a softcap
/// (and once more with a window).
fn wide_group(codecs: &str, q_heads: u32, kv_heads: u32, seed: u64) {
    let mut rng = Rng::new(seed);
    let spec = heads(codecs, 1, q_heads, kv_heads, 300).with_softcap(3.0);
    let mut m = Model::new(
        spec,
        Some(rng.normals(q_heads as usize, 2.0)),
        false,
        seed + 1,
    );
    exercise(
        &mut m,
        &format!("{codecs} {q_heads} query heads over {kv_heads}"),
    );
}

#[test]
fn gqa_16_in_two_row_groups() {
    // Qwen3-235B's group: 16 query heads per KV head (64 over 4 there), two row groups of 8.
    for (i, codecs) in ["none", "k_turbo3+qjl"].into_iter().enumerate() {
        wide_group(codecs, 32, 2, 41 + i as u64);
    }
}

#[test]
fn multi_query_71_heads_in_row_groups_the_last_one_short() {
    // Falcon-7B's multi-query attention: 71 query heads on one KV head, nine row groups of 8
    // rows, the last with 7 heads (its eighth row reads zeros and writes nothing).
    for (i, codecs) in ["q8_sym", "turbo3_sym"].into_iter().enumerate() {
        wide_group(codecs, 71, 1, 51 + i as u64);
    }
}

#[test]
fn head_sizes_that_are_no_multiple_of_32() {
    // Phi-2's 80 (multi-head), and 40 and 72 with the rotated codecs whose rows serve them
    // (iso: groups of 4, with exact tokens; rotor: groups of 3, 72 codes a tail of 8 past
    // the blocks of 32), each with sink logits and a softcap.
    let cases = [
        ("none", 80, 4, 4, false),
        ("iso3_sym", 40, 8, 2, true),
        ("rotor3_sym", 72, 6, 3, false),
    ];
    for (i, (codecs, d, qh, kvh, exact)) in cases.into_iter().enumerate() {
        let mut spec = shape(codecs, 1, qh, kvh, d, 300).with_softcap(2.0);
        if exact {
            spec = spec.with_exact(4, 16);
        }
        let mut rng = Rng::new(61 + i as u64);
        let mut m = Model::new(
            spec,
            Some(rng.normals(qh as usize, 2.0)),
            false,
            71 + i as u64,
        );
        exercise(&mut m, &format!("{codecs} head_dim {d}"));
    }
}

#[test]
fn the_matrix_prefill_kernel_serves_sinks_a_softcap_and_gqa_16() {
    // Emulated fragments of 16 (the matrix kernel's tiling, masks and softmax with its f16
    // products written out; hardware units where the adapter has them): chunks by that kernel
    // over a GQA group of 16 (rows of a tile spanning two tokens' heads), with sink logits and
    // a softcap, an f16 and a rotated K (its queries rotated by row groups first).
    let units = ctx()
        .matrix_units()
        .unwrap_or(kvq::MatrixUnits::new(16, true));
    let gpu = ctx()
        .clone()
        .with_matrix_units(Some(units))
        .expect("matrix units");
    for (i, codecs) in ["none", "turbo3_sym"].into_iter().enumerate() {
        let mut rng = Rng::new(101 + i as u64);
        let spec = heads(codecs, 1, 32, 2, 300)
            .with_softcap(2.5)
            .with_prefill_from(1)
            .with_precision(Precision::Fast);
        let mut m = Model::on(
            &gpu,
            spec,
            Some(rng.normals(32, 2.0)),
            i == 1,
            111 + i as u64,
        );
        assert!(
            m.cache.kernel_config().matrix.is_some(),
            "{codecs}: the matrix kernel"
        );
        m.append(0, 45);
        for n in [61, 17, 1, 41] {
            let (c, l) = m.chunk(0, n);
            assert!(
                c.max(l) <= FAST_TOL,
                "{codecs} matrix chunk {n}: {c:.2e} {l:.2e}"
            );
        }
    }
    // A head size that is no multiple of 32: the plan takes the other prefill kernel (its f16
    // products) instead, no error and no other answer.
    let spec = shape("none", 1, 4, 2, 80, 300)
        .with_softcap(2.5)
        .with_prefill_from(1)
        .with_precision(Precision::Fast);
    let mut rng = Rng::new(121);
    let mut m = Model::on(&gpu, spec, Some(rng.normals(4, 2.0)), false, 131);
    assert_eq!(m.cache.kernel_config().matrix, None);
    assert!(m.cache.layout().prefill.is_some());
    m.append(0, 45);
    for n in [61, 17] {
        let (c, l) = m.chunk(0, n);
        assert!(
            c.max(l) <= FAST_TOL,
            "head_dim 80 chunk {n}: {c:.2e} {l:.2e}"
        );
    }
}

#[test]
fn shapes_outside_what_the_kernels_serve_are_typed_errors_naming_the_rule() {
    let err = |s: CacheSpec| KvCache::new(ctx(), s).err().expect("refused").to_string();
    // The codecs' own rules: sym's scale blocks and turbo's Hadamard blocks of 32.
    for (codecs, d) in [("q8_sym", 40), ("k_turbo3", 80), ("turbo4_sym", 72)] {
        let e = err(shape(codecs, 1, 4, 2, d, 64));
        assert!(
            e.contains("multiple of 32") && e.contains(&d.to_string()),
            "{e}"
        );
    }
    // The head-size rule, and what the GPU kernels serve of it.
    let e = err(shape("none", 1, 4, 2, 44, 64));
    assert!(e.contains("multiple of 8"), "{e}");
    let e = err(shape("k_iso3+qjl", 1, 4, 2, 40, 64));
    assert!(e.contains("QJL") && e.contains("multiple of 32"), "{e}");
    for (dk, dv) in [(576, 512), (192, 128), (512, 512)] {
        let e = err(shape("none", 1, 16, 1, dk, 64).with_v_head_dim(dv));
        assert!(e.contains("CPU reference only"), "{e}");
    }
    // GQA: any ratio up to 128.
    let e = err(shape("none", 1, 129, 1, 64, 64));
    assert!(e.contains("GQA ratio 129"), "{e}");
}

#[test]
fn a_gemma3_shaped_cache_with_a_window_per_layer_takes_under_a_third_of_the_memory() {
    // Gemma 3's pattern: five local layers of 1,024 tokens to one global, at 32k. (Its heads
    // are 256 wide, 16 over 8; the ratio does not depend on them: this cache takes the shape
    // of the tests above, whose kernels are compiled already.)
    let windows = (0..6).map(|l| (l % 6 != 5).then_some(1024)).collect();
    let full = base("q8_sym", 6, 32768);
    let local = full.clone().with_layer_windows(windows);
    let (a, b) = (
        KvCache::new(ctx(), full).expect("global cache").memory(),
        KvCache::new(ctx(), local).expect("windowed cache").memory(),
    );
    // The store: one layer of 32,768 slots and five rings of 1,024 + 256.
    let want = (32768.0 + 5.0 * 1280.0) / (6.0 * 32768.0);
    let ratio = b.store() as f64 / a.store() as f64;
    assert!(
        (ratio - want).abs() < 1e-3,
        "store {ratio:.4}, expected {want:.4}"
    );
    let total = b.total() as f64 / a.total() as f64;
    assert!(
        total <= 1.0 / 3.0,
        "total memory {total:.3} of the global cache's"
    );
    eprintln!("window per layer: {b}\nglobal: {a}");
}
