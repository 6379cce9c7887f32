// Split-K flash-decode over a layer's store: one new query per sequence.
//
// `split`: one workgroup per (split, kv head, sequence) reads its slice of the store once and
// serves all G query heads of the GQA group, writing a partial (max, sum, un-normalised
// output) per query head. `reduce`: one workgroup per (query head, sequence) merges the
// partials. Lengths are read on the GPU, so a step needs no host data.
//
// The store's readers come from the codec file linked in front of this one:
//   fn k_scores(row: u32) -> array<f32, G>   scores of row against q_sh (already scaled)
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
    var m: array<f32, G>;
    var l: array<f32, G>;
    var acc: array<vec4<f32>, G>;
    for (var g = 0u; g < G; g++) {
        m[g] = NEG;
    }
    let row0 = seg_row(b, h, seg.seg_start, seg);

    for (var t0 = start; t0 < end; t0 += WG) {
        let tn = min(WG, end - t0);
        // Keys: one token per thread.
        var sc: array<f32, G>;
        if lid < tn {
            sc = k_scores(row0 + t0 + lid);
        }
        let s4 = lid / 4u;
        for (var g = 0u; g < G; g++) {
            s_sh[g * (WG / 4u) + s4][lid % 4u] = select(NEG, sc[g], lid < tn);
        }
        workgroupBarrier();
        // Online softmax: every thread derives the same tile max, so m stays uniform.
        var alpha: array<f32, G>;
        for (var g = 0u; g < G; g++) {
            var mt = vec4<f32>(NEG);
            for (var i = 0u; i < WG / 4u; i++) {
                mt = max(mt, s_sh[g * (WG / 4u) + i]);
            }
            let m_new = max(m[g], max(max(mt.x, mt.y), max(mt.z, mt.w)));
            alpha[g] = exp(m[g] - m_new);
            m[g] = m_new;
            p_sh[g * WG + lid] = select(0.0, exp(sc[g] - m_new), lid < tn);
        }
        workgroupBarrier();
        // Values: thread (c, j) accumulates columns 4c..4c+3 over tokens j, j+J, ...
        if j < J {
            for (var g = 0u; g < G; g++) {
                acc[g] *= alpha[g];
                l[g] *= alpha[g];
            }
            // Four independent loads in flight per batch: a lone load per token would leave
            // the loop waiting on memory latency once per token.
            var i = j;
            for (; i + 3u * J < tn; i += 4u * J) {
                let r = row0 + t0 + i;
                let v0 = v_load(r, c);
                let v1 = v_load(r + J, c);
                let v2 = v_load(r + 2u * J, c);
                let v3 = v_load(r + 3u * J, c);
                for (var g = 0u; g < G; g++) {
                    let p = vec4<f32>(p_sh[g * WG + i], p_sh[g * WG + i + J], p_sh[g * WG + i + 2u * J], p_sh[g * WG + i + 3u * J]);
                    acc[g] += p.x * v0 + p.y * v1 + p.z * v2 + p.w * v3;
                    l[g] += p.x + p.y + p.z + p.w;
                }
            }
            for (; i < tn; i += J) {
                let v = v_load(row0 + t0 + i, c);
                for (var g = 0u; g < G; g++) {
                    let p = p_sh[g * WG + i];
                    acc[g] += p * v;
                    l[g] += p;
                }
            }
        }
    }

    // Merge the J token lanes into lane 0 (all lanes share m).
    for (var r = 1u; r < J; r++) {
        if j == r {
            for (var g = 0u; g < G; g++) {
                comb[g * VC + c] = acc[g];
                if c == 0u {
                    lcomb[g] = l[g];
                }
            }
        }
        workgroupBarrier();
        if j == 0u {
            for (var g = 0u; g < G; g++) {
                acc[g] += comb[g * VC + c];
                l[g] += lcomb[g];
            }
        }
        workgroupBarrier();
    }
    if j == 0u {
        for (var g = 0u; g < G; g++) {
            let pi = (b * QH + h * G + g) * SPLITS_TOTAL + seg.split_base + s;
            let o = pi * D + 4u * c;
            part[o] = acc[g].x;
            part[o + 1u] = acc[g].y;
            part[o + 2u] = acc[g].z;
            part[o + 3u] = acc[g].w;
            if c == 0u {
                part[PART_ML + 2u * pi] = m[g];
                part[PART_ML + 2u * pi + 1u] = l[g];
            }
        }
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
        for (var s = r; s < SPLITS_TOTAL; s += RL) {
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
