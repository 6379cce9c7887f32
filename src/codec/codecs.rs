//! The codec types: [`Codec`] (one side's codec: its name, validation and row layout) and
//! [`KvCodecs`] (a cache's K and V codecs and their names). The layout contract they
//! implement is the module doc of [`crate::codec`].

use super::family::{CodecKind, FAMILIES};
use crate::error::KvqError;

/// Granularity of a rotated codec's f16 scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleMode {
    /// One scale `s = ||x|| / sqrt(D)` per stored vector (the default).
    PerVector,
    /// One scale per block of 32 rotated coordinates (RMS of the block); name suffix `b`.
    /// Sym codecs always use this.
    Block32,
}

/// One codec applied to K or to V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Codec {
    /// The family.
    pub kind: CodecKind,
    /// Bits per code (16 for `None`; 8 or 4 for `Sym`; 1..=4 for rotated codecs, or 0 with
    /// QJL for the QJL-only configuration).
    pub bits: u8,
    /// Whether the row carries the QJL residual sketch (rotated codecs, K only).
    pub qjl: bool,
    /// Scale granularity (`Block32` for `Sym`, `PerVector` for `None`).
    pub scale: ScaleMode,
}

/// Where every field of one stored row lives (all offsets in bits from the row start).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowLayout {
    /// Number of codes (`D` for none/sym/turbo/iso, `3 ceil(D/3)` for rotor).
    pub n_codes: u32,
    /// Bits per code (16 for `none`, whose "codes" are the f16 values).
    pub code_bits: u32,
    /// Bit offset of the first f16 sideband value (`round_up(n_codes * code_bits, 16)`).
    pub side_offset_bits: u32,
    /// Number of f16 sideband values (0 for `none`).
    pub n_side: u32,
    /// Codes covered by each sideband value (32 for sym and `Block32`, the last block may be
    /// shorter; `n_codes` for `PerVector`; 0 for `none`).
    pub side_block: u32,
    /// Bit offset of the QJL sign bits, when the codec has them.
    pub qjl_offset_bits: Option<u32>,
    /// Number of QJL sign bits `m` (`D`; 0 without QJL).
    pub qjl_bits: u32,
    /// Bit offset of the f16 `||r||` of the QJL residual (0 without QJL).
    pub qjl_norm_offset_bits: u32,
    /// `u32` words per row.
    pub words: u32,
}

impl RowLayout {
    /// Bits actually used (before rounding up to whole words).
    pub fn used_bits(&self) -> u32 {
        match self.qjl_offset_bits {
            Some(_) => self.qjl_norm_offset_bits + 16,
            None => self.side_offset_bits + 16 * self.n_side,
        }
    }
}

fn round_up(v: u32, m: u32) -> u32 {
    v.div_ceil(m) * m
}

impl Codec {
    /// Plain f16 storage.
    pub const NONE: Codec = Codec {
        kind: CodecKind::None,
        bits: 16,
        qjl: false,
        scale: ScaleMode::PerVector,
    };
    /// 8-bit symmetric, one f16 scale per 32 values (8.5 bits per value).
    pub const Q8: Codec = Codec {
        kind: CodecKind::Sym,
        bits: 8,
        qjl: false,
        scale: ScaleMode::Block32,
    };
    /// 4-bit symmetric, one f16 scale per 32 values (4.5 bits per value).
    pub const Q4: Codec = Codec {
        kind: CodecKind::Sym,
        bits: 4,
        qjl: false,
        scale: ScaleMode::Block32,
    };

    /// `turbo<bits>` (per-vector scale, no QJL).
    pub const fn turbo(bits: u8) -> Codec {
        Codec {
            kind: CodecKind::Turbo,
            bits,
            qjl: false,
            scale: ScaleMode::PerVector,
        }
    }

    /// `rotor<bits>` (per-vector scale, no QJL).
    pub const fn rotor(bits: u8) -> Codec {
        Codec {
            kind: CodecKind::Rotor,
            bits,
            qjl: false,
            scale: ScaleMode::PerVector,
        }
    }

    /// `iso<bits>` (per-vector scale, no QJL).
    pub const fn iso(bits: u8) -> Codec {
        Codec {
            kind: CodecKind::Iso,
            bits,
            qjl: false,
            scale: ScaleMode::PerVector,
        }
    }

    /// This codec with the QJL residual switched on or off.
    pub const fn with_qjl(self, qjl: bool) -> Codec {
        Codec { qjl, ..self }
    }

    /// This codec with another scale granularity (meaningful for rotated codecs).
    pub const fn with_scale(self, scale: ScaleMode) -> Codec {
        Codec { scale, ..self }
    }

    /// The codec's name as used on the command line (`none`, `q8`, `turbo3`, `iso3b`,
    /// `turbo3+qjl`, …); [`Codec::parse`] inverts it.
    pub fn name(&self) -> String {
        match self.kind {
            CodecKind::None => "none".into(),
            CodecKind::Sym => format!("q{}", self.bits),
            kind => format!(
                "{}{}{}{}",
                kind.prefix(),
                self.bits,
                if self.scale == ScaleMode::Block32 {
                    "b"
                } else {
                    ""
                },
                if self.qjl { "+qjl" } else { "" }
            ),
        }
    }

    /// Parses one codec name (see the module docs).
    pub fn parse(name: &str) -> Result<Codec, KvqError> {
        Self::parse_opt(name.trim()).ok_or_else(|| KvqError::UnknownCodec {
            name: name.to_string(),
            hint: String::new(),
            valid: Self::grammar(),
        })
    }

    fn parse_opt(name: &str) -> Option<Codec> {
        match name {
            "none" => return Some(Codec::NONE),
            "q8" => return Some(Codec::Q8),
            "q4" => return Some(Codec::Q4),
            _ => {}
        }
        let (base, qjl) = match name.strip_suffix("+qjl") {
            Some(b) => (b, true),
            None => (name, false),
        };
        let (base, scale) = match base.strip_suffix('b') {
            Some(b) => (b, ScaleMode::Block32),
            None => (base, ScaleMode::PerVector),
        };
        let kind = FAMILIES
            .iter()
            .find(|f| f.rotated && base.starts_with(f.prefix))?
            .kind;
        let digits = &base[kind.prefix().len()..];
        if digits.len() != 1 {
            return None;
        }
        let bits: u8 = digits.parse().ok()?;
        let c = Codec {
            kind,
            bits,
            qjl,
            scale,
        };
        c.validate().ok()?;
        Some(c)
    }

    /// The names [`Codec::parse`] accepts, in short: each family's bit widths, with the
    /// rotated families' options.
    fn grammar() -> String {
        let mut names = Vec::new();
        for f in &FAMILIES {
            let bits = f.bits.iter().copied().filter(|&b| b > 0);
            match f.kind {
                CodecKind::None => names.push(f.prefix.to_string()),
                _ if f.rotated => {
                    let (lo, hi) = (bits.clone().min().unwrap_or(0), bits.max().unwrap_or(0));
                    names.push(format!("{p}{lo}..{p}{hi}", p = f.prefix));
                }
                _ => names.extend(bits.map(|b| format!("{}{b}", f.prefix))),
            }
        }
        format!(
            "{}; a rotated one (turbo, rotor, iso) may add 'b' (one scale per 32 rotated \
             coordinates) and then '+qjl' (a QJL residual, K only; with 0 bits, QJL alone: \
             turbo0+qjl)",
            names.join(", ")
        )
    }

    /// Every single-codec name [`Codec::parse`] accepts.
    pub fn valid_names() -> Vec<String> {
        let mut v = vec!["none".to_string(), "q8".into(), "q4".into()];
        for f in FAMILIES.iter().filter(|f| f.rotated) {
            let kind = f.kind;
            for scale in [ScaleMode::PerVector, ScaleMode::Block32] {
                for bits in f.bits.iter().copied().filter(|&b| b > 0) {
                    let c = Codec {
                        kind,
                        bits,
                        qjl: false,
                        scale,
                    };
                    v.push(c.name());
                    v.push(c.with_qjl(true).name());
                }
                v.push(
                    Codec {
                        kind,
                        bits: 0,
                        qjl: true,
                        scale,
                    }
                    .name(),
                );
            }
        }
        v
    }

    /// Checks that the fields form a codec this crate implements (independent of `D`).
    pub fn validate(&self) -> Result<(), KvqError> {
        let f = self.kind.family();
        // QJL and the scale mode are the rotated families' options; sym's scales are always
        // per block. 0 bits only with QJL.
        let ok = f.bits.contains(&self.bits)
            && (self.bits > 0 || self.qjl)
            && match self.kind {
                CodecKind::None => !self.qjl && self.scale == ScaleMode::PerVector,
                CodecKind::Sym => !self.qjl && self.scale == ScaleMode::Block32,
                _ => f.rotated,
            };
        if ok {
            Ok(())
        } else {
            Err(KvqError::InvalidSpec(format!(
                "codec {:?} with {} bits (qjl: {}) does not exist",
                self.kind, self.bits, self.qjl
            )))
        }
    }

    /// Checks that this codec's rows (its layout and CPU reference) can hold vectors of
    /// `head_dim` values; a cache's head sizes follow [`crate::spec::HEAD_DIM_MULTIPLE`]'s
    /// rule besides. Rules: `8 <= head_dim <= 576` and a multiple of 8 for all codecs;
    /// additionally a multiple of 32 for sym (its scale blocks) and turbo (its Hadamard
    /// blocks: one per power of two of the width's binary decomposition, each at least 32, so
    /// 96 is rotated as 64 + 32 and 576 as 512 + 64). Iso needs a multiple of 4 and rotor
    /// anything (its last group of 3 is padded), both implied by the base rule.
    pub fn check_head_dim(&self, head_dim: u32) -> Result<(), KvqError> {
        self.validate()?;
        let err = |reason: &str| {
            Err(KvqError::UnsupportedHeadDim {
                head_dim,
                codec: self.name(),
                reason: reason.into(),
            })
        };
        if !head_dim.is_multiple_of(8) || !(8..=576).contains(&head_dim) {
            return err("head_dim must be a multiple of 8 between 8 and 576");
        }
        match self.kind.family().head_dim_multiple {
            Some((m, why)) if !head_dim.is_multiple_of(m) => err(why),
            _ => Ok(()),
        }
    }

    /// The row layout at `head_dim` (see the module docs), or why this codec cannot serve it.
    pub fn layout(&self, head_dim: u32) -> Result<RowLayout, KvqError> {
        self.check_head_dim(head_dim)?;
        Ok(self.layout_unchecked(head_dim))
    }

    fn layout_unchecked(&self, d: u32) -> RowLayout {
        let b = self.bits as u32;
        let n_codes = (self.kind.family().n_codes)(d);
        let side_offset_bits = round_up(n_codes * b, 16);
        let (n_side, side_block) = match (self.kind, self.scale) {
            (CodecKind::None, _) => (0, 0),
            (CodecKind::Sym, _) | (_, ScaleMode::Block32) => (n_codes.div_ceil(32), 32),
            (_, ScaleMode::PerVector) => (1, n_codes),
        };
        let side_end = side_offset_bits + 16 * n_side;
        let (qjl_offset_bits, qjl_bits, qjl_norm_offset_bits, used) = if self.qjl {
            let off = round_up(side_end, 32);
            let norm = round_up(off + d, 16);
            (Some(off), d, norm, norm + 16)
        } else {
            (None, 0, 0, side_end)
        };
        RowLayout {
            n_codes,
            code_bits: b,
            side_offset_bits,
            n_side,
            side_block,
            qjl_offset_bits,
            qjl_bits,
            qjl_norm_offset_bits,
            words: used.div_ceil(32),
        }
    }

    /// Number of `u32` words one stored row of `head_dim` values takes (computed by the
    /// layout formulas even for a `head_dim` that [`Codec::check_head_dim`] rejects).
    pub fn row_words(&self, head_dim: u32) -> u32 {
        self.layout_unchecked(head_dim).words
    }

    /// Stored bits per value at `head_dim`, sideband included (`words * 32 / head_dim`).
    pub fn bits_per_value(&self, head_dim: u32) -> f64 {
        self.row_words(head_dim) as f64 * 32.0 / head_dim as f64
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

    /// Every name [`KvCodecs::parse`] accepts (the general `k=…,v=…` form aside): `none`,
    /// and `k_<codec>` / `<codec>_sym` for every codec of [`Codec::valid_names`] but `none`
    /// (no `_sym` for the QJL-only `*0+qjl` codecs: V would have no stage at all).
    pub fn valid_names() -> Vec<String> {
        let mut v = vec!["none".to_string()];
        for c in Codec::valid_names().into_iter().skip(1) {
            v.push(format!("k_{c}"));
            if Codec::parse_opt(&c).is_some_and(|c| c.bits > 0) {
                v.push(format!("{c}_sym"));
            }
        }
        v
    }

    /// The names the benchmark sweep uses for `--codecs all`: `none`, `k_<c>` and `<c>_sym`
    /// for q8, q4, turbo2, turbo3, turbo4, rotor3, rotor4, iso3, iso4, and `k_turbo3+qjl`.
    pub fn all_names() -> Vec<String> {
        let mut v = vec!["none".to_string()];
        for c in [
            "q8", "q4", "turbo2", "turbo3", "turbo4", "rotor3", "rotor4", "iso3", "iso4",
        ] {
            v.push(format!("k_{c}"));
            v.push(format!("{c}_sym"));
        }
        v.push("k_turbo3+qjl".into());
        v
    }

    fn grammar() -> String {
        format!(
            "none, k_<codec> (K only), <codec>_sym (K and V), k=<codec>,v=<codec>; <codec>: {}; \
             e.g. k_iso3, turbo3_sym, k_turbo3+qjl, k=q4,v=q8",
            Codec::grammar()
        )
    }

    /// What a name that does not parse probably meant: a single codec (`q8`) names no
    /// cache; `k=` wants a `v=` beside it.
    fn hint(n: &str) -> String {
        if let Some(c) = Codec::parse_opt(n).filter(|c| *c != Codec::NONE) {
            let c = c.name();
            let sym = if n.ends_with("+qjl") {
                String::new()
            } else {
                format!("'{c}_sym' (K and V) or ")
            };
            return format!(" (a cache names K and V: did you mean {sym}'k_{c}' (K only)?)");
        }
        let parts: Vec<_> = n.split(',').map(|p| p.trim()).collect();
        if n.contains('=') && parts.len() == 1 {
            return " (give both K and V, e.g. 'k=q8,v=none' or 'k=q4,v=q8')".into();
        }
        String::new()
    }

    /// Parses a cache codec name: `none`, `k_<codec>` (K only, V f16), `<codec>_sym` (K and
    /// V; a `+qjl` applies to K only), or `k=<codec>,v=<codec>` (V may not use `+qjl`).
    pub fn parse(name: &str) -> Result<KvCodecs, KvqError> {
        let n = name.trim();
        let unknown = || KvqError::UnknownCodec {
            name: name.to_string(),
            hint: Self::hint(n),
            valid: Self::grammar(),
        };
        if n == "none" {
            return Ok(KvCodecs::NONE);
        }
        if n.contains('=') {
            let mut k = None;
            let mut v = None;
            for part in n.split(',') {
                let (key, val) = part.split_once('=').ok_or_else(unknown)?;
                let c = Codec::parse_opt(val.trim()).ok_or_else(unknown)?;
                let slot = match key.trim() {
                    "k" => &mut k,
                    "v" => &mut v,
                    _ => return Err(unknown()),
                };
                if slot.replace(c).is_some() {
                    return Err(unknown());
                }
            }
            let (Some(k), Some(v)) = (k, v) else {
                return Err(unknown());
            };
            if v.qjl {
                return Err(KvqError::InvalidSpec(format!(
                    "'{name}': the QJL residual (+qjl) applies to K only"
                )));
            }
            return Ok(KvCodecs { k, v });
        }
        // `k_<c>` and `<c>_sym` name quantized codecs only: f16 everywhere is `none` (one
        // name per pair, as `valid_names` lists them).
        let quantized = |c: &str| Codec::parse_opt(c).filter(|c| *c != Codec::NONE);
        if let Some(c) = n.strip_prefix("k_") {
            let k = quantized(c).ok_or_else(unknown)?;
            return Ok(KvCodecs { k, v: Codec::NONE });
        }
        if let Some(c) = n.strip_suffix("_sym") {
            let k = quantized(c).ok_or_else(unknown)?;
            let v = k.with_qjl(false);
            v.validate().map_err(|_| unknown())?;
            return Ok(KvCodecs { k, v });
        }
        Err(unknown())
    }

    /// The canonical name of this pair (inverse of [`KvCodecs::parse`]): `none`,
    /// `k_<k>` when V is f16, `<k>_sym` when V is K without QJL, else `k=<k>,v=<v>`.
    pub fn name(&self) -> String {
        if *self == KvCodecs::NONE {
            "none".into()
        } else if self.v == Codec::NONE {
            format!("k_{}", self.k.name())
        } else if self.v == self.k.with_qjl(false) {
            format!("{}_sym", self.k.name())
        } else {
            format!("k={},v={}", self.k.name(), self.v.name())
        }
    }

    /// Checks both codecs against `head_dim` and that V does not use QJL.
    pub fn check_head_dim(&self, head_dim: u32) -> Result<(), KvqError> {
        self.check_widths(head_dim, head_dim)
    }

    /// [`KvCodecs::check_head_dim`] with K `dk` and V `dv` values wide.
    pub fn check_widths(&self, dk: u32, dv: u32) -> Result<(), KvqError> {
        if self.v.qjl {
            return Err(KvqError::InvalidSpec(
                "the QJL residual (+qjl) applies to K only".into(),
            ));
        }
        self.k.check_head_dim(dk)?;
        self.v.check_head_dim(dv)
    }
}
