//! Kernels and whole decode scenarios for any WebGPU host (a browser, Dawn, another engine).
//!
//! Two levels:
//! * **Kernels.** [`export_kernels`] gives, for a [`KernelConfig`] and a [`Target`], the exact
//!   WGSL text of every kernel module kvq builds, with its entry points, the bind group layouts
//!   a host must create (group 0: the cache's store, group 1: the caller's buffers) and how
//!   each entry point is dispatched.
//! * **Replay plans.** [`replay_plan`] builds a real [`KvCache`] for a [`Scenario`] (a spec, a
//!   prefill and a few decode steps), records it through the same code that records into a
//!   `wgpu::ComputePass`, and returns a [`ReplayPlan`]: every buffer with its initial bytes,
//!   every shader module, bind group layout, pipeline and bind group, the ordered dispatches,
//!   and checks (buffers to read back with the values kvq's CPU reference expects). A host
//!   that replays the plan runs exactly what kvq ships, with no knowledge of kvq's layout;
//!   `web/replay.mjs` does so in Dawn, `cargo run --example export_wgsl` writes the plans
//!   (for the scenarios listed in `examples/shared/scenarios.rs`, which `tests/export.rs`
//!   checks too).
//!
//! Nothing here panics: every failure is a [`KvqError`].

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::cache::{Bound, KvCache, Recorder};
use crate::codec::{Codec, CodecRef};
use crate::context::GpuContext;
use crate::dispatch::{Dispatch, GridShape};
use crate::error::{KvqError, Result};
pub use crate::kernels::KernelModule;
use crate::kernels::{InputType, KernelConfig, LayoutTable, gpu_supported};
use crate::reference;
use crate::spec::CacheSpec;

/// Which kind of WebGPU implementation the WGSL is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// wgpu/naga on Vulkan, Metal, DX12 or GL: the text [`KvCache`] compiles.
    Native,
    /// A browser's WebGPU (Tint in Chrome, also Dawn outside a browser; naga in Firefox):
    /// `enable f16;` where the `f16` type is used, and no subgroup operations (browsers
    /// cannot grant subgroups through wgpu). Today's kernels use neither, so the text equals
    /// [`Target::Native`]'s; a kernel that needs subgroups is refused for this target.
    Browser,
}

impl Target {
    /// `"native"` or `"browser"`.
    pub fn name(self) -> &'static str {
        match self {
            Target::Native => "native",
            Target::Browser => "browser",
        }
    }
}

/// How a buffer is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BindingKind {
    /// `var<uniform>`.
    Uniform,
    /// `var<storage, read_write>`.
    Storage,
    /// `var<storage, read>`.
    ReadOnlyStorage,
}

impl BindingKind {
    /// The WebGPU `GPUBufferBindingType`: `uniform`, `storage` or `read-only-storage`.
    pub fn webgpu_name(self) -> &'static str {
        match self {
            BindingKind::Uniform => "uniform",
            BindingKind::Storage => "storage",
            BindingKind::ReadOnlyStorage => "read-only-storage",
        }
    }

    fn of(t: wgpu::BufferBindingType) -> BindingKind {
        match t {
            wgpu::BufferBindingType::Uniform => BindingKind::Uniform,
            wgpu::BufferBindingType::Storage { read_only: true } => BindingKind::ReadOnlyStorage,
            wgpu::BufferBindingType::Storage { read_only: false } => BindingKind::Storage,
        }
    }
}

/// One binding of a bind group layout (compute stage only, no dynamic offsets).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutEntry {
    /// `@binding(n)`.
    pub binding: u32,
    /// Buffer binding type.
    pub kind: BindingKind,
    /// What the buffer holds (`K store`, `lengths`, `query`, …).
    pub role: &'static str,
}

/// A bind group layout a host creates for kvq's pipelines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindGroupLayoutDesc {
    /// Label (`kvq append store`, …), unique per layout.
    pub label: &'static str,
    /// Bindings in order.
    pub entries: Vec<LayoutEntry>,
}

impl BindGroupLayoutDesc {
    fn of(t: LayoutTable) -> BindGroupLayoutDesc {
        BindGroupLayoutDesc {
            label: t.0,
            entries: t
                .1
                .iter()
                .map(|&(binding, ty, role)| LayoutEntry {
                    binding,
                    kind: BindingKind::of(ty),
                    role,
                })
                .collect(),
        }
    }
}

/// One kernel module as handed to a host.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportedKernel {
    /// Which module.
    pub module: KernelModule,
    /// The exact WGSL text for the target.
    pub wgsl: String,
    /// Its entry points.
    pub entry_points: Vec<&'static Dispatch>,
    /// Layouts of bind groups 0 and 1 (every entry point uses both).
    pub bind_group_layouts: [BindGroupLayoutDesc; 2],
    /// WebGPU features the module needs (`shader-f16` when it enables f16).
    pub features: Vec<&'static str>,
}

/// Checks what [`KernelConfig`]'s source builders assume, so they cannot panic.
fn check_config(cfg: &KernelConfig) -> Result<()> {
    for c in [cfg.k, cfg.v] {
        c.layout(cfg.head_dim)?;
        if !gpu_supported(c) {
            return Err(KvqError::InvalidSpec(format!(
                "codec '{}' has no GPU kernels yet",
                c.name()
            )));
        }
    }
    let bad = |m: &str| Err(KvqError::InvalidSpec(format!("kernel config: {m}")));
    if !cfg.head_dim.is_multiple_of(32) || !(32..=256).contains(&cfg.head_dim) {
        return bad("head_dim must be a multiple of 32 between 32 and 256");
    }
    if !(1..=8).contains(&cfg.gqa) {
        return bad("gqa must be between 1 and 8");
    }
    if [
        cfg.kv_heads,
        cfg.batch,
        cfg.capacity,
        cfg.layers,
        cfg.splits,
        cfg.segments,
    ]
    .contains(&0)
    {
        return bad("kv_heads, batch, capacity, layers, splits and segments must be at least 1");
    }
    if ![64, 128, 256].contains(&cfg.workgroup) {
        return bad("workgroup must be 64, 128 or 256");
    }
    Ok(())
}

/// The code of a WGSL text with `//` comments removed (kvq's WGSL has no block comments).
fn code_only(src: &str) -> String {
    src.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `code` names the identifier `word` (not as part of a longer identifier).
fn has_word(code: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(word).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

/// The WGSL of `module` for `target`, with the WebGPU features it needs.
fn module_for_target(
    cfg: &KernelConfig,
    module: KernelModule,
    target: Target,
) -> Result<(String, Vec<&'static str>)> {
    check_config(cfg)?;
    let src = cfg.module_source(module)?;
    let code = code_only(&src);
    let mut features = Vec::new();
    if target == Target::Browser {
        if code.contains("subgroup") {
            return Err(KvqError::InvalidSpec(format!(
                "kernel module '{}' uses subgroup operations, which browsers cannot grant through wgpu",
                module.name()
            )));
        }
        if has_word(&code, "f16") {
            features.push("shader-f16");
            if !code.contains("enable f16;") {
                return Ok((format!("enable f16;\n{src}"), features));
            }
        }
    }
    Ok((src, features))
}

/// The exact WGSL text of `module` for a cache of `cfg`'s shape on `target`.
pub fn kernel_wgsl(cfg: &KernelConfig, module: KernelModule, target: Target) -> Result<String> {
    module_for_target(cfg, module, target).map(|(s, _)| s)
}

/// Every kernel module of a cache of `cfg`'s shape for `target`: text, entry points, bind
/// group layouts and dispatch rules.
pub fn export_kernels(cfg: &KernelConfig, target: Target) -> Result<Vec<ExportedKernel>> {
    KernelModule::all()
        .into_iter()
        .map(|module| {
            let (wgsl, features) = module_for_target(cfg, module, target)?;
            Ok(ExportedKernel {
                module,
                wgsl,
                entry_points: module.entry_points().to_vec(),
                bind_group_layouts: module.layouts().map(BindGroupLayoutDesc::of),
                features,
            })
        })
        .collect()
}

/// Every codec kvq's GPU kernels serve, from the codec list itself (new GPU codecs appear
/// here as soon as [`crate::kernels::gpu_supported`] accepts them).
pub fn gpu_codecs() -> Vec<Codec> {
    let mut v: Vec<Codec> = Vec::new();
    for name in Codec::valid_names() {
        if let Ok(c) = Codec::parse(&name)
            && gpu_supported(c)
            && !v.contains(&c)
        {
            v.push(c);
        }
    }
    v
}

/// Which recording path a [`Scenario`]'s decode steps take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepPath {
    /// [`KvCache::append_in_pass`] then [`KvCache::attend_in_pass`] per step.
    Separate,
    /// [`KvCache::step_in_pass`] per step (the fused two-dispatch step).
    Fused,
}

/// A decode scenario: a cache, a prefill of `prefill` tokens per sequence into `layer`, then
/// `steps` decode steps of one token each, each attending one query per sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Unique name (used for file names).
    pub name: String,
    /// The cache.
    pub spec: CacheSpec,
    /// The layer every append and attend goes to.
    pub layer: u32,
    /// Tokens per sequence of the prefill append (at least 1).
    pub prefill: u32,
    /// Element type of the prefill input.
    pub prefill_input: InputType,
    /// Decode steps (at least 1).
    pub steps: u32,
    /// Element type of the steps' K/V input.
    pub step_input: InputType,
    /// Separate append + attend, or the fused step.
    pub path: StepPath,
    /// Seed of the random data.
    pub seed: u64,
}

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
    /// [`ReplayPlan::grid_shape`], what the entry point's [`Dispatch`] rule gives `workgroups`
    /// from.
    pub wide_groups: u32,
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
    /// [`KernelModule::name`].
    pub name: String,
    /// The WGSL text for the plan's target.
    pub wgsl: String,
}

/// Everything a WebGPU host needs to replay a [`Scenario`] exactly as [`KvCache`] records it
/// and to check the result. See the module docs; [`ReplayPlan::to_json`] writes it out.
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
    /// What the entry points' [`Dispatch`] rules are evaluated on (with each dispatch's
    /// [`PlanDispatch::wide_groups`]).
    pub grid_shape: GridShape,
    /// Compute passes in submission order (one command encoder, one submit).
    pub passes: Vec<PlanPass>,
    /// Checks after the submit.
    pub checks: Vec<PlanCheck>,
}

/// Records a cache's dispatches into a plan instead of a compute pass.
struct PlanRecorder {
    pipes: HashMap<wgpu::ComputePipeline, (usize, &'static str, [LayoutTable; 2])>,
    pipeline: Option<wgpu::ComputePipeline>,
    groups: [Option<(wgpu::BindGroup, Vec<wgpu::Buffer>)>; 2],
    buffer_ids: HashMap<wgpu::Buffer, usize>,
    buffers: Vec<(String, wgpu::Buffer)>,
    role_counts: HashMap<&'static str, usize>,
    layout_ids: HashMap<&'static str, usize>,
    layouts: Vec<BindGroupLayoutDesc>,
    pipeline_ids: HashMap<wgpu::ComputePipeline, usize>,
    pipelines: Vec<PlanPipeline>,
    group_ids: HashMap<wgpu::BindGroup, usize>,
    bind_groups: Vec<PlanBindGroup>,
    passes: Vec<PlanPass>,
    error: Option<KvqError>,
}

impl PlanRecorder {
    fn buffer(&mut self, name: impl FnOnce(&mut Self) -> String, b: &wgpu::Buffer) -> usize {
        if let Some(&i) = self.buffer_ids.get(b) {
            return i;
        }
        let name = name(self);
        self.buffers.push((name, b.clone()));
        self.buffer_ids.insert(b.clone(), self.buffers.len() - 1);
        self.buffers.len() - 1
    }

    /// Registers a caller buffer under its own name.
    fn caller(&mut self, name: String, b: &wgpu::Buffer) -> usize {
        self.buffer(|_| name, b)
    }

    fn layout(&mut self, t: LayoutTable) -> usize {
        if let Some(&i) = self.layout_ids.get(t.0) {
            return i;
        }
        self.layouts.push(BindGroupLayoutDesc::of(t));
        self.layout_ids.insert(t.0, self.layouts.len() - 1);
        self.layouts.len() - 1
    }

    fn begin(&mut self, label: String) {
        self.passes.push(PlanPass {
            label,
            dispatches: Vec::new(),
        });
        self.pipeline = None;
        self.groups = [None, None];
    }

    fn fail(&mut self, m: String) {
        self.error
            .get_or_insert(KvqError::Other(format!("recording a replay plan: {m}")));
    }

    fn try_dispatch(&mut self, workgroups: [u32; 3]) -> std::result::Result<(), String> {
        let pipe = self.pipeline.clone().ok_or("dispatch without a pipeline")?;
        let &(module, entry_point, tables) = self
            .pipes
            .get(&pipe)
            .ok_or("a pipeline kvq does not describe")?;
        let layouts = tables.map(|t| self.layout(t));
        let pipeline = match self.pipeline_ids.get(&pipe) {
            Some(&i) => i,
            None => {
                self.pipelines.push(PlanPipeline {
                    module,
                    entry_point,
                    layouts,
                });
                self.pipeline_ids.insert(pipe, self.pipelines.len() - 1);
                self.pipelines.len() - 1
            }
        };
        let mut bind_groups = [0; 2];
        for g in 0..2 {
            let (group, bufs) = self.groups[g]
                .clone()
                .ok_or(format!("dispatch without bind group {g}"))?;
            let table = tables[g];
            if table.1.len() != bufs.len() {
                return Err(format!(
                    "bind group {g} binds {} buffers, layout '{}' has {}",
                    bufs.len(),
                    table.0,
                    table.1.len()
                ));
            }
            bind_groups[g] = match self.group_ids.get(&group) {
                Some(&i) => {
                    if self.bind_groups[i].layout != layouts[g] {
                        return Err(format!("bind group {g} used with two layouts"));
                    }
                    i
                }
                None => {
                    let buffers = bufs
                        .iter()
                        .zip(table.1)
                        .map(|(b, &(_, _, role))| {
                            self.buffer(
                                |s| {
                                    let n = s.role_counts.entry(role).or_insert(0);
                                    *n += 1;
                                    format!("{role} {}", *n - 1)
                                },
                                b,
                            )
                        })
                        .collect();
                    self.bind_groups.push(PlanBindGroup {
                        layout: layouts[g],
                        buffers,
                    });
                    self.group_ids.insert(group, self.bind_groups.len() - 1);
                    self.bind_groups.len() - 1
                }
            };
        }
        let pass = self.passes.last_mut().ok_or("dispatch outside a pass")?;
        pass.dispatches.push(PlanDispatch {
            pipeline,
            bind_groups,
            workgroups,
            wide_groups: 0,
        });
        Ok(())
    }
}

impl Recorder for PlanRecorder {
    fn set_pipeline(&mut self, pipeline: &wgpu::ComputePipeline) {
        self.pipeline = Some(pipeline.clone());
    }

    fn set_bind_group(&mut self, index: u32, group: &Bound) {
        match self.groups.get_mut(index as usize) {
            Some(slot) => *slot = Some((group.group.clone(), group.buffers.clone())),
            None => self.fail(format!("bind group index {index}")),
        }
    }

    fn dispatch_workgroups(&mut self, x: u32, y: u32, z: u32) {
        if let Err(m) = self.try_dispatch([x, y, z]) {
            self.fail(m);
        }
    }

    fn dispatch(&mut self, rule: &Dispatch, shape: &GridShape) {
        let [x, y, z] = rule.workgroups(shape);
        self.dispatch_workgroups(x, y, z);
        if let Some(d) = self.passes.last_mut().and_then(|p| p.dispatches.last_mut()) {
            d.wide_groups = shape.wide_groups;
        }
    }
}

/// SplitMix64 with Box–Muller normals: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `n` normal values times `scale`, rounded to f16 values: with f16 inputs the GPU's f32
    /// encoders and the CPU reference's f64 encoders round alike (no ties decided
    /// differently), so the expected output does not depend on which encoded the store.
    fn f16_normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
                let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                let x = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                half::f16::from_f32(x as f32 * scale).to_f32()
            })
            .collect()
    }
}

fn input_bytes(x: &[f32], t: InputType) -> Vec<u8> {
    match t {
        InputType::F32 => bytemuck::cast_slice(x).to_vec(),
        InputType::F16 => x
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
    }
}

// wgpu's handles hash and compare by identity (not by their interior state), which is what
// the plan recorder's maps key on.
#[allow(clippy::mutable_key_type)]
/// Builds a [`ReplayPlan`] for `sc` from a real [`KvCache`] on `ctx`'s device: the cache's
/// pipelines, bind groups and dispatches as its recording functions emit them, the initial
/// buffer contents as read back from that device, and the expected outputs from kvq's CPU
/// references (codec encode/decode, f64 attention). Nothing is dispatched on `ctx`.
pub fn replay_plan(ctx: &GpuContext, sc: &Scenario, target: Target) -> Result<ReplayPlan> {
    let s = &sc.spec;
    if sc.prefill == 0 || sc.steps == 0 {
        return Err(KvqError::InvalidSpec(format!(
            "scenario '{}': prefill and steps must be at least 1",
            sc.name
        )));
    }
    let total = sc.prefill as u64 + sc.steps as u64;
    if sc.layer >= s.layers || (total > s.capacity as u64 && s.window.is_none()) {
        return Err(KvqError::InvalidSpec(format!(
            "scenario '{}': layer {} of {} and {} tokens in capacity {}",
            sc.name, sc.layer, s.layers, total, s.capacity
        )));
    }
    let mut cache = KvCache::new(ctx, s.clone())?;
    let cfg = cache.kernel_config().clone();
    let mut modules = Vec::new();
    let mut features: Vec<&'static str> = Vec::new();
    let mut module_ids = HashMap::new();
    for m in KernelModule::all() {
        let (wgsl, f) = module_for_target(&cfg, m, target)?;
        for f in f {
            if !features.contains(&f) {
                features.push(f);
            }
        }
        module_ids.insert(m, modules.len());
        modules.push(PlanModule {
            name: m.name(),
            wgsl,
        });
    }
    let pipes = cache
        .pipelines()
        .describe()?
        .into_iter()
        .map(|(p, m, ep, t)| (p.clone(), (module_ids[&m], ep, t)))
        .collect();
    let mut rec = PlanRecorder {
        pipes,
        pipeline: None,
        groups: [None, None],
        buffer_ids: HashMap::new(),
        buffers: Vec::new(),
        role_counts: HashMap::new(),
        layout_ids: HashMap::new(),
        layouts: Vec::new(),
        pipeline_ids: HashMap::new(),
        pipelines: Vec::new(),
        group_ids: HashMap::new(),
        bind_groups: Vec::new(),
        passes: Vec::new(),
        error: None,
    };

    let (b, kvh, qh, d) = (
        s.batch as usize,
        s.kv_heads as usize,
        s.q_heads as usize,
        s.head_dim as usize,
    );
    let dev = &ctx.device;
    let caller_buf = |data: &[u8]| {
        let buf = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kvq export caller buffer"),
            size: (data.len() as u64).next_multiple_of(4),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let mut padded = data.to_vec();
        padded.resize(buf.size() as usize, 0);
        ctx.queue.write_buffer(&buf, 0, &padded);
        buf
    };
    let mut rng = Rng(sc.seed);
    // Every token's K and V per sequence, [len, kv_heads, d], as the caller gave them.
    let mut ks: Vec<Vec<f32>> = vec![Vec::new(); b];
    let mut vs: Vec<Vec<f32>> = vec![Vec::new(); b];
    let add_tokens =
        |ks: &mut Vec<Vec<f32>>, vs: &mut Vec<Vec<f32>>, k: &[f32], v: &[f32], n: usize| {
            for seq in 0..b {
                let r = seq * n * kvh * d..(seq + 1) * n * kvh * d;
                ks[seq].extend_from_slice(&k[r.clone()]);
                vs[seq].extend_from_slice(&v[r]);
            }
        };

    let n = sc.prefill as usize;
    let (k, v) = (
        rng.f16_normals(b * n * kvh * d, 1.0),
        rng.f16_normals(b * n * kvh * d, 1.0),
    );
    add_tokens(&mut ks, &mut vs, &k, &v, n);
    let (kb, vb) = (
        caller_buf(&input_bytes(&k, sc.prefill_input)),
        caller_buf(&input_bytes(&v, sc.prefill_input)),
    );
    rec.caller("prefill K input".into(), &kb);
    rec.caller("prefill V input".into(), &vb);
    let input = cache.append_input(&kb, &vb, sc.prefill, sc.prefill_input)?;
    rec.begin(format!("append {} tokens (prefill)", sc.prefill));
    cache.record_append(&mut rec, sc.layer, &input)?;

    let kref = CodecRef::new(s.codecs.k, s.head_dim, s.seed)?;
    let vref = CodecRef::new(s.codecs.v, s.head_dim, s.seed)?;
    let dequant = |r: &CodecRef, x: &[f32]| -> Vec<f64> {
        x.chunks(d)
            .flat_map(|row| r.decode(&r.encode(row)))
            .collect()
    };
    let mut checks = Vec::new();
    for step in 0..sc.steps {
        let (k, v) = (
            rng.f16_normals(b * kvh * d, 1.0),
            rng.f16_normals(b * kvh * d, 1.0),
        );
        add_tokens(&mut ks, &mut vs, &k, &v, 1);
        let q = rng.f16_normals(b * qh * d, 1.5);
        let (kb, vb) = (
            caller_buf(&input_bytes(&k, sc.step_input)),
            caller_buf(&input_bytes(&v, sc.step_input)),
        );
        let qb = caller_buf(bytemuck::cast_slice(&q));
        // Poisoned: a kernel that skips a write cannot pass.
        let ob = caller_buf(bytemuck::cast_slice(&vec![f32::NAN; q.len()]));
        rec.caller(format!("step {step} K input"), &kb);
        rec.caller(format!("step {step} V input"), &vb);
        rec.caller(format!("step {step} query"), &qb);
        let out = rec.caller(format!("step {step} output"), &ob);
        match sc.path {
            StepPath::Separate => {
                let input = cache.append_input(&kb, &vb, 1, sc.step_input)?;
                let io = cache.attend_io(&qb, &ob)?;
                rec.begin(format!("step {step}: append"));
                cache.record_append(&mut rec, sc.layer, &input)?;
                rec.begin(format!("step {step}: attend"));
                cache.record_attend(&mut rec, sc.layer, &io)?;
            }
            StepPath::Fused => {
                let io = cache.step_io(&kb, &vb, 1, sc.step_input, &qb, &ob)?;
                rec.begin(format!("step {step}: fused step"));
                cache.record_step(&mut rec, sc.layer, &io)?;
            }
        }
        let mut want = Vec::with_capacity(q.len());
        for seq in 0..b {
            let qs: Vec<f64> = q[seq * qh * d..(seq + 1) * qh * d]
                .iter()
                .map(|&x| x as f64)
                .collect();
            // A sliding window attends its last `window` tokens only.
            let len = ks[seq].len() / (kvh * d);
            let first = (len - len.min(s.window.unwrap_or(s.capacity) as usize)) * kvh * d;
            let (ks, vs) = (&ks[seq][first..], &vs[seq][first..]);
            let (kd, vd) = (dequant(&kref, ks), dequant(&vref, vs));
            if s.codecs.k.qjl {
                // Scores from the QJL estimator over the encoded rows, as the GPU computes.
                let rows: Vec<Vec<u32>> = ks.chunks(d).map(|x| kref.encode(x)).collect();
                let scale = s.softmax_scale() as f64;
                want.extend(reference::attention_with_scores(
                    &vd,
                    qh,
                    kvh,
                    d,
                    |q, h, t| scale * kref.ip_estimate(&rows[t * kvh + h], &qs[q * d..(q + 1) * d]),
                ));
            } else {
                want.extend(reference::attention(
                    &qs,
                    &kd,
                    &vd,
                    qh,
                    kvh,
                    d,
                    s.softmax_scale() as f64,
                ));
            }
        }
        checks.push((
            format!("step {step} output"),
            out,
            Expected::F32 {
                values: want,
                chunk: qh * d,
                tolerance: 1e-3,
            },
        ));
    }
    if let Some(e) = rec.error.take() {
        return Err(e);
    }
    // Lengths then overflow flags: the scenario's layer holds every token, the others none.
    let lens_id = rec
        .buffers
        .iter()
        .position(|(name, _)| name == "lengths 0")
        .ok_or_else(|| KvqError::Other("replay plan: no lengths buffer was bound".into()))?;
    let mut lens = vec![0u32; 2 * (s.layers * s.batch) as usize];
    for seq in 0..s.batch {
        lens[(sc.layer * s.batch + seq) as usize] = total as u32;
    }
    let mut plan_checks: Vec<PlanCheck> = checks
        .into_iter()
        .map(|(label, buffer, expected)| PlanCheck {
            label,
            buffer,
            expected,
        })
        .collect();
    plan_checks.push(PlanCheck {
        label: "lengths and overflow flags".into(),
        buffer: lens_id,
        expected: Expected::U32(lens),
    });

    let mut buffers = Vec::with_capacity(rec.buffers.len());
    for (name, buf) in &rec.buffers {
        if !buf.usage().contains(wgpu::BufferUsages::COPY_SRC) {
            return Err(KvqError::Other(format!(
                "replay plan: buffer '{name}' lacks COPY_SRC, its initial bytes cannot be read"
            )));
        }
        let bytes = ctx.read_back(buf, 0, buf.size())?;
        let zero = bytes.iter().all(|&x| x == 0);
        buffers.push(PlanBuffer {
            name: name.clone(),
            size: buf.size(),
            usage: buf.usage(),
            init: (!zero).then_some(bytes),
        });
    }
    let storage_per_stage = rec
        .layouts
        .iter()
        .map(|l| {
            l.entries
                .iter()
                .filter(|e| e.kind != BindingKind::Uniform)
                .count() as u64
        })
        .collect::<Vec<_>>();
    // Every pipeline binds both of its module's layouts.
    let max_storage = rec
        .pipelines
        .iter()
        .map(|p| storage_per_stage[p.layouts[0]] + storage_per_stage[p.layouts[1]])
        .max()
        .unwrap_or(0);
    let max_buffer = buffers.iter().map(|b| b.size).max().unwrap_or(0);
    let max_groups = rec
        .passes
        .iter()
        .flat_map(|p| &p.dispatches)
        .flat_map(|d| d.workgroups)
        .max()
        .unwrap_or(1);
    let limits = vec![
        (
            "maxComputeWorkgroupStorageSize",
            cfg.split_workgroup_bytes() as u64,
        ),
        ("maxStorageBuffersPerShaderStage", max_storage),
        ("maxStorageBufferBindingSize", max_buffer),
        ("maxBufferSize", max_buffer),
        ("maxComputeWorkgroupsPerDimension", max_groups as u64),
        (
            "maxComputeInvocationsPerWorkgroup",
            cfg.workgroup.max(256) as u64,
        ),
        ("maxComputeWorkgroupSizeX", cfg.workgroup.max(256) as u64),
    ];
    let summary = format!(
        "K {} V {}, head_dim {}, {} q heads / {} kv heads (GQA {}), batch {}, {} segment(s) x {} split(s), layer {} of {}, prefill {} ({}) + {} steps ({}, {})",
        s.codecs.k.name(),
        s.codecs.v.name(),
        s.head_dim,
        s.q_heads,
        s.kv_heads,
        s.gqa(),
        s.batch,
        cache.layout().segments,
        cache.layout().splits,
        sc.layer,
        s.layers,
        sc.prefill,
        sc.prefill_input.name(),
        sc.steps,
        sc.step_input.name(),
        match sc.path {
            StepPath::Separate => "append + attend",
            StepPath::Fused => "fused step",
        }
    );
    Ok(ReplayPlan {
        name: sc.name.clone(),
        summary,
        target,
        features,
        limits,
        buffers,
        modules,
        layouts: rec.layouts,
        pipelines: rec.pipelines,
        bind_groups: rec.bind_groups,
        grid_shape: cache.grid_shape(),
        passes: rec.passes,
        checks: plan_checks,
    })
}

// ---- JSON (written by hand: the format is small and kvq stays free of a serializer) ----

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json_arr<T>(items: impl IntoIterator<Item = T>, f: impl Fn(T) -> String) -> String {
    let v: Vec<String> = items.into_iter().map(f).collect();
    format!("[{}]", v.join(","))
}

/// Standard base64 (with padding), as `Buffer.from(s, "base64")` and `atob` read it.
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut o = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                o.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                o.push('=');
            }
        }
    }
    o
}

fn usage_names(u: wgpu::BufferUsages) -> Vec<&'static str> {
    use wgpu::BufferUsages as U;
    [
        (U::MAP_READ, "MAP_READ"),
        (U::MAP_WRITE, "MAP_WRITE"),
        (U::COPY_SRC, "COPY_SRC"),
        (U::COPY_DST, "COPY_DST"),
        (U::INDEX, "INDEX"),
        (U::VERTEX, "VERTEX"),
        (U::UNIFORM, "UNIFORM"),
        (U::STORAGE, "STORAGE"),
        (U::INDIRECT, "INDIRECT"),
        (U::QUERY_RESOLVE, "QUERY_RESOLVE"),
    ]
    .into_iter()
    .filter(|(f, _)| u.contains(*f))
    .map(|(_, n)| n)
    .collect()
}

fn layout_json(l: &BindGroupLayoutDesc) -> String {
    format!(
        "{{\"label\":{},\"entries\":{}}}",
        json_str(l.label),
        json_arr(&l.entries, |e| format!(
            "{{\"binding\":{},\"type\":{},\"role\":{}}}",
            e.binding,
            json_str(e.kind.webgpu_name()),
            json_str(e.role)
        ))
    )
}

impl ReplayPlan {
    /// The plan as JSON (format `kvq-replay-plan/1`). Byte arrays (initial contents, expected
    /// f64 values as little-endian IEEE doubles, expected u32 values) are base64; `init` is
    /// null for an all-zero buffer. Usages are WebGPU `GPUBufferUsage` flag names.
    pub fn to_json(&self) -> String {
        let mut o = String::new();
        let _ = write!(
            o,
            "{{\"format\":\"kvq-replay-plan/1\",\"name\":{},\"summary\":{},\"target\":{},",
            json_str(&self.name),
            json_str(&self.summary),
            json_str(self.target.name())
        );
        let _ = write!(
            o,
            "\"features\":{},\"limits\":{{{}}},",
            json_arr(&self.features, |f| json_str(f)),
            self.limits
                .iter()
                .map(|(k, v)| format!("{}:{v}", json_str(k)))
                .collect::<Vec<_>>()
                .join(",")
        );
        let _ = write!(
            o,
            "\"buffers\":{},",
            json_arr(&self.buffers, |b| format!(
                "{{\"name\":{},\"size\":{},\"usage\":{},\"init\":{}}}",
                json_str(&b.name),
                b.size,
                json_arr(usage_names(b.usage), json_str),
                b.init
                    .as_ref()
                    .map_or("null".into(), |x| json_str(&base64(x)))
            ))
        );
        let _ = write!(
            o,
            "\"modules\":{},",
            json_arr(&self.modules, |m| format!(
                "{{\"name\":{},\"wgsl\":{}}}",
                json_str(&m.name),
                json_str(&m.wgsl)
            ))
        );
        let _ = write!(o, "\"layouts\":{},", json_arr(&self.layouts, layout_json));
        let _ = write!(
            o,
            "\"pipelines\":{},",
            json_arr(&self.pipelines, |p| format!(
                "{{\"module\":{},\"entry_point\":{},\"layouts\":[{},{}]}}",
                p.module,
                json_str(p.entry_point),
                p.layouts[0],
                p.layouts[1]
            ))
        );
        let _ = write!(
            o,
            "\"bind_groups\":{},",
            json_arr(&self.bind_groups, |g| format!(
                "{{\"layout\":{},\"buffers\":{}}}",
                g.layout,
                json_arr(&g.buffers, |b| b.to_string())
            ))
        );
        let g = &self.grid_shape;
        let _ = write!(
            o,
            "\"grid_shape\":{{\"batch\":{},\"q_heads\":{},\"kv_heads\":{},\"splits\":{}}},",
            g.batch, g.q_heads, g.kv_heads, g.splits
        );
        let _ = write!(
            o,
            "\"passes\":{},",
            json_arr(&self.passes, |p| format!(
                "{{\"label\":{},\"dispatches\":{}}}",
                json_str(&p.label),
                json_arr(&p.dispatches, |d| format!(
                    "{{\"pipeline\":{},\"bind_groups\":[{},{}],\"workgroups\":[{},{},{}],\"wide_groups\":{}}}",
                    d.pipeline,
                    d.bind_groups[0],
                    d.bind_groups[1],
                    d.workgroups[0],
                    d.workgroups[1],
                    d.workgroups[2],
                    d.wide_groups
                ))
            ))
        );
        let _ = write!(
            o,
            "\"checks\":{}}}",
            json_arr(&self.checks, |c| {
                let e = match &c.expected {
                    Expected::F32 {
                        values,
                        chunk,
                        tolerance,
                    } => format!(
                        "\"kind\":\"f32_rel_err\",\"chunk\":{chunk},\"tolerance\":{tolerance:e},\"count\":{},\"expected_f64\":{}",
                        values.len(),
                        json_str(&base64(bytemuck::cast_slice(values)))
                    ),
                    Expected::U32(v) => format!(
                        "\"kind\":\"u32_exact\",\"count\":{},\"expected_u32\":{}",
                        v.len(),
                        json_str(&base64(bytemuck::cast_slice(v)))
                    ),
                };
                format!(
                    "{{\"label\":{},\"buffer\":{},{e}}}",
                    json_str(&c.label),
                    c.buffer
                )
            })
        );
        o
    }
}

/// Every kernel module of `cfg` for `target` as a JSON manifest entry list (used by the
/// `export_wgsl` example): module name, file name the example writes it to, entry points
/// with dispatch rules, bind group layouts, features.
pub fn kernels_json(
    kernels: &[ExportedKernel],
    file_of: impl Fn(&ExportedKernel) -> String,
) -> String {
    json_arr(kernels, |k| {
        format!(
            "{{\"module\":{},\"file\":{},\"entry_points\":{},\"bind_group_layouts\":[{},{}],\"features\":{}}}",
            json_str(&k.module.name()),
            json_str(&file_of(k)),
            json_arr(&k.entry_points, |e| format!(
                "{{\"name\":{},\"grid\":{},\"when\":{}}}",
                json_str(e.entry),
                json_arr(&e.grid, |t| json_str(t.formula())),
                json_str(e.when)
            )),
            layout_json(&k.bind_group_layouts[0]),
            layout_json(&k.bind_group_layouts[1]),
            json_arr(&k.features, |f| json_str(f))
        )
    })
}

/// A JSON string literal of `s` (for manifests written next to plans).
pub fn json_string(s: &str) -> String {
    json_str(s)
}
