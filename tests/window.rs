//! Sliding-window caches: a ring of `capacity` slots, attention over the last `window`
//! tokens. GPU attention (fused steps and plain attends) against f64 attention over exactly
//! the window's tokens, through many wraps of the ring, across storage segments, with
//! prefills longer than the ring, rollback within the ring and sequences at different lengths.

mod common;

use common::{Kept, Rng, attend_poisoned, ctx, reference_over_rows, rel_err, step_poisoned};
use kvq::codec::CodecRef;
use kvq::{CacheSpec, KvCache, KvCodecs, KvqError};

const TOL: f64 = 1e-3;

/// A windowed cache and every token appended to it, to know what the ring must hold.
struct Ring {
    cache: KvCache,
    kept: Kept,
    rng: Rng,
}

impl Ring {
    fn new(spec: CacheSpec, seed: u64) -> Ring {
        Ring {
            kept: Kept::new(spec.layers, spec.batch),
            cache: KvCache::new(ctx(), spec).expect("cache"),
            rng: Rng::new(seed),
        }
    }

    fn spec(&self) -> CacheSpec {
        self.cache.spec().clone()
    }

    /// Random K and V for `n` tokens, `[batch, n, kv_heads, d]`, kept as `layer`'s newest.
    fn tokens(&mut self, layer: u32, n: usize) -> (Vec<f32>, Vec<f32>) {
        let s = self.spec();
        let per = (s.kv_heads * s.head_dim) as usize;
        let k: Vec<f32> = (0..s.batch as usize * n * per)
            .map(|i| self.rng.normal() * if i % 31 == 0 { 5.0 } else { 1.0 })
            .collect();
        let v = self.rng.normals(k.len(), 1.0);
        self.kept.record(layer, n, &k, &v);
        (k, v)
    }

    fn append(&mut self, layer: u32, n: usize) {
        let (k, v) = self.tokens(layer, n);
        self.cache.append_host(layer, &k, &v).expect("append");
    }

    /// A fused step of `n` tokens; returns the worst relative error of its output.
    fn step(&mut self, layer: u32, n: usize) -> f64 {
        let s = self.spec();
        let (k, v) = self.tokens(layer, n);
        let q = self
            .rng
            .normals((s.batch * s.q_heads * s.head_dim) as usize, 1.5);
        let out = step_poisoned(&mut self.cache, layer, n as u32, &k, &v, &q);
        self.worst(layer, &q, &out)
    }

    /// Attends a random query over `layer`; returns the worst relative error.
    fn attend(&mut self, layer: u32) -> f64 {
        let s = self.spec();
        let q = self
            .rng
            .normals((s.batch * s.q_heads * s.head_dim) as usize, 1.5);
        let out = attend_poisoned(&self.cache, layer, &q);
        self.worst(layer, &q, &out)
    }

    /// Positions the window of sequence `b` covers now, oldest first.
    fn window(&self, layer: u32, b: u32) -> std::ops::Range<usize> {
        let s = self.spec();
        let len = self.cache.len(layer, b).unwrap() as usize;
        assert_eq!(len, self.kept.k[layer as usize][b as usize].len());
        len - len.min(s.window.unwrap() as usize)..len
    }

    /// Worst relative error of `out` against f64 attention over each sequence's window,
    /// from the GPU's rows at the window's slots (position % capacity).
    fn worst(&self, layer: u32, q: &[f32], out: &[f32]) -> f64 {
        let s = self.spec();
        let (krows, vrows) = self.cache.read_rows(layer).unwrap();
        let n = (s.q_heads * s.head_dim) as usize;
        let mut worst = 0.0f64;
        for b in 0..s.batch {
            let slots: Vec<usize> = self
                .window(layer, b)
                .map(|p| p % s.capacity as usize)
                .collect();
            let bi = b as usize;
            let want =
                reference_over_rows(&s, &krows, &vrows, bi, &slots, &q[bi * n..(bi + 1) * n]);
            worst = worst.max(rel_err(&out[bi * n..(bi + 1) * n], &want));
        }
        worst
    }

    /// Checks that slot p % capacity holds position p's token for each sequence's last `span`
    /// positions (at most the capacity): bit for bit against the CPU encoder (rare rounding
    /// ties aside). After a rollback the ring holds only the window for sure.
    fn check_slots(&self, layer: u32, span: u32) {
        let s = self.spec();
        let (krows, vrows) = self.cache.read_rows(layer).unwrap();
        let d = s.head_dim as usize;
        let (kvh, cap) = (s.kv_heads as usize, s.capacity as usize);
        let kref = CodecRef::new(s.codecs.k, s.head_dim, s.seed).unwrap();
        let vref = CodecRef::new(s.codecs.v, s.head_dim, s.seed).unwrap();
        let (kw, vw) = (kref.layout().words as usize, vref.layout().words as usize);
        let (mut rows, mut same) = (0, 0);
        for b in 0..s.batch as usize {
            let len = self.kept.k[layer as usize][b].len();
            for p in len - len.min(span as usize)..len {
                for h in 0..kvh {
                    let r = (b * kvh + h) * cap + p % cap;
                    let x = h * d..(h + 1) * d;
                    let tok_k = &self.kept.k[layer as usize][b][p][x.clone()];
                    let tok_v = &self.kept.v[layer as usize][b][p][x];
                    rows += 2;
                    same += (krows[r * kw..(r + 1) * kw] == kref.encode(tok_k)[..]) as usize;
                    same += (vrows[r * vw..(r + 1) * vw] == vref.encode(tok_v)[..]) as usize;
                }
            }
        }
        // A row of another token never matches; a rounding tie differs in one code or scale.
        assert!(
            same * 100 >= rows * 95,
            "{}: only {same} of {rows} rows hold their position's token",
            s.codecs.name()
        );
    }
}

/// (codec, head_dim, q_heads, kv_heads, capacity, window, segment tokens, batch, layers)
type Shape = (&'static str, u32, u32, u32, u32, u32, Option<u32>, u32, u32);

const SHAPES: [Shape; 4] = [
    ("none", 64, 8, 2, 80, 64, None, 2, 1),
    ("none", 128, 2, 2, 100, 100, Some(32), 1, 2),
    ("q8_sym", 96, 4, 2, 70, 50, Some(32), 2, 1),
    ("k=rotor3b+qjl,v=iso4", 64, 8, 1, 72, 40, Some(32), 2, 1),
];

fn ring(shape: Shape) -> Ring {
    let (name, d, qh, kvh, cap, win, seg, batch, layers) = shape;
    let mut spec = CacheSpec::new(layers, qh, kvh, d, cap)
        .with_codecs(KvCodecs::parse(name).unwrap())
        .with_window(win)
        .with_batch(batch)
        .with_splits(3);
    spec.segment_tokens = seg;
    Ring::new(spec, d as u64 * 7 + cap as u64)
}

#[test]
fn fused_steps_wrap_the_ring_and_attend_the_window() {
    fused_steps_wrap_the_ring(&SHAPES[..2]);
}

/// As above for the quantized shapes (apart, so that the two run on parallel test threads).
#[test]
fn fused_steps_wrap_the_quantized_ring_and_attend_the_window() {
    fused_steps_wrap_the_ring(&SHAPES[2..]);
}

fn fused_steps_wrap_the_ring(shapes: &[Shape]) {
    for &shape in shapes {
        let mut r = ring(shape);
        let (name, cap, layers) = (shape.0, shape.4, shape.8);
        let layer = layers - 1;
        // Fewer tokens than the window, then steps of varied sizes through three wraps.
        r.append(layer, 5);
        let mut sizes = [1usize, 3, 1, 17, 1, 2, 1, 40, 1].iter().cycle();
        while r.cache.len(layer, 0).unwrap() < 3 * cap {
            let n = *sizes.next().unwrap();
            let e = r.step(layer, n);
            let len = r.cache.len(layer, 0).unwrap();
            assert!(
                e <= TOL,
                "{name}: step of {n} to length {len}: rel err {e:e}"
            );
        }
        r.check_slots(layer, cap);
        let e = r.attend(layer);
        assert!(e <= TOL, "{name}: attend after the steps: rel err {e:e}");
        let (gpu, overflow) = r.cache.read_gpu_lengths().unwrap();
        let b = shape.7 as usize;
        assert_eq!(
            gpu[layer as usize * b..],
            r.kept.k[layer as usize]
                .iter()
                .map(|t| t.len() as u32)
                .collect::<Vec<_>>()[..]
        );
        assert!(
            overflow.iter().all(|&f| f == 0),
            "{name}: a ring never overflows"
        );
    }
}

/// Splits take whole tiles and split 0 the tail (wgsl/kernels/attention.wgsl) in a ring over two
/// segments: 64-invocation workgroups and 3 splits give 192-token rounds in 256-token
/// segments. A 40-token step at length 740 cuts a 36-token tail in segment 0 beside new tokens
/// that spill into segment 1, whose own tail lies in segment 0 (not cut); with a window
/// shorter than the ring, single steps cut tails beside the new token and in the segment
/// without new tokens.
#[test]
fn split_tails_in_a_ring_over_segments() {
    for window in [512u32, 448] {
        let mut spec = CacheSpec::new(1, 8, 2, 64, 512)
            .with_window(window)
            .with_batch(2)
            .with_splits(3);
        spec.segment_tokens = Some(256);
        spec.workgroup = Some(64);
        let mut r = Ring::new(spec, 11 + window as u64);
        let (start, steps) = if window == 512 { (740, 6) } else { (705, 63) };
        r.append(0, start);
        if window == 512 {
            let e = r.step(0, 40);
            assert!(
                e <= TOL,
                "window {window}: step of 40 at {start}: rel err {e:e}"
            );
        }
        for _ in 0..steps {
            let e = r.step(0, 1);
            let len = r.cache.len(0, 0).unwrap();
            assert!(e <= TOL, "window {window}: step to {len}: rel err {e:e}");
        }
        let e = r.attend(0);
        assert!(e <= TOL, "window {window}: attend: rel err {e:e}");
        r.check_slots(0, window);
    }
}

#[test]
fn prefill_longer_than_the_ring_keeps_its_last_tokens() {
    prefill_longer_than_the_ring(&SHAPES[..2]);
}

/// As above for the quantized shapes (apart, so that the two run on parallel test threads).
#[test]
fn prefill_longer_than_the_quantized_ring_keeps_its_last_tokens() {
    prefill_longer_than_the_ring(&SHAPES[2..]);
}

fn prefill_longer_than_the_ring(shapes: &[Shape]) {
    for &shape in shapes {
        let mut r = ring(shape);
        let (name, cap) = (shape.0, shape.4 as usize);
        // Wide append path (more than 64 tokens), most of them dropped by the ring.
        r.append(0, 2 * cap + 9);
        r.check_slots(0, cap as u32);
        let e = r.attend(0);
        assert!(
            e <= TOL,
            "{name}: after a prefill of {}: rel err {e:e}",
            2 * cap + 9
        );
        // A fused step longer than the ring.
        let e = r.step(0, cap + 3);
        assert!(e <= TOL, "{name}: fused step of {}: rel err {e:e}", cap + 3);
        r.check_slots(0, cap as u32);
    }
}

#[test]
fn rollback_within_the_ring_and_sequences_at_different_lengths() {
    for shape in SHAPES[..3].iter().copied().filter(|s| s.7 == 2) {
        let mut r = ring(shape);
        let (name, cap, win) = (shape.0, shape.4, shape.5);
        r.append(0, cap as usize + 20);
        let len = r.cache.len(0, 1).unwrap();
        let slack = cap - win;
        // One token more than the ring can give back: refused, nothing changed.
        let too_far = r.cache.truncate(1, len - slack - 1);
        assert!(
            matches!(too_far, Err(KvqError::InvalidArgument(_))),
            "{name}: {too_far:?}"
        );
        assert_eq!(r.cache.len(0, 1).unwrap(), len);
        // As far back as the ring allows: sequence 1 is now `slack` tokens behind sequence 0.
        r.cache.truncate(1, len - slack).unwrap();
        r.kept.truncate(1, len - slack);
        let e = r.attend(0);
        assert!(e <= TOL, "{name}: after the rollback: rel err {e:e}");
        for n in [1, 4, 1] {
            let e = r.step(0, n);
            assert!(
                e <= TOL,
                "{name}: step of {n} after the rollback: rel err {e:e}"
            );
        }
        r.check_slots(0, win);
        // A reset sequence starts over in the same slots.
        r.cache.reset(0).unwrap();
        r.kept.truncate(0, 0);
        r.append(0, 3);
        let e = r.attend(0);
        assert!(e <= TOL, "{name}: after a reset: rel err {e:e}");
    }
}

#[test]
fn window_spec_is_checked() {
    for w in [0, 81] {
        let spec = CacheSpec::new(1, 4, 2, 64, 80).with_window(w);
        assert!(matches!(
            KvCache::new(ctx(), spec),
            Err(KvqError::InvalidSpec(_))
        ));
    }
}
