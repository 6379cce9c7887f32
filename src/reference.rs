//! CPU reference attention in f64: the oracle the GPU kernels are tested against (never a
//! runtime fallback).
//!
//! [`Heads`] is the whole attention a cache computes: any GQA ratio, K and V of different
//! widths, the softmax scale, a logit softcap and per-head sink logits; [`Heads::attend`] (one
//! query per head), [`Heads::chunk`] (a chunk of new tokens, causal, within a window) and
//! [`Heads::attend_scores`] (scores from an estimator, as QJL's) return the outputs and each
//! row's log-sum-exp. A per-layer window is the window of that layer's call
//! ([`crate::CacheSpec::layer_window`]). The free functions below are the plain softmax of
//! one width, kept for the callers that need nothing more.

use crate::error::{KvqError, Result};
use crate::spec::{CacheSpec, SinkLogits};

/// One layer's attention as a cache computes it (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Heads {
    /// Query heads.
    pub q_heads: usize,
    /// KV heads; query head `qh` attends KV head `qh / (q_heads / kv_heads)`.
    pub kv_heads: usize,
    /// Values per K vector (and per query).
    pub dk: usize,
    /// Values per V vector (and per output).
    pub dv: usize,
    /// Softmax scale applied to `q · k`.
    pub scale: f64,
    /// Logit softcap `c`: a scaled score `s` becomes `c · tanh(s / c)` before the softmax.
    pub softcap: Option<f64>,
    /// One logit per query head that joins every softmax's denominator and carries no value.
    pub sinks: Option<Vec<f64>>,
}

/// Outputs and log-sum-exps of [`Heads`]' attention.
#[derive(Clone, Debug, PartialEq)]
pub struct Attended {
    /// `[queries, q_heads, dv]`.
    pub out: Vec<f64>,
    /// `[queries, q_heads]`: `ln(Σ exp(s) + exp(sink))` over the row's (softcapped, scaled)
    /// scores `s`; `-inf` for a row with no key and no sink. Another partial attention over
    /// the same queries and other keys (without the sink) merges with it exactly:
    /// `(out · e^lse + out' · e^lse') / (e^lse + e^lse')`.
    pub lse: Vec<f64>,
}

impl Heads {
    /// `q_heads` over `kv_heads` of width `d` (K and V), scale `1 / sqrt(d)`, no options.
    pub fn new(q_heads: usize, kv_heads: usize, d: usize) -> Heads {
        Heads {
            q_heads,
            kv_heads,
            dk: d,
            dv: d,
            scale: 1.0 / (d as f64).sqrt(),
            softcap: None,
            sinks: None,
        }
    }

    /// Layer `layer` of a cache of `spec`: its heads, widths, scale, softcap and that layer's
    /// sink logits. Sink logits the spec holds in a GPU buffer are not read back: an error
    /// (pass them with [`Heads::with_sinks`]).
    pub fn for_layer(spec: &CacheSpec, layer: u32) -> Result<Heads> {
        let mut h = Heads::new(
            spec.q_heads as usize,
            spec.kv_heads as usize,
            spec.head_dim as usize,
        )
        .with_widths(spec.head_dim as usize, spec.v_width() as usize)
        .with_scale(spec.softmax_scale() as f64);
        h.softcap = spec.softcap.map(f64::from);
        match &spec.sink_logits {
            None => {}
            Some(SinkLogits::Host(v)) => {
                let qh = spec.q_heads as usize;
                let at = layer as usize * qh;
                let row = v.get(at..at + qh).ok_or_else(|| {
                    KvqError::InvalidSpec(format!(
                        "sink logits: {} values for {} layers of {qh} query heads",
                        v.len(),
                        spec.layers
                    ))
                })?;
                h.sinks = Some(row.iter().map(|&x| x as f64).collect());
            }
            Some(SinkLogits::Buffer(_)) => {
                return Err(KvqError::InvalidArgument(
                    "the reference does not read sink logits from a GPU buffer: pass them with Heads::with_sinks".into(),
                ));
            }
        }
        Ok(h)
    }

    /// K (and query) width `dk`, V (and output) width `dv`; the scale stays.
    pub fn with_widths(mut self, dk: usize, dv: usize) -> Heads {
        self.dk = dk;
        self.dv = dv;
        self
    }

    /// Sets the softmax scale.
    pub fn with_scale(mut self, scale: f64) -> Heads {
        self.scale = scale;
        self
    }

    /// Sets the logit softcap.
    pub fn with_softcap(mut self, cap: f64) -> Heads {
        self.softcap = Some(cap);
        self
    }

    /// Sets one sink logit per query head.
    pub fn with_sinks(mut self, sinks: Vec<f64>) -> Heads {
        self.sinks = Some(sinks);
        self
    }

    /// Query heads per KV head.
    pub fn gqa(&self) -> usize {
        self.q_heads / self.kv_heads.max(1)
    }

    /// A scaled score as the softmax takes it: softcapped where a cap is set.
    pub fn logit(&self, scaled: f64) -> f64 {
        match self.softcap {
            Some(c) => c * (scaled / c).tanh(),
            None => scaled,
        }
    }

    /// One query per head: `q` `[q_heads, dk]` over `k` `[len, kv_heads, dk]` and `v` `[len,
    /// kv_heads, dv]`; outputs `[q_heads, dv]`.
    pub fn attend(&self, q: &[f64], k: &[f64], v: &[f64]) -> Attended {
        let (dk, kvh) = (self.dk, self.kv_heads);
        self.attend_scores(v, |qh, h, t| {
            let kv = &k[(t * kvh + h) * dk..][..dk];
            let qv = &q[qh * dk..(qh + 1) * dk];
            self.scale * qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>()
        })
    }

    /// One query per head with the scaled scores given by `score(query head, kv head, token)`
    /// (before the softcap): for estimators such as QJL's, whose scores are not a dot product
    /// with a stored vector. `v`: `[len, kv_heads, dv]`.
    pub fn attend_scores(&self, v: &[f64], score: impl Fn(usize, usize, usize) -> f64) -> Attended {
        let (dv, kvh) = (self.dv, self.kv_heads);
        let len = v.len() / (kvh * dv).max(1);
        let g = self.gqa();
        let mut out = vec![0.0; self.q_heads * dv];
        let mut lse = vec![f64::NEG_INFINITY; self.q_heads];
        for qh in 0..self.q_heads {
            let h = qh / g;
            let s: Vec<f64> = (0..len).map(|t| self.logit(score(qh, h, t))).collect();
            let sink = self.sinks.as_ref().map(|x| x[qh]);
            let m = s
                .iter()
                .chain(sink.as_ref())
                .cloned()
                .fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY {
                continue;
            }
            let mut l = sink.map_or(0.0, |x| (x - m).exp());
            let o = &mut out[qh * dv..(qh + 1) * dv];
            for (t, &st) in s.iter().enumerate() {
                let p = (st - m).exp();
                l += p;
                for (oi, vi) in o.iter_mut().zip(&v[(t * kvh + h) * dv..][..dv]) {
                    *oi += p * vi;
                }
            }
            o.iter_mut().for_each(|x| *x /= l);
            lse[qh] = m + l.ln();
        }
        Attended { out, lse }
    }

    /// Causal attention of a chunk of `n` new tokens, the last `n` of `len` positions: new
    /// token `i` (position `len - n + i`) attends the positions up to its own, the last
    /// `window` of them where one is set. `q`: `[n, q_heads, dk]`; `k`: `[len, kv_heads,
    /// dk]`, `v`: `[len, kv_heads, dv]`; outputs `[n, q_heads, dv]`, log-sum-exps `[n,
    /// q_heads]`.
    pub fn chunk(&self, q: &[f64], k: &[f64], v: &[f64], window: Option<usize>) -> Attended {
        let (kvh, qh) = (self.kv_heads, self.q_heads);
        let n = q.len() / (qh * self.dk).max(1);
        let len = k.len() / (kvh * self.dk).max(1);
        let (kr, vr) = (kvh * self.dk, kvh * self.dv);
        let mut all = Attended {
            out: Vec::with_capacity(n * qh * self.dv),
            lse: Vec::with_capacity(n * qh),
        };
        for i in 0..n {
            let end = len - n + i + 1;
            let start = window.map_or(0, |w| end.saturating_sub(w));
            let a = self.attend(
                &q[i * qh * self.dk..(i + 1) * qh * self.dk],
                &k[start * kr..end * kr],
                &v[start * vr..end * vr],
            );
            all.out.extend(a.out);
            all.lse.extend(a.lse);
        }
        all
    }
}

/// Exact softmax attention for one query vector per query head.
///
/// `q`: `[q_heads, d]`; `k`, `v`: `[len, kv_heads, d]`; returns `[q_heads, d]`. Query head
/// `qh` attends KV head `qh / (q_heads / kv_heads)`. ([`Heads::attend`] with no options.)
pub fn attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    q_heads: usize,
    kv_heads: usize,
    d: usize,
    scale: f64,
) -> Vec<f64> {
    Heads::new(q_heads, kv_heads, d)
        .with_scale(scale)
        .attend(q, k, v)
        .out
}

/// Softmax attention with the scores given by `score(query head, kv head, token)` (already
/// scaled): for estimators such as QJL's, whose scores are not a dot product with a stored
/// vector. `v`: `[len, kv_heads, d]`; returns `[q_heads, d]`. ([`Heads::attend_scores`] with
/// no options.)
pub fn attention_with_scores(
    v: &[f64],
    q_heads: usize,
    kv_heads: usize,
    d: usize,
    score: impl Fn(usize, usize, usize) -> f64,
) -> Vec<f64> {
    Heads::new(q_heads, kv_heads, d).attend_scores(v, score).out
}

/// Exact causal attention of a chunk of `n` new tokens, the last `n` of `len` positions:
/// new token `i` (position `len - n + i`) attends the positions up to its own, the last
/// `window` of them where one is set. ([`Heads::chunk`] with no options.)
///
/// `q`: `[n, q_heads, d]`; `k`, `v`: `[len, kv_heads, d]`; returns `[n, q_heads, d]`.
#[allow(clippy::too_many_arguments)]
pub fn chunk_attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    q_heads: usize,
    kv_heads: usize,
    d: usize,
    scale: f64,
    window: Option<usize>,
) -> Vec<f64> {
    Heads::new(q_heads, kv_heads, d)
        .with_scale(scale)
        .chunk(q, k, v, window)
        .out
}

/// Rounds values to f16 and back, as the `none` codec stores them.
pub fn round_f16(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| half::f16::from_f32(v).to_f64()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded values in [-1, 1).
    fn values(seed: u64, n: usize) -> Vec<f64> {
        let mut r = crate::codec::rotation::SplitMix64::new(seed);
        (0..n).map(|_| r.next_f64() * 2.0 - 1.0).collect()
    }

    /// Attention of one query row over `keys`, written out from the softmax's definition.
    fn by_definition(
        q: &[f64],
        keys: &[&[f64]],
        vals: &[&[f64]],
        scale: f64,
        cap: Option<f64>,
        sink: Option<f64>,
    ) -> (Vec<f64>, f64) {
        let s: Vec<f64> = keys
            .iter()
            .map(|k| {
                let x = scale * q.iter().zip(*k).map(|(a, b)| a * b).sum::<f64>();
                cap.map_or(x, |c| c * (x / c).tanh())
            })
            .collect();
        let z: f64 = s.iter().map(|x| x.exp()).sum::<f64>() + sink.map_or(0.0, f64::exp);
        let mut o = vec![0.0; vals.first().map_or(0, |v| v.len())];
        for (x, v) in s.iter().zip(vals) {
            for (oi, vi) in o.iter_mut().zip(*v) {
                *oi += x.exp() / z * vi;
            }
        }
        (o, z.ln())
    }

    #[test]
    fn every_option_matches_the_softmax_written_out() {
        // GQA 3 (6 query heads over 2 KV heads), K 24 wide, V 16, softcap, sinks.
        let (qh, kvh, dk, dv, len) = (6, 2, 24, 16, 5);
        let q = values(1, qh * dk);
        let k = values(2, len * kvh * dk);
        let v = values(3, len * kvh * dv);
        let sinks = values(4, qh);
        for (cap, sink) in [
            (None, false),
            (Some(0.7), false),
            (None, true),
            (Some(1.5), true),
        ] {
            let mut heads = Heads::new(qh, kvh, dk).with_widths(dk, dv).with_scale(0.9);
            if let Some(c) = cap {
                heads = heads.with_softcap(c);
            }
            if sink {
                heads = heads.with_sinks(sinks.clone());
            }
            let got = heads.attend(&q, &k, &v);
            for i in 0..qh {
                let h = i / 3;
                let keys: Vec<&[f64]> = (0..len).map(|t| &k[(t * kvh + h) * dk..][..dk]).collect();
                let vals: Vec<&[f64]> = (0..len).map(|t| &v[(t * kvh + h) * dv..][..dv]).collect();
                let s = sink.then(|| sinks[i]);
                let (o, lse) = by_definition(&q[i * dk..][..dk], &keys, &vals, 0.9, cap, s);
                for (a, b) in got.out[i * dv..(i + 1) * dv].iter().zip(&o) {
                    assert!((a - b).abs() < 1e-12, "{cap:?} {sink} head {i}");
                }
                assert!((got.lse[i] - lse).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn a_softcap_bounds_every_logit_and_a_sink_takes_weight_from_the_values() {
        let heads = Heads::new(1, 1, 8).with_softcap(2.0);
        assert!((heads.logit(100.0) - 2.0).abs() < 1e-12);
        assert!((heads.logit(-100.0) + 2.0).abs() < 1e-12);
        assert!((heads.logit(0.01) - 0.01).abs() < 1e-6);
        // One key of value 1: without a sink the output is 1; a sink of the key's own logit
        // halves it; an empty row with a sink is zeros with the sink as its log-sum-exp.
        let (q, k, v) = (vec![0.0; 8], vec![0.0; 8], vec![1.0; 8]);
        let plain = Heads::new(1, 1, 8).attend(&q, &k, &v);
        assert!(plain.out.iter().all(|&x| (x - 1.0).abs() < 1e-12));
        let sunk = Heads::new(1, 1, 8).with_sinks(vec![0.0]).attend(&q, &k, &v);
        assert!(sunk.out.iter().all(|&x| (x - 0.5).abs() < 1e-12));
        assert!((sunk.lse[0] - 2f64.ln()).abs() < 1e-12);
        let empty = Heads::new(1, 1, 8)
            .with_sinks(vec![0.3])
            .attend(&q, &[], &[]);
        assert_eq!((empty.out, empty.lse), (vec![0.0; 8], vec![0.3]));
        assert_eq!(
            Heads::new(1, 1, 8).attend(&q, &[], &[]).lse,
            vec![f64::NEG_INFINITY]
        );
    }

    #[test]
    fn two_partials_merge_by_their_log_sum_exps_into_the_whole() {
        // The sink with the first partial only: the merge counts it once.
        let (qh, kvh, d) = (16, 1, 8);
        let q = values(5, qh * d);
        let k = values(6, 9 * kvh * d);
        let v = values(7, 9 * kvh * d);
        let heads = Heads::new(qh, kvh, d)
            .with_softcap(3.0)
            .with_sinks(values(8, qh));
        let whole = heads.attend(&q, &k, &v);
        let a = heads.attend(&q, &k[..4 * d], &v[..4 * d]);
        let plain = Heads {
            sinks: None,
            ..heads.clone()
        };
        let b = plain.attend(&q, &k[4 * d..], &v[4 * d..]);
        for i in 0..qh {
            let m = a.lse[i].max(b.lse[i]);
            let (wa, wb) = ((a.lse[i] - m).exp(), (b.lse[i] - m).exp());
            for c in 0..d {
                let x = (a.out[i * d + c] * wa + b.out[i * d + c] * wb) / (wa + wb);
                assert!((x - whole.out[i * d + c]).abs() < 1e-12);
            }
            assert!((m + (wa + wb).ln() - whole.lse[i]).abs() < 1e-12);
        }
    }

    #[test]
    fn a_chunk_is_each_tokens_own_window_and_the_free_functions_are_the_plain_case() {
        let (qh, kvh, dk, dv, len, n) = (4, 1, 8, 16, 7, 3);
        let q = values(9, n * qh * dk);
        let k = values(10, len * kvh * dk);
        let v = values(11, len * kvh * dv);
        let heads = Heads::new(qh, kvh, dk)
            .with_widths(dk, dv)
            .with_softcap(1.0);
        let got = heads.chunk(&q, &k, &v, Some(3));
        for i in 0..n {
            let end = len - n + i + 1;
            let one = heads.attend(
                &q[i * qh * dk..][..qh * dk],
                &k[(end - 3) * dk..end * dk],
                &v[(end - 3) * dv..end * dv],
            );
            assert_eq!(&got.out[i * qh * dv..][..qh * dv], &one.out[..]);
            assert_eq!(&got.lse[i * qh..][..qh], &one.lse[..]);
        }
        let plain = Heads::new(qh, kvh, dk).with_scale(0.5);
        let v8 = values(12, len * kvh * dk);
        assert_eq!(
            attention(&q[..qh * dk], &k, &v8, qh, kvh, dk, 0.5),
            plain.attend(&q[..qh * dk], &k, &v8).out
        );
        assert_eq!(
            chunk_attention(&q, &k, &v8, qh, kvh, dk, 0.5, None),
            plain.chunk(&q, &k, &v8, None).out
        );
    }

    #[test]
    fn a_layers_heads_come_from_the_spec() {
        let spec = CacheSpec::new(3, 4, 2, 64, 128)
            .with_softcap(30.0)
            .with_sink_logits((0..12).map(|i| i as f32).collect::<Vec<_>>())
            .with_layer_windows(vec![Some(16), None, Some(32)]);
        let h = Heads::for_layer(&spec, 2).unwrap();
        assert_eq!(h.sinks, Some(vec![8.0, 9.0, 10.0, 11.0]));
        assert_eq!((h.softcap, h.gqa(), h.dk, h.dv), (Some(30.0), 2, 64, 64));
        assert_eq!(
            (spec.layer_window(1), spec.layer_window(2)),
            (None, Some(32))
        );
        assert!(Heads::for_layer(&spec.clone().with_sink_logits(vec![1.0; 4]), 1).is_err());
    }
}
