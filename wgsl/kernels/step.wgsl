// The fused decode step module: the attention kernels (kernels/attention.wgsl) with step
// hooks: the split kernel appends the new tokens' K and V rows it covers and attends over
// them; the reduce kernel then commits the sequence length. One layer's step is thereby two
// dispatches (split, reduce) instead of three (append, split, reduce).
//
// Inputs as for append: [NB, n, KVH, D] in IN_T elements, read through in_pair_k/in_pair_v.
#include "shared/input.wgsl"
#include "shared/common.wgsl"
#include "shared/rotate.wgsl"
#include "shared/encode_rows.wgsl"
#include "shared/lengths.wgsl"
#include "codecs/stores.wgsl" access=read_write
#include "codecs/readers.wgsl"
#if EXACT
#include "shared/exact.wgsl"
#endif

// [LAYERS * NB] lengths, then [LAYERS * NB] overflow flags, then the codec constants (cst).
@group(0) @binding(3) var<storage, read_write> lens: array<u32>;

@group(1) @binding(2) var<storage, read> k_in: array<IN_T>;
@group(1) @binding(3) var<storage, read> v_in: array<IN_T>;
struct StepInput {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}
@group(1) @binding(4) var<uniform> input: StepInput;

// Pair index (as for in_pair_k) of new token t's row of KV head h, sequence b.
fn in_row(b: u32, t: u32, h: u32) -> u32 {
    return ((b * input.n + t) * KVH + h) * (D / 2u);
}

// The sequence of input pair i.
fn in_seq(i: u32) -> u32 {
    return i / (D / 2u * KVH * input.n);
}

// Tokens this step appends: all of them, or none when they would pass the capacity.
fn step_tokens(len: u32) -> u32 {
    return select(0u, input.n, fits(len, input.n));
}

// Writes kv head h's rows of sequence b for the new positions len .. len + n that lie in this
// segment (of more than CAP new tokens, a ring keeps the last CAP). Arguments are uniform.
fn write_new_rows(lid: u32, b: u32, h: u32, len: u32) {
    let n = step_tokens(len);
#if KMEAN
    // (The exact workgroup stores the mean where this step completes the sink.)
    kmu_begin(len, n);
#endif
    let t0 = n - min(n, CAP);
    let runs = seg_runs(len + t0, len + n, seg);
    if runs.y + runs.z == 0u {
        return;
    }
    let tasks = K_TASKS + V_TASKS;
    if COOP {
        for (var r0 = t0; r0 < n; r0 += ET) {
            let nr = min(ET, n - r0);
            if lid < nr {
                let slot = ring_slot(len + r0 + lid);
                enc_dst[lid] = select(NO_ROW, seg_row(b, h, slot, seg), in_seg(slot, seg));
                enc_src[lid] = in_row(b, r0 + lid, h);
            }
            encode_rows(lid, WG, nr);
        }
    }
    for (var i = lid; i < (n - t0) * tasks; i += WG) {
        let t = t0 + i / max(tasks, 1u);
        let task = i % max(tasks, 1u);
        let slot = ring_slot(len + t);
        if !in_seg(slot, seg) {
            continue;
        }
        let row = seg_row(b, h, slot, seg);
        let src = in_row(b, t, h);
        if task < K_TASKS {
            encode_k(row, src, task);
        } else {
            encode_v(row, src, task - K_TASKS);
        }
    }
}

#if EXACT
// Writes the exact copies of sequence b's new tokens that keep one, KV head h (the exact
// tokens' workgroup, exact_partial, which attends them after its storage barrier).
fn write_exact_rows(lid: u32, b: u32, h: u32, len: u32) {
    let n = step_tokens(len);
    for (var i = lid; i < n * (D / 2u); i += WG) {
        let t = i / (D / 2u);
        if x_keeps(len + t, len + n) {
            x_put(b, h, len + t, in_row(b, t, h), i % (D / 2u));
        }
    }
}
#endif

// The length commit_step advances (read by the reduce before it folds the partials).
fn committed_len(b: u32) -> u32 {
    return lens[len_index(seg.layer, b)];
}

// Called by one invocation per sequence after every split has read the old length `len`.
fn commit_step(b: u32, len: u32) {
    advance_len(b, len, input.n);
}

#include "kernels/attention.wgsl" scores=s_sh weights=p_sh lanes=comb
