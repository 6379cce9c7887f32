// The append module: n new tokens' K and V into one layer's store, then that layer's lengths
// advanced.
//
// Inputs are the caller's buffers, layout [NB, n, KVH, D] (f32, or f16 packed two per u32),
// read through in_pair_k / in_pair_v (shared/input.wgsl).
// Small n: one workgroup per sequence writes everything and then commits the length itself,
// so a decode step's append is a single dispatch. Large n (prefill): many workgroups write,
// and a separate one-workgroup `commit` dispatch advances the length afterwards.

#include "shared/input.wgsl"
#include "shared/common.wgsl"
#include "shared/rotate.wgsl"
#include "shared/encode_rows.wgsl"
#include "shared/lengths.wgsl"
// k_store (binding 1) and v_store (binding 2), with their encode_k / encode_v.
#include "codecs/stores.wgsl" access=read_write
#if EXACT
#include "shared/exact.wgsl"
#endif

@group(0) @binding(0) var<uniform> seg: Seg;
// [LAYERS * NB] lengths, then [LAYERS * NB] overflow flags.
@group(0) @binding(3) var<storage, read_write> lens: array<u32>;

struct Input {
    // New tokens per sequence this append writes: tokens first .. first + n of the input's
    // `stride` per sequence (a chunk appended slice by slice; else first 0, stride n).
    n: u32,
    // Tasks per invocation of append_wide.
    items: u32,
    // Rows each append_wide workgroup encodes cooperatively (rotated codecs).
    coop_rows: u32,
    first: u32,
    stride: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}
@group(1) @binding(0) var<storage, read> k_in: array<IN_T>;
@group(1) @binding(1) var<storage, read> v_in: array<IN_T>;
@group(1) @binding(2) var<uniform> input: Input;

const APPEND_WG: u32 = 256u;

// Pair index (as for in_pair_k) of new token t's row of KV head h, sequence b.
fn in_row(b: u32, t: u32, h: u32) -> u32 {
    return ((b * input.stride + input.first + t) * KVH + h) * (D / 2u);
}

// The sequence of input pair i.
fn in_seq(i: u32) -> u32 {
    return i / (D / 2u * KVH * input.stride);
}
var<workgroup> base_sh: u32;

// Encode tasks per new row: K_TASKS for K then V_TASKS for V (a word for f16, a code word or
// a scale word for q8/q4; each task owns whole words). A rotated side has no tasks: its
// rows are encoded by the whole workgroup (encode_rows), up to ET tokens at a time.
const ROW_TASKS: u32 = K_TASKS + V_TASKS;
// The divisor for task indices (never zero, even when no task exists).
const TASK_DIV: u32 = max(ROW_TASKS, 1u);

// Of n new tokens, the first one written: a ring keeps only the last CAP.
fn first_kept(n: u32) -> u32 {
    return n - min(n, CAP);
}

// Runs task i (of n * KVH * ROW_TASKS) of sequence b's new rows, whose first position is
// `base`, if its slot lies in this segment.
fn write_task(b: u32, base: u32, i: u32) {
    let t = i / (KVH * TASK_DIV);
    let slot = ring_slot(base + t);
    if t < first_kept(input.n) || !in_seg(slot, seg) {
        return;
    }
    let h = (i / TASK_DIV) % KVH;
    let task = i % TASK_DIV;
    let row = seg_row(b, h, slot, seg);
    let src = in_row(b, t, h);
    if task < K_TASKS {
        encode_k(row, src, task);
    } else {
        encode_v(row, src, task - K_TASKS);
    }
}

// Lists new rows r0 .. r0 + nr (row i = token i / KVH, head i % KVH) of sequence b for
// encode_rows; rows outside this segment (or dropped from a ring) are computed, not written.
fn list_rows(lid: u32, b: u32, base: u32, r0: u32, nr: u32) {
    if lid < nr {
        let i = r0 + lid;
        let t = i / KVH;
        let h = i % KVH;
        let slot = ring_slot(base + t);
        var dst = NO_ROW;
        if t >= first_kept(input.n) && in_seg(slot, seg) {
            dst = seg_row(b, h, slot, seg);
        }
        enc_dst[lid] = dst;
        enc_src[lid] = in_row(b, t, h);
    }
}

// Exact copy i (of n * KVH * D / 2: one value pair of one new row) of sequence b, whose first
// new position is `base`, if the position keeps one (written by the first segment's dispatch,
// which holds them).
fn exact_task(b: u32, base: u32, i: u32) {
#if EXACT
    let t = i / (KVH * D / 2u);
    let p = base + t;
    if seg.split_base != 0u || !x_keeps(p, base + input.n) {
        return;
    }
    let h = (i / (D / 2u)) % KVH;
    x_put(b, h, p, in_row(b, t, h), i % (D / 2u));
#endif
}

// Cooperatively encodes rows [first, last) of sequence b (uniform arguments).
fn encode_range(lid: u32, b: u32, base: u32, first: u32, last: u32) {
    for (var r0 = first; r0 < last; r0 += ET) {
        let nr = min(ET, last - r0);
        list_rows(lid, b, base, r0, nr);
        encode_rows(lid, APPEND_WG, nr);
    }
}

// Loads the encoders' tables and returns sequence b's length before the append, both
// published by the barrier of workgroupUniformLoad (uniform control flow only).
fn append_start(lid: u32, b: u32) -> u32 {
    load_diag(lid, APPEND_WG, true, true);
    k_load_levels(lid);
    v_load_levels(lid);
    if lid == 0u {
        base_sh = lens[len_index(seg.layer, b)];
    }
    return workgroupUniformLoad(&base_sh);
}

// Dispatch (1, NB, 1).
@compute @workgroup_size(256)
fn append_small(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let b = wid.y;
    let base = append_start(lid, b);
    if fits(base, input.n) {
#if KMEAN
        if kmu_begin(base, input.n) {
            kmu_write(lid, APPEND_WG, b, 0u, KVH);
        }
#endif
        for (var i = lid; i < input.n * KVH * ROW_TASKS; i += APPEND_WG) {
            write_task(b, base, i);
        }
        if COOP {
            encode_range(lid, b, base, 0u, input.n * KVH);
        }
        if EXACT {
            for (var i = lid; i < input.n * KVH * D / 2u; i += APPEND_WG) {
                exact_task(b, base, i);
            }
        }
    }
    // Only invocation 0 touches the length, and it read it above: no other ordering needed.
    if lid == 0u && seg.is_last == 1u {
        advance_len(b, base, input.n);
    }
}

// Dispatch (max(ceil(n*KVH*ROW_TASKS / (APPEND_WG * items)), ceil(n*KVH / coop_rows)), NB, 1);
// nobody writes lengths here.
@compute @workgroup_size(256)
fn append_wide(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let b = wid.y;
    let base = append_start(lid, b);
    if !fits(base, input.n) {
        return;
    }
#if KMEAN
    // (The grid's first workgroup stores the mean; the others compute what it stores.)
    if kmu_begin(base, input.n) && wid.x == 0u {
        kmu_write(lid, APPEND_WG, b, 0u, KVH);
    }
#endif
    if COOP {
        let rows = input.n * KVH;
        encode_range(lid, b, base, min(rows, wid.x * input.coop_rows), min(rows, (wid.x + 1u) * input.coop_rows));
    }
    let per_wg = APPEND_WG * input.items;
    let last = min(input.n * KVH * ROW_TASKS, (wid.x + 1u) * per_wg);
    for (var i = wid.x * per_wg + lid; i < last; i += APPEND_WG) {
        write_task(b, base, i);
    }
    // The exact copies, strided over the grid.
    if EXACT {
        for (var i = wid.x * APPEND_WG + lid; i < input.n * KVH * D / 2u; i += nwg.x * APPEND_WG) {
            exact_task(b, base, i);
        }
    }
}

// Dispatch (1, NB, 1) after every segment's append_wide.
@compute @workgroup_size(1)
fn append_commit(@builtin(workgroup_id) wid: vec3<u32>) {
    advance_len(wid.y, lens[len_index(seg.layer, wid.y)], input.n);
}
