//! Chunks: n new tokens per sequence appended and attended causally over the cache (prompts
//! in pieces, speculative verification), on the GPU against the f64 reference over the rows
//! the GPU stored, with poisoned outputs.

mod common;

use common::{Rng, ctx, reference_over_rows, rel_err, storage_buffer};
use kvq::{CacheSpec, GpuContext, InputType, KvCache, KvCodecs, KvqError, MatrixUnits, Precision};

const TOL: f64 = 1e-3;

/// Records a chunk of `n` tokens into `layer` through the recording API, the output buffer
/// filled with NaN first, and returns the output `[batch, n, q_heads, head_dim]`.
fn chunk_poisoned(
    cache: &mut KvCache,
    layer: u32,
    n: u32,
    k: &[f32],
    v: &[f32],
    q: &[f32],
) -> kvq::Result<Vec<f32>> {
    let gpu = cache.context().clone();
    let (kb, vb, qb) = (
        storage_buffer(&gpu, k),
        storage_buffer(&gpu, v),
        storage_buffer(&gpu, q),
    );
    let ob = storage_buffer(&gpu, &vec![f32::NAN; q.len()]);
    let io = cache.chunk_io(&kb, &vb, n, InputType::F32, &qb, &ob)?;
    assert_eq!(io.tokens(), n);
    assert_eq!(io.slice_tokens(), n.min(kvq::CHUNK_SLICE_TOKENS));
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    cache.chunk(&mut enc, layer, &io)?;
    gpu.queue.submit([enc.finish()]);
    Ok(common::read_f32(&gpu, &ob, q.len()))
}

/// One layer of `codecs` over `q_heads` / `kv_heads` heads of `d`, `batch` sequences of
/// `capacity` tokens, 3 splits.
fn spec(codecs: &str, d: u32, q_heads: u32, kv_heads: u32, batch: u32, capacity: u32) -> CacheSpec {
    CacheSpec::new(1, q_heads, kv_heads, d, capacity)
        .with_codecs(KvCodecs::parse(codecs).unwrap())
        .with_batch(batch)
        .with_splits(3)
}

/// A cache of `spec`, a random prefix of `prefix` tokens, then chunks of each `n` of
/// `chunks`: every new token's output against the reference over the stored rows of the
/// positions it may attend (its own and earlier ones, within the window).
fn check(spec: CacheSpec, prefix: u32, chunks: &[u32]) {
    check_on(ctx(), spec, prefix, chunks)
}

/// [`check`] on the context `gpu`.
fn check_on(gpu: &GpuContext, spec: CacheSpec, prefix: u32, chunks: &[u32]) {
    let (d, q_heads, kv_heads, batch, capacity, window) = (
        spec.head_dim,
        spec.q_heads,
        spec.kv_heads,
        spec.batch,
        spec.capacity,
        spec.window,
    );
    let codecs = spec.codecs.name();
    // The last layer: its lengths and rows follow every other layer's.
    let layer = spec.layers - 1;
    let mut cache = KvCache::new(gpu, spec.clone()).expect("cache");
    // What the cache resolved its precision to (`Auto` is `Fast` for codes of at most 4 bits);
    // only the prefill kernel has f16 products, so only its chunks take their tolerance.
    let half = cache.kernel_config().precision == Precision::Fast;
    let prefill_from = cache.layout().prefill.map(|(_, from)| from);
    if spec.precision == Precision::Fast {
        // The f16 kernel, not the exact one it falls back to without shader-f16.
        assert!(half);
        assert!(prefill_from.is_some());
    }
    let mut rng = Rng::new(u64::from(d * 7919 + q_heads * 31 + prefix));
    let per = (batch * kv_heads * d) as usize;
    if prefix > 0 {
        let k = rng.normals(prefix as usize * per, 1.0);
        let v = rng.normals(prefix as usize * per, 1.0);
        cache.append_host(layer, &k, &v).expect("prefix");
    }
    let mut len = prefix;
    for &n in chunks {
        let k = rng.normals(n as usize * per, 1.0);
        let v = rng.normals(n as usize * per, 1.0);
        let qrow = (q_heads * d) as usize;
        let q = rng.normals((batch * n) as usize * qrow, 2.0);
        let out = chunk_poisoned(&mut cache, layer, n, &k, &v, &q).expect("chunk");
        let (krows, vrows) = cache.read_rows(layer).expect("rows");
        let mut worst = 0.0f64;
        for b in 0..batch as usize {
            for i in 0..n as usize {
                let pos = len as usize + i;
                let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w as usize));
                let slots: Vec<usize> = (lo..=pos).map(|p| p % capacity as usize).collect();
                let r = (b * n as usize + i) * qrow;
                let want = reference_over_rows(&spec, &krows, &vrows, b, &slots, &q[r..r + qrow]);
                worst = worst.max(rel_err(&out[r..r + qrow], &want));
            }
        }
        // f16 products (Precision::Fast) are held to their own contract against the reference.
        let fast = half && prefill_from.is_some_and(|from| n >= from);
        let tol = if fast { FAST_TOL } else { TOL };
        if fast {
            eprintln!("{codecs} d={d} chunk {n} with f16 products: rel err {worst:.2e}");
        }
        assert!(
            worst <= tol,
            "{codecs} d={d} g={} b={batch} prefix {len} chunk {n} ({:?}): rel err {worst:.2e}",
            q_heads / kv_heads,
            spec.precision
        );
        len += n;
        assert_eq!(cache.len(layer, batch - 1).unwrap(), len);
    }
}

#[test]
fn chunks_of_f16_and_int_codecs_match_the_reference() {
    // Prefixes of 0, 1 and about a split boundary (3 splits); batch 3; GQA 4, 1 and 8;
    // storage segments of 64 tokens, so that chunks cross segments.
    check(spec("none", 64, 8, 2, 3, 300), 0, &[1, 2, 3, 5, 17]);
    check(spec("none", 64, 8, 2, 3, 300), 1, &[8, 129]);
    check(
        segmented(spec("q4_sym", 128, 2, 2, 1, 400)),
        95,
        &[64, 3, 1, 8],
    );
    check(spec("k=q8,v=q4", 256, 8, 1, 1, 200), 20, &[4, 9]);
}

#[test]
fn chunks_of_fewer_splits_than_the_decode_match_the_reference() {
    // A chunk's slices take their own split count (CacheSpec::chunk_splits), their partials
    // packed by it segment after segment: 1 and 2 of the decode's 3, across storage segments
    // and a prefix past the new split boundaries, by the split and the prefill kernel, and over
    // a sliding window.
    for splits in [1, 2] {
        let seg = segmented(spec("q4_sym", 128, 2, 2, 1, 400)).with_chunk_splits(splits);
        check(seg.clone(), 95, &[64, 3, 1, 8]);
        check(tiled(seg), 95, &[64, 3, 1, 8]);
        check(
            spec("none", 64, 8, 2, 3, 300).with_chunk_splits(splits),
            1,
            &[8, 129],
        );
    }
    // A wrapped ring whose window starts inside the splits' ranges, by both kernels.
    let ring = spec("none", 64, 4, 2, 2, 160)
        .with_window(100)
        .with_chunk_splits(1);
    check(ring.clone(), 150, &[33, 61, 5]);
    check(tiled(ring), 150, &[33, 61, 5]);
    // More than the decode's: the decode's.
    check(spec("none", 64, 8, 2, 3, 300).with_chunk_splits(9), 1, &[8]);
}

#[test]
fn a_chunk_of_4096_tokens_is_attended_in_slices() {
    // Slices of CHUNK_SLICE_TOKENS queries, one after another in one scratch: 16 of them, the
    // causal diagonal running through every one; then a chunk of 600 (2 slices and a part).
    assert_eq!(kvq::CHUNK_SLICE_TOKENS, 256);
    check(spec("k_q8", 64, 2, 1, 1, 4800), 40, &[4096, 600]);
}

#[test]
fn chunks_whose_workgroups_serve_several_new_tokens_match_the_reference() {
    // A split workgroup serves 8 / GQA new tokens' rows (2 here): chunks of odd lengths end
    // in a workgroup with one, and the causal diagonal crosses the split tiles; batch 3.
    check(spec("k_rotor3", 128, 8, 2, 3, 300), 64, &[3, 8, 1]);
}

#[test]
fn chunks_of_rotated_and_qjl_codecs_match_the_reference() {
    check(spec("turbo3_sym", 96, 7, 1, 1, 300), 40, &[2, 17]);
    check(spec("k=iso3b+qjl,v=rotor4", 64, 4, 2, 2, 800), 3, &[5, 600]);
}

#[test]
fn chunks_over_a_sliding_window_whose_ring_wraps_inside_the_chunk() {
    // A ring of 160 slots attending the last 100: chunks of up to 61 tokens keep every
    // position their first query attends; the prefix has wrapped the ring already.
    check(
        spec("none", 64, 4, 2, 2, 160).with_window(100),
        150,
        &[33, 61, 5],
    );
    let ring = spec("k_turbo4", 128, 4, 4, 1, 160).with_window(100);
    check(segmented(ring), 170, &[40]);
    // A chunk of two slices (256 + 44) through a wrapped ring.
    check(
        spec("q8_sym", 64, 4, 2, 1, 600).with_window(200),
        650,
        &[300],
    );
}

/// `s` with storage segments of 64 tokens.
fn segmented(mut s: CacheSpec) -> CacheSpec {
    s.segment_tokens = Some(64);
    s
}

#[test]
fn a_verify_chunk_then_truncate_is_as_if_only_the_accepted_tokens_were_appended() {
    let spec = CacheSpec::new(1, 8, 2, 64, 256)
        .with_batch(2)
        .with_splits(3);
    let per = (2 * 2 * 64) as usize;
    let qrow = 8 * 64;
    let mut rng = Rng::new(11);
    let prefix_k = rng.normals(50 * per, 1.0);
    let prefix_v = rng.normals(50 * per, 1.0);
    // Five drafted tokens per sequence ([batch, n, ...] layout), of which two are accepted.
    let (dk, dv, dq) = (
        rng.normals(5 * per, 1.0),
        rng.normals(5 * per, 1.0),
        rng.normals(2 * 5 * qrow, 2.0),
    );
    let take = |x: &[f32], n: usize, row: usize, keep: usize| -> Vec<f32> {
        (0..2)
            .flat_map(|b| x[b * n * row..(b * n + keep) * row].to_vec())
            .collect()
    };
    let (nk, nv, nq) = (
        rng.normals(3 * per, 1.0),
        rng.normals(3 * per, 1.0),
        rng.normals(2 * 3 * qrow, 2.0),
    );

    let mut verified = KvCache::new(ctx(), spec.clone()).unwrap();
    verified.append_host(0, &prefix_k, &prefix_v).unwrap();
    chunk_poisoned(&mut verified, 0, 5, &dk, &dv, &dq).unwrap();
    for b in 0..2 {
        verified.truncate(b, 52).unwrap();
    }
    let after_verify = chunk_poisoned(&mut verified, 0, 3, &nk, &nv, &nq).unwrap();

    let mut plain = KvCache::new(ctx(), spec).unwrap();
    plain.append_host(0, &prefix_k, &prefix_v).unwrap();
    let row = per / 2;
    chunk_poisoned(
        &mut plain,
        0,
        2,
        &take(&dk, 5, row, 2),
        &take(&dv, 5, row, 2),
        &take(&dq, 5, qrow, 2),
    )
    .unwrap();
    let direct = chunk_poisoned(&mut plain, 0, 3, &nk, &nv, &nq).unwrap();
    assert_eq!(after_verify, direct);
    assert_eq!(verified.len(0, 1).unwrap(), 55);
}

#[test]
fn bad_chunks_are_typed_errors_with_nothing_written() {
    let spec = CacheSpec::new(1, 4, 2, 64, 40).with_batch(2);
    let mut cache = KvCache::new(ctx(), spec).unwrap();
    let per = (2 * 2 * 64) as usize;
    let mut rng = Rng::new(5);
    cache
        .append_host(0, &rng.normals(30 * per, 1.0), &rng.normals(30 * per, 1.0))
        .unwrap();
    let before = cache.read_rows(0).unwrap();
    let (k, v, q) = (
        rng.normals(11 * per, 1.0),
        rng.normals(11 * per, 1.0),
        rng.normals(2 * 11 * 4 * 64, 1.0),
    );
    let e = chunk_poisoned(&mut cache, 0, 11, &k, &v, &q).unwrap_err();
    assert!(matches!(e, KvqError::CapacityExceeded { n: 11, .. }), "{e}");
    assert_eq!(cache.len(0, 0).unwrap(), 30);
    assert_eq!(cache.read_rows(0).unwrap(), before);
    assert_eq!(cache.read_gpu_lengths().unwrap().0, vec![30, 30]);
    // A query buffer for fewer tokens than the chunk's.
    let gpu = cache.context().clone();
    let (kb, vb) = (storage_buffer(&gpu, &k), storage_buffer(&gpu, &v));
    let small = storage_buffer(&gpu, &q[..q.len() / 2]);
    let e = cache
        .chunk_io(&kb, &vb, 11, InputType::F32, &small, &small)
        .err()
        .unwrap();
    assert!(matches!(e, KvqError::BadBuffer { .. }), "{e}");
    // Over a sliding window, a chunk longer than the ring's slack (40 - 32 + 1 = 9 tokens)
    // is no error: it goes in slices of the slack, each appended just before it is attended
    // (tests/variants.rs checks their attention).
    let ring = CacheSpec::new(1, 4, 2, 64, 40)
        .with_batch(2)
        .with_window(32);
    let ring = KvCache::new(ctx(), ring).unwrap();
    let qb = storage_buffer(&gpu, &q);
    let ob = storage_buffer(&gpu, &q);
    let io = ring
        .chunk_io(&kb, &vb, 10, InputType::F32, &qb, &ob)
        .unwrap();
    assert_eq!(io.slice_tokens(), 9);
    // Then its K and V may not share a buffer with its outputs.
    let e = ring
        .chunk_io(&kb, &vb, 10, InputType::F32, &qb, &kb)
        .err()
        .unwrap();
    assert!(matches!(e, KvqError::BadBuffer { .. }), "{e}");
    // The host API refuses a query of the wrong length.
    let e = cache.chunk_host(0, &k[..per], &v[..per], &q).unwrap_err();
    assert!(matches!(e, KvqError::WrongLength { .. }), "{e}");
}

/// The f64 log-sum-exp of query row `q` (head `qh` of `q_heads`) against the stored rows of
/// `slots` of sequence `b`: ln Σ exp(scale · q·k) over the decoded K (QJL: its estimate).
fn lse_over_rows(
    spec: &CacheSpec,
    krows: &[u32],
    b: usize,
    slots: &[usize],
    qh: usize,
    q: &[f32],
) -> f64 {
    use kvq::codec::CodecRef;
    let h = qh / (spec.q_heads / spec.kv_heads) as usize;
    let kref = CodecRef::new(spec.codecs.k, spec.head_dim, spec.seed).unwrap();
    let kw = kref.layout().words as usize;
    let qd: Vec<f64> = q.iter().map(|&x| x as f64).collect();
    let scale = spec.softmax_scale() as f64;
    let scores: Vec<f64> = slots
        .iter()
        .map(|&slot| {
            let r = (b * spec.kv_heads as usize + h) * spec.capacity as usize + slot;
            let row = &krows[r * kw..(r + 1) * kw];
            if spec.codecs.k.qjl {
                scale * kref.ip_estimate(row, &qd)
            } else {
                let k = kref.decode(row);
                scale * k.iter().zip(&qd).map(|(a, b)| a * b).sum::<f64>()
            }
        })
        .collect();
    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    m + scores.iter().map(|s| (s - m).exp()).sum::<f64>().ln()
}

#[test]
fn chunks_write_each_rows_log_sum_exp_where_asked() {
    // An int, a rotated (V un-rotated in the reduce) and a QJL K; a chunk longer than a slice
    // for one of them; the log-sum-exp buffer poisoned first.
    for (c, prefill) in [
        ("q4_sym", 64, 30, 5),
        ("iso3_sym", 128, 100, 300),
        ("k_turbo3+qjl", 64, 7, 9),
    ]
    .into_iter()
    .flat_map(|c| [(c, false), (c, true)])
    {
        let (codecs, d, prefix, n) = c;
        // The split kernel's partials, then the prefill kernel's, through the one reduce.
        let spec = match prefill {
            false => spec(codecs, d, 4, 2, 2, 500),
            true => tiled(spec(codecs, d, 4, 2, 2, 500)),
        };
        let mut cache = KvCache::new(ctx(), spec.clone()).expect("cache");
        let gpu = cache.context().clone();
        let mut rng = Rng::new(u64::from(d + prefix));
        let per = (spec.batch * spec.kv_heads * d) as usize;
        cache
            .append_host(
                0,
                &rng.normals(prefix as usize * per, 1.0),
                &rng.normals(prefix as usize * per, 1.0),
            )
            .expect("prefix");
        let qrow = (spec.q_heads * d) as usize;
        let rows = (spec.batch * n) as usize;
        let (k, v, q) = (
            rng.normals(n as usize * per, 1.0),
            rng.normals(n as usize * per, 1.0),
            rng.normals(rows * qrow, 2.0),
        );
        let (kb, vb, qb) = (
            storage_buffer(&gpu, &k),
            storage_buffer(&gpu, &v),
            storage_buffer(&gpu, &q),
        );
        let ob = storage_buffer(&gpu, &vec![f32::NAN; q.len()]);
        let lb = storage_buffer(&gpu, &vec![f32::NAN; rows * spec.q_heads as usize]);
        let io = cache
            .chunk_io_lse(&kb, &vb, n, InputType::F32, &qb, &ob, &lb)
            .expect("io");
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        cache.chunk(&mut enc, 0, &io).expect("chunk");
        gpu.queue.submit([enc.finish()]);
        let lse = common::read_f32(&gpu, &lb, rows * spec.q_heads as usize);
        let (krows, _) = cache.read_rows(0).expect("rows");
        let mut worst = 0.0f64;
        for b in 0..spec.batch as usize {
            for i in 0..n as usize {
                let slots: Vec<usize> = (0..=prefix as usize + i).collect();
                for qh in 0..spec.q_heads as usize {
                    let at = (b * n as usize + i) * spec.q_heads as usize + qh;
                    let r = (b * n as usize + i) * qrow + qh * d as usize;
                    let want = lse_over_rows(&spec, &krows, b, &slots, qh, &q[r..r + d as usize]);
                    worst = worst.max(common::lse_err(lse[at], want));
                }
            }
        }
        assert!(
            worst <= TOL,
            "{codecs} (prefill kernel: {prefill}): log-sum-exp error {worst:.2e}"
        );
    }
    // A buffer too small for [batch, n, q_heads] is a typed error.
    let cache = KvCache::new(ctx(), spec("none", 64, 4, 2, 1, 64)).expect("cache");
    let gpu = cache.context().clone();
    let b = storage_buffer(&gpu, &[0.0; 4 * 64 * 8]);
    let small = storage_buffer(&gpu, &[0.0; 7]);
    assert!(matches!(
        cache.chunk_io_lse(&b, &b, 2, InputType::F32, &b, &b, &small),
        Err(KvqError::BadBuffer { .. })
    ));
}

/// `s` with every chunk attended by the prefill kernel (tiled over queries and keys), with
/// f32 products (`Auto`, the default, would give codes of at most 4 bits f16 ones).
fn tiled(s: CacheSpec) -> CacheSpec {
    s.with_prefill_from(1).with_precision(Precision::Exact)
}

#[test]
fn prefill_kernel_of_f16_and_int_codecs_matches_the_reference() {
    // The shapes of the split kernel's tests: prefixes of 0, 1 and about a split boundary,
    // batch 3, GQA 4, 1 and 8, chunks across storage segments; tiles of 32 rows end inside
    // a token's heads (GQA 7 below) and past the slice's last row.
    check(tiled(spec("none", 64, 8, 2, 3, 300)), 0, &[1, 2, 3, 5, 17]);
    check(tiled(spec("none", 64, 8, 2, 3, 300)), 1, &[8, 129]);
    check(
        tiled(segmented(spec("q4_sym", 128, 2, 2, 1, 400))),
        95,
        &[64, 3, 1, 8],
    );
    check(tiled(spec("k=q8,v=q4", 256, 8, 1, 1, 200)), 20, &[4, 9]);
}

#[test]
fn prefill_kernel_over_many_tiles_and_slices_matches_the_reference() {
    // 16 slices of 256 queries whose splits each hold several 64-key tiles (the online
    // softmax rescales across tiles), then 2 slices and a part.
    check(tiled(spec("k_q8", 64, 2, 1, 1, 4800)), 40, &[4096, 600]);
}

#[test]
fn prefill_kernel_of_rotated_and_qjl_codecs_matches_the_reference() {
    // Rotated queries (rotate first, into the scratch), rotated V (un-rotated by the reduce),
    // per-block scales, QJL's signs as a second block of the query row; rows per group 4
    // (D 128), 3 (rotor's 160-wide rows at D 128), 2 (D 256) and 1 (rotor at D 256; QJL at
    // D 256); GQA 7, 4, 2, 1; batch 3.
    check(
        tiled(spec("turbo3_sym", 96, 7, 1, 1, 300)),
        40,
        &[2, 17, 64],
    );
    check(
        tiled(spec("k=iso3b+qjl,v=rotor4", 64, 4, 2, 2, 800)),
        3,
        &[5, 600],
    );
    check(tiled(spec("k_rotor3", 128, 8, 2, 3, 300)), 64, &[3, 8, 129]);
    check(tiled(spec("iso4_sym", 256, 4, 2, 1, 300)), 70, &[33]);
    check(tiled(spec("rotor3_sym", 256, 2, 2, 1, 300)), 70, &[20]);
    check(tiled(spec("k_turbo3+qjl", 256, 8, 8, 1, 200)), 10, &[9]);
}

#[test]
fn prefill_kernel_over_a_sliding_window_and_segments_matches_the_reference() {
    check(
        tiled(spec("none", 64, 4, 2, 2, 160).with_window(100)),
        150,
        &[33, 61, 5],
    );
    let ring = tiled(spec("k_turbo4", 128, 4, 4, 1, 160).with_window(100));
    check(segmented(ring), 170, &[40]);
    check(
        tiled(spec("q8_sym", 64, 4, 2, 1, 600).with_window(200)),
        650,
        &[300],
    );
}

/// The relative error [`Precision::Fast`] promises against the reference over the stored rows.
const FAST_TOL: f64 = 1e-2;

#[test]
fn prefill_kernel_with_f16_products_keeps_its_contract() {
    // Every kind of K tile (f16, int, rotated, QJL signs), V rows of each width, a wrapped
    // ring, several tiles per split (exact tokens' rows: tests/exact.rs); the adapter must
    // offer shader-f16 (lavapipe does), else this would test the exact kernel.
    assert!(ctx().capabilities().f16, "the adapter has no shader-f16");
    let fast = |s: CacheSpec| tiled(s).with_precision(Precision::Fast);
    check(fast(spec("none", 64, 8, 2, 3, 300)), 1, &[8, 129]);
    check(fast(spec("q4_sym", 128, 8, 2, 1, 400)), 95, &[64, 3]);
    check(fast(spec("k_q8", 64, 2, 1, 1, 4800)), 40, &[600]);
    check(fast(spec("turbo3_sym", 96, 7, 1, 1, 300)), 40, &[17, 64]);
    check(
        fast(spec("k=iso3b+qjl,v=rotor4", 64, 4, 2, 2, 800)),
        3,
        &[600],
    );
    check(fast(spec("rotor3_sym", 256, 2, 2, 1, 300)), 70, &[20]);
    check(fast(spec("k_turbo3+qjl", 256, 8, 8, 1, 200)), 10, &[9]);
    check(
        fast(spec("k_turbo4", 128, 4, 4, 1, 160).with_window(100)),
        170,
        &[40],
    );
}

/// The matrix units the matrix prefill kernel is tested on: the adapter's, or where it has
/// none emulated fragments of 16 and 8 (the kernel's tiling, decoding, masks and softmax with
/// its products written out); with `KVQ_REQUIRE_MATRIX=1` an adapter without them fails.
fn matrix_contexts() -> Vec<(GpuContext, MatrixUnits)> {
    if let Some(units) = ctx().matrix_units() {
        return vec![(ctx().clone(), units)];
    }
    assert!(
        std::env::var("KVQ_REQUIRE_MATRIX").as_deref() != Ok("1"),
        "KVQ_REQUIRE_MATRIX=1: '{}' has no matrix units kvq uses (KVQ_MATRIX=on asks for them)",
        ctx().info.name
    );
    [16, 8]
        .into_iter()
        .map(|fragment| {
            let units = MatrixUnits::new(fragment, true);
            let gpu = ctx()
                .clone()
                .with_matrix_units(Some(units))
                .expect("emulated");
            (gpu, units)
        })
        .collect()
}

#[test]
fn prefill_kernel_on_matrix_units_matches_the_reference() {
    // f16 products on matrix units (Precision::Fast): K tiles of every kind (f16, int, rotated,
    // QJL signs), V rows of each width (a rotor V's 72 values padded to 96), GQA 1 to 8, rows
    // ending inside a token's heads, several tiles and splits, segments, a wrapped ring.
    let fast = |s: CacheSpec| s.with_prefill_from(1).with_precision(Precision::Fast);
    for (i, (gpu, units)) in matrix_contexts().into_iter().enumerate() {
        let served = |s: &CacheSpec| {
            let c = KvCache::new(&gpu, s.clone()).expect("cache");
            let got = c.kernel_config().matrix;
            // (2 F rows a workgroup, or F where those tiles do not fit the adapter.)
            let rows = got.map_or(0, |m| m.rows);
            assert_eq!(
                got,
                Some(MatrixUnits { rows, ..units }),
                "{}",
                s.codecs.name()
            );
            got.unwrap()
        };
        let shapes = [
            (fast(spec("none", 64, 8, 2, 3, 300)), 1, vec![8, 129]),
            (
                fast(segmented(spec("q4_sym", 128, 2, 2, 1, 400))),
                95,
                vec![64, 3],
            ),
            (fast(spec("turbo3_sym", 96, 7, 1, 1, 300)), 40, vec![17, 64]),
            (fast(spec("k_q8", 64, 2, 1, 1, 4800)), 40, vec![600]),
            (
                fast(spec("k=rotor3,v=rotor3", 64, 4, 2, 2, 300)),
                70,
                vec![20],
            ),
            (fast(spec("k_turbo3+qjl", 64, 8, 1, 1, 200)), 10, vec![9]),
            (
                fast(spec("k_iso4", 128, 4, 4, 1, 160).with_window(100)),
                170,
                vec![40],
            ),
        ];
        // (Emulated fragments of 8 on the first two shapes: their compiles are lavapipe's.)
        let take = if units.emulated && i > 0 {
            2
        } else {
            shapes.len()
        };
        for (s, prefix, chunks) in shapes.into_iter().take(take) {
            let got = served(&s);
            eprintln!("matrix units {got:?}: {} d={}", s.codecs.name(), s.head_dim);
            check_on(&gpu, s, prefix, &chunks);
        }
    }
}

/// Where a matrix cache attends chunks of one token by the prefill kernel, its steps are
/// chunks of 1 (`KvCache::steps_as_chunks`): fused steps through `step_io` / `step` match the
/// reference at every step (the decode on matrix units), poisoned outputs; elsewhere steps stay
/// fused.
#[test]
fn steps_on_matrix_units_are_chunks_of_one_that_match_the_reference() {
    let (gpu, _) = matrix_contexts().swap_remove(0);
    // (The kernels of the matrix test's first shape: no compile of its own.)
    let spec = spec("none", 64, 8, 2, 3, 300)
        .with_prefill_from(1)
        .with_precision(Precision::Fast);
    assert!(
        !KvCache::new(&gpu, spec.clone().with_prefill_from(2))
            .unwrap()
            .steps_as_chunks()
    );
    let mut cache = KvCache::new(&gpu, spec.clone()).expect("cache");
    assert!(cache.steps_as_chunks());
    let (d, qh, kvh, batch) = (64usize, 8usize, 2usize, 3usize);
    let mut rng = Rng::new(41);
    let per = batch * kvh * d;
    let prefix = 37;
    cache
        .append_host(
            0,
            &rng.normals(prefix * per, 1.0),
            &rng.normals(prefix * per, 1.0),
        )
        .expect("prefix");
    let (k, v, q) = (
        rng.normals(per, 1.0),
        rng.normals(per, 1.0),
        rng.normals(batch * qh * d, 2.0),
    );
    let (kb, vb, qb) = (
        storage_buffer(&gpu, &k),
        storage_buffer(&gpu, &v),
        storage_buffer(&gpu, &q),
    );
    let ob = storage_buffer(&gpu, &vec![f32::NAN; q.len()]);
    let io = cache
        .step_io(&kb, &vb, 1, InputType::F32, &qb, &ob)
        .expect("io");
    for step in 0..4 {
        // (The same token and query each step: a new position each time.)
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        cache.step(&mut enc, 0, &io).expect("step");
        gpu.queue.submit([enc.finish()]);
        let out = common::read_f32(&gpu, &ob, q.len());
        let (krows, vrows) = cache.read_rows(0).expect("rows");
        let pos = prefix + step;
        let slots: Vec<usize> = (0..=pos).collect();
        let mut worst = 0.0f64;
        for b in 0..batch {
            let r = b * qh * d..(b + 1) * qh * d;
            let want = reference_over_rows(&spec, &krows, &vrows, b, &slots, &q[r.clone()]);
            worst = worst.max(rel_err(&out[r], &want));
        }
        assert!(worst <= FAST_TOL, "step {step}: rel err {worst:.2e}");
        assert_eq!(cache.len(0, batch as u32 - 1).unwrap(), pos as u32 + 1);
    }
}

/// Mean over query rows of the relative L2 error of a prefill-kernel chunk of `n` tokens
/// after `prefix` against exact f64 attention over the original (unquantized) K/V: what a
/// user of the codec sees. `q_scale`: the queries' spread (larger peaks the attention).
fn error_against_the_original(spec: CacheSpec, prefix: u32, n: u32, q_scale: f32) -> f64 {
    let (d, qh, kvh) = (spec.head_dim, spec.q_heads, spec.kv_heads);
    let mut cache = KvCache::new(ctx(), spec.clone().with_prefill_from(1)).expect("cache");
    assert_eq!(cache.kernel_config().precision, spec.precision);
    let mut rng = Rng::new(u64::from(d * 131 + prefix + n));
    let per = (kvh * d) as usize;
    let (k0, v0) = (
        rng.normals(prefix as usize * per, 1.0),
        rng.normals(prefix as usize * per, 1.0),
    );
    cache.append_host(0, &k0, &v0).expect("prefix");
    let (k1, v1) = (
        rng.normals(n as usize * per, 1.0),
        rng.normals(n as usize * per, 1.0),
    );
    let q = rng.normals((n * qh * d) as usize, q_scale);
    let out = chunk_poisoned(&mut cache, 0, n, &k1, &v1, &q).expect("chunk");
    let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    let (k, v) = ([f(&k0), f(&k1)].concat(), [f(&v0), f(&v1)].concat());
    let scale = 1.0 / (d as f64).sqrt();
    let want = kvq::reference::chunk_attention(
        &f(&q),
        &k,
        &v,
        qh as usize,
        kvh as usize,
        d as usize,
        scale,
        None,
    );
    let rows = (n * qh) as usize;
    let err: f64 = (0..rows)
        .map(|r| {
            let (g, w) = (
                &out[r * d as usize..][..d as usize],
                &want[r * d as usize..][..d as usize],
            );
            let e: f64 = g.iter().zip(w).map(|(&a, &b)| (a as f64 - b).powi(2)).sum();
            let nw: f64 = w.iter().map(|b| b * b).sum();
            (e / nw).sqrt()
        })
        .sum();
    err / rows as f64
}

#[test]
fn f16_products_add_at_most_5_percent_to_a_quantized_codecs_error() {
    // Precision::Fast's contract against the original K/V: for the 3- and 4-bit codecs,
    // whose own error dwarfs f16 rounding, its error exceeds the exact kernel's by at most
    // 5 % (relative, mean over rows), on spread and on peaked attention.
    assert!(ctx().capabilities().f16, "the adapter has no shader-f16");
    for codecs in ["q4_sym", "turbo3_sym", "k_iso3", "turbo4_sym", "rotor3_sym"] {
        for (q_scale, d) in [(1.0, 128), (6.0, 128)] {
            let s = spec(codecs, d, 8, 2, 1, 700);
            let exact = error_against_the_original(
                s.clone().with_precision(Precision::Exact),
                300,
                200,
                q_scale,
            );
            let fast =
                error_against_the_original(s.with_precision(Precision::Fast), 300, 200, q_scale);
            eprintln!("{codecs} d={d} q x{q_scale}: exact {exact:.5}, fast {fast:.5}");
            assert!(
                fast <= 1.05 * exact,
                "{codecs} d={d} q x{q_scale}: fast {fast:.5} against exact {exact:.5}"
            );
        }
    }
}

#[test]
fn the_prefill_kernel_serves_only_the_caches_it_is_written_for() {
    // A threshold picks it from that many new tokens on; a query row wider than its tile
    // keeps the split kernel.
    let c = |s: CacheSpec| KvCache::new(ctx(), s).expect("cache").layout().prefill;
    assert_eq!(c(spec("none", 128, 8, 2, 1, 64)), None);
    assert_eq!(
        c(spec("none", 128, 8, 2, 1, 64).with_prefill_from(48)),
        Some((32, 48))
    );
    assert_eq!(
        c(tiled(spec("rotor3_sym", 128, 8, 2, 1, 64))),
        Some((24, 1))
    );
    assert_eq!(
        c(tiled(spec("none", 128, 8, 2, 1, 64)).with_exact(4, 0)),
        Some((32, 1))
    );
    assert_eq!(c(tiled(spec("k_rotor3+qjl", 256, 8, 2, 1, 64))), None);
}
