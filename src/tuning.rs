//! Device tuning: the decode defaults kvq has measured, per device, in one table.
//!
//! WebGPU reports neither a GPU's multiprocessors nor the registers its compiler gives a
//! kernel, so the default split count and decode workgroup of a [`crate::KvCache`] come from
//! measurements on named devices ([`MEASURED`]); an adapter that none of them matches gets
//! [`UNMEASURED`]. [`for_adapter`] is the one place an adapter is matched to its tuning
//! ([`crate::GpuContext::tuning`] asks it for a context's adapter).
//!
//! [`crate::CacheSpec::with_splits`] and [`crate::CacheSpec::workgroup`] override what a
//! tuning picks, on any device.

use crate::spec::CacheSpec;

/// How a tuning recognises its adapters from [`wgpu::AdapterInfo`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterMatch {
    /// A CPU implementation of the API (lavapipe, llvmpipe, WARP, SwiftShader):
    /// `device_type` is [`wgpu::DeviceType::Cpu`], as [`crate::GpuContext::is_cpu`] tests.
    Cpu,
    /// Every adapter: the fallback, [`UNMEASURED`]'s, taken when no measured tuning matches.
    Otherwise,
    /// A PCI vendor id and a substring of the adapter's name (case-sensitive).
    Named {
        /// PCI vendor id (`AdapterInfo::vendor`; 0x10de is NVIDIA).
        vendor: u32,
        /// A substring of `AdapterInfo::name`.
        name_contains: &'static str,
    },
}

impl AdapterMatch {
    /// Whether `info` is one of this rule's adapters.
    pub fn matches(&self, info: &wgpu::AdapterInfo) -> bool {
        match *self {
            AdapterMatch::Cpu => info.device_type == wgpu::DeviceType::Cpu,
            AdapterMatch::Otherwise => true,
            AdapterMatch::Named {
                vendor,
                name_contains,
            } => info.vendor == vendor && info.name.contains(name_contains),
        }
    }
}

/// What the split kernel of a cache costs a multiprocessor: the inputs of a
/// [`SplitRule::OneWave`] residency rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitKernel {
    /// GQA ratio (query heads per KV head).
    pub gqa: u32,
    /// K or V is a rotated codec (turbo, rotor, iso).
    pub rotated: bool,
    /// The heavier register families: a QJL K, or an f16 or int K (its query kept in
    /// workgroup memory) beside a rotated V (8 values per invocation), which holds more
    /// registers than either family alone.
    pub heavy: bool,
}

impl SplitKernel {
    /// The split kernel `spec`'s codecs and GQA ratio build.
    pub fn of(spec: &CacheSpec) -> SplitKernel {
        let c = spec.codecs;
        SplitKernel {
            gqa: spec.gqa(),
            rotated: c.k.kind.is_rotated() || c.v.kind.is_rotated(),
            heavy: c.k.qjl || (c.v.kind.is_rotated() && !c.k.kind.is_rotated()),
        }
    }
}

/// How a tuning picks the decode splits per KV head when the spec leaves them unset.
#[derive(Clone, Copy, Debug)]
pub enum SplitRule {
    /// One split per `tokens_per_split` token positions of a storage segment, between 1 and
    /// `max`.
    ByTokens {
        /// Token positions each split is given before another split is added.
        tokens_per_split: u32,
        /// Most splits.
        max: u32,
    },
    /// The largest split grid (KV heads × sequences rows of splits + 1 workgroups) that fits
    /// in one wave of resident workgroups, between 1 and `max` splits.
    OneWave {
        /// Multiprocessors (NVIDIA SMs, AMD CUs, Apple GPU cores) the wave is counted over.
        multiprocessors: u32,
        /// Split workgroups of [`SplitRule::RESIDENT_AT`] invocations one multiprocessor
        /// holds for a split kernel (a wider workgroup holds proportionally fewer).
        resident: fn(SplitKernel) -> u32,
        /// Most splits per KV head.
        max: u32,
    },
}

impl SplitRule {
    /// The workgroup size (invocations) a [`SplitRule::OneWave`] `resident` rule counts in.
    pub const RESIDENT_AT: u32 = 128;

    /// The most splits per KV head this rule gives any cache.
    pub fn max(&self) -> u32 {
        match *self {
            SplitRule::ByTokens { max, .. } | SplitRule::OneWave { max, .. } => max,
        }
    }

    /// Splits per KV head for `spec`, whose storage segments hold `segment_tokens` positions.
    pub fn splits(&self, spec: &CacheSpec, segment_tokens: u32, workgroup: u32) -> u32 {
        match *self {
            SplitRule::ByTokens {
                tokens_per_split,
                max,
            } => segment_tokens.div_ceil(tokens_per_split).clamp(1, max),
            SplitRule::OneWave {
                multiprocessors,
                resident,
                max,
            } => {
                // Split workgroups per split: one per row group of each KV head and sequence.
                let groups = spec
                    .kv_heads
                    .saturating_mul(spec.batch)
                    .saturating_mul(crate::kernels::row_groups(spec.gqa().max(1)).1);
                let slots = multiprocessors * resident(SplitKernel::of(spec)) * Self::RESIDENT_AT
                    / workgroup.max(1);
                (slots / groups.max(1)).saturating_sub(1).clamp(1, max)
            }
        }
    }
}

/// How a tuning picks a chunk slice's splits per storage segment when the spec leaves them
/// unset ([`CacheSpec::chunk_splits`]): from the decode's splits (one wave of single-query
/// workgroups per KV head and sequence) and the slice's workgroups per KV head and split
/// (`groups`: the split kernel's query groups, or the prefill kernel's row tiles), so that
/// the slice's grid holds `waves` decode grids' worth of split workgroups: a slice of many
/// query groups already fills the GPU, and more splits only write and merge more partials
/// and give each split fewer tiles to spread its query loads over.
#[derive(Clone, Copy, Debug)]
pub struct ChunkSplitRule {
    /// Decode grids' worth of workgroups a split kernel slice aims for.
    pub split_waves: u32,
    /// The same where V is rotated (turbo, rotor or iso: eight values an invocation), whose
    /// chunk split kernel holds more registers than its decode (168 against 126 for
    /// `turbo3_sym` on an H200), so that fewer of its workgroups fit a multiprocessor and one
    /// decode grid runs as a wave and a third.
    pub rotated_v_waves: u32,
    /// The same for a prefill kernel slice.
    pub prefill_waves: u32,
    /// Fewest splits (unless the decode has fewer).
    pub min: u32,
}

impl ChunkSplitRule {
    /// Splits per segment for a slice of `spec`'s cache of `groups` workgroups per KV head and
    /// split (the prefill kernel's where `prefill`), under a decode of `decode` splits.
    pub fn splits(&self, spec: &CacheSpec, groups: u32, prefill: bool, decode: u32) -> u32 {
        let waves = if prefill {
            self.prefill_waves
        } else if spec.codecs.v.kind.is_rotated() {
            self.rotated_v_waves
        } else {
            self.split_waves
        };
        (decode.saturating_mul(waves) / groups.max(1)).clamp(self.min.min(decode), decode)
    }
}

/// Chunk splits as measured on an H100 SXM (BENCHMARKS.md, "A chunk's split count"; qwen3-8b
/// over 32k, 64 decode splits, chunks of 4 to 512 tokens, three calls): one decode grid for
/// the split kernel (32 splits at 4 new tokens, 16 at 8, 8 at 16, 4 from 64 on: `none` and
/// `q4_sym` within 2.5 % of the best count at each n, 0.70–0.93× the time with 64); two where
/// V is rotated (64, 32 and 16 splits at 4, 8 and 16 tokens: `turbo3_sym`, `iso3_sym`,
/// `rotor3_sym` within 2.6 % of the best, where one grid's 32 splits at 4 tokens took 1.14×
/// the time of 64); four for the prefill kernel (32 splits at 64 tokens, 8 at 512: within
/// 1.4 % of the best for `q4_sym`, and at 64 tokens the best for a rotated V, whose 16 took
/// 1.08×); at least 4. Unmeasured adapters take it too: it follows the decode's split count,
/// which is their own one-wave estimate.
pub const CHUNK_SPLITS: ChunkSplitRule = ChunkSplitRule {
    split_waves: 1,
    rotated_v_waves: 2,
    prefill_waves: 4,
    min: 4,
};

/// The decode defaults for one kind of device.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct DeviceTuning {
    /// What the tuning is for, in words.
    pub name: &'static str,
    /// Which adapters get it.
    pub adapters: AdapterMatch,
    /// How the default decode split count is chosen.
    pub splits: SplitRule,
    /// Invocations per decode workgroup (64, 128 or 256).
    pub decode_workgroup: u32,
    /// New tokens per sequence from which a chunk slice is attended by the prefill kernel
    /// ([`CacheSpec::prefill_from`]) with f32 products; `None`: never (the chunk's split
    /// kernel).
    pub prefill_from: Option<u32>,
    /// The same with f16 products ([`crate::Precision::Fast`] on an adapter with
    /// `shader-f16`), which make the prefill kernel a different kernel for speed.
    pub prefill_from_f16: Option<u32>,
    /// The same for the prefill kernel on matrix units, where the cache has them
    /// ([`DeviceTuning::matrix_units`], [`crate::GpuContext::matrix_units`]): from how many
    /// new tokens it replaces the split kernel. A QJL K takes it too (its signs are one more
    /// f16 tile pass, not a slower kernel).
    pub prefill_from_matrix: Option<u32>,
    /// How a chunk slice's splits follow from its size.
    pub chunk_splits: ChunkSplitRule,
    /// The cache's shape numbers this device's kernels keep baked into their text, by their
    /// WGSL names (`NB`, `CAP`, `WIN`, `RING`, `LAYERS`, `KVH`, `QH`, `NSPLIT`,
    /// `SPLITS_TOTAL`, `PSLOTS`, `MIN_CHUNK`, `CST`, `KMU`, `SCALE`); the others are read
    /// from uniforms at run time. A baked number makes caches that differ in it compile
    /// kernels of their own; a uniform one may cost the kernels time. Empty: every number
    /// is a uniform, so caches of any capacity, batch, window, layers and splits share one
    /// compile ([`crate::GpuContext::compiled_pipelines`]). For a measurement, the environment
    /// variable `KVQ_BAKE` (comma-separated names, `all`, or empty for none) takes its place
    /// for every cache of the process; either way the kernels compute the same results. A
    /// cache with a window per layer reads the numbers that differ between its layers from
    /// their params all the same ([`crate::KernelConfig::bakes`]).
    pub baked_shape: &'static [&'static str],
    /// Whether kvq asks this adapter for cooperative matrices and puts the chunk kernels'
    /// products on them (where it offers fragments kvq's matrix kernels are written for:
    /// [`crate::GpuContext::matrix_units`]): where they measured faster than the kernels
    /// they replace, so far nowhere (the matrix prefill kernel has not run on hardware yet).
    /// For a measurement, `KVQ_MATRIX=on` or `off` in the environment takes its place for
    /// every context the process opens.
    pub matrix_units: bool,
}

/// The shape numbers whose move from the kernels' text to uniforms cost more than 2 % of a
/// decode step or a chunk somewhere on an H100 SXM (qwen3-8b, `none`, `q4_sym`,
/// `turbo3_sym`, `k_iso3` at 4k and 32k, steps and chunks of 4 and 512; BENCHMARKS.md, "One
/// compile per kernel"): `NB`, `CAP` and `LAYERS` up to 4 % of a 4k step, `WIN` and `RING` up
/// to 5 % of a chunk, `KVH` and `QH` up to 6 % of a chunk of 4, the split counts up to 4 % of
/// a 4k step; `CST`, `KMU` and `SCALE` within ±1 %. There a kernel compiles in about 0.4 s,
/// so a cache of another size pays that once rather than the step's time at every step.
pub const BAKED_ON_NVIDIA: &[&str] = &[
    "NB",
    "CAP",
    "LAYERS",
    "WIN",
    "RING",
    "KVH",
    "QH",
    "NSPLIT",
    "SPLITS_TOTAL",
    "PSLOTS",
    "MIN_CHUNK",
];

impl DeviceTuning {
    /// The prefill threshold for `spec`: its own [`CacheSpec::prefill_from`], else this
    /// tuning's for its kernels' products (`half`: f16, [`crate::Precision::Fast`] where the
    /// adapter has it; `matrix`: on matrix units).
    ///
    /// A tuned threshold for the FP32 / packed-f16 kernel skips a QJL K: that kernel scores
    /// the signs' S q beside the codes, a query row twice as wide, and measured slower than
    /// its split kernel on the H200 (1.28× at 64 new tokens, 1.43× at 512, with f16 products).
    pub fn prefill_from(&self, spec: &CacheSpec, half: bool, matrix: bool) -> Option<u32> {
        let tuned = match (matrix, half) {
            (true, _) => self.prefill_from_matrix,
            (false, true) => self.prefill_from_f16.filter(|_| !spec.codecs.k.qjl),
            (false, false) => self.prefill_from.filter(|_| !spec.codecs.k.qjl),
        };
        spec.prefill_from.or(tuned)
    }

    /// A chunk slice's splits per segment: the spec's [`CacheSpec::chunk_splits`], else this
    /// tuning's rule for a slice of `groups` workgroups per KV head and split (row tiles of
    /// the prefill kernel where `prefill`), at most the cache's `decode` splits.
    pub fn chunk_splits(&self, spec: &CacheSpec, groups: u32, prefill: bool, decode: u32) -> u32 {
        spec.chunk_splits
            .unwrap_or_else(|| self.chunk_splits.splits(spec, groups, prefill, decode))
            .clamp(1, decode)
    }

    /// The decode workgroup for `spec`: its own [`CacheSpec::workgroup`], else this tuning's.
    pub fn workgroup(&self, spec: &CacheSpec) -> u32 {
        spec.workgroup.unwrap_or(self.decode_workgroup)
    }

    /// The default splits per KV head for `spec` (before [`crate::KvCache`] caps them by the
    /// reduce's room), storage segments holding `segment_tokens` positions. A set
    /// [`CacheSpec::splits`] takes precedence over this; the cache applies it.
    pub fn splits(&self, spec: &CacheSpec, segment_tokens: u32) -> u32 {
        self.splits
            .splits(spec, segment_tokens, self.workgroup(spec))
    }
}

/// A CPU driver runs a handful of workgroups at once; more splits only add reduce work: one
/// split per 1024 token positions, 1 to 4.
pub const CPU_DRIVER: DeviceTuning = DeviceTuning {
    name: "CPU driver",
    adapters: AdapterMatch::Cpu,
    splits: SplitRule::ByTokens {
        tokens_per_split: 1024,
        max: 4,
    },
    decode_workgroup: 128,
    prefill_from: None,
    prefill_from_f16: None,
    prefill_from_matrix: Some(64),
    chunk_splits: CHUNK_SPLITS,
    // Compiles are the suite's and a first start's cost here: every shape number a uniform.
    baked_shape: &[],
    matrix_units: false,
};

/// NVIDIA H200 (132 multiprocessors), where every decode default was measured (BENCHMARKS.md,
/// "Split count: one wave of resident workgroups"); a chunk's split count
/// ([`CHUNK_SPLITS`]) was measured on its sibling, the H100 SXM.
///
/// Splits per KV head: the largest split grid that fits in one wave of resident workgroups, at
/// most 64. On an H200 a second wave cost 30-50 % (qwen3-8b: 64 splits best, 48 with a QJL K
/// or an f16/int K beside a rotated V; qwen2.5-7b, 4 KV heads, GQA 7: each codec fastest with
/// its largest one-wave grid). Residency per multiprocessor: [`h200_resident`]. Decode
/// workgroups of 128 invocations.
///
/// Chunks: slices of 64 or more new tokens per sequence take the prefill kernel where its
/// products are f16 ([`crate::Precision::Fast`]): qwen3-8b over 32k, 0.84–0.97× the split
/// kernel's GPU time at 64 tokens and 0.78–0.90× at 512 (`none`, `q4_sym`, `turbo3_sym`,
/// `k_iso3`; BENCHMARKS.md, "Chunks"), both kernels with the decode's split count; with f32
/// products it is 2× slower, and fewer tokens were not measured. With a chunk's own split
/// count ([`CHUNK_SPLITS`]) the f16 prefill kernel stayed 7–8 % ahead of the split kernel's
/// best count on an H100 SXM (`q4_sym`, `turbo3_sym` at 64 and 512 tokens, two calls).
///
/// Shape numbers: [`BAKED_ON_NVIDIA`], measured on its sibling, the H100 SXM.
pub const H200: DeviceTuning = DeviceTuning {
    name: "NVIDIA H200",
    adapters: AdapterMatch::Named {
        vendor: 0x10de,
        name_contains: "H200",
    },
    splits: SplitRule::OneWave {
        multiprocessors: 132,
        resident: h200_resident,
        max: 64,
    },
    decode_workgroup: 128,
    prefill_from: None,
    prefill_from_f16: Some(64),
    prefill_from_matrix: Some(64),
    chunk_splits: CHUNK_SPLITS,
    baked_shape: BAKED_ON_NVIDIA,
    // (Until the matrix prefill kernel is measured here: `bench/matrix-chunks.sh`.)
    matrix_units: false,
};

/// NVIDIA H100 SXM (its Vulkan name "NVIDIA H100 80GB HBM3"): the H200's GH100 chip, with
/// its 132 multiprocessors, registers and workgroup memory and less memory bandwidth, so the
/// H200's rules. Measured there in two calls (qwen3-8b; BENCHMARKS.md, "On an H100 SXM"):
/// decode steps at 32k took 0.26–0.36× the time they took with 8 splits (about what
/// [`UNMEASURED`]'s rule gives it), chunks of 4 new tokens 0.45–0.56× (`none`, `q4_sym`,
/// `turbo3_sym`), and the f16 prefill kernel 0.81–0.82× the split kernel's time at 64 and
/// 512 new tokens (`q4_sym`, `turbo3_sym`), chunks taking the decode's split count then;
/// [`CHUNK_SPLITS`] was measured here. (The PCIe H100, 114 multiprocessors, does not
/// match: it keeps [`UNMEASURED`].)
pub const H100_SXM: DeviceTuning = DeviceTuning {
    name: "NVIDIA H100 SXM",
    adapters: AdapterMatch::Named {
        vendor: 0x10de,
        name_contains: "H100 80GB HBM3",
    },
    ..H200
};

/// Every adapter kvq has no measurements for: Apple, AMD, Intel, browsers (whose adapter
/// information names no device), NVIDIA GPUs but the H200 and the H100 SXM.
///
/// One wave of a small GPU: [`H200`]'s rule with 16 multiprocessors instead of 132 (7 splits
/// for llama3-8b's 8 KV heads at GQA 4, one sequence; 3 at GQA 8). It is conservative
/// because more splits than a GPU holds at once buy no parallelism and still cost each split
/// a query load, a partial row for the reduce and a part-filled tile, and a grid just past
/// one wave is what the H200 measured slowest; WebGPU reports no multiprocessor count, and
/// GPUs range from 8 (Apple M1) to 132 multiprocessors, so assuming the H200's 132 would put a
/// small GPU several waves deep. A GPU larger than 16 multiprocessors is underfilled by a
/// single sequence (several sequences fill it); [`crate::CacheSpec::with_splits`] sets more.
/// The residency per multiprocessor is the H200's, because it follows each kernel's
/// registers; decode workgroups of 128 invocations, as on the H200 (every WebGPU adapter
/// runs workgroups of 256). Every shape number is a uniform: on Metal and in browsers a
/// kernel compiles at its first use, a stall an app sees whenever a cache of another size
/// would need kernels of its own, and no run-time cost of the uniforms was measured there.
pub const UNMEASURED: DeviceTuning = DeviceTuning {
    name: "unmeasured GPU",
    adapters: AdapterMatch::Otherwise,
    splits: SplitRule::OneWave {
        multiprocessors: 16,
        resident: h200_resident,
        max: 64,
    },
    decode_workgroup: 128,
    prefill_from: None,
    prefill_from_f16: None,
    prefill_from_matrix: Some(64),
    chunk_splits: CHUNK_SPLITS,
    baked_shape: &[],
    matrix_units: false,
};

/// The measured tunings, the first match wins; an adapter none matches gets [`UNMEASURED`].
pub const MEASURED: &[DeviceTuning] = &[CPU_DRIVER, H200, H100_SXM];

/// The tuning kvq uses for the adapter `info` describes: the first of [`MEASURED`] that
/// matches it, else [`UNMEASURED`].
pub fn for_adapter(info: &wgpu::AdapterInfo) -> &'static DeviceTuning {
    MEASURED
        .iter()
        .find(|t| t.adapters.matches(info))
        .unwrap_or(&UNMEASURED)
}

/// Split workgroups (of 128 invocations) one H200 multiprocessor holds, as measured by the
/// split count that ran fastest (BENCHMARKS.md, "Split count: one wave of resident
/// workgroups") and read beside the registers the driver gives the fused step's split kernel
/// (examples/kernel_stats.rs): GQA 4: 92-128 registers (4), 167 with a QJL K (3), and 3 for
/// an f16 or int K beside a rotated V (`heavy` with QJL: 48 splits beat 64 by 16-21 % for
/// `k=none,v=turbo3`, `k=q8,v=turbo3`, `k=q4,v=iso3`, `k=q8,v=iso4` at 4k and 32k,
/// while `k=turbo3,v=q8` keeps 64); GQA 7: 146-167 for f16 and int codecs (3), 203-231 with a
/// rotated side or QJL (2); GQA 8: 164-244 (2 for every codec: 32 splits beat 48 and 64 for
/// `none` too, whose 164 registers would allow 3). Ratios 5-6 are taken as GQA 7, above 8 as
/// GQA 8 (not measured).
pub fn h200_resident(k: SplitKernel) -> u32 {
    match k.gqa {
        0..=4 if k.heavy => 3,
        0..=4 => 4,
        5..=7 if k.rotated || k.heavy => 2,
        5..=7 => 3,
        _ => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Codec, KvCodecs};

    fn h200_info() -> wgpu::AdapterInfo {
        let mut info = wgpu::AdapterInfo::new(wgpu::DeviceType::DiscreteGpu, wgpu::Backend::Vulkan);
        info.name = "NVIDIA H200".into();
        info.vendor = 0x10de;
        info
    }

    /// The defaults as the cache computed them before this table (commit 7b26870), kept
    /// verbatim as the oracle the H200's entry must reproduce.
    mod old {
        use crate::spec::CacheSpec;

        const DECODE_WG: u32 = 128;
        const TUNED_MULTIPROCESSORS: u32 = 132;

        pub fn default_splits(is_cpu: bool, seg_tokens: u32, spec: &CacheSpec) -> u32 {
            if is_cpu {
                return seg_tokens.div_ceil(1024).clamp(1, 4);
            }
            let c = spec.codecs;
            let rotated = c.k.kind.is_rotated() || c.v.kind.is_rotated();
            let heavy = c.k.qjl || (c.v.kind.is_rotated() && !c.k.kind.is_rotated());
            gpu_splits(
                spec.kv_heads.saturating_mul(spec.batch),
                resident_per_multiprocessor(spec.gqa(), rotated, heavy),
                spec.workgroup.unwrap_or(DECODE_WG),
            )
        }

        pub fn workgroup(spec: &CacheSpec) -> u32 {
            spec.workgroup.unwrap_or(DECODE_WG)
        }

        pub fn resident_per_multiprocessor(gqa: u32, rotated: bool, heavy: bool) -> u32 {
            match gqa {
                0..=4 if heavy => 3,
                0..=4 => 4,
                5..=7 if rotated || heavy => 2,
                5..=7 => 3,
                _ => 2,
            }
        }

        pub fn gpu_splits(groups: u32, resident: u32, workgroup: u32) -> u32 {
            let slots = TUNED_MULTIPROCESSORS * resident * DECODE_WG / workgroup.max(1);
            (slots / groups.max(1)).saturating_sub(1).clamp(1, 64)
        }
    }

    /// Every codec pair the GPU kernels serve (V without QJL), covering every (rotated,
    /// heavy) family.
    fn codec_pairs() -> Vec<KvCodecs> {
        let gpu: Vec<Codec> = Codec::valid_names()
            .iter()
            .map(|n| Codec::parse(n).unwrap())
            .filter(|&c| crate::kernels::gpu_supported(c))
            .collect();
        let mut v = Vec::new();
        for &k in &gpu {
            for &vc in gpu.iter().filter(|c| !c.qjl) {
                v.push(KvCodecs { k, v: vc });
            }
        }
        v
    }

    #[test]
    fn the_h200_takes_the_f16_prefill_kernel_from_64_tokens_but_not_for_a_qjl_k() {
        let spec = |codecs: &str| {
            CacheSpec::new(36, 32, 8, 128, 40_000).with_codecs(KvCodecs::parse(codecs).unwrap())
        };
        let t = for_adapter(&h200_info());
        assert_eq!(t.prefill_from(&spec("q4_sym"), true, false), Some(64));
        assert_eq!(t.prefill_from(&spec("q4_sym"), false, false), None);
        assert_eq!(t.prefill_from(&spec("k_turbo3+qjl"), true, false), None);
        // On matrix units a QJL K takes the prefill kernel too.
        let matrix = t.prefill_from_matrix;
        assert_eq!(t.prefill_from(&spec("k_turbo3+qjl"), true, true), matrix);
        // A spec's own threshold wins, QJL or not.
        let own = spec("k_turbo3+qjl").with_prefill_from(8);
        assert_eq!(t.prefill_from(&own, true, false), Some(8));
        assert_eq!(t.prefill_from(&own, true, true), Some(8));
        assert_eq!(UNMEASURED.prefill_from(&spec("q4_sym"), true, false), None);
    }

    #[test]
    fn a_chunk_slice_fills_one_decode_grid_with_at_least_4_splits() {
        let spec = CacheSpec::new(36, 32, 8, 128, 40_000);
        let t = for_adapter(&h200_info());
        let decode = t.splits(&spec, 40_000);
        assert_eq!(decode, 64);
        // The split kernel serves 2 new tokens a workgroup at GQA 4: chunks of 4 to 512.
        let split = [2, 4, 8, 32, 128].map(|z| t.chunk_splits(&spec, z, false, decode));
        assert_eq!(split, [32, 16, 8, 4, 4]);
        // The prefill kernel 32 rows a tile: chunks of 64 and 512 (slices of 256).
        let tiled = [8, 32].map(|z| t.chunk_splits(&spec, z, true, decode));
        assert_eq!(tiled, [32, 8]);
        // Fewer decode splits bound it; a spec's own count wins, capped by the decode's.
        assert_eq!(t.chunk_splits(&spec, 128, false, 3), 3);
        let own = spec.clone().with_chunk_splits(9);
        assert_eq!(t.chunk_splits(&own, 1, false, 3), 3);
        assert_eq!(t.chunk_splits(&own, 1, false, 64), 9);
        assert_eq!(UNMEASURED.chunk_splits(&spec, 128, false, 7), 4);
        // A rotated V's chunk kernel holds fewer workgroups a multiprocessor: two grids.
        let turbo = spec.with_codecs(KvCodecs::parse("turbo3_sym").unwrap());
        let split = [2, 4, 8, 32].map(|z| t.chunk_splits(&turbo, z, false, decode));
        assert_eq!(split, [64, 32, 16, 4]);
    }

    #[test]
    fn h200_matches_the_old_formula_everywhere() {
        let info = h200_info();
        let t = for_adapter(&info);
        assert_eq!(t.name, H200.name);
        let pairs = codec_pairs();
        let families: std::collections::HashSet<(bool, bool)> = pairs
            .iter()
            .map(|&c| {
                let k = SplitKernel::of(&CacheSpec::new(1, 4, 1, 128, 64).with_codecs(c));
                (k.rotated, k.heavy)
            })
            .collect();
        // Heavy implies rotated (QJL rides on a rotated K; the other heavy pair has a rotated V).
        assert_eq!(
            families,
            [(false, false), (true, false), (true, true)].into(),
            "{families:?}"
        );
        let mut checked = 0u64;
        for gqa in 1..=8u32 {
            for groups in 1..=64u32 {
                // Every way of writing the groups as KV heads x sequences.
                for kv_heads in (1..=groups).filter(|h| groups.is_multiple_of(*h)) {
                    let batch = groups / kv_heads;
                    for wg in [None, Some(64), Some(128), Some(256)] {
                        for &codecs in &pairs {
                            let mut spec = CacheSpec::new(1, kv_heads * gqa, kv_heads, 128, 4096)
                                .with_batch(batch)
                                .with_codecs(codecs);
                            spec.workgroup = wg;
                            for seg_tokens in [32, 4096] {
                                assert_eq!(
                                    t.splits(&spec, seg_tokens),
                                    old::default_splits(false, seg_tokens, &spec),
                                    "gqa {gqa} kv_heads {kv_heads} batch {batch} wg {wg:?} {}",
                                    codecs.name()
                                );
                            }
                            assert_eq!(t.workgroup(&spec), old::workgroup(&spec));
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 100_000, "{checked}");
    }

    #[test]
    fn cpu_driver_matches_the_old_rule() {
        let info = wgpu::AdapterInfo::new(wgpu::DeviceType::Cpu, wgpu::Backend::Vulkan);
        let t = for_adapter(&info);
        assert_eq!(t.name, CPU_DRIVER.name);
        // A CPU driver is matched first, whatever its name says.
        let mut named = info.clone();
        named.name = "llvmpipe H200".into();
        named.vendor = 0x10de;
        assert_eq!(for_adapter(&named).name, CPU_DRIVER.name);
        let spec = CacheSpec::new(1, 8, 2, 64, 1 << 20)
            .with_codecs(KvCodecs::parse("k_turbo3+qjl").unwrap());
        for seg_tokens in [1, 32, 1023, 1024, 1025, 2048, 3000, 4096, 4097, 1 << 20] {
            assert_eq!(
                t.splits(&spec, seg_tokens),
                old::default_splits(true, seg_tokens, &spec),
                "{seg_tokens}"
            );
        }
        assert_eq!(t.workgroup(&spec), 128);
    }

    #[test]
    fn unmeasured_adapters_get_the_default() {
        let mut others = vec![];
        for (vendor, name, ty) in [
            (0x106b, "Apple M1", wgpu::DeviceType::IntegratedGpu),
            (
                0x1002,
                "AMD Radeon RX 7900 XTX",
                wgpu::DeviceType::DiscreteGpu,
            ),
            (
                0x8086,
                "Intel(R) Arc(tm) A770 Graphics",
                wgpu::DeviceType::DiscreteGpu,
            ),
            (0x10de, "NVIDIA H100 PCIe", wgpu::DeviceType::DiscreteGpu),
            (
                0x10de,
                "NVIDIA GeForce RTX 4090",
                wgpu::DeviceType::DiscreteGpu,
            ),
            // A browser's WebGPU adapter: no vendor id, often no name.
            (0, "", wgpu::DeviceType::Other),
            // The name alone is not enough.
            (0x1002, "H200", wgpu::DeviceType::DiscreteGpu),
        ] {
            let mut info = wgpu::AdapterInfo::new(ty, wgpu::Backend::Vulkan);
            info.vendor = vendor;
            info.name = name.into();
            others.push(info);
        }
        for info in &others {
            assert_eq!(for_adapter(info).name, UNMEASURED.name, "{}", info.name);
        }
        // The H100 SXM (as its Vulkan driver names it) takes the H200's rules.
        let mut sxm = wgpu::AdapterInfo::new(wgpu::DeviceType::DiscreteGpu, wgpu::Backend::Vulkan);
        sxm.vendor = 0x10de;
        sxm.name = "NVIDIA H100 80GB HBM3".into();
        let h100 = for_adapter(&sxm);
        assert_eq!(h100.name, H100_SXM.name);
        let llama3_8b = CacheSpec::new(1, 32, 8, 128, 32768);
        assert_eq!(h100.splits(&llama3_8b, 32768), 64);
        assert_eq!(h100.prefill_from_f16, H200.prefill_from_f16);
        // One wave of 16 multiprocessors: 16 x 4 x 128 / 128 = 64 slots over 8 KV heads.
        let t = &UNMEASURED;
        assert_eq!(t.splits(&llama3_8b, 32768), 7);
        assert_eq!(H200.splits(&llama3_8b, 32768), 64);
        let qjl = llama3_8b
            .clone()
            .with_codecs(KvCodecs::parse("k_turbo3+qjl").unwrap());
        assert_eq!(t.splits(&qjl, 32768), 5);
        let llama3_70b = CacheSpec::new(1, 64, 8, 128, 32768);
        assert_eq!(t.splits(&llama3_70b, 32768), 3);
        assert_eq!(t.splits(&llama3_8b.clone().with_batch(8), 32768), 1);
        // Never more than the H200 gets.
        for gqa in 1..=8 {
            for groups in 1..=64 {
                for &codecs in &codec_pairs() {
                    let spec =
                        CacheSpec::new(1, groups * gqa, groups, 128, 4096).with_codecs(codecs);
                    let s = t.splits(&spec, 4096);
                    assert!((1..=H200.splits(&spec, 4096)).contains(&s));
                }
            }
        }
        assert_eq!(t.decode_workgroup, 128);
    }

    #[test]
    fn h200_split_grid_fits_one_wave() {
        // Measured shapes (BENCHMARKS.md), through the table's entry.
        let split = |kv_heads: u32, batch: u32, gqa: u32, codecs: &str, wg: u32| {
            let mut spec = CacheSpec::new(1, kv_heads * gqa, kv_heads, 128, 4096)
                .with_batch(batch)
                .with_codecs(KvCodecs::parse(codecs).unwrap());
            spec.workgroup = Some(wg);
            H200.splits(&spec, 4096)
        };
        // qwen3-8b / llama3-8b (8 KV heads, GQA 4), one sequence: measured best.
        assert_eq!(split(8, 1, 4, "none", 128), 64);
        assert_eq!(split(8, 1, 4, "turbo3_sym", 128), 64);
        // A QJL K, or an f16/int K beside a rotated V: 3 resident.
        assert_eq!(split(8, 1, 4, "k_turbo3+qjl", 128), 48);
        assert_eq!(split(8, 1, 4, "k=q8,v=turbo3", 128), 48);
        assert_eq!(split(8, 1, 4, "k=turbo3,v=q8", 128), 64);
        // qwen2.5-7b (4 KV heads, GQA 7): capped at 64.
        assert_eq!(split(4, 1, 7, "none", 128), 64);
        assert_eq!(split(4, 1, 7, "turbo3_sym", 128), 64);
        // 8 KV heads at GQA 8 (llama3-70b): 33 x 8 <= 264.
        assert_eq!(split(8, 1, 8, "none", 128), 32);
        assert_eq!(split(8, 1, 8, "turbo3_sym", 128), 32);
        // GQA 7 with 8 KV heads: 49 x 8 <= 396 for f16 / int codecs.
        assert_eq!(split(8, 1, 7, "none", 128), 48);
        // 8 KV heads x 4 sequences: 16 x 32 <= 528 < 17 x 32.
        assert_eq!(split(8, 4, 4, "none", 128), 15);
        // Wider workgroups, fewer resident.
        assert_eq!(split(8, 1, 4, "none", 256), 32);
        assert_eq!(split(8, 1, 4, "none", 64), 64);
        // A huge grid still gets one split.
        assert_eq!(split(65535, 1, 1, "k_turbo3+qjl", 128), 1);
    }
}
