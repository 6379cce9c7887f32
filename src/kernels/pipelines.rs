//! Bind group layouts and compute pipelines of one cache, compiled from the modules'
//! assembled WGSL with the shader runtime checks kvq's audits allow.

use std::sync::OnceLock;

use crate::error::{KvqError, Result};
use crate::kernels::config::KernelConfig;
use crate::kernels::module::{
    APPEND_ENTRIES, APPEND_INPUT, APPEND_STORE, ATTEND_ENTRIES, CHUNK_IO, DECODE_IO, DECODE_STORE,
    InputType, KernelModule, LayoutTable, PREFILL_ENTRIES, STEP_IO, STEP_STORE,
};

/// A pipeline with its module, entry point and bind group layouts (groups 0 and 1).
pub(crate) type Described<'a> = (
    &'a wgpu::ComputePipeline,
    KernelModule,
    &'static str,
    [LayoutTable; 2],
);

/// Bind group layouts and pipelines of one cache.
///
/// The attend pipelines are built with the cache (they validate its shape); the append and
/// fused-step pipelines when their inputs are first prepared (`append_input`, `step_io`),
/// never while recording, so a cache only compiles the modules it runs (several seconds each
/// on a CPU driver).
pub(crate) struct Pipelines {
    device: wgpu::Device,
    cfg: KernelConfig,
    /// How the modules are compiled.
    compile: Compile,
    pub append_store: wgpu::BindGroupLayout,
    pub append_input: wgpu::BindGroupLayout,
    pub decode_store: wgpu::BindGroupLayout,
    pub decode_io: wgpu::BindGroupLayout,
    pub chunk_io: wgpu::BindGroupLayout,
    pub step_store: wgpu::BindGroupLayout,
    pub step_io: wgpu::BindGroupLayout,
    append_layout: wgpu::PipelineLayout,
    step_layout: wgpu::PipelineLayout,
    /// [F32, F16] x (small, wide, commit).
    append: [OnceLock<Result<[wgpu::ComputePipeline; 3]>>; 2],
    /// (split, reduce).
    attend: [wgpu::ComputePipeline; 2],
    /// [F32, F16] x (split, reduce) of the fused step.
    step: [OnceLock<Result<[wgpu::ComputePipeline; 2]>>; 2],
    /// The chunk module, which the next two share.
    chunk_module: OnceLock<Result<wgpu::ShaderModule>>,
    /// (split, reduce) of chunks.
    chunk: OnceLock<Result<[wgpu::ComputePipeline; 2]>>,
    /// (prefill_q, prefill) of long chunk slices, from the chunk module.
    prefill: OnceLock<Result<[wgpu::ComputePipeline; 2]>>,
    chunk_layout: wgpu::PipelineLayout,
}

fn entry(binding: u32, ty: wgpu::BufferBindingType) -> wgpu::BindGroupLayoutEntry {
    wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

fn layout(device: &wgpu::Device, table: LayoutTable) -> wgpu::BindGroupLayout {
    let e: Vec<_> = table.1.iter().map(|&(b, t, _)| entry(b, t)).collect();
    device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(table.0),
        entries: &e,
    })
}

impl Pipelines {
    /// Every pipeline with its module, entry point and bind group layouts (groups 0 and 1),
    /// so [`crate::export`] can name what a recording uses.
    pub(crate) fn describe(&self) -> Result<Vec<Described<'_>>> {
        let mut v = Vec::new();
        for t in [InputType::F32, InputType::F16] {
            for (p, ep) in self.append(t)?.iter().zip(APPEND_ENTRIES) {
                let m = KernelModule::Append(t);
                v.push((p, m, ep, m.layouts()));
            }
            for (p, ep) in self.step(t)?.iter().zip(ATTEND_ENTRIES) {
                let m = KernelModule::Step(t);
                v.push((p, m, ep, m.layouts()));
            }
        }
        for (p, ep) in self.attend.iter().zip(ATTEND_ENTRIES) {
            v.push((p, KernelModule::Decode, ep, KernelModule::Decode.layouts()));
        }
        for (p, ep) in self.chunk()?.iter().zip(ATTEND_ENTRIES) {
            v.push((p, KernelModule::Chunk, ep, KernelModule::Chunk.layouts()));
        }
        if self.cfg.prefill_rows().is_some() {
            for (p, ep) in self.prefill()?.iter().zip(PREFILL_ENTRIES) {
                v.push((p, KernelModule::Chunk, ep, KernelModule::Chunk.layouts()));
            }
        }
        Ok(v)
    }

    /// The append pipelines for `input` (built on the first call).
    pub fn append(&self, input: InputType) -> Result<&[wgpu::ComputePipeline; 3]> {
        self.append[input as usize]
            .get_or_init(|| {
                let src = self.cfg.module_source(KernelModule::Append(input))?;
                build(
                    &self.device,
                    self.compile,
                    "kvq append",
                    src,
                    &self.append_layout,
                    APPEND_ENTRIES,
                )
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The attend pipelines (split, reduce).
    pub fn attend(&self) -> &[wgpu::ComputePipeline; 2] {
        &self.attend
    }

    /// The fused-step pipelines (split, reduce) for `input` (built on the first call).
    pub fn step(&self, input: InputType) -> Result<&[wgpu::ComputePipeline; 2]> {
        self.step[input as usize]
            .get_or_init(|| {
                let src = self.cfg.module_source(KernelModule::Step(input))?;
                build(
                    &self.device,
                    self.compile,
                    "kvq step",
                    src,
                    &self.step_layout,
                    ATTEND_ENTRIES,
                )
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The chunk module, compiled on the first call: its split kernel's and its prefill
    /// kernel's pipelines share it.
    fn chunk_module(&self) -> Result<&wgpu::ShaderModule> {
        self.chunk_module
            .get_or_init(|| {
                let src = self.cfg.module_source(KernelModule::Chunk)?;
                shader_module(&self.device, self.compile, "kvq chunk", src)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The chunk pipelines (split, reduce; built on the first call).
    pub fn chunk(&self) -> Result<&[wgpu::ComputePipeline; 2]> {
        self.chunk
            .get_or_init(|| {
                let module = self.chunk_module()?;
                let (device, layout) = (&self.device, &self.chunk_layout);
                pipelines(
                    device,
                    self.compile,
                    "kvq chunk",
                    module,
                    layout,
                    ATTEND_ENTRIES,
                )
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The prefill pipelines (prefill_q, prefill; built on the first call), for a cache the
    /// prefill kernel serves ([`KernelConfig::prefill_rows`]).
    pub fn prefill(&self) -> Result<&[wgpu::ComputePipeline; 2]> {
        self.prefill
            .get_or_init(|| {
                let module = self.chunk_module()?;
                let (device, layout) = (&self.device, &self.chunk_layout);
                pipelines(
                    device,
                    self.compile,
                    "kvq prefill",
                    module,
                    layout,
                    PREFILL_ENTRIES,
                )
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// `all_checks`: compile with every one of wgpu's shader runtime checks and its
    /// zero-initialization of workgroup memory ([`crate::GpuContext::with_shader_checks`]);
    /// otherwise [`runtime_checks`] decides, and workgroup memory starts uninitialized.
    /// `poison`: fill it with poison first ([`crate::GpuContext::with_workgroup_poison`]).
    pub fn new(
        device: &wgpu::Device,
        cfg: &KernelConfig,
        all_checks: bool,
        poison: bool,
    ) -> Result<Pipelines> {
        let compile = Compile {
            checks: if all_checks {
                wgpu::ShaderRuntimeChecks::checked()
            } else {
                runtime_checks(cfg)
            },
            zero_init: all_checks,
            poison,
        };
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let append_store = layout(device, APPEND_STORE);
        let append_input = layout(device, APPEND_INPUT);
        let decode_store = layout(device, DECODE_STORE);
        let decode_io = layout(device, DECODE_IO);
        let chunk_io = layout(device, CHUNK_IO);
        let pl = |a: &wgpu::BindGroupLayout, b: &wgpu::BindGroupLayout| {
            device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(a), Some(b)],
                immediate_size: 0,
            })
        };
        let append_layout = pl(&append_store, &append_input);
        let decode_layout = pl(&decode_store, &decode_io);
        let chunk_layout = pl(&decode_store, &chunk_io);
        let step_store = layout(device, STEP_STORE);
        let step_io = layout(device, STEP_IO);
        let step_layout = pl(&step_store, &step_io);
        crate::wait::check_scope(device, scope, |e| {
            KvqError::Gpu(format!("building kvq's kernels failed: {e}"))
        })?;
        let attend = build(
            device,
            compile,
            "kvq decode",
            cfg.module_source(KernelModule::Decode)?,
            &decode_layout,
            ATTEND_ENTRIES,
        )?;
        Ok(Pipelines {
            device: device.clone(),
            cfg: cfg.clone(),
            compile,
            append_layout,
            step_layout,
            attend,
            append: Default::default(),
            step: Default::default(),
            chunk_module: Default::default(),
            chunk: Default::default(),
            prefill: Default::default(),
            chunk_layout,
            append_store,
            append_input,
            decode_store,
            decode_io,
            chunk_io,
            step_store,
            step_io,
        })
    }
}

/// The shader runtime checks kvq's kernels are compiled with, unless all are asked for.
///
/// wgpu's loop bounding (a hidden iteration counter on every loop, a guard against shaders
/// that never end) is left out: every kvq loop counts by a fixed step to a bound derived from
/// the cache's shape constants or from lengths the kernels keep within capacity, and the
/// counters cost the decode step 7-28 % on an H200 (BENCHMARKS.md, "wgpu's shader runtime checks").
///
/// wgpu's index clamping (every array index clamped into range in the shader) is left out
/// where the V codec is rotated (turbo, rotor, iso): there it cost 7-10 % of the step (a
/// clamp on each level-table lookup, BENCHMARKS.md, "wgpu's shader runtime checks"), while for the other codecs
/// its removal measured nothing or a loss. Every index of every kernel is in range by
/// construction (the audits in BENCHMARKS.md, "wgpu's shader runtime checks": codes are masked to their table's size, row
/// and word indices stay within the row, the buffer or the workgroup array); the driver's
/// own buffer robustness (Vulkan's robustBufferAccess2, which wgpu enables) stays on.
pub(crate) fn runtime_checks(cfg: &KernelConfig) -> wgpu::ShaderRuntimeChecks {
    wgpu::ShaderRuntimeChecks {
        force_loop_bounding: false,
        bounds_checks: cfg.clamps_indices(),
        ..wgpu::ShaderRuntimeChecks::checked()
    }
}

/// How kvq compiles a cache's modules.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Compile {
    /// wgpu's shader runtime checks ([`runtime_checks`]).
    checks: wgpu::ShaderRuntimeChecks,
    /// wgpu's zero-initialization of workgroup memory: off unless every check is asked for.
    /// Every kvq kernel writes each workgroup value before reading it (the tests check this
    /// with poisoned workgroup memory). The zeroing runs before a workgroup's first barrier:
    /// naga's version is one invocation storing every array (690 stores in the `none` split
    /// kernel, 1557 in `turbo3_sym`'s), for drivers without native zeroing. On an H200,
    /// whose driver zeroes natively, leaving it out measured within ±2 % (BENCHMARKS.md, "wgpu's shader runtime checks").
    zero_init: bool,
    /// Poison workgroup memory at every workgroup's start (`kernels/poison.rs`).
    poison: bool,
}

/// Compiles `src` and one pipeline per entry point, inside a validation error scope, as
/// `compile` says.
fn build<const N: usize>(
    device: &wgpu::Device,
    compile: Compile,
    label: &str,
    src: String,
    layout: &wgpu::PipelineLayout,
    entries: [&str; N],
) -> Result<[wgpu::ComputePipeline; N]> {
    let module = shader_module(device, compile, label, src)?;
    pipelines(device, compile, label, &module, layout, entries)
}

/// Compiles `src` as `compile` says (poisoned first where asked), inside a validation error
/// scope.
fn shader_module(
    device: &wgpu::Device,
    compile: Compile,
    label: &str,
    src: String,
) -> Result<wgpu::ShaderModule> {
    let src = if compile.poison {
        super::poison::poison_workgroup_memory(&src)?
    } else {
        src
    };
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(src.into()),
    };
    // SAFETY: wgpu's contract for the checks left out (see `runtime_checks`): every loop
    // terminates, and no index leaves its array or buffer.
    let module = unsafe { device.create_shader_module_trusted(desc, compile.checks) };
    let label = label.to_string();
    crate::wait::check_scope(device, scope, move |e| {
        KvqError::Gpu(format!("building kvq's {label} kernels failed: {e}"))
    })?;
    Ok(module)
}

/// One pipeline of `module` per entry point, inside a validation error scope.
fn pipelines<const N: usize>(
    device: &wgpu::Device,
    compile: Compile,
    label: &str,
    module: &wgpu::ShaderModule,
    layout: &wgpu::PipelineLayout,
    entries: [&str; N],
) -> Result<[wgpu::ComputePipeline; N]> {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let pipes = entries.map(|ep| {
        device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(ep),
            layout: Some(layout),
            module,
            entry_point: Some(ep),
            compilation_options: wgpu::PipelineCompilationOptions {
                zero_initialize_workgroup_memory: compile.zero_init,
                ..Default::default()
            },
            cache: None,
        })
    });
    let label = label.to_string();
    crate::wait::check_scope(device, scope, move |e| {
        KvqError::Gpu(format!("building kvq's {label} kernels failed: {e}"))
    })?;
    Ok(pipes)
}
