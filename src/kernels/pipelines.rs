//! One cache's pipelines: looked up in its context's [`KernelCache`] on first use (compiled
//! there once per context, whichever cache asks first), then kept at hand for recording.

use std::sync::{Arc, OnceLock};

use super::cache::{Compile, KernelCache, Layouts};
use crate::dispatch::SMALL_APPEND_MAX_TOKENS;
use crate::error::Result;
use crate::kernels::config::KernelConfig;
use crate::kernels::module::{InputType, KernelModule, LayoutTable};

/// A pipeline with its module, entry point and bind group layouts (groups 0 and 1).
pub(crate) type Described<'a> = (
    &'a wgpu::ComputePipeline,
    KernelModule,
    &'static str,
    [LayoutTable; 2],
);

/// The pipelines of one cache, and the layouts its bind groups are made with.
///
/// The decode pipelines are looked up with the cache (assembling them validates its shape);
/// the others when their inputs are first prepared (`append_input`, `step_io`, `chunk_io`),
/// never while recording, so a context only compiles the modules its caches run (several
/// seconds each on a CPU driver).
pub(crate) struct Pipelines {
    source: Source,
    layouts: Arc<Layouts>,
    /// [F32, F16] x (small).
    append_small: [OnceLock<Result<[wgpu::ComputePipeline; 1]>>; 2],
    /// [F32, F16] x (wide, commit).
    append_wide: [OnceLock<Result<[wgpu::ComputePipeline; 2]>>; 2],
    /// (split, reduce).
    attend: [wgpu::ComputePipeline; 2],
    /// [F32, F16] x (split, reduce) of the fused step.
    step: [OnceLock<Result<[wgpu::ComputePipeline; 2]>>; 2],
    /// (split, reduce) of chunks.
    chunk: OnceLock<Result<[wgpu::ComputePipeline; 2]>>,
    /// (prefill_q) of long chunk slices with a rotated K, from the chunk module.
    prefill_q: OnceLock<Result<[wgpu::ComputePipeline; 1]>>,
    /// (prefill) of long chunk slices, from the chunk module.
    prefill: OnceLock<Result<[wgpu::ComputePipeline; 1]>>,
}

/// Where a cache's pipelines come from: its configuration, compiled as its context says, in
/// its context's cache.
struct Source {
    device: wgpu::Device,
    kernels: Arc<KernelCache>,
    cfg: KernelConfig,
    compile: Compile,
}

impl Source {
    /// Entry points `entries` (indices into [`KernelModule::entry_points`]) of `module`.
    fn lookup<const N: usize>(
        &self,
        module: KernelModule,
        entries: [usize; N],
    ) -> Result<[wgpu::ComputePipeline; N]> {
        let src = self.cfg.module_source(module)?;
        let mut out = Vec::with_capacity(N);
        for e in entries {
            let p = self
                .kernels
                .pipeline(&self.device, module, src.clone(), self.compile, e)?;
            out.push(p);
        }
        Ok(out
            .try_into()
            .unwrap_or_else(|_| unreachable!("one pipeline per entry")))
    }
}

impl Pipelines {
    /// The pipelines of `cfg` on `device`, from `kernels` (its context's), compiled with all
    /// checks or poisoned workgroup memory as the context says
    /// ([`crate::GpuContext::with_shader_checks`], [`crate::GpuContext::with_workgroup_poison`]).
    pub fn new(
        device: &wgpu::Device,
        kernels: &Arc<KernelCache>,
        cfg: &KernelConfig,
        all_checks: bool,
        poison: bool,
    ) -> Result<Pipelines> {
        let source = Source {
            device: device.clone(),
            kernels: kernels.clone(),
            cfg: cfg.clone(),
            compile: Compile {
                all_checks,
                clamps: cfg.clamps_indices(),
                poison,
            },
        };
        Ok(Pipelines {
            layouts: source.kernels.layouts(&source.device)?,
            attend: source.lookup(KernelModule::Decode, [0, 1])?,
            source,
            append_small: Default::default(),
            append_wide: Default::default(),
            step: Default::default(),
            chunk: Default::default(),
            prefill_q: Default::default(),
            prefill: Default::default(),
        })
    }

    /// The layouts this cache's bind groups are made with.
    pub fn layouts(&self) -> &Layouts {
        &self.layouts
    }

    /// Every pipeline with its module, entry point and bind group layouts (groups 0 and 1),
    /// so [`crate::export`] can name what a recording uses.
    pub(crate) fn describe(&self) -> Result<Vec<Described<'_>>> {
        let mut groups: Vec<(&[wgpu::ComputePipeline], KernelModule, usize)> = Vec::new();
        for t in [InputType::F32, InputType::F16] {
            let m = KernelModule::Append(t);
            groups.push((self.append(t, 1)?, m, 0));
            groups.push((self.append(t, SMALL_APPEND_MAX_TOKENS + 1)?, m, 1));
            groups.push((self.step(t)?, KernelModule::Step(t), 0));
        }
        groups.push((&self.attend, KernelModule::Decode, 0));
        groups.push((self.chunk()?, KernelModule::Chunk, 0));
        if self.source.cfg.prefill_rows().is_some() {
            if let Some(q) = self.prefill_rotate()? {
                groups.push((std::slice::from_ref(q), KernelModule::Chunk, 2));
            }
            groups.push((
                std::slice::from_ref(self.prefill()?),
                KernelModule::Chunk,
                3,
            ));
        }
        let mut v = Vec::new();
        for (pipes, m, skip) in groups {
            for (p, d) in pipes.iter().zip(&m.entry_points()[skip..]) {
                v.push((p, m, d.entry, m.layouts()));
            }
        }
        Ok(v)
    }

    /// The append pipelines an append of `n` tokens per sequence of `input` runs (looked up
    /// on the first call): `append_small` alone for at most [`SMALL_APPEND_MAX_TOKENS`],
    /// else `append_wide` then `append_commit`. (Each only where it runs: on a CPU driver a
    /// pipeline's compile is seconds.)
    pub fn append(&self, input: InputType, n: u32) -> Result<&[wgpu::ComputePipeline]> {
        let m = KernelModule::Append(input);
        let i = input as usize;
        if n <= SMALL_APPEND_MAX_TOKENS {
            let p = self.append_small[i].get_or_init(|| self.source.lookup(m, [0]));
            return p.as_ref().map(|p| p.as_slice()).map_err(Clone::clone);
        }
        let p = self.append_wide[i].get_or_init(|| self.source.lookup(m, [1, 2]));
        p.as_ref().map(|p| p.as_slice()).map_err(Clone::clone)
    }

    /// The attend pipelines (split, reduce).
    pub fn attend(&self) -> &[wgpu::ComputePipeline; 2] {
        &self.attend
    }

    /// The fused-step pipelines (split, reduce) for `input` (looked up on the first call).
    pub fn step(&self, input: InputType) -> Result<&[wgpu::ComputePipeline; 2]> {
        self.step[input as usize]
            .get_or_init(|| self.source.lookup(KernelModule::Step(input), [0, 1]))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The chunk pipelines (split, reduce; looked up on the first call).
    pub fn chunk(&self) -> Result<&[wgpu::ComputePipeline; 2]> {
        self.chunk
            .get_or_init(|| self.source.lookup(KernelModule::Chunk, [0, 1]))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The prefill pipeline (looked up on the first call), for a cache the prefill kernel
    /// serves ([`KernelConfig::prefill_rows`]); it shares the chunk module.
    pub fn prefill(&self) -> Result<&wgpu::ComputePipeline> {
        self.prefill
            .get_or_init(|| self.source.lookup(KernelModule::Chunk, [3]))
            .as_ref()
            .map(|[p]| p)
            .map_err(Clone::clone)
    }

    /// The pipeline that rotates a prefill slice's queries first (`prefill_q`), for a rotated
    /// K only (looked up on the first call); None for another K.
    pub fn prefill_rotate(&self) -> Result<Option<&wgpu::ComputePipeline>> {
        if !self.source.cfg.k.kind.is_rotated() {
            return Ok(None);
        }
        self.prefill_q
            .get_or_init(|| self.source.lookup(KernelModule::Chunk, [2]))
            .as_ref()
            .map(|[p]| Some(p))
            .map_err(Clone::clone)
    }
}
