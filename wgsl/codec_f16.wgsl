// Codec `none`: f16 rows, D halves two per u32. Linked once for K (@SIDE@ = k, @S@ = K) and once
// for V (@SIDE@ = v, @S@ = V); @ACCESS@ is `read` for attend and `read_write` for append/step.
// K rows are interleaved in 16-byte chunks (k_chunk); V rows are plain.

@group(0) @binding(@BINDING@) var<storage, @ACCESS@> @SIDE@_store: array<vec@LANES@<u32>>;

// Index of chunk w (@LANES@ words: 16 bytes for K, 8 for V) of row `row` of this side's store.
fn @SIDE@_vec_index(row: u32, w: u32) -> u32 {
    if @S@_INTERLEAVED {
        return k_chunk(row, w);
    }
    return row * (D / (2u * @LANES@)) + w;
}

// No level table (hook of the rotated codecs).
fn @SIDE@_load_levels(lid: u32) {}

// @ENCODER@ (attend-only modules stop here)

// f16 rows are encoded by independent tasks (encode_@SIDE@), not cooperatively.
fn encode_rows_@SIDE@(lid: u32, nt: u32, nr: u32, sides: u32) {}

// Writes word w of row `row`.
fn @SIDE@_put_word(row: u32, w: u32, word: u32) {
    @SIDE@_store[@SIDE@_vec_index(row, w / @LANES@)][w % @LANES@] = word;
}

// Encode task `task` (of @S@_TASKS = D/2 per row): one word, values 2 task and 2 task + 1.
// `src` is the pair index of the row's first value in the input. Values past f16's range
// saturate at ±65504 (pack2x16float of them is indeterminate, an Inf on some drivers, which
// would make the token's score or the output Inf/NaN).
fn encode_@SIDE@(row: u32, src: u32, task: u32) {
    let x = clamp(in_pair_@SIDE@(src + task), vec2<f32>(-65504.0), vec2<f32>(65504.0));
    @SIDE@_put_word(row, task, pack2x16float(x));
}
