// Append n new tokens' K and V to one layer's store and advance that layer's lengths.
//
// Inputs are the caller's buffers, layout [B, n, KVH, D] (f32, or f16 packed two per u32).
// `in_pair(buf, i)` (generated for the input type) returns elements 2i and 2i+1.
// Small n: one workgroup per sequence writes everything and then commits the length itself,
// so a decode step's append is a single dispatch. Large n (prefill): many workgroups write,
// and a separate one-workgroup `commit` dispatch advances the length afterwards.

@group(0) @binding(0) var<uniform> seg: Seg;
@group(0) @binding(1) var<storage, read_write> k_store: array<u32>;
@group(0) @binding(2) var<storage, read_write> v_store: array<u32>;
// [LAYERS * B] lengths, then [LAYERS * B] overflow flags.
@group(0) @binding(3) var<storage, read_write> lens: array<u32>;

struct Input {
    n: u32,
    // Words per invocation of append_wide.
    items: u32,
    _pad1: u32,
    _pad2: u32,
}
@group(1) @binding(0) var<storage, read> k_in: array<IN_T>;
@group(1) @binding(1) var<storage, read> v_in: array<IN_T>;
@group(1) @binding(2) var<uniform> input: Input;

const APPEND_WG: u32 = 256u;
var<workgroup> base_sh: u32;

// Writes word i (of n*KVH*D/2) of sequence b's new rows, whose first position is `base`,
// if that position lies in this segment.
fn write_word(b: u32, base: u32, i: u32) {
    let words_per_tok = KVH * (D / 2u);
    let t = i / words_per_tok;
    let pos = base + t;
    if pos < seg.seg_start || pos >= seg.seg_start + seg.seg_tokens {
        return;
    }
    let rem = i % words_per_tok;
    let w = rem % (D / 2u);
    let row = seg_row(b, rem / (D / 2u), pos, seg);
    let src = (b * input.n + t) * words_per_tok + rem;
    k_store[4u * k_chunk(row, w / 4u) + w % 4u] = pack2x16float(in_pair_k(src));
    v_store[row * (D / 2u) + w] = pack2x16float(in_pair_v(src));
}

// Overflow (base + n > CAP) writes nothing and raises the sequence's overflow flag instead.
fn commit(b: u32, base: u32) {
    let li = len_index(seg.layer, b);
    if base + input.n <= CAP {
        lens[li] = base + input.n;
    } else {
        lens[LAYERS * B + li] = 1u;
    }
}

// Dispatch (1, B, 1).
@compute @workgroup_size(256)
fn append_small(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let b = wid.y;
    if lid == 0u {
        base_sh = lens[len_index(seg.layer, b)];
    }
    let base = workgroupUniformLoad(&base_sh);
    if base + input.n <= CAP {
        for (var i = lid; i < input.n * KVH * (D / 2u); i += APPEND_WG) {
            write_word(b, base, i);
        }
    }
    // Only invocation 0 touches the length, and it read it above: no other ordering needed.
    if lid == 0u && seg.is_last == 1u {
        commit(b, base);
    }
}

// Dispatch (ceil(n*KVH*D/2 / (APPEND_WG * items)), B, 1); nobody writes lengths here.
@compute @workgroup_size(256)
fn append_wide(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let b = wid.y;
    let base = lens[len_index(seg.layer, b)];
    if base + input.n > CAP {
        return;
    }
    let per_wg = APPEND_WG * input.items;
    let last = min(input.n * KVH * (D / 2u), (wid.x + 1u) * per_wg);
    for (var i = wid.x * per_wg + lid; i < last; i += APPEND_WG) {
        write_word(b, base, i);
    }
}

// Dispatch (1, B, 1) after every segment's append_wide.
@compute @workgroup_size(1)
fn append_commit(@builtin(workgroup_id) wid: vec3<u32>) {
    commit(wid.y, lens[len_index(seg.layer, wid.y)]);
}
