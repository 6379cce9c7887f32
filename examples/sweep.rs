//! Decode sweep: for each (codec, context), fill a cache to the context, then time decode
//! steps (append + attend for every layer, one submit per step) and print a table.
//!
//! `cargo run --release --example sweep -- --model llama3-8b --ctx 4096,32768 --codecs none
//! --steps 50 --csv out.csv`. On a CPU adapter with no --model/--ctx given it picks small sizes
//! by itself so the default command finishes in under a minute.

use std::io::Write;
use std::time::Instant;

use kvq::{CacheSpec, GpuContext, InputType, KvCache, KvCodecs};

struct Model {
    name: &'static str,
    layers: u32,
    q_heads: u32,
    kv_heads: u32,
    head_dim: u32,
}

const MODELS: &[Model] = &[
    Model {
        name: "llama3-8b",
        layers: 32,
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
    },
    Model {
        name: "qwen3-8b",
        layers: 36,
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
    },
    Model {
        name: "tiny",
        layers: 4,
        q_heads: 8,
        kv_heads: 2,
        head_dim: 64,
    },
];

const USAGE: &str =
    "usage: sweep [--model llama3-8b|qwen3-8b|tiny] [--ctx 4096,32768] [--codecs none,...|all]
             [--steps N] [--warmup N] [--splits N] [--wg 64|128|256] [--unfused] [--csv FILE]";

struct Args {
    model: Option<String>,
    ctx: Option<Vec<u32>>,
    codecs: Vec<String>,
    steps: Option<usize>,
    warmup: usize,
    splits: Option<u32>,
    wg: Option<u32>,
    unfused: bool,
    csv: Option<String>,
}

/// Splits a `--codecs` list on commas, keeping `k=<codec>,v=<codec>` names whole.
fn split_codecs(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in list.split(',').map(str::trim) {
        match out.last_mut() {
            Some(prev) if part.starts_with("v=") && prev.starts_with("k=") => {
                prev.push(',');
                prev.push_str(part);
            }
            _ => out.push(part.to_string()),
        }
    }
    out
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        model: None,
        ctx: None,
        codecs: vec!["none".into()],
        steps: None,
        warmup: 5,
        splits: None,
        wg: None,
        unfused: false,
        csv: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--unfused" {
            a.unfused = true;
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
            "--splits" => a.splits = Some(num(&val)?),
            "--wg" => a.wg = Some(num(&val)?),
            "--csv" => a.csv = Some(val),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

/// One measured (codec, ctx) point.
struct Row {
    codec: String,
    ctx: u32,
    layers: u32,
    step_ms: f64,
    /// Host time to record and finish the step's commands (inside step_ms).
    record_ms: f64,
    gpu_ms: Option<f64>,
    bytes: u64,
    bits_k: f64,
    bits_v: f64,
    host_bytes: f64,
    dispatches: f64,
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

fn run_point(
    ctx: &GpuContext,
    m: &Model,
    codecs: KvCodecs,
    name: &str,
    context: u32,
    args: &Args,
    steps: usize,
) -> Result<Row, String> {
    let mut spec = CacheSpec::new(
        m.layers,
        m.q_heads,
        m.kv_heads,
        m.head_dim,
        context + (args.warmup + steps) as u32 + 1,
    )
    .with_codecs(codecs);
    spec.splits = args.splits;
    spec.workgroup = args.wg;
    let mut cache = KvCache::new(ctx, spec).map_err(|e| format!("skipped: {e}"))?;
    let mut rng = Rng(context as u64 * 31 + m.layers as u64);

    // Fill to `context` from a few random chunks (never zeros), uploaded once.
    let chunk = 256u32.min(context.max(1));
    let per_tok = (m.kv_heads * m.head_dim) as usize;
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
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut filled = 0;
    let mut i = 0;
    while filled + chunk <= context {
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for layer in 0..m.layers {
                cache
                    .append_in_pass(&mut pass, layer, &inputs[(i + layer as usize) % 4])
                    .map_err(|e| e.to_string())?;
            }
        }
        ctx.queue.submit([enc.finish()]);
        filled += chunk;
        i += 1;
    }
    let rest = context - filled;
    if rest > 0 {
        let k = storage(ctx, &rng.halves(rest as usize * per_tok));
        let v = storage(ctx, &rng.halves(rest as usize * per_tok));
        let input = cache
            .append_input(&k, &v, rest, InputType::F16)
            .map_err(|e| e.to_string())?;
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        for layer in 0..m.layers {
            cache
                .append(&mut enc, layer, &input)
                .map_err(|e| e.to_string())?;
        }
        ctx.queue.submit([enc.finish()]);
    }
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| e.to_string())?;

    // Per-step inputs: one new token's K/V per layer (distinct buffers), a query and an output.
    let step_kv: Vec<_> = (0..m.layers)
        .map(|_| {
            (
                storage(ctx, &rng.halves(per_tok)),
                storage(ctx, &rng.halves(per_tok)),
            )
        })
        .collect();
    let qn = (m.q_heads * m.head_dim) as usize;
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
    let io = cache.attend_io(&qb, &ob).map_err(|e| e.to_string())?;
    // Per layer: the fused step's bindings, and the separate append's (for --unfused).
    let step_io: Vec<_> = step_kv
        .iter()
        .map(|(k, v)| cache.step_io(k, v, 1, InputType::F16, &qb, &ob))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let step_in: Vec<_> = step_kv
        .iter()
        .map(|(k, v)| cache.append_input(k, v, 1, InputType::F16))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;

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
    let mut before = ctx.stats();
    for s in 0..total {
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
                    cache
                        .append_in_pass(&mut pass, layer, &step_in[l])
                        .map_err(|e| e.to_string())?;
                    cache
                        .attend_in_pass(&mut pass, layer, &io)
                        .map_err(|e| e.to_string())?;
                } else {
                    cache
                        .step_in_pass(&mut pass, layer, &step_io[l])
                        .map_err(|e| e.to_string())?;
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
        let idx = ctx.queue.submit([cmd]);
        ctx.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(idx),
                timeout: None,
            })
            .map_err(|e| e.to_string())?;
        if s >= args.warmup {
            host_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            record_ms.push(recorded.as_secs_f64() * 1e3);
        }
    }
    let d = ctx.stats() - before;
    let gpu_ms = match (&qbuf, ts) {
        (Some(qb), true) => {
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
            let mut g: Vec<f64> = (args.warmup..total)
                .map(|s| t[w * s + 1].wrapping_sub(t[w * s]) as f64 * period / 1e6)
                .collect();
            Some(median(&mut g))
        }
        _ => None,
    };
    let l = cache.layout();
    // Bytes a step must read: every stored row of every layer at the mid-run length.
    let len = context as u64 + (args.warmup + steps / 2) as u64;
    let bytes = m.layers as u64 * m.kv_heads as u64 * len * (l.k_row_bytes + l.v_row_bytes);
    Ok(Row {
        codec: name.to_string(),
        ctx: context,
        layers: m.layers,
        step_ms: median(&mut host_ms),
        record_ms: median(&mut record_ms),
        gpu_ms,
        bytes,
        bits_k: codecs.k.bits_per_value(m.head_dim),
        bits_v: codecs.v.bits_per_value(m.head_dim),
        host_bytes: (d.bytes_uploaded + d.bytes_downloaded) as f64 / steps as f64,
        dispatches: d.dispatches as f64 / steps as f64,
    })
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("sweep: {e}\n{USAGE}");
        std::process::exit(2);
    });
    let ctx = GpuContext::new().unwrap_or_else(|e| {
        eprintln!("sweep: {e}");
        std::process::exit(1);
    });
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
        "kvq sweep on '{}' ({:?}, {:?}){}: model {} ({} layers, {}/{} heads, D {}), ctx {:?}, {} steps",
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
        ctxs,
        steps
    );
    let mut rows = Vec::new();
    let total = codecs.len() * ctxs.len();
    for &c in &ctxs {
        for (name, codec) in &codecs {
            let t = Instant::now();
            match run_point(&ctx, m, *codec, name, c, &args, steps) {
                Ok(r) => {
                    eprintln!(
                        "[{}/{total}] {name} ctx {c}: {:.3} ms/step ({:.1} s)",
                        rows.len() + 1,
                        r.step_ms,
                        t.elapsed().as_secs_f64()
                    );
                    rows.push(r);
                }
                Err(e) => eprintln!("[-/{total}] {name} ctx {c}: {e}"),
            }
        }
    }
    let none_ms = |c: u32| {
        rows.iter()
            .find(|r| r.codec == "none" && r.ctx == c)
            .map(|r| r.step_ms)
    };
    let mut csv = String::from(
        "codec,model,ctx,layers,step_ms,gpu_ms,tok_s,gbps,bits_k,bits_v,ratio_vs_none,host_bytes_per_step,dispatches_per_step,record_ms\n",
    );
    println!(
        "\n{:<22} {:>7} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>6} {:>7} {:>6} {:>6}",
        "codec",
        "ctx",
        "layers",
        "step_ms",
        "record_ms",
        "gpu_ms",
        "tok/s",
        "GB/s",
        "bitsK",
        "bitsV",
        "vs_none",
        "host_B",
        "disp"
    );
    for r in &rows {
        let t = r.gpu_ms.unwrap_or(r.step_ms);
        let gbps = r.bytes as f64 / (t * 1e-3) / 1e9;
        let ratio = none_ms(r.ctx).map(|n| r.step_ms / n);
        let fmt_opt =
            |v: Option<f64>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "-".into());
        println!(
            "{:<22} {:>7} {:>6} {:>9.3} {:>9.3} {:>9} {:>9.1} {:>8.1} {:>6.2} {:>6.2} {:>7} {:>6.0} {:>6.0}",
            r.codec,
            r.ctx,
            r.layers,
            r.step_ms,
            r.record_ms,
            fmt_opt(r.gpu_ms, 3),
            1e3 / r.step_ms,
            gbps,
            r.bits_k,
            r.bits_v,
            fmt_opt(ratio, 3),
            r.host_bytes,
            r.dispatches
        );
        csv += &format!(
            "{},{},{},{},{:.4},{},{:.2},{:.1},{:.3},{:.3},{},{},{},{:.4}\n",
            r.codec,
            m.name,
            r.ctx,
            r.layers,
            r.step_ms,
            fmt_opt(r.gpu_ms, 4),
            1e3 / r.step_ms,
            gbps,
            r.bits_k,
            r.bits_v,
            fmt_opt(ratio, 4),
            r.host_bytes,
            r.dispatches,
            r.record_ms
        );
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
}
