//! Criterion: one layer's decode attention (split + reduce), recorded and submitted, at a few
//! contexts. On a CPU adapter the shapes shrink so the bench finishes in minutes.

use criterion::{Criterion, criterion_group, criterion_main};
use kvq::{CacheSpec, GpuContext, InputType, KvCache};
use wgpu::util::DeviceExt;

fn decode(c: &mut Criterion) {
    let ctx = GpuContext::new().expect("benchmarks need a GPU adapter");
    let (q_heads, kv_heads, d, ctxs): (u32, u32, u32, &[u32]) = if ctx.is_cpu() {
        (8, 2, 64, &[256, 1024])
    } else {
        (32, 8, 128, &[1024, 4096, 32768])
    };
    let mut group = c.benchmark_group("attend_one_layer");
    group.sample_size(20);
    for &n in ctxs {
        let mut cache =
            KvCache::new(&ctx, CacheSpec::new(1, q_heads, kv_heads, d, n)).expect("cache");
        let mut x = 0x1234_5678u32;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        let vals: Vec<f32> = (0..n * kv_heads * d).map(|_| rnd()).collect();
        let mk = |data: &[f32]| {
            ctx.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: None,
                    contents: bytemuck::cast_slice(data),
                    usage: wgpu::BufferUsages::STORAGE,
                })
        };
        let (kb, vb) = (mk(&vals), mk(&vals.iter().map(|v| -v).collect::<Vec<_>>()));
        let input = cache
            .append_input(&kb, &vb, n, InputType::F32)
            .expect("input");
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        cache.append(&mut enc, 0, &input).expect("append");
        ctx.queue.submit([enc.finish()]);
        let q: Vec<f32> = (0..q_heads * d).map(|_| rnd()).collect();
        let qb = mk(&q);
        let ob = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (q.len() * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let io = cache.attend_io(&qb, &ob).expect("io");
        group.bench_function(format!("none/ctx{n}"), |b| {
            b.iter(|| {
                let mut enc = ctx.device.create_command_encoder(&Default::default());
                cache.attend(&mut enc, 0, &io).expect("attend");
                let idx = ctx.queue.submit([enc.finish()]);
                ctx.device
                    .poll(wgpu::PollType::Wait {
                        submission_index: Some(idx),
                        timeout: None,
                    })
                    .expect("poll");
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
