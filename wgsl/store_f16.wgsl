// Readers for f16 rows (codec `none`): D halves, two per u32, read as 16-byte vectors.

@group(0) @binding(1) var<storage, read> k_store: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> v_store: array<vec2<u32>>;

fn k_scores(row: u32) {
    let r = k_chunk(row, 0u);
    // KU chunks are loaded before any math so they are all in flight at once.
    for (var w = 0u; w < D / 8u; w += KU) {
        let kr$u = k_store[r + (w + $u) * KB];
        let ka$u = vec4<f32>(unpack2x16float(kr$u.x), unpack2x16float(kr$u.y));
        let kb$u = vec4<f32>(unpack2x16float(kr$u.z), unpack2x16float(kr$u.w));
        let qo$g = $g * (D / 4u) + 2u * w;
        sc$g += dot(q_sh[qo$g + 2u * $u], ka$u) + dot(q_sh[qo$g + 2u * $u + 1u], kb$u);
    }
}

fn v_load(row: u32, c: u32) -> vec4<f32> {
    let w = v_store[row * (D / 4u) + c];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
