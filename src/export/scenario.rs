//! A decode [`Scenario`] and [`replay_plan`], which records one from a real cache into a
//! [`ReplayPlan`] with the outputs kvq's CPU reference expects.

use std::collections::HashMap;

use super::plan::{Expected, PlanBuffer, PlanCheck, PlanModule, ReplayPlan};
use super::record::PlanRecorder;
use super::wgsl::{BindingKind, Target, module_for_target};
use crate::cache::KvCache;
use crate::codec::CodecRef;
use crate::context::GpuContext;
use crate::error::{KvqError, Result};
use crate::kernels::{InputType, KernelModule};
use crate::reference;
use crate::spec::CacheSpec;

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
    let mut rec = PlanRecorder::new(pipes);

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
