//! Allocating a cache's buffers from its [`Plan`]: the K/V stores of every segment of every
//! layer, the lengths and codec constants, the decode scratch and the segments' parameters.

use bytemuck::{Pod, Zeroable};

use super::plan::{Layout, Plan};
use crate::context::GpuContext;
use crate::kernels::{K_BLOCK, ShapeParams};
use crate::spec::CacheSpec;

/// A segment's uniform params, as `Seg` in `wgsl/shared/common.wgsl`: where the segment lies,
/// then the cache's shape numbers.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SegParams {
    layer: u32,
    seg_start: u32,
    seg_tokens: u32,
    is_last: u32,
    split_base: u32,
    shape: ShapeParams,
    _pad: [u32; 3],
}

/// What a buffer in [`super::KvCache`]'s `owned` list is for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum OwnedPart {
    Lengths,
    Scratch,
    Params,
}

/// The buffers of one storage segment of one layer.
pub(super) struct SegmentBuffers {
    pub(super) k: wgpu::Buffer,
    pub(super) v: wgpu::Buffer,
    pub(super) params: wgpu::Buffer,
}

/// Every buffer a cache allocates at creation.
pub(super) struct Buffers {
    /// Lengths then overflow flags, then the codec constants.
    pub(super) lens: wgpu::Buffer,
    /// The decode scratch.
    pub(super) partials: wgpu::Buffer,
    /// By layer, then segment.
    pub(super) layers: Vec<Vec<SegmentBuffers>>,
    /// Every buffer but the K/V stores, by part (for [`super::KvCache::memory`]).
    pub(super) owned: Vec<(OwnedPart, wgpu::Buffer)>,
}

impl Buffers {
    /// Bytes of every buffer: what an allocation failure reports as needed.
    pub(super) fn bytes(&self) -> u64 {
        let stores: u64 = self
            .layers
            .iter()
            .flatten()
            .map(|s| s.k.size() + s.v.size())
            .sum();
        stores + self.owned.iter().map(|(_, b)| b.size()).sum::<u64>()
    }
}

/// A buffer created with `contents` (a multiple of 4 bytes). Unlike wgpu's `create_buffer_init`
/// it does not panic when the buffer cannot be allocated: the error goes to the device's error
/// scopes like any other allocation's, and the buffer is invalid.
pub(super) fn init_buffer(
    device: &wgpu::Device,
    label: &str,
    contents: &[u8],
    usage: wgpu::BufferUsages,
) -> wgpu::Buffer {
    let buf = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: contents.len() as u64,
        usage,
        mapped_at_creation: true,
    });
    if let Ok(mut view) = buf.get_mapped_range_mut(..) {
        view.copy_from_slice(contents);
        drop(view);
        buf.unmap();
    }
    buf
}

/// Bytes of a layer's exact tokens ([`crate::ExactTokens`]): each sequence's `exact_lo`, then
/// K's and V's f16 rows, after the first segment's V rows (`wgsl/shared/exact.wgsl`).
pub(super) fn exact_bytes(spec: &CacheSpec) -> u64 {
    if !spec.exact.any() {
        return 0;
    }
    let rows = spec.batch as u64 * spec.kv_heads as u64 * spec.exact.rows() as u64;
    4 * spec.batch as u64 + 2 * rows * spec.head_dim as u64 * 2
}

/// Bytes of K's means ([`crate::ExactTokens::k_mean`]), at the end of the lengths buffer:
/// `head_dim` f32 per layer, sequence and KV head.
pub(super) fn k_mean_bytes(spec: &CacheSpec) -> u64 {
    if !spec.exact.k_mean {
        return 0;
    }
    4 * spec.layers as u64 * spec.batch as u64 * spec.kv_heads as u64 * spec.head_dim as u64
}

/// Bytes after segment `s`'s V rows with exact tokens: the layer's exact tokens after the
/// first segment's ([`exact_bytes`]), a copy of their `exact_lo` after every other's.
pub(super) fn exact_tail(spec: &CacheSpec, s: u32) -> u64 {
    match (spec.exact.any(), s) {
        (false, _) => 0,
        (true, 0) => exact_bytes(spec),
        (true, _) => 4 * spec.batch as u64,
    }
}

/// Allocates `plan`'s buffers on `ctx`'s device, uploading their initial contents. A buffer
/// that cannot be allocated is invalid and its error goes to the device's error scopes: the
/// caller holds them open.
pub(super) fn allocate(ctx: &GpuContext, spec: &CacheSpec, plan: &Plan) -> Buffers {
    let device = &ctx.device;
    let Layout {
        segment_tokens: seg_tokens,
        splits,
        k_row_bytes,
        v_row_bytes,
        ..
    } = plan.layout;
    // Lengths then overflow flags, all zero (an empty cache), then the codec constants
    // (rotations, codebooks, QJL matrix) the kernels read.
    let mut state = vec![0u32; 2 * plan.lengths];
    state.extend(plan.constants.iter().map(|c| c.to_bits()));
    ctx.counters().add_upload(state.len() as u64 * 4);
    let lens = init_buffer(
        device,
        "kvq lengths and codec constants",
        bytemuck::cast_slice(&state),
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
    );
    let partials = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("kvq decode partials"),
        size: plan.partial_floats * 4,
        // COPY_SRC: crate::export reads every buffer's initial bytes.
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let rows = |t: u32| spec.batch as u64 * spec.kv_heads as u64 * t as u64;
    let store_usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let mut owned = vec![
        (OwnedPart::Lengths, lens.clone()),
        (OwnedPart::Scratch, partials.clone()),
    ];
    let mut layers = Vec::with_capacity(spec.layers as usize);
    for layer in 0..spec.layers {
        // The layer's own slots and segments (fewer where its own window keeps a smaller
        // ring), and its shape numbers.
        let capacity = spec.layer_capacity(layer);
        let segments = plan.layer_segments[layer as usize];
        let shape = plan
            .cfg
            .layer_shape_params(capacity, spec.layer_window(layer), segments);
        let mut segs = Vec::with_capacity(segments as usize);
        for s in 0..segments {
            let start = s * seg_tokens;
            // Allocated in whole K interleave blocks; positions past capacity stay unused.
            let tokens = seg_tokens.min(capacity - start).next_multiple_of(K_BLOCK);
            let buf = |label: &str, row: u64| {
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size: rows(tokens) * row,
                    usage: store_usage,
                    mapped_at_creation: false,
                })
            };
            let k = buf("kvq K store", k_row_bytes);
            let v = if spec.exact.any() {
                // The exact tokens after the first segment's V rows, and a copy of their
                // exact_lo after every other's (wgsl/shared/exact.wgsl).
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("kvq V store and exact tokens"),
                    size: rows(tokens) * v_row_bytes + exact_tail(spec, s),
                    usage: store_usage,
                    mapped_at_creation: false,
                })
            } else {
                buf("kvq V store", v_row_bytes)
            };
            let params = SegParams {
                layer,
                seg_start: start,
                seg_tokens: tokens,
                is_last: (s + 1 == segments) as u32,
                split_base: s * (splits + 1),
                shape,
                _pad: [0; 3],
            };
            // Written once at creation, not per step.
            ctx.counters()
                .add_upload(std::mem::size_of::<SegParams>() as u64);
            let params = init_buffer(
                device,
                "kvq segment params",
                bytemuck::bytes_of(&params),
                wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_SRC,
            );
            owned.push((OwnedPart::Params, params.clone()));
            segs.push(SegmentBuffers { k, v, params });
        }
        layers.push(segs);
    }
    Buffers {
        lens,
        partials,
        layers,
        owned,
    }
}
