// Values 8c..8c+7 of a rotated-codec V row (VW = 8), in the codec's rotated domain (the
// reduce un-rotates the output once): 8 codes cut from one word (two for 3-bit codes, whose
// 24 bits may straddle), looked up in the level table. One scale per row is applied by the
// caller to the softmax weight (v_row_scale); per-block scales are applied here.
fn v_load(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let r = row * V_WORDS;
    let bit = 8u * V_BITS * c;
    let sh = bit % 32u;
    var f = v_store[r + bit / 32u] >> sh;
    if V_BITS == 3u {
        // Always loaded (no divergent branch); unused unless the field straddles. The last
        // column's next word can lie past the row (and, for the buffer's last row, past the
        // buffer): it reads the row's last word instead.
        let hi = v_store[r + min(bit / 32u + 1u, V_WORDS - 1u)];
        // (The shift is masked: at sh = 0 a shift by 32 would be undefined in SPIR-V and MSL,
        // which naga does not mask, even though select drops the value.)
        f |= select(0u, hi << ((32u - sh) & 31u), sh > 8u);
    }
    let mask = vec4<u32>((1u << V_BITS) - 1u);
    let lo = (vec4<u32>(f) >> vec4<u32>(0u, V_BITS, 2u * V_BITS, 3u * V_BITS)) & mask;
    let hi = (vec4<u32>(f) >> vec4<u32>(4u * V_BITS, 5u * V_BITS, 6u * V_BITS, 7u * V_BITS)) & mask;
    var a = vec4<f32>(lv_v[lo.x], lv_v[lo.y], lv_v[lo.z], lv_v[lo.w]);
    var b = vec4<f32>(lv_v[hi.x], lv_v[hi.y], lv_v[hi.z], lv_v[hi.w]);
    if V_BLOCK32 {
        let s = v_half(r, V_SIDE_BIT + 16u * (c / 4u));
        a *= s;
        b *= s;
    }
    return array<vec4<f32>, 2>(a, b);
}

// The f16 at bit `bit` (16-bit aligned) of the row whose first word is `r`.
fn v_half(r: u32, bit: u32) -> f32 {
    return unpack2x16float(v_store[r + bit / 32u])[(bit / 16u) % 2u];
}

// The row's scale (one per row).
fn v_row_scale(row: u32) -> f32 {
    return v_half(row * V_WORDS, V_SIDE_BIT);
}
