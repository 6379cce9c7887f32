//! Soak (issue #5): 100,000 fused decode steps with truncations and resets on a tiny cache must
//! not grow GPU allocations or host memory. Alone in its test binary: the process's resident
//! set is the measure, and other tests running beside it would move it.

mod common;

use common::{Rng, private_ctx, read_f32};
use kvq::{CacheSpec, InputType, KvCache};

/// Resident set size of this process in KiB (Linux; 0 elsewhere).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[derive(Default)]
struct Soak {
    steps: u64,
    cycle: u64,
    truncations: u64,
}

impl Soak {
    /// Steps until `until` steps in all: each cycle records steps up to the capacity into one
    /// encoder, submits, then truncates (every 8th cycle resets).
    fn run(&mut self, gpu: &kvq::GpuContext, cache: &mut KvCache, io: &kvq::StepIo, until: u64) {
        let cap = cache.spec().capacity;
        while self.steps < until {
            let len = cache.len(0, 0).unwrap();
            let n = u64::from(cap - len).min(until - self.steps);
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for _ in 0..n {
                    cache.step_in_pass(&mut pass, 0, io).unwrap();
                }
            }
            gpu.queue.submit([enc.finish()]);
            self.steps += n;
            self.cycle += 1;
            if self.cycle.is_multiple_of(8) {
                cache.reset(0).unwrap();
            } else {
                cache.truncate(0, (self.cycle * 13 % 48) as u32).unwrap();
            }
            self.truncations += 1;
            if self.cycle.is_multiple_of(16) {
                gpu.device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .unwrap();
            }
        }
        gpu.device
            .poll(wgpu::PollType::wait_indefinitely())
            .unwrap();
    }
}

/// 100,000 fused decode steps on a tiny cache, each cycle filled to capacity in one encoder and
/// then truncated (every 8th cycle: reset): no growth in GPU allocations or host memory, no
/// uploads but the truncations' length writes, and the output still right at the end.
#[test]
fn soak_steps_truncate_reset() {
    const STEPS: u64 = 100_000;
    const WARMUP: u64 = 5_000;
    let gpu = private_ctx();
    let cap = 64;
    let spec = CacheSpec::new(1, 1, 1, 32, cap).with_splits(1);
    let mut cache = KvCache::new(&gpu, spec).unwrap();
    let mut rng = Rng::new(77);
    let (k, v, q) = (
        rng.normals(32, 1.0),
        rng.normals(32, 1.0),
        rng.normals(32, 1.0),
    );
    let st = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
    let mk = |data: &[f32], usage| {
        let b = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (data.len() * 4) as u64,
            usage,
            mapped_at_creation: false,
        });
        gpu.queue.write_buffer(&b, 0, bytemuck::cast_slice(data));
        b
    };
    let (kb, vb, qb) = (mk(&k, st), mk(&v, st), mk(&q, st));
    let ob = mk(&[f32::NAN; 32], st | wgpu::BufferUsages::COPY_SRC);
    let io = cache
        .step_io(&kb, &vb, 1, InputType::F32, &qb, &ob)
        .unwrap();

    let mut soak = Soak::default();
    let t0 = std::time::Instant::now();
    soak.run(&gpu, &mut cache, &io, WARMUP);
    let (rss0, alloc0, stats0, trunc0) = (
        rss_kib(),
        gpu.device.generate_allocator_report(),
        gpu.stats(),
        soak.truncations,
    );
    soak.run(&gpu, &mut cache, &io, WARMUP + STEPS);
    let (rss1, alloc1, stats1) = (
        rss_kib(),
        gpu.device.generate_allocator_report(),
        gpu.stats(),
    );
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "soak: {} steps in {secs:.1} s ({} cycles); VmRSS {rss0} -> {rss1} KiB; GPU allocations {:?} -> {:?}",
        WARMUP + STEPS,
        soak.cycle,
        alloc0.as_ref().map(|a| (
            a.allocations.len(),
            a.total_allocated_bytes,
            a.total_reserved_bytes
        )),
        alloc1.as_ref().map(|a| (
            a.allocations.len(),
            a.total_allocated_bytes,
            a.total_reserved_bytes
        )),
    );
    if let (Some(a0), Some(a1)) = (&alloc0, &alloc1) {
        assert_eq!(
            a1.allocations.len(),
            a0.allocations.len(),
            "live GPU allocations"
        );
        assert_eq!(
            a1.total_allocated_bytes, a0.total_allocated_bytes,
            "GPU bytes allocated"
        );
        assert_eq!(
            a1.total_reserved_bytes, a0.total_reserved_bytes,
            "GPU bytes reserved"
        );
    } else {
        // Only the Vulkan, DX12 and Metal backends keep an allocator report.
        assert!(
            gpu.info.backend != wgpu::Backend::Vulkan,
            "no allocator report on Vulkan"
        );
    }
    assert!(
        rss1 <= rss0 + 8 * 1024,
        "host memory grew from {rss0} KiB to {rss1} KiB over {STEPS} steps"
    );
    // Nothing uploaded per step: only each truncation's length and overflow-flag words.
    assert_eq!(
        stats1.bytes_uploaded - stats0.bytes_uploaded,
        8 * (soak.truncations - trunc0),
        "bytes uploaded"
    );
    assert_eq!(
        stats1.dispatches - stats0.dispatches,
        2 * STEPS,
        "dispatches"
    );

    // Every stored row is the same token, so the output is its V (stored as f16).
    let len = cache.len(0, 0).unwrap();
    if len == cap {
        cache.reset(0).unwrap();
    }
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    cache.step(&mut enc, 0, &io).unwrap();
    gpu.queue.submit([enc.finish()]);
    let out = read_f32(&gpu, &ob, 32);
    for (o, x) in out.iter().zip(&v) {
        let want = half::f16::from_f32(*x).to_f32();
        assert!(
            (o - want).abs() <= 1e-3 * want.abs().max(1.0),
            "{o} vs {want}"
        );
    }
}
