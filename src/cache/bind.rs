//! Binding a cache's buffers: the bind groups of each storage segment, built once at creation.

use super::buffers::Buffers;
use crate::kernels::Pipelines;

/// One storage segment of one layer: a range of token positions in its own buffers, so that
/// capacities past one binding's size limit are split rather than refused.
pub(super) struct Segment {
    pub(super) k: wgpu::Buffer,
    pub(super) v: wgpu::Buffer,
    pub(super) append_bg: Bound,
    pub(super) decode_bg: Bound,
    pub(super) step_bg: Bound,
}

/// A bind group with the buffers it binds (binding `i` is `buffers[i]`), so that
/// [`crate::export`] can describe a recording to another WebGPU host.
pub(crate) struct Bound {
    pub(crate) group: wgpu::BindGroup,
    pub(crate) buffers: Vec<wgpu::Buffer>,
}

/// A bind group of `layout` over whole buffers, binding `i` being `bufs[i]`.
pub(super) fn bind_buffers(
    device: &wgpu::Device,
    label: &str,
    layout: &wgpu::BindGroupLayout,
    bufs: &[&wgpu::Buffer],
) -> Bound {
    let entries: Vec<_> = bufs
        .iter()
        .enumerate()
        .map(|(i, b)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: b.as_entire_binding(),
        })
        .collect();
    let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout,
        entries: &entries,
    });
    Bound {
        group,
        buffers: bufs.iter().map(|&b| b.clone()).collect(),
    }
}

/// The segments of every layer of `bufs`, each with its append, decode and fused-step bind
/// groups of `pipes`' store layouts.
pub(super) fn bind_segments(
    device: &wgpu::Device,
    pipes: &Pipelines,
    bufs: &Buffers,
) -> Vec<Vec<Segment>> {
    let (lens, partials) = (&bufs.lens, &bufs.partials);
    let bg = |layout: &wgpu::BindGroupLayout, b: &[&wgpu::Buffer]| {
        bind_buffers(device, "kvq segment", layout, b)
    };
    bufs.layers
        .iter()
        .map(|segs| {
            segs.iter()
                .map(|s| {
                    let (params, k, v) = (&s.params, &s.k, &s.v);
                    Segment {
                        k: k.clone(),
                        v: v.clone(),
                        append_bg: bg(&pipes.layouts().append_store, &[params, k, v, lens]),
                        decode_bg: bg(
                            &pipes.layouts().decode_store,
                            &[params, k, v, lens, partials],
                        ),
                        step_bg: bg(&pipes.layouts().step_store, &[params, k, v, lens, partials]),
                    }
                })
                .collect()
        })
        .collect()
}
