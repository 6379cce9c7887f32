//! Criterion: one layer's fused decode step (append the new token, attend over the prefix:
//! split + reduce), recorded, submitted and waited for, for every codec the GPU path serves
//! (`KvCodecs::all_names` filtered by `kvq::kernels::gpu_supported`) at a few contexts (one
//! cache per codec, filled up to each context in turn). Each sample cuts the sequence back to
//! the context first (untimed), so every step sees the same length. On a CPU adapter the shapes
//! shrink so the bench finishes in minutes.

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use kvq::{CacheSpec, GpuContext, InputType, KvCache, KvCodecs};
use wgpu::util::DeviceExt;

fn wait(ctx: &GpuContext, idx: Option<wgpu::SubmissionIndex>) {
    ctx.device
        .poll(wgpu::PollType::Wait {
            submission_index: idx,
            timeout: None,
        })
        .expect("poll");
}

fn decode_step(c: &mut Criterion) {
    let ctx = GpuContext::new().expect("benchmarks need a GPU adapter");
    let (q_heads, kv_heads, d, ctxs): (u32, u32, u32, &[u32]) = if ctx.is_cpu() {
        (8, 2, 64, &[256, 1024])
    } else {
        (32, 8, 128, &[1024, 4096, 32768])
    };
    let codecs: Vec<(String, KvCodecs)> = KvCodecs::all_names()
        .into_iter()
        .filter_map(|n| KvCodecs::parse(&n).ok().map(|c| (n, c)))
        .filter(|(_, c)| kvq::kernels::gpu_supported(c.k) && kvq::kernels::gpu_supported(c.v))
        .collect();
    let mut group = c.benchmark_group("decode_step_one_layer");
    group.sample_size(20);
    if ctx.is_cpu() {
        group.warm_up_time(Duration::from_millis(300));
        group.measurement_time(Duration::from_secs(1));
    }
    let mk = |data: &[f32]| {
        ctx.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents: bytemuck::cast_slice(data),
                usage: wgpu::BufferUsages::STORAGE,
            })
    };
    let max = *ctxs.iter().max().expect("contexts");
    let mut x = 0x1234_5678u32;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        (x as f32 / u32::MAX as f32) * 2.0 - 1.0
    };
    let vals: Vec<f32> = (0..max * kv_heads * d).map(|_| rnd()).collect();
    let (kb, vb) = (mk(&vals), mk(&vals.iter().map(|v| -v).collect::<Vec<_>>()));
    let tok: Vec<f32> = (0..kv_heads * d).map(|_| rnd()).collect();
    let (kt, vt) = (mk(&tok), mk(&tok));
    let q: Vec<f32> = (0..q_heads * d).map(|_| rnd()).collect();
    let qb = mk(&q);
    let ob = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: (q.len() * 4) as u64,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    for (name, codecs) in &codecs {
        // One cache per codec, sized for the largest context and filled up to each in turn:
        // its kernels are built once (slow on a CPU driver), not once per context.
        let spec = CacheSpec::new(1, q_heads, kv_heads, d, max + 1).with_codecs(*codecs);
        let mut cache = KvCache::new(&ctx, spec).expect("cache");
        let io = cache
            .step_io(&kt, &vt, 1, InputType::F32, &qb, &ob)
            .expect("step io");
        let mut len = 0;
        for &n in ctxs {
            cache.truncate(0, len).expect("truncate");
            let input = cache
                .append_input(&kb, &vb, n - len, InputType::F32)
                .expect("input");
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            cache.append(&mut enc, 0, &input).expect("append");
            wait(&ctx, Some(ctx.queue.submit([enc.finish()])));
            len = n;
            // One step outside the measurement: drivers that build pipelines lazily do it here.
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            cache.step(&mut enc, 0, &io).expect("step");
            wait(&ctx, Some(ctx.queue.submit([enc.finish()])));
            group.bench_function(format!("{name}/ctx{n}"), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        cache.truncate(0, n).expect("truncate");
                        wait(&ctx, None);
                        let t = Instant::now();
                        let mut enc = ctx.device.create_command_encoder(&Default::default());
                        cache.step(&mut enc, 0, &io).expect("step");
                        wait(&ctx, Some(ctx.queue.submit([enc.finish()])));
                        total += t.elapsed();
                    }
                    total
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, decode_step);
criterion_main!(benches);
