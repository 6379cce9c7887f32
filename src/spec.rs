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

/// The head sizes kvq serves, the one statement of the rule ([`check_head_dims`], which
/// [`CacheSpec::validate`] and [`crate::KernelConfig::check`] apply): K and V widths each a
/// multiple of [`HEAD_DIM_MULTIPLE`] from [`MIN_HEAD_DIM`] to [`MAX_HEAD_DIM`], or one pair of
/// [`MLA_HEAD_DIMS`] (multi-head latent attention). A codec may ask more of its side's width
/// ([`crate::Codec::check_head_dim`]: sym and turbo a multiple of 32).
pub const HEAD_DIM_MULTIPLE: u32 = 8;
/// The smallest head size ([`HEAD_DIM_MULTIPLE`]).
pub const MIN_HEAD_DIM: u32 = 32;
/// The largest head size but the MLA pairs ([`HEAD_DIM_MULTIPLE`]).
pub const MAX_HEAD_DIM: u32 = 256;
/// The (K, V) widths of multi-head latent attention beyond [`MAX_HEAD_DIM`]: the absorbed
/// form's latent (512) with and without its rotary part (64).
pub const MLA_HEAD_DIMS: [(u32, u32); 2] = [(512, 512), (576, 512)];
/// The largest GQA ratio (query heads per KV head).
pub const MAX_GQA: u32 = 128;

/// Which of the kernels' shape rules a shape breaks ([`check_shape`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ShapeRule {
    HeadDim,
    Gqa,
    Workgroup,
}

/// The head-size rule ([`HEAD_DIM_MULTIPLE`]) for K width `dk` and V width `dv`; the error
/// says which width breaks it and how.
pub fn check_head_dims(dk: u32, dv: u32) -> std::result::Result<(), String> {
    let plain =
        |d: u32| d.is_multiple_of(HEAD_DIM_MULTIPLE) && (MIN_HEAD_DIM..=MAX_HEAD_DIM).contains(&d);
    if (plain(dk) && plain(dv)) || MLA_HEAD_DIMS.contains(&(dk, dv)) {
        return Ok(());
    }
    let what = if dk == dv {
        format!("head_dim {dk}")
    } else {
        format!("K width {dk} with V width {dv}")
    };
    Err(format!(
        "{what}: kvq serves K and V widths that are each a multiple of {HEAD_DIM_MULTIPLE} from {MIN_HEAD_DIM} to {MAX_HEAD_DIM}, or the MLA pairs (K, V) = {MLA_HEAD_DIMS:?}"
    ))
}

/// The shapes kvq's kernels are written for, and audited for running without wgpu's index
/// clamps ([`crate::KernelConfig::clamps_indices`]): the one copy of these rules, read by
/// [`CacheSpec::validate`] and by [`crate::KernelConfig::check`], which guards every module's
/// assembly and [`crate::export`]. `workgroup`: `None` where the device picks it (always a
/// valid size). The error names the rule and says why.
pub(crate) fn check_shape(
    dk: u32,
    dv: u32,
    gqa: u32,
    workgroup: Option<u32>,
) -> std::result::Result<(), (ShapeRule, String)> {
    check_head_dims(dk, dv).map_err(|why| (ShapeRule::HeadDim, why))?;
    // What the GPU kernels serve of the rule today: one width for K and V (not the MLA
    // pairs, nor K and V of different widths).
    if dk != dv || dk > MAX_HEAD_DIM {
        let why = format!(
            "kvq's GPU kernels serve one width for K and V, up to {MAX_HEAD_DIM} (K {dk}, V {dv}): the MLA widths and K and V of different widths have the CPU reference only"
        );
        return Err((ShapeRule::HeadDim, why));
    }
    if !(1..=MAX_GQA).contains(&gqa) {
        let why = format!("GQA ratio {gqa} is outside the supported 1 to {MAX_GQA}");
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

/// Where a cache's sink logits come from ([`CacheSpec::with_sink_logits`]): `[layers,
/// q_heads]` f32, one logit per query head of every layer, which joins every softmax's
/// denominator of that head and carries no value (gpt-oss's learned attention sinks; not
/// [`CacheSpec::with_exact`]'s sink tokens). The cache copies them into its own constants
/// when it is built: later changes to the source do not reach it.
#[derive(Clone, Debug, PartialEq)]
pub enum SinkLogits {
    /// Values on the host (finite).
    Host(Vec<f32>),
    /// A buffer of the cache's device with `COPY_SRC` usage, its first `layers * q_heads * 4`
    /// bytes (finite f32; a non-finite logit gives non-finite outputs).
    Buffer(wgpu::Buffer),
}

impl From<Vec<f32>> for SinkLogits {
    fn from(v: Vec<f32>) -> SinkLogits {
        SinkLogits::Host(v)
    }
}

impl From<&[f32]> for SinkLogits {
    fn from(v: &[f32]) -> SinkLogits {
        SinkLogits::Host(v.to_vec())
    }
}

impl From<wgpu::Buffer> for SinkLogits {
    fn from(b: wgpu::Buffer) -> SinkLogits {
        SinkLogits::Buffer(b)
    }
}

impl From<&wgpu::Buffer> for SinkLogits {
    fn from(b: &wgpu::Buffer) -> SinkLogits {
        SinkLogits::Buffer(b.clone())
    }
}

/// Ring slots a layer with a window of its own keeps beyond the window by default
/// ([`CacheSpec::window_slack`]).
pub const DEFAULT_WINDOW_SLACK: u32 = 256;

/// What a [`crate::KvCache`] holds.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheSpec {
    /// Transformer layers (each has its own K and V store).
    pub layers: u32,
    /// Query heads per token.
    pub q_heads: u32,
    /// KV heads per token (`q_heads / kv_heads` is the GQA ratio; it must divide evenly).
    pub kv_heads: u32,
    /// Values per K vector (and per query), and per V vector unless
    /// [`CacheSpec::v_head_dim`] sets V's: what the head-size rule allows
    /// ([`HEAD_DIM_MULTIPLE`]) and the codecs serve (anything else is
    /// [`crate::KvqError::UnsupportedHeadDim`]).
    pub head_dim: u32,
    /// Values per V vector (and per output row); `None`: [`CacheSpec::head_dim`]. K and V of
    /// different widths are multi-head latent attention's (K 576, V 512) or an unabsorbed
    /// MLA's (K 192, V 128). The CPU reference serves them; [`crate::KvCache::new`] refuses
    /// them, typed, until the GPU kernels do.
    pub v_head_dim: Option<u32>,
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
    /// A window per layer (`None`: that layer attends everything), for models whose local
    /// layers alternate with global ones (Gemma 2 and 3, gpt-oss): `layers` entries. A layer
    /// with a window keeps a ring of [`CacheSpec::layer_capacity`] slots (its window plus
    /// [`CacheSpec::window_slack`]), so its store holds only that: the cache's memory is the
    /// global layers' `capacity` and the local layers' rings ([`crate::KvCache::memory`]).
    /// Not with [`CacheSpec::window`] (which gives every layer one window in a ring of
    /// `capacity`). Each layer's kernels attend its own window over its own ring (the same
    /// compiled kernels for every layer: [`crate::KernelConfig::bakes`]); a chunk longer than
    /// the smallest slack is attended in slices ([`crate::KvCache::chunk_io`]), and
    /// [`crate::KvCache::truncate`] follows each layer's ring.
    pub layer_windows: Option<Vec<Option<u32>>>,
    /// Ring slots a layer with a window of its own ([`CacheSpec::layer_windows`]) keeps
    /// beyond its window: how far [`crate::KvCache::truncate`] can roll such a layer back once
    /// its ring has wrapped, and the most new tokens a chunk appends before it attends them
    /// (a longer chunk is appended and attended slice by slice). [`DEFAULT_WINDOW_SLACK`] by
    /// default.
    pub window_slack: u32,
    /// Independent sequences in the cache (each with its own length on the GPU).
    pub batch: u32,
    /// Codecs for K and V.
    pub codecs: KvCodecs,
    /// Softmax scale; `None` means `1/sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Logit softcap `c` (Gemma 2: 50): each scaled score `s` becomes `c · tanh(s / c)`
    /// before the softmax, in every kernel that attends. `None`: no cap.
    pub softcap: Option<f32>,
    /// Sink logits ([`SinkLogits`]): one per query head of each layer, in every softmax's
    /// denominator. `None`: no sink logit.
    pub sink_logits: Option<SinkLogits>,
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
            v_head_dim: None,
            batch: 1,
            window: None,
            layer_windows: None,
            window_slack: DEFAULT_WINDOW_SLACK,
            codecs: KvCodecs::NONE,
            scale: None,
            softcap: None,
            sink_logits: None,
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

    /// Gives each layer its own window (`None`: global), `layers` entries
    /// ([`CacheSpec::layer_windows`]).
    pub fn with_layer_windows(mut self, windows: Vec<Option<u32>>) -> CacheSpec {
        self.layer_windows = Some(windows);
        self
    }

    /// Sets the ring slots a layer with a window of its own keeps beyond it
    /// ([`CacheSpec::window_slack`]).
    pub fn with_window_slack(mut self, tokens: u32) -> CacheSpec {
        self.window_slack = tokens;
        self
    }

    /// Sets V's width apart from K's ([`CacheSpec::v_head_dim`]).
    pub fn with_v_head_dim(mut self, v_head_dim: u32) -> CacheSpec {
        self.v_head_dim = Some(v_head_dim);
        self
    }

    /// Caps every scaled score at `c` (`c · tanh(s / c)`, [`CacheSpec::softcap`]); `c` must
    /// be finite and positive.
    pub fn with_softcap(mut self, c: f32) -> CacheSpec {
        self.softcap = Some(c);
        self
    }

    /// Adds sink logits, `[layers, q_heads]` f32 from a host slice or a GPU buffer
    /// ([`SinkLogits`]).
    pub fn with_sink_logits(mut self, logits: impl Into<SinkLogits>) -> CacheSpec {
        self.sink_logits = Some(logits.into());
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

    /// V's width ([`CacheSpec::v_head_dim`], else [`CacheSpec::head_dim`]).
    pub fn v_width(&self) -> u32 {
        self.v_head_dim.unwrap_or(self.head_dim)
    }

    /// Layer `layer`'s window: its own ([`CacheSpec::layer_windows`]), else the cache's
    /// ([`CacheSpec::window`]); `None` where it attends everything.
    pub fn layer_window(&self, layer: u32) -> Option<u32> {
        match &self.layer_windows {
            Some(w) => w.get(layer as usize).copied().flatten(),
            None => self.window,
        }
    }

    /// Whether any layer has a window (then `capacity` no longer bounds a sequence's length:
    /// a ring never fills).
    pub fn any_window(&self) -> bool {
        self.window.is_some() || self.layer_windows.iter().flatten().any(Option::is_some)
    }

    /// Token slots layer `layer` keeps per sequence: the capacity, but for a layer with a
    /// window of its own ([`CacheSpec::layer_windows`]) a ring of its window plus
    /// [`CacheSpec::window_slack`] (in whole blocks of 32 slots, at most the capacity).
    pub fn layer_capacity(&self, layer: u32) -> u32 {
        let own = self
            .layer_windows
            .as_ref()
            .and_then(|w| w.get(layer as usize));
        match own.copied().flatten() {
            Some(w) => (w as u64 + self.window_slack as u64)
                .next_multiple_of(crate::kernels::K_BLOCK as u64)
                .min(self.capacity as u64) as u32,
            None => self.capacity,
        }
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
        if let Some(ws) = &self.layer_windows {
            if self.window.is_some() {
                return bad(
                    "a window per layer (layer_windows) and one window for every layer (window) cannot both be set"
                        .into(),
                );
            }
            if ws.len() != self.layers as usize {
                return bad(format!(
                    "a window per layer: {} entries for {} layers",
                    ws.len(),
                    self.layers
                ));
            }
            if let Some((l, w)) = ws.iter().enumerate().find_map(|(l, w)| {
                w.filter(|w| !(1..=self.capacity).contains(w))
                    .map(|w| (l, w))
            }) {
                return bad(format!(
                    "layer {l}'s window {w} must be between 1 and the capacity ({})",
                    self.capacity
                ));
            }
        }
        if self.batch == 0 {
            return bad("batch must be at least 1".into());
        }
        if self.exact.any() && self.any_window() {
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
        let row_groups = crate::kernels::row_groups(self.gqa().max(1)).1;
        if self.batch as u64 * self.kv_heads as u64 * row_groups as u64 > 65535 {
            // One decode workgroup row per (sequence, kv head, row group of at most 8 query
            // heads): WebGPU's dispatch limit.
            return bad(format!(
                "batch x kv_heads x ceil(gqa / 8) ({} x {} x {row_groups}) must be at most 65535",
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
        if let Some(c) = self.softcap
            && !(c.is_finite() && c > 0.0)
        {
            return bad(format!("softcap {c} must be finite and positive"));
        }
        self.check_sink_logits()?;
        if self.exact.k_mean && (self.softcap.is_some() || self.sink_logits.is_some()) {
            // Scores taken against K less its mean are shifted by q . mean: the softmax is
            // unchanged, but a cap of the shifted score or a sink beside it is not.
            return bad(
                "K's mean (ExactTokens::k_mean) shifts every score, which a softcap or sink logits would not follow: not with either"
                    .into(),
            );
        }
        for (what, splits) in [("splits", self.splits), ("chunk splits", self.chunk_splits)] {
            if let Some(s) = splits
                && !(1..=1024).contains(&s)
            {
                return bad(format!("{what} {s} must be between 1 and 1024"));
            }
        }
        // The kernels' shape rules: head sizes, GQA ratio, workgroup.
        check_shape(self.head_dim, self.v_width(), self.gqa(), self.workgroup).map_err(
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
        self.codecs.check_widths(self.head_dim, self.v_width())?;
        Ok(())
    }

    /// The sink logits' length and values (a host slice) or size and usage (a buffer).
    fn check_sink_logits(&self) -> Result<()> {
        let want = self.layers as usize * self.q_heads as usize;
        match &self.sink_logits {
            None => Ok(()),
            Some(SinkLogits::Host(v)) => {
                if v.len() != want {
                    return Err(KvqError::WrongLength {
                        what: format!(
                            "sink logits ([layers, q_heads] = [{}, {}])",
                            self.layers, self.q_heads
                        ),
                        expected: want,
                        got: v.len(),
                    });
                }
                match v.iter().position(|x| !x.is_finite()) {
                    Some(i) => Err(KvqError::InvalidSpec(format!(
                        "sink logit {i} (layer {}, query head {}) is {}: sink logits must be finite",
                        i / self.q_heads as usize,
                        i % self.q_heads as usize,
                        v[i]
                    ))),
                    None => Ok(()),
                }
            }
            Some(SinkLogits::Buffer(b)) => {
                let need = want as u64 * 4;
                if b.size() < need {
                    return Err(KvqError::BadBuffer {
                        what: "sink logits".into(),
                        problem: format!(
                            "{} bytes, needs at least {need} ([layers, q_heads] = [{}, {}] f32)",
                            b.size(),
                            self.layers,
                            self.q_heads
                        ),
                    });
                }
                if !b.usage().contains(wgpu::BufferUsages::COPY_SRC) {
                    return Err(KvqError::BadBuffer {
                        what: "sink logits".into(),
                        problem: format!(
                            "usage {:?} lacks COPY_SRC (the cache copies them)",
                            b.usage()
                        ),
                    });
                }
                Ok(())
            }
        }
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

    #[test]
    fn each_options_bad_input_is_a_typed_error_naming_it() {
        let base = || CacheSpec::new(2, 8, 2, 64, 1024);
        let msg = |s: CacheSpec| s.validate().unwrap_err().to_string();
        // Sink logits: [layers, q_heads] finite values.
        assert!(matches!(
            base().with_sink_logits(vec![0.0; 8]).validate(),
            Err(KvqError::WrongLength {
                expected: 16,
                got: 8,
                ..
            })
        ));
        let mut nan = vec![0.0; 16];
        nan[9] = f32::NAN;
        assert!(msg(base().with_sink_logits(nan)).contains("layer 1, query head 1"));
        assert!(base().with_sink_logits(vec![0.5; 16]).validate().is_ok());
        // Softcap: finite and positive.
        for c in [0.0, -1.0, f32::INFINITY, f32::NAN] {
            assert!(msg(base().with_softcap(c)).contains("softcap"), "{c}");
        }
        assert!(base().with_softcap(50.0).validate().is_ok());
        // A window per layer: one entry a layer, each within the capacity, not beside one
        // window for all.
        assert!(msg(base().with_layer_windows(vec![Some(4)])).contains("1 entries for 2 layers"));
        assert!(msg(base().with_layer_windows(vec![None, Some(0)])).contains("layer 1's window 0"));
        assert!(msg(base().with_layer_windows(vec![None, Some(2000)])).contains("2000"));
        assert!(msg(base().with_window(8).with_layer_windows(vec![None, None])).contains("both"));
        assert!(
            msg(base()
                .with_layer_windows(vec![Some(8), None])
                .with_exact(4, 4))
            .contains("exact")
        );
        // K's mean shifts scores: not with a cap or sinks.
        let kmean = || base().with_exact(4, 0).with_k_mean();
        assert!(msg(kmean().with_softcap(30.0)).contains("shifts"));
        assert!(msg(kmean().with_sink_logits(vec![0.0; 16])).contains("shifts"));
    }

    #[test]
    fn the_head_size_rule_is_multiples_of_8_from_32_to_256_and_the_mla_pairs() {
        for (dk, dv) in [
            (32, 32),
            (40, 40),
            (80, 80),
            (192, 128),
            (256, 256),
            (576, 512),
            (512, 512),
        ] {
            assert!(check_head_dims(dk, dv).is_ok(), "{dk} {dv}");
        }
        for (dk, dv) in [
            (24, 24),
            (44, 44),
            (264, 264),
            (512, 576),
            (576, 576),
            (640, 512),
        ] {
            let e = check_head_dims(dk, dv).unwrap_err();
            assert!(
                e.contains(&dk.to_string()) && e.contains("multiple of 8"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_layer_with_a_window_of_its_own_keeps_its_window_and_the_slack_in_whole_blocks() {
        let s = CacheSpec::new(6, 8, 4, 256, 32768).with_layer_windows(vec![
            Some(1024),
            Some(1024),
            None,
            Some(100),
            Some(32768),
            None,
        ]);
        assert_eq!(s.layer_capacity(0), 1024 + DEFAULT_WINDOW_SLACK);
        assert_eq!(s.layer_capacity(2), 32768);
        // 100 + 256 in whole blocks of 32, and never past the capacity.
        assert_eq!(s.layer_capacity(3), 384);
        assert_eq!(s.layer_capacity(4), 32768);
        assert_eq!(s.clone().with_window_slack(0).layer_capacity(3), 128);
        assert_eq!((s.layer_window(2), s.layer_window(3)), (None, Some(100)));
        assert!(s.any_window() && !CacheSpec::new(1, 1, 1, 64, 8).any_window());
        // One window for all layers: every layer a ring of the capacity.
        let w = CacheSpec::new(2, 1, 1, 64, 512).with_window(100);
        assert_eq!((w.layer_window(1), w.layer_capacity(1)), (Some(100), 512));
    }
}
