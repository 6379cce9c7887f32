// Values 4c..4c+3 of a rotated-codec V row, in the codec's rotated domain (the reduce
// un-rotates the output once): 4 codes cut from one word (or two, when they straddle),
// looked up in the level table and scaled.
fn v_load(row: u32, c: u32) -> vec4<f32> {
    let r = row * V_WORDS;
    let bit = 4u * V_BITS * c;
    var f = v_store[r + bit / 32u] >> (bit % 32u);
    if bit % 32u + 4u * V_BITS > 32u {
        f |= v_store[r + bit / 32u + 1u] << (32u - bit % 32u);
    }
    let codes = (vec4<u32>(f) >> vec4<u32>(0u, V_BITS, 2u * V_BITS, 3u * V_BITS)) & vec4<u32>((1u << V_BITS) - 1u);
    let lv = vec4<f32>(lv_v[codes.x], lv_v[codes.y], lv_v[codes.z], lv_v[codes.w]);
    let sbit = V_SIDE_BIT + select(0u, 16u * (c / 8u), V_BLOCK32);
    return unpack2x16float(v_store[r + sbit / 32u])[(sbit / 16u) % 2u] * lv;
}
