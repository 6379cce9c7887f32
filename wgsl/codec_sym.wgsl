// Symmetric int codecs `q8` / `q4` (layout contract: src/codec/mod.rs). Per block of 32 values
// one f16 scale d = f16(absmax / qmax); codes u = round_half_away(x / d) + 2^(b-1), packed
// LSB-first, 32/b codes per word, blocks never straddle words. Scales follow the codes, two
// per word. Linked per side like codec_f16.wgsl; @S@_BITS etc. come from the header.
// K rows are interleaved word by word in blocks of KB tokens (coalesced thread-per-token reads).

@group(0) @binding(@BINDING@) var<storage, @ACCESS@> @SIDE@_store: array<u32>;

fn @SIDE@_word(row: u32, w: u32) -> u32 {
    if @S@_INTERLEAVED {
        return (row - row % KB) * @S@_WORDS + w * KB + row % KB;
    }
    return row * @S@_WORDS + w;
}

// No level table (hook of the rotated codecs).
fn @SIDE@_load_levels(lid: u32) {}

// @ENCODER@ (attend-only modules stop here)

// q8/q4 rows are encoded by independent tasks (encode_@SIDE@), not cooperatively.
fn encode_rows_@SIDE@(lid: u32, nt: u32, nr: u32) {}


// round_half_away(x / d) clamped to ±qmax, exactly as in f64: the quotient's rounding error
// (GPU division may be approximate) is corrected with the remainder x - c d, which is exact
// in f32 here (c has at most 7 bits, d is an f16 value).
fn @SIDE@_quantize(x: vec2<f32>, d: f32, qmax: f32) -> vec2<f32> {
    if d <= 0.0 {
        return vec2<f32>(0.0);
    }
    let t = x / d;
    var c = sign(t) * floor(abs(t) + 0.5);
    let r = x - c * d;
    let half = vec2<f32>(0.5 * d);
    c += select(vec2<f32>(0.0), vec2<f32>(1.0), r > half) - select(vec2<f32>(0.0), vec2<f32>(1.0), r < -half);
    // Exact ties go away from zero.
    c += select(vec2<f32>(0.0), sign(x), (r == half & x > vec2<f32>(0.0)) | (r == -half & x < vec2<f32>(0.0)));
    return clamp(c, vec2<f32>(-qmax), vec2<f32>(qmax));
}
// Encode task `task` (of @S@_TASKS = ceil(D/64) per row): blocks 2 task and 2 task + 1, their
// code words and their shared scale word, so no two tasks write the same word.
fn encode_@SIDE@(row: u32, src: u32, task: u32) {
    let qmax = f32((1u << (@S@_BITS - 1u)) - 1u);
    let nb = min(2u, (D - 64u * task) / 32u);
    var amax = vec2<f32>(0.0);
    for (var i = 0u; i < 16u; i++) {
        let p0 = abs(in_pair_@SIDE@(src + 32u * task + i));
        amax.x = max(amax.x, max(p0.x, p0.y));
        if nb == 2u {
            let p1 = abs(in_pair_@SIDE@(src + 32u * task + 16u + i));
            amax.y = max(amax.y, max(p1.x, p1.y));
        }
    }
    let d = min(amax / qmax, vec2<f32>(65504.0));
    // Quantize against the stored (f16-rounded) scales, as the reference does.
    let ds = vec2<f32>(f16_round(d.x), f16_round(d.y));
    let packed = pack2x16float(ds);
    @SIDE@_store[@SIDE@_word(row, @S@_SIDE_WORD + task)] = packed;
    let per_word = 32u / @S@_BITS;
    for (var k = 0u; k < nb; k++) {
        let blk = 2u * task + k;
        let dk = select(ds.x, ds.y, k == 1u);
        for (var w = 0u; w < @S@_BITS; w++) {
            var word = 0u;
            for (var i = 0u; i < per_word; i += 2u) {
                let x = in_pair_@SIDE@(src + (32u * blk + w * per_word + i) / 2u);
                let c = @SIDE@_quantize(x, dk, qmax);
                let u = vec2<u32>(vec2<i32>(c) + vec2<i32>(1 << (@S@_BITS - 1u)));
                word |= (u.x << (i * @S@_BITS)) | (u.y << ((i + 1u) * @S@_BITS));
            }
            @SIDE@_store[@SIDE@_word(row, blk * @S@_BITS + w)] = word;
        }
    }
}
