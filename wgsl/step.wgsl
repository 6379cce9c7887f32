// Fused decode step hooks: the split kernel appends the new tokens' K and V rows it covers
// and attends over them; the reduce kernel then commits the sequence length. One layer's
// step is thereby two dispatches (split, reduce) instead of three (append, split, reduce).
//
// Inputs as for append: [B, n, KVH, D] in IN_T elements, read through in_pair_k/in_pair_v.

@group(1) @binding(2) var<storage, read> k_in: array<IN_T>;
@group(1) @binding(3) var<storage, read> v_in: array<IN_T>;
struct StepInput {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}
@group(1) @binding(4) var<uniform> input: StepInput;

// Tokens this step appends: all of them, or none when they would pass the capacity.
fn step_tokens(len: u32) -> u32 {
    return select(0u, input.n, len + input.n <= CAP);
}

// Writes kv head h's rows of sequence b for positions [max(first, len), last).
fn write_new_rows(lid: u32, b: u32, h: u32, len: u32, first: u32, last: u32) {
    let p0 = max(first, len);
    if last <= p0 {
        return;
    }
    let tasks = K_TASKS + V_TASKS;
    if COOP {
        for (var r0 = p0; r0 < last; r0 += ER) {
            let nr = min(ER, last - r0);
            if lid < nr {
                enc_dst[lid] = seg_row(b, h, r0 + lid, seg);
                enc_src[lid] = ((b * input.n + (r0 + lid - len)) * KVH + h) * (D / 2u);
            }
            encode_rows(lid, WG, nr);
        }
    }
    for (var i = lid; i < (last - p0) * tasks; i += WG) {
        let pos = p0 + i / max(tasks, 1u);
        let task = i % max(tasks, 1u);
        let row = seg_row(b, h, pos, seg);
        let src = ((b * input.n + (pos - len)) * KVH + h) * (D / 2u);
        if task < K_TASKS {
            encode_k(row, src, task);
        } else {
            encode_v(row, src, task - K_TASKS);
        }
    }
}

// Called by one invocation per sequence after every split has read the old length.
fn commit_step(b: u32) {
    let li = len_index(seg.layer, b);
    let len = lens[li];
    if len + input.n <= CAP {
        lens[li] = len + input.n;
    } else {
        lens[LAYERS * B + li] = 1u;
    }
}
