//! A cache's kernel configuration and the one table of constants its modules are assembled
//! against: every shape, codec and tuning number the WGSL reads is decided here.

use super::module::{InputType, KernelModule};
use super::preprocess::{self, Defines, Value};
use super::workgroup::{self, WORKGROUP_MEMORY_NEEDED};
use crate::codec::{Codec, CodecKind, FAMILIES, ScaleMode};
use crate::error::{KvqError, Result};
use crate::spec::check_shape;

/// Tokens per K interleave block (`KB` in the WGSL): K rows are stored interleaved chunk by
/// chunk across blocks of this many tokens, and storage segments start on whole blocks.
pub(crate) const K_BLOCK: u32 = 32;

/// Everything a kernel's source depends on. [`crate::KvCache`] derives it from its spec and
/// the device's tuning ([`crate::KvCache::kernel_config`] shows the result); tests and
/// exporters may build one directly, and [`KernelConfig::check`] refuses what the kernels
/// are not written for. A cache's splits and workgroup size are set through its spec
/// ([`crate::CacheSpec::with_splits`], [`crate::CacheSpec::workgroup`]); what the kernels
/// derive from these fields (tile widths, unrolls, workgroup arrays) is internal.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelConfig {
    /// Head dimension: values per K vector and per query.
    pub head_dim: u32,
    /// Values per V vector and per output (the kernels serve `head_dim` only today:
    /// [`KernelConfig::check`]).
    pub v_head_dim: u32,
    /// GQA ratio (query heads per KV head).
    pub gqa: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Batch (sequences).
    pub batch: u32,
    /// Capacity in tokens (slots per sequence; a ring of them with a sliding window).
    pub capacity: u32,
    /// Sliding window: attend only the last this many tokens, keeping the last `capacity` in a
    /// ring (see [`crate::CacheSpec::window`]). `None`: attend everything, up to `capacity`.
    pub window: Option<u32>,
    /// Layers.
    pub layers: u32,
    /// Decode splits per storage segment.
    pub splits: u32,
    /// The most decode splits per storage segment the reduce kernel is sized for: one pass
    /// of its lanes covers this many splits' slots, so that caches with fewer splits (a
    /// larger batch, a shorter capacity) share its text, and more take more passes. A cache
    /// takes its adapter's largest split count ([`crate::tuning::SplitRule::max`]), or its own
    /// where that is larger.
    pub max_splits: u32,
    /// Storage segments per layer.
    pub segments: u32,
    /// Fewest tokens a decode split takes before fewer splits are used.
    pub min_chunk: u32,
    /// Softmax scale.
    pub scale: f32,
    /// Logit softcap ([`crate::CacheSpec::softcap`]): read at run time, not in the text.
    pub softcap: Option<f32>,
    /// Whether the cache has sink logits ([`crate::CacheSpec::sink_logits`], kept after the
    /// codec constants): read at run time, not in the text.
    pub sinks: bool,
    /// Invocations per decode workgroup.
    pub workgroup: u32,
    /// K codec.
    pub k: Codec,
    /// V codec.
    pub v: Codec,
    /// Tokens kept exact beside their codes (see [`crate::ExactTokens`]).
    pub exact: crate::spec::ExactTokens,
    /// The shape numbers baked into the kernels' text rather than read from uniforms, by
    /// their WGSL names ([`crate::tuning::DeviceTuning::baked_shape`]: a cache takes its
    /// adapter's).
    pub baked_shape: &'static [&'static str],
    /// Whether the layers' rings differ (a window per layer,
    /// [`crate::CacheSpec::layer_windows`]): then the shape numbers that differ between
    /// layers are read from each layer's params even where [`KernelConfig::baked_shape`]
    /// names them ([`KernelConfig::bakes`]), so that every layer runs the same text with its
    /// own ring. [`KernelConfig::capacity`], `window` and `segments` are then the global
    /// layers' (a local layer's come from its [`crate::CacheSpec::layer_capacity`]).
    pub layer_shapes: bool,
    /// The products' arithmetic ([`crate::Precision`]). A cache's is resolved for its codecs
    /// and adapter: `Exact` or `Fast`, `Fast` only where the adapter has `shader-f16`. One
    /// built by hand may say `Auto`, which these kernels resolve as a cache does
    /// ([`crate::Precision::resolve`]); `Fast` kernels need `shader-f16`.
    pub precision: crate::spec::Precision,
    /// The matrix units the chunk module's prefill kernel puts its products on
    /// (`wgsl/kernels/prefill_matrix.wgsl`), or `None`: FP32 and packed-f16 lanes. A cache
    /// takes its context's ([`crate::GpuContext::matrix_units`]) where its products are
    /// `Fast`, it keeps no exact tokens and the kernel's tile fits the adapter's workgroup
    /// memory.
    pub matrix: Option<crate::MatrixUnits>,
}

impl KernelConfig {
    /// A configuration of K codec `k` and V codec `v` at `head_dim` (K and V), GQA `gqa`, for
    /// tests and exporters to adjust with struct-update syntax: one layer of one sequence and
    /// one KV head, 4096 tokens in one storage segment, 4 splits, scale `1/sqrt(head_dim)`,
    /// 128-invocation workgroups, exact products, every shape number a uniform, and no window,
    /// exact tokens, softcap, sink logits or matrix units.
    pub fn new(head_dim: u32, gqa: u32, k: Codec, v: Codec) -> KernelConfig {
        KernelConfig {
            head_dim,
            v_head_dim: head_dim,
            gqa,
            kv_heads: 1,
            batch: 1,
            capacity: 4096,
            window: None,
            layers: 1,
            splits: 4,
            max_splits: 4,
            segments: 1,
            min_chunk: 32,
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
            sinks: false,
            workgroup: 128,
            k,
            v,
            exact: crate::spec::ExactTokens::NONE,
            baked_shape: &[],
            layer_shapes: false,
            precision: crate::spec::Precision::Exact,
            matrix: None,
        }
    }

    /// Whether this cache's kernels are compiled with wgpu's index clamping: every codec but a
    /// rotated V codec's (see the crate-internal `kernels::cache::Compile::checks` for the measurements and
    /// why every index is in range without it).
    pub fn clamps_indices(&self) -> bool {
        // The audits hold for the shapes `CacheSpec::validate` accepts at head sizes that are
        // multiples of 32; other head sizes, and a configuration built by hand outside them,
        // keep the clamps.
        let shape_ok = self.check().is_ok() && !self.v.qjl && self.head_dim.is_multiple_of(32);
        !(self.v.kind.is_rotated() && shape_ok)
    }

    /// Checks what the kernels' assembly assumes, so that it cannot panic and every module
    /// it builds is one the audits cover: the shape rules, GPU codecs that serve the
    /// head_dim, and no count of zero.
    pub fn check(&self) -> Result<()> {
        for c in [self.k, self.v] {
            c.layout(self.head_dim)?;
            if c.qjl && !self.head_dim.is_multiple_of(32) {
                // The sign bits are read and projected 32 at a time.
                return Err(KvqError::UnsupportedHeadDim {
                    head_dim: self.head_dim,
                    codec: c.name(),
                    reason: "the GPU kernels' QJL residual needs a multiple of 32 (its sign bits are read 32 at a time)".into(),
                });
            }
            if !gpu_supported(c) {
                return Err(KvqError::InvalidSpec(format!(
                    "codec '{}' has a CPU reference (kvq::codec) but no GPU kernels: the QJL-only configurations (0-bit codes) are for quality studies",
                    c.name()
                )));
            }
        }
        check_shape(
            self.head_dim,
            self.v_head_dim,
            self.gqa,
            Some(self.workgroup),
        )
        .map_err(|(rule, why)| KvqError::InvalidSpec(format!("kernel config ({rule:?}): {why}")))?;
        let counts = [
            self.kv_heads,
            self.batch,
            self.capacity,
            self.layers,
            self.splits,
            self.max_splits,
            self.segments,
        ];
        if counts.contains(&0) {
            return Err(KvqError::InvalidSpec(
                "kernel config: kv_heads, batch, capacity, layers, splits, max_splits and segments must be at least 1".into(),
            ));
        }
        self.check_baked_shape()?;
        Ok(())
    }

    /// Decode splits over all segments (the partials per query head): per segment, `splits`
    /// over the stored tokens and one for the tokens a fused step appends.
    pub(crate) fn splits_total(&self) -> u32 {
        (self.splits + 1) * self.segments
    }

    /// Partial slots per query row: every split's, and with exact tokens one more for theirs
    /// (in the caller's domain; the reduce adds it after un-rotating the others).
    pub(crate) fn partial_slots(&self) -> u32 {
        self.splits_total() + self.exact.any() as u32
    }

    /// The table of constants every module of this configuration is assembled against (and
    /// emits as WGSL `const`s): the one place a number the kernels use is decided.
    fn defines(&self) -> Defines {
        self.defines_with(self.kv_joint(), 1)
    }

    /// [`Self::defines`] with K's encoder encoding V too or not ([`Self::kv_joint`]), and
    /// `cq` new tokens of a chunk per split workgroup (`CQ`; 1 but for the chunk module,
    /// [`Self::chunk_queries`]). (Only for a configuration [`Self::check`] accepts: the
    /// layouts exist.)
    fn defines_with(&self, joint: bool, cq: u32) -> Defines {
        let er = self.encode_rows_with(joint);
        // The query rows of a split workgroup: its row group's heads (the GQA group, or a
        // share of a group of more than GROUP_ROWS) times the chunk's tokens.
        let (g, groups) = row_groups(self.gqa);
        let rows = g * cq;
        let mut h = Defines::default();
        let mut c = |name: &str, v: u32| h.constant(name, Value::U32(v));
        for f in &FAMILIES {
            c(f.wgsl_kind, f.kind.id());
        }
        c("D", self.head_dim);
        c("G", g);
        c("GQ", self.gqa);
        c("NRG", groups);
        c("CQ", cq);
        c("GR", rows);
        c("SINK", self.exact.sink);
        c("RECENT", self.exact.recent);
        c("XRING", self.exact.ring());
        c("WG", self.workgroup);
        c("KU", k_unroll(self.head_dim));
        c("XKB", exact_k_batch(self.head_dim));
        c("VU", V_UNROLL);
        // A chunk's rows take the registers a decode's V batch has in flight.
        c("VB", (self.v_batch() / cq).max(1));
        c("VBF", (self.v_batch_full() / cq).max(1));
        c("KCG", CODE_GROUPS);
        c("KTG", self.k_tail_groups());
        c("QV", self.query_values(rows));
        c("K_CHUNKS", self.k.row_words(self.head_dim) / 4);
        c("KB", K_BLOCK);
        let cst = self.constant_offsets();
        for (side, codec, off) in [("K", self.k, cst.k), ("V", self.v, cst.v)] {
            let d = self.head_dim;
            let l = codec.layout(d).expect("callers check() first");
            let mut c = |name: &str, v: u32| h.constant(&format!("{side}_{name}"), Value::U32(v));
            c("WORDS", l.words);
            c("BITS", l.code_bits);
            c("SIDE_WORD", l.side_offset_bits / 32);
            c("SIDE_BIT", l.side_offset_bits);
            c("NSIDE", l.n_side);
            c("NC", l.n_codes);
            c("CODE_WORDS", (l.n_codes * l.code_bits).div_ceil(32));
            c("TASKS", encode_tasks(codec, d));
            c("KIND", codec.kind.id());
            c("ROT", off.rot);
            c("LV", off.levels);
            c("BD", off.bounds);
            c("QJL_WORD", l.qjl_offset_bits.unwrap_or(0) / 32);
            c("QJL_NORM_BIT", l.qjl_norm_offset_bits);
            let mut b = |name: &str, v: bool| h.constant(&format!("{side}_{name}"), Value::Bool(v));
            b("INTERLEAVED", side == "K");
            b("ROTATED", codec.kind.is_rotated());
            b(
                "BLOCK32",
                codec.kind.is_rotated() && codec.scale == ScaleMode::Block32,
            );
            b("QJL", codec.qjl);
        }
        let mut c = |name: &str, v: u32| h.constant(name, Value::U32(v));
        c("QJL_S", cst.qjl);
        c("VW", self.v_width());
        c("VC", self.v_columns());
        c("PV4", self.partial_width() / 4);
        c("RP", self.reduce_slots());
        h.constant(
            "V_VSCALE",
            Value::Bool(self.v.kind.is_rotated() && self.v.scale == ScaleMode::PerVector),
        );
        h.constant("K_PAIRS", Value::Bool(self.k_pairs()));
        let mut c = |name: &str, v: u32| h.constant(name, Value::U32(v));
        // (A WGSL array needs one entry at least: 1, unused, without pairs.)
        c("K_NPAIR", self.k_pair_entries().max(1));
        c(
            "QSH",
            if self.k.kind.is_rotated() {
                1
            } else {
                rows * self.head_dim / 4
            },
        );
        c("SQN", if self.k.qjl { rows * self.head_dim } else { 4 });
        c("RW", self.rot_width());
        c("ER", er);
        h.constant("KV_JOINT", Value::Bool(joint));
        let mut c = |name: &str, v: u32| h.constant(name, Value::U32(v));
        c("RROWS", rows.max(er));
        c("DIAG_N", self.diag_len());
        c("SIDE_MAX", self.side_max());
        h.constant(
            "COOP",
            Value::Bool(self.k.kind.is_rotated() || self.v.kind.is_rotated()),
        );
        h.constant("EXACT", Value::Bool(self.exact.any()));
        h.constant("KMEAN", Value::Bool(self.exact.k_mean));
        self.shape_defines(&mut h);
        h
    }

    /// Whether the kernels that have f16 products use them ([`crate::Precision::Fast`]).
    pub(crate) fn half_products(&self) -> bool {
        let codecs = crate::codec::KvCodecs {
            k: self.k,
            v: self.v,
        };
        self.precision.resolve(&codecs) == crate::spec::Precision::Fast
    }

    /// The WGSL of `module` for this configuration.
    pub fn module_source(&self, module: KernelModule) -> Result<String> {
        self.check()?;
        let defines = match module {
            KernelModule::Chunk => self.defines_with(self.kv_joint(), self.chunk_queries()),
            _ => self.defines(),
        };
        self.module_source_with(module, defines)
    }

    /// New tokens of a chunk each split workgroup serves (`CQ`): its `G * CQ` query rows
    /// share every K/V tile it reads and decodes, so a chunk of `n` reads the store
    /// `ceil(n / CQ)` times, not `n`. At most [`CHUNK_ROWS`] rows, and the module's workgroup
    /// memory within the 32 KiB kvq asks of an adapter.
    pub(crate) fn chunk_queries(&self) -> u32 {
        let mut cq = (CHUNK_ROWS / row_groups(self.gqa).0).max(1);
        while cq > 1 && !self.chunk_fits(cq) {
            cq -= 1;
        }
        cq
    }

    /// Whether the chunk module with `cq` tokens per workgroup assembles within
    /// [`WORKGROUP_MEMORY_NEEDED`] bytes of workgroup memory (as WebGPU counts them).
    fn chunk_fits(&self, cq: u32) -> bool {
        self.module_source_with(KernelModule::Chunk, self.defines_with(self.kv_joint(), cq))
            .and_then(|src| workgroup::workgroup_bytes(&src, "split"))
            .is_ok_and(|b| b.webgpu <= WORKGROUP_MEMORY_NEEDED)
    }

    fn module_source_with(&self, module: KernelModule, mut defines: Defines) -> Result<String> {
        self.check()?;
        defines.switch("ENCODE", module.encodes());
        defines.switch("IN_F16", module.input() == Some(InputType::F16));
        defines.switch("CHUNK", module == KernelModule::Chunk);
        let matrix = self.matrix.filter(|_| module == KernelModule::Chunk);
        defines.switch("MM", matrix.is_some());
        defines.switch("MMN", matrix.is_some_and(|m| !m.emulated));
        // The prefill kernel's tile and products only where it is (the chunk module): the
        // other modules' text, and so the kernels a driver compiles and caches for them, is
        // the same whatever the precision.
        if module == KernelModule::Chunk {
            self.prefill_defines(&mut defines);
            let half = self.half_products();
            defines.constant("PH", Value::Bool(half));
            if half {
                defines.enable("f16");
            }
            if let Some(m) = matrix {
                self.matrix_defines(&mut defines, m)?;
                if !m.emulated {
                    defines.enable("wgpu_cooperative_matrix");
                }
            }
        }
        preprocess::assemble(module.root(), &defines)
    }

    /// Every kernel source with a short name, as compiled for this configuration.
    pub fn sources(&self) -> Result<Vec<(String, String)>> {
        KernelModule::all()
            .into_iter()
            .map(|m| Ok((m.name(), self.module_source(m)?)))
            .collect()
    }

    /// Workgroup memory the `split` kernel of the fused step uses (the larger of the two
    /// split kernels), in bytes as WebGPU counts it against `maxComputeWorkgroupStorageSize`
    /// (each variable rounded up to 16 bytes), read off the compiled module.
    pub(crate) fn split_workgroup_bytes(&self) -> Result<u32> {
        self.check()?;
        Ok(self.split_memory(self.defines())?.webgpu)
    }

    /// The fused step's `split` kernel's workgroup memory with `defines`.
    fn split_memory(&self, defines: Defines) -> Result<workgroup::WorkgroupBytes> {
        let src = self.module_source_with(KernelModule::Step(InputType::F16), defines)?;
        workgroup::workgroup_bytes(&src, "split")
    }

    /// Whether the rotated K reader looks its codes up two at a time (`K_PAIRS`, the level-pair
    /// table `lp_k` in wgsl/codecs/read_k_rot.wgsl): for codes of at most 3 bits (a table of at most
    /// 512 bytes) beside a V that is not rotated: there it made the K-only kernels faster;
    /// 4-bit codes' 2 KiB table takes the split kernel past the 12 KiB workgroup-memory cliff,
    /// and beside a rotated V the K+V kernels got slower (BENCHMARKS.md, "Kernel choices,
    /// measured").
    fn k_pairs(&self) -> bool {
        self.k.kind.is_rotated() && self.k.bits <= 3 && !self.v.kind.is_rotated()
    }

    /// Entries (two levels each) of the level-pair table: 0 without [`Self::k_pairs`].
    fn k_pair_entries(&self) -> u32 {
        if self.k_pairs() {
            1 << (2 * self.k.bits as u32)
        } else {
            0
        }
    }

    /// V values each decode thread accumulates per row: 8 for a rotated V codec (its 8 codes
    /// come from one or two words), else 4.
    pub(crate) fn v_width(&self) -> u32 {
        if self.v.kind.is_rotated() { 8 } else { 4 }
    }

    /// Value columns ([`KernelConfig::v_width`] values each) of the V accumulators: over
    /// `D`, or over a rotated V codec's `n_codes` (its output is un-rotated in the reduce).
    pub(crate) fn v_columns(&self) -> u32 {
        if self.v.kind.is_rotated() {
            n_codes(self.v, self.head_dim).div_ceil(self.v_width())
        } else {
            self.head_dim / 4
        }
    }

    /// V rows a decode thread loads together in a full tile (`$x` lines, `VBF`): 16 (64
    /// values) for an f16 or q8 V beside a K without QJL, else [`Self::v_batch`] (no separate
    /// full-tile loop): twice the rows in flight made those V readers faster at long contexts,
    /// and the other codecs slower (BENCHMARKS.md, "Kernel choices, measured"). A partial tile
    /// (short contexts, whose splits hold less than a tile) keeps the smaller batch, which
    /// measured better there.
    fn v_batch_full(&self) -> u32 {
        let f16_or_q8 = match self.v.kind {
            CodecKind::None => true,
            CodecKind::Sym => self.v.bits == 8,
            _ => false,
        };
        if f16_or_q8 && !self.k.qjl {
            64 / self.v_width()
        } else {
            self.v_batch()
        }
    }

    /// V rows a decode thread loads together (`$w` lines, `VB`): 32 values in flight.
    fn v_batch(&self) -> u32 {
        32 / self.v_width()
    }

    /// Groups of 4 codes in a rotated K's short last block of 32 (`$t` lines): rotor's
    /// n_codes is not a multiple of 32.
    fn k_tail_groups(&self) -> u32 {
        if self.k.kind.is_rotated() {
            (n_codes(self.k, self.head_dim) % 32).div_ceil(4)
        } else {
            0
        }
    }

    /// Split slots each reduce lane folds per pass (`$p` lines and `RP`): enough for
    /// [`KernelConfig::max_splits`] splits of one segment in one pass, at most 16 (the loads
    /// of a pass are all in flight at once).
    fn reduce_slots(&self) -> u32 {
        let lanes = 256 / (self.partial_width() / 4);
        (self.max_splits + 1).div_ceil(lanes).clamp(1, 16)
    }

    /// Query tasks each decode invocation loads (and rotates) for a rotated K (`$r` lines):
    /// per query row (`rows` of them), a rotor's groups of 3 coordinates, else the vec4s of
    /// its padded `rot_sh` row (wgsl/kernels/attention.wgsl, `query_task`).
    fn query_values(&self, rows: u32) -> u32 {
        let tasks = match self.k.kind {
            CodecKind::Rotor if !self.k.qjl => self.head_dim.div_ceil(3),
            k if k.is_rotated() => self.rot_width() / 4,
            _ => return 1,
        };
        (rows * tasks).div_ceil(self.workgroup)
    }

    /// Floats of turbo's diagonal kept in workgroup memory (`diag_sh`): D per turbo side, 1
    /// (unused) without one.
    fn diag_len(&self) -> u32 {
        let sides = [self.k, self.v]
            .iter()
            .filter(|c| c.kind == CodecKind::Turbo)
            .count() as u32;
        (sides * self.head_dim).max(1)
    }

    /// Floats of one partial output vector (per split and query head).
    pub(crate) fn partial_width(&self) -> u32 {
        self.v_columns() * self.v_width()
    }

    /// Row width of the rotation scratch: the largest rotated side's `n_codes`, padded to a
    /// multiple of 32 (4 when no side is rotated).
    pub(super) fn rot_width(&self) -> u32 {
        [self.k, self.v]
            .into_iter()
            .filter(|c| c.kind.is_rotated())
            .map(|c| n_codes(c, self.head_dim).next_multiple_of(32))
            .max()
            .unwrap_or(4)
    }

    /// Rows a workgroup encodes at once (rotated codecs): about 256 values per pass, and at
    /// least a token's K and V rows where they are encoded together ([`Self::kv_joint`]).
    #[cfg(test)]
    fn encode_rows(&self) -> u32 {
        self.encode_rows_with(self.kv_joint())
    }

    fn encode_rows_with(&self, joint: bool) -> u32 {
        let natural = (256 / self.rot_width()).clamp(1, 4);
        if joint { natural.max(2) } else { natural }
    }

    /// Whether K's encoder also encodes V (`KV_JOINT`): both sides the same rotated codec
    /// (the same rotation, levels and layout; the constants come from one seed) and no QJL.
    /// A token's two rows then share one chain of barriers instead of one each: in the fused
    /// step that chain is split 0's, on the step's critical path at short contexts (BENCHMARKS.md,
    /// "Kernel choices, measured"). Where a row is wider than 128 codes (D > 128, or rotor's
    /// 129 at D = 128) that takes a second encoder row of workgroup memory, added only while
    /// the split kernel stays within 12 KiB, past which the split kernels ran much slower
    /// (BENCHMARKS.md, "The 12 KiB workgroup-memory cliff"); larger shapes must still fit the
    /// 32 KiB of workgroup memory kvq asks for.
    fn kv_joint(&self) -> bool {
        let same = self.k.kind.is_rotated() && self.k == self.v && !self.k.qjl;
        // The cliff is in what the GPU allocates: the exact sum. (A module that fails to
        // assemble fails again, with its error, when it is built.)
        let fits = || {
            self.check().is_ok()
                && self
                    .split_memory(self.defines_with(true, 1))
                    .is_ok_and(|b| b.exact <= 12 * 1024)
        };
        same && (256 / self.rot_width() >= 2 || fits())
    }

    /// Most f16 sideband values of a row on either side.
    fn side_max(&self) -> u32 {
        [self.k, self.v]
            .into_iter()
            .map(|c| c.layout(self.head_dim).map(|l| l.n_side).unwrap_or(0))
            .max()
            .unwrap_or(0)
            .max(1)
    }
}

fn n_codes(c: Codec, head_dim: u32) -> u32 {
    c.layout(head_dim).map(|l| l.n_codes).unwrap_or(head_dim)
}

/// Independent encode tasks per stored row (each task writes whole words): a word per task
/// for f16; for q8/q4 one per code word, then one per scale word (two blocks' scales).
/// Rotated codecs have none: the workgroup encodes their rows together (`encode_rows`).
pub(crate) fn encode_tasks(codec: Codec, head_dim: u32) -> u32 {
    match codec.kind {
        CodecKind::None => head_dim / 2,
        CodecKind::Sym => head_dim * codec.bits as u32 / 32 + head_dim.div_ceil(64),
        _ => 0,
    }
}

/// Whether the GPU kernels serve `codec`: every codec but the QJL-only quality configuration
/// (`turbo0+qjl` and the like, 0-bit codes), which has a CPU reference only.
pub fn gpu_supported(codec: Codec) -> bool {
    codec.validate().is_ok() && codec.bits > 0
}

/// f16 K chunks (16 bytes each) one thread loads together before using them (`$u` lines):
/// 8 (half a D = 128 row; 4 measured slower, BENCHMARKS.md, "Kernel choices, measured") where
/// that divides the row's D / 8 chunks, else 4 where that does (the other multiples of 32),
/// else the largest count up to 8 that divides them (5 at D = 40 and 80, 7 at 112), or the
/// whole row where that would be under 4 and the row is at most 16 chunks (9 at D = 72, 11 at
/// 88, 13 at 104; one at a time past that, as at 136).
pub(crate) fn k_unroll(head_dim: u32) -> u32 {
    let chunks = head_dim / 8;
    if chunks.is_multiple_of(8) {
        return 8;
    }
    if chunks.is_multiple_of(4) {
        return 4;
    }
    let most = (1..=8)
        .rev()
        .find(|u| chunks.is_multiple_of(*u))
        .unwrap_or(1);
    if most < 4 && chunks <= 16 {
        chunks
    } else {
        most
    }
}

/// Query heads of one GQA group a split workgroup serves at most (`G`): a larger group is
/// spread over several workgroups (row groups, `NRG`), each reading the KV head's codes once
/// for its rows, so that no workgroup keeps more rows' state in registers than GQA 8 does
/// and the codes are read once per row group, never once per query head.
pub(crate) const GROUP_ROWS: u32 = 8;

/// The heads each split workgroup serves and the workgroups (row groups) a GQA group of
/// `gqa` heads is spread over: `ceil(gqa / 8)` groups of `ceil(gqa / groups)` heads (the last
/// may hold fewer: 71 heads are 9 groups of 8, the last of 7).
pub(crate) fn row_groups(gqa: u32) -> (u32, u32) {
    let groups = gqa.div_ceil(GROUP_ROWS).max(1);
    (gqa.div_ceil(groups), groups)
}

/// Word pairs of an exact K row (4 values each, `XC = D / 4` of them) the exact tokens'
/// workgroup loads before their math (`XKB`): the whole row up to 32 (D = 128), else the
/// most up to 32 that divide it (20 at D = 160, 28 at 224, 32 at 256), so that its passes
/// end at the row's end.
pub(crate) fn exact_k_batch(head_dim: u32) -> u32 {
    let xc = head_dim / 4;
    (1..=32.min(xc))
        .rev()
        .find(|u| xc.is_multiple_of(*u))
        .unwrap_or(1)
}

/// Query rows a chunk's split workgroup serves at most ([`KernelConfig::chunk_queries`]).
/// Every row keeps its output accumulators in registers and reads its query from workgroup
/// memory once per key, so the rows trade fewer store reads against registers and shared
/// loads: 8 rows (2 tokens a workgroup at GQA 4) ran faster than 4 or 16 (BENCHMARKS.md,
/// "Chunks").
pub(crate) const CHUNK_ROWS: u32 = 8;

/// Loads a thread issues together before using them in the QJL projection (`$v` lines of
/// kernels/attention.wgsl, `VU`).
pub(crate) const V_UNROLL: u32 = 8;

/// Groups of 4 codes in a block of 32 codes of a rotated K row (`$k` lines).
const CODE_GROUPS: u32 = 8;

#[cfg(test)]
pub(super) mod tests {
    use super::{KernelConfig, KernelModule, k_unroll};
    use crate::KvCodecs;
    use crate::spec::Precision;

    /// A one-layer configuration of `codecs` at `head_dim`, GQA 4 (the kernels' tests').
    pub(in crate::kernels) fn cfg(codecs: &str, head_dim: u32) -> KernelConfig {
        let c = KvCodecs::parse(codecs).unwrap();
        KernelConfig {
            kv_heads: 2,
            capacity: 256,
            scale: 0.125,
            ..KernelConfig::new(head_dim, 4, c.k, c.v)
        }
    }

    #[test]
    fn only_the_chunk_module_depends_on_the_precision() {
        // The f16 products are the prefill kernel's: every other module's text is the same,
        // so a driver's shader cache serves a Fast cache's kernels from an Exact one's.
        for codecs in ["q4_sym", "turbo3_sym", "k_turbo3+qjl"] {
            let exact = cfg(codecs, 128);
            let fast = KernelConfig {
                precision: Precision::Fast,
                ..exact
            };
            for m in KernelModule::all() {
                let (a, b) = (exact.module_source(m), fast.module_source(m));
                assert_eq!(
                    a.unwrap() == b.unwrap(),
                    m != KernelModule::Chunk,
                    "{codecs} {m:?}"
                );
            }
        }
    }

    #[test]
    fn the_exact_k_batch_divides_every_row() {
        // A batch that did not divide D / 4 read past the row (D = 160 and 224 did, with 32).
        for d in (32u32..=256).step_by(8) {
            let x = super::exact_k_batch(d);
            assert!(
                x > 0 && x <= 32 && (d / 4).is_multiple_of(x),
                "head_dim {d}: XKB {x}"
            );
        }
        assert_eq!(super::exact_k_batch(128), 32);
        assert_eq!(super::exact_k_batch(256), 32);
    }

    #[test]
    fn k_unroll_divides_every_row() {
        // The f16 K reader loads KU chunks per pass over D / 8: a KU that did not divide it
        // would read past the row (D = 96 with KU = 8 did, caught by the GPU tests).
        for d in (32u32..=256).step_by(8) {
            let ku = k_unroll(d);
            assert!(
                ku > 0 && (d / 8).is_multiple_of(ku),
                "head_dim {d}: KU {ku}"
            );
        }
    }

    #[test]
    fn index_clamps_only_where_v_is_not_rotated_or_the_shape_is_unchecked() {
        for (codecs, clamps) in [
            ("none", true),
            ("q8_sym", true),
            ("k_turbo3", true),
            ("k=turbo3,v=q8", true),
            ("turbo3_sym", false),
            ("iso4b_sym", false),
            ("k=q8,v=rotor3", false),
            ("k=turbo3+qjl,v=iso3", false),
        ] {
            assert_eq!(cfg(codecs, 128).clamps_indices(), clamps, "{codecs}");
        }
        // A configuration built by hand outside the validated shapes keeps the clamps.
        assert!(cfg("turbo3_sym", 40).clamps_indices());
        let mut odd = cfg("turbo3_sym", 128);
        odd.workgroup = 32;
        assert!(odd.clamps_indices());
    }

    #[test]
    fn joint_encoding_only_for_one_rotated_codec_and_within_the_memory_bound() {
        for (codecs, d, joint) in [
            ("turbo3_sym", 128, true),
            ("iso4_sym", 128, true),
            // 129 codes: a second encoder row, and the split kernel stays under 12 KiB.
            ("rotor3_sym", 128, true),
            ("k_turbo3", 128, false),
            ("k=turbo3,v=turbo4", 128, false),
            ("k=iso3,v=rotor3", 128, false),
            ("k=turbo3+qjl,v=turbo3", 128, false),
        ] {
            let c = cfg(codecs, d);
            assert_eq!(c.kv_joint(), joint, "{codecs}");
            assert!(c.encode_rows() >= if joint { 2 } else { 1 }, "{codecs}");
        }
        // Wide rows at a large workgroup: the second encoder row would pass 12 KiB, so none is
        // added, and the kernel keeps the memory it had (within the 32 KiB kvq asks for).
        let mut wide = cfg("turbo3_sym", 256);
        wide.gqa = 6;
        wide.workgroup = 256;
        assert!(!wide.kv_joint());
        assert_eq!(wide.encode_rows(), 1);
        assert!(wide.split_workgroup_bytes().unwrap() <= 32 * 1024);
    }

    #[test]
    fn level_pairs_only_for_small_k_codes_beside_an_unrotated_v_and_under_12_kib() {
        for (codecs, pairs) in [
            ("k_turbo2", true),
            ("k_turbo3", true),
            ("k_rotor3", true),
            ("k_iso3b", true),
            ("k_turbo3+qjl", true),
            ("k=iso3,v=q8", true),
            ("k_turbo4", false),
            ("k_rotor4", false),
            ("turbo3_sym", false),
            ("k=turbo3,v=iso3", false),
            ("none", false),
            ("q8_sym", false),
        ] {
            let c = cfg(codecs, 128);
            assert_eq!(c.k_pairs(), pairs, "{codecs}");
            assert_eq!(
                c.k_pair_entries(),
                if pairs { 1 << (2 * c.k.bits as u32) } else { 0 }
            );
        }
        // At the shape it was measured on (qwen3-8b: GQA 4, D 128, 128 invocations), the table
        // keeps every split kernel it is added to under the 12 KiB past which they ran much
        // slower (BENCHMARKS.md, "The 12 KiB workgroup-memory cliff"). The QJL kernel was past it before the table.
        for codecs in [
            "k_turbo2",
            "k_turbo3",
            "k_rotor3",
            "k_iso3",
            "k=turbo3,v=q8",
        ] {
            let c = cfg(codecs, 128);
            assert!(c.split_workgroup_bytes().unwrap() <= 12 * 1024, "{codecs}");
        }
    }
}
