// Values 4c..4c+3 of a q8/q4 V row: the block's scale and the one code word holding them
// (VW = 4: the second vector is unused).
fn v_load_sym(row: u32, c: u32) -> vec4<f32> {
    let j = c / 8u;
    let sw = unpack2x16float(v_store[v_word(row, V_SIDE_WORD + j / 2u)]);
    let d = select(sw.x, sw.y, j % 2u == 1u);
    if V_BITS == 8u {
        // d (c - 128) as one fma, exactly: c d and 128 d are exact in the fma's product and
        // sum, so it rounds once, as the product does. (A byte's f32() is one I2F.U8 on
        // NVIDIA; the integer-logic conversion of codes_less took two instructions, not one,
        // and made the q8 loops slower: BENCHMARKS.md, session 13.)
        return fma(vec4<f32>(unpack4xU8(v_store[v_word(row, c)])), vec4<f32>(d), vec4<f32>(-128.0 * d));
    }
    // q4: the 4 nibbles of half a word.
    let n = v_store[v_word(row, c / 2u)] >> (16u * (c % 2u));
    return d * codes_less(vec4<u32>(n, n >> 4u, n >> 8u, n >> 12u) & vec4<u32>(0xfu), 8.0);
}

fn v_load(row: u32, c: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(v_load_sym(row, c), vec4<f32>(0.0));
}

// q8/q4 scales are per block, applied in v_load.
fn v_row_scale(row: u32) -> f32 {
    return 1.0;
}
