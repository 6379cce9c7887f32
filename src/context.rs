//! The GPU context: adapter selection, device limits, and transfer counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{KvqError, Result};
use crate::kernels::KernelCache;

/// Counts of host<->GPU traffic and GPU work that kvq itself caused.
///
/// Every queue write, readback and dispatch kvq makes goes through these counters, so a caller
/// (and the tests) can prove that a recorded decode step moves zero host bytes.
#[derive(Debug, Default)]
pub struct TransferCounters {
    uploaded: AtomicU64,
    downloaded: AtomicU64,
    dispatches: AtomicU64,
    submits: AtomicU64,
}

/// A snapshot of [`TransferCounters`]; subtract two to get the traffic of what happened between.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Bytes kvq wrote to the GPU through the queue.
    pub bytes_uploaded: u64,
    /// Bytes kvq read back from the GPU.
    pub bytes_downloaded: u64,
    /// Compute dispatches kvq recorded.
    pub dispatches: u64,
    /// Command buffers kvq submitted itself (host convenience API only).
    pub submits: u64,
}

impl std::ops::Sub for TransferStats {
    type Output = TransferStats;
    fn sub(self, o: TransferStats) -> TransferStats {
        TransferStats {
            bytes_uploaded: self.bytes_uploaded - o.bytes_uploaded,
            bytes_downloaded: self.bytes_downloaded - o.bytes_downloaded,
            dispatches: self.dispatches - o.dispatches,
            submits: self.submits - o.submits,
        }
    }
}

impl TransferCounters {
    pub(crate) fn add_upload(&self, n: u64) {
        self.uploaded.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn add_download(&self, n: u64) {
        self.downloaded.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn add_dispatches(&self, n: u64) {
        self.dispatches.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn add_submit(&self) {
        self.submits.fetch_add(1, Ordering::Relaxed);
    }
    /// The current totals.
    pub fn snapshot(&self) -> TransferStats {
        TransferStats {
            bytes_uploaded: self.uploaded.load(Ordering::Relaxed),
            bytes_downloaded: self.downloaded.load(Ordering::Relaxed),
            dispatches: self.dispatches.load(Ordering::Relaxed),
            submits: self.submits.load(Ordering::Relaxed),
        }
    }
}

/// Optional accelerations the device has turned on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// `shader-f16` is enabled.
    pub f16: bool,
    /// Subgroup operations are enabled.
    pub subgroups: bool,
    /// Timestamp queries at compute pass boundaries are enabled.
    pub timestamps: bool,
    /// Timestamp queries inside compute passes are enabled (what a
    /// [`crate::timer::DispatchTimer`] needs).
    pub timestamps_in_passes: bool,
}

pub use crate::kernels::{INVOCATIONS_NEEDED, WORKGROUP_MEMORY_NEEDED};

/// Matrix units the chunk kernels put their products on ([`GpuContext::matrix_units`]):
/// wgpu's cooperative matrices (tensor cores on NVIDIA, simdgroup matrices on Apple), f16
/// fragments multiplied into f32 ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatrixUnits {
    /// The fragments' size F (F × F × F products): 16 on NVIDIA, 8 on Apple.
    pub fragment: u32,
    /// The same products written out per invocation in plain WGSL instead of on matrix
    /// units: a testing aid that runs the matrix kernels' tiling, decoding, masks and softmax
    /// on any adapter (slower than the kernels they replace).
    pub emulated: bool,
    /// Query rows a workgroup of the matrix prefill kernel serves: 2 F, or F for a cache
    /// whose tiles at 2 F rows do not fit the adapter's workgroup memory (a cache's
    /// [`crate::KernelConfig::matrix`] says which it got).
    pub rows: u32,
}

impl MatrixUnits {
    /// Hardware or `emulated` fragments of `fragment` (16 or 8), 2 F rows a workgroup.
    pub fn new(fragment: u32, emulated: bool) -> MatrixUnits {
        MatrixUnits {
            fragment,
            emulated,
            rows: 2 * fragment,
        }
    }

    /// Whether kvq's matrix kernels are written for these units: fragments of 16 or 8, F or
    /// 2 F rows a workgroup.
    pub fn has_kernels(&self) -> bool {
        let f = self.fragment;
        MATRIX_FRAGMENTS.contains(&f) && [f, 2 * f].contains(&self.rows)
    }
}

/// Fragment sizes the matrix kernels are written for, in order of preference.
const MATRIX_FRAGMENTS: [u32; 2] = [16, 8];

/// Invocations of a subgroup the matrix kernels are written for (their workgroup of 128 is
/// four subgroups): NVIDIA's and Apple's.
const MATRIX_SUBGROUP: u32 = 32;

/// The fragment size kvq's matrix kernels would use on `adapter`: one it offers square with f16
/// inputs and f32 sums, with subgroups of [`MATRIX_SUBGROUP`] invocations, shader-f16 and
/// subgroups; `None` elsewhere.
fn matrix_fragment(adapter: &wgpu::Adapter) -> Option<u32> {
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP;
    let info = adapter.get_info();
    if !adapter.features().contains(needed)
        || info.subgroup_min_size != MATRIX_SUBGROUP
        || info.subgroup_max_size != MATRIX_SUBGROUP
    {
        return None;
    }
    let props = adapter.cooperative_matrix_properties();
    MATRIX_FRAGMENTS.into_iter().find(|&f| {
        props.iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (f, f, f)
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        })
    })
}

/// A wgpu device and queue that kvq records onto, with the counters of kvq's own traffic.
///
/// Cheap to clone (everything inside is reference counted).
#[derive(Clone, Debug)]
pub struct GpuContext {
    /// The device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// What adapter this is (name, backend, type).
    pub info: wgpu::AdapterInfo,
    caps: Capabilities,
    counters: Arc<TransferCounters>,
    kernels: Arc<KernelCache>,
    shader_checks: bool,
    workgroup_poison: bool,
    matrix: Option<MatrixUnits>,
}

/// [`GpuContext::new`] has wgpu refuse (as an out-of-memory error) a buffer that would take
/// the device's memory heap past this share of the budget the driver reports (Vulkan with
/// `VK_EXT_memory_budget`, D3D12), rather than oversubscribe it.
pub const MEMORY_BUDGET_PERCENT: u8 = 90;

const MEMORY_BUDGET: wgpu::MemoryBudgetThresholds = wgpu::MemoryBudgetThresholds {
    for_resource_creation: Some(MEMORY_BUDGET_PERCENT),
    for_device_loss: None,
};

fn backends_from_env() -> wgpu::Backends {
    wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all())
}

impl GpuContext {
    /// Opens a device on this system's GPU.
    ///
    /// The adapter is chosen by `WGPU_BACKEND` (e.g. `vulkan`, `metal`) and `WGPU_ADAPTER_NAME`
    /// (a substring of the adapter name) when set, else the high-performance adapter. Only what
    /// kvq needs is requested; f16, subgroups and timestamps are enabled when offered.
    /// Allocations past [`MEMORY_BUDGET_PERCENT`] of the driver's memory budget fail with
    /// [`KvqError::OutOfMemory`] instead of oversubscribing the device.
    ///
    /// Blocking, so not in a browser (`wasm32`): use [`GpuContext::new_async`] there.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<GpuContext> {
        pollster::block_on(Self::new_async())
    }

    /// Async form of [`GpuContext::new`].
    pub async fn new_async() -> Result<GpuContext> {
        let backends = backends_from_env();
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            memory_budget_thresholds: MEMORY_BUDGET,
            ..wgpu::InstanceDescriptor::new_without_display_handle_from_env()
        });
        let adapter = match std::env::var("WGPU_ADAPTER_NAME") {
            Ok(want) if !want.is_empty() => {
                let adapters = instance.enumerate_adapters(backends).await;
                let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
                adapters
                    .into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&want.to_lowercase()))
                    .ok_or_else(|| KvqError::NoAdapter {
                        detail: format!(
                            "WGPU_ADAPTER_NAME='{want}' matches none of [{}] (backends {backends:?})",
                            names.join(", ")
                        ),
                    })?
            }
            _ => instance
                .request_adapter(&wgpu::RequestAdapterOptions {
                    power_preference: wgpu::PowerPreference::from_env()
                        .unwrap_or(wgpu::PowerPreference::HighPerformance),
                    ..Default::default()
                })
                .await
                .map_err(|e| KvqError::NoAdapter {
                    detail: format!("backends {backends:?}: {e}"),
                })?,
        };
        Self::from_adapter(&adapter).await
    }

    /// The features and limits to request on `adapter` for kvq: what kvq needs (a typed error
    /// says what the adapter lacks), the adapter's full buffer sizes and workgroup memory, f16,
    /// subgroups and timestamps where offered, and cooperative matrices where kvq would use
    /// them ([`GpuContext::matrix_units`]). An engine that creates its own device can request
    /// these (or more) and hand the device to [`GpuContext::from_device`]; where they hold
    /// `Features::EXPERIMENTAL_COOPERATIVE_MATRIX`, the device must be requested with
    /// `wgpu::ExperimentalFeatures::enabled()`, and [`GpuContext::with_matrix_units`] then
    /// turns the units on for kvq.
    pub fn device_requirements(adapter: &wgpu::Adapter) -> Result<(wgpu::Features, wgpu::Limits)> {
        let info = adapter.get_info();
        let have = adapter.limits();
        let need = |what: &str, needed: u64, got: u64| -> Result<()> {
            if got < needed {
                return Err(KvqError::AdapterTooWeak {
                    adapter: info.name.clone(),
                    what: what.into(),
                    needed,
                    have: got,
                });
            }
            Ok(())
        };
        need(
            "max_compute_workgroup_storage_size",
            WORKGROUP_MEMORY_NEEDED as u64,
            have.max_compute_workgroup_storage_size as u64,
        )?;
        need(
            "max_compute_invocations_per_workgroup",
            INVOCATIONS_NEEDED as u64,
            have.max_compute_invocations_per_workgroup as u64,
        )?;
        need(
            "max_storage_buffers_per_shader_stage",
            8,
            have.max_storage_buffers_per_shader_stage as u64,
        )?;
        let mut limits = wgpu::Limits::downlevel_defaults();
        // kvq's kernels fit WORKGROUP_MEMORY_NEEDED; the matrix kernels take more where the
        // adapter has it (their tiles of f16 and their f32 outputs).
        limits.max_compute_workgroup_storage_size = have.max_compute_workgroup_storage_size;
        limits.max_compute_invocations_per_workgroup = INVOCATIONS_NEEDED;
        limits.max_compute_workgroup_size_x =
            INVOCATIONS_NEEDED.min(have.max_compute_workgroup_size_x);
        limits.max_storage_buffers_per_shader_stage = 8;
        // Big caches want big bindings and buffers: take all the adapter offers.
        limits.max_storage_buffer_binding_size = have.max_storage_buffer_binding_size;
        limits.max_buffer_size = have.max_buffer_size;
        limits.max_compute_workgroups_per_dimension = have.max_compute_workgroups_per_dimension;
        limits.max_bind_groups = have.max_bind_groups.min(4);
        let mut wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        // Cooperative matrices where the tuning table chooses the matrix kernels (or
        // KVQ_MATRIX=on asks for them) and the adapter has fragments they are written for.
        let chosen = match std::env::var("KVQ_MATRIX").as_deref() {
            Ok("on") => true,
            Ok("off") => false,
            _ => crate::tuning::for_adapter(&info).matrix_units,
        };
        if chosen && matrix_fragment(adapter).is_some() {
            wanted |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        Ok((adapter.features() & wanted, limits))
    }

    /// Opens a device on a given adapter, asking for kvq's limits and optional features
    /// ([`GpuContext::device_requirements`]).
    pub async fn from_adapter(adapter: &wgpu::Adapter) -> Result<GpuContext> {
        let info = adapter.get_info();
        let (features, limits) = Self::device_requirements(adapter)?;
        let matrix = features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("kvq"),
                required_features: features,
                required_limits: limits,
                // SAFETY: wgpu's opt-in for its experimental features, taken only for
                // cooperative matrices; kvq's matrix kernels pass naga's validation (the
                // portability test) and are tested against the CPU reference on the GPU.
                experimental_features: match matrix {
                    true => unsafe { wgpu::ExperimentalFeatures::enabled() },
                    false => wgpu::ExperimentalFeatures::disabled(),
                },
                ..Default::default()
            })
            .await
            .map_err(|e| KvqError::RequestDevice(e.to_string()))?;
        let mut ctx = Self::wrap(device, queue, info);
        if matrix {
            ctx.matrix = matrix_fragment(adapter).map(|f| MatrixUnits::new(f, false));
        }
        Ok(ctx)
    }

    /// Wraps a caller's existing device and queue. kvq uses only the features and limits the
    /// device already has; creating a cache that needs more is a typed error.
    pub fn from_device(
        device: wgpu::Device,
        queue: wgpu::Queue,
        info: wgpu::AdapterInfo,
    ) -> GpuContext {
        Self::wrap(device, queue, info)
    }

    fn wrap(device: wgpu::Device, queue: wgpu::Queue, info: wgpu::AdapterInfo) -> GpuContext {
        let f = device.features();
        let caps = Capabilities {
            f16: f.contains(wgpu::Features::SHADER_F16),
            subgroups: f.contains(wgpu::Features::SUBGROUP),
            timestamps: f.contains(wgpu::Features::TIMESTAMP_QUERY),
            timestamps_in_passes: f.contains(
                wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES,
            ),
        };
        GpuContext {
            device,
            queue,
            info,
            caps,
            counters: Arc::new(TransferCounters::default()),
            kernels: Arc::default(),
            shader_checks: false,
            workgroup_poison: false,
            matrix: None,
        }
    }

    /// The matrix units the chunk kernels of caches made on this context put their products
    /// on, where their precision is [`crate::Precision::Fast`]: those [`GpuContext::new`]
    /// found where the tuning table chooses them ([`crate::tuning::DeviceTuning::matrix_units`])
    /// or `KVQ_MATRIX=on` asks for them, or those set by [`GpuContext::with_matrix_units`];
    /// `None`: FP32 and packed-f16 lanes only.
    pub fn matrix_units(&self) -> Option<MatrixUnits> {
        self.matrix
    }

    /// Caches created from now on put their chunk products on `units` (`None`: on no matrix
    /// units). Emulated units run on any adapter with shader-f16 (a testing aid); hardware ones
    /// need a device with `Features::EXPERIMENTAL_COOPERATIVE_MATRIX`, shader-f16 and
    /// subgroups, on an adapter whose subgroups are 32 invocations: else
    /// [`KvqError::AdapterTooWeak`]. That the adapter offers F × F × F fragments of f16 summed
    /// in f32 (`wgpu::Adapter::cooperative_matrix_properties`) the caller vouches for: the
    /// device does not say. A context from [`GpuContext::from_device`] has none until this is
    /// called.
    pub fn with_matrix_units(mut self, units: Option<MatrixUnits>) -> Result<GpuContext> {
        if let Some(u) = units {
            let too_weak = |what: String| KvqError::AdapterTooWeak {
                adapter: self.info.name.clone(),
                what,
                needed: 1,
                have: 0,
            };
            if !u.has_kernels() {
                return Err(too_weak(format!(
                    "matrix fragments of {0}x{0} and {1} rows a workgroup (kvq's are 16x16 or 8x8, F or 2 F rows)",
                    u.fragment, u.rows
                )));
            }
            let needed = match u.emulated {
                true => wgpu::Features::SHADER_F16,
                false => {
                    wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
                        | wgpu::Features::SHADER_F16
                        | wgpu::Features::SUBGROUP
                }
            };
            let missing = needed - self.device.features();
            if !missing.is_empty() {
                return Err(too_weak(format!("{missing:?} (matrix units)")));
            }
            // The kernels' 4 subgroups of 32 invocations (their workgroup of 128).
            let (lo, hi) = (self.info.subgroup_min_size, self.info.subgroup_max_size);
            if !u.emulated && (lo, hi) != (MATRIX_SUBGROUP, MATRIX_SUBGROUP) {
                return Err(too_weak(format!(
                    "subgroups of {MATRIX_SUBGROUP} invocations (matrix units; this adapter's are {lo} to {hi})"
                )));
            }
        }
        self.matrix = units;
        Ok(self)
    }

    /// Compiles the kernels of caches created from now on with all of wgpu's shader runtime
    /// checks (`true`), or, the default (`false`), without loop bounding, and without index
    /// clamping where the V codec is rotated.
    ///
    /// wgpu bounds every loop with a hidden iteration counter, a guard against shaders that
    /// never terminate. kvq's loops terminate by construction (each counts by a fixed step to
    /// a bound derived from the cache's shape or from lengths the kernels keep within
    /// capacity), and the counters cost the decode step much of its time (BENCHMARKS.md,
    /// "wgpu's shader runtime checks"). wgpu also clamps every array index into range; every
    /// kvq index is in range by construction (audited there), and the clamps cost a cache
    /// with a rotated V codec (turbo, rotor, iso) a clamp on each level-table lookup, so its
    /// kernels leave them out ([`crate::KernelConfig::clamps_indices`]); for the
    /// other codecs leaving them out measured nothing or a loss, and they stay. On Vulkan the
    /// driver's own buffer robustness stays on regardless. `true` restores every check, and
    /// wgpu's zeroing of workgroup memory (see [`GpuContext::with_workgroup_poison`]), as a
    /// debugging aid.
    pub fn with_shader_checks(mut self, on: bool) -> GpuContext {
        self.shader_checks = on;
        self
    }

    /// Whether kernels are compiled with all of wgpu's shader runtime checks
    /// ([`GpuContext::with_shader_checks`]).
    pub fn shader_checks(&self) -> bool {
        self.shader_checks
    }

    /// Compiles the kernels of caches created from now on with a prologue that fills the
    /// workgroup memory each kernel uses with poison (NaN for f32 values, 0xDEADBEEF for u32)
    /// before anything else runs (`true`); off by default. A testing aid: kvq compiles its
    /// kernels without wgpu's zero-initialization of workgroup memory (unless
    /// [`GpuContext::with_shader_checks`] is on), which is sound only because every kernel
    /// writes each workgroup value before reading it; kvq's GPU tests run poisoned, so a
    /// kernel that read an unwritten value would give NaN or a wild index and fail them. The
    /// zeroing runs before each workgroup's first barrier (in naga's version for drivers
    /// without native zeroing, one invocation stores every array: 690 stores in the `none`
    /// split kernel).
    pub fn with_workgroup_poison(mut self, on: bool) -> GpuContext {
        self.workgroup_poison = on;
        self
    }

    /// Whether kernels are compiled with poisoned workgroup memory
    /// ([`GpuContext::with_workgroup_poison`]).
    pub fn workgroup_poison(&self) -> bool {
        self.workgroup_poison
    }

    /// A clone of this context whose transfer counters start at zero and count only what is
    /// done through it and its own clones (the caches made on it and their recordings): the
    /// traffic of one part of an application. It shares the device, the queue and the
    /// compiled kernels.
    pub fn with_own_counters(&self) -> GpuContext {
        GpuContext {
            counters: Arc::default(),
            ..self.clone()
        }
    }

    /// Compute pipelines this context has compiled: every cache made on it (and on its
    /// clones) shares them, compiling a kernel only where no earlier cache had one of the
    /// same text and compile options. Caches that differ only in capacity, batch, window,
    /// layers or splits compile nothing new, but where the adapter's tuning bakes those into
    /// the text ([`crate::tuning::DeviceTuning::baked_shape`]: the measured NVIDIA GPUs, where
    /// a compile is cheap and the uniforms measured slower); another codec, head_dim, GQA
    /// ratio, workgroup, exact-token layout or precision does, as do other shader checks or
    /// workgroup poison.
    pub fn compiled_pipelines(&self) -> u64 {
        self.kernels.compiled_pipelines()
    }

    /// The kernels this context has compiled, shared by its clones.
    pub(crate) fn kernels(&self) -> &Arc<KernelCache> {
        &self.kernels
    }

    /// Optional accelerations available on this device.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    /// kvq's transfer counters for this context.
    pub fn counters(&self) -> &TransferCounters {
        &self.counters
    }

    /// Shorthand for `counters().snapshot()`.
    pub fn stats(&self) -> TransferStats {
        self.counters.snapshot()
    }

    /// True when the adapter is a CPU implementation (lavapipe, WARP, llvmpipe).
    pub fn is_cpu(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// The decode defaults kvq uses on this adapter ([`crate::tuning::for_adapter`]).
    pub fn tuning(&self) -> &'static crate::tuning::DeviceTuning {
        crate::tuning::for_adapter(&self.info)
    }

    /// Creates a buffer; one the device cannot allocate is [`KvqError::OutOfMemory`] (not the
    /// device's uncaptured-error handler, which panics).
    pub(crate) fn create_buffer_checked(
        &self,
        desc: &wgpu::BufferDescriptor<'_>,
    ) -> Result<wgpu::Buffer> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buf = self.device.create_buffer(desc);
        let (adapter, what, needed) = (
            self.info.name.clone(),
            desc.label.unwrap_or("a buffer").to_string(),
            desc.size,
        );
        crate::wait::check_scope(&self.device, scope, move |e| KvqError::OutOfMemory {
            adapter,
            what,
            needed,
            detail: e.to_string(),
        })?;
        Ok(buf)
    }

    /// Writes `data` into `buffer` at `offset` through the queue, counted as an upload.
    pub(crate) fn upload(&self, buffer: &wgpu::Buffer, offset: u64, data: &[u8]) {
        self.counters.add_upload(data.len() as u64);
        self.queue.write_buffer(buffer, offset, data);
    }

    /// Submits one command buffer and waits for it, counted (in a browser, submits only:
    /// queue order makes later work and read-backs see its results).
    pub(crate) fn submit_and_wait(&self, cmd: wgpu::CommandBuffer) -> Result<()> {
        self.counters.add_submit();
        let idx = self.queue.submit([cmd]);
        #[cfg(target_arch = "wasm32")]
        let _ = idx;
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(idx),
                timeout: None,
            })
            .map_err(|e| KvqError::DeviceLost(e.to_string()))?;
        Ok(())
    }
}
