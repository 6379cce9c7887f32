// The embedding lookup: row t of the residual stream h = row ids[p.ids_base + t] of the
// embedding matrix (weights.wgsl; N = vocabulary, K = model width), one workgroup per token.

#include "params.wgsl"
#include "weights.wgsl"

@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read_write> h: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.x;
    let id = min(ids[p.ids_base + t], N - 1u);
    for (var b = lid; b < K / 32u; b += 64u) {
        let w = load_block(id * (K / 32u) + b);
        for (var j = 0u; j < 8u; j++) {
            h[t * (K / 4u) + b * 8u + j] = w[j];
        }
    }
}
