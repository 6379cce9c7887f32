//! Typed errors for bad input, zero host traffic per recorded step, and f16 inputs.

mod common;

use common::{Rng, attend_poisoned, ctx, rel_err};
use kvq::{CacheSpec, InputType, KvCache, KvCodecs, KvqError, reference};

fn buffer(size: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
    ctx().device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size,
        usage,
        mapped_at_creation: false,
    })
}

#[test]
fn matrix_units_the_device_lacks_are_typed_errors() {
    // Fragments kvq has no kernels for, row counts other than F or 2 F, and hardware units on
    // a device without cooperative matrices: AdapterTooWeak, the context unchanged.
    let units = |fragment, emulated, rows| kvq::MatrixUnits {
        fragment,
        emulated,
        rows,
    };
    for bad in [units(12, true, 24), units(16, true, 48), units(16, true, 8)] {
        let got = ctx().clone().with_matrix_units(Some(bad));
        assert!(
            matches!(got, Err(KvqError::AdapterTooWeak { .. })),
            "{bad:?}"
        );
    }
    if !ctx()
        .device
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    {
        let got = ctx()
            .clone()
            .with_matrix_units(Some(kvq::MatrixUnits::new(16, false)));
        assert!(matches!(got, Err(KvqError::AdapterTooWeak { .. })));
    }
    // Emulated units run anywhere with shader-f16, and None turns them off again.
    let emulated = ctx()
        .clone()
        .with_matrix_units(Some(kvq::MatrixUnits::new(8, true)));
    let emulated = emulated.expect("emulated units");
    assert_eq!(
        emulated.matrix_units(),
        Some(kvq::MatrixUnits::new(8, true))
    );
    assert_eq!(
        emulated.with_matrix_units(None).unwrap().matrix_units(),
        None
    );
}

#[test]
fn bad_specs_are_typed_errors() {
    let bad = [
        CacheSpec::new(1, 6, 4, 64, 16),   // GQA not whole
        CacheSpec::new(1, 129, 1, 64, 16), // GQA 129, past the 128 served
        CacheSpec::new(0, 4, 4, 64, 16),   // no layers
        CacheSpec::new(1, 4, 4, 64, 0),    // no capacity
        CacheSpec::new(1, 4, 0, 64, 16),   // no kv heads
        CacheSpec::new(1, 4, 4, 64, 16).with_batch(0),
        CacheSpec::new(1, 4, 4, 64, 16).with_splits(0),
        // Past the u32 slot arithmetic of a ring.
        CacheSpec::new(1, 4, 4, 64, kvq::MAX_CAPACITY + 1).with_window(64),
        // A QJL residual on V, built directly rather than parsed (the kernels have none).
        CacheSpec::new(1, 4, 4, 64, 16).with_codecs(KvCodecs {
            k: kvq::Codec::turbo(3),
            v: kvq::Codec::turbo(3).with_qjl(true),
        }),
    ];
    for spec in bad {
        match KvCache::new(ctx(), spec.clone()) {
            Err(KvqError::InvalidSpec(msg)) => assert!(!msg.is_empty()),
            Err(e) => panic!("{spec:?}: unexpected error {e}"),
            Ok(_) => panic!("{spec:?} was accepted"),
        }
    }
    for d in [0, 100, 512] {
        assert!(matches!(
            KvCache::new(ctx(), CacheSpec::new(1, 4, 4, d, 16)),
            Err(KvqError::UnsupportedHeadDim { .. })
        ));
    }
    // The QJL-only quality configuration has a CPU reference but no GPU kernels: a typed error.
    let quantized =
        CacheSpec::new(1, 4, 4, 64, 16).with_codecs(KvCodecs::parse("k_turbo0+qjl").unwrap());
    assert!(
        matches!(KvCache::new(ctx(), quantized), Err(KvqError::InvalidSpec(m)) if m.contains("turbo0+qjl"))
    );
    let e = KvCodecs::parse("k_nonsense9").unwrap_err();
    assert!(
        matches!(&e, KvqError::UnknownCodec { valid, .. } if valid.contains("none")),
        "{e}"
    );
}

#[test]
fn bad_calls_are_typed_errors_and_change_nothing() {
    let spec = CacheSpec::new(2, 4, 2, 64, 10);
    let mut cache = KvCache::new(ctx(), spec).unwrap();
    let tok = vec![0.5f32; 2 * 64];
    assert!(matches!(
        cache.append_host(2, &tok, &tok),
        Err(KvqError::LayerOutOfRange {
            layer: 2,
            layers: 2
        })
    ));
    assert!(matches!(
        cache.append_host(0, &tok[1..], &tok[1..]),
        Err(KvqError::WrongLength { .. })
    ));
    assert!(matches!(
        cache.append_host(0, &tok, &tok[..64]),
        Err(KvqError::WrongLength { .. })
    ));
    assert!(matches!(
        cache.append_host(0, &[], &[]),
        Err(KvqError::WrongLength { .. })
    ));
    assert!(matches!(
        cache.attend_host(0, &vec![0.0; 4 * 64]),
        Err(KvqError::EmptySequence { layer: 0, seq: 0 })
    ));
    assert!(matches!(
        cache.attend_host(0, &[0.0; 3]),
        Err(KvqError::WrongLength { .. })
    ));

    let mut rng = Rng::new(3);
    let k = rng.normals(8 * 2 * 64, 1.0);
    let v = rng.normals(8 * 2 * 64, 1.0);
    cache.append_host(0, &k, &v).unwrap();
    let q = rng.normals(4 * 64, 1.0);
    let before = cache.attend_host(0, &q).unwrap();
    // 8 + 3 > 10: refused, and neither the host mirror nor the GPU store moves.
    let three = rng.normals(3 * 2 * 64, 1.0);
    let e = cache.append_host(0, &three, &three).unwrap_err();
    assert!(
        matches!(
            e,
            KvqError::CapacityExceeded {
                layer: 0,
                len: 8,
                n: 3,
                capacity: 10
            }
        ),
        "{e}"
    );
    assert_eq!(cache.len(0, 0).unwrap(), 8);
    assert_eq!(cache.read_gpu_lengths().unwrap().0, vec![8, 0]);
    assert_eq!(cache.attend_host(0, &q).unwrap(), before);

    // Caller buffers: too small, or lacking STORAGE.
    let small = buffer(16, wgpu::BufferUsages::STORAGE);
    let right = buffer(2 * 64 * 4, wgpu::BufferUsages::STORAGE);
    let no_storage = buffer(2 * 64 * 4, wgpu::BufferUsages::COPY_DST);
    assert!(matches!(
        cache.append_input(&small, &right, 1, InputType::F32),
        Err(KvqError::BadBuffer { .. })
    ));
    assert!(matches!(
        cache.append_input(&right, &no_storage, 1, InputType::F32),
        Err(KvqError::BadBuffer { .. })
    ));
    assert!(matches!(
        cache.append_input(&right, &right, 0, InputType::F32),
        Err(KvqError::InvalidArgument(_))
    ));
    let qbuf = buffer(4 * 64 * 4, wgpu::BufferUsages::STORAGE);
    assert!(matches!(
        cache.attend_io(&qbuf, &small),
        Err(KvqError::BadBuffer { .. })
    ));
}

/// A recorded decode step (append + attend for every layer) uploads and reads back nothing,
/// and records a fixed 3 dispatches per layer.
#[test]
fn recorded_step_moves_zero_host_bytes() {
    let layers = 4;
    let spec = CacheSpec::new(layers, 8, 2, 64, 128).with_splits(2);
    // A private context: the shared one's counters also count concurrent tests.
    let gpu = common::private_ctx();
    let mut cache = KvCache::new(&gpu, spec).unwrap();
    let buffer = |size: u64, usage: wgpu::BufferUsages| {
        gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage,
            mapped_at_creation: false,
        })
    };
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
    let k = buffer(2 * 64 * 4, usage);
    let v = buffer(2 * 64 * 4, usage);
    let q = buffer(8 * 64 * 4, usage);
    let out = buffer(8 * 64 * 4, usage);
    let mut rng = Rng::new(9);
    gpu.queue
        .write_buffer(&k, 0, bytemuck::cast_slice(&rng.normals(128, 1.0)));
    gpu.queue
        .write_buffer(&v, 0, bytemuck::cast_slice(&rng.normals(128, 1.0)));
    gpu.queue
        .write_buffer(&q, 0, bytemuck::cast_slice(&rng.normals(512, 1.0)));
    let input = cache.append_input(&k, &v, 1, InputType::F32).unwrap();
    let io = cache.attend_io(&q, &out).unwrap();
    for _step in 0..3 {
        let before = gpu.stats();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for layer in 0..layers {
                cache.append_in_pass(&mut pass, layer, &input).unwrap();
                cache.attend_in_pass(&mut pass, layer, &io).unwrap();
            }
        }
        let d = gpu.stats() - before;
        assert_eq!((d.bytes_uploaded, d.bytes_downloaded), (0, 0));
        assert_eq!(d.dispatches, 3 * layers as u64);
        gpu.queue.submit([enc.finish()]);
    }
    assert_eq!(
        cache.read_gpu_lengths().unwrap().0,
        vec![3; layers as usize]
    );
}

/// f16 inputs (two halves per word) append the same values as f32 inputs.
/// f64 attention of query `q` over K/V rows `[tokens, kv_heads, d]` stored as f16, at the
/// default scale.
fn f16_attention(q: &[f32], k: &[f32], v: &[f32], qh: usize, kvh: usize, d: usize) -> Vec<f64> {
    let q64: Vec<f64> = q.iter().map(|&x| x as f64).collect();
    reference::attention(
        &q64,
        &reference::round_f16(k),
        &reference::round_f16(v),
        qh,
        kvh,
        d,
        1.0 / (d as f64).sqrt(),
    )
}

#[test]
fn f16_input_matches_reference() {
    let spec = CacheSpec::new(1, 4, 2, 96, 100).with_splits(2);
    let mut cache = KvCache::new(ctx(), spec).unwrap();
    let mut rng = Rng::new(17);
    let n = 70u32; // wide path
    let k = rng.normals(n as usize * 2 * 96, 1.0);
    let v = rng.normals(n as usize * 2 * 96, 1.0);
    let halves = |x: &[f32]| {
        x.iter()
            .map(|&f| half::f16::from_f32(f).to_bits())
            .collect::<Vec<u16>>()
    };
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
    let kb = buffer(k.len() as u64 * 2, usage);
    let vb = buffer(v.len() as u64 * 2, usage);
    ctx()
        .queue
        .write_buffer(&kb, 0, bytemuck::cast_slice(&halves(&k)));
    ctx()
        .queue
        .write_buffer(&vb, 0, bytemuck::cast_slice(&halves(&v)));
    let input = cache.append_input(&kb, &vb, n, InputType::F16).unwrap();
    let mut enc = ctx().device.create_command_encoder(&Default::default());
    cache.append(&mut enc, 0, &input).unwrap();
    ctx().queue.submit([enc.finish()]);
    let q = rng.normals(4 * 96, 2.0);
    let got = attend_poisoned(&cache, 0, &q);
    let want = f16_attention(&q, &k, &v, 4, 2, 96);
    let e = rel_err(&got, &want);
    assert!(e <= 1e-3, "rel err {e:e}");
}

/// Buffers of another device (of the same wgpu instance) are a typed error when bound, not a
/// report to wgpu's uncaptured-error handler, and the cache stays usable.
#[test]
fn foreign_device_buffers_are_typed_errors() {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(instance.request_adapter(&Default::default())).unwrap();
    let (features, limits) = kvq::GpuContext::device_requirements(&adapter).unwrap();
    let device = || {
        pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .unwrap()
    };
    let (dev, queue) = device();
    let (other, _) = device();
    let ctx = kvq::GpuContext::from_device(dev.clone(), queue, adapter.get_info());
    let mut cache = KvCache::new(&ctx, CacheSpec::new(1, 4, 2, 64, 16)).unwrap();
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
    let on = |d: &wgpu::Device, size: u64| {
        d.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage,
            mapped_at_creation: false,
        })
    };
    let (kv, qo) = (2 * 64 * 4, 4 * 64 * 4);
    let (k, v, q) = (on(&dev, kv), on(&dev, kv), on(&dev, qo));
    let (fk, fq) = (on(&other, kv), on(&other, qo));
    let is_bad = |r: kvq::Result<()>| matches!(r, Err(KvqError::BadBuffer { .. }));
    assert!(is_bad(
        cache.append_input(&fk, &v, 1, InputType::F32).map(|_| ())
    ));
    assert!(is_bad(cache.attend_io(&fq, &q).map(|_| ())));
    assert!(is_bad(
        cache
            .step_io(&k, &v, 1, InputType::F32, &q, &fq)
            .map(|_| ())
    ));
    // Still usable with its own device's buffers.
    let mut rng = Rng::new(5);
    let n = kv as usize / 4;
    cache
        .append_host(0, &rng.normals(n, 1.0), &rng.normals(n, 1.0))
        .unwrap();
    let out = cache
        .attend_host(0, &rng.normals(qo as usize / 4, 1.0))
        .unwrap();
    assert!(out.iter().all(|x| x.is_finite()));
}

/// A buffer kvq writes that is also passed as another argument, and io objects recorded on a
/// cache that did not prepare them: typed errors, nothing recorded (wgpu would otherwise
/// panic when the caller's encoder is finished, or the kernels index another cache's shape).
#[test]
fn aliased_buffers_and_another_caches_io_are_typed_errors() {
    let a = KvCache::new(ctx(), CacheSpec::new(1, 4, 2, 64, 16)).unwrap();
    let mut b = KvCache::new(ctx(), CacheSpec::new(2, 8, 4, 64, 16)).unwrap();
    let usage = wgpu::BufferUsages::STORAGE;
    let (kv, qo) = (4 * 4 * 64 * 4, 8 * 4 * 64 * 4);
    let (k, v, q, out) = (
        buffer(kv, usage),
        buffer(kv, usage),
        buffer(qo, usage),
        buffer(qo, usage),
    );
    let bad = |r: kvq::Result<()>, what: &str| match r {
        Err(KvqError::BadBuffer { what: w, problem }) => {
            assert_eq!(w, what, "{problem}");
            assert!(problem.contains("also passed"), "{problem}");
        }
        r => panic!("{what}: {r:?}"),
    };
    bad(a.attend_io(&q, &q).map(|_| ()), "out");
    bad(
        a.step_io(&k, &v, 1, InputType::F32, &q, &q).map(|_| ()),
        "out",
    );
    bad(
        a.step_io(&k, &v, 1, InputType::F32, &q, &k).map(|_| ()),
        "out",
    );
    bad(
        a.chunk_io(&k, &v, 4, InputType::F32, &q, &q).map(|_| ()),
        "out",
    );
    // A chunk's K/V are appended before its attention writes: they may share out's buffer,
    // unless each slice is appended just before it is attended (recent exact tokens).
    a.chunk_io(&k, &v, 4, InputType::F32, &q, &v).unwrap();
    let x = KvCache::new(ctx(), CacheSpec::new(1, 4, 2, 64, 16).with_exact(2, 4)).unwrap();
    bad(
        x.chunk_io(&k, &v, 4, InputType::F32, &q, &v).map(|_| ()),
        "out",
    );
    bad(
        a.chunk_io_lse(&k, &v, 4, InputType::F32, &q, &out, &out)
            .map(|_| ()),
        "out",
    );
    // K and V may share a buffer: kvq only reads them.
    a.step_io(&k, &k, 1, InputType::F32, &q, &out).unwrap();

    // Every io object of cache a, recorded on cache b.
    let append = a.append_input(&k, &v, 1, InputType::F32).unwrap();
    let attend = a.attend_io(&q, &out).unwrap();
    let step = a.step_io(&k, &v, 1, InputType::F32, &q, &out).unwrap();
    let chunk = a.chunk_io(&k, &v, 2, InputType::F32, &q, &out).unwrap();
    let mut enc = ctx().device.create_command_encoder(&Default::default());
    let wrong = |r: kvq::Result<()>, what: &str| {
        assert!(
            matches!(r, Err(KvqError::WrongCache { what: w }) if w == what),
            "{what}: {r:?}"
        )
    };
    wrong(b.append(&mut enc, 1, &append), "AppendInput");
    wrong(b.attend(&mut enc, 1, &attend), "AttendIo");
    wrong(b.step(&mut enc, 1, &step), "StepIo");
    wrong(b.chunk(&mut enc, 1, &chunk), "ChunkIo");
    ctx().queue.submit([enc.finish()]);
    assert!(b.is_empty());
    assert_eq!(b.read_gpu_lengths().unwrap().0, vec![0, 0]);
}

/// Every ChunkIo of a cache binds one chunk scratch, which memory() reports: a chunk io per
/// layer costs no more scratch than one, and a longer chunk replaces it.
#[test]
fn chunk_ios_share_one_scratch_that_memory_reports() {
    let spec = CacheSpec::new(3, 4, 2, 64, 600);
    let cache = KvCache::new(ctx(), spec).unwrap();
    assert_eq!(cache.memory().chunk_scratch, 0);
    let usage = wgpu::BufferUsages::STORAGE;
    let n = 300u64;
    let (k, v, q, out) = (
        buffer(n * 2 * 64 * 4, usage),
        buffer(n * 2 * 64 * 4, usage),
        buffer(n * 4 * 64 * 4, usage),
        buffer(n * 4 * 64 * 4, usage),
    );
    let small: Vec<_> = (0..3)
        .map(|_| cache.chunk_io(&k, &v, 8, InputType::F32, &q, &out).unwrap())
        .collect();
    let one = small[0].scratch_bytes();
    assert!(one > 0);
    assert!(small.iter().all(|c| c.scratch_bytes() == one));
    let m = cache.memory();
    assert_eq!(m.chunk_scratch, one);
    assert!(m.total() >= m.store() + m.scratch + one);
    // A longer chunk (a whole slice) needs more: the cache's scratch grows, once.
    let long = cache
        .chunk_io(&k, &v, n as u32, InputType::F32, &q, &out)
        .unwrap();
    assert!(long.scratch_bytes() > one);
    assert_eq!(cache.memory().chunk_scratch, long.scratch_bytes());
    let again = cache.chunk_io(&k, &v, 8, InputType::F32, &q, &out).unwrap();
    assert_eq!(again.scratch_bytes(), long.scratch_bytes());
}

/// Append, fused step and attend on `gpu` for `codecs`: (the step's output, then attend's).
fn step_then_attend(gpu: &kvq::GpuContext, codecs: KvCodecs) -> (Vec<f32>, Vec<f32>) {
    let spec = CacheSpec::new(1, 4, 2, 64, 100)
        .with_codecs(codecs)
        .with_splits(3);
    let mut cache = KvCache::new(gpu, spec).unwrap();
    let mut rng = Rng::new(29);
    let n = 90;
    cache
        .append_host(
            0,
            &rng.normals(n * 2 * 64, 1.0),
            &rng.normals(n * 2 * 64, 1.0),
        )
        .unwrap();
    let buf = |data: &[f32]| common::storage_buffer(gpu, data);
    let (k, v) = (
        buf(&rng.normals(2 * 64, 1.0)),
        buf(&rng.normals(2 * 64, 1.0)),
    );
    let q = rng.normals(4 * 64, 2.0);
    let (qb, ob) = (buf(&q), buf(&[f32::NAN; 4 * 64]));
    let io = cache.step_io(&k, &v, 1, InputType::F32, &qb, &ob).unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    cache.step(&mut enc, 0, &io).unwrap();
    gpu.queue.submit([enc.finish()]);
    let stepped = common::read_f32(gpu, &ob, 4 * 64);
    (stepped, attend_poisoned(&cache, 0, &q))
}

/// The kernels as users get them (no poisoned workgroup memory, and no zeroing of it) give
/// what the poisoned kernels of every other test give, for a codec of each family, in the
/// append, fused-step and attend modules.
#[test]
fn unpoisoned_kernels_match_poisoned() {
    let plain = common::unpoisoned_ctx();
    assert!(!plain.workgroup_poison() && ctx().workgroup_poison());
    for name in ["none", "q4_sym", "turbo3_sym"] {
        let codecs = KvCodecs::parse(name).unwrap();
        let (s0, a0) = step_then_attend(ctx(), codecs);
        let (s1, a1) = step_then_attend(&plain, codecs);
        assert!(s0.iter().chain(&a0).all(|x| x.is_finite()), "{name}");
        for (got, want) in [(&s1, &s0), (&a1, &a0)] {
            let want: Vec<f64> = want.iter().map(|&x| x as f64).collect();
            let e = rel_err(got, &want);
            assert!(e <= 1e-6, "{name}: unpoisoned differs by {e:e}");
        }
    }
}

/// A context asking for all of wgpu's shader runtime checks (loop bounding too, which kvq
/// leaves out by default) builds the same kernels and gets the same attention.
#[test]
fn shader_checks_on_match_reference() {
    let gpu = common::private_ctx().with_shader_checks(true);
    assert!(gpu.shader_checks() && !ctx().shader_checks());
    let spec = CacheSpec::new(1, 4, 2, 64, 80).with_splits(2);
    let mut cache = KvCache::new(&gpu, spec).unwrap();
    let mut rng = Rng::new(23);
    let k = rng.normals(70 * 2 * 64, 1.0);
    let v = rng.normals(70 * 2 * 64, 1.0);
    cache.append_host(0, &k, &v).unwrap();
    let q = rng.normals(4 * 64, 2.0);
    let got = cache.attend_host(0, &q).unwrap();
    let want = f16_attention(&q, &k, &v, 4, 2, 64);
    let e = rel_err(&got, &want);
    assert!(e <= 1e-3, "rel err {e:e}");
}

#[test]
fn a_dispatch_timer_names_each_kernel_and_leaves_the_outputs_alone() {
    // The same chunk on two like caches, one recorded with each dispatch timed: the same
    // outputs bit for bit, and the timer names what ran (the append and its commit, the
    // prefill kernel and its reduce, per layer).
    let gpu = ctx();
    assert!(
        gpu.capabilities().timestamps_in_passes,
        "the adapter has no timestamps inside compute passes"
    );
    assert!(matches!(
        kvq::DispatchTimer::new(gpu, 0),
        Err(KvqError::InvalidArgument(_))
    ));
    let spec = CacheSpec::new(2, 8, 2, 64, 300)
        .with_codecs(KvCodecs::parse("q4_sym").unwrap())
        .with_prefill_from(1);
    let n = 40u32;
    let mut rng = Rng::new(7);
    let per = (n * 2 * 64) as usize;
    let (k, v, q) = (
        rng.normals(per, 1.0),
        rng.normals(per, 1.0),
        rng.normals((n * 8 * 64) as usize, 1.0),
    );
    let (kb, vb, qb) = (
        common::storage_buffer(gpu, &k),
        common::storage_buffer(gpu, &v),
        common::storage_buffer(gpu, &q),
    );
    let mut timer = kvq::DispatchTimer::new(gpu, 6).unwrap();
    let mut outs = Vec::new();
    for timed in [false, true] {
        let mut cache = KvCache::new(gpu, spec.clone()).unwrap();
        let ob = common::storage_buffer(gpu, &vec![f32::NAN; q.len()]);
        let io = cache
            .chunk_io(&kb, &vb, n, InputType::F32, &qb, &ob)
            .unwrap();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for layer in 0..2 {
                match timed {
                    true => cache.chunk_in_timed_pass(&mut pass, layer, &io, &mut timer),
                    false => cache.chunk_in_pass(&mut pass, layer, &io),
                }
                .unwrap();
            }
        }
        timer.resolve(&mut enc);
        gpu.queue.submit([enc.finish()]);
        outs.push(common::read_f32(gpu, &ob, q.len()));
    }
    assert!(outs[1].iter().all(|x| x.is_finite()));
    assert_eq!(outs[0], outs[1]);
    // 4 dispatches a layer, the timer holds 6: the last 2 are recorded untimed.
    assert_eq!((timer.len(), timer.dropped()), (6, 2));
    let times = timer.read(gpu).unwrap();
    let names: Vec<_> = times.iter().map(|t| (t.entry, t.dispatches)).collect();
    let want = [
        ("append_wide", 2),
        ("append_commit", 2),
        ("prefill", 1),
        ("reduce", 1),
    ];
    assert_eq!(names, want);
    assert!(times.iter().all(|t| t.ms >= 0.0 && t.ms.is_finite()));
    timer.clear();
    assert!(timer.is_empty() && timer.dropped() == 0);
}

/// A recording dropped instead of submitted leaves the host mirror ahead of the GPU;
/// `sync_lengths` brings it back, so a cut to the dropped length is refused rather than
/// attending rows never written.
#[test]
fn sync_lengths_undoes_a_dropped_recording() {
    let spec = CacheSpec::new(2, 4, 2, 64, 10);
    let mut cache = KvCache::new(ctx(), spec).unwrap();
    let mut rng = Rng::new(5);
    let (k, v) = (rng.normals(4 * 2 * 64, 1.0), rng.normals(4 * 2 * 64, 1.0));
    for layer in 0..2 {
        cache.append_host(layer, &k, &v).unwrap();
    }
    let kb = buffer(2 * 64 * 4, wgpu::BufferUsages::STORAGE);
    let input = cache.append_input(&kb, &kb, 1, InputType::F32).unwrap();
    let mut enc = ctx().device.create_command_encoder(&Default::default());
    cache.append(&mut enc, 0, &input).unwrap();
    // Layer 2 of 2: the loop fails part-way, and its encoder is dropped unsubmitted.
    assert!(matches!(
        cache.append(&mut enc, 2, &input),
        Err(KvqError::LayerOutOfRange { .. })
    ));
    drop(enc);
    assert_eq!(cache.len(0, 0).unwrap(), 5);
    assert_eq!(cache.read_gpu_lengths().unwrap().0, vec![4, 4]);
    cache.sync_lengths().unwrap();
    assert_eq!((cache.len(0, 0).unwrap(), cache.len(1, 0).unwrap()), (4, 4));
    assert!(matches!(
        cache.truncate(0, 5),
        Err(KvqError::InvalidArgument(_))
    ));
}

/// Caches that differ only in capacity, batch, window and splits share their context's
/// compiled kernels where the adapter's tuning reads those from uniforms (every adapter but the
/// measured NVIDIA GPUs, whose tuning bakes them: there each compiles its own); either way
/// they attend as the reference does.
#[test]
fn caches_of_other_sizes_compile_nothing_new() {
    // A device of its own: the shared context's count also counts the other tests' compiles.
    let gpu = common::device_ctx().with_workgroup_poison(true);
    let codecs = KvCodecs::parse("q4_sym").unwrap();
    let specs = [
        CacheSpec::new(2, 8, 2, 64, 200).with_codecs(codecs),
        CacheSpec::new(2, 8, 2, 64, 3000)
            .with_codecs(codecs)
            .with_batch(3),
        CacheSpec::new(2, 8, 2, 64, 48)
            .with_codecs(codecs)
            .with_window(40),
    ];
    let mut rng = Rng::new(46);
    let mut compiled = Vec::new();
    for spec in specs {
        let mut cache = KvCache::new(&gpu, spec.clone()).unwrap();
        let (b, kvh, qh, d) = (
            spec.batch as usize,
            spec.kv_heads as usize,
            spec.q_heads as usize,
            spec.head_dim as usize,
        );
        // 70 tokens: past the third cache's window and ring, so its slots wrap.
        let n = 70;
        let k = rng.normals(b * n * kvh * d, 1.0);
        let v = rng.normals(b * n * kvh * d, 1.0);
        cache.append_host(1, &k, &v).unwrap();
        let q = rng.normals(b * qh * d, 1.5);
        let out = cache.attend_host(1, &q).unwrap();
        compiled.push(gpu.compiled_pipelines());
        // f64 attention over each sequence's attended tokens, from the GPU's stored rows.
        let (krows, vrows) = cache.read_rows(1).unwrap();
        let window = spec.window.unwrap_or(spec.capacity) as usize;
        for s in 0..b {
            let slots: Vec<usize> = (n - n.min(window)..n)
                .map(|p| p % spec.capacity as usize)
                .collect();
            let want = common::reference_over_rows(
                &spec,
                &krows,
                &vrows,
                s,
                &slots,
                &q[s * qh * d..(s + 1) * qh * d],
            );
            let err = rel_err(&out[s * qh * d..(s + 1) * qh * d], &want);
            assert!(err < 2e-3, "{spec:?} sequence {s}: {err}");
        }
    }
    assert!(compiled[0] > 0);
    // (KVQ_BAKE, a measurement aid, bakes shape numbers back into the text: then the caches'
    // kernels differ, and only their results are checked.)
    if std::env::var("KVQ_BAKE").is_ok() {
        eprintln!("KVQ_BAKE is set: pipelines compiled after each cache {compiled:?}");
        return;
    }
    let baked = gpu.tuning().baked_shape;
    if ["NB", "CAP", "WIN", "RING"]
        .iter()
        .any(|n| baked.contains(n))
    {
        assert!(
            compiled[0] < compiled[1] && compiled[1] < compiled[2],
            "{} bakes {baked:?}: pipelines compiled after each cache {compiled:?}",
            gpu.info.name
        );
    } else {
        assert_eq!(
            compiled, [compiled[0]; 3],
            "pipelines compiled after each cache"
        );
    }
}

/// The async forms a browser uses (natively they wait in place) give what the blocking forms
/// give, and a new cache's deferred error checks are all answered natively.
#[test]
fn async_host_forms_match_the_blocking_ones() {
    let spec = CacheSpec::new(2, 8, 2, 64, 40).with_codecs(KvCodecs::parse("q8_sym").unwrap());
    let mut cache = pollster::block_on(KvCache::new_async(ctx(), spec)).unwrap();
    pollster::block_on(ctx().check_errors_async()).unwrap();
    let mut rng = Rng::new(31);
    let (k, v) = (rng.normals(5 * 2 * 64, 1.0), rng.normals(5 * 2 * 64, 1.0));
    cache.append_host(1, &k, &v).unwrap();
    let q = rng.normals(8 * 64, 1.0);
    let out = cache.attend_host(1, &q).unwrap();
    assert_eq!(
        pollster::block_on(cache.attend_host_async(1, &q)).unwrap(),
        out
    );
    assert_eq!(
        pollster::block_on(cache.read_rows_async(1)).unwrap(),
        cache.read_rows(1).unwrap()
    );
    assert_eq!(
        pollster::block_on(cache.read_gpu_lengths_async()).unwrap(),
        cache.read_gpu_lengths().unwrap()
    );
    let (k, v) = (rng.normals(3 * 2 * 64, 1.0), rng.normals(3 * 2 * 64, 1.0));
    let qc = rng.normals(3 * 8 * 64, 1.0);
    let chunk = pollster::block_on(cache.chunk_host_async(0, &k, &v, &qc)).unwrap();
    assert_eq!(chunk.len(), qc.len());
    assert!(chunk.iter().all(|x| x.is_finite()));
    pollster::block_on(cache.sync_lengths_async()).unwrap();
    assert_eq!((cache.len(0, 0).unwrap(), cache.len(1, 0).unwrap()), (3, 5));
    // The failures stay typed errors through the async forms.
    assert!(matches!(
        pollster::block_on(cache.attend_host_async(0, &q[1..])),
        Err(KvqError::WrongLength { .. })
    ));
}

/// A caller's kernel reads the cache's lengths on the GPU (`KvCache::lengths_binding`), in the
/// same pass as kvq's steps: before a layer's step it sees that layer's length before the
/// step (the new token's position), after it the length after.
#[test]
fn a_callers_kernel_reads_the_lengths_on_the_gpu() {
    let gpu = ctx();
    let (layers, batch) = (3u32, 2u32);
    let spec = CacheSpec::new(layers, 4, 2, 64, 32).with_batch(batch);
    let mut cache = KvCache::new(gpu, spec).unwrap();
    let mut rng = Rng::new(7);
    let n = (layers * batch) as usize;
    // Layer l holds 3 + l tokens per sequence before the steps.
    for l in 0..layers {
        let len = (3 + l) as usize;
        let k = rng.normals(batch as usize * len * 2 * 64, 1.0);
        let v = rng.normals(batch as usize * len * 2 * 64, 1.0);
        cache.append_host(l, &k, &v).unwrap();
    }
    let src = "
        @group(0) @binding(0) var<storage, read> lens: array<u32>;
        @group(0) @binding(1) var<storage, read_write> out: array<u32>;
        @group(0) @binding(2) var<uniform> at: vec4<u32>;
        @compute @workgroup_size(1)
        fn main() {
            for (var i = 0u; i < arrayLength(&lens); i++) {
                out[at.x + i] = lens[i];
            }
        }";
    let d = &gpu.device;
    let module = d.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: None,
        source: wgpu::ShaderSource::Wgsl(src.into()),
    });
    let pipe = d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    use wgpu::BufferUsages as U;
    let out = buffer(2 * n as u64 * 4, U::STORAGE | U::COPY_SRC);
    let uniforms: Vec<wgpu::Buffer> = [0u32, n as u32]
        .iter()
        .map(|&at| {
            let b = buffer(16, U::UNIFORM | U::COPY_DST);
            gpu.queue
                .write_buffer(&b, 0, bytemuck::cast_slice(&[at, 0, 0, 0]));
            b
        })
        .collect();
    let groups: Vec<wgpu::BindGroup> = uniforms
        .iter()
        .map(|u| {
            d.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipe.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: wgpu::BindingResource::Buffer(cache.lengths_binding()),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: out.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 2,
                        resource: u.as_entire_binding(),
                    },
                ],
            })
        })
        .collect();
    let rows = |bytes: u64| buffer(bytes, U::STORAGE | U::COPY_DST);
    let (k, v) = (
        rows(batch as u64 * 2 * 64 * 4),
        rows(batch as u64 * 2 * 64 * 4),
    );
    let (q, o) = (
        rows(batch as u64 * 4 * 64 * 4),
        rows(batch as u64 * 4 * 64 * 4),
    );
    let step = cache.step_io(&k, &v, 1, InputType::F32, &q, &o).unwrap();
    let mut enc = d.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        // Before every step, then after layer 1's only.
        pass.set_pipeline(&pipe);
        pass.set_bind_group(0, &groups[0], &[]);
        pass.dispatch_workgroups(1, 1, 1);
        cache.step_in_pass(&mut pass, 1, &step).unwrap();
        pass.set_pipeline(&pipe);
        pass.set_bind_group(0, &groups[1], &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
    gpu.queue.submit([enc.finish()]);
    let got: Vec<u32> = common::read_f32(gpu, &out, 2 * n)
        .iter()
        .map(|x| x.to_bits())
        .collect();
    let before: Vec<u32> = (0..n as u32).map(|i| 3 + i / batch).collect();
    let mut after = before.clone();
    after[batch as usize..2 * batch as usize]
        .iter_mut()
        .for_each(|l| *l += 1);
    assert_eq!(&got[..n], &before[..], "lengths before the step");
    assert_eq!(&got[n..], &after[..], "lengths after layer 1's step");
    for l in 0..layers {
        for s in 0..batch {
            assert_eq!(got[n + (l * batch + s) as usize], cache.len(l, s).unwrap());
        }
    }
}
