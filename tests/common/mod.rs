//! Shared test harness: the test binary's GPU contexts, seeded random data, poisoned outputs.
#![allow(dead_code)]

use std::sync::{Mutex, OnceLock};

use kvq::{AttendIo, GpuContext, KvCache};

/// The test binary's contexts, one per test the harness runs at once (`--test-threads`, by
/// default the cores). Caches on one context share its compiled kernels. Why more than one:
/// a CPU driver (lavapipe) compiles a kernel when it is first dispatched, on the device's one
/// queue, so every test on a device waits for every other test's compiles, and a 2-core
/// machine compiles on one core. A device per running test compiles on all of them; what one
/// device compiled, Mesa's shader cache serves to the others.
struct Pool {
    slots: Vec<OnceLock<GpuContext>>,
    /// How many running threads hold each slot.
    held: Mutex<Vec<usize>>,
}

static POOL: OnceLock<Pool> = OnceLock::new();

fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let n = std::env::var("RUST_TEST_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(1)
            .max(1);
        // SAFETY: `atexit` of the C runtime every Rust program links, with a function that
        // only reads the contexts' counters.
        unsafe { atexit(report_compiled) };
        Pool {
            slots: (0..n).map(|_| OnceLock::new()).collect(),
            held: Mutex::new(vec![0; n]),
        }
    })
}

/// A test thread's slot in the pool, held until the thread ends (the harness runs each test on
/// a thread of its own). A thread that finds every slot held (a test's own threads, or a test
/// that started before the last one's thread had ended: it waits 100 ms for that) takes the
/// slot fewest threads hold: a context is thread-safe, only their compiles wait for each other.
struct Lease(usize);

impl Lease {
    fn take() -> Lease {
        for _ in 0..100 {
            let mut held = pool().held.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = held.iter().position(|&n| n == 0) {
                held[slot] = 1;
                return Lease(slot);
            }
            drop(held);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut held = pool().held.lock().unwrap_or_else(|e| e.into_inner());
        let slot = (0..held.len()).min_by_key(|&i| held[i]).unwrap_or(0);
        held[slot] += 1;
        Lease(slot)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        pool().held.lock().unwrap_or_else(|e| e.into_inner())[self.0] -= 1;
    }
}

thread_local! {
    static LEASE: Lease = Lease::take();
}

/// The test's context (its thread's slot in the pool, created at first use). No adapter is a
/// failure, never a skip: CI must see the kernels run.
pub fn ctx() -> &'static GpuContext {
    let slot = LEASE.with(|l| l.0);
    pool().slots[slot].get_or_init(|| {
        let ctx = new_ctx();
        if slot == 0 {
            eprintln!(
                "kvq tests on '{}' ({:?}, {:?})",
                ctx.info.name,
                ctx.info.backend,
                ctx.capabilities()
            );
        }
        ctx
    })
}

unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

/// Says at the test binary's exit how many pipelines its contexts compiled (a kernel counts
/// once per context that needed it).
extern "C" fn report_compiled() {
    if let Some(pool) = POOL.get() {
        let counts: Vec<u64> = pool
            .slots
            .iter()
            .filter_map(|s| s.get().map(GpuContext::compiled_pipelines))
            .collect();
        eprintln!(
            "kvq tests: {} compute pipelines compiled by this test binary (per context: {counts:?})",
            counts.iter().sum::<u64>()
        );
    }
}

/// Test data from kvq's own generator (SplitMix64): small, seeded, reproducible.
pub struct Rng(kvq::codec::rotation::SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(kvq::codec::rotation::SplitMix64::new(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
}

/// Attends through the recording API into an output buffer first filled with NaN, so a
/// kernel that skips a write cannot pass.
pub fn attend_poisoned(cache: &KvCache, layer: u32, q: &[f32]) -> Vec<f32> {
    let ctx = cache.context();
    let dev = &ctx.device;
    let bytes = (q.len() * 4) as u64;
    let mk = |usage| {
        dev.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes,
            usage,
            mapped_at_creation: false,
        })
    };
    let qb = mk(wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST);
    let ob = mk(wgpu::BufferUsages::STORAGE
        | wgpu::BufferUsages::COPY_DST
        | wgpu::BufferUsages::COPY_SRC);
    let rb = mk(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
    ctx.queue.write_buffer(&qb, 0, bytemuck::cast_slice(q));
    ctx.queue
        .write_buffer(&ob, 0, bytemuck::cast_slice(&vec![f32::NAN; q.len()]));
    let io: AttendIo = cache.attend_io(&qb, &ob).expect("attend_io");
    let mut enc = dev.create_command_encoder(&Default::default());
    cache.attend(&mut enc, layer, &io).expect("attend");
    enc.copy_buffer_to_buffer(&ob, 0, &rb, 0, bytes);
    ctx.queue.submit([enc.finish()]);
    rb.map_async(wgpu::MapMode::Read, .., |r| r.expect("map"));
    dev.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
    let out = bytemuck::cast_slice(&rb.get_mapped_range(..).expect("mapped")).to_vec();
    rb.unmap();
    out
}

/// A fused step of `n` new tokens per sequence (`k`, `v` f32 `[batch, n, kv_heads, d]`) into
/// `layer` through the recording API, its output buffer first filled with NaN; returns the
/// output `[batch, q_heads, d]`.
pub fn step_poisoned(
    cache: &mut KvCache,
    layer: u32,
    n: u32,
    k: &[f32],
    v: &[f32],
    q: &[f32],
) -> Vec<f32> {
    let ctx = cache.context().clone();
    let mk = |d: &[f32]| storage_buffer(&ctx, d);
    let (kb, vb, qb, ob) = (mk(k), mk(v), mk(q), mk(&vec![f32::NAN; q.len()]));
    let io = cache
        .step_io(&kb, &vb, n, kvq::InputType::F32, &qb, &ob)
        .expect("step_io");
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    cache.step(&mut enc, layer, &io).expect("step");
    ctx.queue.submit([enc.finish()]);
    read_f32(&ctx, &ob, q.len())
}

/// Every token appended to a cache as the caller gave it, to know what its store must hold:
/// `k[layer][seq][position]` is the token's K input (kv_heads * head_dim values), `v` its V.
pub struct Kept {
    pub k: Vec<Vec<Vec<Vec<f32>>>>,
    pub v: Vec<Vec<Vec<Vec<f32>>>>,
}

impl Kept {
    /// Nothing kept yet, for `layers` layers of `batch` sequences.
    pub fn new(layers: u32, batch: u32) -> Kept {
        let empty = vec![vec![Vec::new(); batch as usize]; layers as usize];
        Kept {
            k: empty.clone(),
            v: empty,
        }
    }

    /// Records `k`, `v` (`[batch, n, ...]`) as `layer`'s newest `n` tokens of every sequence.
    pub fn record(&mut self, layer: u32, n: usize, k: &[f32], v: &[f32]) {
        let batch = self.k[layer as usize].len();
        let (kw, vw) = (k.len() / (batch * n), v.len() / (batch * n));
        for b in 0..batch {
            for t in 0..n {
                let i = b * n + t;
                self.k[layer as usize][b].push(k[i * kw..(i + 1) * kw].to_vec());
                self.v[layer as usize][b].push(v[i * vw..(i + 1) * vw].to_vec());
            }
        }
    }

    /// Cuts sequence `seq` back to `len` tokens in every layer (as `KvCache::truncate`).
    pub fn truncate(&mut self, seq: u32, len: u32) {
        for layer in self.k.iter_mut().chain(&mut self.v) {
            layer[seq as usize].truncate(len as usize);
        }
    }
}

/// |got - want| / max(|want|, 1), infinite where `got` is NaN or infinite (a log-sum-exp's
/// error).
pub fn lse_err(got: f32, want: f64) -> f64 {
    let d = (got as f64 - want).abs();
    if d.is_finite() {
        d / want.abs().max(1.0)
    } else {
        f64::INFINITY
    }
}

/// Max |a - b| / max |b|; infinite where any GPU value is NaN or infinite (`f64::max` would
/// drop a NaN, and the poisoned outputs are NaN).
pub fn rel_err(gpu: &[f32], reference: &[f64]) -> f64 {
    assert_eq!(gpu.len(), reference.len());
    let scale = reference
        .iter()
        .fold(0.0f64, |m, x| m.max(x.abs()))
        .max(1e-30);
    gpu.iter()
        .zip(reference)
        .map(|(&a, &b)| {
            let d = (a as f64 - b).abs();
            if d.is_finite() { d } else { f64::INFINITY }
        })
        .fold(0.0, f64::max)
        / scale
}

/// A context with counters of its own, for tests that assert on transfer counters: the shared
/// context's counters also count the other tests running at the same time. (It shares the
/// device and the compiled kernels.)
pub fn private_ctx() -> GpuContext {
    ctx().with_own_counters()
}

/// A new context, or a panic that says what the tests need. Its kernels run with poisoned
/// workgroup memory (`GpuContext::with_workgroup_poison`): kvq leaves out wgpu's zeroing of
/// workgroup memory, so every GPU test also checks that no kernel reads a workgroup value it
/// has not written. (`unpoisoned_ctx` gives the context as users get it.)
fn new_ctx() -> GpuContext {
    device_ctx().with_workgroup_poison(true)
}

/// The context as `GpuContext::new` gives it, without poisoned workgroup memory (the shared
/// device and compiled kernels; its kernels compile apart, unpoisoned).
pub fn unpoisoned_ctx() -> GpuContext {
    ctx().with_own_counters().with_workgroup_poison(false)
}

/// A new context as `GpuContext::new` gives it (a device of its own, compiling its own
/// kernels), or a panic that says what the tests need.
pub fn device_ctx() -> GpuContext {
    let ctx = GpuContext::new().unwrap_or_else(|e| panic!("GPU tests need an adapter: {e}"));
    // wgpu's GL backend serialises every call on one context lock and panics after waiting 6 s
    // for it, which the parallel tests' CPU shader compiles exceed (seen with llvmpipe): fail
    // here with what to do, not with wgpu's "most-likely a deadlock" panic mid-test.
    if ctx.info.backend == wgpu::Backend::Gl && std::env::var_os("WGPU_BACKEND").is_none() {
        panic!(
            "kvq tests found only a GL adapter ('{}'); they need Vulkan, Metal or DX12. \
             Without a GPU install lavapipe (`bash .ci/install-deps` on Debian); \
             WGPU_BACKEND=gl runs them on GL anyway",
            ctx.info.name
        );
    }
    ctx
}

/// A storage buffer of `ctx`'s device holding `data` (also a copy source and destination).
pub fn storage_buffer(ctx: &GpuContext, data: &[f32]) -> wgpu::Buffer {
    let b = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: (data.len() * 4) as u64,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    ctx.queue.write_buffer(&b, 0, bytemuck::cast_slice(data));
    b
}

/// Reads `n` f32 values from the start of a COPY_SRC buffer of `ctx`'s device.
pub fn read_f32(ctx: &GpuContext, buf: &wgpu::Buffer, n: usize) -> Vec<f32> {
    let rb = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: (n * 4) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(buf, 0, &rb, 0, (n * 4) as u64);
    ctx.queue.submit([enc.finish()]);
    rb.map_async(wgpu::MapMode::Read, .., |r| r.expect("map"));
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    let out = bytemuck::cast_slice(&rb.get_mapped_range(..).expect("mapped")).to_vec();
    rb.unmap();
    out
}

/// f64 attention of sequence `b`'s query `q` (`[q_heads, head_dim]`) over the stored rows
/// `krows`, `vrows` (as from [`KvCache::read_rows`]) at `slots`, decoded by the CPU reference
/// codecs. With QJL on K the scores come from the QJL estimator, as the GPU computes them.
pub fn reference_over_rows(
    spec: &kvq::CacheSpec,
    krows: &[u32],
    vrows: &[u32],
    b: usize,
    slots: &[usize],
    q: &[f32],
) -> Vec<f64> {
    use kvq::codec::CodecRef;
    let (d, kvh, qh) = (
        spec.head_dim as usize,
        spec.kv_heads as usize,
        spec.q_heads as usize,
    );
    let kref = CodecRef::new(spec.codecs.k, spec.head_dim, spec.seed).unwrap();
    let vref = CodecRef::new(spec.codecs.v, spec.head_dim, spec.seed).unwrap();
    let (kw, vw) = (kref.layout().words as usize, vref.layout().words as usize);
    let row = |h: usize, t: usize| (b * kvh + h) * spec.capacity as usize + slots[t];
    // [len, kv_heads, d] in position order.
    let mut k = Vec::with_capacity(slots.len() * kvh * d);
    let mut v = Vec::with_capacity(slots.len() * kvh * d);
    for t in 0..slots.len() {
        for h in 0..kvh {
            let r = row(h, t);
            k.extend(kref.decode(&krows[r * kw..(r + 1) * kw]));
            v.extend(vref.decode(&vrows[r * vw..(r + 1) * vw]));
        }
    }
    let qb: Vec<f64> = q.iter().map(|&x| x as f64).collect();
    let scale = spec.softmax_scale() as f64;
    if spec.codecs.k.qjl {
        kvq::reference::attention_with_scores(&v, qh, kvh, d, |qi, h, t| {
            let r = row(h, t);
            scale * kref.ip_estimate(&krows[r * kw..(r + 1) * kw], &qb[qi * d..(qi + 1) * d])
        })
    } else {
        kvq::reference::attention(&qb, &k, &v, qh, kvh, d, scale)
    }
}

/// spirv-val's verdict on `words` for Vulkan `env` (`vulkan1.1`, ...): whether it accepts them,
/// and what it said. None where spirv-val cannot run, which `KVQ_REQUIRE_SPIRV_VAL=1` (CI)
/// makes a failure instead.
pub fn spirv_val(words: &[u32], env: &str, name: &str) -> Option<(bool, String)> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let required = std::env::var("KVQ_REQUIRE_SPIRV_VAL").is_ok_and(|v| v == "1");
    let child = Command::new("spirv-val")
        .args(["--target-env", env, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            assert!(
                !required,
                "spirv-val is required (KVQ_REQUIRE_SPIRV_VAL=1) but could not run: {e}"
            );
            eprintln!("spirv-val not found; SPIR-V of {name} not checked by it");
            return None;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(bytemuck::cast_slice(words))
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    Some((out.status.success(), said.into_owned()))
}
