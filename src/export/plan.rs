//! What a replay plan holds: buffers, modules, layouts, pipelines, bind groups, passes and
//! checks, indexed into one another (no wgpu handles, nothing of kvq's layout).

use super::wgsl::{BindGroupLayoutDesc, Target};
use crate::dispatch::GridShape;

/// A buffer of a [`ReplayPlan`].
#[derive(Clone, Debug, PartialEq)]
pub struct PlanBuffer {
    /// Name (its role in kvq and a counter, or the caller buffer's purpose).
    pub name: String,
    /// Size in bytes (a multiple of 4).
    pub size: u64,
    /// Usages kvq created it with (WebGPU and wgpu share the bit values); a host may add
    /// COPY_DST / COPY_SRC to fill and read it.
    pub usage: wgpu::BufferUsages,
    /// Initial contents (`size` bytes); `None` when all zero.
    pub init: Option<Vec<u8>>,
}

/// A pipeline of a [`ReplayPlan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanPipeline {
    /// Index into [`ReplayPlan::modules`].
    pub module: usize,
    /// Entry point.
    pub entry_point: &'static str,
    /// Indices into [`ReplayPlan::layouts`] of bind groups 0 and 1.
    pub layouts: [usize; 2],
}

/// A bind group of a [`ReplayPlan`]: binding `i` is the whole of `buffers[i]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanBindGroup {
    /// Index into [`ReplayPlan::layouts`].
    pub layout: usize,
    /// Indices into [`ReplayPlan::buffers`], by binding.
    pub buffers: Vec<usize>,
}

/// One dispatch of a [`ReplayPlan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanDispatch {
    /// Index into [`ReplayPlan::pipelines`].
    pub pipeline: usize,
    /// Indices into [`ReplayPlan::bind_groups`] of groups 0 and 1.
    pub bind_groups: [usize; 2],
    /// Workgroup counts.
    pub workgroups: [u32; 3],
    /// [`GridShape::wide_groups`] of the call (0 but for `append_wide`): with
    /// [`ReplayPlan::grid_shape`], what the entry point's
    /// [`Dispatch`](crate::dispatch::Dispatch) rule gives `workgroups` from.
    pub wide_groups: u32,
    /// [`GridShape::queries`] of the call (1 but for a slice of a chunk of several new
    /// tokens: the slice's count).
    pub queries: u32,
    /// [`GridShape::query_groups`] of the call (1 but for a chunk of several new tokens).
    pub query_groups: u32,
    /// [`GridShape::row_tiles`] of the call (1 but for a prefill slice).
    pub row_tiles: u32,
    /// [`GridShape::splits`] of the call: the plan's, but for a chunk slice its own
    /// ([`crate::spec::CacheSpec::chunk_splits`]; 0 for a dispatch no rule recorded).
    pub splits: u32,
}

/// A compute pass of a [`ReplayPlan`] (one per kvq call: an append, an attend, a step).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanPass {
    /// What kvq call recorded it.
    pub label: String,
    /// Its dispatches in order.
    pub dispatches: Vec<PlanDispatch>,
}

/// What a host compares a buffer against after replaying every pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Expected {
    /// f32 values checked chunk by chunk (one chunk per sequence's output): max |got − want|
    /// over the chunk divided by max |want| over the chunk must be at most `tolerance`.
    F32 {
        /// The reference values (f64 attention over the CPU reference's dequantized store).
        values: Vec<f64>,
        /// Values per chunk.
        chunk: usize,
        /// Largest allowed relative error per chunk.
        tolerance: f64,
    },
    /// u32 values that must match exactly.
    U32(Vec<u32>),
}

/// A buffer to read back after the replay, with what it must hold.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanCheck {
    /// What is checked (`step 2 output`, `lengths`).
    pub label: String,
    /// Index into [`ReplayPlan::buffers`].
    pub buffer: usize,
    /// The expected contents (from the start of the buffer).
    pub expected: Expected,
}

/// A WGSL module of a [`ReplayPlan`].
#[derive(Clone, Debug, PartialEq)]
pub struct PlanModule {
    /// [`KernelModule::name`](crate::kernels::KernelModule::name).
    pub name: String,
    /// The WGSL text for the plan's target.
    pub wgsl: String,
}

/// Everything a WebGPU host needs to replay a [`Scenario`](super::Scenario) exactly as
/// [`KvCache`](crate::KvCache) records it and to check the result. See the [module docs](super);
/// [`ReplayPlan::to_json`] writes it out.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayPlan {
    /// The scenario's name.
    pub name: String,
    /// One-line summary of the scenario (shape, codecs, lengths, path).
    pub summary: String,
    /// The target the WGSL is for.
    pub target: Target,
    /// WebGPU features to request.
    pub features: Vec<&'static str>,
    /// WebGPU limits to request (name, minimum value), in WebGPU's names.
    pub limits: Vec<(&'static str, u64)>,
    /// Buffers.
    pub buffers: Vec<PlanBuffer>,
    /// Every kernel module of the cache (all are compiled, also those no dispatch uses, so a
    /// host validates every variant).
    pub modules: Vec<PlanModule>,
    /// Bind group layouts.
    pub layouts: Vec<BindGroupLayoutDesc>,
    /// Pipelines (explicit layouts of the plan's bind group layouts).
    pub pipelines: Vec<PlanPipeline>,
    /// Bind groups.
    pub bind_groups: Vec<PlanBindGroup>,
    /// What the entry points' [`Dispatch`](crate::dispatch::Dispatch) rules are evaluated on
    /// (with each dispatch's [`PlanDispatch::wide_groups`]).
    pub grid_shape: GridShape,
    /// Compute passes in submission order (one command encoder, one submit).
    pub passes: Vec<PlanPass>,
    /// Checks after the submit.
    pub checks: Vec<PlanCheck>,
}
