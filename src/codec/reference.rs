//! The CPU reference codec: bit-exact encoder and `f64` decoder of the row layout described
//! in the [module docs](super). The GPU kernels are tested against it.

use half::f16;

use super::codecs::{Codec, RowLayout, ScaleMode};
use super::family::CodecKind;
use super::lloyd;
use super::rotation;
use crate::error::KvqError;

/// Reads the `b`-bit field (`b <= 32`) at row bit `offset` (LSB-first, may straddle words).
///
/// # Panics
/// If the field extends past the end of `row`.
pub fn get_bits(row: &[u32], offset: u32, b: u32) -> u32 {
    assert!(b <= 32, "fields are at most 32 bits");
    if b == 0 {
        return 0;
    }
    let w = (offset / 32) as usize;
    let sh = offset % 32;
    let lo = row[w] as u64;
    let hi = if sh + b > 32 { row[w + 1] as u64 } else { 0 };
    (((hi << 32) | lo) >> sh & ((1u64 << b) - 1)) as u32
}

/// Writes the low `b` bits of `value` (`b <= 32`) at row bit `offset`, replacing what was
/// there (LSB-first, may straddle words).
///
/// # Panics
/// If the field extends past the end of `row`.
pub fn put_bits(row: &mut [u32], offset: u32, b: u32, value: u32) {
    assert!(b <= 32, "fields are at most 32 bits");
    if b == 0 {
        return;
    }
    let w = (offset / 32) as usize;
    let sh = offset % 32;
    let mask = ((1u64 << b) - 1) << sh;
    let v = ((value as u64) << sh) & mask;
    row[w] = ((row[w] as u64 & !mask) | v) as u32;
    if sh + b > 32 {
        let (mask_hi, v_hi) = ((mask >> 32) as u32, (v >> 32) as u32);
        row[w + 1] = (row[w + 1] & !mask_hi) | v_hi;
    }
}

/// f16 of a non-negative scale, saturating at the largest finite f16 (65504).
fn f16_scale(s: f64) -> f16 {
    f16::from_f64(s.min(65504.0))
}

#[derive(Clone, Debug)]
enum Rotation {
    None,
    Turbo(Vec<f32>),
    Rotor(Vec<[f32; 9]>),
    Iso(Vec<[f32; 16]>),
}

/// The CPU reference of one codec at one `head_dim` and seed: codebook, rotation arrays
/// (exactly the `f32` values the GPU rotates with), QJL matrix and layout.
#[derive(Clone, Debug)]
pub struct CodecRef {
    codec: Codec,
    head_dim: usize,
    seed: u64,
    layout: RowLayout,
    levels: Vec<f64>,
    rotation: Rotation,
    qjl: Vec<f64>,
}

impl CodecRef {
    /// Builds the reference for `codec` at `head_dim` with the rotation / QJL `seed`.
    pub fn new(codec: Codec, head_dim: u32, seed: u64) -> Result<CodecRef, KvqError> {
        let layout = codec.layout(head_dim)?;
        let d = head_dim as usize;
        let rotation = match codec.kind {
            CodecKind::None | CodecKind::Sym => Rotation::None,
            CodecKind::Turbo => Rotation::Turbo(rotation::turbo_signs(seed, d)),
            CodecKind::Rotor => Rotation::Rotor(rotation::rotor_matrices(seed, d)),
            CodecKind::Iso => Rotation::Iso(rotation::iso_matrices(seed, d)),
        };
        let levels = if codec.kind.is_rotated() {
            lloyd::codebook(codec.bits)
                .levels_f32()
                .into_iter()
                .map(f64::from)
                .collect()
        } else {
            Vec::new()
        };
        let qjl = if codec.qjl {
            rotation::qjl_matrix(seed, d, d)
                .into_iter()
                .map(f64::from)
                .collect()
        } else {
            Vec::new()
        };
        Ok(CodecRef {
            codec,
            head_dim: d,
            seed,
            layout,
            levels,
            rotation,
            qjl,
        })
    }

    /// The codec.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// The head dimension `D`.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The seed the rotation and QJL matrix were drawn from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The row layout.
    pub fn layout(&self) -> &RowLayout {
        &self.layout
    }

    /// The reconstruction levels in use (`f32`-rounded Lloyd–Max levels as `f64`; empty for
    /// none/sym).
    pub fn levels(&self) -> &[f64] {
        &self.levels
    }

    /// The QJL matrix `S` in use (`m x D` row-major, `f32` values as `f64`; empty without
    /// QJL).
    pub fn qjl_matrix(&self) -> &[f64] {
        &self.qjl
    }

    /// Rotates `x` (length `D`) into the codec's code domain (length `n_codes`; rotor pads
    /// with zeros first). Identity for none/sym.
    pub fn rotate(&self, x: &[f64]) -> Vec<f64> {
        let mut y = x.to_vec();
        y.resize(self.layout.n_codes as usize, 0.0);
        match &self.rotation {
            Rotation::None => {}
            Rotation::Turbo(s) => rotation::turbo_forward(s, &mut y),
            Rotation::Rotor(m) => rotation::rotor_forward(m, &mut y),
            Rotation::Iso(m) => rotation::iso_forward(m, &mut y),
        }
        y
    }

    /// The inverse of [`CodecRef::rotate`] (transpose), dropping rotor's pad coordinates.
    pub fn unrotate(&self, y: &[f64]) -> Vec<f64> {
        let mut x = y.to_vec();
        match &self.rotation {
            Rotation::None => {}
            Rotation::Turbo(s) => rotation::turbo_inverse(s, &mut x),
            Rotation::Rotor(m) => rotation::rotor_inverse(m, &mut x),
            Rotation::Iso(m) => rotation::iso_inverse(m, &mut x),
        }
        x.truncate(self.head_dim);
        x
    }

    /// The code index of `t` (in units of the scale) against the `f32`-rounded boundaries.
    fn quantize(&self, t: f64) -> u32 {
        lloyd::codebook(self.codec.bits).quantize(t)
    }

    /// Encodes one vector into one row of `layout().words` words.
    ///
    /// # Panics
    /// If `x.len() != head_dim`.
    pub fn encode(&self, x: &[f32]) -> Vec<u32> {
        assert_eq!(x.len(), self.head_dim, "encode: expected head_dim values");
        let l = &self.layout;
        let mut row = vec![0u32; l.words as usize];
        let b = l.code_bits;
        // As the GPU encoders: a non-finite value is encoded as 0 (KvCache::append_input).
        let x: Vec<f32> = x
            .iter()
            .map(|&v| if v.is_finite() { v } else { 0.0 })
            .collect();
        let xd: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        match self.codec.kind {
            CodecKind::None => {
                for (i, &v) in x.iter().enumerate() {
                    // f16 saturates at ±65504 rather than becoming ±Inf (wgsl/codecs/f16.wgsl).
                    put_bits(
                        &mut row,
                        16 * i as u32,
                        16,
                        f16::from_f32(v.clamp(-65504.0, 65504.0)).to_bits() as u32,
                    );
                }
            }
            CodecKind::Sym => {
                let qmax = ((1i64 << (b - 1)) - 1) as f64;
                let bias = 1i64 << (b - 1);
                for (j, block) in xd.chunks(32).enumerate() {
                    let absmax = block.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                    let d = f16_scale(absmax / qmax);
                    put_bits(
                        &mut row,
                        l.side_offset_bits + 16 * j as u32,
                        16,
                        d.to_bits() as u32,
                    );
                    let d = d.to_f64();
                    for (i, &v) in block.iter().enumerate() {
                        let c = if d > 0.0 {
                            (v / d).round().clamp(-qmax, qmax) as i64
                        } else {
                            0
                        };
                        put_bits(&mut row, (32 * j + i) as u32 * b, b, (c + bias) as u32);
                    }
                }
            }
            _ => {
                let y = self.rotate(&xd);
                let scales = self.rotated_scales(&xd, &y);
                for (j, s) in scales.iter().enumerate() {
                    put_bits(
                        &mut row,
                        l.side_offset_bits + 16 * j as u32,
                        16,
                        s.to_bits() as u32,
                    );
                }
                let block = l.side_block as usize;
                for (i, &v) in y.iter().enumerate() {
                    let s = scales[i / block].to_f64();
                    let t = if s > 0.0 { v / s } else { 0.0 };
                    put_bits(&mut row, i as u32 * b, b, self.quantize(t));
                }
                if let Some(off) = l.qjl_offset_bits {
                    self.encode_qjl(&xd, off, &mut row);
                }
            }
        }
        row
    }

    /// The f16 scales of a rotated codec (`PerVector`: `||x|| / sqrt(D)`; `Block32`: block
    /// RMS of `y`).
    fn rotated_scales(&self, x: &[f64], y: &[f64]) -> Vec<f16> {
        match self.codec.scale {
            ScaleMode::PerVector => {
                let n = x.iter().map(|v| v * v).sum::<f64>().sqrt();
                vec![f16_scale(n / (self.head_dim as f64).sqrt())]
            }
            ScaleMode::Block32 => y
                .chunks(32)
                .map(|blk| {
                    f16_scale((blk.iter().map(|v| v * v).sum::<f64>() / blk.len() as f64).sqrt())
                })
                .collect(),
        }
    }

    fn encode_qjl(&self, x: &[f64], off: u32, row: &mut [u32]) {
        let l = &self.layout;
        let xhat = self.decode(row);
        let n = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        let r: Vec<f64> = if n > 0.0 {
            x.iter().zip(&xhat).map(|(a, b)| (a - b) / n).collect()
        } else {
            vec![0.0; self.head_dim]
        };
        let sr = self.qjl_project(&r);
        for (j, v) in sr.iter().enumerate() {
            put_bits(row, off + j as u32, 1, (*v >= 0.0) as u32);
        }
        let rn = r.iter().map(|v| v * v).sum::<f64>().sqrt();
        put_bits(
            row,
            l.qjl_norm_offset_bits,
            16,
            f16_scale(rn).to_bits() as u32,
        );
    }

    /// The sideband values of a row as floats (sym/rotated scales; empty for `none`).
    pub fn scales(&self, row: &[u32]) -> Vec<f64> {
        let l = &self.layout;
        (0..l.n_side)
            .map(|j| f16::from_bits(get_bits(row, l.side_offset_bits + 16 * j, 16) as u16).to_f64())
            .collect()
    }

    /// The raw code fields of a row (`n_codes` values; for `none` the f16 bit patterns).
    pub fn codes(&self, row: &[u32]) -> Vec<u32> {
        let l = &self.layout;
        (0..l.n_codes)
            .map(|i| get_bits(row, i * l.code_bits, l.code_bits))
            .collect()
    }

    /// The dequantized vector in the code domain: `ŷ_i = s * level[k_i]` for rotated codecs
    /// (length `n_codes`); the same as [`CodecRef::decode`] for none/sym.
    pub fn decode_rotated(&self, row: &[u32]) -> Vec<f64> {
        let l = &self.layout;
        let codes = self.codes(row);
        match self.codec.kind {
            CodecKind::None => codes
                .iter()
                .map(|&c| f16::from_bits(c as u16).to_f64())
                .collect(),
            CodecKind::Sym => {
                let scales = self.scales(row);
                let bias = 1i64 << (l.code_bits - 1);
                codes
                    .iter()
                    .enumerate()
                    .map(|(i, &c)| (c as i64 - bias) as f64 * scales[i / 32])
                    .collect()
            }
            _ => {
                let scales = self.scales(row);
                let block = l.side_block as usize;
                codes
                    .iter()
                    .enumerate()
                    .map(|(i, &c)| scales[i / block] * self.levels[c as usize])
                    .collect()
            }
        }
    }

    /// Decodes one row to `x̂` (length `D`, the MSE stage only; QJL bits do not change it).
    pub fn decode(&self, row: &[u32]) -> Vec<f64> {
        self.unrotate(&self.decode_rotated(row))
    }

    /// The norm `n` of the encoded vector as recovered from the row's scales (rotated
    /// codecs: `PerVector` `s · sqrt(D)`, `Block32` `sqrt(Σ len_j s_j^2)`; others: `||x̂||`).
    pub fn row_norm(&self, row: &[u32]) -> f64 {
        let l = &self.layout;
        if !self.codec.kind.is_rotated() {
            return self.decode(row).iter().map(|v| v * v).sum::<f64>().sqrt();
        }
        let scales = self.scales(row);
        match self.codec.scale {
            ScaleMode::PerVector => scales[0] * (self.head_dim as f64).sqrt(),
            ScaleMode::Block32 => {
                let n = l.n_codes as usize;
                scales
                    .iter()
                    .enumerate()
                    .map(|(j, s)| (n.min(32 * j + 32) - 32 * j) as f64 * s * s)
                    .sum::<f64>()
                    .sqrt()
            }
        }
    }

    /// `S v` for the QJL matrix (length `m`; empty without QJL). Compute it once per query.
    pub fn qjl_project(&self, v: &[f64]) -> Vec<f64> {
        let d = self.head_dim;
        self.qjl
            .chunks_exact(d)
            .map(|s| s.iter().zip(v).map(|(a, b)| a * b).sum())
            .collect()
    }

    /// The QJL residual term of the inner-product estimator for a row, given `sq = S q`
    /// ([`CodecRef::qjl_project`]): `n · sqrt(π/2)/m · ||r|| · Σ_j sq_j (±1)_j`. 0 without QJL.
    pub fn qjl_correction(&self, row: &[u32], sq: &[f64]) -> f64 {
        let l = &self.layout;
        let Some(off) = l.qjl_offset_bits else {
            return 0.0;
        };
        let rn = f16::from_bits(get_bits(row, l.qjl_norm_offset_bits, 16) as u16).to_f64();
        let m = l.qjl_bits as usize;
        let dot: f64 = (0..m)
            .map(|j| {
                if get_bits(row, off + j as u32, 1) == 1 {
                    sq[j]
                } else {
                    -sq[j]
                }
            })
            .sum();
        self.row_norm(row) * (std::f64::consts::FRAC_PI_2).sqrt() / m as f64 * rn * dot
    }

    /// Estimate of `<q, x>` from a row: `<q, x̂>` plus, with QJL, the residual term.
    pub fn ip_estimate(&self, row: &[u32], q: &[f64]) -> f64 {
        let xhat = self.decode(row);
        let base: f64 = xhat.iter().zip(q).map(|(a, b)| a * b).sum();
        if self.codec.qjl {
            base + self.qjl_correction(row, &self.qjl_project(q))
        } else {
            base
        }
    }
}
