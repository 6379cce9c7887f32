// 1 / rms of each of the p.tokens rows of the residual stream (a prompt's RMSNorm, applied by
// the matmul that reads them), one workgroup per row.

#include "params.wgsl"

@group(0) @binding(0) var<storage, read> h: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> inv: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x + wid.y * 65535u;
    // Every invocation of the workgroup takes the same branch (t is the workgroup's).
    let row = min(t, p.tokens - 1u);
    var s = 0.0;
    for (var i = lid; i < K / 4u; i += 64u) {
        let v = h[row * (K / 4u) + i];
        s += dot(v, v);
    }
    red[lid] = s;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
        if lid < k {
            red[lid] += red[lid + k];
        }
        workgroupBarrier();
    }
    if lid == 0u && t < p.tokens {
        inv[t] = inverseSqrt(red[0] / f32(K) + EPS);
    }
}
