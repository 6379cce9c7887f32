// Values 4c..4c+3 of a q8/q4 V row: the block's scale and the one code word holding them
// (VW = 4: the second vector is unused).
fn v_load_sym(row: u32, c: u32) -> vec4<f32> {
    let j = c / 8u;
    let sw = unpack2x16float(v_store[v_word(row, V_SIDE_WORD + j / 2u)]);
    let d = select(sw.x, sw.y, j % 2u == 1u);
    // The 4 codes: q8's 4 bytes of a word, or q4's 4 nibbles of half a word spread into bytes
    // (even nibbles in e, odd in o), so that a GPU that converts a byte of a word in one
    // instruction does (a mask, a conversion, a subtraction and a product a nibble before
    // measured slower; codes_less's logic instead made the q8 loops slower: BENCHMARKS.md,
    // "Kernel choices, measured").
    var q: vec4<u32>;
    if V_BITS == 8u {
        q = unpack4xU8(v_store[v_word(row, c)]);
    } else {
        let n = v_store[v_word(row, c / 2u)] >> (16u * (c % 2u));
        let e = unpack4xU8(n & 0x0f0fu);
        let o = unpack4xU8((n >> 4u) & 0x0f0fu);
        q = vec4<u32>(e.x, o.x, e.y, o.y);
    }
    // d (q - z), z = 2^(bits - 1), as one fma, exactly: q d and z d are exact in the fma's
    // product and sum, so it rounds once, as the product does.
    let z = f32(1u << (V_BITS - 1u));
    return fma(vec4<f32>(q), vec4<f32>(d), vec4<f32>(-z * d));
}

fn v_load(row: u32, c: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(v_load_sym(row, c), vec4<f32>(0.0));
}

// q8/q4 scales are per block, applied in v_load.
fn v_row_scale(row: u32) -> f32 {
    return 1.0;
}
