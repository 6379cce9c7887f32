// Symmetric int codecs `q8` / `q4` (layout contract: src/codec/mod.rs). Per block of 32 values
// one f16 scale d = f16(absmax / qmax); codes u = round_half_away(x / d) + 2^(b-1), packed
// LSB-first, 32/b codes per word, blocks never straddle words. Scales follow the codes, two
// per word. Included once per side by codecs/stores.wgsl; the side's constants (K_BITS...)
// come from the generated header.
// K rows are interleaved word by word in blocks of KB tokens (coalesced thread-per-token reads).

@group(0) @binding({{binding}}) var<storage, {{access}}> {{side}}_store: array<u32>;

fn {{side}}_word(row: u32, w: u32) -> u32 {
    if {{S}}_INTERLEAVED {
        return (row - row % KB) * {{S}}_WORDS + w * KB + row % KB;
    }
    return row * {{S}}_WORDS + w;
}

// No level table (hook of the rotated codecs).
fn {{side}}_load_levels(lid: u32) {}

// The encoder: only in modules that write rows (append, the fused step).
#if ENCODE

// q8/q4 rows are encoded by independent tasks (encode_{{side}}), not cooperatively.
fn encode_rows_{{side}}(lid: u32, nt: u32, nr: u32, sides: u32) {}

// Writes word w of row `row`.
fn {{side}}_put_word(row: u32, w: u32, word: u32) {
    {{side}}_store[{{side}}_word(row, w)] = word;
}


// round_half_away(x / d) clamped to ±qmax, exactly as in f64: the quotient's rounding error
// (GPU division may be approximate) is corrected with the remainder x - c d, which is exact
// in f32 here (c has at most 7 bits, d is an f16 value).
fn {{side}}_quantize(x: vec2<f32>, d: f32, qmax: f32) -> vec2<f32> {
    if d <= 0.0 {
        return vec2<f32>(0.0);
    }
    let t = x / d;
    var c = sign(t) * floor(abs(t) + 0.5);
    let r = x - c * d;
    let half = vec2<f32>(0.5 * d);
    c += select(vec2<f32>(0.0), vec2<f32>(1.0), r > half) - select(vec2<f32>(0.0), vec2<f32>(1.0), r < -half);
    // Exact ties go away from zero. (WGSL needs the parentheses around each comparison: Tint
    // rejects `a == b & c`, naga accepts it.)
    c += select(vec2<f32>(0.0), sign(x), ((r == half) & (x > vec2<f32>(0.0))) | ((r == -half) & (x < vec2<f32>(0.0))));
    return clamp(c, vec2<f32>(-qmax), vec2<f32>(qmax));
}
// The stored (f16-rounded) scale of block `blk` of the row whose first input pair is `src`:
// its largest magnitude over qmax, within f16's range.
fn {{side}}_block_scale(src: u32, blk: u32, qmax: f32) -> f32 {
    var amax = 0.0;
    for (var i = 0u; i < 16u; i++) {
        let p = abs(in_code_{{side}}(src + 16u * blk + i));
        amax = max(amax, max(p.x, p.y));
    }
    return f16_round(min(amax / qmax, 65504.0));
}

// Encode task `task` of a row (of {{S}}_TASKS = D * BITS / 32 code words, then ceil(D / 64)
// scale words): code word `task`, quantized against its block's stored scale, or scale word
// `task - D * BITS / 32` (blocks 2t and 2t + 1). Each task finds its block's scale itself, so
// that a new row's words are encoded in parallel (one task per block pair took a row's whole
// encode into two invocations, on the fused step's critical path).
fn encode_{{side}}(row: u32, src: u32, task: u32) {
    let qmax = f32((1u << ({{S}}_BITS - 1u)) - 1u);
    let code_words = D * {{S}}_BITS / 32u;
    if task >= code_words {
        let t = task - code_words;
        var d = vec2<f32>({{side}}_block_scale(src, 2u * t, qmax), 0.0);
        if 2u * t + 1u < D / 32u {
            d.y = {{side}}_block_scale(src, 2u * t + 1u, qmax);
        }
        {{side}}_put_word(row, {{S}}_SIDE_WORD + t, pack2x16float(d));
        return;
    }
    // Quantize against the stored (f16-rounded) scale, as the reference does. A block's
    // 32 values fill BITS words.
    let d = {{side}}_block_scale(src, task / {{S}}_BITS, qmax);
    let per_word = 32u / {{S}}_BITS;
    var word = 0u;
    for (var i = 0u; i < per_word; i += 2u) {
        let x = in_code_{{side}}(src + (task * per_word + i) / 2u);
        let c = {{side}}_quantize(x, d, qmax);
        let u = vec2<u32>(vec2<i32>(c) + vec2<i32>(1 << ({{S}}_BITS - 1u)));
        word |= (u.x << (i * {{S}}_BITS)) | (u.y << ((i + 1u) * {{S}}_BITS));
    }
    {{side}}_put_word(row, task, word);
}
#endif
