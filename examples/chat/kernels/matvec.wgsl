// Matrix-vector products of the decode step: y[m] = W · x[m] for the M sequences of a batch,
// W of N rows by K columns (weights.wgsl), every weight read once for all M.
//
// A workgroup of WG invocations serves ROWS = (WG / TPR) * R consecutive rows: TPR lanes share
// each group of R rows, lane l taking blocks l, l + TPR, … of them, and the lanes' partial sums
// are added in workgroup memory. Rows past N read row N - 1 and store nothing.
//
// NORM: x is the residual stream and the product takes RMSNorm(x) · gain instead, the norm
//   computed here (every workgroup reads x whole; it is in L2).
// EPI 0: y[m, r] = acc. EPI 1: y[m, r] += acc (the residual add). EPI 2: rows come in pairs
//   (gate row 2j, up row 2j + 1) and y[m, j] = silu(gate) * up (SwiGLU).
// x row m is row m * p.per_seq + p.per_seq - 1 of its buffer (the last token of each
// sequence of a prompt; row m in a decode step, per_seq = 1).

#include "params.wgsl"
#include "weights.wgsl"

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> gain: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

const KB: u32 = K / 32u;
const GROUPS: u32 = WG / TPR;
const ROWS: u32 = GROUPS * R;
const ACC: u32 = M * R;

var<workgroup> red: array<f32, WG * ACC>;
var<workgroup> inv_rms: array<f32, M>;

fn x_row(m: u32) -> u32 {
    return (m * p.per_seq + p.per_seq - 1u) * (K / 4u);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    // RMSNorm's 1/rms of each sequence's x.
    if NORM {
        for (var m = 0u; m < M; m++) {
            var s = 0.0;
            for (var i = lid; i < K / 4u; i += WG) {
                let v = x[x_row(m) + i];
                s += dot(v, v);
            }
            red[m * WG + lid] = s;
        }
        workgroupBarrier();
        for (var h = WG / 2u; h > 0u; h >>= 1u) {
            if lid < h {
                for (var m = 0u; m < M; m++) {
                    red[m * WG + lid] += red[m * WG + lid + h];
                }
            }
            workgroupBarrier();
        }
        if lid < M {
            inv_rms[lid] = inverseSqrt(red[lid * WG] / f32(K) + EPS);
        }
        workgroupBarrier();
    }
    let lane = lid % TPR;
    let row0 = wid.x * ROWS + (lid / TPR) * R;
    var acc: array<f32, ACC>;
    for (var i = 0u; i < ACC; i++) {
        acc[i] = 0.0;
    }
    for (var b = lane; b < KB; b += TPR) {
        for (var m = 0u; m < M; m++) {
            var xv: array<vec4<f32>, 8>;
            var xs = vec4<f32>(0.0);
            let base = x_row(m) + b * 8u;
            for (var j = 0u; j < 8u; j++) {
                var v = x[base + j];
                if NORM {
                    v *= gain[b * 8u + j] * inv_rms[m];
                }
                xv[j] = v;
                xs += v;
            }
            let xsum = xs.x + xs.y + xs.z + xs.w;
            for (var r = 0u; r < R; r++) {
                let row = min(row0 + r, N - 1u);
                acc[m * R + r] += block_dot(row * KB + b, &xv, xsum);
            }
        }
    }
    // The lanes' partial sums, added in workgroup memory.
    workgroupBarrier();
    for (var i = 0u; i < ACC; i++) {
        red[i * WG + lid] = acc[i];
    }
    workgroupBarrier();
    for (var h = TPR / 2u; h > 0u; h >>= 1u) {
        if lane < h {
            for (var i = 0u; i < ACC; i++) {
                red[i * WG + lid] += red[i * WG + lid + h];
            }
        }
        workgroupBarrier();
    }
    if lane != 0u {
        return;
    }
    for (var m = 0u; m < M; m++) {
        for (var r = 0u; r < R; r++) {
            let row = row0 + r;
            let v = red[(m * R + r) * WG + lid];
            if EPI == 2u {
                // Odd rows (up) are combined by the thread holding their gate row.
                if r % 2u == 0u && row + 1u < N {
                    let u = red[(m * R + r + 1u) * WG + lid];
                    y[m * (N / 2u) + row / 2u] = v / (1.0 + exp(-v)) * u;
                }
            } else if row < N {
                if EPI == 1u {
                    y[m * N + row] += v;
                } else {
                    y[m * N + row] = v;
                }
            }
        }
    }
}
