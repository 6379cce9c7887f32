// Rotations of the rotated codecs (turbo, rotor, iso), applied in place to rows of `rot_sh`:
// the query (forward, once per split workgroup), the attention output (inverse, once per
// reduce workgroup) and new rows being encoded (forward; inverse for the QJL residual).
// The coefficients are the CPU reference's f32 arrays (src/codec/rotation.rs), stored after
// the lengths in the `lens` buffer (see `cst`). Every function here holds barriers: all
// invocations of the workgroup call it, with uniform arguments.

// RROWS rows of RW values (a rotated side's n_codes padded to a multiple of 32), held as
// vec4s: a rotated K's scores read the rotated query from here four values at a time.
var<workgroup> rot_sh: array<vec4<f32>, RROWS * RW / 4u>;

fn rs_get(i: u32) -> f32 {
    return rot_sh[i / 4u][i % 4u];
}

fn rs_set(i: u32, v: f32) {
    rot_sh[i / 4u][i % 4u] = v;
}

// Codec constant i (an f32 stored after the lengths and overflow flags).
fn cst(i: u32) -> f32 {
    return bitcast<f32>(lens[CST + i]);
}

// Length of the Walsh–Hadamard block holding coordinate i (blocks of D's binary
// decomposition, largest first: 96 = 64 + 32).
fn hblock_len(i: u32) -> u32 {
    var start = 0u;
    for (var len = 256u; len >= 32u; len /= 2u) {
        if (D & len) != 0u {
            if i < start + len {
                return len;
            }
            start += len;
        }
    }
    return 32u;
}

// Turbo: y = H (signs * x) per Hadamard block (orthonormal), or its inverse
// x = signs * (H y). `rot` is the offset of the D signs.
fn turbo_rotate(rot: u32, rows: u32, lid: u32, nt: u32, inverse: bool) {
    if !inverse {
        for (var i = lid; i < rows * D; i += nt) {
            let k = i % D;
            let at = (i / D) * RW + k;
            rs_set(at, rs_get(at) * cst(rot + k) * inverseSqrt(f32(hblock_len(k))));
        }
        workgroupBarrier();
    }
    // In-place butterflies, one stage per barrier; a pair is skipped when its block is no
    // longer than the stage's stride.
    for (var h = 1u; h < D; h *= 2u) {
        for (var p = lid; p < rows * (D / 2u); p += nt) {
            let q = p % (D / 2u);
            let i = (q / h) * 2u * h + q % h;
            if hblock_len(i) > h {
                let at = (p / (D / 2u)) * RW + i;
                let a = rs_get(at);
                let b = rs_get(at + h);
                rs_set(at, a + b);
                rs_set(at + h, a - b);
            }
        }
        workgroupBarrier();
    }
    if inverse {
        for (var i = lid; i < rows * D; i += nt) {
            let k = i % D;
            let at = (i / D) * RW + k;
            rs_set(at, rs_get(at) * cst(rot + k) * inverseSqrt(f32(hblock_len(k))));
        }
        workgroupBarrier();
    }
}

// Rotor and iso: a small matrix M per group of `n` coordinates (row-major, n*n values per
// group at `rot`): y = M x per group, or x = M^T y. `groups` groups per row.
fn group_rotate(rot: u32, n: u32, groups: u32, rows: u32, lid: u32, nt: u32, inverse: bool) {
    for (var i = lid; i < rows * groups; i += nt) {
        let g = i % groups;
        let at = (i / groups) * RW + n * g;
        let m = rot + n * n * g;
        var v = vec4<f32>(0.0);
        for (var c = 0u; c < n; c++) {
            v[c] = rs_get(at + c);
        }
        for (var r = 0u; r < n; r++) {
            var acc = 0.0;
            for (var c = 0u; c < n; c++) {
                let coef = select(cst(m + n * r + c), cst(m + n * c + r), inverse);
                acc += coef * v[c];
            }
            rs_set(at + r, acc);
        }
    }
    workgroupBarrier();
}

// Rotation of codec kind `kind` (2 turbo, 3 rotor, 4 iso) with coefficients at `rot`, on
// the first `rows` rows of rot_sh (padded coordinates must hold zeros going forward).
fn rotate_rows(kind: u32, rot: u32, rows: u32, lid: u32, nt: u32, inverse: bool) {
    if kind == 2u {
        turbo_rotate(rot, rows, lid, nt, inverse);
    } else if kind == 3u {
        group_rotate(rot, 3u, (D + 2u) / 3u, rows, lid, nt, inverse);
    } else if kind == 4u {
        group_rotate(rot, 4u, D / 4u, rows, lid, nt, inverse);
    }
}
