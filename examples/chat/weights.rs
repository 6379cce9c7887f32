//! Weight matrices as the kernels read them (`kernels/weights.wgsl`): rows of 32-value blocks,
//! each block's codes in 4, 8 or 16 32-bit words and its scale in one word beside them. A
//! GGUF's Q4_1 / Q4_0 / Q8_0 blocks are repacked into this form once at load (the same bits,
//! word-aligned: Q8_0's 34-byte blocks are not) and dequantized in the kernels; f16 and f32
//! tensors become the f16 form. `--weights f16` converts every matrix to f16 at load instead,
//! to measure what in-kernel dequantization saves.

use crate::error::{ChatError, Result};
use crate::gguf;

/// How a matrix's blocks are stored on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// 4-bit codes, f16 scale and minimum per block (Q4_1; Q4_0 with minimum -8 d).
    Q4,
    /// Signed 8-bit codes, f16 scale per block (Q8_0).
    Q8,
    /// f16 values.
    F16,
}

impl Format {
    /// The kernels' `FORMAT` constant.
    pub fn id(self) -> u32 {
        match self {
            Format::Q4 => 0,
            Format::Q8 => 1,
            Format::F16 => 2,
        }
    }

    /// Code words per block of 32 values.
    pub fn words(self) -> usize {
        match self {
            Format::Q4 => 4,
            Format::Q8 => 8,
            Format::F16 => 16,
        }
    }

    /// Scale words per block.
    pub fn scale_words(self) -> usize {
        match self {
            Format::F16 => 0,
            _ => 1,
        }
    }

    /// Bytes the GPU reads per block of 32 weights.
    pub fn block_bytes(self) -> u64 {
        4 * (self.words() + self.scale_words()) as u64
    }

    /// Parses `q4`, `q8`, `f16`.
    pub fn parse(s: &str) -> Result<Format> {
        match s {
            "q4" => Ok(Format::Q4),
            "q8" => Ok(Format::Q8),
            "f16" => Ok(Format::F16),
            _ => Err(ChatError::Argument(format!(
                "weights format '{s}': q4, q8 or f16"
            ))),
        }
    }
}

/// A matrix of `rows` x `cols` (cols a multiple of 32) in host memory, in [`Format`]'s layout.
#[derive(Clone, Debug)]
pub struct HostMatrix {
    /// Rows (outputs).
    pub rows: usize,
    /// Columns (inputs).
    pub cols: usize,
    /// The block layout.
    pub format: Format,
    /// `rows * cols / 32 * format.words()` words.
    pub codes: Vec<u32>,
    /// `rows * cols / 32 * format.scale_words()` words.
    pub scales: Vec<u32>,
}

fn f16_bits(x: f32) -> u32 {
    half::f16::from_f32(x).to_bits() as u32
}

fn f16_val(bits: u32) -> f32 {
    half::f16::from_bits(bits as u16).to_f32()
}

fn le16(b: &[u8], at: usize) -> u32 {
    u16::from_le_bytes([b[at], b[at + 1]]) as u32
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl HostMatrix {
    /// Repacks a GGUF tensor of ggml type `ty` (its raw bytes) holding `rows` x `cols`.
    pub fn from_gguf(name: &str, ty: u32, raw: &[u8], rows: usize, cols: usize) -> Result<Self> {
        if !cols.is_multiple_of(32) {
            return Err(ChatError::Shape(format!(
                "tensor {name}: {cols} columns, not a multiple of 32"
            )));
        }
        let blocks = rows * cols / 32;
        let mut m = HostMatrix {
            rows,
            cols,
            format: Format::Q4,
            codes: Vec::new(),
            scales: Vec::new(),
        };
        match ty {
            gguf::Q4_1 | 2 => {
                let size = if ty == gguf::Q4_1 { 20 } else { 18 };
                m.codes.reserve(blocks * 4);
                m.scales.reserve(blocks);
                for b in raw.chunks_exact(size) {
                    let d = le16(b, 0);
                    let (min, qs) = if ty == gguf::Q4_1 {
                        (le16(b, 2), 4)
                    } else {
                        (f16_bits(-8.0 * f16_val(d)), 2)
                    };
                    m.scales.push(d | min << 16);
                    for w in 0..4 {
                        m.codes.push(le32(b, qs + 4 * w));
                    }
                }
            }
            gguf::Q8_0 => {
                m.format = Format::Q8;
                m.codes.reserve(blocks * 8);
                m.scales.reserve(blocks);
                for b in raw.chunks_exact(34) {
                    m.scales.push(le16(b, 0));
                    for w in 0..8 {
                        m.codes.push(le32(b, 2 + 4 * w));
                    }
                }
            }
            gguf::F16 => {
                m.format = Format::F16;
                m.codes = raw.chunks_exact(4).map(|w| le32(w, 0)).collect();
            }
            gguf::F32 => {
                m.format = Format::F16;
                m.codes = raw
                    .chunks_exact(8)
                    .map(|w| {
                        let a = f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                        let b = f32::from_le_bytes([w[4], w[5], w[6], w[7]]);
                        f16_bits(a) | f16_bits(b) << 16
                    })
                    .collect();
            }
            _ => {
                return Err(ChatError::TensorType {
                    name: name.into(),
                    ty,
                });
            }
        }
        Ok(m)
    }

    fn blocks_per_row(&self) -> usize {
        self.cols / 32
    }

    /// Row `r` dequantized, as the kernels compute it (f32 arithmetic on the f16 scales).
    pub fn row(&self, r: usize) -> Vec<f32> {
        let kb = self.blocks_per_row();
        let mut out = Vec::with_capacity(self.cols);
        for b in r * kb..(r + 1) * kb {
            let w = &self.codes[b * self.format.words()..(b + 1) * self.format.words()];
            match self.format {
                Format::Q4 => {
                    let (d, m) = (
                        f16_val(self.scales[b] & 0xffff),
                        f16_val(self.scales[b] >> 16),
                    );
                    let nib = |i: usize| (w[i % 16 / 4] >> (8 * (i % 4) + 4 * (i / 16))) & 15;
                    out.extend((0..32).map(|i| nib(i) as f32 * d + m));
                }
                Format::Q8 => {
                    let d = f16_val(self.scales[b] & 0xffff);
                    out.extend(
                        (0..32).map(|i| ((w[i / 4] >> (8 * (i % 4))) as u8 as i8) as f32 * d),
                    );
                }
                Format::F16 => {
                    out.extend((0..32).map(|i| f16_val(w[i / 2] >> (16 * (i % 2)) & 0xffff)));
                }
            }
        }
        out
    }

    /// The same matrix in f16 (dequantized once).
    pub fn to_f16(&self) -> HostMatrix {
        if self.format == Format::F16 {
            return self.clone();
        }
        let codes = (0..self.rows)
            .flat_map(|r| {
                self.row(r)
                    .chunks_exact(2)
                    .map(|p| f16_bits(p[0]) | f16_bits(p[1]) << 16)
                    .collect::<Vec<_>>()
            })
            .collect();
        HostMatrix {
            rows: self.rows,
            cols: self.cols,
            format: Format::F16,
            codes,
            scales: Vec::new(),
        }
    }

    /// Row `r`'s code and scale words.
    fn row_words(&self, r: usize) -> (&[u32], &[u32]) {
        let kb = self.blocks_per_row();
        let (cw, sw) = (kb * self.format.words(), kb * self.format.scale_words());
        (
            &self.codes[r * cw..(r + 1) * cw],
            &self.scales[r * sw..(r + 1) * sw],
        )
    }

    /// The rows of `parts` one after another (one product computes all of them); parts of
    /// different formats are all converted to f16 first.
    pub fn concat(parts: &[HostMatrix]) -> HostMatrix {
        let same = parts.iter().all(|p| p.format == parts[0].format);
        let conv: Vec<HostMatrix>;
        let parts = if same {
            parts
        } else {
            conv = parts.iter().map(|p| p.to_f16()).collect();
            &conv[..]
        };
        let mut m = HostMatrix {
            rows: parts.iter().map(|p| p.rows).sum(),
            cols: parts[0].cols,
            format: parts[0].format,
            codes: Vec::new(),
            scales: Vec::new(),
        };
        for p in parts {
            m.codes.extend_from_slice(&p.codes);
            m.scales.extend_from_slice(&p.scales);
        }
        m
    }

    /// Rows `a_0, b_0, a_1, b_1, …` (a SwiGLU's gate and up rows side by side).
    pub fn interleave(a: &HostMatrix, b: &HostMatrix) -> HostMatrix {
        let (a, b) = if a.format == b.format {
            (a.clone(), b.clone())
        } else {
            (a.to_f16(), b.to_f16())
        };
        let mut m = HostMatrix {
            rows: a.rows + b.rows,
            cols: a.cols,
            format: a.format,
            codes: Vec::with_capacity(a.codes.len() + b.codes.len()),
            scales: Vec::with_capacity(a.scales.len() + b.scales.len()),
        };
        for r in 0..a.rows {
            for x in [&a, &b] {
                let (c, s) = x.row_words(r);
                m.codes.extend_from_slice(c);
                m.scales.extend_from_slice(s);
            }
        }
        m
    }
}
