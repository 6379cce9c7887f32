//! [`MemoryReport`]: a cache's device memory, by part, from the buffers it allocated.

use std::fmt;

use crate::codec::{Codec, CodecKind, ScaleMode};

/// Device bytes of one side's store (K or V), split by what the bytes hold.
///
/// A stored row interleaves codes and sideband (see the row layout in [`crate::codec`]), so
/// the split is the row layout's, applied to every row the store buffers hold: every byte of
/// the store buffers is in exactly one field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreBytes {
    /// Code bits: the f16 values for `none`, the integer or Lloyd–Max codes, and the QJL sign
    /// bits.
    pub codes: u64,
    /// f16 scales: one per 32 values (sym codecs, rotated codecs with per-block scales).
    pub scales: u64,
    /// f16 norms: the per-vector scale `||x|| / sqrt(D)` of rotated codecs and the QJL
    /// residual norm `||r||` (0 for `none` and the sym codecs).
    pub norms: u64,
    /// Unused bits that round each row up to whole 32-bit words.
    pub padding: u64,
}

impl StoreBytes {
    /// The split of `bytes` of store buffers holding rows of `codec` at `head_dim` (a whole
    /// number of rows).
    pub(crate) fn of_rows(codec: Codec, head_dim: u32, bytes: u64) -> StoreBytes {
        let l = match codec.layout(head_dim) {
            Ok(l) => l,
            // A cache only exists for codecs that serve its head_dim; count it all as codes.
            Err(_) => {
                return StoreBytes {
                    codes: bytes,
                    ..Default::default()
                };
            }
        };
        let row_bytes = l.words as u64 * 4;
        let rows = bytes / row_bytes;
        // Sideband and QJL norm are f16: whole bytes. Everything else of a row is a code bit
        // or padding; code fields may share a byte with nothing else but padding.
        let side = 2 * l.n_side as u64;
        let (scales, mut norms) = match (codec.kind, codec.scale) {
            (CodecKind::None, _) => (0, 0),
            (CodecKind::Sym, _) | (_, ScaleMode::Block32) => (side, 0),
            (_, ScaleMode::PerVector) => (0, side),
        };
        if l.qjl_offset_bits.is_some() {
            norms += 2;
        }
        let code_bits = (l.n_codes * l.code_bits + l.qjl_bits) as u64;
        let codes = code_bits.div_ceil(8);
        let padding = row_bytes.saturating_sub(codes + scales + norms);
        StoreBytes {
            codes: rows * codes,
            scales: rows * scales,
            norms: rows * norms,
            padding: rows * padding + bytes % row_bytes,
        }
    }

    /// All bytes of the store.
    pub fn total(&self) -> u64 {
        self.codes + self.scales + self.norms + self.padding
    }
}

/// Every byte of device memory a [`crate::KvCache`] owns, by part, from the sizes of the
/// buffers it allocated ([`crate::KvCache::memory`]).
///
/// Not included: the 16-byte parameter uniforms and the bind groups inside each io object the
/// caller prepares ([`crate::AppendInput`], [`crate::StepIo`], [`crate::ChunkIo`]: they live
/// and die with that object), a chunk scratch that a longer chunk has since replaced (kept
/// until the last [`crate::ChunkIo`] bound to it is dropped), and the caller's own buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// The K store (all layers and segments).
    pub k: StoreBytes,
    /// The V store.
    pub v: StoreBytes,
    /// Sequence lengths and overflow flags on the GPU.
    pub lengths: u64,
    /// Codec constants the kernels read (rotations, codebooks, QJL matrix; 0 for `none` and
    /// the sym codecs).
    pub constants: u64,
    /// Scratch: the decode split partials (per query head and split: output, max, sum).
    pub scratch: u64,
    /// The chunks' decode scratch, shared by every [`crate::ChunkIo`] of the cache: each of
    /// its slice's queries takes a decode query's partials (and with the prefill kernel its
    /// rotated query), 0 until the first [`crate::KvCache::chunk_io`]
    /// ([`crate::ChunkIo::scratch_bytes`]).
    pub chunk_scratch: u64,
    /// Uniform parameter buffers (one per storage segment of each layer).
    pub params: u64,
    /// The exact tokens' rows and any K means ([`crate::ExactTokens`]; 0 where the cache keeps
    /// none).
    pub exact: u64,
    /// Buffers of the host convenience API ([`crate::KvCache::append_host`] and
    /// [`crate::KvCache::attend_host`]), 0 until it is first used.
    pub host_staging: u64,
}

impl MemoryReport {
    /// K and V codes.
    pub fn codes(&self) -> u64 {
        self.k.codes + self.v.codes
    }

    /// K and V scales.
    pub fn scales(&self) -> u64 {
        self.k.scales + self.v.scales
    }

    /// K and V norms.
    pub fn norms(&self) -> u64 {
        self.k.norms + self.v.norms
    }

    /// K and V row padding.
    pub fn padding(&self) -> u64 {
        self.k.padding + self.v.padding
    }

    /// The K and V stores.
    pub fn store(&self) -> u64 {
        self.k.total() + self.v.total()
    }

    /// Every byte of every part.
    pub fn total(&self) -> u64 {
        self.store()
            + self.lengths
            + self.constants
            + self.scratch
            + self.chunk_scratch
            + self.params
            + self.exact
            + self.host_staging
    }
}

/// Bytes in binary units with three significant digits (`1.50 GiB`, `640 B`).
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    match u {
        0 => format!("{b} B"),
        _ if x >= 100.0 => format!("{x:.0} {}", UNITS[u]),
        _ if x >= 10.0 => format!("{x:.1} {}", UNITS[u]),
        _ => format!("{x:.2} {}", UNITS[u]),
    }
}

impl fmt::Display for MemoryReport {
    /// One line: the total, then each part (`K codes 1.00 GiB + K scales 64.0 MiB + …`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} = K codes {} + V codes {} + scales {} + norms {} + padding {} + lengths {} + constants {} + scratch {} + params {}",
            fmt_bytes(self.total()),
            fmt_bytes(self.k.codes),
            fmt_bytes(self.v.codes),
            fmt_bytes(self.scales()),
            fmt_bytes(self.norms()),
            fmt_bytes(self.padding()),
            fmt_bytes(self.lengths),
            fmt_bytes(self.constants),
            fmt_bytes(self.scratch),
            fmt_bytes(self.params),
        )?;
        if self.exact > 0 {
            write!(f, " + exact tokens {}", fmt_bytes(self.exact))?;
        }
        if self.chunk_scratch > 0 {
            write!(f, " + chunk scratch {}", fmt_bytes(self.chunk_scratch))?;
        }
        if self.host_staging > 0 {
            write!(f, " + host staging {}", fmt_bytes(self.host_staging))?;
        }
        Ok(())
    }
}
