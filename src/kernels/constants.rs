//! The codec constants a cache's kernels read, stored after the lengths and overflow flags
//! in the lengths buffer: each rotated side's rotation coefficients, Lloyd–Max levels and
//! boundaries, the QJL matrix, then K's means and the sink logits; where each lies and their
//! values.

use super::KernelConfig;
use crate::codec::{Codec, lloyd, rotation};

impl KernelConfig {
    /// Where each rotated side's coefficients, levels and boundaries, and the QJL matrix,
    /// lie in the codec constants (f32 indices after the lengths and overflow flags).
    pub(super) fn constant_offsets(&self) -> ConstantOffsets {
        let d = self.head_dim;
        let mut at = 0;
        let mut side = |c: Codec| {
            let rot = at;
            at += (c.kind.family().coefficient_count)(d);
            let levels = at;
            at += if c.kind.is_rotated() { 32 } else { 0 };
            SideOffsets {
                rot,
                levels,
                bounds: levels + 16,
            }
        };
        let (k, v) = (side(self.k), side(self.v));
        let qjl = at;
        let k_mean = qjl + if self.k.qjl { d * d } else { 0 };
        let sinks = k_mean + self.k_mean_words();
        ConstantOffsets {
            k,
            v,
            qjl,
            k_mean,
            sinks,
            len: sinks + self.sink_words(),
        }
    }

    /// Words of the sink logits ([`crate::CacheSpec::sink_logits`]): `[layers, q_heads]` f32,
    /// after K's means; 0 without.
    pub(crate) fn sink_words(&self) -> u32 {
        if self.sinks {
            self.layers * self.kv_heads * self.gqa
        } else {
            0
        }
    }

    /// Where the sink logits lie in [`KernelConfig::constants`] (their values are the
    /// cache's, written there by its plan or copied from the caller's buffer).
    pub(crate) fn sinks_at(&self) -> u32 {
        self.constant_offsets().sinks
    }

    /// Words of K's means ([`crate::ExactTokens::k_mean`]): `[layers, batch, kv_heads, d]` f32,
    /// after the codec constants in the lengths buffer; 0 without.
    pub(crate) fn k_mean_words(&self) -> u32 {
        if self.exact.k_mean {
            self.layers * self.batch * self.kv_heads * self.head_dim
        } else {
            0
        }
    }

    /// The codec constants the kernels read (rotation coefficients, Lloyd–Max levels and
    /// boundaries, QJL matrix: exactly the CPU reference's f32 values for `seed`; a rotor's
    /// matrices and an iso's quaternions, whose left-multiplication matrices the reference
    /// uses, one coefficient of every group before the next), as stored after the lengths and
    /// overflow flags in the lengths buffer, then K's means (zeros: a cache's state, which the
    /// kernels write once a sequence holds its sink), then room for the sink logits (zeros:
    /// the cache writes its own at [`KernelConfig::sinks_at`]).
    pub(crate) fn constants(&self, seed: u64) -> Vec<f32> {
        let d = self.head_dim as usize;
        let off = self.constant_offsets();
        let mut out = vec![0.0f32; off.len as usize];
        for (c, o) in [(self.k, off.k), (self.v, off.v)] {
            if !c.kind.is_rotated() {
                continue;
            }
            let rot = (c.kind.family().coefficients)(seed, d);
            out[o.rot as usize..][..rot.len()].copy_from_slice(&rot);
            let cb = lloyd::codebook(c.bits);
            let lv = cb.levels_f32();
            out[o.levels as usize..][..lv.len()].copy_from_slice(&lv);
            let bd = cb.boundaries_f32();
            out[o.bounds as usize..][..bd.len()].copy_from_slice(&bd);
        }
        if self.k.qjl {
            // Stored transposed (S^T, row k = column k of S): invocations computing
            // neighbouring (S x)_j then read neighbouring words.
            let s = rotation::qjl_matrix(seed, d, d);
            let st = &mut out[off.qjl as usize..][..s.len()];
            for j in 0..d {
                for k in 0..d {
                    st[k * d + j] = s[j * d + k];
                }
            }
        }
        out
    }
}

#[derive(Clone, Copy)]
pub(super) struct SideOffsets {
    pub(super) rot: u32,
    pub(super) levels: u32,
    pub(super) bounds: u32,
}

#[derive(Clone, Copy)]
pub(super) struct ConstantOffsets {
    pub(super) k: SideOffsets,
    pub(super) v: SideOffsets,
    pub(super) qjl: u32,
    pub(super) k_mean: u32,
    pub(super) sinks: u32,
    pub(super) len: u32,
}
