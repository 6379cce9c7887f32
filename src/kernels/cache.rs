//! Every kernel a context has compiled, shared by all the caches made on it.
//!
//! A kernel module's key is what its compiled form depends on: the module, its assembled WGSL
//! text and how it is compiled ([`Compile`]). The text holds every number baked into it (the
//! codecs, head_dim, the GQA ratio, the workgroup, the exact-token layout, the precision);
//! the shape numbers the kernels read at run time are not in it (`kernels/shape.rs`), so caches
//! that differ only in capacity, batch, window, layers or splits find each other's kernels
//! here. Keying by the text itself means no field can be forgotten: two modules share
//! pipelines exactly when the GPU would run the same code.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::module::{
    APPEND_INPUT, APPEND_STORE, CHUNK_IO, DECODE_IO, DECODE_STORE, KernelModule, LayoutTable,
    STEP_IO, STEP_STORE,
};
use crate::error::{KvqError, Result};

/// How a module is compiled: what `GpuContext::with_shader_checks` and
/// `GpuContext::with_workgroup_poison` set, and the index clamps a configuration takes
/// ([`super::KernelConfig::clamps_indices`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Compile {
    /// Every one of wgpu's shader runtime checks, and its zero-initialization of workgroup
    /// memory ([`crate::GpuContext::with_shader_checks`]); otherwise [`Compile::checks`].
    pub all_checks: bool,
    /// wgpu's index clamps, where [`Compile::all_checks`] is off.
    pub clamps: bool,
    /// Poisoned workgroup memory at every workgroup's start
    /// ([`crate::GpuContext::with_workgroup_poison`], `kernels/poison.rs`).
    pub poison: bool,
}

impl Compile {
    /// The shader runtime checks kvq's kernels are compiled with.
    ///
    /// wgpu's loop bounding (a hidden iteration counter on every loop, a guard against shaders
    /// that never end) is left out: every kvq loop counts by a fixed step to a bound derived
    /// from the cache's shape or from lengths the kernels keep within capacity, and the
    /// counters cost the decode step much of its time (BENCHMARKS.md, "wgpu's shader runtime
    /// checks").
    ///
    /// wgpu's index clamping (every array index clamped into range in the shader) is left out
    /// where [`Compile::clamps`] is off: a rotated V codec's kernels, where a clamp on each
    /// level-table lookup cost the step time, while for the other codecs leaving them out
    /// measured nothing or a loss. Every index of every kernel is in range by construction (the
    /// audits in BENCHMARKS.md, "wgpu's shader runtime checks": codes are masked to their
    /// table's size, row and word indices stay within the row, the buffer or the workgroup
    /// array); the driver's own buffer robustness (Vulkan's robustBufferAccess2, which wgpu
    /// enables) stays on.
    pub fn checks(self) -> wgpu::ShaderRuntimeChecks {
        if self.all_checks {
            return wgpu::ShaderRuntimeChecks::checked();
        }
        wgpu::ShaderRuntimeChecks {
            force_loop_bounding: false,
            bounds_checks: self.clamps,
            ..wgpu::ShaderRuntimeChecks::checked()
        }
    }

    /// wgpu's zero-initialization of workgroup memory: off unless every check is asked for.
    /// Every kvq kernel writes each workgroup value before reading it (the tests check this
    /// with poisoned workgroup memory). The zeroing runs before a workgroup's first barrier:
    /// naga's version is one invocation storing every array (690 stores in the `none` split
    /// kernel, 1557 in `turbo3_sym`'s), for drivers without native zeroing; where the driver
    /// zeroes natively, leaving it out measured the same (BENCHMARKS.md, "wgpu's shader
    /// runtime checks").
    fn zero_init(self) -> bool {
        self.all_checks
    }
}

/// A module's key: what its compiled form depends on.
#[derive(Clone, PartialEq, Eq, Hash)]
struct ModuleKey {
    module: KernelModule,
    compile: Compile,
    source: String,
}

/// One compiled module and its pipelines, each built on first use (a module's entry points
/// in the order of [`KernelModule::entry_points`]).
struct Compiled {
    module: OnceLock<Result<wgpu::ShaderModule>>,
    pipelines: Vec<OnceLock<Result<wgpu::ComputePipeline>>>,
}

/// The bind group and pipeline layouts every cache's kernels and bind groups use: one set
/// per context, so a bind group of one cache and a pipeline cached for another agree.
pub(crate) struct Layouts {
    pub append_store: wgpu::BindGroupLayout,
    pub append_input: wgpu::BindGroupLayout,
    pub decode_store: wgpu::BindGroupLayout,
    pub decode_io: wgpu::BindGroupLayout,
    pub chunk_io: wgpu::BindGroupLayout,
    pub step_store: wgpu::BindGroupLayout,
    pub step_io: wgpu::BindGroupLayout,
    append: wgpu::PipelineLayout,
    decode: wgpu::PipelineLayout,
    chunk: wgpu::PipelineLayout,
    step: wgpu::PipelineLayout,
}

impl Layouts {
    fn new(device: &wgpu::Device) -> Result<Layouts> {
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let layout = |table: LayoutTable| {
            let entries: Vec<_> = table
                .1
                .iter()
                .map(|&(binding, ty, _)| wgpu::BindGroupLayoutEntry {
                    binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                })
                .collect();
            device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(table.0),
                entries: &entries,
            })
        };
        let pipeline = |a: &wgpu::BindGroupLayout, b: &wgpu::BindGroupLayout| {
            device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(a), Some(b)],
                immediate_size: 0,
            })
        };
        let append_store = layout(APPEND_STORE);
        let append_input = layout(APPEND_INPUT);
        let decode_store = layout(DECODE_STORE);
        let decode_io = layout(DECODE_IO);
        let chunk_io = layout(CHUNK_IO);
        let step_store = layout(STEP_STORE);
        let step_io = layout(STEP_IO);
        let layouts = Layouts {
            append: pipeline(&append_store, &append_input),
            decode: pipeline(&decode_store, &decode_io),
            chunk: pipeline(&decode_store, &chunk_io),
            step: pipeline(&step_store, &step_io),
            append_store,
            append_input,
            decode_store,
            decode_io,
            chunk_io,
            step_store,
            step_io,
        };
        crate::wait::check_scope(device, scope, |e| {
            KvqError::Gpu(format!("creating kvq's layouts failed: {e}"))
        })?;
        Ok(layouts)
    }

    /// The pipeline layout of `module`'s kernels.
    fn pipeline(&self, module: KernelModule) -> &wgpu::PipelineLayout {
        match module {
            KernelModule::Append(_) => &self.append,
            KernelModule::Decode => &self.decode,
            KernelModule::Chunk => &self.chunk,
            KernelModule::Step(_) => &self.step,
        }
    }
}

/// Every module and pipeline one context has compiled, by key, and its layouts. Shared by
/// the context's clones (thread-safe: a compile runs outside the map's lock, and two callers
/// of one kernel wait for one compile).
#[derive(Default)]
pub(crate) struct KernelCache {
    layouts: OnceLock<Result<Arc<Layouts>>>,
    modules: Mutex<HashMap<ModuleKey, Arc<Compiled>>>,
    pipelines: AtomicU64,
}

impl std::fmt::Debug for KernelCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelCache")
            .field("pipelines", &self.compiled_pipelines())
            .finish_non_exhaustive()
    }
}

impl KernelCache {
    /// Compute pipelines compiled so far.
    pub fn compiled_pipelines(&self) -> u64 {
        self.pipelines.load(Ordering::Relaxed)
    }

    /// The layouts, created on the first call.
    pub fn layouts(&self, device: &wgpu::Device) -> Result<Arc<Layouts>> {
        self.layouts
            .get_or_init(|| Layouts::new(device).map(Arc::new))
            .clone()
    }

    /// The pipeline of entry point `entry` (an index into [`KernelModule::entry_points`]) of
    /// `module` assembled as `source` and compiled as `compile`: from this cache, or compiled
    /// now (its module too, if no pipeline of it was built yet).
    pub fn pipeline(
        &self,
        device: &wgpu::Device,
        module: KernelModule,
        source: String,
        compile: Compile,
        entry: usize,
    ) -> Result<wgpu::ComputePipeline> {
        let entries = module.entry_points();
        let Some(dispatch) = entries.get(entry) else {
            return Err(KvqError::Gpu(format!(
                "kvq's {} module has no entry point {entry}",
                module.name()
            )));
        };
        let key = ModuleKey {
            module,
            compile,
            source,
        };
        let compiled = {
            // (A panic elsewhere while the lock was held leaves the map intact.)
            let mut map = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(key.clone())
                .or_insert_with(|| {
                    Arc::new(Compiled {
                        module: OnceLock::new(),
                        pipelines: entries.iter().map(|_| OnceLock::new()).collect(),
                    })
                })
                .clone()
        };
        let label = format!("kvq {}", module.name());
        compiled.pipelines[entry]
            .get_or_init(|| {
                let layouts = self.layouts(device)?;
                let shader = compiled
                    .module
                    .get_or_init(|| shader_module(device, compile, &label, &key.source))
                    .as_ref()
                    .map_err(Clone::clone)?;
                let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
                let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(dispatch.entry),
                    layout: Some(layouts.pipeline(module)),
                    module: shader,
                    entry_point: Some(dispatch.entry),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        zero_initialize_workgroup_memory: compile.zero_init(),
                        ..Default::default()
                    },
                    cache: None,
                });
                let (label, entry) = (label.clone(), dispatch.entry);
                crate::wait::check_scope(device, scope, move |e| {
                    KvqError::Gpu(format!("building kvq's {label} kernel {entry} failed: {e}"))
                })?;
                self.pipelines.fetch_add(1, Ordering::Relaxed);
                Ok(pipeline)
            })
            .clone()
    }
}

/// Compiles `src` as `compile` says (poisoned first where asked), inside a validation error
/// scope.
fn shader_module(
    device: &wgpu::Device,
    compile: Compile,
    label: &str,
    src: &str,
) -> Result<wgpu::ShaderModule> {
    let src = if compile.poison {
        super::poison::poison_workgroup_memory(src)?
    } else {
        src.to_string()
    };
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(src.into()),
    };
    // SAFETY: wgpu's contract for the checks left out (see `Compile::checks`): every loop
    // terminates, and no index leaves its array or buffer.
    let module = unsafe { device.create_shader_module_trusted(desc, compile.checks()) };
    let label = label.to_string();
    crate::wait::check_scope(device, scope, move |e| {
        KvqError::Gpu(format!("building kvq's {label} kernels failed: {e}"))
    })?;
    Ok(module)
}
