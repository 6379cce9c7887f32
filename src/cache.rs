//! [`KvCache`]: the GPU-resident store of one model's K and V, with append and decode attention.

use std::sync::Mutex;

use bytemuck::{Pod, Zeroable};

use crate::codec::CodecKind;
use crate::context::GpuContext;
use crate::dispatch::{self, Dispatch, GridShape, SMALL_APPEND_MAX_TOKENS};
use crate::error::{KvqError, Result};
use crate::kernels::{InputType, K_BLOCK, KernelConfig, Pipelines};
use crate::memory::{MemoryReport, StoreBytes};
use crate::spec::CacheSpec;

/// Words each invocation of the wide append handles at least.
const WIDE_ITEMS: u32 = 16;
/// Rows of a rotated codec each wide-append workgroup encodes (several cooperative passes).
const COOP_ROWS: u32 = 16;
/// Fewest tokens per decode split before fewer splits are used.
const MIN_CHUNK: u32 = 32;
/// Most partials per query head (sized into the reduce kernel's workgroup memory).
const MAX_SPLITS_TOTAL: u32 = 1024;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SegParams {
    layer: u32,
    seg_start: u32,
    seg_tokens: u32,
    is_last: u32,
    split_base: u32,
    _pad: [u32; 3],
}

/// One storage segment of one layer: a range of token positions in its own buffers, so that
/// capacities past one binding's size limit are split rather than refused.
struct Segment {
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    append_bg: Bound,
    decode_bg: Bound,
    step_bg: Bound,
}

/// A bind group with the buffers it binds (binding `i` is `buffers[i]`), so that
/// [`crate::export`] can describe a recording to another WebGPU host.
pub(crate) struct Bound {
    pub(crate) group: wgpu::BindGroup,
    pub(crate) buffers: Vec<wgpu::Buffer>,
}

fn bind_buffers(
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

/// Where kvq records its dispatches: a compute pass, or [`crate::export`]'s plan recorder.
/// Every dispatch kvq records goes through one of the `record_*` functions below, so an
/// exported plan is exactly what the cache records natively.
pub(crate) trait Recorder {
    fn set_pipeline(&mut self, pipeline: &wgpu::ComputePipeline);
    fn set_bind_group(&mut self, index: u32, group: &Bound);
    fn dispatch_workgroups(&mut self, x: u32, y: u32, z: u32);
    /// Dispatches by `rule`'s grid for `shape`: the only way kvq dispatches a kernel.
    fn dispatch(&mut self, rule: &Dispatch, shape: &GridShape) {
        let [x, y, z] = rule.workgroups(shape);
        self.dispatch_workgroups(x, y, z);
    }
}

impl Recorder for wgpu::ComputePass<'_> {
    fn set_pipeline(&mut self, pipeline: &wgpu::ComputePipeline) {
        wgpu::ComputePass::set_pipeline(self, pipeline);
    }
    fn set_bind_group(&mut self, index: u32, group: &Bound) {
        wgpu::ComputePass::set_bind_group(self, index, &group.group, &[]);
    }
    fn dispatch_workgroups(&mut self, x: u32, y: u32, z: u32) {
        wgpu::ComputePass::dispatch_workgroups(self, x, y, z);
    }
}

/// How a cache's storage and decode work are laid out on this device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Storage segments per layer (1 unless one layer's rows pass a binding's size limit).
    pub segments: u32,
    /// Token positions per segment (the last may hold fewer).
    pub segment_tokens: u32,
    /// Decode splits per segment.
    pub splits: u32,
    /// Bytes of one stored K row (one token, one KV head).
    pub k_row_bytes: u64,
    /// Bytes of one stored V row.
    pub v_row_bytes: u64,
}

/// Caller buffers prepared for [`KvCache::append`]: bind groups are built once here, so
/// recording an append allocates nothing.
pub struct AppendInput {
    bind_group: Bound,
    n: u32,
    input: InputType,
    wide_groups: u32,
    params: wgpu::Buffer,
}

impl AppendInput {
    /// Tokens per sequence each append with this input writes.
    pub fn tokens(&self) -> u32 {
        self.n
    }
}

/// Caller buffers prepared for [`KvCache::attend`]: the query `[B, q_heads, head_dim]` f32 and
/// the output of the same shape.
pub struct AttendIo {
    bind_group: Bound,
}

/// Caller buffers prepared for [`KvCache::step`]: the new tokens' K and V (as for
/// [`KvCache::append_input`]) with the query and output (as for [`KvCache::attend_io`]).
pub struct StepIo {
    bind_group: Bound,
    n: u32,
    input: InputType,
}

impl StepIo {
    /// Tokens per sequence each step with these buffers appends.
    pub fn tokens(&self) -> u32 {
        self.n
    }
}

struct HostIo {
    n: u32,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    input: AppendInput,
}

struct HostQuery {
    q: wgpu::Buffer,
    out: wgpu::Buffer,
    io: AttendIo,
}

/// A quantized (or f16) KV cache living on the GPU.
///
/// Storage is allocated once, at creation. Sequence lengths live on the GPU, one per (layer,
/// sequence); kvq keeps a host mirror of what it has recorded, to refuse appends past the
/// capacity before they reach the GPU. The GPU checks again and writes nothing on overflow.
///
/// Caller buffers must belong to the cache's device. One of another device of the same
/// `wgpu::Instance` is a [`KvqError::BadBuffer`] when it is bound (`append_input`,
/// `attend_io`, `step_io`); wgpu's safe API gives no way to recognise a buffer of another
/// `wgpu::Instance`, so that case cannot be checked.
pub struct KvCache {
    ctx: GpuContext,
    spec: CacheSpec,
    cfg: KernelConfig,
    layout: Layout,
    pipes: Pipelines,
    layers: Vec<Vec<Segment>>,
    lens: wgpu::Buffer,
    host_lens: Vec<u32>,
    host_io: Mutex<Option<HostIo>>,
    host_query: Mutex<Option<HostQuery>>,
    /// Every buffer the cache owns besides the K/V stores, by part (for [`KvCache::memory`]).
    owned: Vec<(OwnedPart, wgpu::Buffer)>,
}

/// What a buffer in [`KvCache`]'s `owned` list is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OwnedPart {
    Lengths,
    Scratch,
    Params,
}

/// A compute pass of kvq's own in the caller's encoder (for the encoder-level calls).
fn own_pass<'e>(encoder: &'e mut wgpu::CommandEncoder, label: &str) -> wgpu::ComputePass<'e> {
    encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
        label: Some(label),
        timestamp_writes: None,
    })
}

/// A buffer created with `contents` (a multiple of 4 bytes). Unlike wgpu's `create_buffer_init`
/// it does not panic when the buffer cannot be allocated: the error goes to the device's error
/// scopes like any other allocation's, and the buffer is invalid.
fn init_buffer(
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

impl KvCache {
    /// Allocates the store and builds the kernels for `spec` on `ctx`'s device.
    pub fn new(ctx: &GpuContext, spec: CacheSpec) -> Result<KvCache> {
        spec.validate()?;
        for c in [spec.codecs.k, spec.codecs.v] {
            if !crate::kernels::gpu_supported(c) {
                return Err(KvqError::InvalidSpec(format!(
                    "codec '{}' has a CPU reference (kvq::codec) but no GPU kernels: the QJL-only configurations (0-bit codes) are for quality studies",
                    c.name()
                )));
            }
        }
        let device = &ctx.device;
        let limits = device.limits();
        let d = spec.head_dim;
        let k_row_bytes = spec.codecs.k.row_words(d) as u64 * 4;
        let v_row_bytes = spec.codecs.v.row_words(d) as u64 * 4;
        let per_token = spec.batch as u64 * spec.kv_heads as u64 * k_row_bytes.max(v_row_bytes);
        // At most 4 GiB a binding (Metal allows more): the kernels index in u32, and this
        // keeps every element index of every binding below 2^32.
        let max_binding = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size)
            .min(u32::MAX as u64);
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
                adapter: ctx.info.name.clone(),
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
        let tuning = crate::tuning::for_adapter(&ctx.info);
        let mut splits = spec
            .splits
            .unwrap_or_else(|| tuning.splits(&spec, seg_tokens));
        // Each segment also has one split for the tokens a fused step appends.
        splits = (MAX_SPLITS_TOTAL / segments)
            .saturating_sub(1)
            .min(splits)
            .max(1);
        if 2 * segments > MAX_SPLITS_TOTAL {
            return Err(KvqError::InvalidSpec(format!(
                "capacity {} needs {segments} storage segments on this adapter; at most {MAX_SPLITS_TOTAL} are supported",
                spec.capacity
            )));
        }
        let layout = Layout {
            segments,
            segment_tokens: seg_tokens,
            splits,
            k_row_bytes,
            v_row_bytes,
        };
        let cfg = KernelConfig {
            head_dim: d,
            gqa: spec.gqa(),
            kv_heads: spec.kv_heads,
            batch: spec.batch,
            capacity: spec.capacity,
            window: spec.window,
            layers: spec.layers,
            splits,
            segments,
            min_chunk: MIN_CHUNK,
            scale: spec.softmax_scale(),
            workgroup: tuning.workgroup(&spec),
            k: spec.codecs.k,
            v: spec.codecs.v,
        };
        let wg_bytes = cfg.split_workgroup_bytes();
        if wg_bytes > limits.max_compute_workgroup_storage_size {
            return Err(KvqError::AdapterTooWeak {
                adapter: ctx.info.name.clone(),
                what: "max_compute_workgroup_storage_size".into(),
                needed: wg_bytes as u64,
                have: limits.max_compute_workgroup_storage_size as u64,
            });
        }
        // The store is split to fit a binding; the decode scratch and the constants are one
        // binding each, so a shape that needs more than the adapter binds is refused here.
        let n_lens = (spec.layers * spec.batch) as usize;
        let constants = cfg.constants(spec.seed);
        let part_floats = spec.batch as u64
            * spec.q_heads as u64
            * cfg.splits_total() as u64
            * (cfg.partial_width() as u64 + 4);
        for (what, bytes) in [
            (
                "decode scratch (batch x q_heads x splits partials)",
                part_floats * 4,
            ),
            (
                "lengths and codec constants",
                (2 * n_lens + constants.len()) as u64 * 4,
            ),
        ] {
            if bytes > max_binding {
                return Err(KvqError::AdapterTooWeak {
                    adapter: ctx.info.name.clone(),
                    what: format!("max_storage_buffer_binding_size (the {what})"),
                    needed: bytes,
                    have: max_binding,
                });
            }
        }
        let pipes = Pipelines::new(device, &cfg, ctx.shader_checks(), ctx.workgroup_poison())?;

        let scope = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        // A buffer that failed to allocate is invalid: binding it is a validation error, which
        // must come back as this call's error too, not reach the device's uncaptured handler.
        let invalid_scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        // Lengths then overflow flags, all zero (an empty cache), then the codec constants
        // (rotations, codebooks, QJL matrix) the kernels read.
        let mut state = vec![0u32; 2 * n_lens];
        state.extend(constants.iter().map(|c| c.to_bits()));
        ctx.counters().add_upload(state.len() as u64 * 4);
        let lens = init_buffer(
            device,
            "kvq lengths and codec constants",
            bytemuck::cast_slice(&state),
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
        );
        let partials = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kvq decode partials"),
            size: part_floats * 4,
            // COPY_SRC: crate::export reads every buffer's initial bytes.
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let rows = |t: u32| spec.batch as u64 * spec.kv_heads as u64 * t as u64;
        let store_usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST;
        let mut owned = vec![
            (OwnedPart::Lengths, lens.clone()),
            (OwnedPart::Scratch, partials.clone()),
        ];
        let mut layers = Vec::with_capacity(spec.layers as usize);
        for layer in 0..spec.layers {
            let mut segs = Vec::with_capacity(segments as usize);
            for s in 0..segments {
                let start = s * seg_tokens;
                // Allocated in whole K interleave blocks; positions past capacity stay unused.
                let tokens = seg_tokens
                    .min(spec.capacity - start)
                    .next_multiple_of(K_BLOCK);
                let buf = |label: &str, row: u64| {
                    device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(label),
                        size: rows(tokens) * row,
                        usage: store_usage,
                        mapped_at_creation: false,
                    })
                };
                let k = buf("kvq K store", k_row_bytes);
                let v = buf("kvq V store", v_row_bytes);
                let params = SegParams {
                    layer,
                    seg_start: start,
                    seg_tokens: tokens,
                    is_last: (s + 1 == segments) as u32,
                    split_base: s * (splits + 1),
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
                let bg = |layout: &wgpu::BindGroupLayout, bufs: &[&wgpu::Buffer]| {
                    bind_buffers(device, "kvq segment", layout, bufs)
                };
                let append_bg = bg(&pipes.append_store, &[&params, &k, &v, &lens]);
                let decode_bg = bg(&pipes.decode_store, &[&params, &k, &v, &lens, &partials]);
                let step_bg = bg(&pipes.step_store, &[&params, &k, &v, &lens, &partials]);
                segs.push(Segment {
                    k,
                    v,
                    append_bg,
                    decode_bg,
                    step_bg,
                });
            }
            layers.push(segs);
        }
        let invalid = pollster::block_on(invalid_scope.pop());
        if let Some(e) = pollster::block_on(scope.pop()) {
            let stores: u64 = layers
                .iter()
                .flatten()
                .map(|s| s.k.size() + s.v.size())
                .sum();
            return Err(KvqError::OutOfMemory {
                adapter: ctx.info.name.clone(),
                what: "the KV cache".into(),
                needed: stores + owned.iter().map(|(_, b)| b.size()).sum::<u64>(),
                detail: e.to_string(),
            });
        }
        if let Some(e) = invalid {
            return Err(KvqError::Gpu(format!("creating the cache failed: {e}")));
        }
        Ok(KvCache {
            ctx: ctx.clone(),
            host_lens: vec![0; n_lens],
            spec,
            cfg,
            layout,
            pipes,
            layers,
            lens,
            host_io: Mutex::new(None),
            host_query: Mutex::new(None),
            owned,
        })
    }

    /// Every byte of device memory this cache owns, by part: K and V codes, scales, norms and
    /// row padding; lengths; codec constants; decode scratch; parameter uniforms; host-API
    /// staging. Summed from
    /// the sizes of the buffers it allocated; [`MemoryReport::total`] is all of them.
    pub fn memory(&self) -> MemoryReport {
        let d = self.spec.head_dim;
        let (mut k, mut v) = (0, 0);
        for seg in self.layers.iter().flatten() {
            k += seg.k.size();
            v += seg.v.size();
        }
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
        // The lengths buffer holds the lengths and overflow flags, then the codec constants.
        let state = part(OwnedPart::Lengths);
        let lengths = state.min(8 * self.spec.layers as u64 * self.spec.batch as u64);
        MemoryReport {
            k: StoreBytes::of_rows(self.spec.codecs.k, d, k),
            v: StoreBytes::of_rows(self.spec.codecs.v, d, v),
            lengths,
            constants: state - lengths,
            scratch: part(OwnedPart::Scratch),
            params: part(OwnedPart::Params),
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

    /// The context this cache records onto.
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// Bytes of K and V storage on the device (all layers).
    pub fn store_bytes(&self) -> u64 {
        self.layers
            .iter()
            .flatten()
            .map(|s| s.k.size() + s.v.size())
            .sum()
    }

    /// Length of `seq` in `layer` as recorded so far (the host mirror of the GPU length): the
    /// tokens appended, which with a sliding window may pass the capacity (attention then
    /// covers the last `min(len, window)`).
    pub fn len(&self, layer: u32, seq: u32) -> Result<u32> {
        self.check_layer(layer)?;
        if seq >= self.spec.batch {
            return Err(KvqError::InvalidSpec(format!(
                "sequence {seq} out of range (batch {})",
                self.spec.batch
            )));
        }
        Ok(self.host_lens[(layer * self.spec.batch + seq) as usize])
    }

    /// True when no layer of any sequence holds a token.
    pub fn is_empty(&self) -> bool {
        self.host_lens.iter().all(|&l| l == 0)
    }

    fn check_layer(&self, layer: u32) -> Result<()> {
        if layer >= self.spec.layers {
            return Err(KvqError::LayerOutOfRange {
                layer,
                layers: self.spec.layers,
            });
        }
        Ok(())
    }

    fn check_buffer(
        &self,
        what: &str,
        buf: &wgpu::Buffer,
        need: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<()> {
        if buf.size() < need {
            return Err(KvqError::BadBuffer {
                what: what.into(),
                problem: format!("{} bytes, needs at least {need}", buf.size()),
            });
        }
        if !buf.usage().contains(usage) {
            return Err(KvqError::BadBuffer {
                what: what.into(),
                problem: format!("usage {:?} lacks {usage:?}", buf.usage()),
            });
        }
        Ok(())
    }

    fn check_kv_inputs(
        &self,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        n: u32,
        input: InputType,
    ) -> Result<()> {
        let s = &self.spec;
        if n == 0 {
            return Err(KvqError::InvalidSpec(
                "append needs at least one token".into(),
            ));
        }
        if n > s.capacity && s.window.is_none() {
            return Err(KvqError::CapacityExceeded {
                layer: 0,
                len: 0,
                n,
                capacity: s.capacity,
            });
        }
        let need = s.batch as u64 * n as u64 * s.kv_heads as u64 * s.head_dim as u64 * input.size();
        self.check_buffer("k", k, need, wgpu::BufferUsages::STORAGE)?;
        self.check_buffer("v", v, need, wgpu::BufferUsages::STORAGE)
    }

    fn check_query_io(&self, q: &wgpu::Buffer, out: &wgpu::Buffer) -> Result<()> {
        let s = &self.spec;
        let need = s.batch as u64 * s.q_heads as u64 * s.head_dim as u64 * 4;
        self.check_buffer("q", q, need, wgpu::BufferUsages::STORAGE)?;
        self.check_buffer("out", out, need, wgpu::BufferUsages::STORAGE)
    }

    /// A 16-byte uniform written once when a binding is prepared, never per step.
    fn uniform(&self, label: &str, words: [u32; 4]) -> Result<wgpu::Buffer> {
        let device = &self.ctx.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buf = init_buffer(
            device,
            label,
            bytemuck::cast_slice(&words),
            // COPY_SRC: crate::export reads every buffer's initial bytes.
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_SRC,
        );
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(KvqError::OutOfMemory {
                adapter: self.ctx.info.name.clone(),
                what: label.into(),
                needed: buf.size(),
                detail: e.to_string(),
            });
        }
        self.ctx.counters().add_upload(16);
        Ok(buf)
    }

    /// Binds caller buffers; a buffer wgpu refuses to bind (one of another device, say) is a
    /// typed error here rather than a report to the device's uncaptured-error handler.
    fn bind(
        &self,
        label: &str,
        layout: &wgpu::BindGroupLayout,
        bufs: &[&wgpu::Buffer],
    ) -> Result<Bound> {
        let scope = self
            .ctx
            .device
            .push_error_scope(wgpu::ErrorFilter::Validation);
        let bound = bind_buffers(&self.ctx.device, label, layout, bufs);
        match pollster::block_on(scope.pop()) {
            None => Ok(bound),
            Some(e) => Err(KvqError::BadBuffer {
                what: label.into(),
                problem: format!("wgpu cannot bind it to this cache's device: {e}"),
            }),
        }
    }

    /// The pipelines this cache records (for [`crate::export`]).
    pub(crate) fn pipelines(&self) -> &Pipelines {
        &self.pipes
    }

    /// Prepares caller buffers holding `n` new tokens per sequence, layout
    /// `[batch, n, kv_heads, head_dim]` of `input` elements, for [`KvCache::append`].
    ///
    /// # Non-finite inputs
    /// Every append path (this one, [`KvCache::append_host`] and the fused
    /// [`KvCache::step`]) stores a NaN or ±Inf input value exactly as it would store 0, for
    /// every codec: the encoders read non-finite values as 0 before computing scales, norms or
    /// codes. So a bad value changes only its own row (its K or V vector of that token and KV
    /// head), attention outputs stay finite, the sequence's other tokens keep their weight,
    /// and other sequences are not affected at all (bit for bit). kvq does not report such
    /// values; check your inputs if you need to know. With codec `none` (f16 rows) a finite
    /// value beyond f16's range is stored as ±65504, not ±Inf.
    pub fn append_input(
        &self,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        n: u32,
        input: InputType,
    ) -> Result<AppendInput> {
        self.check_kv_inputs(k, v, n, input)?;
        // Built here, once, so that recording an append never compiles a pipeline.
        self.pipes.append(input)?;
        let s = &self.spec;
        let row_tasks = crate::kernels::encode_tasks(s.codecs.k, s.head_dim)
            + crate::kernels::encode_tasks(s.codecs.v, s.head_dim);
        let tasks = n as u64 * s.kv_heads as u64 * row_tasks as u64;
        let max_groups = self
            .ctx
            .device
            .limits()
            .max_compute_workgroups_per_dimension as u64;
        let items = (WIDE_ITEMS as u64).max(tasks.div_ceil(256 * max_groups)) as u32;
        // Rows a wide workgroup encodes cooperatively (rotated codecs): a few passes each.
        let rows = n as u64 * s.kv_heads as u64;
        let coop_rows = (COOP_ROWS as u64).max(rows.div_ceil(max_groups)) as u32;
        let cooperative = s.codecs.k.kind.is_rotated() || s.codecs.v.kind.is_rotated();
        let coop_groups = if cooperative {
            rows.div_ceil(coop_rows as u64)
        } else {
            0
        };
        let wide_groups = tasks.div_ceil(256 * items as u64).max(coop_groups) as u32;
        let params = self.uniform("kvq append params", [n, items, coop_rows, 0])?;
        let bind_group = self.bind(
            "kvq append input",
            &self.pipes.append_input,
            &[k, v, &params],
        )?;
        Ok(AppendInput {
            bind_group,
            n,
            input,
            wide_groups,
            params,
        })
    }

    /// Prepares a caller's query buffer (`[batch, q_heads, head_dim]` f32, STORAGE) and output
    /// buffer (same shape, STORAGE) for [`KvCache::attend`].
    pub fn attend_io(&self, q: &wgpu::Buffer, out: &wgpu::Buffer) -> Result<AttendIo> {
        self.check_query_io(q, out)?;
        Ok(AttendIo {
            bind_group: self.bind("kvq attend io", &self.pipes.decode_io, &[q, out])?,
        })
    }

    /// Prepares the buffers of a fused decode step: `k`, `v` hold `n` new tokens per
    /// sequence (`[batch, n, kv_heads, head_dim]` of `input` elements); `q` and `out` are
    /// `[batch, q_heads, head_dim]` f32. All need STORAGE usage.
    pub fn step_io(
        &self,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        n: u32,
        input: InputType,
        q: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Result<StepIo> {
        self.check_kv_inputs(k, v, n, input)?;
        self.check_query_io(q, out)?;
        // Built here, once, so that recording a step never compiles a pipeline.
        self.pipes.step(input)?;
        let params = self.uniform("kvq step params", [n, 0, 0, 0])?;
        let bind_group = self.bind("kvq step io", &self.pipes.step_io, &[q, out, k, v, &params])?;
        Ok(StepIo {
            bind_group,
            n,
            input,
        })
    }

    /// Refuses (with the host mirror unchanged) an append of `n` tokens that would pass the
    /// capacity of any sequence of `layer` (for a sliding window, which never fills: the range
    /// of its u32 position count); otherwise advances the mirror.
    fn reserve(&mut self, layer: u32, n: u32) -> Result<()> {
        self.check_layer(layer)?;
        let b = self.spec.batch as usize;
        let limit = match self.spec.window {
            Some(_) => u32::MAX as u64,
            None => self.spec.capacity as u64,
        };
        let lens = &mut self.host_lens[layer as usize * b..(layer as usize + 1) * b];
        if let Some(&len) = lens.iter().find(|&&l| l as u64 + n as u64 > limit) {
            return Err(KvqError::CapacityExceeded {
                layer,
                len,
                n,
                capacity: self.spec.capacity,
            });
        }
        lens.iter_mut().for_each(|l| *l += n);
        Ok(())
    }

    /// Records a fused decode step for `layer` into an open compute pass: appends the new
    /// tokens and attends the query over the whole prefix including them, in two dispatches
    /// (the split kernel writes the new rows it covers; the reduce commits the length).
    /// Same result as [`KvCache::append_in_pass`] then [`KvCache::attend_in_pass`]; a NaN or
    /// ±Inf input value is stored as 0 (see [`KvCache::append_input`]).
    pub fn step_in_pass(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        layer: u32,
        io: &StepIo,
    ) -> Result<()> {
        self.record_step(pass, layer, io)
    }

    /// [`KvCache::step_in_pass`] into any [`Recorder`].
    pub(crate) fn record_step(
        &mut self,
        pass: &mut impl Recorder,
        layer: u32,
        io: &StepIo,
    ) -> Result<()> {
        self.check_layer(layer)?;
        let [split, reduce] = self.pipes.step(io.input)?.clone();
        self.reserve(layer, io.n)?;
        self.record_attention(pass, layer, &split, &reduce, &io.bind_group, |seg| {
            &seg.step_bg
        });
        Ok(())
    }

    /// Records a fused decode step into `encoder` (in a compute pass of its own).
    pub fn step(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        layer: u32,
        io: &StepIo,
    ) -> Result<()> {
        self.step_in_pass(&mut own_pass(encoder, "kvq step"), layer, io)
    }

    /// Records an append of `input`'s tokens to `layer` into an open compute pass.
    ///
    /// Refused (nothing recorded) when any sequence would pass the capacity.
    pub fn append_in_pass(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        layer: u32,
        input: &AppendInput,
    ) -> Result<()> {
        self.record_append(pass, layer, input)
    }

    /// [`KvCache::append_in_pass`] into any [`Recorder`].
    pub(crate) fn record_append(
        &mut self,
        pass: &mut impl Recorder,
        layer: u32,
        input: &AppendInput,
    ) -> Result<()> {
        self.check_layer(layer)?;
        let pipes = self.pipes.append(input.input)?.clone();
        self.reserve(layer, input.n)?;
        let segs = &self.layers[layer as usize];
        pass.set_bind_group(1, &input.bind_group);
        let mut dispatches = 0;
        let shape = GridShape {
            wide_groups: input.wide_groups,
            ..self.grid_shape()
        };
        if input.n <= SMALL_APPEND_MAX_TOKENS {
            pass.set_pipeline(&pipes[0]);
            for seg in segs {
                pass.set_bind_group(0, &seg.append_bg);
                pass.dispatch(&dispatch::APPEND_SMALL, &shape);
                dispatches += 1;
            }
        } else {
            pass.set_pipeline(&pipes[1]);
            for seg in segs {
                pass.set_bind_group(0, &seg.append_bg);
                pass.dispatch(&dispatch::APPEND_WIDE, &shape);
                dispatches += 1;
            }
            pass.set_pipeline(&pipes[2]);
            pass.dispatch(&dispatch::APPEND_COMMIT, &shape);
            dispatches += 1;
        }
        self.ctx.counters().add_dispatches(dispatches);
        Ok(())
    }

    /// Records decode attention of `io`'s query over `layer`'s stored prefix into an open
    /// compute pass. Reads the lengths on the GPU: nothing is uploaded. A sequence with no
    /// tokens gets a zero output.
    pub fn attend_in_pass(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        layer: u32,
        io: &AttendIo,
    ) -> Result<()> {
        self.record_attend(pass, layer, io)
    }

    /// [`KvCache::attend_in_pass`] into any [`Recorder`].
    pub(crate) fn record_attend(
        &self,
        pass: &mut impl Recorder,
        layer: u32,
        io: &AttendIo,
    ) -> Result<()> {
        self.check_layer(layer)?;
        let [split, reduce] = self.pipes.attend();
        self.record_attention(pass, layer, split, reduce, &io.bind_group, |seg| {
            &seg.decode_bg
        });
        Ok(())
    }

    /// The split dispatch of every segment of `layer`, then the reduce: shared by attend and
    /// the fused step, which differ in pipelines and bind groups only.
    fn record_attention(
        &self,
        pass: &mut impl Recorder,
        layer: u32,
        split: &wgpu::ComputePipeline,
        reduce: &wgpu::ComputePipeline,
        io: &Bound,
        store: impl Fn(&Segment) -> &Bound,
    ) {
        let segs = &self.layers[layer as usize];
        let shape = self.grid_shape();
        pass.set_bind_group(1, io);
        pass.set_pipeline(split);
        for seg in segs {
            pass.set_bind_group(0, store(seg));
            pass.dispatch(&dispatch::SPLIT, &shape);
        }
        pass.set_pipeline(reduce);
        pass.dispatch(&dispatch::REDUCE, &shape);
        self.ctx.counters().add_dispatches(segs.len() as u64 + 1);
    }

    /// What this cache's dispatch grids are evaluated on ([`crate::dispatch`]).
    pub fn grid_shape(&self) -> GridShape {
        GridShape {
            batch: self.spec.batch,
            q_heads: self.spec.q_heads,
            kv_heads: self.spec.kv_heads,
            splits: self.layout.splits,
            wide_groups: 0,
        }
    }

    /// Records an append into `encoder` (in a compute pass of its own). A NaN or ±Inf input
    /// value is stored as 0 (see [`KvCache::append_input`]).
    pub fn append(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        layer: u32,
        input: &AppendInput,
    ) -> Result<()> {
        self.append_in_pass(&mut own_pass(encoder, "kvq append"), layer, input)
    }

    /// Records decode attention into `encoder` (in a compute pass of its own).
    pub fn attend(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        layer: u32,
        io: &AttendIo,
    ) -> Result<()> {
        self.attend_in_pass(&mut own_pass(encoder, "kvq attend"), layer, io)
    }

    /// Host convenience: uploads `k` and `v` (`[batch, n, kv_heads, head_dim]` f32) and appends
    /// them to `layer`, waiting for the GPU. A NaN or ±Inf value is stored as 0 (see
    /// [`KvCache::append_input`]).
    pub fn append_host(&mut self, layer: u32, k: &[f32], v: &[f32]) -> Result<()> {
        self.check_layer(layer)?;
        let s = &self.spec;
        let per_tok = (s.batch * s.kv_heads * s.head_dim) as usize;
        if k.is_empty() || !k.len().is_multiple_of(per_tok) {
            return Err(KvqError::WrongLength {
                what: format!(
                    "k (a whole number of tokens of batch*kv_heads*head_dim = {per_tok})"
                ),
                expected: per_tok * (k.len() / per_tok).max(1),
                got: k.len(),
            });
        }
        if v.len() != k.len() {
            return Err(KvqError::WrongLength {
                what: "v (same as k)".into(),
                expected: k.len(),
                got: v.len(),
            });
        }
        let n = (k.len() / per_tok) as u32;
        let mut slot = self
            .host_io
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if slot.as_ref().map(|h| h.n) != Some(n) {
            let buf = |label| {
                self.ctx.create_buffer_checked(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size: (k.len() * 4) as u64,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            };
            let (kb, vb) = (buf("kvq host k")?, buf("kvq host v")?);
            let input = self.append_input(&kb, &vb, n, InputType::F32)?;
            slot = Some(HostIo {
                n,
                k: kb,
                v: vb,
                input,
            });
        }
        let io = slot.expect("host io set above");
        self.ctx.upload(&io.k, 0, bytemuck::cast_slice(k));
        self.ctx.upload(&io.v, 0, bytemuck::cast_slice(v));
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        let res = self.append(&mut enc, layer, &io.input);
        if res.is_ok() {
            self.ctx.submit_and_wait(enc.finish())?;
        }
        *self.host_io.lock().unwrap_or_else(|e| e.into_inner()) = Some(io);
        res
    }

    /// Host convenience: attends `q` (`[batch, q_heads, head_dim]` f32) over `layer` and
    /// returns the output, same shape.
    pub fn attend_host(&self, layer: u32, q: &[f32]) -> Result<Vec<f32>> {
        self.check_layer(layer)?;
        let s = &self.spec;
        let want = (s.batch * s.q_heads * s.head_dim) as usize;
        if q.len() != want {
            return Err(KvqError::WrongLength {
                what: "q ([batch, q_heads, head_dim])".into(),
                expected: want,
                got: q.len(),
            });
        }
        for b in 0..s.batch {
            if self.len(layer, b)? == 0 {
                return Err(KvqError::EmptySequence { layer });
            }
        }
        let mut guard = self.host_query.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let buf = |label, usage| {
                self.ctx.create_buffer_checked(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size: (want * 4) as u64,
                    usage,
                    mapped_at_creation: false,
                })
            };
            let q = buf(
                "kvq host q",
                wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            )?;
            let out = buf(
                "kvq host out",
                wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
            )?;
            let io = self.attend_io(&q, &out)?;
            *guard = Some(HostQuery { q, out, io });
        }
        let hq = guard.as_ref().expect("host query set above");
        self.ctx.upload(&hq.q, 0, bytemuck::cast_slice(q));
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        self.attend(&mut enc, layer, &hq.io)?;
        self.ctx.submit_and_wait(enc.finish())?;
        let bytes = self.ctx.read_back(&hq.out, 0, (want * 4) as u64)?;
        Ok(bytemuck::cast_slice(&bytes).to_vec())
    }

    /// Cuts sequence `seq` back to its first `len` tokens in every layer (speculative decoding
    /// rejecting drafted tokens, say) and clears its overflow flags. Nothing is reallocated; the
    /// rows past `len` are overwritten by later appends.
    ///
    /// With a sliding window, the ring holds a sequence's last `capacity` tokens, so a cut is
    /// refused (nothing changed) when the window ending at `len` would need a token the ring
    /// has already overwritten: allowed while the sequence holds at most `capacity` tokens, or
    /// when `len >= current - (capacity - window)`. [`KvCache::reset`] (`len` 0) always works.
    ///
    /// The new lengths are written through the queue and submitted at once, so they land after
    /// everything already submitted: submit any recorded work on this cache first.
    pub fn truncate(&mut self, seq: u32, len: u32) -> Result<()> {
        let s = &self.spec;
        if seq >= s.batch {
            return Err(KvqError::InvalidSpec(format!(
                "sequence {seq} out of range (batch {})",
                s.batch
            )));
        }
        for layer in 0..s.layers {
            let cur = self.host_lens[(layer * s.batch + seq) as usize];
            if len > cur {
                return Err(KvqError::InvalidSpec(format!(
                    "cannot truncate sequence {seq} to {len} tokens: layer {layer} holds {cur}"
                )));
            }
            if let Some(w) = s.window {
                // Oldest position still in the ring, and oldest the window at `len` needs.
                let kept = cur.saturating_sub(s.capacity);
                if len > 0 && len.saturating_sub(w) < kept {
                    return Err(KvqError::InvalidSpec(format!(
                        "cannot truncate sequence {seq} to {len} tokens: layer {layer} holds {cur} and its ring of {} slots no longer has position {} that a window of {w} ending there needs (at most {} tokens can be rolled back now)",
                        s.capacity,
                        len.saturating_sub(w),
                        cur - (kept + w).min(cur)
                    )));
                }
            }
        }
        let n = s.layers * s.batch;
        for layer in 0..s.layers {
            let i = layer * s.batch + seq;
            self.ctx
                .upload(&self.lens, 4 * i as u64, bytemuck::bytes_of(&len));
            self.ctx
                .upload(&self.lens, 4 * (n + i) as u64, bytemuck::bytes_of(&0u32));
            self.host_lens[i as usize] = len;
        }
        let enc = self.ctx.device.create_command_encoder(&Default::default());
        self.ctx.counters().add_submit();
        self.ctx.queue.submit([enc.finish()]);
        Ok(())
    }

    /// Empties sequence `seq` in every layer so its slot can serve a new sequence (see
    /// [`KvCache::truncate`]).
    pub fn reset(&mut self, seq: u32) -> Result<()> {
        self.truncate(seq, 0)
    }

    /// Reads the lengths and overflow flags from the GPU (`[layers * batch]` each): for tests
    /// and diagnostics, not for the hot path.
    pub fn read_gpu_lengths(&self) -> Result<(Vec<u32>, Vec<u32>)> {
        let n = (self.spec.layers * self.spec.batch) as usize;
        let bytes = self.ctx.read_back(&self.lens, 0, (2 * n * 4) as u64)?;
        let all: &[u32] = bytemuck::cast_slice(&bytes);
        Ok((all[..n].to_vec(), all[n..].to_vec()))
    }

    /// Reads the stored rows of `layer` by slot: K then V, each
    /// `[batch, kv_heads, capacity, row_words]` words exactly as the codec's row layout
    /// defines them (storage interleaving and segments undone). Slot = token position, or
    /// position % capacity with a sliding window. For tests and diagnostics.
    pub fn read_rows(&self, layer: u32) -> Result<(Vec<u32>, Vec<u32>)> {
        self.check_layer(layer)?;
        let s = &self.spec;
        let (kw, vw) = (
            s.codecs.k.row_words(s.head_dim) as usize,
            s.codecs.v.row_words(s.head_dim) as usize,
        );
        let runs = (s.batch * s.kv_heads) as usize;
        let cap = s.capacity as usize;
        let mut k = vec![0u32; runs * cap * kw];
        let mut v = vec![0u32; runs * cap * vw];
        for (si, seg) in self.layers[layer as usize].iter().enumerate() {
            let kraw: Vec<u32> =
                bytemuck::cast_slice(&self.ctx.read_back(&seg.k, 0, seg.k.size())?).to_vec();
            let vraw: Vec<u32> =
                bytemuck::cast_slice(&self.ctx.read_back(&seg.v, 0, seg.v.size())?).to_vec();
            let start = si * self.layout.segment_tokens as usize;
            let stride = kraw.len() / (runs * kw); // allocated tokens per run in this segment
            for run in 0..runs {
                for p in 0..stride.min(cap.saturating_sub(start)) {
                    let row = run * stride + p;
                    let dst = (run * cap + start + p) * kw;
                    for w in 0..kw {
                        // K interleave: f16 by 16-byte chunks, q8/q4 by words (wgsl/codec_*.wgsl).
                        let idx = if s.codecs.k.kind == CodecKind::None {
                            4 * ((row - row % K_BLOCK as usize) * (kw / 4)
                                + (w / 4) * K_BLOCK as usize
                                + row % K_BLOCK as usize)
                                + w % 4
                        } else {
                            (row - row % K_BLOCK as usize) * kw
                                + w * K_BLOCK as usize
                                + row % K_BLOCK as usize
                        };
                        k[dst + w] = kraw[idx];
                    }
                    let vdst = (run * cap + start + p) * vw;
                    v[vdst..vdst + vw].copy_from_slice(&vraw[row * vw..(row + 1) * vw]);
                }
            }
        }
        Ok((k, v))
    }
}
