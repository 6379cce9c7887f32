//! The matrix-unit probe: wgpu's experimental cooperative matrices (tensor cores on NVIDIA's
//! Vulkan driver, simdgroup matrices on Apple) measured in TFLOP/s: the multiply-add pipe
//! alone, fragments loaded from workgroup memory every iteration, and f16 GEMMs (4096³, f32
//! accumulators, each checked against an f64 reference on sampled entries) staged in several
//! ways ([`crate::matrix_wgsl`] writes them). It opens a device of its own on the sweep's
//! adapter, with the cooperative-matrix feature, which kvq's own context does not request.
//! An adapter without cooperative matrices (lavapipe, DX12) gets one line saying so.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use kvq::GpuContext;

use crate::matrix_wgsl::{Kernel, Ops, Shape, Target, Variant, source, variants};
use crate::probe::time_passes;

/// The GEMM's size: 4096³, as the PyTorch anchor (`bench/anchor_torch_matmul.py`) times it.
const SHAPE: Shape = Shape {
    m: 4096,
    n: 4096,
    k: 4096,
};

/// Sampled entries of C checked against the f64 reference per GEMM.
const SAMPLES: usize = 2048;

/// Iterations of the pipe and workgroup-load kernels, and their workgroups.
const LOOP_ROUNDS: u32 = 2048;
const LOOP_GROUPS: u32 = 4096;

/// The probe's variants that `--matrix default` runs: the loop kernels and the fastest GEMM
/// (BENCHMARKS.md, "Matrix units").
pub const DEFAULT: [&str; 3] = ["pipe", "lds-2x4", "g128x128x32-w2x2-s1p-h-pad8"];

/// Which variants `--matrix` asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Selection {
    /// None: the probe does not run.
    Off,
    /// [`DEFAULT`].
    Default,
    /// Every variant the probe knows.
    All,
    /// These names (as the table prints them).
    Names(Vec<String>),
}

impl Selection {
    /// Parses `--matrix`'s value: `off`, `default`, `all` or a comma-separated list of names.
    pub fn parse(v: &str) -> Result<Selection, String> {
        Ok(match v {
            "off" | "none" => Selection::Off,
            "default" => Selection::Default,
            "all" => Selection::All,
            list => {
                let known: Vec<String> = variants().iter().map(Variant::name).collect();
                let names: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
                if let Some(bad) = names.iter().find(|n| !known.contains(n)) {
                    return Err(format!(
                        "--matrix: no variant '{bad}' (known: {})",
                        known.join(", ")
                    ));
                }
                Selection::Names(names)
            }
        })
    }

    fn picks(&self, v: &Variant) -> bool {
        match self {
            Selection::Off => false,
            Selection::Default => DEFAULT.contains(&v.name().as_str()),
            Selection::All => true,
            Selection::Names(n) => n.contains(&v.name()),
        }
    }
}

/// One measured variant.
pub struct MatrixRow {
    pub name: String,
    pub tflops: f64,
    pub ms: f64,
    /// GEMMs: ‖C − reference‖ / ‖reference‖ over the sampled entries.
    pub rel_err: Option<f64>,
}

/// Runs the selected variants, printing a line each and a table (also returned); `dump`: a folder that gets
/// each variant's WGSL and (where the device offers pipeline caches) its pipeline-cache data,
/// which holds the machine code on NVIDIA (`bench/sass.py` disassembles it).
pub fn peak_matrix(ctx: &GpuContext, which: &Selection, dump: Option<&str>) -> Vec<MatrixRow> {
    if *which == Selection::Off {
        return Vec::new();
    }
    match MatrixDevice::open(ctx) {
        Ok(Some(dev)) => dev.run(which, dump),
        Ok(None) => Vec::new(),
        Err(e) => {
            eprintln!("matrix units: not measured ({e})");
            Vec::new()
        }
    }
}

/// A device with cooperative matrices on the sweep's adapter, and what was chosen for it.
struct MatrixDevice {
    gpu: GpuContext,
    target: Target,
    cache: bool,
    /// Set when the device is lost (a driver that fails to compile a kernel can lose it):
    /// the variants after that are reported, not run.
    lost: Arc<AtomicBool>,
}

impl MatrixDevice {
    /// The device, or None (after a line saying why) where the adapter has no cooperative
    /// matrices of a size the probe writes for.
    fn open(ctx: &GpuContext) -> Result<Option<MatrixDevice>, String> {
        let backends = wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all());
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle_from_env()
        });
        let adapter = pollster::block_on(instance.enumerate_adapters(backends))
            .into_iter()
            .find(|a| {
                let i = a.get_info();
                i.name == ctx.info.name && i.backend == ctx.info.backend
            })
            .ok_or_else(|| format!("adapter '{}' not found again", ctx.info.name))?;
        let info = adapter.get_info();
        let offered = adapter.features();
        if !offered.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            eprintln!(
                "matrix units: no cooperative matrices on this adapter ('{}', {:?}); not measured",
                info.name, info.backend
            );
            return Ok(None);
        }
        let props = adapter.cooperative_matrix_properties();
        let listed: Vec<String> = props
            .iter()
            .map(|p| {
                format!(
                    "{}x{}x{} {:?}->{:?}",
                    p.m_size, p.n_size, p.k_size, p.ab_type, p.cr_type
                )
            })
            .collect();
        eprintln!("matrix units: the adapter offers {}", listed.join(", "));
        let square = |f: u32| {
            props.iter().any(|p| {
                p.m_size == f
                    && p.n_size == f
                    && p.k_size == f
                    && p.ab_type == wgpu::CooperativeScalarType::F16
                    && p.cr_type == wgpu::CooperativeScalarType::F32
            })
        };
        let Some(frag) = [16, 8].into_iter().find(|&f| square(f)) else {
            eprintln!("matrix units: none of them is 16x16x16 or 8x8x8 f16 -> f32; not measured");
            return Ok(None);
        };
        if info.subgroup_min_size != info.subgroup_max_size {
            eprintln!(
                "matrix units: subgroups of {} to {} invocations; the probe's kernels need one size; not measured",
                info.subgroup_min_size, info.subgroup_max_size
            );
            return Ok(None);
        }
        let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
            | wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP;
        if !offered.contains(needed) {
            return Err(format!("the adapter lacks {:?}", needed - offered));
        }
        let optional = wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
            | wgpu::Features::PIPELINE_CACHE;
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("sweep matrix probe"),
            required_features: needed | (offered & optional),
            required_limits: adapter.limits(),
            // SAFETY: wgpu's opt-in for experimental features; the probe uses only cooperative
            // matrices, on kernels validated by naga beforehand (tests/matrix_probe.rs).
            experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
            ..Default::default()
        }))
        .map_err(|e| format!("cannot open a device with cooperative matrices: {e}"))?;
        let cache = device.features().contains(wgpu::Features::PIPELINE_CACHE);
        let lost = Arc::new(AtomicBool::new(false));
        let flag = lost.clone();
        device.set_device_lost_callback(move |_, why| {
            eprintln!("matrix units: the device was lost ({why})");
            flag.store(true, Ordering::Release);
        });
        Ok(Some(MatrixDevice {
            lost,
            gpu: GpuContext::from_device(device, queue, info.clone()),
            target: Target {
                frag,
                subgroup: info.subgroup_min_size,
                ops: Ops::Native,
            },
            cache,
        }))
    }

    fn run(&self, which: &Selection, dump: Option<&str>) -> Vec<MatrixRow> {
        let t = self.target;
        eprintln!(
            "matrix units: {0}x{0} f16 fragments, f32 accumulators, subgroups of {1}",
            t.frag, t.subgroup
        );
        if let Some(d) = dump
            && let Err(e) = std::fs::create_dir_all(d)
        {
            eprintln!("matrix units: cannot create {d}: {e}");
        }
        let gemm = GemmData::new(&self.gpu);
        let busy = match self.busy() {
            Ok(b) => b,
            Err(e) => {
                eprintln!("matrix units: not measured ({e})");
                return Vec::new();
            }
        };
        let mut rows = Vec::new();
        for v in variants().iter().filter(|v| which.picks(v)) {
            let name = v.name();
            let r = self.measure(v, &gemm, &busy, dump);
            match r {
                Ok(row) => {
                    eprintln!(
                        "matrix {name}: {:.1} TFLOP/s ({:.3} ms){}",
                        row.tflops,
                        row.ms,
                        row.rel_err
                            .map(|e| format!(", rel err {e:.1e}"))
                            .unwrap_or_default()
                    );
                    rows.push(row);
                }
                Err(e) => eprintln!("matrix {name}: not measured ({e})"),
            }
        }
        print_table(&rows);
        rows
    }

    /// Builds, runs and times one variant (a validation error in it is its error).
    fn measure(
        &self,
        v: &Variant,
        gemm: &GemmData,
        busy: &Busy,
        dump: Option<&str>,
    ) -> Result<MatrixRow, String> {
        let dev = &self.gpu.device;
        let t = &self.target;
        let limits = dev.limits();
        let bytes = v.kernel.workgroup_bytes(t);
        if bytes > limits.max_compute_workgroup_storage_size {
            return Err(format!(
                "{bytes} bytes of workgroup memory, the device allows {}",
                limits.max_compute_workgroup_storage_size
            ));
        }
        let threads = v.kernel.threads(t);
        if threads > limits.max_compute_invocations_per_workgroup {
            return Err(format!("{threads} invocations a workgroup"));
        }
        let src = source(&v.kernel, t, &SHAPE)?;
        self.alive()?;
        // A driver's compile failure is an internal error; a bad module, a validation error.
        let internal = dev.push_error_scope(wgpu::ErrorFilter::Internal);
        let validation = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let built = self.build(&v.name(), &src, v.checks, dump);
        let errors = [
            pollster::block_on(validation.pop()),
            pollster::block_on(internal.pop()),
        ];
        if let Some(e) = errors.into_iter().flatten().next() {
            return Err(e.to_string());
        }
        let pipe = built?;
        self.alive()?;
        let f = t.frag as f64;
        match v.kernel {
            Kernel::Pipe | Kernel::Lds { .. } => {
                let lp = LoopData::new(&self.gpu, &pipe);
                busy.run(&self.gpu)?;
                let (ms, _) = time_passes(&self.gpu, "matrix probe", |enc, desc| {
                    lp.record(enc, &pipe, desc)
                })?;
                let mmas_per_round = match v.kernel {
                    Kernel::Lds { fm, fnn } => (fm * fnn) as f64,
                    _ => crate::matrix_wgsl::PIPE_CHAINS as f64,
                };
                let subgroups = (LOOP_GROUPS * crate::matrix_wgsl::LOOP_SUBGROUPS) as f64;
                let flop = subgroups * LOOP_ROUNDS as f64 * mmas_per_round * 2.0 * f * f * f;
                Ok(MatrixRow {
                    name: v.name(),
                    tflops: flop / (ms * 1e-3) / 1e12,
                    ms,
                    rel_err: None,
                })
            }
            Kernel::Gemm(g) => {
                let bind = gemm.bind(&self.gpu, &pipe, g.bt);
                let groups = (SHAPE.n / g.bn, SHAPE.m / g.bm);
                gemm.poison(&self.gpu);
                busy.run(&self.gpu)?;
                let record = |enc: &mut wgpu::CommandEncoder,
                              desc: &wgpu::ComputePassDescriptor| {
                    let mut pass = enc.begin_compute_pass(desc);
                    pass.set_pipeline(&pipe);
                    pass.set_bind_group(0, &bind, &[]);
                    pass.dispatch_workgroups(groups.0, groups.1, 1);
                };
                let (ms, _) = time_passes(&self.gpu, "matrix probe gemm", record)?;
                let rel_err = gemm.check(&self.gpu)?;
                let flop = 2.0 * SHAPE.m as f64 * SHAPE.n as f64 * SHAPE.k as f64;
                Ok(MatrixRow {
                    name: v.name(),
                    tflops: flop / (ms * 1e-3) / 1e12,
                    ms,
                    rel_err: Some(rel_err),
                })
            }
        }
    }

    /// The kernel that raises the clocks before each timing ([`Busy`]).
    fn busy(&self) -> Result<Busy, String> {
        let src = source(&Kernel::Pipe, &self.target, &SHAPE)?;
        let pipe = self.build("busy", &src, false, None)?;
        let data = LoopData::new(&self.gpu, &pipe);
        Ok(Busy { pipe, data })
    }

    /// An error once the device is lost.
    fn alive(&self) -> Result<(), String> {
        match self.lost.load(Ordering::Acquire) {
            true => Err("the device is lost".into()),
            false => Ok(()),
        }
    }

    /// The compute pipeline of `src` (entry `main`), without wgpu's runtime checks unless
    /// `checks`; with `dump`, its WGSL and pipeline-cache data written there as `{name}.*`.
    fn build(
        &self,
        name: &str,
        src: &str,
        checks: bool,
        dump: Option<&str>,
    ) -> Result<wgpu::ComputePipeline, String> {
        let dev = &self.gpu.device;
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        };
        let module = if checks {
            dev.create_shader_module(desc)
        } else {
            // SAFETY: every loop of the probe's kernels counts to a constant or to a count the
            // host passes, and every index stays in its array: the GEMMs' tiles and fragments
            // lie inside blocks that divide the shape (`Gemm::check`), and the loop kernels
            // cycle through fixed slots.
            unsafe {
                dev.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        };
        let cache = (dump.is_some() && self.cache).then(|| {
            // SAFETY: a fresh, empty cache (no data from elsewhere).
            unsafe {
                dev.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                    label: Some(name),
                    data: None,
                    fallback: true,
                })
            }
        });
        let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                zero_initialize_workgroup_memory: checks,
                ..Default::default()
            },
            cache: cache.as_ref(),
        });
        if let Some(dir) = dump {
            let write = |ext: &str, bytes: &[u8]| {
                let path = format!("{dir}/{name}.{ext}");
                if let Err(e) = std::fs::write(&path, bytes) {
                    eprintln!("matrix units: cannot write {path}: {e}");
                }
            };
            write("wgsl", src.as_bytes());
            if let Some(data) = cache.as_ref().and_then(|c| c.get_data()) {
                write("cache", &data);
            }
        }
        Ok(pipe)
    }
}

/// Back-to-back runs of the pipe kernel for [`BUSY_MS`] right before each timing: with the
/// host's work between variants (the reference check, the next kernel's compile) the clocks
/// fall, and a GEMM of a few milliseconds timed after one warm-up at the start ran up to 3x
/// slow (an H100, driver 580: 82 against 232 TFLOP/s for the same kernel).
struct Busy {
    pipe: wgpu::ComputePipeline,
    data: LoopData,
}

/// Milliseconds of [`Busy`].
const BUSY_MS: u128 = 300;

impl Busy {
    fn run(&self, gpu: &GpuContext) -> Result<(), String> {
        let t0 = Instant::now();
        while t0.elapsed().as_millis() < BUSY_MS {
            self.data.run_once(gpu, &self.pipe)?;
        }
        Ok(())
    }
}

/// The loop kernels' output and iteration count.
struct LoopData {
    bind: wgpu::BindGroup,
    _buffers: [wgpu::Buffer; 2],
}

impl LoopData {
    fn new(gpu: &GpuContext, pipe: &wgpu::ComputePipeline) -> LoopData {
        use wgpu::util::DeviceExt;
        let dev = &gpu.device;
        let out = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("matrix probe out"),
            size: 64 << 10,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let params = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("matrix probe params"),
            contents: bytemuck::cast_slice(&[LOOP_ROUNDS, 1, 0, 0]),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipe.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: out.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: params.as_entire_binding(),
                },
            ],
        });
        LoopData {
            bind,
            _buffers: [out, params],
        }
    }

    fn record(
        &self,
        enc: &mut wgpu::CommandEncoder,
        pipe: &wgpu::ComputePipeline,
        desc: &wgpu::ComputePassDescriptor,
    ) {
        let mut pass = enc.begin_compute_pass(desc);
        pass.set_pipeline(pipe);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(LOOP_GROUPS, 1, 1);
    }

    fn run_once(&self, gpu: &GpuContext, pipe: &wgpu::ComputePipeline) -> Result<(), String> {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        self.record(&mut enc, pipe, &Default::default());
        crate::timing::wait_for(gpu, gpu.queue.submit([enc.finish()])).map_err(|e| e.to_string())
    }
}

/// The GEMM's inputs (random f16 in [-1, 1), B also transposed), its output and the host
/// copies the check needs.
struct GemmData {
    a: Vec<half::f16>,
    /// B transposed (n x k), so that the reference reads both operands contiguously.
    bt: Vec<half::f16>,
    a_buf: wgpu::Buffer,
    b_buf: wgpu::Buffer,
    bt_buf: wgpu::Buffer,
    c_buf: wgpu::Buffer,
}

impl GemmData {
    fn new(gpu: &GpuContext) -> GemmData {
        use wgpu::util::DeviceExt;
        let (m, n, k) = (SHAPE.m as usize, SHAPE.n as usize, SHAPE.k as usize);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            // SplitMix64: the host data only has to be random-looking and never zero.
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            let u = ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32;
            half::f16::from_f32(u * 2.0 - 1.0 + 1.0 / 4096.0)
        };
        let a: Vec<half::f16> = (0..m * k).map(|_| next()).collect();
        let b: Vec<half::f16> = (0..k * n).map(|_| next()).collect();
        let bt: Vec<half::f16> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let dev = &gpu.device;
        let init = |label, data: &[half::f16]| {
            dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytemuck::cast_slice(data),
                usage: wgpu::BufferUsages::STORAGE,
            })
        };
        let (a_buf, b_buf, bt_buf) = (init("gemm a", &a), init("gemm b", &b), init("gemm bt", &bt));
        let c_buf = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("gemm c"),
            size: (m * n * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        GemmData {
            a,
            bt,
            a_buf,
            b_buf,
            bt_buf,
            c_buf,
        }
    }

    fn bind(&self, gpu: &GpuContext, pipe: &wgpu::ComputePipeline, bt: bool) -> wgpu::BindGroup {
        let b = if bt { &self.bt_buf } else { &self.b_buf };
        gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipe.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: self.a_buf.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: b.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: self.c_buf.as_entire_binding(),
                },
            ],
        })
    }

    /// Fills C with NaN, so that an entry the kernel does not write fails the check.
    fn poison(&self, gpu: &GpuContext) {
        let nan = vec![0xffu8; self.c_buf.size() as usize];
        gpu.queue.write_buffer(&self.c_buf, 0, &nan);
    }

    /// ‖C − A B‖ / ‖A B‖ over sampled entries (f64 reference); an error where an entry is
    /// not finite.
    fn check(&self, gpu: &GpuContext) -> Result<f64, String> {
        let (n, k) = (SHAPE.n as usize, SHAPE.k as usize);
        let dev = &gpu.device;
        let rb = dev.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: self.c_buf.size(),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = dev.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&self.c_buf, 0, &rb, 0, self.c_buf.size());
        crate::timing::wait_for(gpu, gpu.queue.submit([enc.finish()]))
            .map_err(|e| e.to_string())?;
        rb.map_async(wgpu::MapMode::Read, .., |_| {});
        dev.poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| e.to_string())?;
        let view = rb.get_mapped_range(..).map_err(|e| format!("{e:?}"))?;
        let c: &[f32] = bytemuck::cast_slice(&view);
        let (mut num, mut den) = (0f64, 0f64);
        for s in 0..SAMPLES {
            // Spread over rows and columns, corners of blocks included.
            let i = (s * 2654435761usize + s / 7) % SHAPE.m as usize;
            let j = (s * 40503usize + 3 * s) % n;
            let (ar, br) = (&self.a[i * k..][..k], &self.bt[j * k..][..k]);
            let want: f64 = ar
                .iter()
                .zip(br)
                .map(|(x, y)| x.to_f64() * y.to_f64())
                .sum();
            let got = c[i * n + j] as f64;
            if !got.is_finite() {
                return Err(format!("C[{i}][{j}] = {got}: not written or wrong"));
            }
            num += (got - want) * (got - want);
            den += want * want;
        }
        Ok((num / den).sqrt())
    }
}

/// The measured variants, fastest first, as a table on stdout.
fn print_table(rows: &[MatrixRow]) {
    if rows.is_empty() {
        return;
    }
    let mut sorted: Vec<&MatrixRow> = rows.iter().collect();
    sorted.sort_by(|a, b| b.tflops.total_cmp(&a.tflops));
    println!(
        "\nmatrix units (TFLOP/s; GEMM {}x{}x{} f16, f32 accumulators):",
        SHAPE.m, SHAPE.n, SHAPE.k
    );
    println!(
        "{:<40} {:>9} {:>9} {:>9}",
        "variant", "TFLOP/s", "ms", "rel err"
    );
    for r in sorted {
        println!(
            "{:<40} {:>9.1} {:>9.3} {:>9}",
            r.name,
            r.tflops,
            r.ms,
            r.rel_err
                .map(|e| format!("{e:.1e}"))
                .unwrap_or_else(|| "-".into())
        );
    }
}
