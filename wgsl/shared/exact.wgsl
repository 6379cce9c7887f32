// Exact tokens (CacheSpec::exact): each sequence's first SINK positions and its newest RECENT,
// kept as f16 in the caller's domain beside the store (which still encodes every token), and
// attended by the first segment's exact workgroup (split NSPLIT + 1) in place of their
// codes. Only the first segment's dispatches touch them.
//
// They live after the V rows of the first segment's V buffer (a binding of their own would
// pass WebGPU's 8 storage buffers a stage in the fused step): [B] exact_lo (the oldest
// position the ring still holds since a truncate cut the sequence back, KvCache::truncate;
// every segment's V buffer ends with a copy, which its splits read), then K's rows, then
// V's, each [B, KVH, XE, D / 2] f16 pairs. Position p lives in slot p
// below SINK, else in the ring slot SINK + (p - SINK) % RECENT.

// Word i of the region in V's store: after this segment's V rows.
fn x_word(i: u32) -> u32 {
    return B * KVH * seg.seg_tokens * V_WORDS + i;
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

const XE: u32 = SINK + RECENT;
// Words from a K row to the same slot's V row.
const XV: u32 = B * KVH * XE * (D / 2u);

fn x_slot(p: u32) -> u32 {
    if p < SINK {
        return p;
    }
    return SINK + (p - SINK) % max(RECENT, 1u);
}

// First word of position p's K row (sequence b, KV head h); its V row is XV words on.
fn x_row(b: u32, h: u32, p: u32) -> u32 {
    return B + ((b * KVH + h) * XE + x_slot(p)) * (D / 2u);
}

// First position of a sequence's ring when it holds `len` tokens and its exact_lo is `lo`:
// positions from there up to len are exact (none below SINK: those are the sink's).
fn x_ring_lo(lo: u32, len: u32) -> u32 {
    return min(len, max(max(SINK, len - min(len, RECENT)), lo));
}

#if ENCODE
// Whether position p keeps an exact copy once the sequence holds `total` tokens: the sink's,
// and the newest RECENT (older ones would be overwritten in the same dispatch).
fn x_keeps(p: u32, total: u32) -> bool {
    return p < SINK || p + RECENT >= total;
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
    x_set(r + XV, x_half2(in_pair_v(src + w)));
}
#endif
