// Split-K flash-decode over a layer's store: one new query per sequence.
//
// `split`: one workgroup per (split, kv head, sequence) reads its slice of the store once and
// serves all G query heads of the GQA group, writing a partial (max, sum, un-normalised
// output) per query head. `reduce`: one workgroup per (query head, sequence) merges the
// partials. Lengths are read on the GPU, so a step needs no host data.
//
// The store's readers come from the codec file linked in front of this one:
//   fn k_scores(row: u32)                    sets sc$g, the scores of row against q_sh
//   fn v_load(row: u32, c: u32) -> vec4<f32> values 4c..4c+3 of row

@group(0) @binding(0) var<uniform> seg: Seg;
@group(0) @binding(3) var<storage, read> lens: array<u32>;
// Partials: [B, QH, SPLITS_TOTAL, D] outputs, then [B, QH, SPLITS_TOTAL, 2] (max, sum).
@group(0) @binding(4) var<storage, read_write> part: array<f32>;
@group(1) @binding(0) var<storage, read> q_in: array<f32>;
@group(1) @binding(1) var<storage, read_write> out: array<f32>;

// V columns: each thread owns 4 consecutive values of a row; J token lanes share a tile.
const VC: u32 = D / 4u;
const J: u32 = WG / VC;
const PART_ML: u32 = B * QH * SPLITS_TOTAL * D;

var<workgroup> q_sh: array<vec4<f32>, G * D / 4u>;
var<workgroup> s_sh: array<vec4<f32>, G * WG / 4u>;
var<workgroup> p_sh: array<f32, G * WG>;
var<workgroup> comb: array<vec4<f32>, G * D / 4u>;
var<workgroup> lcomb: array<f32, G>;
var<workgroup> len_sh: u32;

// Per-query-head state lives in named registers: lines holding `$g` are repeated for each
// head g of the group by kvq's preprocessor (src/kernels.rs), so nothing is indexed
// dynamically (a dynamically indexed private array would spill to memory on most GPUs).
var<private> sc$g: f32;

fn write_partial(g: u32, pi: u32, c: u32, acc: vec4<f32>, m: f32, l: f32) {
    let o = (pi + g * SPLITS_TOTAL) * D + 4u * c;
    part[o] = acc.x;
    part[o + 1u] = acc.y;
    part[o + 2u] = acc.z;
    part[o + 3u] = acc.w;
    if c == 0u {
        part[PART_ML + 2u * (pi + g * SPLITS_TOTAL)] = m;
        part[PART_ML + 2u * (pi + g * SPLITS_TOTAL) + 1u] = l;
    }
}

// Dispatch (NSPLIT, KVH, B) per segment.
@compute @workgroup_size(WG)
fn split(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let s = wid.x;
    let h = wid.y;
    let b = wid.z;
    if lid == 0u {
        len_sh = lens[len_index(seg.layer, b)];
    }
    let len = workgroupUniformLoad(&len_sh);
    var valid = 0u;
    if len > seg.seg_start {
        valid = min(len - seg.seg_start, seg.seg_tokens);
    }
    let chunk = max((valid + NSPLIT - 1u) / NSPLIT, MIN_CHUNK);
    let start = min(s * chunk, valid);
    let end = min(start + chunk, valid);

    for (var i = lid; i < G * D / 4u; i += WG) {
        let o = ((b * QH + h * G) * D) + 4u * i;
        q_sh[i] = vec4<f32>(q_in[o], q_in[o + 1u], q_in[o + 2u], q_in[o + 3u]) * SCALE;
    }
    workgroupBarrier();

    let c = lid % VC;
    let j = lid / VC;
    var m$g = NEG;
    var l$g = 0.0;
    var acc$g = vec4<f32>(0.0);
    let row0 = seg_row(b, h, seg.seg_start, seg);

    for (var t0 = start; t0 < end; t0 += WG) {
        let tn = min(WG, end - t0);
        // Keys: one token per thread; k_scores sets sc$g.
        sc$g = 0.0;
        if lid < tn {
            k_scores(row0 + t0 + lid);
        }
        let s4 = lid / 4u;
        s_sh[$g * (WG / 4u) + s4][lid % 4u] = select(NEG, sc$g, lid < tn);
        workgroupBarrier();
        // Online softmax: every thread derives the same tile max, so m stays uniform.
        var mt$g = vec4<f32>(NEG);
        for (var i = 0u; i < WG / 4u; i++) {
            mt$g = max(mt$g, s_sh[$g * (WG / 4u) + i]);
        }
        let mn$g = max(m$g, max(max(mt$g.x, mt$g.y), max(mt$g.z, mt$g.w)));
        let alpha$g = exp(m$g - mn$g);
        m$g = mn$g;
        p_sh[$g * WG + lid] = select(0.0, exp(sc$g - mn$g), lid < tn);
        workgroupBarrier();
        // Values: thread (c, j) accumulates columns 4c..4c+3 over tokens j, j+J, ...
        if j < J {
            acc$g *= alpha$g;
            l$g *= alpha$g;
            // Four independent loads in flight per batch: a lone load per token would leave
            // the loop waiting on memory latency once per token.
            var i = j;
            for (; i + 3u * J < tn; i += 4u * J) {
                let r = row0 + t0 + i;
                let v0 = v_load(r, c);
                let v1 = v_load(r + J, c);
                let v2 = v_load(r + 2u * J, c);
                let v3 = v_load(r + 3u * J, c);
                let p$g = vec4<f32>(p_sh[$g * WG + i], p_sh[$g * WG + i + J], p_sh[$g * WG + i + 2u * J], p_sh[$g * WG + i + 3u * J]);
                acc$g += p$g.x * v0 + p$g.y * v1 + p$g.z * v2 + p$g.w * v3;
                l$g += p$g.x + p$g.y + p$g.z + p$g.w;
            }
            for (; i < tn; i += J) {
                let v = v_load(row0 + t0 + i, c);
                acc$g += p_sh[$g * WG + i] * v;
                l$g += p_sh[$g * WG + i];
            }
        }
    }

    // Merge the J token lanes into lane 0 (all lanes share m).
    for (var r = 1u; r < J; r++) {
        if j == r {
            comb[$g * VC + c] = acc$g;
            if c == 0u {
                lcomb[$g] = l$g;
            }
        }
        workgroupBarrier();
        if j == 0u {
            acc$g += comb[$g * VC + c];
            l$g += lcomb[$g];
        }
        workgroupBarrier();
    }
    if j == 0u {
        let pi = (b * QH + h * G) * SPLITS_TOTAL + seg.split_base + s;
        write_partial($gu, pi, c, acc$g, m$g, l$g);
    }
}

const RED_WG: u32 = 128u;
// Output columns (4 values each) and split lanes of the reduce workgroup.
const RC: u32 = D / 4u;
const RL: u32 = RED_WG / RC;
var<workgroup> w_sh: array<f32, SPLITS_TOTAL>;
var<workgroup> red: array<f32, RED_WG>;
var<workgroup> red4: array<vec4<f32>, RED_WG>;

// Dispatch (QH, B, 1): merges the partials of one query head into out[b, qh, :].
@compute @workgroup_size(128)
fn reduce(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let qh = wid.x;
    let b = wid.y;
    let base = (b * QH + qh) * SPLITS_TOTAL;
    var mx = NEG;
    for (var s = lid; s < SPLITS_TOTAL; s += RED_WG) {
        mx = max(mx, part[PART_ML + 2u * (base + s)]);
    }
    red[lid] = mx;
    workgroupBarrier();
    mx = NEG;
    for (var i = 0u; i < RED_WG; i++) {
        mx = max(mx, red[i]);
    }
    workgroupBarrier();
    var lsum = 0.0;
    for (var s = lid; s < SPLITS_TOTAL; s += RED_WG) {
        let w = exp(part[PART_ML + 2u * (base + s)] - mx);
        w_sh[s] = w;
        lsum += w * part[PART_ML + 2u * (base + s) + 1u];
    }
    red[lid] = lsum;
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < RED_WG; i++) {
        total += red[i];
    }
    // Thread (c, r) sums columns 4c..4c+3 over splits r, r+RL, ...
    let c = lid % RC;
    let r = lid / RC;
    var o = vec4<f32>(0.0);
    if r < RL {
        // Two partials per iteration keep independent loads in flight.
        var s = r;
        for (; s + RL < SPLITS_TOTAL; s += 2u * RL) {
            let p0 = (base + s) * D + 4u * c;
            let p1 = p0 + RL * D;
            let a = vec4<f32>(part[p0], part[p0 + 1u], part[p0 + 2u], part[p0 + 3u]);
            let e = vec4<f32>(part[p1], part[p1 + 1u], part[p1 + 2u], part[p1 + 3u]);
            o += w_sh[s] * a + w_sh[s + RL] * e;
        }
        if s < SPLITS_TOTAL {
            let p = (base + s) * D + 4u * c;
            o += w_sh[s] * vec4<f32>(part[p], part[p + 1u], part[p + 2u], part[p + 3u]);
        }
    }
    red4[lid] = o;
    workgroupBarrier();
    if r == 0u {
        for (var k = 1u; k < RL; k++) {
            o += red4[k * RC + c];
        }
        // An empty sequence has total 0: its output is defined as zeros.
        let inv = select(0.0, 1.0 / total, total > 0.0);
        let p = (b * QH + qh) * D + 4u * c;
        out[p] = o.x * inv;
        out[p + 1u] = o.y * inv;
        out[p + 2u] = o.z * inv;
        out[p + 3u] = o.w * inv;
    }
}
