//! KV codecs: names, stored row layout, and (in submodules) the CPU reference encoders.
//!
//! Every stored (token, kv-head) vector is one *row* of `u32` words. A codec fixes the row's
//! layout; the GPU kernels and the CPU reference read and write exactly the same bits.

use crate::error::KvqError;

/// Family of a codec: how a head vector is turned into codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CodecKind {
    /// Plain f16 storage (no quantization).
    None,
}

/// One codec applied to K or to V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Codec {
    /// The family.
    pub kind: CodecKind,
    /// Bits per code (16 for `None`).
    pub bits: u8,
}

impl Codec {
    /// Plain f16 storage.
    pub const NONE: Codec = Codec {
        kind: CodecKind::None,
        bits: 16,
    };

    /// The codec's name as used on the command line (`none`, `turbo3`, …).
    pub fn name(&self) -> String {
        match self.kind {
            CodecKind::None => "none".into(),
        }
    }

    /// Number of `u32` words one stored row of `head_dim` values takes.
    pub fn row_words(&self, head_dim: u32) -> u32 {
        match self.kind {
            CodecKind::None => head_dim / 2,
        }
    }

    /// Stored bits per value at `head_dim`, sideband included.
    pub fn bits_per_value(&self, head_dim: u32) -> f64 {
        self.row_words(head_dim) as f64 * 32.0 / head_dim as f64
    }

    /// Checks that this codec can serve vectors of `head_dim` values.
    pub fn check_head_dim(&self, head_dim: u32) -> Result<(), KvqError> {
        if head_dim % 8 != 0 || !(8..=256).contains(&head_dim) {
            return Err(KvqError::UnsupportedHeadDim {
                head_dim,
                codec: self.name(),
                reason: "head_dim must be a multiple of 8 between 8 and 256".into(),
            });
        }
        Ok(())
    }
}

/// The codecs of a cache: one for K, one for V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvCodecs {
    /// Codec for keys.
    pub k: Codec,
    /// Codec for values.
    pub v: Codec,
}

impl KvCodecs {
    /// f16 K and V.
    pub const NONE: KvCodecs = KvCodecs {
        k: Codec::NONE,
        v: Codec::NONE,
    };

    /// Every name [`KvCodecs::parse`] accepts (the general `k=…,v=…` form aside).
    pub fn valid_names() -> Vec<String> {
        vec!["none".into()]
    }

    /// The cache names `--codecs all` expands to in the sweep.
    pub fn all_names() -> Vec<String> {
        Self::valid_names()
    }

    /// Parses a cache codec name: `none`, `k_<codec>` (K only), `<codec>_sym` (K and V), or
    /// `k=<codec>,v=<codec>`.
    pub fn parse(name: &str) -> Result<KvCodecs, KvqError> {
        match name.trim() {
            "none" => Ok(KvCodecs::NONE),
            _ => Err(KvqError::UnknownCodec {
                name: name.to_string(),
                valid: Self::valid_names().join(", "),
            }),
        }
    }

    /// The canonical name of this pair (inverse of [`KvCodecs::parse`]).
    pub fn name(&self) -> String {
        if *self == KvCodecs::NONE {
            "none".into()
        } else {
            format!("k={},v={}", self.k.name(), self.v.name())
        }
    }
}
