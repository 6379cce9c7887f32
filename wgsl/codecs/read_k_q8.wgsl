#unroll $g GR
#unroll $v K_BITS
// Scores of a q8 K row against q_sh: per 32-value block, the scale word and the 8 code words
// are loaded together, then the integer codes are dotted with the query and scaled once.
fn k_scores(row: u32) {
    let base = (row - row % KB) * K_WORDS + row % KB;
    for (var j = 0u; j < D / 32u; j++) {
        let sw = unpack2x16float(k_store[base + (K_SIDE_WORD + j / 2u) * KB]);
        let w$v = k_store[base + (8u * j + $v) * KB];
        let d = select(sw.x, sw.y, j % 2u == 1u);
        let c$v = vec4<f32>(unpack4xU8(w$v)) - 128.0;
        var part$g = 0.0;
        part$g = fma4(part$g, q_sh[$g * (D / 4u) + 8u * j + $v], c$v);
        sc$g += d * part$g;
    }
}

// No level-pair table (the rotated K reader's).
fn k_load_pairs(lid: u32) {}

// Coordinates 4c .. 4c + 3 of a q8 K row, scaled (the prefill kernel's K tile): code word c
// of the row, in block c / 8.
fn k_dec4(row: u32, c: u32) -> vec4<f32> {
    let base = (row - row % KB) * K_WORDS + row % KB;
    let j = c / 8u;
    let sw = unpack2x16float(k_store[base + (K_SIDE_WORD + j / 2u) * KB]);
    let d = select(sw.x, sw.y, j % 2u == 1u);
    return (vec4<f32>(unpack4xU8(k_store[base + c * KB])) - 128.0) * d;
}
