// Exact tokens (CacheSpec::exact): each sequence's first SINK positions and its newest XRING
// (RECENT, and a chunk slice's more: a chunk's queries each see the RECENT up to their own),
// kept as f16 in the caller's domain beside the store (which still encodes every token), and
// attended by the first segment's exact workgroup (split nsplit() + 1) in place of their
// codes. Only the first segment's dispatches touch them.
//
// They live after the V rows of the first segment's V buffer (a binding of their own would
// pass WebGPU's 8 storage buffers a stage in the fused step): [NB] exact_lo (the oldest
// position the ring still holds since a truncate cut the sequence back, KvCache::truncate;
// every segment's V buffer ends with a copy, which its splits read), then K's rows, then
// V's, each [NB, KVH, XE, D / 2] f16 pairs. Position p lives in slot p
// below SINK, else in the ring slot SINK + (p - SINK) % XRING.

// Word i of the region in V's store: after this segment's V rows.
fn x_word(i: u32) -> u32 {
    return NB * KVH * seg.seg_tokens * V_WORDS + i;
}

// u32 word i of the region (V's store is vec2<u32> for f16 rows, else u32).
fn x_at(i: u32) -> u32 {
    let w = x_word(i);
#if V_KIND == KIND_NONE
    return v_store[w / 2u][w % 2u];
#else
    return v_store[w];
#endif
}

const XE: u32 = SINK + XRING;
// Words from a K row to the same slot's V row.
fn xv() -> u32 {
    return NB * KVH * XE * (D / 2u);
}

// (Without a ring, a position past the sink reads the last sink row: the attention kernels
// load the rows of masked positions too, which must stay inside the region and finite. The
// max keeps naga's constant evaluation from seeing a division by zero there.)
fn x_slot(p: u32) -> u32 {
    if p < SINK {
        return p;
    }
    if XRING == 0u {
        return XE - 1u;
    }
    return SINK + (p - SINK) % max(XRING, 1u);
}

// First word of position p's K row (sequence b, KV head h); its V row is xv() words on.
fn x_row(b: u32, h: u32, p: u32) -> u32 {
    return NB + ((b * KVH + h) * XE + x_slot(p)) * (D / 2u);
}

// First exact position of the ring for a query that sees positions below `len` (the newest
// RECENT of them), the sequence's exact_lo being `lo`: positions from there up to len are
// exact (none below SINK: those are the sink's).
fn x_ring_lo(lo: u32, len: u32) -> u32 {
    return min(len, max(max(SINK, len - min(len, RECENT)), lo));
}

#if ENCODE
// Whether position p keeps an exact copy once the sequence holds `total` tokens: the sink's,
// and the newest XRING (older ones would be overwritten in the same dispatch).
fn x_keeps(p: u32, total: u32) -> bool {
    return p < SINK || p + XRING >= total;
}

fn x_half2(x: vec2<f32>) -> u32 {
    return pack2x16float(clamp(x, vec2<f32>(-65504.0), vec2<f32>(65504.0)));
}

fn x_set(i: u32, x: u32) {
    let w = x_word(i);
#if V_KIND == KIND_NONE
    v_store[w / 2u][w % 2u] = x;
#else
    v_store[w] = x;
#endif
}

// Values 2w, 2w + 1 of position p's K and V rows (sequence b, KV head h), from input pair
// src + w.
fn x_put(b: u32, h: u32, p: u32, src: u32, w: u32) {
    let r = x_row(b, h, p) + w;
    x_set(r, x_half2(in_pair_k(src + w)));
    x_set(r + xv(), x_half2(in_pair_v(src + w)));
}
#endif

#if KMEAN
// K's mean (ExactTokens::k_mean): once a sequence holds its SINK tokens, the f32 mean of their
// f16 K rows per channel, kept in `lens` after the codec constants ([LAYERS, NB, KVH, D] f32)
// and written by the first segment's dispatch that completes the sink. Every later K row is
// encoded as k - mean, and the exact workgroup scores k - mean too: every score of a query is
// shifted alike, so the softmax is unchanged (a chunk's log-sum-exp adds q . mean back).

// Word of value 0 of sequence b's mean, head h.
fn kmu_at(b: u32, h: u32) -> u32 {
    return KMU + ((seg.layer * NB + b) * KVH + h) * D;
}

// Values 4c .. 4c + 3 of the stored mean.
fn kmu_load(b: u32, h: u32, c: u32) -> vec4<f32> {
    let i = kmu_at(b, h) + 4u * c;
    return bitcast<vec4<f32>>(vec4<u32>(lens[i], lens[i + 1u], lens[i + 2u], lens[i + 3u]));
}

#if ENCODE
// Where this workgroup's K encoders take the mean from (kmu_begin): nowhere (every new
// position lies in the sink, whose codes are never attended), the stored mean, or the sink's
// rows themselves (in the first segment's dispatch that completes the sink: the stored mean
// is being written beside it).
const KMU_NONE: u32 = 0u;
const KMU_STORED: u32 = 1u;
const KMU_SOURCE: u32 = 2u;
var<private> kmu_mode: u32;
// The sequence's length before this dispatch's tokens.
var<private> kmu_base: u32;

// Sets the mode for new positions base .. base + n; returns whether this dispatch writes the
// mean (it completes the sink, and it is the first segment's).
fn kmu_begin(base: u32, n: u32) -> bool {
    kmu_base = base;
    let writes = base < SINK && base + n >= SINK && seg.split_base == 0u;
    if base + n <= SINK {
        kmu_mode = KMU_NONE;
    } else if writes {
        kmu_mode = KMU_SOURCE;
    } else {
        kmu_mode = KMU_STORED;
    }
    return writes;
}

// Values 2w, 2w + 1 of the mean over sequence b's sink (head h) in the dispatch that completes
// it: positions below kmu_base from their exact copies, the rest from the input rounded to
// f16 as their copies are, summed in position order, so that every workgroup computes what
// the writer stores. (x_at reads the first segment's region: KMU_SOURCE is only there.)
fn kmu_source(b: u32, h: u32, w: u32) -> vec2<f32> {
    var s = vec2<f32>(0.0);
    for (var p = 0u; p < SINK; p++) {
        if p < kmu_base {
            s += unpack2x16float(x_at(x_row(b, h, p) + w));
        } else {
            let x = clamp(in_pair_k(in_row(b, p - kmu_base, h) + w), vec2<f32>(-65504.0), vec2<f32>(65504.0));
            s += sign(x) * vec2<f32>(f16_round(abs(x.x)), f16_round(abs(x.y)));
        }
    }
    return s / f32(SINK);
}

// K's input pair i less the mean (see in_pair_k; the encoders' view of K).
fn in_code_k(i: u32) -> vec2<f32> {
    let x = in_pair_k(i);
    if kmu_mode == KMU_NONE {
        return x;
    }
    let w = i % (D / 2u);
    let h = (i / (D / 2u)) % KVH;
    let b = in_seq(i);
    if kmu_mode == KMU_SOURCE {
        return x - kmu_source(b, h, w);
    }
    let m = kmu_at(b, h) + 2u * w;
    return x - vec2<f32>(bitcast<f32>(lens[m]), bitcast<f32>(lens[m + 1u]));
}

// Stores the mean of heads h0 .. h0 + nh of sequence b (nt invocations share it), in the
// dispatch that completes the sink.
fn kmu_write(lid: u32, nt: u32, b: u32, h0: u32, nh: u32) {
    for (var i = lid; i < nh * (D / 2u); i += nt) {
        let h = h0 + i / (D / 2u);
        let w = i % (D / 2u);
        let m = kmu_source(b, h, w);
        let at = kmu_at(b, h) + 2u * w;
        lens[at] = bitcast<u32>(m.x);
        lens[at + 1u] = bitcast<u32>(m.y);
    }
}
#endif
#endif
