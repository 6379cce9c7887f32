#unroll $g GR
#unroll $k KCG
#unroll $t KTG
// Scores of a rotated-codec K row (turbo / rotor / iso) against the rotated query in rot_sh
// rows 0..GR: per block of 32 codes (K_BITS words, loaded together) the codes are cut out four
// at a time, looked up in the level table (k_levels4), dotted with the query and scaled by the
// block's (or the row's) scale. With QJL, the residual's sign bits add the estimator's
// correction.

// With K_PAIRS (src/kernels/config.rs, `k_pairs`, says where it pays), the levels of two adjacent codes (the
// first in the low bits) by their 2 K_BITS-bit field, so that codes are looked up two at a
// time: half the lookups, and half the shifts and masks that cut the codes out.
var<workgroup> lp_k: array<vec2<f32>, K_NPAIR>;

fn k_load_pairs(lid: u32) {
    if K_PAIRS {
        for (var i = lid; i < K_NPAIR; i += WG) {
            let lo = i & ((1u << K_BITS) - 1u);
            lp_k[i] = vec2<f32>(cst(K_LV + lo), cst(K_LV + (i >> K_BITS)));
        }
    }
}

// The levels of the 4 codes in the 4 K_BITS-bit field f: two pair lookups, or four.
fn k_levels4(f: u32) -> vec4<f32> {
    if K_PAIRS {
        let p = (vec2<u32>(f) >> vec2<u32>(0u, 2u * K_BITS)) & vec2<u32>(K_NPAIR - 1u);
        return vec4<f32>(lp_k[p.x], lp_k[p.y]);
    }
    return k_levels4_table(f);
}

// The levels of the 4 codes in f, one table lookup each (kernels that load no pair table).
fn k_levels4_table(f: u32) -> vec4<f32> {
    let c = (vec4<u32>(f) >> vec4<u32>(0u, K_BITS, 2u * K_BITS, 3u * K_BITS)) & vec4<u32>((1u << K_BITS) - 1u);
    return vec4<f32>(lv_k[c.x], lv_k[c.y], lv_k[c.z], lv_k[c.w]);
}

// The QJL residual's signs 4k .. 4k + 3 of sign word w as +-1: each bit moved into the sign
// bit of -1.0's pattern, two integer ops a sign (not a shift, a mask, a conversion and an fma).
fn qjl_signs4(w: u32, k: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(((vec4<u32>(w) << (vec4<u32>(31u, 30u, 29u, 28u) - vec4<u32>(4u * k))) & vec4<u32>(0x80000000u)) ^ vec4<u32>(0xbf800000u));
}

// The 4 * K_BITS bits from bit `bit` of a block's words (LSB-first; may straddle two words).
fn k_field(w: vec4<u32>, bit: u32) -> u32 {
    let i = bit / 32u;
    let sh = bit % 32u;
    var f = w[i] >> sh;
    if sh + 4u * K_BITS > 32u {
        f |= w[i + 1u] << (32u - sh);
    }
    return f;
}

// The f16 at row bit `bit` (16-bit aligned); `base` is the row's first word (interleaved).
fn k_half(base: u32, bit: u32) -> f32 {
    return unpack2x16float(k_store[base + (bit / 32u) * KB])[(bit / 16u) % 2u];
}

// The K_BITS code words of block j (32 codes) of the row whose first word is `base`. A short
// last block (rotor) re-reads its last word: the codes past K_NC meet zeros in the padded
// query.
fn k_block_words(base: u32, j: u32) -> vec4<u32> {
    var w = vec4<u32>(0u);
    w.x = k_store[base + min(K_BITS * j, K_CODE_WORDS - 1u) * KB];
    if K_BITS > 1u {
        w.y = k_store[base + min(K_BITS * j + 1u, K_CODE_WORDS - 1u) * KB];
    }
    if K_BITS > 2u {
        w.z = k_store[base + min(K_BITS * j + 2u, K_CODE_WORDS - 1u) * KB];
    }
    if K_BITS > 3u {
        w.w = k_store[base + min(K_BITS * j + 3u, K_CODE_WORDS - 1u) * KB];
    }
    return w;
}

fn k_scores(row: u32) {
    let base = (row - row % KB) * K_WORDS + row % KB;
    var s = k_half(base, K_SIDE_BIT);
    // Squared norm of the row (QJL with per-block scales).
    var nn = 0.0;
    for (var j = 0u; j < K_NC / 32u; j++) {
        if K_BLOCK32 {
            s = k_half(base, K_SIDE_BIT + 16u * j);
            nn += 32.0 * s * s;
        }
        let w = k_block_words(base, j);
        let l$k = k_levels4(k_field(w, 4u * $ku * K_BITS));
        var part$g = 0.0;
        part$g = fma4(part$g, rot_sh[$g * (RW / 4u) + 8u * j + $k], l$k);
        sc$g += s * part$g;
    }
    // A short last block (rotor: 129 codes at D = 128) decodes only its groups of 4 codes
    // (`$t` lines), not 8: a whole block's work for its one code was a fifth of the K phase.
    if K_NC % 32u != 0u {
        let j = K_NC / 32u;
        if K_BLOCK32 {
            s = k_half(base, K_SIDE_BIT + 16u * j);
            nn += f32(K_NC - 32u * j) * s * s;
        }
        let w = k_block_words(base, j);
        let l$t = k_levels4(k_field(w, 4u * $tu * K_BITS));
        var pt$g = 0.0;
        pt$g = fma4(pt$g, rot_sh[$g * (RW / 4u) + 8u * j + $t], l$t);
        sc$g += s * pt$g;
    }
    if K_QJL {
        // n sqrt(pi/2) / m ||r|| sum_j (S q)_j (+-1)_j, with m = D sign bits.
        if !K_BLOCK32 {
            nn = s * s * f32(D);
        }
        let coef = sqrt(nn) * 1.2533141 / f32(D) * k_half(base, K_QJL_NORM_BIT);
        var t$g = 0.0;
        for (var j = 0u; j < D / 32u; j++) {
            let w = k_store[base + (K_QJL_WORD + j) * KB];
            let sgn$k = qjl_signs4(w, $ku);
            t$g = fma4(t$g, sq_sh[$g * (D / 4u) + 8u * j + $k], sgn$k);
        }
        sc$g += coef * t$g;
    }
}

// The prefill kernel's K tile: coordinates 4c .. 4c + 3 of the row's scoring domain, which
// the query tile matches (kernels/prefill.wgsl): the codes' levels times their scale (past
// n_codes, where the rotated query is padded with zeros, finite values: zeros from the first
// whole vec4 on, padding bits' levels in the one that straddles it), then with QJL, from RW
// on, the residual's signs times the estimator's coefficient, against S q.
fn k_dec4(row: u32, c: u32) -> vec4<f32> {
    let base = (row - row % KB) * K_WORDS + row % KB;
    if c < RW / 4u {
        if 4u * c >= K_NC {
            return vec4<f32>(0.0);
        }
        let j = c / 8u;
        let s = k_half(base, K_SIDE_BIT + select(0u, 16u * j, K_BLOCK32));
        return k_levels4_table(k_field(k_block_words(base, j), 4u * (c % 8u) * K_BITS)) * s;
    }
    let e = c - RW / 4u;
    return qjl_signs4(k_store[base + (K_QJL_WORD + e / 8u) * KB], e % 8u) * k_qjl_coef(base);
}

// The QJL estimator's coefficient of the row whose first word is `base`, as k_scores
// computes it: n sqrt(pi/2) / m times the residual's norm, with ||x|| from the scales.
fn k_qjl_coef(base: u32) -> f32 {
    var nn = 0.0;
    if K_BLOCK32 {
        for (var j = 0u; j < (K_NC + 31u) / 32u; j++) {
            let s = k_half(base, K_SIDE_BIT + 16u * j);
            nn += f32(min(32u, K_NC - 32u * j)) * s * s;
        }
    } else {
        let s = k_half(base, K_SIDE_BIT);
        nn = s * s * f32(D);
    }
    return sqrt(nn) * 1.2533141 / f32(D) * k_half(base, K_QJL_NORM_BIT);
}
