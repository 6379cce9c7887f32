// Values 4c..4c+3 of a q8/q4 V row: the block's scale and the one code word holding them
// (VW = 4: the second vector is unused).
fn v_load_sym(row: u32, c: u32) -> vec4<f32> {
    let j = c / 8u;
    let sw = unpack2x16float(v_store[v_word(row, V_SIDE_WORD + j / 2u)]);
    let d = select(sw.x, sw.y, j % 2u == 1u);
    if V_BITS == 8u {
        return d * (vec4<f32>(unpack4xU8(v_store[v_word(row, c)])) - 128.0);
    }
    // q4: the 4 nibbles of half a word.
    let n = v_store[v_word(row, c / 2u)] >> (16u * (c % 2u));
    return d * (vec4<f32>(vec4<u32>(n, n >> 4u, n >> 8u, n >> 12u) & vec4<u32>(0xfu)) - 8.0);
}

fn v_load(row: u32, c: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(v_load_sym(row, c), vec4<f32>(0.0));
}

// q8/q4 scales are per block, applied in v_load.
fn v_row_scale(row: u32) -> f32 {
    return 1.0;
}
