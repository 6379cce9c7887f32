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
    // q4: the 4 nibbles of half a word, spread into bytes (even nibbles in e, odd in o) and
    // converted as q8's bytes are, one I2F.U8 each, then d (c - 8) as one exact fma: a mask, a
    // conversion, a subtraction and a product a value before (q4_sym 32k -7 % on the H200).
    let n = v_store[v_word(row, c / 2u)] >> (16u * (c % 2u));
    let e = unpack4xU8(n & 0x0f0fu);
    let o = unpack4xU8((n >> 4u) & 0x0f0fu);
    return fma(vec4<f32>(vec4<u32>(e.x, o.x, e.y, o.y)), vec4<f32>(d), vec4<f32>(-8.0 * d));
}

fn v_load(row: u32, c: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(v_load_sym(row, c), vec4<f32>(0.0));
}

// q8/q4 scales are per block, applied in v_load.
fn v_row_scale(row: u32) -> f32 {
    return 1.0;
}
