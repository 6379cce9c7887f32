//! [`KvCache`] itself: its parts, its creation (plan, allocate, bind) and what it reports
//! about itself.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::bind::{self, Segment};
use super::buffers::{self, OwnedPart};
use super::io::{HostIo, HostQuery};
use super::plan::{self, Layout};
use crate::context::GpuContext;
use crate::error::{KvqError, Result};
use crate::kernels::{KernelConfig, Pipelines};
use crate::memory::{MemoryReport, StoreBytes};
use crate::spec::{CacheSpec, SinkLogits};

/// A quantized (or f16) KV cache living on the GPU.
///
/// Storage is allocated once, at creation. Sequence lengths live on the GPU, one per (layer,
/// sequence); kvq keeps a host mirror of what it has recorded, to refuse appends past the
/// capacity before they reach the GPU. The GPU checks again and writes nothing on overflow. A
/// recording dropped instead of submitted leaves the mirror ahead of the GPU:
/// [`KvCache::sync_lengths`] reads the GPU's lengths back into it.
///
/// Caller buffers must belong to the cache's device. One of another device of the same
/// `wgpu::Instance` is a [`KvqError::BadBuffer`] when it is bound (`append_input`,
/// `attend_io`, `step_io`, `chunk_io`); wgpu's safe API gives no way to recognise a buffer of another
/// `wgpu::Instance`, so that case cannot be checked.
pub struct KvCache {
    /// This cache among the process's caches: the io objects it prepares carry it, and
    /// recording checks it ([`KvqError::WrongCache`]).
    pub(super) id: u64,
    pub(super) ctx: GpuContext,
    pub(super) spec: CacheSpec,
    pub(super) cfg: KernelConfig,
    pub(super) layout: Layout,
    pub(super) pipes: Pipelines,
    pub(super) layers: Vec<Vec<Segment>>,
    pub(super) lens: wgpu::Buffer,
    pub(super) host_lens: Vec<u32>,
    /// `exact_lo` of every (layer, sequence), as on the GPU ([`crate::ExactTokens`]).
    pub(super) host_exact_lo: Vec<u32>,
    pub(super) host_io: Mutex<Option<HostIo>>,
    pub(super) host_query: Mutex<Option<HostQuery>>,
    /// The decode scratch every [`crate::ChunkIo`] of this cache binds (chunks run one after
    /// another on the queue, so they can share it): the longest any has needed so far.
    pub(super) chunk_scratch: Mutex<Option<wgpu::Buffer>>,
    /// Every buffer the cache owns besides the K/V stores, by part (for [`KvCache::memory`]).
    pub(super) owned: Vec<(OwnedPart, wgpu::Buffer)>,
}

/// Copies sink logits from the caller's buffer `src` (checked by the spec: size and usage)
/// into the cache's constants in `lens`; a buffer of another device is a typed error.
fn copy_sink_logits(
    ctx: &GpuContext,
    spec: &CacheSpec,
    plan: &plan::Plan,
    src: &wgpu::Buffer,
    lens: &wgpu::Buffer,
) -> Result<()> {
    let device = &ctx.device;
    let bytes = plan.cfg.sink_words() as u64 * 4;
    let at = (2 * plan.lengths as u64 + plan.cfg.sinks_at() as u64) * 4;
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(src, 0, lens, at, bytes);
    let cmd = enc.finish();
    crate::wait::check_scope(device, scope, |e| KvqError::BadBuffer {
        what: "sink logits".into(),
        problem: format!("cannot be copied to this cache's device: {e}"),
    })?;
    debug_assert_eq!(bytes, spec.layers as u64 * spec.q_heads as u64 * 4);
    ctx.counters().add_submit();
    ctx.queue.submit([cmd]);
    Ok(())
}

/// The next cache's [`KvCache::id`].
static NEXT_CACHE_ID: AtomicU64 = AtomicU64::new(1);

impl KvCache {
    /// Bytes of the decode scratch for one query per sequence (a chunk's slice of `n` takes
    /// `n` times as many).
    pub(super) fn partials_bytes(&self) -> u64 {
        plan::partial_floats(&self.spec, &self.cfg) * 4
    }

    /// Allocates the store and builds the kernels for `spec` on `ctx`'s device.
    pub fn new(ctx: &GpuContext, spec: CacheSpec) -> Result<KvCache> {
        let device = &ctx.device;
        let f16 = ctx.capabilities().f16;
        let plan = plan::plan(
            &spec,
            &device.limits(),
            ctx.tuning(),
            &ctx.info.name,
            f16,
            ctx.matrix_units(),
        )?;
        let pipes = Pipelines::new(
            device,
            ctx.kernels(),
            &plan.cfg,
            ctx.shader_checks(),
            ctx.workgroup_poison(),
        )?;
        let scope = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        // A buffer that failed to allocate is invalid: binding it is a validation error, which
        // must come back as this call's error too, not reach the device's uncaptured handler.
        let invalid_scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bufs = buffers::allocate(ctx, &spec, &plan);
        let layers = bind::bind_segments(device, &pipes, &bufs);
        let invalid = crate::wait::check_scope(device, invalid_scope, |e| {
            KvqError::Gpu(format!("creating the cache failed: {e}"))
        });
        let (adapter, needed) = (ctx.info.name.clone(), bufs.bytes());
        crate::wait::check_scope(device, scope, move |e| KvqError::OutOfMemory {
            adapter,
            what: "the KV cache".into(),
            needed,
            detail: e.to_string(),
        })?;
        invalid?;
        if let Some(SinkLogits::Buffer(src)) = &spec.sink_logits {
            copy_sink_logits(ctx, &spec, &plan, src, &bufs.lens)?;
        }
        Ok(KvCache {
            id: NEXT_CACHE_ID.fetch_add(1, Ordering::Relaxed),
            ctx: ctx.clone(),
            host_lens: vec![0; plan.lengths],
            host_exact_lo: vec![0; plan.lengths],
            spec,
            cfg: plan.cfg,
            layout: plan.layout,
            pipes,
            layers,
            lens: bufs.lens,
            host_io: Mutex::new(None),
            host_query: Mutex::new(None),
            chunk_scratch: Mutex::new(None),
            owned: bufs.owned,
        })
    }

    /// [`KvCache::new`], then [`GpuContext::check_errors_async`]: in a browser (`wasm32`) the
    /// device answers kvq's checks of the allocation and the kernel builds only through the
    /// page's event loop, so this is the form that returns their typed errors there
    /// ([`KvqError::OutOfMemory`], say). Natively the same as [`KvCache::new`].
    pub async fn new_async(ctx: &GpuContext, spec: CacheSpec) -> Result<KvCache> {
        let cache = KvCache::new(ctx, spec)?;
        ctx.check_errors_async().await?;
        Ok(cache)
    }

    /// Every byte of device memory this cache owns, by part: K and V codes, scales, norms and
    /// row padding; lengths; codec constants; decode scratch and the chunks' shared scratch;
    /// parameter uniforms; host-API staging. Summed from
    /// the sizes of the buffers it allocated; [`MemoryReport::total`] is all of them.
    pub fn memory(&self) -> MemoryReport {
        let d = self.spec.head_dim;
        let (mut k, mut v) = (0, 0);
        for seg in self.layers.iter().flatten() {
            k += seg.k.size();
            v += seg.v.size();
        }
        // The exact tokens sit after the first segment's V rows (and their exact_lo after
        // every other's).
        let exact: u64 = (0..self.layout.segments)
            .map(|s| buffers::exact_tail(&self.spec, s))
            .sum::<u64>()
            * self.spec.layers as u64;
        v -= exact;
        let part = |p: OwnedPart| -> u64 {
            self.owned
                .iter()
                .filter(|(q, _)| *q == p)
                .map(|(_, b)| b.size())
                .sum()
        };
        let mut host_staging = 0;
        if let Some(h) = &*self.host_io.lock().unwrap_or_else(|e| e.into_inner()) {
            host_staging += h.k.size() + h.v.size() + h.input.params.size();
        }
        if let Some(h) = &*self.host_query.lock().unwrap_or_else(|e| e.into_inner()) {
            host_staging += h.q.size() + h.out.size();
        }
        // The lengths buffer holds the lengths and overflow flags, then the codec constants,
        // then any K means (counted with the exact tokens they are taken over).
        let k_mean = buffers::k_mean_bytes(&self.spec);
        let state = part(OwnedPart::Lengths) - k_mean;
        let lengths = state.min(8 * self.spec.layers as u64 * self.spec.batch as u64);
        let chunk_scratch = self
            .chunk_scratch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |b| b.size());
        MemoryReport {
            k: StoreBytes::of_rows(self.spec.codecs.k, d, k),
            v: StoreBytes::of_rows(self.spec.codecs.v, d, v),
            lengths,
            constants: state - lengths,
            scratch: part(OwnedPart::Scratch),
            chunk_scratch,
            params: part(OwnedPart::Params),
            exact: exact + k_mean,
            host_staging,
        }
    }

    /// The spec this cache was built from.
    pub fn spec(&self) -> &CacheSpec {
        &self.spec
    }

    /// How storage and decode work are laid out on this device.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The kernel configuration (shape constants) of this cache's shaders.
    pub fn kernel_config(&self) -> &KernelConfig {
        &self.cfg
    }

    /// Whether a step of one new token is recorded as a chunk of 1 ([`KvCache::step_io`]):
    /// where this cache attends chunks of one token by the prefill kernel on matrix units
    /// (its [`crate::CacheSpec::prefill_from`], or the tuning's
    /// [`crate::tuning::DeviceTuning::prefill_from_matrix`], is 1), which then replaces the
    /// fused step's split kernel for the decode too. Same results either way, within the
    /// matrix kernel's f16 products ([`crate::Precision::Fast`]).
    pub fn steps_as_chunks(&self) -> bool {
        self.cfg.matrix.is_some() && self.layout.prefill.is_some_and(|(_, from)| from <= 1)
    }

    /// The context this cache records onto.
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// Bytes of K and V storage on the device (all layers): [`MemoryReport::store`], the
    /// codes' rows without the exact tokens' rows and `exact_lo` words (which share the
    /// segments' V buffers and are counted in [`MemoryReport::exact`]).
    pub fn store_bytes(&self) -> u64 {
        self.memory().store()
    }

    /// Length of `seq` in `layer` as recorded so far (the host mirror of the GPU length, which
    /// a dropped recording leaves ahead: [`KvCache::sync_lengths`]): the tokens appended, which
    /// with a sliding window may pass the capacity (attention then covers the last
    /// `min(len, window)`).
    pub fn len(&self, layer: u32, seq: u32) -> Result<u32> {
        self.check_layer(layer)?;
        if seq >= self.spec.batch {
            return Err(KvqError::SequenceOutOfRange {
                seq,
                batch: self.spec.batch,
            });
        }
        Ok(self.host_lens[(layer * self.spec.batch + seq) as usize])
    }

    /// The range of the GPU buffer that holds every sequence's length, for a caller's own
    /// kernels (a RoPE kernel reading each new token's position on the GPU, say, so that a
    /// decode step still uploads nothing): `layers × batch` u32, the length of sequence `seq`
    /// in `layer` at index `layer * batch + seq`. A recorded append, fused step or chunk
    /// advances its layer's lengths in its own last dispatch, so a kernel recorded before it
    /// reads the length before its new tokens: the first new token's position (with a sliding
    /// window too: lengths count every token appended). Bind it as read-only storage; kvq
    /// writes it only in its own dispatches, which wgpu orders against the caller's in the
    /// same pass.
    pub fn lengths_binding(&self) -> wgpu::BufferBinding<'_> {
        let bytes = self.spec.layers as u64 * self.spec.batch as u64 * 4;
        wgpu::BufferBinding {
            buffer: &self.lens,
            offset: 0,
            size: std::num::NonZeroU64::new(bytes),
        }
    }

    /// True when no layer of any sequence holds a token.
    pub fn is_empty(&self) -> bool {
        self.host_lens.iter().all(|&l| l == 0)
    }

    /// That an io object of `cache` (its [`KvCache::id`]) is this cache's.
    pub(super) fn check_io(&self, cache: u64, what: &'static str) -> Result<()> {
        if cache != self.id {
            return Err(KvqError::WrongCache { what });
        }
        Ok(())
    }

    pub(super) fn check_layer(&self, layer: u32) -> Result<()> {
        if layer >= self.spec.layers {
            return Err(KvqError::LayerOutOfRange {
                layer,
                layers: self.spec.layers,
            });
        }
        Ok(())
    }

    /// The pipelines this cache records (for [`crate::export`]).
    pub(crate) fn pipelines(&self) -> &Pipelines {
        &self.pipes
    }
}
