// From the fused projection's output qkv [tokens, (HQ + 2 HK) * D] to attention's inputs:
// q [tokens, HQ, D] f32, k and v [tokens, HK, D] f16 (two per word, element 2i in the low
// half), with RoPE on q and k at each token's position and, where QK_NORM, an RMSNorm of each
// q and k head before it (Qwen3). One workgroup per (head, token); token t = b * per_seq + i
// is at position len + i, len the sequence's length in this layer before its new tokens, read
// from kvq's lengths on the GPU (`KvCache::lengths_binding`): nothing is uploaded per step.
//
// ROPE 0: adjacent pairs (2i, 2i + 1) rotate by pos · freq[i] (GGUF's Llama layout, whose Q/K
// weights are permuted for it); ROPE 1: pairs (i, i + D / 2) (the Hugging Face / NeoX form).

#include "params.wgsl"

@group(0) @binding(0) var<storage, read> qkv: array<f32>;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> k: array<u32>;
@group(0) @binding(3) var<storage, read_write> v: array<u32>;
// kvq's lengths: sequence b of layer l at l * B + b.
@group(0) @binding(4) var<storage, read> lens: array<u32>;
// [D / 2] RoPE frequencies, then [D] q-norm gain, then [D] k-norm gain.
@group(0) @binding(5) var<storage, read> consts: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;
// x: this layer's index.
@group(0) @binding(7) var<uniform> at: vec4<u32>;

const HALF: u32 = D / 2u;
const WGS: u32 = 64u;

var<workgroup> red: array<f32, WGS>;
var<workgroup> row: array<f32, D>;

// The two coordinates rotation pair i turns (see ROPE).
fn pair(i: u32) -> vec2<u32> {
    if ROPE == 0u {
        return vec2<u32>(2u * i, 2u * i + 1u);
    }
    return vec2<u32>(i, i + HALF);
}

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let head = wid.x;
    let t = wid.y;
    let src = t * (HQ + 2u * HK) * D + head * D;
    let is_q = head < HQ;
    let is_v = head >= HQ + HK;
    for (var i = lid; i < D; i += WGS) {
        row[i] = qkv[src + i];
    }
    workgroupBarrier();
    // Per-head RMSNorm of q and k (uniform per workgroup: the head is the workgroup's).
    var scale = 1.0;
    if QK_NORM {
        var s = 0.0;
        for (var i = lid; i < D; i += WGS) {
            s += row[i] * row[i];
        }
        red[lid] = s;
        workgroupBarrier();
        for (var h = WGS / 2u; h > 0u; h >>= 1u) {
            if lid < h {
                red[lid] += red[lid + h];
            }
            workgroupBarrier();
        }
        scale = inverseSqrt(red[0] / f32(D) + EPS);
    }
    let b = t / p.per_seq;
    let pos = f32(lens[at.x * B + b] + t % p.per_seq);
    var out: array<f32, 2 * ((HALF + WGS - 1u) / WGS)>;
    for (var j = 0u; j * WGS + lid < HALF; j++) {
        let i = j * WGS + lid;
        let ab = pair(i);
        let ia = ab.x;
        let ib = ab.y;
        var a = row[ia];
        var c = row[ib];
        if !is_v {
            if QK_NORM {
                let g = select(HALF + D, HALF, is_q);
                a *= scale * consts[g + ia];
                c *= scale * consts[g + ib];
            }
            let th = pos * consts[i];
            let sn = sin(th);
            let cs = cos(th);
            let a2 = a * cs - c * sn;
            c = a * sn + c * cs;
            a = a2;
        }
        out[2u * j] = a;
        out[2u * j + 1u] = c;
    }
    workgroupBarrier();
    for (var j = 0u; j * WGS + lid < HALF; j++) {
        let ab = pair(j * WGS + lid);
        row[ab.x] = out[2u * j];
        row[ab.y] = out[2u * j + 1u];
    }
    workgroupBarrier();
    if is_q {
        for (var i = lid; i < D; i += WGS) {
            q[t * HQ * D + head * D + i] = row[i];
        }
    } else {
        let kvh = select(head - HQ, head - HQ - HK, is_v);
        let dst = (t * HK + kvh) * HALF;
        for (var i = lid; i < HALF; i += WGS) {
            let w = pack2x16float(vec2<f32>(row[2u * i], row[2u * i + 1u]));
            if is_v {
                v[dst + i] = w;
            } else {
                k[dst + i] = w;
            }
        }
    }
}
