// Matrix-matrix products of a prompt: Y[t] = W · X[t] for the p.tokens rows of X, W of N rows
// by K columns (weights.wgsl). A workgroup computes a 64 x 64 tile of Y (64 tokens by 64
// output rows), one 32-value block of K at a time: each invocation stages 8 values of X and
// 8 dequantized weights in workgroup memory, then multiplies a 4 x 4 patch.
//
// NORM: X is the residual stream and the product takes RMSNorm(X) · gain, with each token's
//   1/rms from the rms kernel (`inv`).
// EPI 0: store; 1: add into Y (the residual); 2: SwiGLU of row pairs (gate 2j, up 2j + 1)
//   into Y[t, j] (matvec.wgsl).

#include "params.wgsl"
#include "weights.wgsl"

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> gain: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;
@group(0) @binding(6) var<storage, read> inv: array<f32>;

const KB: u32 = K / 32u;
const TILE: u32 = 64u;

// [k][t] and [k][n] of the current block, 4 tokens / rows per vec4.
var<workgroup> xs: array<vec4<f32>, 512>;
var<workgroup> ws: array<vec4<f32>, 512>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * TILE;
    let t0 = wid.y * TILE;
    // Staging: token / row `sr` of the tile, values 8 * sq .. 8 * sq + 7 of the block.
    let sr = lid / 4u;
    let sq = lid % 4u;
    let t_in = t0 + sr < p.tokens;
    let t_row = min(t0 + sr, p.tokens - 1u);
    var scale = 1.0;
    if NORM {
        scale = inv[t_row];
    }
    let w_row = min(n0 + sr, N - 1u);
    // The patch: tokens 4 * ty .. +3, rows 4 * tx .. +3.
    let tx = lid % 16u;
    let ty = lid / 16u;
    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        acc[i] = vec4<f32>(0.0);
    }
    for (var b = 0u; b < KB; b++) {
        // X: 8 values of token sr.
        for (var h = 0u; h < 2u; h++) {
            var v = vec4<f32>(0.0);
            if t_in {
                v = x[t_row * (K / 4u) + b * 8u + sq * 2u + h];
                if NORM {
                    v *= gain[b * 8u + sq * 2u + h] * scale;
                }
            }
            let k = sq * 8u + h * 4u;
            for (var c = 0u; c < 4u; c++) {
                xs[(k + c) * 16u + sr / 4u][sr % 4u] = v[c];
            }
        }
        // W: the block of row sr, its values 8 * sq .. +7 from one quarter of its codes.
        let w = load_quarter(w_row * KB + b, sq);
        for (var h = 0u; h < 2u; h++) {
            let v = w[h];
            let k = sq * 8u + h * 4u;
            for (var c = 0u; c < 4u; c++) {
                ws[(k + c) * 16u + sr / 4u][sr % 4u] = v[c];
            }
        }
        workgroupBarrier();
        for (var k = 0u; k < 32u; k++) {
            let a = xs[k * 16u + ty];
            let bw = ws[k * 16u + tx];
            acc[0] += a.x * bw;
            acc[1] += a.y * bw;
            acc[2] += a.z * bw;
            acc[3] += a.w * bw;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let t = t0 + ty * 4u + i;
        if t >= p.tokens {
            break;
        }
        let n = n0 + tx * 4u;
        let v = acc[i];
        if EPI == 2u {
            if n + 3u < N {
                let o = t * (N / 2u) + n / 2u;
                y[o] = v.x / (1.0 + exp(-v.x)) * v.y;
                y[o + 1u] = v.z / (1.0 + exp(-v.z)) * v.w;
            }
        } else {
            for (var c = 0u; c < 4u; c++) {
                if n + c < N {
                    if EPI == 1u {
                        y[t * N + n + c] += v[c];
                    } else {
                        y[t * N + n + c] = v[c];
                    }
                }
            }
        }
    }
}
