// Reading a weight matrix of N rows by K columns, stored in blocks of 32 values of one row:
// block b of row r is `codes` words [(r * KB + b) * WORDS, +WORDS) and `scales` word r * KB + b.
//   FORMAT 0 (4-bit, from Q4_1 or Q4_0): 4 code words, scale word = f16 d | f16 m << 16;
//     value i = d * q_i + m, q_i the low nibble of byte i (i < 16) or the high nibble of
//     byte i - 16 (GGUF's order).
//   FORMAT 1 (8-bit, from Q8_0): 8 code words, one signed byte per value; scale word = f16 d;
//     value i = d * q_i.
//   FORMAT 2 (f16): 16 code words, two values each (value 2j in the low half); no scales.
// The including module declares `codes: array<vec4<u32>>` and `scales: array<u32>`.

const WORDS: u32 = select(select(16u, 8u, FORMAT == 1u), 4u, FORMAT == 0u);
const VEC_WORDS: u32 = WORDS / 4u;

fn lo_nibbles(c: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(c, c >> 8u, c >> 16u, c >> 24u) & vec4<u32>(15u));
}

fn hi_nibbles(c: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(c >> 4u, c >> 12u, c >> 20u, c >> 28u) & vec4<u32>(15u));
}

fn bytes_i8(c: u32) -> vec4<f32> {
    let s = bitcast<i32>(c);
    return vec4<f32>(f32((s << 24u) >> 24u), f32((s << 16u) >> 24u), f32((s << 8u) >> 24u), f32(s >> 24u));
}

fn halves(a: u32, b: u32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(a), unpack2x16float(b));
}

// The 32 values of block `blk` (global block index) as 8 vec4s, values 4j .. 4j+3 in out[j].
fn load_block(blk: u32) -> array<vec4<f32>, 8> {
    var w: array<vec4<f32>, 8>;
    let base = blk * VEC_WORDS;
    if FORMAT == 0u {
        let c = codes[base];
        let dm = unpack2x16float(scales[blk]);
        for (var j = 0u; j < 4u; j++) {
            w[j] = lo_nibbles(c[j]) * dm.x + dm.y;
            w[4u + j] = hi_nibbles(c[j]) * dm.x + dm.y;
        }
    } else if FORMAT == 1u {
        let d = unpack2x16float(scales[blk]).x;
        let c0 = codes[base];
        let c1 = codes[base + 1u];
        for (var j = 0u; j < 4u; j++) {
            w[j] = bytes_i8(c0[j]) * d;
            w[4u + j] = bytes_i8(c1[j]) * d;
        }
    } else {
        for (var j = 0u; j < 4u; j++) {
            let c = codes[base + j];
            w[2u * j] = halves(c.x, c.y);
            w[2u * j + 1u] = halves(c.z, c.w);
        }
    }
    return w;
}

// Values 8q .. 8q + 7 of block `blk` (q < 4), as two vec4s.
fn load_quarter(blk: u32, q: u32) -> array<vec4<f32>, 2> {
    var w: array<vec4<f32>, 2>;
    let base = blk * VEC_WORDS;
    if FORMAT == 0u {
        let c = codes[base];
        let dm = unpack2x16float(scales[blk]);
        let j = (q % 2u) * 2u;
        if q < 2u {
            w[0] = lo_nibbles(c[j]) * dm.x + dm.y;
            w[1] = lo_nibbles(c[j + 1u]) * dm.x + dm.y;
        } else {
            w[0] = hi_nibbles(c[j]) * dm.x + dm.y;
            w[1] = hi_nibbles(c[j + 1u]) * dm.x + dm.y;
        }
    } else if FORMAT == 1u {
        let d = unpack2x16float(scales[blk]).x;
        let c = codes[base + q / 2u];
        let j = (q % 2u) * 2u;
        w[0] = bytes_i8(c[j]) * d;
        w[1] = bytes_i8(c[j + 1u]) * d;
    } else {
        let c = codes[base + q];
        w[0] = halves(c.x, c.y);
        w[1] = halves(c.z, c.w);
    }
    return w;
}

// Σ_i value_i · x_i over block `blk`, x given as 8 vec4s (x[j] = values 4j .. 4j+3) with
// their sum `xs` (the 4-bit form's minimum multiplies it).
fn block_dot(blk: u32, x: ptr<function, array<vec4<f32>, 8>>, xs: f32) -> f32 {
    let base = blk * VEC_WORDS;
    if FORMAT == 0u {
        let c = codes[base];
        let dm = unpack2x16float(scales[blk]);
        var s = vec4<f32>(0.0);
        for (var j = 0u; j < 4u; j++) {
            s += lo_nibbles(c[j]) * (*x)[j] + hi_nibbles(c[j]) * (*x)[4u + j];
        }
        return dm.x * (s.x + s.y + s.z + s.w) + dm.y * xs;
    } else if FORMAT == 1u {
        let d = unpack2x16float(scales[blk]).x;
        let c0 = codes[base];
        let c1 = codes[base + 1u];
        var s = vec4<f32>(0.0);
        for (var j = 0u; j < 4u; j++) {
            s += bytes_i8(c0[j]) * (*x)[j] + bytes_i8(c1[j]) * (*x)[4u + j];
        }
        return d * (s.x + s.y + s.z + s.w);
    } else {
        var s = vec4<f32>(0.0);
        for (var j = 0u; j < 4u; j++) {
            let c = codes[base + j];
            s += halves(c.x, c.y) * (*x)[2u * j] + halves(c.z, c.w) * (*x)[2u * j + 1u];
        }
        return s.x + s.y + s.z + s.w;
    }
}
