//! The shape of a cache: model dimensions, batch, capacity, codecs and decode tuning.

use crate::codec::{CodecKind, KvCodecs};
use crate::error::{KvqError, Result};

/// Most (layer, sequence) pairs a cache may hold (`layers * batch`).
pub const MAX_LENGTHS: u64 = 1 << 20;

/// The arithmetic of a cache's attention products ([`CacheSpec::precision`]).
///
/// A quantized codec's own error on the attention output is orders of magnitude larger
/// than f16 rounding, so its products need not be f32: `Fast` trades an exact match with
/// the reference over the dequantized store for f16 operands, which halve the bytes a
/// kernel moves through workgroup memory and the instructions of its products (packed f16
/// pairs). The default, `Auto`, takes `Fast` for caches of codes of at most 4 bits and
/// `Exact` for the rest ([`Precision::resolve`]). What a cache got is
/// [`crate::KernelConfig::precision`] (`cache.kernel_config().precision`): `Exact` where
/// the adapter has no `shader-f16`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Precision {
    /// `Fast` where every quantized side of the cache stores codes of at most 4 bits (and
    /// at least one side is quantized: `q4_sym`, `k_q4`, every turbo, rotor and iso width,
    /// with or without QJL), else `Exact` (`none`, a cache with an 8-bit side): at 3 and 4 bits
    /// the codec's own error dwarfs f16 rounding (`Fast` adds at most 5 % to it on five such
    /// codecs, tested), and the f16 prefill kernel is the faster chunk kernel on the measured
    /// GPUs (BENCHMARKS.md, "Chunks"). It does not check
    /// the values' range (see `Fast`): a model whose K or query · key products may pass f16's
    /// wants `Exact`.
    #[default]
    Auto,
    /// f32 operands and products throughout: the GPU's attention matches the f64 reference
    /// over the dequantized store to about 1e-6 relative (tested to 1e-3).
    Exact,
    /// f16 operands and products where a kernel has them, on adapters with `shader-f16`
    /// ([`crate::Capabilities::f16`]); elsewhere, as on a browser without it, the same
    /// kernels as `Exact`. Today only the prefill kernel has them (its query and K/V tiles
    /// and its weights in f16, products summed in f16 at most 16 to a sum and then added
    /// into f32; every softmax maximum, sum and rescale in f32), so `Fast` changes chunks
    /// that kernel attends ([`CacheSpec::prefill_from`]) and nothing else. Tested within
    /// 1e-2 (relative) of the reference over the dequantized store, and for 3/4-bit codecs
    /// within 5 % of `Exact`'s error against the original K/V. f16's range bounds it: K
    /// values or sums of 16 query · key products past ±65504, or V values past about
    /// ±4000, overflow to a wrong or NaN output; keep such caches `Exact`.
    Fast,
}

impl Precision {
    /// `"auto"`, `"exact"` or `"fast"`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Auto => "auto",
            Precision::Exact => "exact",
            Precision::Fast => "fast",
        }
    }

    /// `Exact` or `Fast` for a cache of `codecs`: `Auto` resolved (see [`Precision::Auto`]),
    /// the others as they are. The adapter may still lack `shader-f16`, which makes `Fast`
    /// run the exact kernels ([`crate::KernelConfig::precision`] says what a cache got).
    pub fn resolve(self, codecs: &KvCodecs) -> Precision {
        let sides = [codecs.k, codecs.v];
        let quantized = sides.iter().filter(|c| c.kind != CodecKind::None);
        let low_bits = quantized.clone().all(|c| c.bits <= 4);
        match self {
            Precision::Auto if low_bits && quantized.count() > 0 => Precision::Fast,
            Precision::Auto => Precision::Exact,
            p => p,
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = crate::KvqError;

    /// `"auto"`, `"exact"` or `"fast"`.
    fn from_str(s: &str) -> crate::Result<Precision> {
        match s {
            "auto" => Ok(Precision::Auto),
            "exact" => Ok(Precision::Exact),
            "fast" => Ok(Precision::Fast),
            _ => Err(crate::KvqError::InvalidSpec(format!(
                "precision '{s}': auto, exact or fast"
            ))),
        }
    }
}

/// Tokens a cache keeps exact (f16, as the caller gave them) beside their codes, and attends
/// in place of the codes: each sequence's first `sink` positions and its newest `recent`. On a
/// real model these are what a 3- or 4-bit cache must not lose (QUALITY.md, "Exact tokens on
/// the GPU"). The store still encodes
/// every token, so nothing is re-encoded when a token grows old. Every query, of a decode
/// step or of a chunk, sees exactly the sink and the `recent` positions up to its own exact.
/// Costs [`ExactTokens::rows`]` x head_dim x 4` bytes per sequence, KV head and layer
/// ([`crate::MemoryReport::exact`]): the ring holds [`EXACT_CHUNK_SLICE`] slots beyond
/// `recent`, for chunks. Not with a sliding [`CacheSpec::window`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExactTokens {
    /// The first positions of every sequence (attention sinks).
    pub sink: u32,
    /// The newest positions of every sequence.
    pub recent: u32,
    /// K's mean removed before the codec: once a sequence holds its `sink` tokens, the f32
    /// per-channel mean of their (f16) K rows is kept on the GPU, and every later K row is
    /// encoded as `k - mean`. Attention is unchanged in exact arithmetic (`q . (k - mean)`
    /// shifts every score of a query alike, and the exact tokens are scored the same way),
    /// but real K has channels with large means that the small block rotations of `iso` and
    /// `rotor` cannot spread: on SmolLM2 this is what brings `k_iso3` and `k_rotor3` into
    /// range (QUALITY.md). Needs `sink >= 1`; costs `head_dim x 4` bytes per sequence, KV head
    /// and layer.
    pub k_mean: bool,
}

impl ExactTokens {
    /// None: every token through the codec.
    pub const NONE: ExactTokens = ExactTokens {
        sink: 0,
        recent: 0,
        k_mean: false,
    };

    /// The first `sink` and newest `recent` tokens exact, K's mean kept in the codes.
    pub fn new(sink: u32, recent: u32) -> ExactTokens {
        ExactTokens {
            sink,
            recent,
            k_mean: false,
        }
    }

    /// Whether any token is kept exact.
    pub fn any(&self) -> bool {
        self.sink + self.recent > 0
    }

    /// Ring slots per sequence for the newest tokens: `recent` plus [`EXACT_CHUNK_SLICE`]
    /// (0 without `recent`). A chunk is appended and attended [`EXACT_CHUNK_SLICE`] tokens at
    /// a time, so that the ring still holds the `recent` tokens before each query of a slice:
    /// every query of a chunk sees what a decode step at its position would.
    pub fn ring(&self) -> u32 {
        if self.recent == 0 {
            0
        } else {
            self.recent + EXACT_CHUNK_SLICE
        }
    }

    /// Exact rows per sequence, KV head and layer: the sink's and the ring's.
    pub fn rows(&self) -> u32 {
        self.sink + self.ring()
    }
}

impl std::str::FromStr for ExactTokens {
    type Err = crate::KvqError;

    /// `"SINK,RECENT"`, or `"SINK,RECENT,kmean"` with K's mean removed (the tools' `--exact`).
    fn from_str(s: &str) -> crate::Result<ExactTokens> {
        let bad = || {
            crate::KvqError::InvalidSpec(format!(
                "exact tokens '{s}': SINK,RECENT or SINK,RECENT,kmean"
            ))
        };
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let (sink, recent, k_mean) = match parts[..] {
            [sink, recent] => (sink, recent, false),
            [sink, recent, "kmean"] => (sink, recent, true),
            _ => return Err(bad()),
        };
        Ok(ExactTokens {
            sink: sink.parse().map_err(|_| bad())?,
            recent: recent.parse().map_err(|_| bad())?,
            k_mean,
        })
    }
}

/// New tokens per sequence of a chunk appended and attended together where a cache keeps
/// recent tokens exact ([`ExactTokens::ring`]); a longer chunk goes slice by slice, in one
/// recording.
pub const EXACT_CHUNK_SLICE: u32 = 64;

/// Most exact tokens a cache keeps per sequence (`sink + recent`).
pub const MAX_EXACT_TOKENS: u32 = 4096;

/// The head sizes kvq's GPU kernels serve are multiples of this from [`MIN_HEAD_DIM`] to
/// [`MAX_HEAD_DIM`]: the one statement of the rule, which [`CacheSpec::validate`] and
/// [`crate::KernelConfig::check`] apply. A codec may ask more ([`crate::Codec::check_head_dim`]).
pub const HEAD_DIM_MULTIPLE: u32 = 32;
/// The smallest head size the GPU kernels serve ([`HEAD_DIM_MULTIPLE`]).
pub const MIN_HEAD_DIM: u32 = 32;
/// The largest head size the GPU kernels serve ([`HEAD_DIM_MULTIPLE`]).
pub const MAX_HEAD_DIM: u32 = 256;

/// Which of the kernels' shape rules a shape breaks ([`check_shape`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ShapeRule {
    HeadDim,
    Gqa,
    Workgroup,
}

/// The shapes kvq's kernels are written for, and audited for running without wgpu's index
/// clamps ([`crate::KernelConfig::clamps_indices`]): the one copy of these rules, read by
/// [`CacheSpec::validate`] and by [`crate::KernelConfig::check`], which guards every module's
/// assembly and [`crate::export`]. `workgroup`: `None` where the device picks it (always a
/// valid size). The error names the rule and says why.
pub(crate) fn check_shape(
    head_dim: u32,
    gqa: u32,
    workgroup: Option<u32>,
) -> std::result::Result<(), (ShapeRule, String)> {
    if !head_dim.is_multiple_of(HEAD_DIM_MULTIPLE)
        || !(MIN_HEAD_DIM..=MAX_HEAD_DIM).contains(&head_dim)
    {
        let why = format!(
            "kvq's kernels need a multiple of {HEAD_DIM_MULTIPLE} between {MIN_HEAD_DIM} and {MAX_HEAD_DIM}"
        );
        return Err((ShapeRule::HeadDim, why));
    }
    if !(1..=8).contains(&gqa) {
        let why = format!("GQA ratio {gqa} is outside the supported 1 to 8");
        return Err((ShapeRule::Gqa, why));
    }
    if let Some(w) = workgroup
        && ![64, 128, 256].contains(&w)
    {
        let why = format!("decode workgroup {w} must be 64, 128 or 256");
        return Err((ShapeRule::Workgroup, why));
    }
    Ok(())
}

/// What a [`crate::KvCache`] holds.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheSpec {
    /// Transformer layers (each has its own K and V store).
    pub layers: u32,
    /// Query heads per token.
    pub q_heads: u32,
    /// KV heads per token (`q_heads / kv_heads` is the GQA ratio; it must divide evenly).
    pub kv_heads: u32,
    /// Values per head vector: what the kernels serve ([`HEAD_DIM_MULTIPLE`]) and the
    /// codecs do (anything else is [`crate::KvqError::UnsupportedHeadDim`]); 64, 96, 128 and
    /// 256 are the ones tested against the reference.
    pub head_dim: u32,
    /// Tokens each sequence can hold (at most [`MAX_CAPACITY`]). With a [`CacheSpec::window`],
    /// the ring of slots holding each sequence's last `capacity` tokens.
    pub capacity: u32,
    /// Sliding window: attention covers only each sequence's last `window` tokens (the new
    /// ones included), as models with sliding-window layers need. The sequence length keeps
    /// counting every token appended (positions), never fills, and the store keeps the last
    /// `capacity` tokens in a ring; `capacity - window` is how far [`crate::KvCache::truncate`]
    /// can roll back past the point where the ring wrapped. `None`: attend everything, and an
    /// append past `capacity` is refused.
    pub window: Option<u32>,
    /// Independent sequences in the cache (each with its own length on the GPU).
    pub batch: u32,
    /// Codecs for K and V.
    pub codecs: KvCodecs,
    /// Softmax scale; `None` means `1/sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Seed of the codecs' fixed random rotations.
    pub seed: u64,
    /// Workgroups each KV head's sequence is split over in decode; `None` picks from the
    /// adapter's [`crate::tuning`] entry (a measured GPU: the largest split grid that fits in
    /// one wave of its resident workgroups for this GQA ratio and codec, at most 64 per head;
    /// a CPU driver: 1-4 by capacity; any other adapter: one wave of a small GPU,
    /// [`crate::tuning::UNMEASURED`]).
    pub splits: Option<u32>,
    /// Splits per storage segment a chunk's slices take ([`crate::KvCache::chunk`]), at most
    /// the decode's ([`CacheSpec::splits`]; a larger value takes those); `None` picks per
    /// slice from the adapter's [`crate::tuning`] entry by its workgroups per split (a long
    /// slice has parallelism enough in its queries, and fewer splits write and merge fewer
    /// partials). Attention is the same up to rounding (the partials merge in another
    /// order); this only changes its speed.
    pub chunk_splits: Option<u32>,
    /// Most token positions one storage buffer holds; `None` fills a binding's size limit.
    /// Capacities above it are split into several buffers per layer.
    pub segment_tokens: Option<u32>,
    /// Invocations per decode workgroup (64, 128 or 256); `None` takes the adapter's
    /// [`crate::tuning`] entry's (128 on every adapter today).
    pub workgroup: Option<u32>,
    /// Tokens kept exact beside their codes ([`ExactTokens`]); none by default.
    pub exact: ExactTokens,
    /// Chunk slices of at least this many new tokens per sequence are attended by the
    /// prefill kernel, tiled over queries and keys (each K/V tile decoded once for up to 32
    /// query rows), instead of the chunk's split kernel; `None` takes the adapter's
    /// [`crate::tuning`] entry's (on the measured GPUs 64 where the products are f16,
    /// [`Precision`], and the K codec has no QJL; on matrix units
    /// [`crate::tuning::DeviceTuning::prefill_from_matrix`]; none elsewhere), `Some(u32::MAX)`
    /// never.
    /// Both kernels compute the same attention; this only chooses the faster one. A
    /// cache the prefill kernel does not serve (a QJL K beside a rotor side at head_dim 256,
    /// whose query rows pass its tile) always takes the split kernel.
    pub prefill_from: Option<u32>,
    /// The attention products' arithmetic ([`Precision`]); `Auto` by default.
    pub precision: Precision,
}

/// Most tokens a cache holds: a ring's slot arithmetic (`wgsl/shared/common.wgsl`, `seg_runs`) adds
/// up to a capacity's worth of positions to a slot, which must not wrap a u32.
pub const MAX_CAPACITY: u32 = 1 << 31;

impl CacheSpec {
    /// A spec with batch 1, f16 K/V and default scale, seed and splits.
    pub fn new(
        layers: u32,
        q_heads: u32,
        kv_heads: u32,
        head_dim: u32,
        capacity: u32,
    ) -> CacheSpec {
        CacheSpec {
            layers,
            q_heads,
            kv_heads,
            head_dim,
            capacity,
            batch: 1,
            window: None,
            codecs: KvCodecs::NONE,
            scale: None,
            seed: 0x6b76_715f_7365_6564,
            splits: None,
            chunk_splits: None,
            segment_tokens: None,
            workgroup: None,
            exact: ExactTokens::NONE,
            prefill_from: None,
            precision: Precision::Auto,
        }
    }

    /// Sets the codecs.
    pub fn with_codecs(mut self, codecs: KvCodecs) -> CacheSpec {
        self.codecs = codecs;
        self
    }

    /// Sets the batch size.
    pub fn with_batch(mut self, batch: u32) -> CacheSpec {
        self.batch = batch;
        self
    }

    /// Makes the cache a sliding window of `window` tokens (see [`CacheSpec::window`]).
    pub fn with_window(mut self, window: u32) -> CacheSpec {
        self.window = Some(window);
        self
    }

    /// Keeps each sequence's first `sink` and newest `recent` tokens exact ([`ExactTokens`]).
    pub fn with_exact(mut self, sink: u32, recent: u32) -> CacheSpec {
        self.exact = ExactTokens {
            sink,
            recent,
            ..self.exact
        };
        self
    }

    /// Removes K's mean over each sequence's sink before the codec ([`ExactTokens::k_mean`]);
    /// needs exact sink tokens ([`CacheSpec::with_exact`]).
    pub fn with_k_mean(mut self) -> CacheSpec {
        self.exact.k_mean = true;
        self
    }

    /// Attends chunk slices of at least `tokens` new tokens per sequence with the prefill
    /// kernel ([`CacheSpec::prefill_from`]); 1 (or 0: every chunk has a token) takes it for
    /// every chunk.
    pub fn with_prefill_from(mut self, tokens: u32) -> CacheSpec {
        self.prefill_from = Some(tokens);
        self
    }

    /// Sets the products' arithmetic ([`CacheSpec::precision`]).
    pub fn with_precision(mut self, precision: Precision) -> CacheSpec {
        self.precision = precision;
        self
    }

    /// Sets the number of decode splits per KV head.
    pub fn with_splits(mut self, splits: u32) -> CacheSpec {
        self.splits = Some(splits);
        self
    }

    /// Sets the splits per storage segment of a chunk's slices ([`CacheSpec::chunk_splits`]).
    pub fn with_chunk_splits(mut self, splits: u32) -> CacheSpec {
        self.chunk_splits = Some(splits);
        self
    }

    /// Query heads served by one KV head.
    pub fn gqa(&self) -> u32 {
        self.q_heads / self.kv_heads.max(1)
    }

    /// The softmax scale in effect.
    pub fn softmax_scale(&self) -> f32 {
        self.scale.unwrap_or(1.0 / (self.head_dim as f32).sqrt())
    }

    /// Checks every field; the error says which one is wrong and why.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(KvqError::InvalidSpec(m));
        if self.layers == 0 {
            return bad("layers must be at least 1".into());
        }
        if self.kv_heads == 0 || self.q_heads == 0 {
            return bad(format!(
                "q_heads ({}) and kv_heads ({}) must be at least 1",
                self.q_heads, self.kv_heads
            ));
        }
        if !self.q_heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "q_heads ({}) must be a multiple of kv_heads ({}) (GQA groups must be whole)",
                self.q_heads, self.kv_heads
            ));
        }
        if self.capacity == 0 {
            return bad("capacity must be at least 1 token".into());
        }
        if let Some(w) = self.window
            && !(1..=self.capacity).contains(&w)
        {
            return bad(format!(
                "window {w} must be between 1 and the capacity ({})",
                self.capacity
            ));
        }
        if self.batch == 0 {
            return bad("batch must be at least 1".into());
        }
        if self.exact.any() && self.window.is_some() {
            return bad(
                "exact tokens (CacheSpec::exact) are not supported with a sliding window".into(),
            );
        }
        if self.exact.k_mean && self.exact.sink == 0 {
            return bad(
                "K's mean (ExactTokens::k_mean) is taken over the exact sink: sink must be at least 1"
                    .into(),
            );
        }
        if self.exact.sink as u64 + self.exact.recent as u64 > MAX_EXACT_TOKENS as u64 {
            return bad(format!(
                "exact tokens: sink {} + recent {} is above {MAX_EXACT_TOKENS}",
                self.exact.sink, self.exact.recent
            ));
        }
        if self.batch as u64 * self.kv_heads as u64 > 65535 {
            // One decode workgroup row per (sequence, kv head): WebGPU's dispatch limit.
            return bad(format!(
                "batch x kv_heads ({} x {}) must be at most 65535",
                self.batch, self.kv_heads
            ));
        }
        if self.layers as u64 * self.batch as u64 > MAX_LENGTHS {
            // One length and one overflow flag per (layer, sequence) in one small buffer, and
            // counts that stay far from u32 overflow in the kernels' index arithmetic.
            return bad(format!(
                "layers x batch ({} x {}) must be at most {MAX_LENGTHS}",
                self.layers, self.batch
            ));
        }
        if let Some(s) = self.scale
            && !(s.is_finite() && s > 0.0)
        {
            return bad(format!("softmax scale {s} must be finite and positive"));
        }
        for (what, splits) in [("splits", self.splits), ("chunk splits", self.chunk_splits)] {
            if let Some(s) = splits
                && !(1..=1024).contains(&s)
            {
                return bad(format!("{what} {s} must be between 1 and 1024"));
            }
        }
        // The kernels' shape rules: head_dim, GQA ratio, workgroup.
        check_shape(self.head_dim, self.gqa(), self.workgroup).map_err(
            |(rule, reason)| match rule {
                ShapeRule::HeadDim => KvqError::UnsupportedHeadDim {
                    head_dim: self.head_dim,
                    codec: self.codecs.name(),
                    reason,
                },
                ShapeRule::Gqa | ShapeRule::Workgroup => KvqError::InvalidSpec(reason),
            },
        )?;
        if self.segment_tokens == Some(0) {
            return bad("segment_tokens must be at least 1".into());
        }
        if self.capacity > MAX_CAPACITY {
            return bad(format!(
                "capacity {} is above {MAX_CAPACITY} tokens (the kernels' slot arithmetic is u32)",
                self.capacity
            ));
        }
        // Both codecs and the pair (the QJL residual is for K only).
        self.codecs.check_head_dim(self.head_dim)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_tokens_parse_from_the_tools_flag() {
        let x: ExactTokens = "16,32".parse().unwrap();
        assert_eq!((x.sink, x.recent, x.k_mean), (16, 32, false));
        let x: ExactTokens = "4, 0, kmean".parse().unwrap();
        assert_eq!((x.sink, x.recent, x.k_mean), (4, 0, true));
        for bad in ["16", "16,32,mean", "a,32", "16,-1", "1,2,kmean,3"] {
            assert!(bad.parse::<ExactTokens>().is_err(), "{bad}");
        }
    }

    #[test]
    fn auto_precision_is_fast_for_codes_of_at_most_4_bits_only() {
        let resolve = |name: &str| Precision::Auto.resolve(&KvCodecs::parse(name).unwrap());
        for fast in [
            "q4_sym",
            "k_q4",
            "turbo3_sym",
            "k_iso3",
            "k_turbo3+qjl",
            "k=q4,v=turbo3",
        ] {
            assert_eq!(resolve(fast), Precision::Fast, "{fast}");
        }
        for exact in ["none", "q8_sym", "k_q8", "k=q8,v=q4", "k=q4,v=q8"] {
            assert_eq!(resolve(exact), Precision::Exact, "{exact}");
        }
        let q4 = KvCodecs::parse("q4_sym").unwrap();
        assert_eq!(Precision::Exact.resolve(&q4), Precision::Exact);
        assert_eq!(Precision::Fast.resolve(&KvCodecs::NONE), Precision::Fast);
        assert_eq!(CacheSpec::new(1, 8, 2, 64, 16).precision, Precision::Auto);
        assert_eq!("auto".parse::<Precision>().unwrap(), Precision::Auto);
    }
}
