// Readers for f16 rows (codec `none`): D halves, two per u32, read as 16-byte vectors.

@group(0) @binding(1) var<storage, read> k_store: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> v_store: array<vec2<u32>>;

fn k_scores(row: u32) -> array<f32, G> {
    var sc: array<f32, G>;
    let r = row * (D / 8u);
    // D is a multiple of 32: four 16-byte loads are issued together before their math.
    for (var w = 0u; w < D / 8u; w += 4u) {
        let k = array<vec4<u32>, 4>(k_store[r + w], k_store[r + w + 1u], k_store[r + w + 2u], k_store[r + w + 3u]);
        for (var u = 0u; u < 4u; u++) {
            let kk = unpack8(k[u]);
            for (var g = 0u; g < G; g++) {
                let qo = g * (D / 4u) + 2u * (w + u);
                sc[g] += dot(q_sh[qo], kk[0]) + dot(q_sh[qo + 1u], kk[1]);
            }
        }
    }
    return sc;
}

fn v_load(row: u32, c: u32) -> vec4<f32> {
    let w = v_store[row * (D / 4u) + c];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
