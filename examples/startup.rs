//! Start-up: what a cache costs before its first decode step, and what a second or third cache
//! of another size costs on the same context.
//!
//! `cargo run --release --example startup [-- --model qwen3-8b --codecs none,turbo3_sym]`
//!
//! For each codec, three caches on one [`GpuContext`]: the first (capacity 4096, batch 1),
//! a second of another capacity and batch (8192, 2), a third with a sliding window (a ring of
//! 1024 slots). Each line is the wall time from `KvCache::new` to its first finished fused
//! decode step (every layer), and the compute pipelines the context compiled for it: the
//! first cache compiles its kernels, the others find them compiled (caches that differ only
//! in capacity, batch, window, layers or splits share them), so their start is the
//! allocation and one step; but where the adapter's tuning bakes the shape into the kernels
//! (`kvq::tuning::DeviceTuning::baked_shape`: the measured NVIDIA GPUs), each compiles its own.

use std::time::Instant;

use kvq::{CacheSpec, GpuContext, InputType, KvCache, KvCodecs};

#[path = "shared/models.rs"]
mod models;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut model = "tiny".to_string();
    let mut codecs = "none,turbo3_sym".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--model" => model = value()?,
            "--codecs" => codecs = value()?,
            "-h" | "--help" => {
                println!("usage: startup [--model NAME] [--codecs a,b,...]");
                println!(
                    "models: {}",
                    models::MODELS
                        .iter()
                        .map(|m| m.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                return Ok(());
            }
            other => return Err(format!("unknown argument {other} (try --help)").into()),
        }
    }
    let m = models::MODELS
        .iter()
        .find(|m| m.name == model)
        .ok_or(format!("unknown model {model}"))?;
    let ctx = GpuContext::new()?;
    println!(
        "{} ({:?}); {}: {} layers, {} query heads over {} KV heads, head_dim {}",
        ctx.info.name, ctx.info.backend, m.name, m.layers, m.q_heads, m.kv_heads, m.head_dim
    );
    println!(
        "{:<14} {:<28} {:>12} {:>10}",
        "codecs", "cache", "to 1st step", "compiled"
    );
    let started = Instant::now();
    for name in codecs.split(',') {
        let kv = KvCodecs::parse(name)?;
        let base =
            CacheSpec::new(m.layers, m.q_heads, m.kv_heads, m.head_dim, 4096).with_codecs(kv);
        let second = CacheSpec {
            capacity: 8192,
            ..base.clone()
        }
        .with_batch(2);
        let third = CacheSpec {
            capacity: 1024,
            ..base.clone()
        }
        .with_window(1024);
        for (what, spec) in [
            ("first: 4096 slots", base),
            ("capacity 8192, batch 2", second),
            ("window: a ring of 1024", third),
        ] {
            let before = ctx.compiled_pipelines();
            let t = Instant::now();
            first_step(&ctx, spec)?;
            println!(
                "{:<14} {:<28} {:>9.0} ms {:>10}",
                name,
                what,
                t.elapsed().as_secs_f64() * 1e3,
                ctx.compiled_pipelines() - before
            );
        }
    }
    println!(
        "{} pipelines compiled in all, {:.1} s",
        ctx.compiled_pipelines(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Creates a cache for `spec` and runs one fused decode step of every layer, waiting for it.
fn first_step(ctx: &GpuContext, spec: CacheSpec) -> Result<(), Box<dyn std::error::Error>> {
    let (b, kvh, qh, d) = (
        spec.batch as u64,
        spec.kv_heads as u64,
        spec.q_heads as u64,
        spec.head_dim as u64,
    );
    let layers = spec.layers;
    let mut cache = KvCache::new(ctx, spec)?;
    let buffer = |bytes: u64| {
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    // (Zeros: the values do not change what is compiled or allocated.)
    let (k, v) = (buffer(b * kvh * d * 2), buffer(b * kvh * d * 2));
    let (q, out) = (buffer(b * qh * d * 4), buffer(b * qh * d * 4));
    let io = cache.step_io(&k, &v, 1, InputType::F16, &q, &out)?;
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        for layer in 0..layers {
            cache.step_in_pass(&mut pass, layer, &io)?;
        }
    }
    ctx.queue.submit([enc.finish()]);
    ctx.device.poll(wgpu::PollType::wait_indefinitely())?;
    Ok(())
}
