// Codec `none`: f16 rows, D halves two per u32. Included once per side by codecs/stores.wgsl
// (parameters there). K rows are interleaved in 16-byte chunks (k_chunk); V rows are plain.

@group(0) @binding({{binding}}) var<storage, {{access}}> {{side}}_store: array<vec{{lanes}}<u32>>;

// Index of chunk w (4 words for K, 2 for V) of row `row` of this side's store.
fn {{side}}_vec_index(row: u32, w: u32) -> u32 {
    if {{S}}_INTERLEAVED {
        return k_chunk(row, w);
    }
    return row * (D / (2u * {{lanes}})) + w;
}

// No level table (hook of the rotated codecs).
fn {{side}}_load_levels(lid: u32) {}

// The encoder: only in modules that write rows (append, the fused step).
#if ENCODE

// f16 rows are encoded by independent tasks (encode_{{side}}), not cooperatively.
fn encode_rows_{{side}}(lid: u32, nt: u32, nr: u32, sides: u32) {}

// Writes word w of row `row`.
fn {{side}}_put_word(row: u32, w: u32, word: u32) {
    {{side}}_store[{{side}}_vec_index(row, w / {{lanes}})][w % {{lanes}}] = word;
}

// Encode task `task` (of D/2 per row): one word, values 2 task and 2 task + 1.
// `src` is the pair index of the row's first value in the input. Values past f16's range
// saturate at ±65504 (pack2x16float of them is indeterminate, an Inf on some drivers, which
// would make the token's score or the output Inf/NaN).
fn encode_{{side}}(row: u32, src: u32, task: u32) {
    let x = clamp(in_code_{{side}}(src + task), vec2<f32>(-65504.0), vec2<f32>(65504.0));
    {{side}}_put_word(row, task, pack2x16float(x));
}
#endif
