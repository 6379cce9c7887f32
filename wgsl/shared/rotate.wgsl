// Rotations of the rotated codecs (turbo, rotor, iso), applied in place to rows of `rot_sh`:
// the query (forward, once per split workgroup), the attention output (inverse, once per
// reduce workgroup) and new rows being encoded (forward; inverse for the QJL residual).
// The coefficients are the CPU reference's f32 values (src/codec/rotation.rs: turbo's signs,
// rotor's matrices, iso's quaternions; the last two one coefficient of every group before the
// next, see group_matrix), stored after the lengths in the `lens` buffer (see `cst`). Most
// functions here hold barriers: all invocations of the workgroup call them, with uniform
// arguments.

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
    if (D & (D - 1u)) == 0u {
        return D;
    }
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

// Turbo's diagonal, sign_k / sqrt(len of k's Hadamard block), of each turbo side (K's first):
// copied from the constants by load_diag at the start of a kernel that rotates, beside its
// other first loads, so a rotation (on every decode workgroup's critical path) waits on no
// global memory. DIAG_N = D per turbo side (1 without one).
var<workgroup> diag_sh: array<f32, DIAG_N>;

// Where V's diagonal starts in diag_sh.
const DIAG_V: u32 = select(0u, D, K_KIND == KIND_TURBO);

// Fills the diagonals of the turbo sides asked for (`k`, `v`: uniform); a barrier must
// follow before any rotation.
fn load_diag(lid: u32, nt: u32, k: bool, v: bool) {
    if k && K_KIND == KIND_TURBO {
        for (var i = lid; i < D; i += nt) {
            diag_sh[i] = cst(K_ROT + i) * inverseSqrt(f32(hblock_len(i)));
        }
    }
    if v && V_KIND == KIND_TURBO {
        for (var i = lid; i < D; i += nt) {
            diag_sh[DIAG_V + i] = cst(V_ROT + i) * inverseSqrt(f32(hblock_len(i)));
        }
    }
}

// Turbo's diagonal: x_k *= diag_k of the side whose coefficients start at `rot` (K's when
// both sides are turbo with the same coefficients).
fn turbo_scale(rot: u32, rows: u32, lid: u32, nt: u32) {
    let base = select(DIAG_V, 0u, K_KIND == KIND_TURBO && rot == K_ROT);
    for (var i = lid; i < rows * D; i += nt) {
        let k = i % D;
        let at = (i / D) * RW + k;
        rs_set(at, rs_get(at) * diag_sh[base + k]);
    }
    workgroupBarrier();
}

// In-place unnormalised Walsh–Hadamard butterflies on every Hadamard block of `rows` rows,
// stage by stage (strides 1, 2, 4, ...). For a power-of-two D the stages run four at a time
// in registers (fwht_lo, fwht_hi): two barriers instead of log2(D), with the same additions
// in the same order, so the same values (but for the sign of a zero: fwht_hi adds zeros).
// Each barrier is a round trip through workgroup memory on every decode workgroup's
// critical path (the query), on split 0's (the encoder) and on the reduce's (the output's
// un-rotation).
fn fwht(rows: u32, lid: u32, nt: u32) {
    if (D & (D - 1u)) == 0u && D >= 32u && D <= 256u {
        fwht_lo(rows, lid, nt);
        fwht_hi(rows, lid, nt);
        return;
    }
    for (var lh = 0u; (1u << lh) < D; lh++) {
        let h = 1u << lh;
        // Pair q of stage 2^lh is (i, i + 2^lh), i being q with its bits from lh up moved up
        // one: shifts, since the compiler does not unroll this loop (q / h, h being the
        // loop's value, compiled to a full integer division of dozens of instructions).
        for (var p = lid; p < rows * (D / 2u); p += nt) {
            let q = p % (D / 2u);
            let i = ((q >> lh) << (lh + 1u)) | (q & (h - 1u));
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
}

// Stages 1 and 2 of 4 values.
fn h4(x: vec4<f32>) -> vec4<f32> {
    let p = vec4<f32>(x.x + x.y, x.x - x.y, x.z + x.w, x.z - x.w);
    return vec4<f32>(p.x + p.z, p.y + p.w, p.x - p.z, p.y - p.w);
}

// Stages 1, 2, 4 and 8 of 16 values (4 vec4s, in order). Zeros past the first 2^m values
// leave the first 2^m results those of m stages alone (H_2n's top left block is H_n).
fn h16(x: mat4x4<f32>) -> mat4x4<f32> {
    let a = h4(x[0]);
    let b = h4(x[1]);
    let c = h4(x[2]);
    let d = h4(x[3]);
    let ab = a + b;
    let ab2 = a - b;
    let cd = c + d;
    let cd2 = c - d;
    return mat4x4<f32>(ab + cd, ab2 + cd2, ab - cd, ab2 - cd2);
}

// Stages 1-8 (power-of-two D >= 32): 16 consecutive values a task.
fn fwht_lo(rows: u32, lid: u32, nt: u32) {
    for (var t = lid; t < rows * (D / 16u); t += nt) {
        let q = ((t / (D / 16u)) * RW + 16u * (t % (D / 16u))) / 4u;
        let y = h16(mat4x4<f32>(rot_sh[q], rot_sh[q + 1u], rot_sh[q + 2u], rot_sh[q + 3u]));
        rot_sh[q] = y[0];
        rot_sh[q + 1u] = y[1];
        rot_sh[q + 2u] = y[2];
        rot_sh[q + 3u] = y[3];
    }
    workgroupBarrier();
}

// Stages 16 .. D/2 (power-of-two D, 32 <= D <= 256): the D / 16 values at stride 16 from
// each of a row's first 16 coordinates.
fn fwht_hi(rows: u32, lid: u32, nt: u32) {
    let n = D / 16u;
    for (var t = lid; t < rows * 16u; t += nt) {
        let at = (t / 16u) * RW + t % 16u;
        var x = mat4x4<f32>();
        // (Constant conditions: D is a constant, so no branch survives.)
        x[0] = vec4<f32>(rs_get(at), rs_get(at + 16u), 0.0, 0.0);
        if n > 2u {
            x[0].z = rs_get(at + 32u);
            x[0].w = rs_get(at + 48u);
        }
        if n > 4u {
            x[1] = vec4<f32>(rs_get(at + 64u), rs_get(at + 80u), rs_get(at + 96u), rs_get(at + 112u));
        }
        if n > 8u {
            x[2] = vec4<f32>(rs_get(at + 128u), rs_get(at + 144u), rs_get(at + 160u), rs_get(at + 176u));
            x[3] = vec4<f32>(rs_get(at + 192u), rs_get(at + 208u), rs_get(at + 224u), rs_get(at + 240u));
        }
        let y = h16(x);
        rs_set(at, y[0].x);
        rs_set(at + 16u, y[0].y);
        if n > 2u {
            rs_set(at + 32u, y[0].z);
            rs_set(at + 48u, y[0].w);
        }
        if n > 4u {
            rs_set(at + 64u, y[1].x);
            rs_set(at + 80u, y[1].y);
            rs_set(at + 96u, y[1].z);
            rs_set(at + 112u, y[1].w);
        }
        if n > 8u {
            rs_set(at + 128u, y[2].x);
            rs_set(at + 144u, y[2].y);
            rs_set(at + 160u, y[2].z);
            rs_set(at + 176u, y[2].w);
            rs_set(at + 192u, y[3].x);
            rs_set(at + 208u, y[3].y);
            rs_set(at + 224u, y[3].z);
            rs_set(at + 240u, y[3].w);
        }
    }
    workgroupBarrier();
}

// Turbo: y = H (signs * x) per Hadamard block (orthonormal), or its inverse
// x = signs * (H y).
fn turbo_rotate(rot: u32, rows: u32, lid: u32, nt: u32, inverse: bool) {
    if !inverse {
        turbo_scale(rot, rows, lid, nt);
    }
    fwht(rows, lid, nt);
    if inverse {
        turbo_scale(rot, rows, lid, nt);
    }
}

// Turbo's diagonal for coordinates 4j .. 4j + 3 of the side whose constants start at `rot`:
// sign / sqrt(length of the coordinate's Hadamard block). Read at kernel start by the
// decode's query load.
fn turbo_coef(rot: u32, j: u32) -> vec4<f32> {
    let m = rot + 4u * j;
    let c = vec4<f32>(cst(m), cst(m + 1u), cst(m + 2u), cst(m + 3u));
    return c * inverseSqrt(f32(hblock_len(4u * j)));
}

// A rotor's or iso's matrix M of group g, its rows as the columns (rotor: 3 rows, w 0, and a
// zero fourth column), so that x * m = M x and m * x = M^T x. The constants hold one
// coefficient of every group before the next (a rotor's 9 entries of M; an iso's quaternion q,
// M = L(q), whose entries are q's with signs): the invocations of a rotation, one per group,
// read consecutive words. (Group by group, a warp's loads touched up to 16 times the cache
// lines: BENCHMARKS.md, "Kernel choices, measured".) Read by every rotor and iso rotation, and at kernel
// start by those fused into the first loads (the decode's query, the reduce's output).
fn group_matrix(kind: u32, rot: u32, g: u32) -> mat4x4<f32> {
    if kind == KIND_ROTOR {
        let n = (D + 2u) / 3u;
        let e = rot + g;
        return mat4x4<f32>(
            vec4<f32>(cst(e), cst(e + n), cst(e + 2u * n), 0.0),
            vec4<f32>(cst(e + 3u * n), cst(e + 4u * n), cst(e + 5u * n), 0.0),
            vec4<f32>(cst(e + 6u * n), cst(e + 7u * n), cst(e + 8u * n), 0.0),
            vec4<f32>(0.0),
        );
    }
    let n = D / 4u;
    let w = cst(rot + g);
    let x = cst(rot + n + g);
    let y = cst(rot + 2u * n + g);
    let z = cst(rot + 3u * n + g);
    // L(q) v = q v (quaternion product), v = (w, x, y, z) of 4 coordinates.
    return mat4x4<f32>(vec4<f32>(w, -x, -y, -z), vec4<f32>(x, w, -z, y), vec4<f32>(y, z, w, -x), vec4<f32>(z, -y, x, w));
}

// Rotor: a 3x3 matrix M per group of 3 coordinates (group_matrix): y = M x per group, or
// x = M^T y.
fn rotor_rotate(rot: u32, rows: u32, lid: u32, nt: u32, inverse: bool) {
    let groups = (D + 2u) / 3u;
    for (var i = lid; i < rows * groups; i += nt) {
        let at = (i / groups) * RW + 3u * (i % groups);
        let m = group_matrix(KIND_ROTOR, rot, i % groups);
        let x = vec4<f32>(rs_get(at), rs_get(at + 1u), rs_get(at + 2u), 0.0);
        let y = select(x * m, m * x, inverse);
        rs_set(at, y.x);
        rs_set(at + 1u, y.y);
        rs_set(at + 2u, y.z);
    }
    workgroupBarrier();
}

// Iso: a 4x4 matrix M per group of 4 coordinates (group_matrix): y = M x per group, or
// x = M^T y.
fn iso_rotate(rot: u32, rows: u32, lid: u32, nt: u32, inverse: bool) {
    let groups = D / 4u;
    for (var i = lid; i < rows * groups; i += nt) {
        let at = (i / groups) * RW + 4u * (i % groups);
        let m = group_matrix(KIND_ISO, rot, i % groups);
        let x = rot_sh[at / 4u];
        rot_sh[at / 4u] = select(x * m, m * x, inverse);
    }
    workgroupBarrier();
}

// Rotation of codec kind `kind` (KIND_TURBO, KIND_ROTOR or KIND_ISO) with coefficients at `rot`, on
// the first `rows` rows of rot_sh (padded coordinates must hold zeros going forward).
fn rotate_rows(kind: u32, rot: u32, rows: u32, lid: u32, nt: u32, inverse: bool) {
    if kind == KIND_TURBO {
        turbo_rotate(rot, rows, lid, nt, inverse);
    } else if kind == KIND_ROTOR {
        rotor_rotate(rot, rows, lid, nt, inverse);
    } else if kind == KIND_ISO {
        iso_rotate(rot, rows, lid, nt, inverse);
    }
}
