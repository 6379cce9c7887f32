#unroll $g GR
// Scores of a q4 K row against q_sh: per 32-value block, the scale word and the 4 code words
// are loaded together; each word holds 8 codes (two vec4 of the query).
// The 8 codes of a q4 word as signed integers, two vec4s (codes 0-3, 4-7).
fn q4_codes(w: u32) -> array<vec4<f32>, 2> {
    let lo = vec4<u32>(w, w >> 4u, w >> 8u, w >> 12u) & vec4<u32>(0xfu);
    let hi = vec4<u32>(w >> 16u, w >> 20u, w >> 24u, w >> 28u) & vec4<u32>(0xfu);
    return array<vec4<f32>, 2>(codes_less(lo, 8.0), codes_less(hi, 8.0));
}

fn k_scores(row: u32) {
    let base = (row - row % KB) * K_WORDS + row % KB;
    for (var j = 0u; j < D / 32u; j++) {
        let sw = unpack2x16float(k_store[base + (K_SIDE_WORD + j / 2u) * KB]);
        let w0 = k_store[base + (4u * j) * KB];
        let w1 = k_store[base + (4u * j + 1u) * KB];
        let w2 = k_store[base + (4u * j + 2u) * KB];
        let w3 = k_store[base + (4u * j + 3u) * KB];
        let d = select(sw.x, sw.y, j % 2u == 1u);
        let c0 = q4_codes(w0);
        let c1 = q4_codes(w1);
        let c2 = q4_codes(w2);
        let c3 = q4_codes(w3);
        let qb$g = $g * (D / 4u) + 8u * j;
        var part$g = fma4(fma4(0.0, q_sh[qb$g], c0[0]), q_sh[qb$g + 1u], c0[1]);
        part$g = fma4(fma4(part$g, q_sh[qb$g + 2u], c1[0]), q_sh[qb$g + 3u], c1[1]);
        part$g = fma4(fma4(part$g, q_sh[qb$g + 4u], c2[0]), q_sh[qb$g + 5u], c2[1]);
        part$g = fma4(fma4(part$g, q_sh[qb$g + 6u], c3[0]), q_sh[qb$g + 7u], c3[1]);
        sc$g += d * part$g;
    }
}

// No level-pair table (the rotated K reader's).
fn k_load_pairs(lid: u32) {}

// Coordinates 4c .. 4c + 3 of a q4 K row, scaled (the prefill kernel's K tile): half of the
// row's code word c / 2.
fn k_dec4(row: u32, c: u32) -> vec4<f32> {
    let base = (row - row % KB) * K_WORDS + row % KB;
    let j = c / 8u;
    let sw = unpack2x16float(k_store[base + (K_SIDE_WORD + j / 2u) * KB]);
    let d = select(sw.x, sw.y, j % 2u == 1u);
    let q = q4_codes(k_store[base + (c / 2u) * KB]);
    return select(q[0], q[1], c % 2u == 1u) * d;
}
