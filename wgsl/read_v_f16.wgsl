// Values 4c..4c+3 of an f16 V row.
fn v_load(row: u32, c: u32) -> vec4<f32> {
    let w = v_store[row * (D / 4u) + c];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
