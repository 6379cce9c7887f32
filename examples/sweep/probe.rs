//! The probes, run once before the points: the adapter's streaming read bandwidth, the
//! reference each point's `bw_fraction` (`%peak`) is taken of, its FP32 multiply-add
//! rate, the reference of each point's attention FLOP/s (`fma_fraction`, `%fma`), and its
//! matrix units ([`crate::matrix`], where the adapter has cooperative matrices).

use std::time::Instant;

use kvq::GpuContext;
use kvq::memory::fmt_bytes;

use crate::matrix::{Selection, peak_matrix};
use crate::timing::{Timestamps, gbps, median, ms, wait_for};

/// What the probes measured (None where a probe failed; the sweep goes on without it).
pub struct Peaks {
    pub read: Option<PeakBandwidth>,
    pub fma: Option<PeakFma>,
}

/// Runs the probes, each printing its result (or why there is none) on stderr; the matrix
/// probe ([`crate::matrix::peak_matrix`]) runs the variants `matrix` selects, writing their
/// WGSL and machine code to `matrix_dump` if given, and prints its own table.
pub fn peaks(ctx: &GpuContext, matrix: &Selection, matrix_dump: Option<&str>) -> Peaks {
    let p = Peaks {
        read: peak_bandwidth(ctx),
        fma: peak_fma(ctx),
    };
    peak_matrix(ctx, matrix, matrix_dump);
    p
}

/// The adapter's measured FP32 multiply-add rate.
pub struct PeakFma {
    /// GFLOP/s, two per multiply-add.
    pub gflops: f64,
    /// How it was timed.
    pub how: &'static str,
}

/// The adapter's measured streaming read bandwidth.
pub struct PeakBandwidth {
    pub gbps: f64,
    pub bytes: u64,
    /// How it was timed.
    pub how: &'static str,
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

/// Measures the peak and prints it (or why it was not measured) on stderr; None when the
/// probe failed, and the sweep goes on without `%peak`.
pub fn peak_bandwidth(ctx: &GpuContext) -> Option<PeakBandwidth> {
    match measure_read_bandwidth(ctx) {
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
    }
}

/// Times [`READ_KERNEL`] over one large buffer (1 GiB on a GPU, 64 MiB on a CPU adapter; at
/// most one storage binding): GPU timestamps where the device has them, else the host clock
/// around submit + wait. Median of several runs after a warm-up. A validation error anywhere
/// in it is the probe's error, not a panic.
fn measure_read_bandwidth(ctx: &GpuContext) -> Result<PeakBandwidth, String> {
    let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let r = ReadKernel::new(ctx).and_then(|k| k.time(ctx));
    match pollster::block_on(scope.pop()) {
        Some(e) => Err(e.to_string()),
        None => r,
    }
}

/// The probe's buffer, its two pipelines (fill, read) and their bindings.
struct ReadKernel {
    bytes: u64,
    fill: wgpu::ComputePipeline,
    read: wgpu::ComputePipeline,
    bind: wgpu::BindGroup,
    /// Each invocation reads at least 16 elements; as many workgroups as the device allows.
    groups: u32,
    // Bound by `bind`; kept with it.
    _buffers: [wgpu::Buffer; 2],
}

impl ReadKernel {
    fn new(ctx: &GpuContext) -> Result<ReadKernel, String> {
        let dev = &ctx.device;
        let limits = dev.limits();
        let want: u64 = if ctx.is_cpu() { 64 << 20 } else { 1 << 30 };
        let bytes = want
            .min(limits.max_storage_buffer_binding_size)
            .min(limits.max_buffer_size)
            / 16
            * 16;
        let scope = dev.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = |label, size| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        };
        let src = buffer("sweep bandwidth src", bytes);
        let sink = buffer("sweep bandwidth sink", 16);
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
        let groups = (bytes / 16)
            .div_ceil(256 * 16)
            .clamp(1, limits.max_compute_workgroups_per_dimension as u64)
            as u32;
        Ok(ReadKernel {
            bytes,
            fill,
            read,
            bind,
            groups,
            _buffers: [src, sink],
        })
    }

    /// Records one pass of `pipe` over the whole buffer.
    fn pass(
        &self,
        enc: &mut wgpu::CommandEncoder,
        pipe: &wgpu::ComputePipeline,
        desc: &wgpu::ComputePassDescriptor,
    ) {
        let mut pass = enc.begin_compute_pass(desc);
        pass.set_pipeline(pipe);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(self.groups, 1, 1);
    }

    /// Fills the buffer once, then times the read passes.
    fn time(&self, ctx: &GpuContext) -> Result<PeakBandwidth, String> {
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        self.pass(&mut enc, &self.fill, &Default::default());
        wait_for(ctx, ctx.queue.submit([enc.finish()])).map_err(|e| e.to_string())?;
        let (ms, how) = time_passes(ctx, "sweep read bandwidth", |enc, desc| {
            self.pass(enc, &self.read, desc)
        })?;
        Ok(PeakBandwidth {
            gbps: gbps(self.bytes, ms),
            bytes: self.bytes,
            how,
        })
    }
}

const FMA_KERNEL: &str = r#"
// params[0]: rounds (read at run time, so no compiler folds the loop); params[1]: a sink.
@group(0) @binding(0) var<storage, read_write> params: array<u32>;

// 8 independent chains of vec4 multiply-adds an invocation (32 FMAs a round, enough in flight
// to hide the FMA latency), whose sum decides a store that never happens.
@compute @workgroup_size(256)
fn fma_rate(@builtin(global_invocation_id) gid: vec3<u32>) {
    let rounds = params[0];
    let x = f32(gid.x & 255u) * 1e-6;
    let m = vec4<f32>(0.999, 1.0001, 0.9999, 1.001);
    let a = vec4<f32>(x, x + 1e-7, x + 2e-7, x + 3e-7);
    var c0 = a; var c1 = a + 0.1; var c2 = a + 0.2; var c3 = a + 0.3;
    var c4 = a + 0.4; var c5 = a + 0.5; var c6 = a + 0.6; var c7 = a + 0.7;
    for (var r = 0u; r < rounds; r++) {
        c0 = fma(c0, m, a); c1 = fma(c1, m, a); c2 = fma(c2, m, a); c3 = fma(c3, m, a);
        c4 = fma(c4, m, a); c5 = fma(c5, m, a); c6 = fma(c6, m, a); c7 = fma(c7, m, a);
    }
    let s = c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7;
    if s.x + s.y + s.z + s.w == 12345.678 {
        params[1] = gid.x;
    }
}
"#;

/// Measures the FP32 multiply-add rate and prints it (or why it was not measured) on stderr.
pub fn peak_fma(ctx: &GpuContext) -> Option<PeakFma> {
    let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let r = time_fma(ctx);
    let r = match pollster::block_on(scope.pop()) {
        Some(e) => Err(e.to_string()),
        None => r,
    };
    match r {
        Ok(p) => {
            eprintln!(
                "peak FP32: {:.0} GFLOP/s: a kernel of independent multiply-add chains, {} (fma_peak_gflops; fma_fraction is attention FLOP/s over this)",
                p.gflops, p.how
            );
            Some(p)
        }
        Err(e) => {
            eprintln!("peak FP32: not measured ({e})");
            None
        }
    }
}

/// Times [`FMA_KERNEL`] over enough workgroups to fill a large GPU (a few on a CPU adapter):
/// GPU timestamps where the device has them, else the host clock; median after a warm-up.
fn time_fma(ctx: &GpuContext) -> Result<PeakFma, String> {
    use wgpu::util::DeviceExt;
    let dev = &ctx.device;
    let (groups, rounds): (u32, u32) = if ctx.is_cpu() {
        (16, 256)
    } else {
        (8192, 4096)
    };
    let params = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("sweep fma params"),
        contents: bytemuck::cast_slice(&[rounds, 0u32, 0, 0]),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("sweep fma"),
        source: wgpu::ShaderSource::Wgsl(FMA_KERNEL.into()),
    });
    let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("sweep fma"),
        layout: None,
        module: &module,
        entry_point: Some("fma_rate"),
        compilation_options: Default::default(),
        cache: None,
    });
    let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipe.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: params.as_entire_binding(),
        }],
    });
    let (ms, how) = time_passes(ctx, "sweep fma rate", |enc, desc| {
        let mut pass = enc.begin_compute_pass(desc);
        pass.set_pipeline(&pipe);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(groups, 1, 1);
    })?;
    // 8 chains of 4 lanes a round, 2 FLOP a multiply-add.
    let flop = groups as f64 * 256.0 * rounds as f64 * 8.0 * 4.0 * 2.0;
    Ok(PeakFma {
        gflops: flop / (ms * 1e-3) / 1e9,
        how,
    })
}

/// Times the pass `record` writes (into its encoder, with the descriptor's timestamps) after a
/// warm-up: the median of several runs' GPU time where the device has timestamps, else of the
/// host clock around submit + wait; with how it was timed.
pub fn time_passes(
    ctx: &GpuContext,
    label: &str,
    record: impl Fn(&mut wgpu::CommandEncoder, &wgpu::ComputePassDescriptor),
) -> Result<(f64, &'static str), String> {
    let (warmup, runs): (usize, usize) = if ctx.is_cpu() { (1, 3) } else { (3, 10) };
    let ts = Timestamps::new(ctx, runs);
    let mut host_ms = Vec::new();
    for r in 0..warmup + runs {
        let t0 = Instant::now();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        let slot = r.checked_sub(warmup);
        let timed = ts.as_ref().zip(slot);
        let desc = wgpu::ComputePassDescriptor {
            label: Some(label),
            timestamp_writes: timed.map(|(t, s)| t.writes(s)),
        };
        record(&mut enc, &desc);
        if let Some((t, s)) = timed {
            t.resolve(&mut enc, s);
        }
        wait_for(ctx, ctx.queue.submit([enc.finish()])).map_err(|e| e.to_string())?;
        if slot.is_some() {
            host_ms.push(ms(t0.elapsed()));
        }
    }
    Ok(match &ts {
        Some(t) => (median(&mut t.read_ms(ctx, 0..runs)?), "GPU timestamps"),
        None => (median(&mut host_ms), "host clock around submit + wait"),
    })
}
