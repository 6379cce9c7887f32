// Random weights for a model shape without a file (`--shape`): every code word hashed from
// its index and SEED, and each block's scale such that a row's products keep a unit-rms input
// near unit rms (speed does not depend on the values; finite values keep the forward honest).

@group(0) @binding(0) var<storage, read_write> codes: array<u32>;
@group(0) @binding(1) var<storage, read_write> scales: array<u32>;

fn hash(x: u32) -> u32 {
    var h = x * 747796405u + 2891336453u;
    h = ((h >> ((h >> 28u) + 4u)) ^ h) * 277803737u;
    return (h >> 22u) ^ h;
}

fn unit(x: u32) -> f32 {
    return f32(hash(x) >> 8u) / 16777216.0;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let stride = nwg.x * 256u;
    let n = arrayLength(&codes);
    let sd = inverseSqrt(f32(K));
    for (var i = gid.x; i < n; i += stride) {
        if FORMAT == 2u {
            // f16 values uniform in ±sqrt(3) sd.
            let a = (unit(i ^ SEED) - 0.5) * 3.4641 * sd;
            let b = (unit(i ^ SEED ^ 0x55555555u) - 0.5) * 3.4641 * sd;
            codes[i] = pack2x16float(vec2<f32>(a, b));
        } else {
            codes[i] = hash(i ^ SEED);
        }
    }
    let blocks = arrayLength(&scales);
    for (var i = gid.x; i < blocks && FORMAT != 2u; i += stride) {
        let jitter = 0.75 + 0.5 * unit(i ^ SEED ^ 0xa5a5a5a5u);
        if FORMAT == 0u {
            // 4-bit codes 0..15 centred by the minimum: values uniform in ±7.5 d.
            let d = sd / 4.6 * jitter;
            scales[i] = pack2x16float(vec2<f32>(d, -7.5 * d));
        } else {
            // Signed bytes, uniform in ±128 d.
            let d = sd / 74.0 * jitter;
            scales[i] = pack2x16float(vec2<f32>(d, 0.0));
        }
    }
}
