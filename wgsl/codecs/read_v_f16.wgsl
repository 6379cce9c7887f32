// Values 4c..4c+3 of an f16 V row (VW = 4: the second vector is unused).
fn v_load(row: u32, c: u32) -> array<vec4<f32>, 2> {
    let w = v_store[row * (D / 4u) + c];
    return array<vec4<f32>, 2>(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)), vec4<f32>(0.0));
}

// f16 rows have no scale.
fn v_row_scale(row: u32) -> f32 {
    return 1.0;
}
