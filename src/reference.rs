//! CPU reference attention in f64: the oracle the GPU kernels are tested against (never a
//! runtime fallback).

/// Exact softmax attention for one query vector per query head.
///
/// `q`: `[q_heads, d]`; `k`, `v`: `[len, kv_heads, d]`; returns `[q_heads, d]`. Query head
/// `qh` attends KV head `qh / (q_heads / kv_heads)`.
pub fn attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    q_heads: usize,
    kv_heads: usize,
    d: usize,
    scale: f64,
) -> Vec<f64> {
    attention_with_scores(v, q_heads, kv_heads, d, |qh, h, t| {
        let kv = &k[(t * kv_heads + h) * d..][..d];
        let qv = &q[qh * d..(qh + 1) * d];
        scale * qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>()
    })
}

/// Softmax attention with the scores given by `score(query head, kv head, token)` (already
/// scaled): for estimators such as QJL's, whose scores are not a dot product with a stored
/// vector. `v`: `[len, kv_heads, d]`; returns `[q_heads, d]`.
pub fn attention_with_scores(
    v: &[f64],
    q_heads: usize,
    kv_heads: usize,
    d: usize,
    score: impl Fn(usize, usize, usize) -> f64,
) -> Vec<f64> {
    let len = v.len() / (kv_heads * d);
    let g = q_heads / kv_heads;
    let mut out = vec![0.0; q_heads * d];
    for qh in 0..q_heads {
        let h = qh / g;
        let s: Vec<f64> = (0..len).map(|t| score(qh, h, t)).collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let mut l = 0.0;
        let o = &mut out[qh * d..(qh + 1) * d];
        for (t, &st) in s.iter().enumerate() {
            let p = (st - m).exp();
            l += p;
            for (oi, vi) in o.iter_mut().zip(&v[(t * kv_heads + h) * d..][..d]) {
                *oi += p * vi;
            }
        }
        o.iter_mut().for_each(|x| *x /= l);
    }
    out
}

/// Exact causal attention of a chunk of `n` new tokens, the last `n` of `len` positions:
/// new token `i` (position `len - n + i`) attends the positions up to its own, the last
/// `window` of them where one is set.
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
    let n = q.len() / (q_heads * d);
    let len = k.len() / (kv_heads * d);
    let row = kv_heads * d;
    (0..n)
        .flat_map(|i| {
            let end = len - n + i + 1;
            let start = window.map_or(0, |w| end.saturating_sub(w));
            attention(
                &q[i * q_heads * d..(i + 1) * q_heads * d],
                &k[start * row..end * row],
                &v[start * row..end * row],
                q_heads,
                kv_heads,
                d,
                scale,
            )
        })
        .collect()
}

/// Rounds values to f16 and back, as the `none` codec stores them.
pub fn round_f16(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| half::f16::from_f32(v).to_f64()).collect()
}
