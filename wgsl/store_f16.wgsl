// Readers for f16 rows (codec `none`): D halves, two per u32, read as 16-byte vectors.

@group(0) @binding(1) var<storage, read> k_store: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> v_store: array<vec2<u32>>;

fn k_scores(row: u32) {
    let r = k_chunk(row, 0u);
    // D is a multiple of 32: four 16-byte loads are issued together before their math.
    for (var w = 0u; w < D / 8u; w += 4u) {
        let k0 = unpack8(k_store[r + w * KB]);
        let k1 = unpack8(k_store[r + (w + 1u) * KB]);
        let k2 = unpack8(k_store[r + (w + 2u) * KB]);
        let k3 = unpack8(k_store[r + (w + 3u) * KB]);
        let qo$g = $g * (D / 4u) + 2u * w;
        sc$g += dot(q_sh[qo$g], k0[0]) + dot(q_sh[qo$g + 1u], k0[1]) + dot(q_sh[qo$g + 2u], k1[0]) + dot(q_sh[qo$g + 3u], k1[1]) + dot(q_sh[qo$g + 4u], k2[0]) + dot(q_sh[qo$g + 5u], k2[1]) + dot(q_sh[qo$g + 6u], k3[0]) + dot(q_sh[qo$g + 7u], k3[1]);
    }
}

fn v_load(row: u32, c: u32) -> vec4<f32> {
    let w = v_store[row * (D / 4u) + c];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
