//! Planning a cache: its storage segments, decode splits and kernel configuration, from the
//! spec, the device's limits and its [`DeviceTuning`] alone (no GPU work).

use crate::error::{KvqError, Result};
use crate::kernels::{K_BLOCK, KernelConfig};
use crate::spec::{CacheSpec, Precision, SinkLogits};
use crate::tuning::DeviceTuning;

/// Fewest tokens per decode split before fewer splits are used.
const MIN_CHUNK: u32 = 32;
/// Most partials per query head (sized into the reduce kernel's workgroup memory).
const MAX_SPLITS_TOTAL: u32 = 1024;

/// How a cache's storage and decode work are laid out on this device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Storage segments per layer (1 unless one layer's rows pass a binding's size limit);
    /// a layer with a window of its own ([`CacheSpec::layer_windows`]) may have fewer.
    pub segments: u32,
    /// Token positions per segment (the last may hold fewer).
    pub segment_tokens: u32,
    /// Decode splits per segment.
    pub splits: u32,
    /// Bytes of one stored K row (one token, one KV head).
    pub k_row_bytes: u64,
    /// Bytes of one stored V row.
    pub v_row_bytes: u64,
    /// Query rows of a prefill workgroup, and the new tokens per sequence from which a
    /// chunk slice takes the prefill kernel ([`CacheSpec::prefill_from`]); `None` where it
    /// never does.
    pub prefill: Option<(u32, u32)>,
}

/// Everything [`crate::KvCache::new`] decides before it touches the device.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Plan {
    pub(super) layout: Layout,
    pub(super) cfg: KernelConfig,
    /// The codec constants (rotations, codebooks, QJL matrix) the kernels read, and room for
    /// K's means and the sink logits (a host slice's values in place).
    pub(super) constants: Vec<f32>,
    /// Floats of the decode scratch (every split's partials).
    pub(super) partial_floats: u64,
    /// (layer, sequence) pairs: each has a length and an overflow flag on the GPU.
    pub(super) lengths: usize,
    /// Storage segments of each layer: [`Layout::segments`], or fewer for a layer whose own
    /// window keeps a smaller ring ([`CacheSpec::layer_capacity`]).
    pub(super) layer_segments: Vec<u32>,
}

/// Most bytes one storage binding may hold on a device with `limits`: at most 4 GiB a binding
/// (Metal allows more), since the kernels index in u32 and this keeps every element index of
/// every binding below 2^32.
fn max_binding(limits: &wgpu::Limits) -> u64 {
    limits
        .max_storage_buffer_binding_size
        .min(limits.max_buffer_size)
        .min(u32::MAX as u64)
}

/// Plans a cache for `spec` on an adapter named `adapter` with `limits` and `tuning` (`f16`:
/// the device has `shader-f16`): checks the spec, segments the store to fit a binding,
/// picks the splits (`spec.splits`, else the tuning's) and the kernel configuration, and
/// refuses what the adapter cannot hold.
pub(super) fn plan(
    spec: &CacheSpec,
    limits: &wgpu::Limits,
    tuning: &DeviceTuning,
    adapter: &str,
    f16: bool,
    matrix: Option<crate::MatrixUnits>,
) -> Result<Plan> {
    spec.validate()?;
    let too_weak = |what: String, needed: u64, have: u64| KvqError::AdapterTooWeak {
        adapter: adapter.into(),
        what,
        needed,
        have,
    };
    let max_binding = max_binding(limits);
    let mut layout = segment(spec, max_binding, tuning, adapter)?;
    let mut cfg = KernelConfig {
        head_dim: spec.head_dim,
        v_head_dim: spec.v_width(),
        gqa: spec.gqa(),
        kv_heads: spec.kv_heads,
        batch: spec.batch,
        capacity: spec.capacity,
        window: spec.window,
        layers: spec.layers,
        splits: layout.splits,
        max_splits: layout.splits.max(tuning.splits.max()),
        segments: layout.segments,
        min_chunk: MIN_CHUNK,
        scale: spec.softmax_scale(),
        softcap: spec.softcap,
        sinks: spec.sink_logits.is_some(),
        workgroup: tuning.workgroup(spec),
        k: spec.codecs.k,
        v: spec.codecs.v,
        exact: spec.exact,
        baked_shape: tuning.baked_shape,
        // Each layer's ring in its own params (KernelConfig::bakes).
        layer_shapes: spec.layer_windows.is_some(),
        // Without shader-f16 the fast products are not there: the exact kernels run.
        precision: match f16 {
            true => spec.precision.resolve(&spec.codecs),
            false => Precision::Exact,
        },
        matrix: None,
    };
    // GPU codecs, the shape rules (again, for what the tuning chose) and every count.
    cfg.check()?;
    // Each kernel's workgroup memory within the adapter's limit.
    let fits_workgroup = |what: &str, bytes: u32| {
        let have = limits.max_compute_workgroup_storage_size;
        match bytes > have {
            true => Err(too_weak(what.into(), bytes as u64, have as u64)),
            false => Ok(()),
        }
    };
    let what = "max_compute_workgroup_storage_size";
    fits_workgroup(what, cfg.split_workgroup_bytes()?)?;
    // The prefill kernel on matrix units where the cache takes the prefill kernel, the
    // context has them and that kernel serves the cache within the adapter's workgroup
    // memory; else the FP32 / packed-f16 one. (Its rows as the context says, else one row
    // fragment, whose tiles take about half.)
    let half = cfg.half_products();
    let mut candidates = matrix
        .filter(|_| tuning.prefill_from(spec, half, true).is_some())
        .map_or(vec![], |m| {
            vec![
                m,
                crate::MatrixUnits {
                    rows: m.fragment,
                    ..m
                },
            ]
        });
    candidates.dedup();
    for m in candidates {
        let with = KernelConfig {
            matrix: Some(m),
            ..cfg.clone()
        };
        if with.matrix_tile().is_some()
            && with.prefill_workgroup_bytes()? <= limits.max_compute_workgroup_storage_size
        {
            cfg = with;
            break;
        }
    }
    // The prefill kernel where the cache asks for it and it serves the cache.
    if let (Some(rows), Some(from)) = (
        cfg.prefill_rows(),
        tuning.prefill_from(spec, half, cfg.matrix.is_some()),
    ) {
        let what = "max_compute_workgroup_storage_size (the prefill kernel)";
        fits_workgroup(what, cfg.prefill_workgroup_bytes()?)?;
        layout.prefill = Some((rows, from.max(1)));
    }
    // The store is split to fit a binding; the decode scratch and the constants are one
    // binding each, so a shape that needs more than the adapter binds is refused here.
    let lengths = (spec.layers * spec.batch) as usize;
    let mut constants = cfg.constants(spec.seed);
    // Sink logits from the host go in with the constants (a buffer's are copied in by the
    // cache once it is allocated).
    if let Some(SinkLogits::Host(v)) = &spec.sink_logits {
        constants[cfg.sinks_at() as usize..][..v.len()].copy_from_slice(v);
    }
    let partial_floats = partial_floats(spec, &cfg);
    for (what, bytes) in [
        (
            "decode scratch (batch x q_heads x splits partials)",
            partial_floats * 4,
        ),
        (
            "lengths and codec constants",
            (2 * lengths + constants.len()) as u64 * 4,
        ),
    ] {
        if bytes > max_binding {
            return Err(too_weak(
                format!("max_storage_buffer_binding_size (the {what})"),
                bytes,
                max_binding,
            ));
        }
    }
    let layer_segments = (0..spec.layers)
        .map(|l| spec.layer_capacity(l).div_ceil(layout.segment_tokens))
        .collect();
    Ok(Plan {
        layout,
        cfg,
        constants,
        partial_floats,
        lengths,
        layer_segments,
    })
}

/// Floats of the decode scratch for one query per sequence: every split's partial (output
/// vector, then max and sum) per query head.
pub(super) fn partial_floats(spec: &CacheSpec, cfg: &KernelConfig) -> u64 {
    spec.batch as u64
        * spec.q_heads as u64
        * cfg.partial_slots() as u64
        * (cfg.partial_width() as u64 + 4)
}

/// Floats of the prefill kernel's scratch for one query per sequence, after the partials: a
/// rotated K's queries, rotated by `prefill_q` (`wgsl/kernels/prefill.wgsl`); none otherwise.
pub(super) fn prefill_query_floats(spec: &CacheSpec, cfg: &KernelConfig) -> u64 {
    if !spec.codecs.k.kind.is_rotated() {
        return 0;
    }
    spec.batch as u64 * spec.q_heads as u64 * cfg.prefill_tile().query_width as u64
}

/// The storage segments and splits of `spec` with bindings of at most `max_binding` bytes.
fn segment(
    spec: &CacheSpec,
    max_binding: u64,
    tuning: &DeviceTuning,
    adapter: &str,
) -> Result<Layout> {
    let d = spec.head_dim;
    let k_row_bytes = spec.codecs.k.row_words(d) as u64 * 4;
    let v_row_bytes = spec.codecs.v.row_words(d) as u64 * 4;
    let per_token = spec.batch as u64 * spec.kv_heads as u64 * k_row_bytes.max(v_row_bytes);
    let mut seg_tokens = (max_binding / per_token).min(spec.capacity as u64) as u32;
    if let Some(t) = spec.segment_tokens {
        seg_tokens = seg_tokens.min(t);
    }
    if seg_tokens < spec.capacity {
        // Segment starts must fall on K interleave blocks.
        seg_tokens -= seg_tokens % K_BLOCK;
    }
    if seg_tokens == 0 {
        // A split store needs whole K interleave blocks per segment.
        let needed = if spec.capacity > 1 && per_token <= max_binding {
            per_token * K_BLOCK as u64
        } else {
            per_token
        };
        return Err(KvqError::AdapterTooWeak {
            adapter: adapter.into(),
            what: format!(
                "max_storage_buffer_binding_size ({} of every sequence and head)",
                if needed > per_token {
                    "32 tokens"
                } else {
                    "one token"
                }
            ),
            needed,
            have: max_binding,
        });
    }
    let segments = spec.capacity.div_ceil(seg_tokens);
    let splits = spec
        .splits
        .unwrap_or_else(|| tuning.splits(spec, seg_tokens));
    if 2 * segments > MAX_SPLITS_TOTAL {
        return Err(KvqError::InvalidSpec(format!(
            "capacity {} needs {segments} storage segments on this adapter; at most {MAX_SPLITS_TOTAL} are supported",
            spec.capacity
        )));
    }
    Ok(Layout {
        segments,
        segment_tokens: seg_tokens,
        // Each segment also has one split for the tokens a fused step appends.
        splits: (MAX_SPLITS_TOTAL / segments)
            .saturating_sub(1)
            .min(splits)
            .max(1),
        k_row_bytes,
        v_row_bytes,
        prefill: None,
    })
}

#[cfg(test)]
mod tests {
    use super::{MAX_SPLITS_TOTAL, MIN_CHUNK, plan};
    use crate::codec::KvCodecs;
    use crate::error::KvqError;
    use crate::spec::CacheSpec;
    use crate::tuning::{CPU_DRIVER, DeviceTuning, MEASURED, SplitRule, UNMEASURED};

    /// The measured tuning of the largest GPU: one wave over 132 multiprocessors, at most 64
    /// splits per KV head.
    fn big_gpu() -> &'static DeviceTuning {
        MEASURED
            .iter()
            .find(|t| {
                matches!(
                    t.splits,
                    SplitRule::OneWave {
                        multiprocessors: 132,
                        ..
                    }
                )
            })
            .expect("a measured one-wave tuning")
    }

    fn limits() -> wgpu::Limits {
        wgpu::Limits {
            max_storage_buffer_binding_size: 1 << 30,
            max_buffer_size: 1 << 30,
            ..wgpu::Limits::default()
        }
    }

    /// llama3-8b's attention shape: 32 query heads over 8 KV heads, head_dim 128.
    fn llama3_8b(capacity: u32) -> CacheSpec {
        CacheSpec::new(2, 32, 8, 128, capacity)
    }

    #[test]
    fn one_segment_takes_the_tunings_splits_and_workgroup() {
        let spec = llama3_8b(4096);
        let p = plan(&spec, &limits(), big_gpu(), "test", false, None).unwrap();
        assert_eq!(p.layout.segments, 1);
        assert_eq!(p.layout.segment_tokens, 4096);
        assert_eq!(p.layout.splits, 64);
        // f16 rows: 2 bytes a value.
        assert_eq!((p.layout.k_row_bytes, p.layout.v_row_bytes), (256, 256));
        assert_eq!(p.cfg.splits, 64);
        assert_eq!(p.cfg.segments, 1);
        assert_eq!(
            (p.cfg.gqa, p.cfg.workgroup, p.cfg.min_chunk),
            (4, 128, MIN_CHUNK)
        );
        assert_eq!(p.lengths, 2);
        // 32 query heads x 65 splits, each partial D values and 4 more.
        assert_eq!(
            p.partial_floats,
            32 * 65 * (p.cfg.partial_width() as u64 + 4)
        );
        assert_eq!(p.constants, p.cfg.constants(spec.seed));
        // Other tunings, same storage.
        let cpu = plan(&spec, &limits(), &CPU_DRIVER, "test", false, None).unwrap();
        assert_eq!(cpu.layout.splits, 4);
        assert_eq!(cpu.layout.segments, 1);
        let other = plan(&spec, &limits(), &UNMEASURED, "test", false, None).unwrap();
        assert_eq!(other.layout.splits, 7);
    }

    #[test]
    fn spec_overrides_beat_the_tuning() {
        let mut spec = llama3_8b(4096).with_splits(5);
        spec.workgroup = Some(256);
        for t in [big_gpu(), &CPU_DRIVER, &UNMEASURED] {
            let p = plan(&spec, &limits(), t, "test", false, None).unwrap();
            assert_eq!((p.layout.splits, p.cfg.workgroup), (5, 256), "{}", t.name);
        }
        // Without a split count, a wider workgroup halves the resident grid.
        spec.splits = None;
        assert_eq!(
            plan(&spec, &limits(), big_gpu(), "t", false, None)
                .unwrap()
                .layout
                .splits,
            32
        );
    }

    #[test]
    fn segments_fit_a_binding_and_cap_the_splits() {
        // One KV head of 64-byte rows: 6000-byte bindings hold 93 tokens, 64 in whole K blocks.
        let small = wgpu::Limits {
            max_storage_buffer_binding_size: 6000,
            ..limits()
        };
        let spec = CacheSpec::new(1, 1, 1, 32, 640).with_splits(1);
        let p = plan(&spec, &small, big_gpu(), "test", false, None).unwrap();
        assert_eq!((p.layout.segments, p.layout.segment_tokens), (10, 64));
        let mut spec = llama3_8b(4096);
        spec.segment_tokens = Some(32);
        let p = plan(&spec, &limits(), big_gpu(), "test", false, None).unwrap();
        assert_eq!((p.layout.segments, p.layout.segment_tokens), (128, 32));
        // 128 segments: at most 1024 / 128 - 1 = 7 splits each besides the step's.
        assert_eq!(p.layout.splits, 7);
        assert!(p.cfg.splits_total() <= MAX_SPLITS_TOTAL);
        // A segment size of the spec's own is rounded down to whole K blocks.
        let mut spec = llama3_8b(1000);
        spec.segment_tokens = Some(100);
        let p = plan(&spec, &limits(), big_gpu(), "test", false, None).unwrap();
        assert_eq!((p.layout.segments, p.layout.segment_tokens), (11, 96));
        assert_eq!(p.layout.splits, 64);
        // A capacity that fits one segment is not rounded.
        spec.segment_tokens = Some(1000);
        assert_eq!(
            plan(&spec, &limits(), big_gpu(), "t", false, None)
                .unwrap()
                .layout
                .segment_tokens,
            1000
        );
    }

    #[test]
    fn a_window_per_layer_gives_each_layer_its_ring_and_bakes_none_of_it() {
        // Gemma 3's pattern on the tuning that bakes the shape numbers: the local layers'
        // rings (1,024 + 256 slots) take fewer segments of 2,048 tokens than the global
        // layer's 32k, and the numbers that differ between layers are read from the params.
        let windows = (0..6).map(|l| (l != 5).then_some(1024)).collect();
        let mut spec = llama3_8b(32768).with_layer_windows(windows);
        spec.layers = 6;
        spec.segment_tokens = Some(2048);
        let p = plan(&spec, &limits(), big_gpu(), "t", false, None).unwrap();
        assert_eq!(p.layer_segments, [1, 1, 1, 1, 1, 16]);
        assert_eq!(
            (p.layout.segments, p.cfg.capacity, p.cfg.window),
            (16, 32768, None)
        );
        assert!(p.cfg.layer_shapes);
        assert!(!p.cfg.bakes("CAP") && !p.cfg.bakes("WIN") && !p.cfg.bakes("PSLOTS"));
        // The same cache without keeps the tuning's baked numbers.
        spec.layer_windows = None;
        let p = plan(&spec, &limits(), big_gpu(), "t", false, None).unwrap();
        assert!(!p.cfg.layer_shapes);
    }

    #[test]
    fn refuses_what_the_adapter_cannot_hold() {
        let tiny = |bytes: u64| wgpu::Limits {
            max_storage_buffer_binding_size: bytes,
            ..limits()
        };
        // Less than 32 tokens of every head in a binding.
        match plan(
            &llama3_8b(4096),
            &tiny(32 << 10),
            big_gpu(),
            "gpu",
            false,
            None,
        ) {
            Err(KvqError::AdapterTooWeak {
                adapter,
                needed,
                have,
                ..
            }) => {
                assert_eq!(
                    (adapter.as_str(), needed, have),
                    ("gpu", 64 << 10, 32 << 10)
                );
            }
            other => panic!("{other:?}"),
        }
        // Not even one token.
        match plan(&llama3_8b(4096), &tiny(1024), big_gpu(), "gpu", false, None) {
            Err(KvqError::AdapterTooWeak { needed, .. }) => assert_eq!(needed, 2048),
            other => panic!("{other:?}"),
        }
        // More than 512 segments.
        let mut spec = llama3_8b(32 * 513);
        spec.segment_tokens = Some(32);
        assert!(matches!(
            plan(&spec, &limits(), big_gpu(), "gpu", false, None),
            Err(KvqError::InvalidSpec(_))
        ));
        // The split kernel's workgroup memory.
        let no_wg_memory = wgpu::Limits {
            max_compute_workgroup_storage_size: 1024,
            ..limits()
        };
        assert!(matches!(
            plan(
                &llama3_8b(4096),
                &no_wg_memory,
                big_gpu(),
                "gpu",
                false,
                None
            ),
            Err(KvqError::AdapterTooWeak { .. })
        ));
        // A spec the checks refuse, and a codec with no GPU kernels.
        assert!(matches!(
            plan(
                &CacheSpec::new(0, 4, 4, 64, 16),
                &limits(),
                big_gpu(),
                "gpu",
                false,
                None
            ),
            Err(KvqError::InvalidSpec(_))
        ));
        let qjl_only = llama3_8b(64).with_codecs(KvCodecs::parse("k_turbo0+qjl").unwrap());
        assert!(matches!(
            plan(&qjl_only, &limits(), big_gpu(), "gpu", false, None),
            Err(KvqError::InvalidSpec(_))
        ));
    }
}
