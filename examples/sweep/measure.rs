//! The timed runs: one (codec, context) point fills a cache to its context from random K/V,
//! raises the GPU's clocks, then times decode steps (append + attend for every layer, one
//! submit per step).

use std::time::{Duration, Instant};

use kvq::codec::rotation::SplitMix64;
use kvq::{CacheSpec, GpuContext, InputType, KvCache, KvCodecs, KvqError, MemoryReport};

use crate::args::Args;
use crate::models::Model;
use crate::noise::CpuTimes;
use crate::progress::Progress;
use crate::timing::{Timestamps, median, ms, submit_and_wait, wait_for};

/// One measured (codec, ctx) point.
pub struct Row {
    pub codec: String,
    pub ctx: u32,
    pub layers: u32,
    /// Host time around submit + wait: the step's commands are recorded beforehand, as an
    /// engine records the next step while the GPU runs the current one (and as the CUDA-graph
    /// anchor replays a recording).
    pub step_ms: f64,
    /// Host time to record the step's commands (not in step_ms).
    pub record_ms: f64,
    /// record + submit + wait: the step with nothing overlapped.
    pub wall_ms: f64,
    pub gpu_ms: Option<f64>,
    /// K/V bytes a step must read.
    pub bytes: u64,
    /// Attention FLOP of a step: QK and PV, 4 per query row, attended key and dimension.
    pub flop: f64,
    pub bits_k: f64,
    pub bits_v: f64,
    pub host_bytes: f64,
    pub dispatches: f64,
    /// The cache's device memory by part.
    pub mem: MemoryReport,
    /// Decode splits per KV head the cache used.
    pub splits: u32,
    /// Sequences per step.
    pub batch: u32,
    /// New tokens per sequence per step.
    pub queries: u32,
    /// The kernel that attends the step's queries: `step` (one new token: the fused step),
    /// `split` (a chunk, its split kernel) or `prefill` (a chunk, the prefill kernel).
    pub kernel: &'static str,
    /// The cache's products as the adapter resolved them (`exact` where `fast` was asked
    /// of an adapter without shader-f16).
    pub precision: kvq::Precision,
    /// The point's figure (GPU ms where timed, else step ms) in each round, in round order:
    /// the timing fields above are the medians of the rounds' medians.
    pub rounds: Vec<f64>,
    /// Per round: the share of the host's CPU time other processes used while its steps ran
    /// (None where the host does not say), for [`crate::noise::why`].
    pub others_cpu: Vec<Option<f64>>,
    /// GPU ms per kernel of one more step, each dispatch timed (`--kernel-times`; the first
    /// round's), else empty.
    pub kernel_ms: Vec<kvq::KernelTime>,
}

/// Rounds of a point whose figures spread (max - min over their median) by more than this
/// are flagged in the table and the CSV: the point cannot be told from noise.
pub const NOISY_SPREAD: f64 = 0.10;

impl Row {
    /// (max - min) / median of the round figures: 0 for one round.
    pub fn spread(&self) -> f64 {
        let mut v = self.rounds.clone();
        let mid = median(&mut v);
        let (lo, hi) = (v[0], v[v.len() - 1]);
        if mid > 0.0 { (hi - lo) / mid } else { 0.0 }
    }

    /// Whether the rounds disagree by more than [`NOISY_SPREAD`].
    pub fn noisy(&self) -> bool {
        self.spread() > NOISY_SPREAD
    }

    /// One row from the same point's rows of several rounds (in round order): every timing
    /// the median over the rounds, the rest as the first round measured it.
    pub fn merge(mut rounds: Vec<Row>) -> Row {
        let figures: Vec<f64> = rounds.iter().flat_map(|r| r.rounds.clone()).collect();
        let others: Vec<Option<f64>> = rounds.iter().flat_map(|r| r.others_cpu.clone()).collect();
        let mid = |f: &dyn Fn(&Row) -> f64| median(&mut rounds.iter().map(f).collect::<Vec<_>>());
        let step_ms = mid(&|r| r.step_ms);
        let record_ms = mid(&|r| r.record_ms);
        let wall_ms = mid(&|r| r.wall_ms);
        // GPU time only where every round has it (a device has timestamps or not).
        let gpu_ms = rounds
            .iter()
            .all(|r| r.gpu_ms.is_some())
            .then(|| mid(&|r| r.gpu_ms.unwrap_or(f64::NAN)));
        let mut row = rounds.swap_remove(0);
        row.step_ms = step_ms;
        row.record_ms = record_ms;
        row.wall_ms = wall_ms;
        row.gpu_ms = gpu_ms;
        row.rounds = figures;
        row.others_cpu = others;
        row
    }
}

impl Row {
    /// The codec as the table and the plot name the point ([`label`]).
    pub fn label(&self) -> String {
        label(&self.codec, self.queries)
    }

    /// `--kernel-times`' figures as `entry=ms (dispatches)` pairs, `;`-separated.
    pub fn kernel_times(&self) -> String {
        let t: Vec<String> = self
            .kernel_ms
            .iter()
            .map(|k| format!("{}={:.4} ({})", k.entry, k.ms, k.dispatches))
            .collect();
        t.join("; ")
    }

    pub fn tok_s(&self) -> f64 {
        tok_s((self.batch * self.queries) as f64, self.step_ms)
    }
}

/// A point's codec as the table, the progress lines and the plot name it: with ` n=N` for a
/// chunk of N new tokens per sequence.
pub fn label(codec: &str, queries: u32) -> String {
    if queries > 1 {
        format!("{codec} n={queries}")
    } else {
        codec.to_string()
    }
}

/// Attention tokens per second: `tokens` per step (a step's new tokens over all sequences;
/// for a row and for a CSV read back, so a replot shows what the sweep printed).
pub fn tok_s(tokens: f64, step_ms: f64) -> f64 {
    tokens * 1e3 / step_ms
}

/// Why a point has no row.
pub enum Skip {
    /// The point cannot run here (does not fit, or the GPU path lacks the codec): one line.
    Skipped(String),
    /// Something failed while it ran.
    Failed(String),
}

impl From<String> for Skip {
    fn from(s: String) -> Skip {
        Skip::Failed(s)
    }
}

impl From<KvqError> for Skip {
    fn from(e: KvqError) -> Skip {
        Skip::Failed(e.to_string())
    }
}

impl From<wgpu::PollError> for Skip {
    fn from(e: wgpu::PollError) -> Skip {
        Skip::Failed(e.to_string())
    }
}

/// Tokens a point's cache holds: the context, then `queries` per warm-up and timed step, and
/// one spare. The memory budget is checked against the same number the cache is built with.
/// (One step more than timed: `--kernel-times` takes it.)
pub fn capacity(context: u32, warmup: usize, steps: usize, queries: u32) -> u32 {
    context + (warmup + steps + 1) as u32 * queries + 1
}

/// Deterministic, approximately normal values: every run of a point reads the same K/V.
struct Rng(SplitMix64);

impl Rng {
    fn next(&mut self) -> f32 {
        // Approximately normal: a sum of 4 uniforms, variance 1.
        let mut s = 0.0;
        for _ in 0..4 {
            s += (self.0.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        }
        s * 3f32.sqrt()
    }

    fn halves(&mut self, n: usize) -> Vec<u16> {
        (0..n)
            .map(|_| half::f16::from_f32(self.next()).to_bits())
            .collect()
    }

    /// A K and a V storage buffer of `n` random f16 values each.
    fn kv(&mut self, ctx: &GpuContext, n: usize) -> (wgpu::Buffer, wgpu::Buffer) {
        let k = storage(ctx, "sweep input", &self.halves(n));
        let v = storage(ctx, "sweep input", &self.halves(n));
        (k, v)
    }
}

fn storage<T: bytemuck::Pod>(ctx: &GpuContext, label: &str, data: &[T]) -> wgpu::Buffer {
    use wgpu::util::DeviceExt;
    ctx.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytemuck::cast_slice(data),
            usage: wgpu::BufferUsages::STORAGE,
        })
}

/// What one point runs on and with: shared by its phases.
pub struct PointRun<'a> {
    pub ctx: &'a GpuContext,
    pub model: &'a Model,
    pub args: &'a Args,
    /// Timed steps (after `args.warmup` untimed ones).
    pub steps: usize,
    pub progress: &'a Progress,
    pub name: &'a str,
    pub codecs: KvCodecs,
    /// The cache's exact tokens (the entry's suffix, else `--exact`).
    pub exact: kvq::ExactTokens,
    pub context: u32,
    /// New tokens per sequence a step appends and attends.
    pub queries: u32,
}

/// A filled cache's per-step bindings: one new token's K/V per layer (distinct buffers), a
/// query and an output.
struct StepInputs {
    io: kvq::AttendIo,
    /// Per layer: the fused step's bindings.
    step_io: Vec<kvq::StepIo>,
    /// Per layer: the separate append's (for --unfused).
    step_in: Vec<kvq::AppendInput>,
    /// Per layer: a chunk's (for --queries above 1).
    chunk_io: Vec<kvq::ChunkIo>,
    // The buffers bound above, kept as long as their bindings.
    _kv: Vec<(wgpu::Buffer, wgpu::Buffer)>,
    _q: wgpu::Buffer,
    _out: wgpu::Buffer,
}

/// The timed steps' medians and the device's counters over them.
struct Timed {
    host_ms: f64,
    record_ms: f64,
    wall_ms: f64,
    gpu_ms: Option<f64>,
    stats: kvq::TransferStats,
    /// Other processes' share of the host's CPU over the warm-up and timed steps.
    others_cpu: Option<f64>,
}

impl PointRun<'_> {
    /// Measures the point; a cache that cannot be built is [`Skip::Skipped`].
    pub fn run(&self) -> Result<Row, Skip> {
        let (m, args) = (self.model, self.args);
        let mut spec = CacheSpec::new(
            m.layers,
            m.q_heads,
            m.kv_heads,
            m.head_dim,
            capacity(self.context, args.warmup, self.steps, self.queries),
        )
        .with_codecs(self.codecs)
        .with_batch(args.batch);
        spec.exact = self.exact;
        spec.splits = args.splits;
        spec.workgroup = args.wg;
        spec.prefill_from = args.prefill_from;
        spec.chunk_splits = args.chunk_splits;
        spec.precision = args.precision;
        let spec = m.options(spec);
        self.status("allocating");
        let mut cache = KvCache::new(self.ctx, spec).map_err(|e| Skip::Skipped(e.to_string()))?;
        self.status("filling");
        let mut rng = Rng(SplitMix64::new(self.context as u64 * 31 + m.layers as u64));
        self.fill(&mut cache, &mut rng)?;
        let inputs = self.step_inputs(&cache, &mut rng)?;
        self.raise_clocks(&cache, &inputs.io)?;
        let t = self.time_steps(&mut cache, &inputs)?;
        let kernel_ms = match args.kernel_times {
            true => self.kernel_times(&mut cache, &inputs)?,
            false => Vec::new(),
        };
        let l = cache.layout();
        // Bytes a step must read: every row each layer attends (a local layer's window) at the
        // mid-run length.
        let len = self.context as u64 + (args.warmup + self.steps / 2) as u64 * self.queries as u64;
        let rows: u64 = (0..m.layers).map(|layer| m.attended(layer, len)).sum();
        let bytes = args.batch as u64 * m.kv_heads as u64 * rows * (l.k_row_bytes + l.v_row_bytes);
        // Query i of a step's n attends len + i + 1 positions (at the mid-run length), a local
        // layer's at most its window.
        let keys: f64 = (0..m.layers)
            .map(|layer| {
                let before = m.attended(layer, len) as f64;
                let w = m.window(layer).map_or(f64::INFINITY, f64::from);
                (1..=self.queries)
                    .map(|i| (before + i as f64).min(w))
                    .sum::<f64>()
            })
            .sum();
        let flop = 2.0 * keys * (args.batch * m.q_heads * (m.head_dim + m.v_dim())) as f64;
        Ok(Row {
            codec: self.name.to_string(),
            ctx: self.context,
            layers: m.layers,
            step_ms: t.host_ms,
            record_ms: t.record_ms,
            wall_ms: t.wall_ms,
            gpu_ms: t.gpu_ms,
            bytes,
            flop,
            bits_k: self.codecs.k.bits_per_value(m.head_dim),
            bits_v: self.codecs.v.bits_per_value(m.v_dim()),
            host_bytes: (t.stats.bytes_uploaded + t.stats.bytes_downloaded) as f64
                / self.steps as f64,
            dispatches: t.stats.dispatches as f64 / self.steps as f64,
            mem: cache.memory(),
            splits: l.splits,
            batch: args.batch,
            queries: self.queries,
            precision: cache.kernel_config().precision,
            kernel: match inputs.chunk_io.first() {
                // (A matrix cache's step may be a chunk of 1: KvCache::steps_as_chunks.)
                None if cache.steps_as_chunks() => "prefill",
                None => "step",
                Some(io) if io.prefill() => "prefill",
                Some(_) => "split",
            },
            rounds: vec![t.gpu_ms.unwrap_or(t.host_ms)],
            others_cpu: vec![t.others_cpu],
            kernel_ms,
        })
    }

    /// One more step with each dispatch timed: GPU ms per kernel (the timestamps inside the
    /// pass may serialise what the timed steps overlap, so they stay out of those).
    fn kernel_times(
        &self,
        cache: &mut KvCache,
        inputs: &StepInputs,
    ) -> Result<Vec<kvq::KernelTime>, Skip> {
        let ctx = self.ctx;
        let mut timer = kvq::DispatchTimer::new(ctx, kvq::timer::MAX_TIMED_DISPATCHES)?;
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for layer in 0..self.model.layers {
                let l = layer as usize;
                if !inputs.chunk_io.is_empty() {
                    cache.chunk_in_timed_pass(&mut pass, layer, &inputs.chunk_io[l], &mut timer)?;
                } else {
                    cache.step_in_timed_pass(&mut pass, layer, &inputs.step_io[l], &mut timer)?;
                }
            }
        }
        timer.resolve(&mut enc);
        wait_for(ctx, ctx.queue.submit([enc.finish()]))?;
        if timer.dropped() > 0 {
            self.progress.line(format!(
                "{}: {} dispatches past the timer's {} untimed",
                self.name,
                timer.dropped(),
                timer.len()
            ));
        }
        Ok(timer.read(ctx)?)
    }

    /// What is running now, on the progress bar.
    fn status(&self, what: impl std::fmt::Display) {
        self.progress
            .status(format!("{} ctx {}: {what}", self.name, self.context));
    }

    /// Fills the cache to the point's context from a few random chunks (never zeros),
    /// uploaded once, then waits for the device.
    fn fill(&self, cache: &mut KvCache, rng: &mut Rng) -> Result<(), Skip> {
        let (ctx, m, context) = (self.ctx, self.model, self.context);
        let chunk = 256u32.min(context.max(1));
        let per_tok = self.per_token();
        let chunks: Vec<_> = (0..4)
            .map(|_| rng.kv(ctx, chunk as usize * per_tok))
            .collect();
        let inputs: Vec<_> = chunks
            .iter()
            .map(|(k, v)| cache.append_input(k, v, chunk, InputType::F16))
            .collect::<Result<_, _>>()?;
        let mut filled = 0;
        let mut i = 0;
        while filled + chunk <= context {
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for layer in 0..m.layers {
                    cache.append_in_pass(&mut pass, layer, &inputs[(i + layer as usize) % 4])?;
                }
            }
            ctx.queue.submit([enc.finish()]);
            filled += chunk;
            if i % 32 == 0 {
                self.status(format_args!("filling {filled}/{context}"));
            }
            i += 1;
        }
        let rest = context - filled;
        if rest > 0 {
            let (k, v) = rng.kv(ctx, rest as usize * per_tok);
            let input = cache.append_input(&k, &v, rest, InputType::F16)?;
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            for layer in 0..m.layers {
                cache.append(&mut enc, layer, &input)?;
            }
            ctx.queue.submit([enc.finish()]);
        }
        ctx.device.poll(wgpu::PollType::wait_indefinitely())?;
        Ok(())
    }

    /// Values in one token of every sequence: inputs are [batch, n, kv_heads, head_dim].
    fn per_token(&self) -> usize {
        (self.args.batch * self.model.kv_heads * self.model.head_dim) as usize
    }

    fn step_inputs(&self, cache: &KvCache, rng: &mut Rng) -> Result<StepInputs, Skip> {
        let (ctx, m) = (self.ctx, self.model);
        let step_kv: Vec<_> = (0..m.layers)
            .map(|_| rng.kv(ctx, self.per_token()))
            .collect();
        let qn = (self.args.batch * m.q_heads * m.head_dim) as usize;
        let q: Vec<f32> = (0..qn).map(|_| rng.next()).collect();
        let qb = storage(ctx, "q", &q);
        let ob = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("out"),
            size: qn as u64 * 4,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let io = cache.attend_io(&qb, &ob)?;
        let step_io = step_kv
            .iter()
            .map(|(k, v)| cache.step_io(k, v, 1, InputType::F16, &qb, &ob))
            .collect::<Result<_, _>>()?;
        let step_in = step_kv
            .iter()
            .map(|(k, v)| cache.append_input(k, v, 1, InputType::F16))
            .collect::<Result<_, _>>()?;
        // A chunk's new tokens, queries and outputs: `queries` rows of each per sequence.
        let n = self.queries;
        let mut keep = Vec::new();
        let mut chunk_io = Vec::new();
        if n > 1 {
            let chunk_q: Vec<f32> = (0..qn * n as usize).map(|_| rng.next()).collect();
            let cq = storage(ctx, "chunk q", &chunk_q);
            let co = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("chunk out"),
                size: (qn * n as usize * 4) as u64,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            });
            for _ in 0..m.layers {
                let (k, v) = rng.kv(ctx, self.per_token() * n as usize);
                chunk_io.push(cache.chunk_io(&k, &v, n, InputType::F16, &cq, &co)?);
                keep.push((k, v));
            }
            keep.push((cq, co));
        }
        keep.extend(step_kv);
        Ok(StepInputs {
            io,
            step_io,
            step_in,
            chunk_io,
            _kv: keep,
            _q: qb,
            _out: ob,
        })
    }

    /// GPUs lower their clocks while mostly idle, and short steps leave a GPU idle much of the
    /// time, which made whole short-context points several times slow (BENCHMARKS.md,
    /// "Measurement pitfalls"). Attends back to back (they change no length) bring the clocks
    /// up before the warm-up steps, as a model's other layers would in an engine.
    fn raise_clocks(&self, cache: &KvCache, io: &kvq::AttendIo) -> Result<(), Skip> {
        let ctx = self.ctx;
        let busy = self
            .args
            .busy_ms
            .unwrap_or(if ctx.is_cpu() { 0 } else { 300 });
        if busy == 0 {
            return Ok(());
        }
        self.status("raising clocks");
        let t0 = Instant::now();
        let mut n = 0u32;
        while t0.elapsed() < Duration::from_millis(busy as u64) {
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for layer in 0..self.model.layers {
                    cache.attend_in_pass(&mut pass, layer, io)?;
                }
            }
            let idx = ctx.queue.submit([enc.finish()]);
            n += 1;
            // A few submissions in flight keep the GPU busy without an unbounded queue.
            if n.is_multiple_of(4) {
                wait_for(ctx, idx)?;
            }
        }
        ctx.device.poll(wgpu::PollType::wait_indefinitely())?;
        Ok(())
    }

    /// Runs the warm-up and timed steps, each recorded before the clock around its submit +
    /// wait starts.
    fn time_steps(&self, cache: &mut KvCache, inputs: &StepInputs) -> Result<Timed, Skip> {
        let (ctx, args) = (self.ctx, self.args);
        let total = args.warmup + self.steps;
        let ts = Timestamps::new(ctx, total);
        let mut host_ms = Vec::new();
        let mut record_ms = Vec::new();
        let mut wall_ms = Vec::new();
        let mut before = ctx.stats();
        let cpu_before = CpuTimes::now();
        for s in 0..total {
            // Outside the timed part of the step.
            self.status(format_args!("step {}/{total}", s + 1));
            if s == args.warmup {
                before = ctx.stats();
            }
            let t0 = Instant::now();
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("decode step"),
                    timestamp_writes: ts.as_ref().map(|t| t.writes(s)),
                });
                for layer in 0..self.model.layers {
                    let l = layer as usize;
                    if !inputs.chunk_io.is_empty() {
                        cache.chunk_in_pass(&mut pass, layer, &inputs.chunk_io[l])?;
                    } else if args.unfused {
                        cache.append_in_pass(&mut pass, layer, &inputs.step_in[l])?;
                        cache.attend_in_pass(&mut pass, layer, &inputs.io)?;
                    } else {
                        cache.step_in_pass(&mut pass, layer, &inputs.step_io[l])?;
                    }
                }
            }
            if let Some(t) = &ts {
                t.resolve(&mut enc, s);
            }
            let cmd = enc.finish();
            let recorded = t0.elapsed();
            let t_submit = Instant::now();
            submit_and_wait(ctx, cmd, args.wait_on(ctx))?;
            if s >= args.warmup {
                host_ms.push(ms(t_submit.elapsed()));
                record_ms.push(ms(recorded));
                wall_ms.push(ms(t0.elapsed()));
            }
        }
        let stats = ctx.stats() - before;
        let others_cpu = match (cpu_before, CpuTimes::now()) {
            (Some(a), Some(b)) => b.others_since(&a),
            _ => None,
        };
        let gpu_ms = match &ts {
            Some(t) => Some(median(&mut t.read_ms(ctx, args.warmup..total)?)),
            None => None,
        };
        Ok(Timed {
            host_ms: median(&mut host_ms),
            record_ms: median(&mut record_ms),
            wall_ms: median(&mut wall_ms),
            gpu_ms,
            stats,
            others_cpu,
        })
    }
}
