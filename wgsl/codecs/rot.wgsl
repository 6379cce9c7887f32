// Rotated codecs `turbo`, `rotor`, `iso` (layout contract: src/codec/mod.rs): a row holds
// NC codes of BITS bits bit-packed LSB-first across the words (a code may straddle two
// words), then NSIDE f16 scales from bit SIDE_BIT (one per row, or one per 32 codes when
// BLOCK32), then for K with QJL the residual's sign bits and its f16 norm (each a K_ or V_
// constant of the header). Included once per side by codecs/stores.wgsl. K rows are interleaved word by word in blocks of KB.

@group(0) @binding({{binding}}) var<storage, {{access}}> {{side}}_store: array<u32>;

fn {{side}}_word(row: u32, w: u32) -> u32 {
    if {{S}}_INTERLEAVED {
        return (row - row % KB) * {{S}}_WORDS + w * KB + row % KB;
    }
    return row * {{S}}_WORDS + w;
}

// The reconstruction levels (f32 Lloyd–Max levels for N(0, 1)), looked up per code (the
// decoders and the encoder's decoded row); {{side}}_load_levels fills it at kernel start.
var<workgroup> lv_{{side}}: array<f32, 16>;

fn {{side}}_load_levels(lid: u32) {
    if lid < (1u << {{S}}_BITS) {
        lv_{{side}}[lid] = cst({{S}}_LV + lid);
    }
}

// The encoder: only in modules that write rows (append, the fused step).
#if ENCODE

// No independent encode tasks ({{S}}_TASKS = 0): rows are encoded by encode_rows_{{side}}.
fn encode_{{side}}(row: u32, src: u32, task: u32) {}

// The code of t = y / s: the number of (f32) Lloyd–Max boundaries at or below t.
fn {{side}}_quantize(y: f32, s: f32) -> u32 {
    var t = 0.0;
    if s > 0.0 {
        t = y / s;
    }
    var code = 0u;
    for (var j = 0u; j + 1u < (1u << {{S}}_BITS); j++) {
        code += u32(enc_bd[j] <= t);
    }
    return code;
}

// Writes word w of row `row`.
fn {{side}}_put_word(row: u32, w: u32, word: u32) {
    {{side}}_store[{{side}}_word(row, w)] = word;
}

// Encodes the rows enc_src[r] -> enc_dst[r], r < nr <= ET, with the whole workgroup (nt
// invocations; barriers inside, so every invocation calls it with the same arguments):
// norm, rotation, scales, codes, QJL residual, then one invocation per output word. With
// sides = 2 (KV_JOINT: V's codec is K's, rotation included) K's encoder also encodes the same
// tokens' V rows, as rows nr .. 2 nr of the scratch: one chain of barriers for both sides.
fn encode_rows_{{side}}(lid: u32, nt: u32, nr: u32, sides: u32) {
    let rows = nr * sides;
    // Rows past nr are V's (sides = 2).
    for (var i = lid; i < rows * RW; i += nt) {
        let r = i / RW;
        let k = i % RW;
        var x = 0.0;
        if k < D {
            let p = enc_src[r % nr] + k / 2u;
            if r < nr {
                x = in_code_{{side}}(p)[k % 2u];
            } else {
                x = in_code_v(p)[k % 2u];
            }
        }
        rs_set(i, x);
        enc_x[i] = x;
    }
    if lid < 15u {
        enc_bd[lid] = cst({{S}}_BD + lid);
    }
    workgroupBarrier();
    // Sums of squares in 8 parts per row, beside the rotation (which leaves enc_x alone).
    for (var i = lid; i < rows * 8u; i += nt) {
        let k0 = (i / 8u) * RW + (i % 8u) * (D / 8u);
        var ss = 0.0;
        for (var k = 0u; k < D / 8u; k++) {
            ss += enc_x[k0 + k] * enc_x[k0 + k];
        }
        enc_np[i] = ss;
    }
    rotate_rows({{S}}_KIND, {{S}}_ROT, rows, lid, nt, false);
    for (var r = lid; r < rows; r += nt) {
        var ss = 0.0;
        for (var q = 0u; q < 8u; q++) {
            ss += enc_np[8u * r + q];
        }
        enc_n[r] = sqrt(ss);
    }
    workgroupBarrier();

    // Scales, rounded to the stored f16 values: codes are chosen against those.
    for (var i = lid; i < rows * {{S}}_NSIDE; i += nt) {
        let r = i / {{S}}_NSIDE;
        let j = i % {{S}}_NSIDE;
        var s = enc_n[r] / sqrt(f32(D));
        if {{S}}_BLOCK32 {
            let n = min(32u, {{S}}_NC - 32u * j);
            var ss = 0.0;
            for (var k = 0u; k < n; k++) {
                let y = rs_get(r * RW + 32u * j + k);
                ss += y * y;
            }
            s = sqrt(ss / f32(n));
        }
        enc_s[r * SIDE_MAX + j] = f16_round(min(s, 65504.0));
    }
    workgroupBarrier();
    for (var i = lid; i < rows * RW; i += nt) {
        let k = i % RW;
        if k < {{S}}_NC {
            let s = enc_s[(i / RW) * SIDE_MAX + select(0u, k / 32u, {{S}}_BLOCK32)];
            let code = {{side}}_quantize(rs_get(i), s);
            enc_code[i] = code;
            // The QJL residual needs the decoded row: y^ = s * level, un-rotated below.
            rs_set(i, s * lv_{{side}}[code]);
        }
    }
    workgroupBarrier();
    if {{S}}_QJL {
        rotate_rows({{S}}_KIND, {{S}}_ROT, nr, lid, nt, true);
        // r = (x - x^) / ||x|| in place of x (0 for a zero row).
        for (var i = lid; i < nr * RW; i += nt) {
            let n = enc_n[i / RW];
            enc_x[i] = select(0.0, (enc_x[i] - rs_get(i)) / n, n > 0.0 && i % RW < D);
        }
        workgroupBarrier();
        // Sign bits of S r (as 0/1 in rot_sh) and ||r||.
        for (var i = lid; i < nr * D; i += nt) {
            let r = i / D;
            let j = i % D;
            var acc = 0.0;
            // 8 loads of S in flight at a time (a lone load per step would wait on each).
            for (var k = 0u; k < D; k += 8u) {
                for (var u = 0u; u < 8u; u++) {
                    acc += cst(QJL_S + (k + u) * D + j) * enc_x[r * RW + k + u];
                }
            }
            rs_set(r * RW + j, select(0.0, 1.0, acc >= 0.0));
        }
        for (var r = lid; r < nr; r += nt) {
            var ss = 0.0;
            for (var k = 0u; k < D; k++) {
                ss += enc_x[r * RW + k] * enc_x[r * RW + k];
            }
            enc_rn[r] = f16_round(min(sqrt(ss), 65504.0));
        }
        workgroupBarrier();
    }

    // One invocation per output word gathers every field overlapping it.
    for (var i = lid; i < rows * {{S}}_WORDS; i += nt) {
        let r = i / {{S}}_WORDS;
        let w = i % {{S}}_WORDS;
        let lo = 32u * w;
        var word = 0u;
        if lo < {{S}}_NC * {{S}}_BITS {
            let c1 = min({{S}}_NC, (lo + 32u + {{S}}_BITS - 1u) / {{S}}_BITS);
            for (var c = lo / {{S}}_BITS; c < c1; c++) {
                let o = c * {{S}}_BITS;
                let v = enc_code[r * RW + c];
                if o >= lo {
                    word |= v << (o - lo);
                } else {
                    word |= v >> (lo - o);
                }
            }
        }
        for (var j = 0u; j < {{S}}_NSIDE; j++) {
            let bit = {{S}}_SIDE_BIT + 16u * j;
            if bit / 32u == w {
                word |= (pack2x16float(vec2<f32>(enc_s[r * SIDE_MAX + j], 0.0)) & 0xffffu) << (bit % 32u);
            }
        }
        if {{S}}_QJL {
            if w >= {{S}}_QJL_WORD && w < {{S}}_QJL_WORD + D / 32u {
                let j0 = r * RW + 32u * (w - {{S}}_QJL_WORD);
                for (var t = 0u; t < 32u; t++) {
                    word |= u32(rs_get(j0 + t)) << t;
                }
            }
            if {{S}}_QJL_NORM_BIT / 32u == w {
                word |= (pack2x16float(vec2<f32>(enc_rn[r], 0.0)) & 0xffffu) << ({{S}}_QJL_NORM_BIT % 32u);
            }
        }
        let dst = enc_dst[r % nr];
        if dst != NO_ROW {
            if r < nr {
                {{side}}_put_word(dst, w, word);
            } else {
                v_put_word(dst, w, word);
            }
        }
    }
    workgroupBarrier();
}
#endif
