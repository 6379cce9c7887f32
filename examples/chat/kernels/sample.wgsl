// The next token of each sequence, chosen on the GPU from its logits [B, V]: one workgroup per
// sequence. p.temperature == 0: greedy (the lowest id among the largest logits). Else
// temperature and nucleus sampling: the smallest set of most likely tokens whose probability
// mass reaches p.top_p (found by bisecting a probability threshold), then a token drawn from
// that set with a uniform number from a counter-based hash of (p.seed, sequence, draw).
// Writes the token (read by the next step's embedding, and read back) and advances the
// sequence's draw counter.

#include "params.wgsl"

@group(0) @binding(0) var<storage, read> logits: array<f32>;
// [B] tokens, then [B] draw counters.
@group(0) @binding(1) var<storage, read_write> state: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;

const WGS: u32 = 256u;
const BISECT: u32 = 24u;

var<workgroup> rv: array<f32, WGS>;
var<workgroup> ri: array<u32, WGS>;

// The largest logit and its lowest id over the sequence's row (every invocation gets both).
fn argmax(base: u32, lid: u32) -> vec2<u32> {
    var best = -3.4e38;
    var id = 0u;
    for (var i = lid; i < V; i += WGS) {
        let l = logits[base + i];
        if l > best {
            best = l;
            id = i;
        }
    }
    rv[lid] = best;
    ri[lid] = id;
    workgroupBarrier();
    for (var h = WGS / 2u; h > 0u; h >>= 1u) {
        if lid < h {
            let o = rv[lid + h];
            let oi = ri[lid + h];
            if o > rv[lid] || (o == rv[lid] && oi < ri[lid]) {
                rv[lid] = o;
                ri[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    let r = vec2<u32>(bitcast<u32>(rv[0]), ri[0]);
    workgroupBarrier();
    return r;
}

// Σ over the row of exp((l - mx) / T) where that is at least `floor` (every invocation gets it).
fn mass(base: u32, lid: u32, mx: f32, floor: f32) -> f32 {
    var s = 0.0;
    for (var i = lid; i < V; i += WGS) {
        let e = exp((logits[base + i] - mx) / p.temperature);
        if e >= floor {
            s += e;
        }
    }
    rv[lid] = s;
    workgroupBarrier();
    for (var h = WGS / 2u; h > 0u; h >>= 1u) {
        if lid < h {
            rv[lid] += rv[lid + h];
        }
        workgroupBarrier();
    }
    let r = rv[0];
    workgroupBarrier();
    return r;
}

fn hash(x: u32) -> u32 {
    var h = x * 747796405u + 2891336453u;
    h = ((h >> ((h >> 28u) + 4u)) ^ h) * 277803737u;
    return (h >> 22u) ^ h;
}

@compute @workgroup_size(WGS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let b = wid.x;
    let base = b * V;
    let top = argmax(base, lid);
    var token = top.y;
    if p.temperature > 0.0 {
        let mx = bitcast<f32>(top.x);
        let total = mass(base, lid, mx, 0.0);
        // The largest floor (relative to the top token's weight 1) whose kept mass is at
        // least top_p of the total.
        var lo = 0.0;
        var hi = 1.0;
        for (var it = 0u; it < BISECT; it++) {
            let mid = 0.5 * (lo + hi);
            if mass(base, lid, mx, mid) >= p.top_p * total {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let kept = mass(base, lid, mx, lo);
        let draw = state[B + b];
        let u = f32(hash(hash(p.seed ^ (b * 2654435769u)) ^ draw) >> 8u) / 16777216.0;
        let goal = u * kept;
        // Each invocation sums a contiguous range of ids; the range holding the goal is
        // scanned by its invocation.
        let per = (V + WGS - 1u) / WGS;
        let first = lid * per;
        let last = min(first + per, V);
        var s = 0.0;
        for (var i = first; i < last; i++) {
            let e = exp((logits[base + i] - mx) / p.temperature);
            if e >= lo {
                s += e;
            }
        }
        rv[lid] = s;
        workgroupBarrier();
        if lid == 0u {
            var acc = 0.0;
            var pick = 0u;
            for (var w = 0u; w < WGS; w++) {
                if acc + rv[w] > goal || w == WGS - 1u {
                    pick = w;
                    break;
                }
                acc += rv[w];
            }
            ri[0] = pick;
            rv[0] = acc;
        }
        workgroupBarrier();
        let pick = ri[0];
        let before = rv[0];
        workgroupBarrier();
        if lid == pick {
            var acc = before;
            var chosen = top.y;
            for (var i = first; i < last; i++) {
                let e = exp((logits[base + i] - mx) / p.temperature);
                if e >= lo {
                    chosen = i;
                    acc += e;
                    if acc > goal {
                        break;
                    }
                }
            }
            ri[1] = chosen;
        }
        workgroupBarrier();
        token = ri[1];
    }
    if lid == 0u {
        state[b] = token;
        state[B + b] += 1u;
    }
}
