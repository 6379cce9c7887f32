//! A decode [`Scenario`] and [`replay_plan`], which records one from a real cache into a
//! [`ReplayPlan`] with the outputs kvq's CPU reference expects.

use std::collections::HashMap;

use super::plan::{Expected, PlanBuffer, PlanCheck, PlanModule, ReplayPlan};
use super::record::PlanRecorder;
use super::wgsl::{BindingKind, Target, module_for_target};
use crate::cache::KvCache;
use crate::codec::CodecRef;
use crate::codec::rotation::SplitMix64;
use crate::context::GpuContext;
use crate::error::{KvqError, Result};
use crate::kernels::{InputType, KernelConfig, KernelModule};
use crate::reference;
use crate::spec::CacheSpec;

/// Which recording path a [`Scenario`]'s decode steps take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepPath {
    /// [`KvCache::append_in_pass`] then [`KvCache::attend_in_pass`] per step.
    Separate,
    /// [`KvCache::step_in_pass`] per step (the fused two-dispatch step).
    Fused,
    /// [`KvCache::chunk_in_pass`] per step: [`CHUNK_TOKENS`] new tokens per sequence,
    /// attended causally.
    Chunk,
}

/// New tokens per sequence of each step of a [`StepPath::Chunk`] scenario.
pub const CHUNK_TOKENS: u32 = 3;

impl StepPath {
    /// New tokens per sequence each step appends.
    pub fn tokens(self) -> u32 {
        match self {
            StepPath::Chunk => CHUNK_TOKENS,
            _ => 1,
        }
    }
}

/// A decode scenario: a cache, a prefill of `prefill` tokens per sequence into `layer`, then
/// `steps` decode steps of one token each (or chunks of [`CHUNK_TOKENS`]), each attending its
/// new tokens' queries.
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

/// kvq's SplitMix64 with Box–Muller normals: small, seeded, reproducible.
struct Rng(SplitMix64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
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

/// Builds a [`ReplayPlan`] for `sc` from a real [`KvCache`] on `ctx`'s device: the cache's
/// pipelines, bind groups and dispatches as its recording functions emit them, the initial
/// buffer contents as read back from that device, and the expected outputs from kvq's CPU
/// references (codec encode/decode, f64 attention). Nothing is dispatched on `ctx`.
/// Natively only (it waits for the read-backs); in a browser, [`replay_plan_async`].
#[cfg(not(target_arch = "wasm32"))]
pub fn replay_plan(ctx: &GpuContext, sc: &Scenario, target: Target) -> Result<ReplayPlan> {
    pollster::block_on(replay_plan_async(ctx, sc, target))
}

/// [`replay_plan`] without blocking (for a browser; natively it waits in place).
pub async fn replay_plan_async(
    ctx: &GpuContext,
    sc: &Scenario,
    target: Target,
) -> Result<ReplayPlan> {
    let total = check_scenario(sc)?;
    let s = &sc.spec;
    let mut cache = KvCache::new(ctx, s.clone())?;
    let cfg = cache.kernel_config().clone();
    let PlanModules {
        modules,
        features,
        ids: module_ids,
    } = plan_modules(&cfg, target)?;
    let mut rec = PlanRecorder::new(
        cache
            .pipelines()
            .describe()?
            .into_iter()
            .map(|(p, m, ep, t)| (p.clone(), (module_ids[&m], ep, t)))
            .collect(),
    );
    let mut inputs = Inputs::new(sc)?;
    record_prefill(ctx, &mut cache, &mut rec, sc, &mut inputs)?;
    let kref = CodecRef::new(s.codecs.k, s.head_dim, s.seed)?;
    let vref = CodecRef::new(s.codecs.v, s.head_dim, s.seed)?;
    let mut checks = Vec::new();
    for step in 0..sc.steps {
        let (q, out) = record_step(ctx, &mut cache, &mut rec, sc, step, &mut inputs)?;
        checks.push(PlanCheck {
            label: format!("step {step} output"),
            buffer: out,
            expected: Expected::F32 {
                values: inputs.expected_chunk(s, &q, sc.path.tokens() as usize, &kref, &vref),
                chunk: (s.q_heads * s.head_dim) as usize,
                tolerance: 1e-3,
            },
        });
    }
    if let Some(e) = rec.error.take() {
        return Err(e);
    }
    checks.push(lengths_check(&rec, sc, total)?);
    let buffers = read_buffers(ctx, &rec).await?;
    let limits = limits(&cfg, &rec, &buffers)?;
    Ok(ReplayPlan {
        name: sc.name.clone(),
        summary: summary(sc, &cache),
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
        checks,
    })
}

/// Refuses a scenario that does not fit its cache; gives its tokens per sequence.
fn check_scenario(sc: &Scenario) -> Result<u64> {
    let s = &sc.spec;
    if sc.prefill == 0 || sc.steps == 0 {
        return Err(KvqError::InvalidSpec(format!(
            "scenario '{}': prefill and steps must be at least 1",
            sc.name
        )));
    }
    let total = sc.prefill as u64 + sc.steps as u64 * sc.path.tokens() as u64;
    // (A layer with a window, the cache's or its own, never fills.)
    if sc.layer >= s.layers || (total > s.capacity as u64 && s.layer_window(sc.layer).is_none()) {
        return Err(KvqError::InvalidSpec(format!(
            "scenario '{}': layer {} of {} and {} tokens in capacity {}",
            sc.name, sc.layer, s.layers, total, s.capacity
        )));
    }
    Ok(total)
}

/// Every kernel module of a cache for a target (all are in a plan, also those no dispatch
/// uses), the WebGPU features they need, and each module's index in the list.
struct PlanModules {
    modules: Vec<PlanModule>,
    features: Vec<&'static str>,
    ids: HashMap<KernelModule, usize>,
}

fn plan_modules(cfg: &KernelConfig, target: Target) -> Result<PlanModules> {
    let mut modules = Vec::new();
    let mut features: Vec<&'static str> = Vec::new();
    let mut ids = HashMap::new();
    for m in KernelModule::all() {
        let (wgsl, f) = module_for_target(cfg, m, target)?;
        for f in f {
            if !features.contains(&f) {
                features.push(f);
            }
        }
        ids.insert(m, modules.len());
        modules.push(PlanModule {
            name: m.name(),
            wgsl,
        });
    }
    Ok(PlanModules {
        modules,
        features,
        ids,
    })
}

/// The scenario's random data, drawn in recording order, and every token's K and V per
/// sequence, `[len, kv_heads, head_dim]`, as the caller gave them.
struct Inputs {
    rng: Rng,
    batch: usize,
    row: usize,
    /// The scenario's layer's window ([`CacheSpec::layer_window`]): `None` attends every token.
    window: Option<u32>,
    /// The layer's attention: heads, scale, softcap and sink logits ([`reference::Heads`]).
    heads: reference::Heads,
    ks: Vec<Vec<f32>>,
    vs: Vec<Vec<f32>>,
}

impl Inputs {
    fn new(sc: &Scenario) -> Result<Inputs> {
        let b = sc.spec.batch as usize;
        Ok(Inputs {
            rng: Rng(SplitMix64::new(sc.seed)),
            batch: b,
            row: (sc.spec.kv_heads * sc.spec.head_dim) as usize,
            window: sc.spec.layer_window(sc.layer),
            heads: reference::Heads::for_layer(&sc.spec, sc.layer)?,
            ks: vec![Vec::new(); b],
            vs: vec![Vec::new(); b],
        })
    }

    /// K and V of `n` new tokens per sequence, `[batch, n, kv_heads, head_dim]`, kept.
    fn tokens(&mut self, n: usize) -> (Vec<f32>, Vec<f32>) {
        let len = self.batch * n * self.row;
        let (k, v) = (
            self.rng.f16_normals(len, 1.0),
            self.rng.f16_normals(len, 1.0),
        );
        for seq in 0..self.batch {
            let r = seq * n * self.row..(seq + 1) * n * self.row;
            self.ks[seq].extend_from_slice(&k[r.clone()]);
            self.vs[seq].extend_from_slice(&v[r]);
        }
        (k, v)
    }

    /// A step's queries, `[batch, n, q_heads, head_dim]`.
    fn queries(&mut self, s: &CacheSpec, n: usize) -> Vec<f32> {
        self.rng
            .f16_normals(self.batch * n * (s.q_heads * s.head_dim) as usize, 1.5)
    }

    /// What attending a step's queries `q` (`[batch, n, q_heads, head_dim]`, the last `n`
    /// tokens' queries) gives, causally: new token `i` over the tokens up to its own.
    fn expected_chunk(
        &self,
        s: &CacheSpec,
        q: &[f32],
        n: usize,
        kref: &CodecRef,
        vref: &CodecRef,
    ) -> Vec<f64> {
        let rows = (s.q_heads * s.head_dim) as usize;
        let mut want = Vec::with_capacity(q.len());
        for seq in 0..self.batch {
            for i in 0..n {
                let r = (seq * n + i) * rows;
                want.extend(self.expected_output(s, seq, &q[r..r + rows], n - 1 - i, kref, vref));
            }
        }
        want
    }

    /// What attending `q` over the tokens so far gives (f64, over the CPU reference's
    /// dequantized store; with QJL K, over the QJL score estimator as the GPU computes).
    /// (Sequence `seq`'s query heads `q`, the last `later` tokens not visible to it.)
    fn expected_output(
        &self,
        s: &CacheSpec,
        seq: usize,
        q: &[f32],
        later: usize,
        kref: &CodecRef,
        vref: &CodecRef,
    ) -> Vec<f64> {
        let (kvh, d) = (s.kv_heads as usize, s.head_dim as usize);
        let dequant = |r: &CodecRef, x: &[f32]| -> Vec<f64> {
            x.chunks(d)
                .flat_map(|row| r.decode(&r.encode(row)))
                .collect()
        };
        let qs: Vec<f64> = q.iter().map(|&x| x as f64).collect();
        // A sliding window (the layer's) attends its last `window` tokens only.
        let total = self.ks[seq].len() / (kvh * d);
        let len = total - later;
        let first = (len - len.min(self.window.unwrap_or(s.capacity) as usize)) * kvh * d;
        let end = len * kvh * d;
        let (ks, vs) = (&self.ks[seq][first..end], &self.vs[seq][first..end]);
        if s.exact.any() {
            return self.expected_exact(s, seq, &qs, len, total, kref, vref);
        }
        let (kd, vd) = (dequant(kref, ks), dequant(vref, vs));
        if s.codecs.k.qjl {
            // Scores from the QJL estimator over the encoded rows, as the GPU computes.
            let rows: Vec<Vec<u32>> = ks.chunks(d).map(|x| kref.encode(x)).collect();
            let scale = s.softmax_scale() as f64;
            self.heads
                .attend_scores(&vd, |q, h, t| {
                    scale * kref.ip_estimate(&rows[t * kvh + h], &qs[q * d..(q + 1) * d])
                })
                .out
        } else {
            self.heads.attend(&qs, &kd, &vd).out
        }
    }

    /// [`Self::expected_output`] with exact tokens ([`crate::ExactTokens`], never with a
    /// window): positions below the sink and the `recent` up to the query's own (of the
    /// `total` the sequence holds) attended as given, the others through the codecs,
    /// K less its mean over the sink where the cache removes it (the mean as the GPU takes it:
    /// an f32 sum in position order, divided) and the scores shifted back by q · mean, which
    /// leaves the softmax as it is.
    #[allow(clippy::too_many_arguments)]
    fn expected_exact(
        &self,
        s: &CacheSpec,
        seq: usize,
        qs: &[f64],
        len: usize,
        total: usize,
        kref: &CodecRef,
        vref: &CodecRef,
    ) -> Vec<f64> {
        let (kvh, d) = (s.kv_heads as usize, s.head_dim as usize);
        let sink = s.exact.sink as usize;
        let ring_lo = sink
            .max(len.saturating_sub(s.exact.recent as usize))
            .min(len);
        let exact = |t: usize| t < sink || t >= ring_lo;
        let (ks, vs) = (&self.ks[seq], &self.vs[seq]);
        let mut mean = vec![0.0f32; kvh * d];
        if s.exact.k_mean && total >= sink {
            for (i, m) in mean.iter_mut().enumerate() {
                *m = (0..sink).fold(0.0f32, |a, p| a + ks[p * kvh * d + i]) / sink as f32;
            }
        }
        let mut kd = Vec::with_capacity(len * kvh * d);
        let mut vd = Vec::with_capacity(len * kvh * d);
        let mut rows = Vec::with_capacity(len * kvh);
        for t in 0..len {
            for h in 0..kvh {
                let at = (t * kvh + h) * d..(t * kvh + h + 1) * d;
                let mu = &mean[h * d..(h + 1) * d];
                if exact(t) {
                    kd.extend(ks[at.clone()].iter().map(|&x| x as f64));
                    vd.extend(vs[at].iter().map(|&x| x as f64));
                    rows.push(Vec::new());
                } else {
                    let x: Vec<f32> = ks[at.clone()].iter().zip(mu).map(|(k, m)| k - m).collect();
                    let row = kref.encode(&x);
                    kd.extend(kref.decode(&row).iter().zip(mu).map(|(y, &m)| y + m as f64));
                    vd.extend(vref.decode(&vref.encode(&vs[at])));
                    rows.push(row);
                }
            }
        }
        let scale = s.softmax_scale() as f64;
        let out = self.heads.attend_scores(&vd, |q, h, t| {
            let qv = &qs[q * d..(q + 1) * d];
            if s.codecs.k.qjl && !exact(t) {
                let qm: f64 = qv
                    .iter()
                    .zip(&mean[h * d..(h + 1) * d])
                    .map(|(a, &b)| a * b as f64)
                    .sum();
                return scale * (kref.ip_estimate(&rows[t * kvh + h], qv) + qm);
            }
            let kr = &kd[(t * kvh + h) * d..(t * kvh + h + 1) * d];
            scale * qv.iter().zip(kr).map(|(a, b)| a * b).sum::<f64>()
        });
        out.out
    }
}

/// A storage buffer of the caller's holding `data` (zero-padded to a multiple of 4 bytes).
fn caller_buffer(ctx: &GpuContext, data: &[u8]) -> wgpu::Buffer {
    let buf = ctx.device.create_buffer(&wgpu::BufferDescriptor {
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
}

/// Records the prefill: one append of `sc.prefill` tokens per sequence.
fn record_prefill(
    ctx: &GpuContext,
    cache: &mut KvCache,
    rec: &mut PlanRecorder,
    sc: &Scenario,
    inputs: &mut Inputs,
) -> Result<()> {
    let (k, v) = inputs.tokens(sc.prefill as usize);
    let (kb, vb) = (
        caller_buffer(ctx, &input_bytes(&k, sc.prefill_input)),
        caller_buffer(ctx, &input_bytes(&v, sc.prefill_input)),
    );
    rec.caller("prefill K input".into(), &kb);
    rec.caller("prefill V input".into(), &vb);
    let input = cache.append_input(&kb, &vb, sc.prefill, sc.prefill_input)?;
    rec.begin(format!("append {} tokens (prefill)", sc.prefill));
    cache.record_append(rec, sc.layer, &input)
}

/// Records decode step `step` on `sc.path`; gives its queries and its output buffer's index.
fn record_step(
    ctx: &GpuContext,
    cache: &mut KvCache,
    rec: &mut PlanRecorder,
    sc: &Scenario,
    step: u32,
    inputs: &mut Inputs,
) -> Result<(Vec<f32>, usize)> {
    let n = sc.path.tokens();
    let (k, v) = inputs.tokens(n as usize);
    let q = inputs.queries(&sc.spec, n as usize);
    let (kb, vb) = (
        caller_buffer(ctx, &input_bytes(&k, sc.step_input)),
        caller_buffer(ctx, &input_bytes(&v, sc.step_input)),
    );
    let qb = caller_buffer(ctx, bytemuck::cast_slice(&q));
    // Poisoned: a kernel that skips a write cannot pass.
    let ob = caller_buffer(ctx, bytemuck::cast_slice(&vec![f32::NAN; q.len()]));
    rec.caller(format!("step {step} K input"), &kb);
    rec.caller(format!("step {step} V input"), &vb);
    rec.caller(format!("step {step} query"), &qb);
    let out = rec.caller(format!("step {step} output"), &ob);
    match sc.path {
        StepPath::Separate => {
            let input = cache.append_input(&kb, &vb, 1, sc.step_input)?;
            let io = cache.attend_io(&qb, &ob)?;
            rec.begin(format!("step {step}: append"));
            cache.record_append(rec, sc.layer, &input)?;
            rec.begin(format!("step {step}: attend"));
            cache.record_attend(rec, sc.layer, &io)?;
        }
        StepPath::Fused => {
            let io = cache.step_io(&kb, &vb, 1, sc.step_input, &qb, &ob)?;
            rec.begin(format!("step {step}: fused step"));
            cache.record_step(rec, sc.layer, &io)?;
        }
        StepPath::Chunk => {
            let io = cache.chunk_io(&kb, &vb, n, sc.step_input, &qb, &ob)?;
            rec.begin(format!("step {step}: chunk of {n} tokens"));
            cache.record_chunk(rec, sc.layer, &io)?;
        }
    }
    Ok((q, out))
}

/// Lengths then overflow flags: the scenario's layer holds every token, the others none.
fn lengths_check(rec: &PlanRecorder, sc: &Scenario, total: u64) -> Result<PlanCheck> {
    let s = &sc.spec;
    let lens_id = rec
        .buffers
        .iter()
        .position(|(name, _)| name == "lengths 0")
        .ok_or_else(|| KvqError::Other("replay plan: no lengths buffer was bound".into()))?;
    let mut lens = vec![0u32; 2 * (s.layers * s.batch) as usize];
    for seq in 0..s.batch {
        lens[(sc.layer * s.batch + seq) as usize] = total as u32;
    }
    Ok(PlanCheck {
        label: "lengths and overflow flags".into(),
        buffer: lens_id,
        expected: Expected::U32(lens),
    })
}

/// Every recorded buffer with its initial bytes, read back from `ctx`'s device.
async fn read_buffers(ctx: &GpuContext, rec: &PlanRecorder) -> Result<Vec<PlanBuffer>> {
    let mut buffers = Vec::with_capacity(rec.buffers.len());
    for (name, buf) in &rec.buffers {
        if !buf.usage().contains(wgpu::BufferUsages::COPY_SRC) {
            return Err(KvqError::Other(format!(
                "replay plan: buffer '{name}' lacks COPY_SRC, its initial bytes cannot be read"
            )));
        }
        let bytes = ctx.read_back_async(buf, 0, buf.size()).await?;
        let zero = bytes.iter().all(|&x| x == 0);
        buffers.push(PlanBuffer {
            name: name.clone(),
            size: buf.size(),
            usage: buf.usage(),
            init: (!zero).then_some(bytes),
        });
    }
    Ok(buffers)
}

/// The WebGPU limits (WebGPU's names, minimum values) the recorded plan needs.
fn limits(
    cfg: &KernelConfig,
    rec: &PlanRecorder,
    buffers: &[PlanBuffer],
) -> Result<Vec<(&'static str, u64)>> {
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
    // The prefill kernel's tiles where the plan dispatches it.
    let prefill = rec.pipelines.iter().any(|p| p.entry_point == "prefill");
    let wg_bytes = match prefill {
        true => cfg
            .split_workgroup_bytes()?
            .max(cfg.prefill_workgroup_bytes()?),
        false => cfg.split_workgroup_bytes()?,
    };
    Ok(vec![
        ("maxComputeWorkgroupStorageSize", wg_bytes as u64),
        ("maxStorageBuffersPerShaderStage", max_storage),
        ("maxStorageBufferBindingSize", max_buffer),
        ("maxBufferSize", max_buffer),
        ("maxComputeWorkgroupsPerDimension", max_groups as u64),
        (
            "maxComputeInvocationsPerWorkgroup",
            cfg.workgroup.max(256) as u64,
        ),
        ("maxComputeWorkgroupSizeX", cfg.workgroup.max(256) as u64),
    ])
}

/// One-line summary of the scenario (shape, codecs, lengths, path).
fn summary(sc: &Scenario, cache: &KvCache) -> String {
    let s = &sc.spec;
    let x = s.exact;
    let exact = match (x.any(), x.k_mean) {
        (false, _) => String::new(),
        (true, false) => format!(", exact tokens {} + {}", x.sink, x.recent),
        (true, true) => format!(", exact tokens {} + {}, K's mean", x.sink, x.recent),
    };
    format!(
        "K {} V {}{exact}, head_dim {}, {} q heads / {} kv heads (GQA {}), batch {}, {} segment(s) x {} split(s), layer {} of {}, prefill {} ({}) + {} steps ({}, {})",
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
            StepPath::Chunk => "chunks of 3 tokens",
        }
    )
}
