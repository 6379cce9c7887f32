//! `--bench`: the whole model's decode and prompt tokens/s per codec, context and batch, beside
//! what a step must read (weights + KV) over the adapter's measured read bandwidth.
//!
//! For each batch and codec one engine is built; for each context its cache is filled to that
//! length with random K/V (kvq's append: the model is not run over the context) and decode
//! steps of the whole model are timed two ways: `step` = the chat loop (record, submit, read
//! the sampled ids back, one step at a time; median), `gpu` = many steps recorded into one
//! submit (the GPU's time per step with no host round trip). A prompt point (batch 1): a chunk
//! of min(context, --prompt-tokens) new tokens after a random-filled prefix, one recording.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use kvq::GpuContext;
use kvq::memory::fmt_bytes;

use crate::Args;
use crate::engine::{Engine, Options, Product, Sampling, default_tune};
use crate::error::{ChatError, Result};
use crate::gguf::Gguf;
use crate::llama::{Config, Weights};
use crate::weights::Format;

/// One measured point.
pub struct Row {
    pub codec: String,
    pub batch: u32,
    pub ctx: u32,
    /// Median ms of a chat-loop step (submit + read back).
    pub step_ms: f64,
    /// ms per step of steps submitted together.
    pub gpu_ms: f64,
    /// Prompt tokens/s (batch 1; 0 where not measured) and the prompt's tokens.
    pub prompt_tok_s: f64,
    pub prompt_tokens: u32,
    /// Bytes a step must read: weights, KV.
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    /// The cache's K/V store (all layers, all sequences).
    pub store_bytes: u64,
    pub dispatches: u64,
}

impl Row {
    fn tok_s(&self) -> f64 {
        self.batch as f64 * 1000.0 / self.step_ms
    }
    fn gpu_tok_s(&self) -> f64 {
        self.batch as f64 * 1000.0 / self.gpu_ms
    }
    fn bytes(&self) -> u64 {
        self.weight_bytes + self.kv_bytes
    }
    /// The step's GPU time over the bytes it must read at the measured bandwidth.
    fn bound_ratio(&self, gbps: f64) -> f64 {
        self.gpu_ms / (self.bytes() as f64 / gbps / 1e6)
    }
}

const READ_PROBE: &str = r#"
@group(0) @binding(0) var<storage, read_write> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> sink: array<u32>;

@compute @workgroup_size(256)
fn fill(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = gid.x; i < arrayLength(&src); i += nwg.x * 256u) {
        let h = (i ^ 0x9e3779b9u) * 0x85ebca6bu;
        src[i] = vec4<u32>(h, ~h, h * 3u, h ^ 0x5bd1e995u);
    }
}

@compute @workgroup_size(256)
fn read(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    var acc = vec4<u32>(0u);
    for (var i = gid.x; i < arrayLength(&src); i += nwg.x * 256u) {
        acc ^= src[i];
    }
    if all(acc == vec4<u32>(1u, 2u, 3u, 4u)) {
        sink[0] = gid.x;
    }
}
"#;

/// The adapter's streaming read bandwidth, GB/s: a buffer of 1 GiB (128 MiB on a CPU adapter)
/// read whole, the median of 7 host-timed reads of 4 passes each.
pub fn read_bandwidth(ctx: &GpuContext) -> Result<f64> {
    let d = &ctx.device;
    let bytes: u64 = if ctx.is_cpu() { 128 << 20 } else { 1 << 30 };
    let bytes = bytes.min(d.limits().max_storage_buffer_binding_size);
    let mk = |size| {
        d.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read probe"),
            size,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    let (src, sink) = (mk(bytes), mk(16));
    let module = d.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("read probe"),
        source: wgpu::ShaderSource::Wgsl(READ_PROBE.into()),
    });
    let pipe = |entry| {
        d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("read probe"),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        })
    };
    let (fill, read) = (pipe("fill"), pipe("read"));
    // (Auto layouts hold only what each entry point uses: fill reads no sink.)
    let bg = |p: &wgpu::ComputePipeline, n: usize| {
        let entries = [
            wgpu::BindGroupEntry {
                binding: 0,
                resource: src.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: sink.as_entire_binding(),
            },
        ];
        d.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &p.get_bind_group_layout(0),
            entries: &entries[..n],
        })
    };
    let (fbg, rbg) = (bg(&fill, 1), bg(&read, 2));
    let groups = if ctx.is_cpu() { 64 } else { 132 * 16 };
    let submit = |p: &wgpu::ComputePipeline, g: &wgpu::BindGroup, reps: u32| -> Result<f64> {
        let t = Instant::now();
        let mut enc = d.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(p);
            pass.set_bind_group(0, g, &[]);
            for _ in 0..reps {
                pass.dispatch_workgroups(groups, 1, 1);
            }
        }
        ctx.queue.submit([enc.finish()]);
        d.poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| ChatError::Gpu(e.to_string()))?;
        Ok(t.elapsed().as_secs_f64())
    };
    submit(&fill, &fbg, 1)?;
    submit(&read, &rbg, 2)?;
    let mut t: Vec<f64> = (0..7)
        .map(|_| submit(&read, &rbg, 4))
        .collect::<Result<_>>()?;
    t.sort_by(f64::total_cmp);
    Ok(4.0 * bytes as f64 / t[3] / 1e9)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times decode at the engine's current state: `warm` chat-loop steps, then `steps` timed one
/// by one (median ms) and `steps` recorded into one submit (ms each).
fn time_decode(e: &mut Engine, warm: u32, steps: u32) -> Result<(f64, f64)> {
    for _ in 0..warm {
        e.step()?;
    }
    let mut t = Vec::new();
    for _ in 0..steps {
        let s = Instant::now();
        e.step()?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    let s = Instant::now();
    let mut enc = e.ctx.device.create_command_encoder(&Default::default());
    for _ in 0..steps {
        e.record_step(&mut enc)?;
    }
    e.ctx.queue.submit([enc.finish()]);
    e.wait()?;
    let gpu = s.elapsed().as_secs_f64() * 1e3 / steps as f64;
    Ok((median(t), gpu))
}

fn load_weights(ctx: &GpuContext, args: &Args) -> Result<Weights> {
    match &args.shape {
        Some(name) => {
            let cfg = Config::shape(name)?;
            let k = crate::kernels::Kernels::new(&ctx.device);
            Weights::random(
                &ctx.device,
                &ctx.queue,
                &k,
                &cfg,
                args.weights.unwrap_or(Format::Q4),
            )
        }
        None => {
            let path = crate::model_path(args.model.clone())?;
            let mut g = Gguf::open(&path)?;
            Weights::from_gguf(&ctx.device, &mut g, args.weights, &mut |_| {})
        }
    }
}

/// Runs the benchmark of `args` on `ctx`.
pub fn run(ctx: &GpuContext, args: &Args) -> Result<()> {
    let weights = Arc::new(load_weights(ctx, args)?);
    let cfg = weights.cfg.clone();
    let fmt = format!("{:?}", weights.embed.format).to_lowercase();
    eprintln!(
        "model {}: {} layers, {} / {} heads of {}, width {}, hidden {}, vocabulary {}, {:.2} B parameters; weights {} ({} layer matrices)",
        cfg.name,
        cfg.layers,
        cfg.q_heads,
        cfg.kv_heads,
        cfg.head_dim,
        cfg.dim,
        cfg.ffn,
        cfg.vocab,
        cfg.params() as f64 / 1e9,
        fmt_bytes(weights.device_bytes()),
        format!("{:?}", weights.layers[0].qkv.format).to_lowercase()
    );
    let bw = read_bandwidth(ctx)?;
    eprintln!("measured read bandwidth: {bw:.0} GB/s");
    let max_ctx = *args.contexts.iter().max().unwrap_or(&1024);
    let (warm, steps) = (3, args.steps);
    let prompt_tokens = args.prompt_tokens;
    // The products alone, every layer's matrix of one kind in one pass, per batch: the
    // matrix-vector kernel's shapes tried and the fastest kept.
    let kernels = Arc::new(crate::kernels::Kernels::new(&ctx.device));
    let mut tunes = Vec::new();
    for &batch in &args.batches {
        let mut o = Options::new(64, args.codecs[0]);
        o.batch = batch;
        let mut e = Engine::with_kernels(ctx, weights.clone(), o, kernels.clone())?;
        let mut tune = [None; 5];
        let mut line = format!(
            "products alone, batch {batch} (weights read / time = GB/s, % of the read bandwidth; lanes x rows):"
        );
        for p in Product::ALL {
            let k = e.operands_cols(p);
            let (l0, _) = default_tune(k);
            let mut best: Option<((u32, u32), u64, f64)> = None;
            // (A CPU adapter takes the default: each variant is a compile of seconds there.)
            let (lanes_tried, rows_tried) = match ctx.is_cpu() {
                true => (vec![l0], vec![default_tune(k).1]),
                false => (vec![l0 / 2, l0, l0 * 2], vec![2, 4, 8]),
            };
            for &lanes in &lanes_tried {
                for &r in &rows_tried {
                    // (The lanes' sums need 256 x batch x rows floats of workgroup memory.)
                    let wg_bytes = 256 * batch * r * 4 + 16;
                    if !(4..=64).contains(&lanes)
                        || (p == Product::GateUp && r % 2 == 1)
                        || (k / 32) < lanes
                        || wg_bytes > ctx.device.limits().max_compute_workgroup_storage_size
                    {
                        continue;
                    }
                    let (bytes, s) = match e.time_products(p, Some((lanes, r)), 8) {
                        Ok(t) => t,
                        Err(err) => {
                            eprintln!("{} {lanes}x{r}: {err}", p.name());
                            continue;
                        }
                    };
                    if best.is_none_or(|b| s < b.2) {
                        best = Some(((lanes, r), bytes, s));
                    }
                }
            }
            let Some((t, bytes, s)) = best else { continue };
            tune[p.index()] = Some(t);
            let gbps = bytes as f64 / s / 1e9;
            line += &format!(
                " {} {} / {:.3} ms = {gbps:.0} ({:.0} %, {}x{});",
                p.name(),
                fmt_bytes(bytes),
                s * 1e3,
                100.0 * gbps / bw,
                t.0,
                t.1
            );
        }
        eprintln!("{line}");
        tunes.push((batch, tune));
    }
    let mut rows: Vec<Row> = Vec::new();
    // The CSV gets each row as it is measured (a run cut short keeps what it measured).
    let mut csv = match &args.csv {
        Some(p) => Some(
            std::fs::File::create(p)
                .and_then(|mut f| writeln!(f, "{CSV_HEADER}").map(|_| f))
                .map_err(|e| ChatError::Io {
                    path: p.clone(),
                    source: e,
                })?,
        ),
        None => None,
    };
    for &batch in &args.batches {
        for codecs in &args.codecs {
            let mut opts = Options::new(max_ctx + warm + 2 * steps + 8, *codecs);
            opts.batch = batch;
            // Exact tokens for caches with codes of at most 4 bits, as the README recommends
            // (the f16 and 8-bit caches go without).
            let low = |c: kvq::Codec| c != kvq::Codec::NONE && c.bits <= 4;
            if low(codecs.k) || low(codecs.v) {
                opts.exact = args.exact;
            }
            let name = match opts.exact.any() {
                true => format!(
                    "{} [sink{}+recent{}]",
                    codecs.name(),
                    opts.exact.sink,
                    opts.exact.recent
                ),
                false => codecs.name(),
            };
            opts.prompt_max = if batch == 1 {
                prompt_tokens.max(64)
            } else {
                16
            };
            opts.tune = tunes
                .iter()
                .find(|t| t.0 == batch)
                .map_or([None; 5], |t| t.1);
            let mut e = match Engine::with_kernels(ctx, weights.clone(), opts, kernels.clone()) {
                Ok(e) => e,
                Err(err) => {
                    eprintln!("skipped {name} batch {batch}: {err}");
                    continue;
                }
            };
            e.set_sampling(Sampling::GREEDY);
            for &c in &args.contexts {
                let row = match point(&mut e, args, &cfg, &name, batch, c, prompt_tokens, bw) {
                    Ok(r) => r,
                    Err(err) => {
                        eprintln!("{name} batch {batch} ctx {c}: {err}");
                        continue;
                    }
                };
                if let (Some(f), Some(p)) = (csv.as_mut(), &args.csv) {
                    csv_line(f, &row, &rows, &cfg, &ctx.info.name, bw, &fmt).map_err(|e| {
                        ChatError::Io {
                            path: p.clone(),
                            source: e,
                        }
                    })?;
                }
                rows.push(row);
            }
        }
    }
    print_table(&rows, &cfg, &ctx.info.name, bw, &fmt);
    if let Some(p) = &args.csv {
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &args.plot {
        plot(
            p,
            &rows,
            &format!(
                "{} ({fmt} weights) on {}: decode tokens/s",
                cfg.name, ctx.info.name
            ),
        )
        .map_err(|e| ChatError::Argument(format!("{}: {e}", p.display())))?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

/// One (codec, batch, context) point of an engine.
#[allow(clippy::too_many_arguments)]
fn point(
    e: &mut Engine,
    args: &Args,
    cfg: &Config,
    name: &str,
    batch: u32,
    c: u32,
    prompt_tokens: u32,
    bw: f64,
) -> Result<Row> {
    let (warm, steps) = (3, args.steps);
    let codecs = &e.opts.codecs.clone();
    e.fill_random(c)?;
    let (step_ms, gpu_ms) = time_decode(e, warm, steps)?;
    let d = e.last_dispatches;
    let layout = e.cache.layout();
    let kv_bytes = batch as u64
        * cfg.layers as u64
        * cfg.kv_heads as u64
        * c as u64
        * (layout.k_row_bytes + layout.v_row_bytes);
    let mut row = Row {
        codec: name.to_string(),
        batch,
        ctx: c,
        step_ms,
        gpu_ms,
        prompt_tok_s: 0.0,
        prompt_tokens: 0,
        weight_bytes: e.weights.bytes_per_step(batch),
        kv_bytes,
        store_bytes: e.cache.memory().store(),
        dispatches: d.own + d.kvq,
    };
    let timed_prompt = args
        .prompt_codecs
        .as_ref()
        .is_none_or(|l| l.contains(codecs));
    if batch == 1 && prompt_tokens > 0 && timed_prompt {
        let p = prompt_tokens.min(c);
        let ids: Vec<u32> = (0..p).map(|i| (i * 7919 + 13) % cfg.vocab).collect();
        // Warm: the chunk's kernels built and the GPU's clocks up.
        e.fill_random(0)?;
        e.prompt(&[ids[..p.min(64) as usize].to_vec()])?;
        e.fill_random(c - p)?;
        let s = Instant::now();
        e.prompt(std::slice::from_ref(&ids))?;
        row.prompt_tok_s = p as f64 / s.elapsed().as_secs_f64();
        row.prompt_tokens = p;
    }
    eprintln!(
        "{} batch {batch} ctx {c}: step {:.3} ms ({:.1} tok/s), gpu {:.3} ms, {:.2}x the read bound{}",
        row.codec,
        row.step_ms,
        row.tok_s(),
        row.gpu_ms,
        row.bound_ratio(bw),
        if row.prompt_tokens > 0 {
            format!(
                ", prompt {} tokens {:.0} tok/s",
                row.prompt_tokens, row.prompt_tok_s
            )
        } else {
            String::new()
        }
    );
    Ok(row)
}

fn none_tok_s(rows: &[Row], r: &Row) -> Option<f64> {
    rows.iter()
        .find(|n| n.codec == "none" && n.batch == r.batch && n.ctx == r.ctx)
        .map(|n| n.gpu_tok_s())
}

fn print_table(rows: &[Row], cfg: &Config, device: &str, bw: f64, fmt: &str) {
    println!(
        "{} ({fmt} weights) on {device}; read bandwidth {bw:.0} GB/s. step = chat loop (submit + read back the ids), gpu = steps submitted together; bound = gpu ms over (weights + KV bytes) / bandwidth",
        cfg.name
    );
    println!(
        "| codec | batch | ctx | step ms | gpu ms | decode tok/s | ÷ none | prompt tok/s | weights + KV read / step | GB/s (% bw) | bound | KV store | dispatches |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|");
    for r in rows {
        let gbps = r.bytes() as f64 / r.gpu_ms / 1e6;
        println!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.1} | {} | {} | {} + {} | {:.0} ({:.0} %) | {:.2} | {} | {} |",
            r.codec,
            r.batch,
            r.ctx,
            r.step_ms,
            r.gpu_ms,
            r.gpu_tok_s(),
            none_tok_s(rows, r).map_or("-".into(), |n| format!("{:.2}", r.gpu_tok_s() / n)),
            if r.prompt_tokens > 0 {
                format!("{:.0} ({})", r.prompt_tok_s, r.prompt_tokens)
            } else {
                "-".into()
            },
            fmt_bytes(r.weight_bytes),
            fmt_bytes(r.kv_bytes),
            gbps,
            100.0 * gbps / bw,
            r.bound_ratio(bw),
            fmt_bytes(r.store_bytes),
            r.dispatches
        );
    }
}

const CSV_HEADER: &str = "model,weights,device,codec,batch,ctx,step_ms,gpu_ms,decode_tok_s,gpu_tok_s,vs_none,prompt_tokens,prompt_tok_s,weight_bytes,kv_bytes,read_gbps,bw_gbps,bound_ratio,store_bytes,dispatches";

/// One CSV line for `r` (`before`: the rows measured earlier, `none`'s among them).
fn csv_line(
    f: &mut std::fs::File,
    r: &Row,
    before: &[Row],
    cfg: &Config,
    device: &str,
    bw: f64,
    fmt: &str,
) -> std::io::Result<()> {
    let q = |s: &str| {
        if s.contains(',') {
            format!("\"{s}\"")
        } else {
            s.to_string()
        }
    };
    let vs = match r.codec == "none" {
        true => "1.000".to_string(),
        false => {
            none_tok_s(before, r).map_or(String::new(), |n| format!("{:.3}", r.gpu_tok_s() / n))
        }
    };
    writeln!(
        f,
        "{},{fmt},{},{},{},{},{:.4},{:.4},{:.2},{:.2},{vs},{},{:.1},{},{},{:.1},{bw:.1},{:.3},{},{}",
        cfg.name,
        q(device),
        q(&r.codec),
        r.batch,
        r.ctx,
        r.step_ms,
        r.gpu_ms,
        r.tok_s(),
        r.gpu_tok_s(),
        r.prompt_tokens,
        r.prompt_tok_s,
        r.weight_bytes,
        r.kv_bytes,
        r.bytes() as f64 / r.gpu_ms / 1e6,
        r.bound_ratio(bw),
        r.store_bytes,
        r.dispatches
    )?;
    f.flush()
}

/// Decode tokens/s (GPU, steps submitted together) against context, log-log: one colour per
/// codec, solid for batch 1, dashed for larger batches.
fn plot(
    path: &std::path::Path,
    rows: &[Row],
    title: &str,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    if rows.is_empty() {
        return Err("no points".into());
    }
    let (x0, x1) = rows.iter().fold((f64::MAX, 0f64), |a, r| {
        (a.0.min(r.ctx as f64), a.1.max(r.ctx as f64))
    });
    let (y0, y1) = rows.iter().fold((f64::MAX, 0f64), |a, r| {
        (a.0.min(r.gpu_tok_s()), a.1.max(r.gpu_tok_s()))
    });
    let root = SVGBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (x0 / 1.3..x1 * 1.3).log_scale(),
            (y0 / 1.3..y1 * 1.3).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("context (tokens, log scale)")
        .y_desc("decode tokens/s, all sequences (log scale)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()?;
    let mut codecs: Vec<&str> = rows.iter().map(|r| r.codec.as_str()).collect();
    codecs.dedup();
    codecs.sort();
    codecs.dedup();
    let mut batches: Vec<u32> = rows.iter().map(|r| r.batch).collect();
    batches.sort();
    batches.dedup();
    for (i, c) in codecs.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        for &b in &batches {
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.codec == *c && r.batch == b)
                .map(|r| (r.ctx as f64, r.gpu_tok_s()))
                .collect();
            if pts.is_empty() {
                continue;
            }
            let style = ShapeStyle::from(color).stroke_width(if b == 1 { 2 } else { 1 });
            let s = chart.draw_series(LineSeries::new(pts.clone(), style))?;
            s.label(format!("{c} batch {b}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    root.present()?;
    Ok(())
}
