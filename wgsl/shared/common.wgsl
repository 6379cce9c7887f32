// Shared helpers for every kvq kernel. The generated block of `const` declarations (shape,
// codec and tuning constants) precedes every module; see src/kernels/config.rs, `defines`.

// Masked score / empty-max sentinel: finite so exp(NEG - m) is 0, never NaN.
const NEG: f32 = -3.0e38;

// Codes as exact f32 integers less an offset, without a conversion instruction: a code c < 2^23
// OR-ed into the mantissa of 2^23 is the float 2^23 + c, and subtracting 2^23 + off is exact.
// Used by q4's K reader: two logic operations (mask, exponent) and the subtraction a code,
// against a mask, a conversion and the subtraction, measured faster for K-only q4. Not for
// bytes: a GPU may convert a byte of a word with one instruction, and this made the q8 loops
// slower (BENCHMARKS.md, "Kernel choices, measured").
fn codes_less(c: vec4<u32>, off: f32) -> vec4<f32> {
    return bitcast<vec4<f32>>(c | vec4<u32>(0x4b000000u)) - (8388608.0 + off);
}

// Per (layer, storage segment) dispatch parameters, written once when the cache is built.
struct Seg {
    layer: u32,
    // First token position held by this segment's buffers.
    seg_start: u32,
    // Tokens each (sequence, kv head) run holds in this segment (the row stride).
    seg_tokens: u32,
    // 1 for the segment holding the last positions: its append dispatch commits the length.
    is_last: u32,
    // Index of this segment's first split in the partials buffer.
    split_base: u32,
    // The cache's shape numbers, the same in every segment's params (src/kernels/shape.rs):
    // the kernels name them NB, CAP, WIN, RING, LAYERS, KVH, QH, NSPLIT, SPLITS_TOTAL, PSLOTS,
    // MIN_CHUNK, CST, KMU, SCALE, SOFTCAP and SINKS, and the preprocessor reads each from
    // here, so that caches differing only in them share one kernel text.
    batch: u32,
    capacity: u32,
    window: u32,
    ring: u32,
    layers: u32,
    kv_heads: u32,
    q_heads: u32,
    splits: u32,
    splits_total: u32,
    partial_slots: u32,
    min_chunk: u32,
    constants: u32,
    k_means: u32,
    scale: f32,
    // Logit softcap, 0 for none.
    softcap: f32,
    // Index in the lengths buffer of layer 0's first sink logit ([LAYERS, QH] f32), NO_SINKS
    // for none.
    sinks: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

const NO_SINKS: u32 = 0xffffffffu;

// A scaled score as the softmax takes it: SOFTCAP * tanh(s / SOFTCAP) where a softcap is set.
// tanh from exp(-2|x|), which never overflows (a driver's tanh may compute inf / inf = NaN
// for a large argument).
fn capped(s: f32) -> f32 {
    if SOFTCAP > 0.0 {
        let x = s / SOFTCAP;
        let t = exp(-2.0 * abs(x));
        return SOFTCAP * sign(x) * (1.0 - t) / (1.0 + t);
    }
    return s;
}

// Row index of (sequence b, kv head h, token position pos) inside a segment's buffer.
fn seg_row(b: u32, h: u32, pos: u32, s: Seg) -> u32 {
    return (b * KVH + h) * s.seg_tokens + (pos - s.seg_start);
}

// Token positions are logical: the count of tokens appended to the sequence before it. A
// sliding-window cache (RING) keeps the last CAP positions in a ring of CAP slots, position p
// in slot p % CAP, and attends the last WIN of them; otherwise slot = position and WIN = CAP.
fn ring_slot(p: u32) -> u32 {
    if RING {
        return p % CAP;
    }
    return p;
}

// Whether n more tokens fit after len: a ring never fills (only its u32 count could wrap).
fn fits(len: u32, n: u32) -> bool {
    if RING {
        return len + n >= len;
    }
    return len + n <= CAP;
}

// The slots of positions [x, y) (y - x <= CAP) that lie in segment s, in position order, as
// two runs of segment-local slots: (first slot of run 1, its length, length of run 2). Run 2
// (a ring's wrap past slot CAP - 1 back to slot 0) starts at the segment's first slot.
fn seg_runs(x: u32, y: u32, s: Seg) -> vec3<u32> {
    let a = ring_slot(x);
    let e = a + (y - x);
    let lo = s.seg_start;
    let hi = s.seg_start + s.seg_tokens;
    let r1s = clamp(a, lo, hi);
    let r1e = clamp(min(e, CAP), lo, hi);
    let r2e = clamp(max(e, CAP) - CAP, lo, hi);
    return vec3<u32>(r1s - lo, r1e - r1s, r2e - lo);
}

// Segment-local slot of the u-th position of runs r (u < r.y + r.z).
fn run_slot(u: u32, r: vec3<u32>) -> u32 {
    if RING && u >= r.y {
        return u - r.y;
    }
    return r.x + u;
}

// Whether absolute slot p lies in segment s.
fn in_seg(p: u32, s: Seg) -> bool {
    return p >= s.seg_start && p < s.seg_start + s.seg_tokens;
}

// K rows are interleaved in blocks of KB tokens: 16-byte chunk w of the KB tokens of a block
// lie side by side, so a thread-per-token read of chunk w is one contiguous, coalesced access.
// (V rows stay plain: V is read a row at a time across threads.) seg_tokens is a multiple of KB
// (KB comes from the generated header: kvq's K_BLOCK).

// Index (in 16-byte chunks) of chunk w of K row `row` (as from seg_row); K_CHUNKS per row.
fn k_chunk(row: u32, w: u32) -> u32 {
    return (row - row % KB) * K_CHUNKS + w * KB + row % KB;
}

// Index of the length of (layer, sequence) in the lengths buffer; overflow flags follow them.
fn len_index(layer: u32, b: u32) -> u32 {
    return layer * NB + b;
}

// The f32 value of the f16 nearest to x (ties to even), for 0 <= x <= 65504. Done in integer
// arithmetic: unpack2x16float(pack2x16float(x)) may be folded back to x by a driver's compiler.
fn f16_round(x: f32) -> f32 {
    if x < 6.103515625e-05 {
        // f16 subnormals are multiples of 2^-24; WGSL round() ties to even.
        return round(x * 16777216.0) / 16777216.0;
    }
    let m = bitcast<u32>(x);
    return bitcast<f32>((m + 0xfffu + ((m >> 13u) & 1u)) & 0xffffe000u);
}

// acc + dot(a, b) as one chain of fused multiply-adds: dot() compiles to a multiply and three
// multiply-adds, and adding its result to a sum takes one more instruction (in the K phase,
// 640 instructions a token on 512 products, 512 this way).
fn fma4(acc: f32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, acc))));
}

// A non-finite input value (NaN or ±Inf: all exponent bits set) reads as 0, so that one bad
// value cannot make a row's scale, its token's score or the sequence's softmax NaN or Inf
// (the behaviour KvCache::append documents). A bit test: drivers may fold `x != x` away.
fn finite_or_zero(x: vec2<f32>) -> vec2<f32> {
    let e = bitcast<vec2<u32>>(x) & vec2<u32>(0x7f800000u);
    return select(x, vec2<f32>(0.0), e == vec2<u32>(0x7f800000u));
}
