//! Decode sweep: measures the adapter's read bandwidth once, then for each (codec, context)
//! fills a cache to the context and times decode steps (append + attend for every layer, one
//! submit per step; the step time is the host clock around submit + wait, the recording is
//! timed on its own; on a GPU the wait spins on the queue, as CUDA's default synchronize does,
//! unless `--wait block`). Prints a progress bar (stderr, on a terminal; plain lines
//! otherwise), a table (stdout), each codec's device memory by part, and writes a CSV and an
//! SVG plot.
//!
//! `cargo run --release --example sweep -- --model qwen3-8b --ctx 1024,4096,32768 --codecs all
//! --csv out.csv --plot out.svg`. On a CPU adapter with no --model/--ctx given it picks small
//! sizes by itself so the default command finishes in seconds. `--replot FILE.csv --plot
//! FILE.svg` plots an earlier sweep's CSV again without measuring (or needing a GPU); its
//! title names the CSV file where a sweep's names the device.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvq::memory::fmt_bytes;
use kvq::{CacheSpec, GpuContext, InputType, KvCache, KvCodecs, KvqError, MemoryReport};

#[path = "../shared/codec_list.rs"]
mod codec_list;
#[path = "../shared/models.rs"]
mod models;
use codec_list::split_codecs;
use models::{MODELS, Model};

const USAGE: &str =
    "usage: sweep [--model llama3-8b|qwen3-8b|qwen2.5-7b|llama3-70b|tiny] [--ctx 4096,32768] [--codecs none,...|all]
             [--batch B] [--steps N] [--warmup N] [--busy MS] [--splits N] [--wg 64|128|256] [--unfused] [--shader-checks]
             [--wait spin|block] [--csv FILE] [--plot FILE.svg] [--mem-budget GIB]
       sweep --replot FILE.csv --plot FILE.svg   (plot a sweep CSV again, no GPU needed)";

/// How the host waits for a step's commands to finish.
#[derive(Clone, Copy, PartialEq)]
enum Wait {
    /// Poll the device without blocking until the submission is done (CUDA's default
    /// synchronize spins like this while a core is free; the anchor is timed that way).
    Spin,
    /// Block in the driver (`PollType::Wait`): frees the core, costs a wake-up.
    Block,
}

impl Wait {
    fn name(self) -> &'static str {
        match self {
            Wait::Spin => "spin",
            Wait::Block => "block",
        }
    }
}

struct Args {
    model: Option<String>,
    ctx: Option<Vec<u32>>,
    codecs: Vec<String>,
    /// Sequences decoded together, each at the point's context.
    batch: u32,
    steps: Option<usize>,
    warmup: usize,
    /// Milliseconds of back-to-back attends before each point's warm-up (None: 300 on a GPU).
    busy_ms: Option<u32>,
    splits: Option<u32>,
    wg: Option<u32>,
    /// `--shader-checks`: compile with all of wgpu's shader runtime checks (loop bounding too).
    shader_checks: bool,
    unfused: bool,
    /// `--wait`; None: see [`Args::wait_on`].
    wait: Option<Wait>,
    csv: Option<String>,
    plot: Option<String>,
    /// A sweep CSV to plot again (with `--plot`) instead of measuring.
    replot: Option<String>,
    mem_budget: Option<f64>,
}

impl Args {
    /// How to wait for a step on `ctx`: as asked, else spin on a GPU and block on a CPU
    /// adapter (whose worker threads need the cores).
    fn wait_on(&self, ctx: &GpuContext) -> Wait {
        self.wait.unwrap_or(if ctx.is_cpu() {
            Wait::Block
        } else {
            Wait::Spin
        })
    }
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        model: None,
        ctx: None,
        codecs: vec!["none".into()],
        batch: 1,
        steps: None,
        warmup: 5,
        busy_ms: None,
        splits: None,
        wg: None,
        shader_checks: false,
        unfused: false,
        wait: None,
        csv: None,
        plot: None,
        replot: None,
        mem_budget: None,
    };
    let mut it = std::env::args().skip(1);
    // Flags that measure (all but --plot and --replot): --replot takes none of them.
    let mut measuring = Vec::new();
    while let Some(flag) = it.next() {
        if flag != "--plot" && flag != "--replot" {
            measuring.push(flag.clone());
        }
        if flag == "--unfused" {
            a.unfused = true;
            continue;
        }
        if flag == "--shader-checks" {
            a.shader_checks = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let val = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| {
            v.trim()
                .parse::<u32>()
                .map_err(|_| format!("{flag}: '{v}' is not a whole number"))
        };
        match flag.as_str() {
            "--model" => a.model = Some(val),
            "--ctx" => a.ctx = Some(val.split(',').map(num).collect::<Result<_, _>>()?),
            "--codecs" => a.codecs = split_codecs(&val),
            "--steps" => a.steps = Some(num(&val)? as usize),
            "--warmup" => a.warmup = num(&val)? as usize,
            "--busy" => a.busy_ms = Some(num(&val)?),
            "--splits" => a.splits = Some(num(&val)?),
            "--batch" => {
                a.batch = num(&val)?;
                if a.batch == 0 {
                    return Err("--batch must be at least 1".into());
                }
            }
            "--wg" => a.wg = Some(num(&val)?),
            "--wait" => {
                a.wait = match val.as_str() {
                    "spin" => Some(Wait::Spin),
                    "block" => Some(Wait::Block),
                    _ => return Err(format!("--wait: '{val}' is not spin or block")),
                }
            }
            "--csv" => a.csv = Some(val),
            "--plot" => a.plot = Some(val),
            "--replot" => a.replot = Some(val),
            "--mem-budget" => {
                let gib: f64 = val
                    .trim()
                    .parse()
                    .map_err(|_| format!("--mem-budget: '{val}' is not a number of GiB"))?;
                a.mem_budget = Some(gib);
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.replot.is_some() {
        if let Some(f) = measuring.first() {
            return Err(format!("--replot takes only --plot, not {f}"));
        }
        if a.plot.is_none() {
            return Err("--replot needs --plot FILE.svg".into());
        }
    }
    Ok(a)
}

/// One measured (codec, ctx) point.
struct Row {
    codec: String,
    ctx: u32,
    layers: u32,
    /// Host time around submit + wait: the step's commands are recorded beforehand, as an
    /// engine records the next step while the GPU runs the current one (and as the CUDA-graph
    /// anchor replays a recording).
    step_ms: f64,
    /// Host time to record the step's commands (not in step_ms).
    record_ms: f64,
    /// record + submit + wait: the step with nothing overlapped.
    wall_ms: f64,
    gpu_ms: Option<f64>,
    bytes: u64,
    bits_k: f64,
    bits_v: f64,
    host_bytes: f64,
    dispatches: f64,
    /// The cache's device memory by part.
    mem: MemoryReport,
    /// Decode splits per KV head the cache used.
    splits: u32,
    /// Sequences per step.
    batch: u32,
}

impl Row {
    /// Attention tokens per second: one per sequence per step.
    fn tok_s(&self) -> f64 {
        self.batch as f64 * 1e3 / self.step_ms
    }
}

/// Why a point has no row.
enum Skip {
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

/// Each step's two timestamps resolve to their own aligned slot.
const RESOLVE_STRIDE: u64 = wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        // SplitMix64 -> approximately normal (sum of 4 uniforms, variance 1).
        let mut s = 0.0;
        for _ in 0..4 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            s += (z >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        }
        s * 3f32.sqrt()
    }
    fn halves(&mut self, n: usize) -> Vec<u16> {
        (0..n)
            .map(|_| half::f16::from_f32(self.next()).to_bits())
            .collect()
    }
}

fn storage(ctx: &GpuContext, data: &[u16]) -> wgpu::Buffer {
    use wgpu::util::DeviceExt;
    ctx.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("sweep input"),
            contents: bytemuck::cast_slice(data),
            usage: wgpu::BufferUsages::STORAGE,
        })
}

/// Submits `cmd` and returns once the GPU has finished it.
fn submit_and_wait(
    ctx: &GpuContext,
    cmd: wgpu::CommandBuffer,
    wait: Wait,
) -> Result<(), wgpu::PollError> {
    match wait {
        Wait::Block => {
            let idx = ctx.queue.submit([cmd]);
            ctx.device.poll(wgpu::PollType::Wait {
                submission_index: Some(idx),
                timeout: None,
            })?;
        }
        Wait::Spin => {
            let done = Arc::new(AtomicBool::new(false));
            let flag = done.clone();
            ctx.queue.submit([cmd]);
            ctx.queue
                .on_submitted_work_done(move || flag.store(true, Ordering::Release));
            while !done.load(Ordering::Acquire) {
                ctx.device.poll(wgpu::PollType::Poll)?;
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_point(
    ctx: &GpuContext,
    m: &Model,
    codecs: KvCodecs,
    name: &str,
    context: u32,
    args: &Args,
    steps: usize,
    progress: &Progress,
) -> Result<Row, Skip> {
    let mut spec = CacheSpec::new(
        m.layers,
        m.q_heads,
        m.kv_heads,
        m.head_dim,
        context + (args.warmup + steps) as u32 + 1,
    )
    .with_codecs(codecs)
    .with_batch(args.batch);
    spec.splits = args.splits;
    spec.workgroup = args.wg;
    progress.status(format!("{name} ctx {context}: allocating"));
    let mut cache = KvCache::new(ctx, spec).map_err(|e| Skip::Skipped(e.to_string()))?;
    progress.status(format!("{name} ctx {context}: filling"));
    let mut rng = Rng(context as u64 * 31 + m.layers as u64);

    // Fill to `context` from a few random chunks (never zeros), uploaded once.
    let chunk = 256u32.min(context.max(1));
    // One token of every sequence: inputs are [batch, n, kv_heads, head_dim].
    let per_tok = (args.batch * m.kv_heads * m.head_dim) as usize;
    let chunks: Vec<_> = (0..4)
        .map(|_| {
            let k = storage(ctx, &rng.halves(chunk as usize * per_tok));
            let v = storage(ctx, &rng.halves(chunk as usize * per_tok));
            (k, v)
        })
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
            progress.status(format!("{name} ctx {context}: filling {filled}/{context}"));
        }
        i += 1;
    }
    let rest = context - filled;
    if rest > 0 {
        let k = storage(ctx, &rng.halves(rest as usize * per_tok));
        let v = storage(ctx, &rng.halves(rest as usize * per_tok));
        let input = cache.append_input(&k, &v, rest, InputType::F16)?;
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        for layer in 0..m.layers {
            cache.append(&mut enc, layer, &input)?;
        }
        ctx.queue.submit([enc.finish()]);
    }
    ctx.device.poll(wgpu::PollType::wait_indefinitely())?;

    // Per-step inputs: one new token's K/V per layer (distinct buffers), a query and an output.
    let step_kv: Vec<_> = (0..m.layers)
        .map(|_| {
            (
                storage(ctx, &rng.halves(per_tok)),
                storage(ctx, &rng.halves(per_tok)),
            )
        })
        .collect();
    let qn = (args.batch * m.q_heads * m.head_dim) as usize;
    let q: Vec<f32> = (0..qn).map(|_| rng.next()).collect();
    let qb = {
        use wgpu::util::DeviceExt;
        ctx.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("q"),
                contents: bytemuck::cast_slice(&q),
                usage: wgpu::BufferUsages::STORAGE,
            })
    };
    let ob = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("out"),
        size: qn as u64 * 4,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let io = cache.attend_io(&qb, &ob)?;
    // Per layer: the fused step's bindings, and the separate append's (for --unfused).
    let step_io: Vec<_> = step_kv
        .iter()
        .map(|(k, v)| cache.step_io(k, v, 1, InputType::F16, &qb, &ob))
        .collect::<Result<_, _>>()?;
    let step_in: Vec<_> = step_kv
        .iter()
        .map(|(k, v)| cache.append_input(k, v, 1, InputType::F16))
        .collect::<Result<_, _>>()?;

    // GPUs lower their clocks while mostly idle (measured on the H200: 540-1170 MHz instead of
    // 1980 between points, and short steps leave the GPU idle a third of the time), which made
    // whole 1k-4k points 1.5-6x slow. Attends back to back (they change no length) bring the
    // clocks up before the warm-up steps, as a model's other layers would in an engine.
    let busy = args.busy_ms.unwrap_or(if ctx.is_cpu() { 0 } else { 300 });
    if busy > 0 {
        progress.status(format!("{name} ctx {context}: raising clocks"));
        let t0 = Instant::now();
        let mut n = 0u32;
        while t0.elapsed() < Duration::from_millis(busy as u64) {
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for layer in 0..m.layers {
                    cache.attend_in_pass(&mut pass, layer, &io)?;
                }
            }
            let idx = ctx.queue.submit([enc.finish()]);
            n += 1;
            // A few submissions in flight keep the GPU busy without an unbounded queue.
            if n.is_multiple_of(4) {
                ctx.device.poll(wgpu::PollType::Wait {
                    submission_index: Some(idx),
                    timeout: None,
                })?;
            }
        }
        ctx.device.poll(wgpu::PollType::wait_indefinitely())?;
    }

    let ts = ctx.capabilities().timestamps;
    let total = args.warmup + steps;
    let qset = ts.then(|| {
        ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: None,
            ty: wgpu::QueryType::Timestamp,
            count: 2 * total as u32,
        })
    });
    let qbuf = ts.then(|| {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: RESOLVE_STRIDE * total as u64,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    });

    let mut host_ms = Vec::new();
    let mut record_ms = Vec::new();
    let mut wall_ms = Vec::new();
    let mut before = ctx.stats();
    for s in 0..total {
        // Outside the timed part of the step.
        progress.status(format!("{name} ctx {context}: step {}/{total}", s + 1));
        if s == args.warmup {
            before = ctx.stats();
        }
        let t0 = Instant::now();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        {
            let tw = qset.as_ref().map(|qs| wgpu::ComputePassTimestampWrites {
                query_set: qs,
                beginning_of_pass_write_index: Some(2 * s as u32),
                end_of_pass_write_index: Some(2 * s as u32 + 1),
            });
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("decode step"),
                timestamp_writes: tw,
            });
            for layer in 0..m.layers {
                let l = layer as usize;
                if args.unfused {
                    cache.append_in_pass(&mut pass, layer, &step_in[l])?;
                    cache.attend_in_pass(&mut pass, layer, &io)?;
                } else {
                    cache.step_in_pass(&mut pass, layer, &step_io[l])?;
                }
            }
        }
        if let (Some(qs), Some(qb)) = (&qset, &qbuf) {
            enc.resolve_query_set(
                qs,
                2 * s as u32..2 * s as u32 + 2,
                qb,
                RESOLVE_STRIDE * s as u64,
            );
        }
        let cmd = enc.finish();
        let recorded = t0.elapsed();
        let t_submit = Instant::now();
        submit_and_wait(ctx, cmd, args.wait_on(ctx))?;
        if s >= args.warmup {
            host_ms.push(t_submit.elapsed().as_secs_f64() * 1e3);
            record_ms.push(recorded.as_secs_f64() * 1e3);
            wall_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    let d = ctx.stats() - before;
    let gpu_ms = match &qbuf {
        Some(qb) => Some(median(&mut read_timestamps(ctx, qb, args.warmup..total)?)),
        None => None,
    };
    let l = cache.layout();
    // Bytes a step must read: every stored row of every layer at the mid-run length.
    let len = context as u64 + (args.warmup + steps / 2) as u64;
    let bytes = args.batch as u64
        * m.layers as u64
        * m.kv_heads as u64
        * len
        * (l.k_row_bytes + l.v_row_bytes);
    Ok(Row {
        codec: name.to_string(),
        ctx: context,
        layers: m.layers,
        step_ms: median(&mut host_ms),
        record_ms: median(&mut record_ms),
        wall_ms: median(&mut wall_ms),
        gpu_ms,
        bytes,
        bits_k: codecs.k.bits_per_value(m.head_dim),
        bits_v: codecs.v.bits_per_value(m.head_dim),
        host_bytes: (d.bytes_uploaded + d.bytes_downloaded) as f64 / steps as f64,
        dispatches: d.dispatches as f64 / steps as f64,
        mem: cache.memory(),
        splits: l.splits,
        batch: args.batch,
    })
}

impl From<wgpu::PollError> for Skip {
    fn from(e: wgpu::PollError) -> Skip {
        Skip::Failed(e.to_string())
    }
}

/// Progress on stderr: a bar on a terminal; where stderr is a file or a pipe (a remote run's
/// log), one plain line per finished point instead, and no control characters.
struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    fn new(points: usize) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(
                Some(points as u64),
                ProgressDrawTarget::stderr_with_hz(10),
            );
            let style = ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} points  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress { bar }
    }

    /// A line that stays (above the bar on a terminal).
    fn line(&self, msg: impl AsRef<str>) {
        match &self.bar {
            Some(b) => b.println(msg),
            None => eprintln!("{}", msg.as_ref()),
        }
    }

    /// What is running now (the bar's message; nothing without a bar).
    fn status(&self, msg: String) {
        if let Some(b) = &self.bar {
            b.set_message(msg);
        }
    }

    fn point_done(&self) {
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }

    /// Removes the bar before the table goes to stdout.
    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// The adapter's measured streaming read bandwidth: the reference `bw_fraction` is taken of.
struct PeakBandwidth {
    gbps: f64,
    bytes: u64,
    /// How it was timed.
    how: &'static str,
}

const READ_KERNEL: &str = r#"
@group(0) @binding(0) var<storage, read_write> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> sink: array<u32>;

// Fills the buffer with hashed words (no zeros: nothing to compress or skip).
@compute @workgroup_size(256)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = arrayLength(&src);
    for (var i = gid.x; i < n; i += nwg.x * 256u) {
        let h = (i ^ 0x9e3779b9u) * 0x85ebca6bu;
        src[i] = vec4<u32>(h, h ^ 0xdeadbeefu, h * 3u + 1u, ~h);
    }
}

// Reads every 16-byte element once, four independent loads in flight per invocation; the
// XOR of everything decides a store that never happens, so no load can be dropped.
@compute @workgroup_size(256)
fn read(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = arrayLength(&src);
    let stride = nwg.x * 256u;
    var a = vec4<u32>(0u);
    var b = vec4<u32>(0u);
    var c = vec4<u32>(0u);
    var d = vec4<u32>(0u);
    var i = gid.x;
    for (; i + 3u * stride < n; i += 4u * stride) {
        a ^= src[i];
        b ^= src[i + stride];
        c ^= src[i + 2u * stride];
        d ^= src[i + 3u * stride];
    }
    for (; i < n; i += stride) {
        a ^= src[i];
    }
    let x = a ^ b ^ c ^ d;
    if (x.x ^ x.y ^ x.z ^ x.w) == 0x7fffffffu && x.x == 0x1234567u {
        sink[0] = x.x;
    }
}
"#;

/// Times [`READ_KERNEL`] over one large buffer (1 GiB on a GPU, 64 MiB on a CPU adapter; at
/// most one storage binding): GPU timestamps where the device has them, else the host clock
/// around submit + wait. Median of several runs after a warm-up.
fn measure_read_bandwidth(ctx: &GpuContext) -> Result<PeakBandwidth, String> {
    let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let r = time_read_kernel(ctx);
    match pollster::block_on(scope.pop()) {
        Some(e) => Err(e.to_string()),
        None => r,
    }
}

fn time_read_kernel(ctx: &GpuContext) -> Result<PeakBandwidth, String> {
    let dev = &ctx.device;
    let limits = dev.limits();
    let want: u64 = if ctx.is_cpu() { 64 << 20 } else { 1 << 30 };
    let bytes = want
        .min(limits.max_storage_buffer_binding_size)
        .min(limits.max_buffer_size)
        / 16
        * 16;
    let scope = dev.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let src = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("sweep bandwidth src"),
        size: bytes,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let sink = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("sweep bandwidth sink"),
        size: 16,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(format!("cannot allocate {}: {e}", fmt_bytes(bytes)));
    }
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("sweep bandwidth"),
        source: wgpu::ShaderSource::Wgsl(READ_KERNEL.into()),
    });
    let entry = |binding| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only: false },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    };
    let bgl = dev.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: None,
        entries: &[entry(0), entry(1)],
    });
    let layout = dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: None,
        bind_group_layouts: &[Some(&bgl)],
        immediate_size: 0,
    });
    let pipe = |entry: &str| {
        dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: Some(&layout),
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        })
    };
    let (fill, read) = (pipe("fill"), pipe("read"));
    let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &bgl,
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: src.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: sink.as_entire_binding(),
            },
        ],
    });
    // Each invocation reads at least 16 elements; as many workgroups as the device allows.
    let groups = (bytes / 16)
        .div_ceil(256 * 16)
        .clamp(1, limits.max_compute_workgroups_per_dimension as u64) as u32;
    let (warmup, runs): (usize, usize) = if ctx.is_cpu() { (1, 3) } else { (3, 10) };
    let ts = ctx.capabilities().timestamps;
    let qset = ts.then(|| {
        dev.create_query_set(&wgpu::QuerySetDescriptor {
            label: None,
            ty: wgpu::QueryType::Timestamp,
            count: 2 * runs as u32,
        })
    });
    let qbuf = ts.then(|| {
        dev.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: RESOLVE_STRIDE * runs as u64,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    });
    let wait = |idx| {
        dev.poll(wgpu::PollType::Wait {
            submission_index: Some(idx),
            timeout: None,
        })
        .map_err(|e| e.to_string())
    };
    let mut enc = dev.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&fill);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(groups, 1, 1);
    }
    wait(ctx.queue.submit([enc.finish()]))?;
    let mut host_ms = Vec::new();
    for r in 0..warmup + runs {
        let t0 = Instant::now();
        let mut enc = dev.create_command_encoder(&Default::default());
        let slot = r.checked_sub(warmup).map(|s| s as u32);
        {
            let tw = qset
                .as_ref()
                .zip(slot)
                .map(|(qs, s)| wgpu::ComputePassTimestampWrites {
                    query_set: qs,
                    beginning_of_pass_write_index: Some(2 * s),
                    end_of_pass_write_index: Some(2 * s + 1),
                });
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("sweep read bandwidth"),
                timestamp_writes: tw,
            });
            pass.set_pipeline(&read);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(groups, 1, 1);
        }
        if let (Some(qs), Some(qb), Some(s)) = (&qset, &qbuf, slot) {
            enc.resolve_query_set(qs, 2 * s..2 * s + 2, qb, RESOLVE_STRIDE * s as u64);
        }
        wait(ctx.queue.submit([enc.finish()]))?;
        if slot.is_some() {
            host_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    let (ms, how) = match &qbuf {
        Some(qb) => {
            let mut g = read_timestamps(ctx, qb, 0..runs)?;
            (median(&mut g), "GPU timestamps")
        }
        None => (median(&mut host_ms), "host clock around submit + wait"),
    };
    Ok(PeakBandwidth {
        gbps: bytes as f64 / (ms * 1e-3) / 1e9,
        bytes,
        how,
    })
}

/// Milliseconds between each pair of resolved timestamps `runs` (one pair per
/// [`RESOLVE_STRIDE`] slot) in `qb`.
fn read_timestamps(
    ctx: &GpuContext,
    qb: &wgpu::Buffer,
    runs: std::ops::Range<usize>,
) -> Result<Vec<f64>, String> {
    let rb = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: qb.size(),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(qb, 0, &rb, 0, qb.size());
    ctx.queue.submit([enc.finish()]);
    rb.map_async(wgpu::MapMode::Read, .., |_| {});
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| e.to_string())?;
    let view = rb.get_mapped_range(..).map_err(|e| format!("{e:?}"))?;
    let t: &[u64] = bytemuck::cast_slice(&view);
    let w = (RESOLVE_STRIDE / 8) as usize;
    let period = ctx.queue.get_timestamp_period() as f64;
    Ok(runs
        .map(|s| t[w * s + 1].wrapping_sub(t[w * s]) as f64 * period / 1e6)
        .collect())
}

/// Free host memory in bytes (Linux `MemAvailable`), for a CPU adapter's memory budget.
fn host_available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Bytes of K/V store a cache of this shape allocates (whole 32-token blocks), before it is
/// built: to skip a point that cannot fit without trying.
fn planned_store_bytes(m: &Model, codecs: KvCodecs, capacity: u32, batch: u32) -> u64 {
    let rows =
        batch as u64 * m.layers as u64 * m.kv_heads as u64 * capacity.next_multiple_of(32) as u64;
    rows * 4 * (codecs.k.row_words(m.head_dim) + codecs.v.row_words(m.head_dim)) as u64
}

/// Context lengths as `1k`, `32k`, `128k` (exact thousands of 1024), else the number.
fn fmt_ctx(c: u32) -> String {
    if c >= 1024 && c.is_multiple_of(1024) {
        format!("{}k", c / 1024)
    } else {
        c.to_string()
    }
}

/// One point of the plot.
struct Point {
    codec: String,
    ctx: u32,
    /// Attention tokens/s: one per sequence per step.
    tok_s: f64,
}

/// The plot's points and title from a sweep CSV (this example's header; `batch` may be absent,
/// as in CSVs older than it). The title names the CSV file where a sweep's names the device.
fn read_points(csv: &str) -> Result<(Vec<Point>, String), String> {
    let text = std::fs::read_to_string(csv).map_err(|e| e.to_string())?;
    let mut lines = text.lines();
    let first = lines.next().ok_or("empty file")?;
    let header = csv_fields(first.trim_start_matches('\u{feff}'));
    let col = |name: &str| header.iter().position(|h| h == name);
    let need = |name: &str| col(name).ok_or(format!("no '{name}' column"));
    let (codec, model, ctx, layers, step) = (
        need("codec")?,
        need("model")?,
        need("ctx")?,
        need("layers")?,
        need("step_ms")?,
    );
    let batch = col("batch");
    let mut points = Vec::new();
    let mut title = String::new();
    for (i, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let n = i + 2;
        let f = csv_fields(line);
        if f.len() != header.len() {
            return Err(format!(
                "line {n}: {} fields, the header has {}",
                f.len(),
                header.len()
            ));
        }
        let num = |c: usize| -> Result<f64, String> {
            f[c].parse::<f64>()
                .map_err(|_| format!("line {n}: '{}' is not a number", f[c]))
        };
        let (step_ms, ctx) = (num(step)?, num(ctx)?);
        let b = batch.map_or(Ok(1.0), num)?;
        let tok_s = b * 1e3 / step_ms;
        if !(step_ms > 0.0 && b >= 1.0 && tok_s.is_finite() && tok_s > 0.0) {
            return Err(format!("line {n}: step_ms or batch out of range"));
        }
        if !(1.0..=u32::MAX as f64).contains(&ctx) || ctx.fract() != 0.0 {
            return Err(format!("line {n}: ctx is not a token count"));
        }
        if title.is_empty() {
            let file = std::path::Path::new(csv)
                .file_name()
                .map_or(csv.into(), |n| n.to_string_lossy());
            title = format!(
                "kvq decode attention: {} ({} layers), from {file}",
                f[model], f[layers]
            );
        }
        points.push(Point {
            codec: f[codec].clone(),
            ctx: ctx as u32,
            tok_s,
        });
    }
    Ok((points, title))
}

/// A CSV field as the sweep writes it: quoted (`"` doubled inside) where it holds a comma or a
/// quote, as a `k=q4,v=q8` codec name does.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The fields of one CSV line: commas outside double quotes separate them; `""` inside quotes
/// is a quote; fields are trimmed.
fn csv_fields(line: &str) -> Vec<String> {
    let (mut fields, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(ch),
        }
    }
    fields.push(cur.trim().to_string());
    fields
}

/// Attention tokens/s against context, one line per codec, log-scale axes.
fn plot(path: &str, points: &[Point], title: &str) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let mut codecs: Vec<&str> = Vec::new();
    for p in points {
        if !codecs.contains(&p.codec.as_str()) {
            codecs.push(&p.codec);
        }
    }
    let mut ctxs: Vec<u32> = points.iter().map(|p| p.ctx).collect();
    ctxs.sort_unstable();
    ctxs.dedup();
    let (Some(&c0), Some(&c1)) = (ctxs.first(), ctxs.last()) else {
        return Err("no measured points to plot".into());
    };
    let (lo, hi) = points
        .iter()
        .map(|p| p.tok_s)
        .fold((f64::MAX, 0f64), |(lo, hi), t| (lo.min(t), hi.max(t)));
    let (y0, y1) = (lo / 1.5, hi * 1.5);
    if !(y0 > 0.0 && y1.is_finite()) {
        return Err("tokens/s out of a log axis's range".into());
    }
    // Ticks at 1, 2 and 5 times each power of ten in range (a log axis alone labels only the
    // powers of ten, often just one or two).
    let mut y_ticks = Vec::new();
    for e in (y0.log10().floor() as i32)..=(y1.log10().ceil() as i32) {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(e);
            if (y0..=y1).contains(&v) {
                y_ticks.push(v);
            }
        }
    }
    let root = SVGBackend::new(path, (1120, 660)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title_area, body) = root.split_vertically(44);
    title_area.titled(title, ("sans-serif", 22))?;
    let (plot_area, legend_area) = body.split_horizontally(850);
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (c0 as f64 / 1.3..c1 as f64 * 1.3)
                .log_scale()
                .with_key_points(ctxs.iter().map(|&c| c as f64).collect()),
            (y0..y1).log_scale().with_key_points(y_ticks),
        )?;
    chart
        .configure_mesh()
        .x_desc("context (tokens, log scale)")
        .y_desc("attention tokens/s (decode steps/s, log scale)")
        .x_label_formatter(&|x| fmt_ctx(x.round() as u32))
        .y_label_formatter(&|y| {
            if *y >= 1.0 {
                format!("{y:.0}")
            } else {
                format!("{y:.2}")
            }
        })
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.12))
        .draw()?;
    // One colour per K codec (none, q8, turbo3, …); solid where V is quantized too, dashed
    // where only K is. Past the palette, colours come back with hollow markers.
    const HUES: [RGBColor; 12] = [
        RGBColor(0, 0, 0),
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        RGBColor(255, 187, 120),
    ];
    let mut families: Vec<String> = Vec::new();
    let mut legend = Vec::new();
    for name in &codecs {
        let (family, k_only) = match KvCodecs::parse(name) {
            Ok(c) => (
                c.k.name(),
                c.v == kvq::Codec::NONE && c.k != kvq::Codec::NONE,
            ),
            Err(_) => (name.to_string(), false),
        };
        let i = families
            .iter()
            .position(|f| *f == family)
            .unwrap_or_else(|| {
                families.push(family);
                families.len() - 1
            });
        let color = HUES[i % HUES.len()];
        let filled = i < HUES.len();
        let mut pts: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.codec == *name)
            .map(|p| (p.ctx as f64, p.tok_s))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let line = color.stroke_width(2);
        if k_only {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 7, 5, line))?;
        } else {
            chart.draw_series(LineSeries::new(pts.clone(), line))?;
        }
        let marker = if filled { color.filled() } else { line };
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, marker)))?;
        legend.push((name, line, marker, k_only));
    }
    // The legend in its own panel, so it never covers a line.
    let font = ("sans-serif", 15).into_font();
    legend_area.draw(&Text::new("codec (dashed: K only)", (8, 18), font.clone()))?;
    let step = (560 / legend.len().max(1) as i32).clamp(12, 24);
    for (j, (name, line, marker, k_only)) in legend.iter().enumerate() {
        let y = 46 + j as i32 * step;
        if *k_only {
            for x in [8, 22] {
                legend_area.draw(&PathElement::new(vec![(x, y), (x + 9, y)], *line))?;
            }
        } else {
            legend_area.draw(&PathElement::new(vec![(8, y), (38, y)], *line))?;
        }
        legend_area.draw(&Circle::new((23, y), 4, *marker))?;
        legend_area.draw(&Text::new(name.to_string(), (46, y - 10), font.clone()))?;
    }
    root.present()?;
    Ok(())
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("sweep: {e}\n{USAGE}");
        std::process::exit(2);
    });
    if let (Some(csv), Some(svg)) = (&args.replot, &args.plot) {
        let (points, title) = read_points(csv).unwrap_or_else(|e| {
            eprintln!("sweep: cannot replot {csv}: {e}");
            std::process::exit(1);
        });
        match plot(svg, &points, &title) {
            Ok(()) => eprintln!("wrote {svg}"),
            Err(e) => {
                eprintln!("sweep: cannot plot to {svg}: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let ctx = GpuContext::new()
        .unwrap_or_else(|e| {
            eprintln!("sweep: {e}");
            std::process::exit(1);
        })
        .with_shader_checks(args.shader_checks);
    let wait = args.wait_on(&ctx);
    let small = ctx.is_cpu() && args.model.is_none() && args.ctx.is_none();
    let model_name = args.model.clone().unwrap_or_else(|| {
        if small {
            "tiny".into()
        } else {
            "llama3-8b".into()
        }
    });
    let Some(m) = MODELS.iter().find(|m| m.name == model_name) else {
        let names: Vec<_> = MODELS.iter().map(|m| m.name).collect();
        eprintln!(
            "sweep: unknown model '{model_name}'; valid: {}",
            names.join(", ")
        );
        std::process::exit(2);
    };
    let ctxs = args.ctx.clone().unwrap_or_else(|| {
        if small {
            vec![256, 1024]
        } else {
            vec![4096, 32768]
        }
    });
    let steps = args.steps.unwrap_or(if ctx.is_cpu() { 5 } else { 50 });
    if steps == 0 {
        eprintln!("sweep: --steps must be at least 1");
        std::process::exit(2);
    }
    let names: Vec<String> = if args.codecs.iter().any(|c| c == "all") {
        KvCodecs::all_names()
    } else {
        args.codecs.clone()
    };
    let mut codecs = Vec::new();
    for n in &names {
        match KvCodecs::parse(n) {
            Ok(c) => codecs.push((n.clone(), c)),
            Err(e) => {
                eprintln!("sweep: {e}");
                std::process::exit(2);
            }
        }
    }
    eprintln!(
        "kvq sweep on '{}' ({:?}, {:?}){}: model {} ({} layers, {}/{} heads, D {}), batch {}, ctx {:?}, {} steps",
        ctx.info.name,
        ctx.info.backend,
        ctx.info.device_type,
        if small {
            " [CPU adapter: small default sizes]"
        } else {
            ""
        },
        m.name,
        m.layers,
        m.q_heads,
        m.kv_heads,
        m.head_dim,
        args.batch,
        ctxs,
        steps
    );
    // Codecs the GPU path does not serve yet: one line each, asked of the library (never a
    // list kept here).
    codecs.retain(|(name, c)| {
        let ok = kvq::kernels::gpu_supported(c.k) && kvq::kernels::gpu_supported(c.v);
        if !ok {
            eprintln!("skipped codec {name}: no GPU kernels yet (CPU reference only)");
        }
        ok
    });
    // A CPU adapter's memory is the host's: stay within half of what is free, so a big
    // context is skipped rather than pushing the machine into swap or the OOM killer. A GPU's
    // own budget is enforced by wgpu (allocations past it are typed OutOfMemory errors).
    let budget = match args.mem_budget {
        Some(gib) => Some(((gib * (1u64 << 30) as f64) as u64, "--mem-budget")),
        None if ctx.is_cpu() => host_available_bytes().map(|b| {
            (
                b / 2,
                "half the free host memory (CPU adapter); --mem-budget GIB to change",
            )
        }),
        None => None,
    };
    let peak = match measure_read_bandwidth(&ctx) {
        Ok(p) => {
            eprintln!(
                "peak bandwidth: {:.1} GB/s: a streaming read kernel over {}, {} (copy_gbps; bw_fraction is GB/s over this)",
                p.gbps,
                fmt_bytes(p.bytes),
                p.how
            );
            Some(p)
        }
        Err(e) => {
            eprintln!("peak bandwidth: not measured ({e})");
            None
        }
    };

    let mut rows: Vec<Row> = Vec::new();
    let total = codecs.len() * ctxs.len();
    let progress = Progress::new(total);
    for &c in &ctxs {
        for (name, codec) in &codecs {
            let t = Instant::now();
            let planned =
                planned_store_bytes(m, *codec, c + (args.warmup + steps) as u32 + 1, args.batch);
            let result = match budget {
                Some((b, why)) if planned > b => Err(Skip::Skipped(format!(
                    "its K/V store needs {}, over the memory budget of {} ({why})",
                    fmt_bytes(planned),
                    fmt_bytes(b)
                ))),
                _ => run_point(&ctx, m, *codec, name, c, &args, steps, &progress),
            };
            match result {
                Ok(r) => {
                    progress.line(format!(
                        "[{}/{total}] {name} ctx {c}: {:.3} ms/step, {} on the device ({:.1} s)",
                        rows.len() + 1,
                        r.step_ms,
                        fmt_bytes(r.mem.total()),
                        t.elapsed().as_secs_f64()
                    ));
                    rows.push(r);
                }
                Err(Skip::Skipped(why)) => {
                    progress.line(format!("skipped ctx={c} codec={name}: {why}"))
                }
                Err(Skip::Failed(why)) => {
                    progress.line(format!("failed ctx={c} codec={name}: {why}"))
                }
            }
            progress.point_done();
        }
    }
    progress.finish();

    let none_ms = |c: u32| {
        rows.iter()
            .find(|r| r.codec == "none" && r.ctx == c)
            .map(|r| r.step_ms)
    };
    let mut csv = String::from(
        "codec,model,ctx,layers,step_ms,gpu_ms,tok_s,gbps,bits_k,bits_v,ratio_vs_none,host_bytes_per_step,dispatches_per_step,record_ms,copy_gbps,bw_fraction,device_bytes,wall_ms,splits,wait,batch\n",
    );
    let fmt_opt =
        |v: Option<f64>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "-".into());
    println!(
        "\n{:<22} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>7} {:>5} {:>5} {:>6} {:>5} {:>10}",
        "codec",
        "ctx",
        "step_ms",
        "record_ms",
        "gpu_ms",
        "tok/s",
        "GB/s",
        "%peak",
        "vs_none",
        "bitsK",
        "bitsV",
        "host_B",
        "disp",
        "device_mem"
    );
    for r in &rows {
        let t = r.gpu_ms.unwrap_or(r.step_ms);
        let gbps = r.bytes as f64 / (t * 1e-3) / 1e9;
        let ratio = none_ms(r.ctx).map(|n| r.step_ms / n);
        let frac = peak.as_ref().map(|p| gbps / p.gbps);
        println!(
            "{:<22} {:>7} {:>9.3} {:>9.3} {:>9} {:>9.1} {:>8.1} {:>6} {:>7} {:>5.2} {:>5.2} {:>6.0} {:>5.0} {:>10}",
            r.codec,
            r.ctx,
            r.step_ms,
            r.record_ms,
            fmt_opt(r.gpu_ms, 3),
            r.tok_s(),
            gbps,
            fmt_opt(frac.map(|f| 100.0 * f), 1),
            fmt_opt(ratio, 3),
            r.bits_k,
            r.bits_v,
            r.host_bytes,
            r.dispatches,
            fmt_bytes(r.mem.total())
        );
        csv += &format!(
            "{},{},{},{},{:.4},{},{:.2},{:.1},{:.3},{:.3},{},{},{},{:.4},{},{},{},{:.4},{},{},{}\n",
            csv_field(&r.codec),
            m.name,
            r.ctx,
            r.layers,
            r.step_ms,
            fmt_opt(r.gpu_ms, 4),
            r.tok_s(),
            gbps,
            r.bits_k,
            r.bits_v,
            fmt_opt(ratio, 4),
            r.host_bytes,
            r.dispatches,
            r.record_ms,
            fmt_opt(peak.as_ref().map(|p| p.gbps), 1),
            fmt_opt(frac, 4),
            r.mem.total(),
            r.wall_ms,
            r.splits,
            wait.name(),
            r.batch
        );
    }
    println!(
        "step_ms: host clock around submit + wait ({}), the step recorded beforehand; record_ms: the recording",
        wait.name()
    );
    if let Some(p) = &peak {
        println!(
            "GB/s: K/V bytes a step must read over its GPU time (host time where untimed); %peak: that over {:.1} GB/s, the adapter's streaming read bandwidth ({})",
            p.gbps, p.how
        );
    }
    // Device memory by part: one line per codec, at the largest context it ran.
    println!("\ndevice memory by part (largest context run):");
    let mut seen: Vec<&str> = Vec::new();
    for r in rows.iter().rev() {
        if !seen.contains(&r.codec.as_str()) {
            seen.push(&r.codec);
        }
    }
    for name in seen.iter().rev() {
        if let Some(r) = rows
            .iter()
            .filter(|r| r.codec == *name)
            .max_by_key(|r| r.ctx)
        {
            println!("{:<22} ctx {:>7}: {}", r.codec, r.ctx, r.mem);
        }
    }
    if let Some(path) = &args.csv {
        match std::fs::File::create(path).and_then(|mut f| f.write_all(csv.as_bytes())) {
            Ok(()) => eprintln!("wrote {path}"),
            Err(e) => {
                eprintln!("sweep: cannot write {path}: {e}");
                std::process::exit(1);
            }
        }
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "kvq decode attention: {} ({} layers), {}",
            m.name, m.layers, ctx.info.name
        );
        let points: Vec<Point> = rows
            .iter()
            .map(|r| Point {
                codec: r.codec.clone(),
                ctx: r.ctx,
                tok_s: r.tok_s(),
            })
            .collect();
        match plot(path, &points, &title) {
            Ok(()) => eprintln!("wrote {path}"),
            Err(e) => {
                eprintln!("sweep: cannot plot to {path}: {e}");
                std::process::exit(1);
            }
        }
    }
}
