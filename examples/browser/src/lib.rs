//! kvq in a browser tab. Compiled to wasm32 and loaded by `index.html` (through `main.js`):
//! opens kvq on the browser's WebGPU adapter ([`open`]), then per codec ([`measure`]) checks
//! kvq's outputs against kvq's CPU reference compiled into this same wasm and times decode
//! steps over a cache filled with random K/V. Each export returns JSON text, which the page
//! renders and, under test, posts back to the test's server.
//!
//! Nothing here blocks: kvq's async forms (`GpuContext::new_async`, `KvCache::new_async`,
//! `KvCache::read_rows_async`, ...) resolve through the page's event loop, and the clock is
//! `performance.now()`.

use std::cell::RefCell;

use kvq::codec::CodecRef;
use kvq::codec::rotation::SplitMix64;
use kvq::{CacheSpec, CodecKind, GpuContext, InputType, KvCache, KvCodecs, KvqError, StepIo};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

#[wasm_bindgen]
extern "C" {
    /// The page's clock in milliseconds.
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn performance_now() -> f64;
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(s: &str);
}

thread_local! {
    /// The device [`open`] opened; every other export uses it.
    static CTX: RefCell<Option<GpuContext>> = const { RefCell::new(None) };
    /// The last panic's message (a panic reaches JavaScript only as "unreachable").
    static LAST_PANIC: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Runs when the module loads: panics go to the console and to [`last_panic`].
#[wasm_bindgen(start)]
fn start() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info.to_string();
        console_error(&msg);
        LAST_PANIC.with(|p| *p.borrow_mut() = msg);
    }));
}

/// The message of the last panic in this module, or an empty string.
#[wasm_bindgen]
pub fn last_panic() -> String {
    LAST_PANIC.with(|p| p.borrow().clone())
}

fn ctx() -> Result<GpuContext, JsError> {
    CTX.with(|c| c.borrow().clone())
        .ok_or_else(|| JsError::new("no device: call open() first"))
}

fn js(e: KvqError) -> JsError {
    JsError::new(&e.to_string())
}

fn json_str(s: &str) -> String {
    kvq::export::json_string(s)
}

/// Opens kvq on the browser's adapter and returns what kvq sees of it (JSON): name, backend,
/// the optional features it enabled, and the limits it was granted. An adapter below what
/// kvq needs is an error naming the limit (`AdapterTooWeak`).
#[wasm_bindgen]
pub async fn open() -> Result<String, JsError> {
    let ctx = GpuContext::new_async().await.map_err(js)?;
    let caps = ctx.capabilities();
    let l = ctx.device.limits();
    let out = format!(
        concat!(
            "{{\"name\":{},\"backend\":{},\"f16\":{},\"subgroups\":{},\"timestamps\":{},",
            "\"max_compute_workgroup_storage_size\":{},\"max_compute_invocations_per_workgroup\":{},",
            "\"max_storage_buffers_per_shader_stage\":{},\"max_storage_buffer_binding_size\":{},",
            "\"max_buffer_size\":{},\"tuning\":{}}}"
        ),
        json_str(&ctx.info.name),
        json_str(&format!("{:?}", ctx.info.backend)),
        caps.f16,
        caps.subgroups,
        caps.timestamps,
        l.max_compute_workgroup_storage_size,
        l.max_compute_invocations_per_workgroup,
        l.max_storage_buffers_per_shader_stage,
        l.max_storage_buffer_binding_size,
        l.max_buffer_size,
        json_str(ctx.tuning().name),
    );
    CTX.with(|c| *c.borrow_mut() = Some(ctx));
    Ok(out)
}

/// Seeded test data: kvq's own generator (SplitMix64), normal values by Box–Muller.
struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(SplitMix64::new(seed))
    }
    fn normal(&mut self) -> f32 {
        let u1 = ((self.0.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
    /// `n` values of N(0, 1); with `tails`, every 37th six times larger (a K with outlier
    /// channels, so that block and vector scales differ).
    fn values(&mut self, n: usize, tails: bool) -> Vec<f32> {
        (0..n)
            .map(|i| self.normal() * if tails && i % 37 == 0 { 6.0 } else { 1.0 })
            .collect()
    }
}

/// A storage buffer for `floats` f32 values that the page writes through the queue.
fn buffer(ctx: &GpuContext, floats: usize, read_back: bool) -> wgpu::Buffer {
    let mut usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
    if read_back {
        usage |= wgpu::BufferUsages::COPY_SRC;
    }
    ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: (floats * 4) as u64,
        usage,
        mapped_at_creation: false,
    })
}

/// A promise and the function that resolves it, for a wgpu callback to resolve.
fn promise() -> (js_sys::Promise, js_sys::Function) {
    let mut resolve = None;
    let p = js_sys::Promise::new(&mut |res, _rej| resolve = Some(res));
    (
        p,
        resolve.expect("the Promise constructor calls its executor at once"),
    )
}

/// Resolves when the GPU has finished everything submitted so far.
async fn queue_done(ctx: &GpuContext) -> Result<(), JsError> {
    let (p, resolve) = promise();
    ctx.queue.on_submitted_work_done(move || {
        let _ = resolve.call0(&JsValue::NULL);
    });
    JsFuture::from(p)
        .await
        .map_err(|_| JsError::new("the queue stopped"))?;
    Ok(())
}

/// Reads `floats` f32 values back from a COPY_SRC buffer.
async fn read_f32(
    ctx: &GpuContext,
    src: &wgpu::Buffer,
    floats: usize,
) -> Result<Vec<f32>, JsError> {
    let size = (floats * 4) as u64;
    let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("kvq-browser readback"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(src, 0, &staging, 0, size);
    ctx.queue.submit([enc.finish()]);
    let (p, resolve) = promise();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = resolve.call1(&JsValue::NULL, &JsValue::from_bool(r.is_ok()));
    });
    let ok = JsFuture::from(p)
        .await
        .map_err(|_| JsError::new("mapping a read-back failed"))?;
    if ok.as_bool() != Some(true) {
        return Err(JsError::new("mapping a read-back failed"));
    }
    let out = bytemuck::pod_collect_to_vec(
        &staging
            .get_mapped_range(..)
            .map_err(|e| JsError::new(&format!("{e:?}")))?,
    );
    staging.unmap();
    Ok(out)
}

/// Max |a - b| / max |b|; infinite where a GPU value is NaN or infinite.
fn rel_err(gpu: &[f32], reference: &[f64]) -> f64 {
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

/// Largest relative error of GPU attention against f64 attention over the GPU's own stored
/// rows decoded by the CPU reference: the kernels' arithmetic, as kvq's own tests check it.
pub const KERNEL_TOLERANCE: f64 = 1e-3;

/// f64 attention of the query `q` (`[q_heads, d]`) over `len` rows given as codec words by
/// KV head and token (`krow(h, t)`, `vrow(h, t)`), decoded by the CPU reference (with a QJL K,
/// its scores from the QJL estimator, as the GPU computes them).
fn reference(
    spec: &CacheSpec,
    kref: &CodecRef,
    vref: &CodecRef,
    len: usize,
    krow: &dyn Fn(usize, usize) -> Vec<u32>,
    vrow: &dyn Fn(usize, usize) -> Vec<u32>,
    q: &[f32],
) -> Vec<f64> {
    let (d, kvh, qh) = (
        spec.head_dim as usize,
        spec.kv_heads as usize,
        spec.q_heads as usize,
    );
    let mut k = Vec::with_capacity(len * kvh * d);
    let mut v = Vec::with_capacity(len * kvh * d);
    for t in 0..len {
        for h in 0..kvh {
            k.extend(kref.decode(&krow(h, t)));
            v.extend(vref.decode(&vrow(h, t)));
        }
    }
    let qb: Vec<f64> = q.iter().map(|&x| x as f64).collect();
    let scale = spec.softmax_scale() as f64;
    if spec.codecs.k.qjl {
        kvq::reference::attention_with_scores(&v, qh, kvh, d, |qi, h, t| {
            scale * kref.ip_estimate(&krow(h, t), &qb[qi * d..(qi + 1) * d])
        })
    } else {
        kvq::reference::attention(&qb, &k, &v, qh, kvh, d, scale)
    }
}

/// How a stored row compares with the reference encoder's row of the same input.
#[derive(Clone, Copy, PartialEq)]
enum RowMatch {
    /// Bit for bit.
    Equal,
    /// A rounding tie: every f16 scale within one f16 step of the reference's (the GPU's f32
    /// arithmetic against the reference's f64), and every code what the reference's rule gives
    /// under the GPU's own scale, or one code away where the value sits on a rounding boundary.
    Tie,
    /// Anything else: a wrong row.
    Differs,
}

fn compare_row(r: &CodecRef, x: &[f32], got: &[u32], want: &[u32]) -> RowMatch {
    if got == want {
        return RowMatch::Equal;
    }
    let c = r.codec();
    let l = r.layout();
    // f16 conversion has no ties to speak of; QJL's sign bits are not judged here.
    if c.kind == CodecKind::None || c.qjl {
        return RowMatch::Differs;
    }
    let (gs, ws) = (r.scales(got), r.scales(want));
    if gs
        .iter()
        .zip(&ws)
        .any(|(a, b)| (a - b).abs() > b.abs() * 1e-3 + 1e-7)
    {
        return RowMatch::Differs;
    }
    let xd: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let vals = if c.kind == CodecKind::Sym {
        xd
    } else {
        r.rotate(&xd)
    };
    let block = l.side_block.max(1) as usize;
    for (i, &code) in r.codes(got).iter().enumerate() {
        let (Some(&v), Some(&s)) = (vals.get(i), gs.get(i / block)) else {
            return RowMatch::Differs;
        };
        let t = if s > 0.0 { v / s } else { 0.0 };
        let hair = 1e-4 * t.abs().max(1.0);
        let (expect, on_edge) = if c.kind == CodecKind::Sym {
            let qmax = ((1i64 << (l.code_bits - 1)) - 1) as f64;
            let c = t.round().clamp(-qmax, qmax) as i64 + (1i64 << (l.code_bits - 1));
            (c as u32, (t.abs().fract() - 0.5).abs() <= hair)
        } else {
            let book = kvq::codec::codebook(c.bits);
            let edge = book
                .boundaries_f32()
                .iter()
                .any(|&b| (t - b as f64).abs() <= hair);
            (book.quantize(t), edge)
        };
        if code != expect && !(code.abs_diff(expect) == 1 && on_edge) {
            return RowMatch::Differs;
        }
    }
    RowMatch::Tie
}

/// Tokens each layer gets before the check's decode steps (appended at once: the wide append
/// path), and the check's fused decode steps: lengths that are no multiple of any tile.
const CHECK_PREFILL: u32 = 90;
const CHECK_STEPS: u32 = 6;
/// Untimed decode steps before the timed ones.
const WARMUP: u32 = 3;

/// The attention shape of every cache here: llama3-8b's (32 query heads over 8 KV heads,
/// GQA 4, head_dim 128), one sequence.
const SHAPE: (u32, u32, u32) = (32, 8, 128);

/// One codec's run on this adapter: checks kvq's outputs against the CPU reference, then
/// times decode steps, on one cache of `layers` layers of [`SHAPE`] (so that its kernels are
/// compiled once for both, which on a CPU adapter is most of the time).
///
/// The check: every layer gets [`CHECK_PREFILL`] random tokens, then [`CHECK_STEPS`] fused
/// decode steps (append + attend, 2 dispatches) with random K/V and queries; on the first and
/// the last layer each step's attention output is compared with f64 attention over the GPU's
/// stored rows decoded by the reference codec (within [`KERNEL_TOLERANCE`]), then a separate
/// attend of the whole layer (the host API's path) the same way, and every stored row with
/// the reference encoder's row of the same input ([`RowMatch`]: equal, or a rounding tie);
/// the GPU's lengths against what was appended.
///
/// The benchmark: every layer is filled with random tokens up to `context` (at least what the
/// check left), then `steps` fused decode steps over every layer, each step one submit, the
/// clock (`performance.now()`) read once the GPU has finished them all, after [`WARMUP`]
/// untimed steps.
///
/// Returns JSON: `{"codec", "check": {"ok", "kernel_err", "rows", "rows_equal", "rows_tied",
/// "lengths_ok", "problem", "ms"}, "bench": {"layers", "context", "steps", "ms_per_step",
/// "tokens_per_s", "bits_k", "bits_v", "kv_bytes", "device_bytes", "splits", "build_ms",
/// "ms"}}`; `"bench"` is null when the check failed.
#[wasm_bindgen]
pub async fn measure(
    codec: String,
    layers: u32,
    context: u32,
    steps: u32,
) -> Result<String, JsError> {
    let ctx = ctx()?;
    let codecs = KvCodecs::parse(&codec).map_err(js)?;
    if layers == 0 || steps == 0 {
        return Err(JsError::new("layers and steps must be at least 1"));
    }
    let context = context.max(CHECK_PREFILL + CHECK_STEPS);
    let (qh, kvh, d) = SHAPE;
    let t0 = performance_now();
    let spec = CacheSpec::new(layers, qh, kvh, d, context + WARMUP + steps).with_codecs(codecs);
    let mut cache = KvCache::new_async(&ctx, spec.clone()).await.map_err(js)?;
    let build_ms = performance_now() - t0;
    let kref = CodecRef::new(codecs.k, d, spec.seed).map_err(js)?;
    let vref = CodecRef::new(codecs.v, d, spec.seed).map_err(js)?;
    let (kw, vw) = (kref.layout().words as usize, vref.layout().words as usize);
    let (dd, kvh_, cap) = (d as usize, kvh as usize, spec.capacity as usize);
    let tok = kvh_ * dd; // K or V values per token
    let qn = (qh * d) as usize;
    let checked = |layer: u32| layer == 0 || layer + 1 == layers;
    let mut rng = Rng::new(7);

    // The check. The K/V of the checked layers as the CPU sees them, [layer][t][h][d].
    let mut k_all = vec![Vec::with_capacity(cap * tok); layers as usize];
    let mut v_all = k_all.clone();
    let n0 = CHECK_PREFILL as usize;
    for layer in 0..layers {
        let (k, v) = (rng.values(n0 * tok, true), rng.values(n0 * tok, false));
        cache.append_host(layer, &k, &v).map_err(js)?;
        if checked(layer) {
            k_all[layer as usize].extend(k);
            v_all[layer as usize].extend(v);
        }
    }
    // The fused decode step's buffers, as an engine binds them once; the benchmark reuses them.
    let (kb, vb) = (buffer(&ctx, tok, false), buffer(&ctx, tok, false));
    let (qb, ob) = (buffer(&ctx, qn, false), buffer(&ctx, qn, true));
    let io: StepIo = cache
        .step_io(&kb, &vb, 1, InputType::F32, &qb, &ob)
        .map_err(js)?;
    ctx.check_errors_async().await.map_err(js)?;
    // Max error of `out` for the query `q` over the first `len` stored rows of `layer`.
    let attention_err = async |cache: &KvCache, layer: u32, len: usize, q: &[f32], out: &[f32]| {
        let (krows, vrows) = cache.read_rows_async(layer).await.map_err(js)?;
        let k = |h: usize, t: usize| krows[(h * cap + t) * kw..][..kw].to_vec();
        let v = |h: usize, t: usize| vrows[(h * cap + t) * vw..][..vw].to_vec();
        let want = reference(&spec, &kref, &vref, len, &k, &v, q);
        Ok::<f64, JsError>(rel_err(out, &want))
    };
    let mut kernel_err = 0.0f64;
    for step in 0..CHECK_STEPS as usize {
        for layer in 0..layers {
            let (k, v) = (rng.values(tok, true), rng.values(tok, false));
            let q = rng.values(qn, false);
            ctx.queue.write_buffer(&kb, 0, bytemuck::cast_slice(&k));
            ctx.queue.write_buffer(&vb, 0, bytemuck::cast_slice(&v));
            ctx.queue.write_buffer(&qb, 0, bytemuck::cast_slice(&q));
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            cache.step(&mut enc, layer, &io).map_err(js)?;
            ctx.queue.submit([enc.finish()]);
            if checked(layer) {
                k_all[layer as usize].extend(k);
                v_all[layer as usize].extend(v);
                let out = read_f32(&ctx, &ob, qn).await?;
                let e = attention_err(&cache, layer, n0 + step + 1, &q, &out).await?;
                kernel_err = kernel_err.max(e);
            }
        }
    }
    let total = n0 + CHECK_STEPS as usize;
    let (mut rows, mut equal, mut tied) = (0usize, 0usize, 0usize);
    let mut problem = String::new();
    for layer in (0..layers).filter(|&l| checked(l)) {
        // The separate attend over the whole layer.
        let q = rng.values(qn, false);
        let out = cache.attend_host_async(layer, &q).await.map_err(js)?;
        kernel_err = kernel_err.max(attention_err(&cache, layer, total, &q, &out).await?);
        // Every stored row against the reference encoder's.
        let (krows, vrows) = cache.read_rows_async(layer).await.map_err(js)?;
        let (ka, va) = (&k_all[layer as usize], &v_all[layer as usize]);
        for h in 0..kvh_ {
            for t in 0..total {
                let x = (t * kvh_ + h) * dd..(t * kvh_ + h + 1) * dd;
                for (side, r, all, stored, w) in
                    [("K", &kref, ka, &krows, kw), ("V", &vref, va, &vrows, vw)]
                {
                    let (x, got) = (&all[x.clone()], &stored[(h * cap + t) * w..][..w]);
                    rows += 1;
                    match compare_row(r, x, got, &r.encode(x)) {
                        RowMatch::Equal => equal += 1,
                        RowMatch::Tie => tied += 1,
                        RowMatch::Differs if problem.is_empty() => {
                            problem = format!(
                                "layer {layer} token {t} KV head {h}: the stored {side} row differs from the reference encoder's"
                            );
                        }
                        RowMatch::Differs => {}
                    }
                }
            }
        }
    }
    let (lens, overflow) = cache.read_gpu_lengths_async().await.map_err(js)?;
    let lengths_ok = lens.iter().all(|&l| l as usize == total) && overflow.iter().all(|&o| o == 0);
    if !lengths_ok && problem.is_empty() {
        problem =
            format!("GPU lengths {lens:?} (overflow flags {overflow:?}), expected {total} each");
    }
    if kernel_err > KERNEL_TOLERANCE && problem.is_empty() {
        problem = format!(
            "attention error {kernel_err:.2e} against the f64 reference (tolerance {KERNEL_TOLERANCE:.0e})"
        );
    }
    let ok = lengths_ok && kernel_err <= KERNEL_TOLERANCE && equal + tied == rows;
    let check = format!(
        concat!(
            "{{\"ok\":{},\"kernel_err\":{:e},\"rows\":{},\"rows_equal\":{},\"rows_tied\":{},",
            "\"lengths_ok\":{},\"problem\":{},\"ms\":{:.0}}}"
        ),
        ok,
        kernel_err,
        rows,
        equal,
        tied,
        lengths_ok,
        json_str(&problem),
        performance_now() - t0,
    );
    if !ok {
        return Ok(format!(
            "{{\"codec\":{},\"check\":{check},\"bench\":null}}",
            json_str(&codec)
        ));
    }

    // The benchmark.
    let t1 = performance_now();
    let chunk = 1024;
    for layer in 0..layers {
        let mut len = total as u32;
        while len < context {
            let n = chunk.min(context - len) as usize;
            let (k, v) = (rng.values(n * tok, true), rng.values(n * tok, false));
            cache.append_host(layer, &k, &v).map_err(js)?;
            len += n as u32;
        }
    }
    ctx.queue
        .write_buffer(&kb, 0, bytemuck::cast_slice(&rng.values(tok, true)));
    ctx.queue
        .write_buffer(&vb, 0, bytemuck::cast_slice(&rng.values(tok, false)));
    ctx.queue
        .write_buffer(&qb, 0, bytemuck::cast_slice(&rng.values(qn, false)));
    let run = |cache: &mut KvCache, n: u32| -> Result<(), JsError> {
        for _ in 0..n {
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for layer in 0..layers {
                    cache.step_in_pass(&mut pass, layer, &io).map_err(js)?;
                }
            }
            ctx.queue.submit([enc.finish()]);
        }
        Ok(())
    };
    run(&mut cache, WARMUP)?;
    queue_done(&ctx).await?;
    let t2 = performance_now();
    run(&mut cache, steps)?;
    queue_done(&ctx).await?;
    let ms = (performance_now() - t2) / steps as f64;
    let mem = cache.memory();
    Ok(format!(
        concat!(
            "{{\"codec\":{},\"check\":{},\"bench\":{{\"layers\":{},\"context\":{},\"steps\":{},",
            "\"ms_per_step\":{:.4},\"tokens_per_s\":{:.3},\"bits_k\":{:.3},\"bits_v\":{:.3},",
            "\"kv_bytes\":{},\"device_bytes\":{},\"splits\":{},\"build_ms\":{:.0},\"ms\":{:.0}}}}}"
        ),
        json_str(&codec),
        check,
        layers,
        context,
        steps,
        ms,
        1000.0 / ms,
        codecs.k.bits_per_value(d),
        codecs.v.bits_per_value(d),
        mem.store(),
        mem.total(),
        cache.kernel_config().splits,
        build_ms,
        performance_now() - t1,
    ))
}
