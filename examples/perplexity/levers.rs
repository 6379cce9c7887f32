//! Candidate codec levers, tried on the CPU before any kernel is written: each layer's K/V go
//! through the codec's CPU reference (`kvq::codec::CodecRef`, the GPU's exact row layout),
//! with transforms around it that attention can undo exactly, then f64 attention runs over
//! the decoded rows. Rows named `<cache>@<levers>` in the tables; a measurement for design
//! decisions, not a kvq cache (`--levers` in the example).
//!
//! - `kmean`: subtract K's per-channel mean over the first `calib` tokens (frozen, per KV
//!   head) before encoding; decode adds it back, which a kernel does exactly by adding `q·μ`
//!   to every quantized token's score (softmax would even ignore a common shift).
//! - `kscale`: divide each K channel by its root-mean-square over the calibration tokens
//!   (after `kmean`) before encoding and multiply it back after decoding: a kernel multiplies
//!   the query by the same per-channel scales once per step, so no score changes but the
//!   codec's; outlier channels no longer set the scale of the whole block or vector.
//! - `vmean`: the same for V; a kernel adds `μ` times the quantized tokens' share of the
//!   attention weight to the output.
//! - `had`: a random-sign Walsh–Hadamard transform of each K and V vector before the codec
//!   (orthogonal: the query is transformed alike and the output transformed back), which
//!   spreads outlier channels over every coordinate before iso's and rotor's small rotations.
//! - `sink`: the first `calib` tokens stay exact (f16), as an attention sink store would keep
//!   them.
//! - `recentN`: each query sees its own and the N - 1 positions before it exact (f16), the
//!   rest through the codec, as a cache that encodes a token only once it is N tokens old
//!   would (a KIVI-style f16 residual window).

use kvq::KvCodecs;
use kvq::codec::{CodecRef, rotation};
use rayon::prelude::*;

use crate::attention::exact;
use crate::model::{Attention, Config, LayerQkv};

/// Which levers a run applies.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Levers {
    /// Subtract K's per-channel calibration mean.
    pub k_mean: bool,
    /// Scale K's channels by their calibration RMS.
    pub k_scale: bool,
    /// Subtract V's per-channel calibration mean.
    pub v_mean: bool,
    /// Random-sign Hadamard before the codec.
    pub hadamard: bool,
    /// Keep the calibration tokens exact.
    pub sink: bool,
    /// Calibration tokens (the first of the sequence).
    pub calib: usize,
    /// Positions before each query (its own included) that it sees exact; 0 for none.
    pub recent: usize,
}

impl Levers {
    /// Parses `kmean+vmean+had+sink+recent32` (any subset, `+`-separated; `ref` for none: the
    /// plain CPU reference codec) with `calib` tokens.
    pub fn parse(s: &str, calib: usize) -> Result<Levers, String> {
        let mut l = Levers {
            calib,
            ..Levers::default()
        };
        for part in s.split('+').filter(|p| *p != "ref") {
            match part {
                "kmean" => l.k_mean = true,
                "kscale" => l.k_scale = true,
                "vmean" => l.v_mean = true,
                "had" => l.hadamard = true,
                "sink" => l.sink = true,
                r if r.starts_with("recent") => {
                    let n: usize = r["recent".len()..].parse().unwrap_or(0);
                    if n == 0 || l.recent != 0 {
                        return Err(format!("bad lever '{r}' (one recentN, N at least 1 token)"));
                    }
                    l.recent = n;
                }
                _ => {
                    return Err(format!(
                        "unknown lever '{part}' (kmean, kscale, vmean, had, sink, recentN)"
                    ));
                }
            }
        }
        Ok(l)
    }

    /// Stored bits per value of a side whose codec stores `codec_bits`, over a sequence of
    /// `tokens`: the exact tokens (the first `calib` with `sink`, the last `recent`) at 16
    /// bits, the rest at `codec_bits`, and `vectors` f32 values per channel and KV head (a
    /// mean, a scale). A side kept in f16 (16 bits) stores neither.
    pub fn stored_bits(&self, codec_bits: f64, tokens: usize, vectors: u32) -> f64 {
        if codec_bits >= 16.0 {
            return codec_bits;
        }
        let t = tokens.max(1);
        let sink = if self.sink { self.calib } else { 0 };
        let exact = (sink + self.recent).min(t);
        let bits = (exact as f64 * 16.0 + (t - exact) as f64 * codec_bits) / t as f64;
        bits + 32.0 * vectors as f64 / t as f64
    }

    /// The `+`-joined name.
    pub fn name(&self) -> String {
        let mut v = Vec::new();
        for (on, n) in [
            (self.k_mean, "kmean"),
            (self.k_scale, "kscale"),
            (self.v_mean, "vmean"),
            (self.hadamard, "had"),
            (self.sink, "sink"),
        ] {
            if on {
                v.push(n.to_string());
            }
        }
        if self.recent > 0 {
            v.push(format!("recent{}", self.recent));
        }
        if v.is_empty() {
            return "ref".into();
        }
        v.join("+")
    }
}

/// The simulated cache as the model's attention.
pub struct Sim {
    cfg: Config,
    k: CodecRef,
    v: CodecRef,
    levers: Levers,
    /// Random signs of the `had` lever's Hadamard: not the turbo codec's, which would undo it.
    signs: Vec<f32>,
}

/// Seed offset of the `had` lever's signs.
const HAD_SEED: u64 = 0x6861_6461_6d61_7264;

impl Sim {
    /// A simulation of `codecs` (no QJL) with `levers`.
    pub fn new(cfg: &Config, codecs: KvCodecs, levers: Levers) -> Result<Sim, String> {
        if codecs.k.qjl {
            return Err("levers: QJL is not simulated".into());
        }
        let d = cfg.head_dim as u32;
        let seed = kvq::CacheSpec::new(1, 1, 1, d, 1).seed;
        let r = |c| CodecRef::new(c, d, seed).map_err(|e| e.to_string());
        let signs = rotation::turbo_signs(seed ^ HAD_SEED, cfg.head_dim);
        Ok(Sim {
            cfg: cfg.clone(),
            k: r(codecs.k)?,
            v: r(codecs.v)?,
            levers,
            signs,
        })
    }

    /// Rows `[tokens, kv_heads, d]` through the codec with the levers; `mean` and `scale`
    /// on or off.
    fn roundtrip(&self, x: &[f32], codec: &CodecRef, mean: bool, scale: bool) -> Vec<f32> {
        let (hk, d) = (self.cfg.kv_heads, self.cfg.head_dim);
        let tokens = x.len() / (hk * d);
        let l = &self.levers;
        let calib = l.calib.min(tokens).max(1);
        let mut out = vec![0f32; x.len()];
        for h in 0..hk {
            let mut mu = vec![0f64; d];
            if mean {
                for t in 0..calib {
                    for (m, &v) in mu.iter_mut().zip(&x[(t * hk + h) * d..][..d]) {
                        *m += v as f64 / calib as f64;
                    }
                }
            }
            let mut sc = vec![1f64; d];
            if scale {
                for (c, s) in sc.iter_mut().enumerate() {
                    let ms = (0..calib)
                        .map(|t| (x[(t * hk + h) * d + c] as f64 - mu[c]).powi(2))
                        .sum::<f64>()
                        / calib as f64;
                    *s = ms.sqrt().max(1e-6);
                }
            }
            for t in 0..tokens {
                let row = &x[(t * hk + h) * d..][..d];
                let dst = &mut out[(t * hk + h) * d..][..d];
                if l.sink && t < calib {
                    for (o, &v) in dst.iter_mut().zip(row) {
                        *o = half::f16::from_f32(v).to_f32();
                    }
                    continue;
                }
                let mut y: Vec<f64> = (0..d).map(|c| (row[c] as f64 - mu[c]) / sc[c]).collect();
                if l.hadamard {
                    rotation::turbo_forward(&self.signs, &mut y);
                }
                let yf: Vec<f32> = y.iter().map(|&v| v as f32).collect();
                let mut z = codec.decode(&codec.encode(&yf));
                if l.hadamard {
                    rotation::turbo_inverse(&self.signs, &mut z);
                }
                for (c, (o, v)) in dst.iter_mut().zip(z).enumerate() {
                    *o = (v * sc[c] + mu[c]) as f32;
                }
            }
        }
        out
    }
}

impl Attention for Sim {
    fn attend(&mut self, qkv: &LayerQkv<'_>) -> Result<Vec<f32>, String> {
        let l = self.levers;
        let k = self.roundtrip(qkv.k, &self.k, l.k_mean, l.k_scale);
        let v = self.roundtrip(qkv.v, &self.v, l.v_mean, false);
        let quant = LayerQkv {
            layer: qkv.layer,
            q: qkv.q,
            k: &k,
            v: &v,
        };
        if l.recent == 0 {
            return Ok(exact(&self.cfg, &quant)
                .into_iter()
                .map(|x| x as f32)
                .collect());
        }
        // Query t sees rows t + 1 - recent ..= t as f16, the older ones decoded.
        let f16 = |x: &[f32]| -> Vec<f32> {
            x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
        };
        let (kh, vh) = (f16(qkv.k), f16(qkv.v));
        let (hq, hk, d) = (self.cfg.q_heads, self.cfg.kv_heads, self.cfg.head_dim);
        let row = hk * d;
        let tokens = qkv.q.len() / (hq * d);
        let scale = 1.0 / (d as f64).sqrt();
        let wide = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let q = wide(qkv.q);
        let out: Vec<Vec<f64>> = (0..tokens)
            .into_par_iter()
            .map(|t| {
                let cut = (t + 1).saturating_sub(l.recent);
                let mut kk = wide(&k[..cut * row]);
                kk.extend(wide(&kh[cut * row..(t + 1) * row]));
                let mut vv = wide(&v[..cut * row]);
                vv.extend(wide(&vh[cut * row..(t + 1) * row]));
                kvq::reference::attention(&q[t * hq * d..][..hq * d], &kk, &vv, hq, hk, d, scale)
            })
            .collect();
        Ok(out.into_iter().flatten().map(|x| x as f32).collect())
    }
}
