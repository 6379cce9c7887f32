#unroll $g GR
#unroll $u KU
// Scores of an f16 K row against q_sh: KU 16-byte chunks are loaded before any math so they
// are all in flight at once (D is a multiple of 32).
fn k_scores(row: u32) {
    let r = k_chunk(row, 0u);
    for (var w = 0u; w < D / 8u; w += KU) {
        let kr$u = k_store[r + (w + $u) * KB];
        let ka$u = vec4<f32>(unpack2x16float(kr$u.x), unpack2x16float(kr$u.y));
        let kb$u = vec4<f32>(unpack2x16float(kr$u.z), unpack2x16float(kr$u.w));
        let qo$g = $g * (D / 4u) + 2u * w;
        sc$g = fma4(fma4(sc$g, q_sh[qo$g + 2u * $u], ka$u), q_sh[qo$g + 2u * $u + 1u], kb$u);
    }
}

// No level-pair table (the rotated K reader's).
fn k_load_pairs(lid: u32) {}

// Coordinates 4c .. 4c + 3 of an f16 K row (the prefill kernel's K tile).
fn k_dec4(row: u32, c: u32) -> vec4<f32> {
    let w = k_store[k_chunk(row, c / 2u)];
    if c % 2u == 0u {
        return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
    }
    return vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w));
}
