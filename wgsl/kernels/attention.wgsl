// Split-K flash-decode over a layer's store: one new query per sequence, or a chunk of them.
//
// `split`: one workgroup per (split, kv head, sequence) reads its slice of the store once and
// serves its GR query rows: the G query heads of the GQA group, times CQ new tokens of a
// chunk (1 for a decode step), writing a partial (max, sum, un-normalised output) per row. `reduce`: one workgroup per (query head, sequence) merges the
// partials. Lengths are read on the GPU, so a step needs no host data.
//
// Included with `scores`, `weights` and `lanes`: the workgroup arrays of the tile's scores, its
// softmax weights and the lane merge (one array for all three in the chunk module, whose rows
// would otherwise take three times the memory; each use is fenced from the next by a barrier).
// Included by a module root that declares `lens` and provides the step hooks (step_tokens,
// write_new_rows, committed_len, commit_step): kernels/decode.wgsl attends only,
// kernels/step.wgsl also appends the step's rows and commits the length. The stores' readers
// (k_scores, k_load_pairs, v_load, v_row_scale) come from codecs/readers.wgsl; their
// contracts are in wgsl/README.md.
#unroll $g GR
#unroll $v VU
#unroll $w VB
#unroll $x VBF
#unroll $r QV
#unroll $p RP

@group(0) @binding(0) var<uniform> seg: Seg;
// Partials: [NB, QH, PSLOTS, PV4] output vectors, then [NB, QH, PSLOTS] vectors (max, sum, 0,
// 0): a slot per split (SPLITS_TOTAL), and with exact tokens one more for theirs.
@group(0) @binding(4) var<storage, read_write> part: array<vec4<f32>>;
@group(1) @binding(0) var<storage, read> q_in: array<f32>;
@group(1) @binding(1) var<storage, read_write> out: array<f32>;
#if CHUNK
// A slice of a chunk: its queries first .. first + count - 1 of the chunk's n new tokens per
// sequence (a long chunk is attended slice by slice, each in the scratch of `count` queries),
// of which `appended` are in the store (n, or first + count where each slice is appended just
// before it is attended: with recent exact tokens). `lse`: 1 where the io asks for each
// output row's log-sum-exp of its scaled scores. `splits`: the slice's splits per storage
// segment, 1 ..= NSPLIT (a slice with many query groups has parallelism enough in them, and
// fewer splits write and merge fewer partials: the cache picks it per slice).
struct ChunkSlice {
    n: u32,
    first: u32,
    count: u32,
    lse: u32,
    appended: u32,
    splits: u32,
    _pad1: u32,
    _pad2: u32,
}
@group(1) @binding(2) var<uniform> chunk: ChunkSlice;
// [NB, nq, QH] log-sum-exps (a 16-byte stand-in where the io asks for none).
@group(1) @binding(3) var<storage, read_write> lse_out: array<f32>;

// Splits per storage segment of this dispatch (the decode's NSPLIT, or the slice's).
fn nsplit() -> u32 {
    return chunk.splits;
}
// Partial slot of this segment's split s: a slice's partials are packed by its own split count,
// segment after segment (the exact tokens' slot stays SPLITS_TOTAL), so the reduce reads
// only slots that were written.
fn split_slot(s: u32) -> u32 {
    return seg.split_base / (NSPLIT + 1u) * (chunk.splits + 1u) + s;
}
// Split slots written (the exact tokens' aside).
fn split_slots() -> u32 {
    return SPLITS_TOTAL / (NSPLIT + 1u) * (chunk.splits + 1u);
}
#else
fn nsplit() -> u32 {
    return NSPLIT;
}
fn split_slot(s: u32) -> u32 {
    return seg.split_base + s;
}
fn split_slots() -> u32 {
    return SPLITS_TOTAL;
}
#endif

// V columns: each thread owns VW consecutive values of a row (4, or 8 for a rotated V codec,
// whose 8 codes of a thread fit in one or two words). VC columns span D, or a rotated V
// codec's n_codes (its output stays rotated until the reduce); J token lanes share a tile.
// A partial holds PV4 = VC * VW / 4 vec4s per query head.
const J: u32 = WG / VC;
// Partials of one query per sequence; a slice of a chunk of `count` queries holds `count`
// times as many, the (max, sum) pairs after all the output vectors.
fn part_ml_at() -> u32 {
    return NB * QH * PSLOTS * PV4;
}

// The scaled query of each row (a rotated K codec reads it from rot_sh).
var<workgroup> q_sh: array<vec4<f32>, QSH>;
// S q per head for the QJL residual term (QJL only).
var<workgroup> sq_sh: array<vec4<f32>, SQN / 4u>;
// Partial tile maxima: MXP per row, each over 16 scores.
const MXP: u32 = WG / 16u;
var<workgroup> mx_sh: array<vec4<f32>, GR * MXP / 4u>;
// Softmax weights ({{weights}}), the GR rows of a token side by side (GP vec4s per token), so
// the V loop reads a token's weights for all rows in a few loads. A rotated V codec's row
// scale (one per row) is folded in, so the V loop applies it once per token, not per value.
const GP: u32 = (GR + 3u) / 4u;
#if CHUNK
var<workgroup> tile_sh: array<vec4<f32>, max(max(GR * WG / 4u, GP * WG), GR * PV4)>;
#else
var<workgroup> s_sh: array<vec4<f32>, G * WG / 4u>;
var<workgroup> p_sh: array<vec4<f32>, GP * WG>;
var<workgroup> comb: array<vec4<f32>, G * PV4>;
#endif
var<workgroup> len_sh: u32;
#if EXACT
var<workgroup> xlo_sh: u32;
#endif

// Per-row state lives in named registers: lines holding `$g` are repeated for each
// row g of the workgroup by kvq's preprocessor (`#unroll`, src/kernels/preprocess.rs), so nothing is indexed
// dynamically (a dynamically indexed private array would spill to memory on most GPUs).
var<private> sc$g: f32;

// A rotated K without QJL rotates its query as it loads it, but for turbo's Walsh–Hadamard
// transform, which needs the whole row (rotate_query); with QJL the projection S q needs the
// unrotated query first.
const TURBO_Q: bool = K_KIND == KIND_TURBO && !K_QJL;
const ROTOR_Q: bool = K_KIND == KIND_ROTOR && !K_QJL;
// The query in tasks, QT per row: a rotor group of 3 coordinates (ROTOR_Q), else a vec4 of
// rot_sh (4 coordinates, an iso group).
const QT: u32 = select(RW / 4u, (D + 2u) / 3u, ROTOR_Q);

// A rotated K's query tasks of this invocation (lid + r WG), loaded and rotated at kernel
// start (their loads beside the length's and the tables') and kept in registers until
// rotate_query writes them to rot_sh, once split 0 has encoded its new rows there. Loading
// iso's and rotor's coefficients in a rotation pass after the barrier cost a round trip to
// memory a layer (BENCHMARKS.md, "Kernel choices, measured").
var<private> qv$r: vec4<f32>;

// Query heads from the first row's to row i's: row i is new token i / G of the workgroup's,
// head i % G of its row group (i itself for one query).
fn row_head(i: u32) -> u32 {
    return (i / G) * QH + i % G;
}

// A workgroup serves the G query heads hq .. hq + G - 1 of KV head h's GQA group of GQ: its
// row group rg of NRG, hq = h GQ + rg G (the whole group where GQ <= 8). Whether row i is one
// of the group's heads (a last row group may hold fewer: 71 heads in groups of 8); the others
// read zero queries and write nothing.
fn row_real(hq: u32, i: u32) -> bool {
    return hq % GQ + i % G < GQ;
}

// Offset in q_in of row i, the workgroup's first query being qb (of the [NB, nq] queries) and
// its first head hq.
fn query_row(qb: u32, hq: u32, i: u32) -> u32 {
    return (qb * QH + hq + row_head(i)) * D;
}

// Coordinate k of row i, scaled (0 past D, for the rows past a chunk's last query, the
// workgroup having nz queries, and for rows past the group's heads).
fn query_coord(qb: u32, hq: u32, nz: u32, i: u32, k: u32) -> f32 {
    if k >= D || i / G >= nz || !row_real(hq, i) {
        return 0.0;
    }
    return q_in[query_row(qb, hq, i) + k] * SCALE;
}

// Query task t (see QT; zeros past the last): a rotor group rotated (xyz), or rot_sh vec4 t
// with turbo's diagonal or iso's group matrix applied (neither with QJL).
fn query_task(qb: u32, hq: u32, nz: u32, t: u32) -> vec4<f32> {
    if t >= GR * QT {
        return vec4<f32>(0.0);
    }
    let i = t / QT;
    let g = t % QT;
    if ROTOR_Q {
        let x = vec4<f32>(query_coord(qb, hq, nz, i, 3u * g), query_coord(qb, hq, nz, i, 3u * g + 1u), query_coord(qb, hq, nz, i, 3u * g + 2u), 0.0);
        return x * group_matrix(KIND_ROTOR, K_ROT, g);
    }
    let k = 4u * g;
    let x = vec4<f32>(query_coord(qb, hq, nz, i, k), query_coord(qb, hq, nz, i, k + 1u), query_coord(qb, hq, nz, i, k + 2u), query_coord(qb, hq, nz, i, k + 3u));
    if k >= D || K_QJL {
        return x;
    }
    if K_KIND == KIND_TURBO {
        return x * turbo_coef(K_ROT, g);
    }
    return x * group_matrix(KIND_ISO, K_ROT, g);
}

// The rows' queries (qv, loaded at kernel start) into rot_sh rows 0..GR, then the QJL
// projection S q of each row (from the unrotated query) and the K codec's rotation, in
// place, or turbo's Walsh–Hadamard transform (iso and rotor without QJL are done).
fn rotate_query(lid: u32, b: u32, h: u32) {
    if ROTOR_Q {
        // 3 coordinates a task; the padding past the last group stays 0.
        for (var i = lid; i < GR * RW; i += WG) {
            if i % RW >= 3u * QT { rs_set(i, 0.0); }
        }
        // (Each `$r` line is repeated on its own.)
        let t$r = lid + $ru * WG;
        let at$r = (t$r / QT) * RW + 3u * (t$r % QT);
        if t$r < GR * QT { rs_set(at$r, qv$r.x); rs_set(at$r + 1u, qv$r.y); rs_set(at$r + 2u, qv$r.z); }
    } else {
        if lid + $ru * WG < GR * QT { rot_sh[lid + $ru * WG] = qv$r; }
    }
    workgroupBarrier();
    if K_QJL {
        // One pass over S (stored transposed: neighbouring j, neighbouring words) serves
        // every row.
        for (var j = lid; j < D; j += WG) {
            var acc$g = 0.0;
            // The query is read a vec4 at a time (D is a multiple of 32): read a value at a
            // time, one workgroup-memory read per multiply-add, it made QJL's step slower
            // (BENCHMARKS.md, "Kernel choices, measured"; 8 loads of S in flight a round
            // instead of these 32 ran as fast).
            for (var k = 0u; k < D; k += 4u * VU) {
                let s$v = vec4<f32>(cst(QJL_S + (k + 4u * $vu) * D + j), cst(QJL_S + (k + 4u * $vu + 1u) * D + j), cst(QJL_S + (k + 4u * $vu + 2u) * D + j), cst(QJL_S + (k + 4u * $vu + 3u) * D + j));
                acc$g = fma4(acc$g, rot_sh[($g * RW + k) / 4u + $vu], s$v);
            }
            sq_sh[($g * D + j) / 4u][j % 4u] = acc$g;
        }
        workgroupBarrier();
    }
    if TURBO_Q {
        fwht(GR, lid, WG);
    } else if K_QJL {
        rotate_rows(K_KIND, K_ROT, GR, lid, WG, false);
    }
}

// Row g's partial: pi is the first row's partial index.
fn write_partial(g: u32, pi: u32, ml: u32, c: u32, acc: vec4<f32>, acc2: vec4<f32>, m: f32, l: f32) {
    let at = pi + row_head(g) * PSLOTS;
    part[at * PV4 + c * (VW / 4u)] = acc;
    if VW == 8u {
        part[at * PV4 + c * 2u + 1u] = acc2;
    }
    if c == 0u {
        part[ml + at] = vec4<f32>(m, l, 0.0, 0.0);
    }
}

#if EXACT
// The exact tokens' partial (CacheSpec::exact): the first segment's workgroup nsplit() + 1 of
// each row attends each sequence's sink and ring rows, f16 in the caller's domain, and writes
// their (max, sum, output) to the last partial slot, which the reduce adds after un-rotating
// the splits'.
// Their values go in columns of 4 (XC of them over D), XJ token lanes a tile.
const XC: u32 = D / 4u;
const XJ: u32 = WG / XC;

// Coordinates 4k .. 4k + 3 of row g's scaled query in the caller's domain: q_sh, or a rotated
// K's rot_sh rows, reloaded unrotated by exact_partial.
fn xq(g: u32, k: u32) -> vec4<f32> {
    if K_ROTATED {
        return rot_sh[g * (RW / 4u) + k];
    }
    return q_sh[g * (D / 4u) + k];
}

// Position of the u-th exact row attended: the sink's ns, then the ring's from rl.
fn x_pos(u: u32, ns: u32, rl: u32) -> u32 {
    return select(rl + u - ns, u, u < ns);
}

// Values 4c .. 4c + 3 of the exact row from word r on (x_row, plus xv() for V), as their two
// words of f16 pairs.
fn x_pair(r: u32, c: u32) -> vec2<u32> {
    return vec2<u32>(x_at(r + 2u * c), x_at(r + 2u * c + 1u));
}

// Values 4c .. 4c + 3 of position p's K (v = 0) or V (v = xv()) row, as their two words of f16
// pairs (x_words) or as values.
fn x_words(b: u32, h: u32, p: u32, v: u32, c: u32) -> vec2<u32> {
    return x_pair(x_row(b, h, p) + v, c);
}

fn x_unpack(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

fn x_load(b: u32, h: u32, p: u32, v: u32, c: u32) -> vec4<f32> {
    return x_unpack(x_words(b, h, p, v, c));
}

// The exact workgroup's loads in flight at once: word pairs of a K row an invocation loads
// before their math (XKB, from the generated header: the whole row up to D = 128, one round
// trip to memory, else the most up to 32 that divide its XC), and V rows of a lane loaded
// before the softmax's barriers.
const XVB: u32 = 8u;

#if KMEAN
// K's mean (shared/exact.wgsl), which the exact rows' scores subtract as the codes hold it.
var<workgroup> xmu_sh: array<vec4<f32>, XC>;

// Fills xmu_sh (published by a later barrier; uniform arguments): zeros while the sequence
// is shorter than its sink (no code is attended), else the stored mean, which in a fused step
// that completes the sink this workgroup stores first for head h (the splits of later
// segments read it after this dispatch).
fn x_load_mean(lid: u32, b: u32, h: u32, len: u32, lc: u32) {
#if ENCODE
    if len < SINK && lc >= SINK {
        kmu_base = len;
        kmu_write(lid, WG, b, h, 1u);
        storageBarrier();
    }
#endif
    for (var c = lid; c < XC; c += WG) {
        xmu_sh[c] = select(vec4<f32>(0.0), kmu_load(b, h, c), lc >= SINK);
    }
}
#endif

// Arguments are uniform (every invocation calls it; barriers inside): `total` tokens are
// attended (`len` of them stored before this dispatch), the committed length is `lc`, row g's
// causal end is first + g / G in a chunk; the rows are heads hq .. of KV head h.
fn exact_partial(lid: u32, b: u32, h: u32, hq: u32, qb: u32, nz: u32, pb: u32, part_ml: u32, len: u32, total: u32, first: u32, lc: u32, xlo: u32) {
    // The sink's ns positions, then the ring's from rl: from the first row's ring start (each
    // row sees the RECENT positions up to its own; a chunk's slice was appended just before
    // it is attended, so the ring holds them all).
    let ns = min(SINK, total);
    let rl = max(ns, x_ring_lo(xlo, first));
    let ne = ns + (total - rl);
    let c = lid % XC;
    let j = lid / XC;
    var m$g = NEG;
    var l$g = 0.0;
    var acc$g = vec4<f32>(0.0);
    for (var t0 = 0u; t0 < ne; t0 += WG) {
        let tn = min(WG, ne - t0);
        let e = t0 + lid;
        let pos = x_pos(e, ns, rl);
        let r = x_row(b, h, pos);
        // Row e's first XKB word pairs of K, loaded before the barrier and the first tile's
        // query and mean loads, so that those round trips overlap (each was a wait of its own,
        // and the exact workgroup outlasted a short step's splits).
        var w: array<vec2<u32>, XKB>;
        if lid < tn {
            for (var u = 0u; u < XKB; u++) {
                w[u] = x_pair(r, u);
            }
        }
        if t0 == 0u {
#if KMEAN
            // The codes hold K less its mean: the exact rows are scored less it too.
            x_load_mean(lid, b, h, len, lc);
#endif
            if K_ROTATED {
                for (var i = lid; i < GR * XC; i += WG) {
                    let r = i / XC;
                    let k = 4u * (i % XC);
                    rot_sh[r * (RW / 4u) + i % XC] = vec4<f32>(query_coord(qb, hq, nz, r, k), query_coord(qb, hq, nz, r, k + 1u), query_coord(qb, hq, nz, r, k + 2u), query_coord(qb, hq, nz, r, k + 3u));
                }
            }
        }
        // The previous tile's V loop (or the split) has read the shared arrays; the first
        // tile's queries and mean are written.
        workgroupBarrier();
        sc$g = 0.0;
        if lid < tn {
            for (var k0 = 0u; k0 < XC; k0 += XKB) {
                if k0 > 0u {
                    for (var u = 0u; u < XKB; u++) {
                        w[u] = x_pair(r, k0 + u);
                    }
                }
                for (var u = 0u; u < XKB; u++) {
                    var x = x_unpack(w[u]);
#if KMEAN
                    x -= xmu_sh[k0 + u];
#endif
                    sc$g += dot(xq($gu, k0 + u), x);
                }
            }
        }
        // This lane's first XVB V rows, in flight during the softmax's barriers.
        var vp: array<vec2<u32>, XVB>;
        if j < XJ {
            for (var u = 0u; u < XVB; u++) {
                let i = j + u * XJ;
                if i < tn {
                    vp[u] = x_words(b, h, x_pos(t0 + i, ns, rl), xv(), c);
                }
            }
        }
#if CHUNK
        let ok$g = lid < tn && pos < first + $gu / G && (pos < SINK || pos >= x_ring_lo(xlo, first + $gu / G));
#else
        let ok$g = lid < tn;
#endif
#include "kernels/softmax_tile.wgsl"
        {{weights}}[lid * GP + $g / 4u][$g % 4u] = pw$g;
        workgroupBarrier();
        if j < XJ {
            acc$g *= alpha$g;
            for (var u = 0u; u < XVB; u++) {
                let i = j + u * XJ;
                if i < tn {
                    acc$g += {{weights}}[i * GP + $g / 4u][$g % 4u] * x_unpack(vp[u]);
                }
            }
            // The rest: 4 rows' values loaded before their math, then one at a time.
            var i = j + XVB * XJ;
            for (; i + 3u * XJ < tn; i += 4u * XJ) {
                var vv: array<vec4<f32>, 4>;
                for (var u = 0u; u < 4u; u++) {
                    let ei = t0 + i + u * XJ;
                    vv[u] = x_load(b, h, x_pos(ei, ns, rl), xv(), c);
                }
                for (var u = 0u; u < 4u; u++) {
                    acc$g += {{weights}}[(i + u * XJ) * GP + $g / 4u][$g % 4u] * vv[u];
                }
            }
            for (; i < tn; i += XJ) {
                let ei = t0 + i;
                let v = x_load(b, h, x_pos(ei, ns, rl), xv(), c);
                acc$g += {{weights}}[i * GP + $g / 4u][$g % 4u] * v;
            }
        }
    }
    // The sum over the workgroup, then the lanes into lane 0, as the split's.
    workgroupBarrier();
#include "kernels/softmax_sum.wgsl"
    for (var r = XJ - 1u; r > 0u; r--) {
        if j == r {
            var a$g = acc$g;
            if r < XJ - 1u {
                a$g += {{lanes}}[$g * XC + c];
            }
            {{lanes}}[$g * XC + c] = a$g;
        }
        workgroupBarrier();
    }
    if j == 0u {
        if XJ > 1u {
            acc$g += {{lanes}}[$g * XC + c];
        }
        let pi = (pb * QH + hq) * PSLOTS + SPLITS_TOTAL;
        if $gu / G < nz && row_real(hq, $gu) { x_write_partial($gu, pi, part_ml, c, acc$g, m$g, l$g); }
    }
}

// Row g's exact partial (values 4c .. 4c + 3; pi is the first row's partial index).
fn x_write_partial(g: u32, pi: u32, ml: u32, c: u32, acc: vec4<f32>, m: f32, l: f32) {
    let at = pi + row_head(g) * PSLOTS;
    part[at * PV4 + c] = acc;
    if c == 0u {
        part[ml + at] = vec4<f32>(m, l, 0.0, 0.0);
    }
}
#endif

#if CHUNK
// Position of the u-th slot of runs r, which hold positions from x on (r = seg_runs(x, y, s)).
fn run_pos(u: u32, r: vec3<u32>, x: u32, s: Seg) -> u32 {
    let a = ring_slot(x);
    if RING && u >= r.y {
        return x + (CAP - a) + s.seg_start + (u - r.y);
    }
    return x + (s.seg_start + r.x - a) + u;
}
#endif

// Dispatch (KVH * NB * NRG, NSPLIT + 1, 1) per segment, or (KVH * NB * NRG, chunk.splits + 1,
// ceil(count / CQ)) for a chunk's slice (NRG row groups of each KV head's GQA group): the
// workgroups of split 0 (the new tokens of a fused step, which have rows to encode,
// and a short tail of the stored ones) come first in dispatch order, so they start first. A
// chunk's nq new tokens per sequence are all appended already; z serves the slice's queries
// first + CQ z .. first + CQ z + CQ - 1, and query i attends the positions up to its own, the
// last nq - 1 - i stored ones not.
// (Only the chunk module reads nq: the decode and step kernels keep their single-query
// arithmetic, which measured faster at short contexts.)
@compute @workgroup_size(WG)
fn split(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let s = wid.y;
    // Row group rg of KV head h of sequence b: query heads hq .. hq + G - 1.
    let rg = wid.x % NRG;
    let h = (wid.x / NRG) % KVH;
    let b = wid.x / NRG / KVH;
    let hq = h * GQ + rg * G;
    // The first query's row of the [NB, nq] queries and of the slice's [NB, count] partials,
    // the workgroup's queries (nz), the tokens after its last one, and where the partials'
    // (max, sum) pairs start.
#if CHUNK
    let nq = chunk.n;
    let z0 = chunk.first + wid.z * CQ;
    let nz = min(CQ, chunk.first + chunk.count - z0);
    let qb = b * nq + z0;
    let pb = b * chunk.count + wid.z * CQ;
    let later = chunk.appended - z0 - nz;
    let part_ml = chunk.count * part_ml_at();
#else
    let nz = 1u;
    let qb = b;
    let pb = b;
    let later = 0u;
    let part_ml = part_ml_at();
#endif
    // The query, the level tables and the length are fetched together; the barrier of
    // workgroupUniformLoad covers them all. (A rotated K codec's query is rotated below, in
    // rot_sh, once the new rows, whose encoding uses rot_sh, are written.)
    if !K_ROTATED {
        // A chunk's rows are (token, head) pairs, some past its last token; the decode keeps
        // its own loop (rows are heads: no division per element).
#if CHUNK
        for (var i = lid; i < GR * D / 4u; i += WG) {
            let r = i / (D / 4u);
            var x = vec4<f32>(0.0);
            if r / G < nz && row_real(hq, r) {
                let o = query_row(qb, hq, r) + 4u * (i % (D / 4u));
                x = vec4<f32>(q_in[o], q_in[o + 1u], q_in[o + 2u], q_in[o + 3u]) * SCALE;
            }
            q_sh[i] = x;
        }
#else
        for (var i = lid; i < G * D / 4u; i += WG) {
            var x = vec4<f32>(0.0);
            if row_real(hq, i / (D / 4u)) {
                let o = ((qb * QH + hq) * D) + 4u * i;
                x = vec4<f32>(q_in[o], q_in[o + 1u], q_in[o + 2u], q_in[o + 3u]) * SCALE;
            }
            q_sh[i] = x;
        }
#endif
    } else {
        qv$r = query_task(qb, hq, nz, lid + $ru * WG);
    }
    k_load_levels(lid);
    v_load_levels(lid);
    k_load_pairs(lid);
    // Split 0 encodes the new rows (both sides); the query's rotation needs K's diagonal
    // only when a QJL K keeps it out of the query load (query_task).
    load_diag(lid, WG, s == 0u || K_QJL, s == 0u);
    if lid == 0u {
        len_sh = lens[len_index(seg.layer, b)];
#if EXACT
        // (Loaded beside the length: one round trip for both.)
        xlo_sh = x_at(b);
#endif
    }
    let len = workgroupUniformLoad(&len_sh) - later;
#if EXACT
    // The sequence's exact_lo, uniform (the ranges below bound loops with barriers).
    let xlo = workgroupUniformLoad(&xlo_sh);
#endif
    // The window is the last WIN positions up to and including the new tokens (all of them
    // unless the cache is a sliding window): of the first row's query, the workgroup's first
    // (positions before `first`; row i's end `first + i / G`). Splits 1..=nsplit() share its stored positions in
    // this segment; split 0 takes the tokens a fused step appends (kernels/step.wgsl; none for a
    // plain attend): it encodes their rows and attends them, so encoding runs beside the
    // other splits, not before them, and it may take a short tail of the stored tokens too
    // (below). Positions become slots through runs (shared/common.wgsl).
    let total = len + step_tokens(len);
    let first = total - (nz - 1u);
#if EXACT
    // The last workgroup of a row (split nsplit() + 1) attends the exact tokens, beside the
    // splits rather than after one of them; only the first segment's holds them.
    if s == nsplit() + 1u {
        if seg.split_base == 0u {
            // (Every row group's exact workgroup writes the same exact rows, as split 0 the
            // new codes.)
            write_exact_rows(lid, b, h, len);
            storageBarrier();
            exact_partial(lid, b, h, hq, qb, nz, pb, part_ml, len, total, first, total + later, xlo);
        }
        return;
    }
    // The codes attended: positions from the sink's end up to the last row's ring start (the
    // exact workgroup attends the exact ones, exact_partial; in a chunk each row masks its
    // own ring): stored ones up to slen, new ones (a fused step's) up to stot.
    let lo = SINK;
    let stot = max(lo, x_ring_lo(xlo, total));
    let slen = min(len, stot);
#else
    let lo = first - min(first, WIN);
    let stot = total;
    let slen = len;
#endif
    let stored_runs = seg_runs(min(lo, slen), slen, seg);
    let stored = stored_runs.y + stored_runs.z;
    let new_runs = seg_runs(max(slen, lo), stot, seg);
    let fresh = new_runs.y + new_runs.z;
    // Whole tiles per split where the stored tokens split that way but for a tail that split
    // 0 takes beside its new tokens (together at most a tile): a split's pass over a last tile
    // of a few tokens costs nearly a full tile's round trips, and just past a multiple of
    // nsplit() * WG stored tokens every split had one. Where this segment holds new tokens,
    // the tail must be the positions just before them (all in this segment), so that split
    // 0's tokens are one range of positions.
    let ns = nsplit();
    let full = stored / (ns * WG) * WG;
    let tail = stored - ns * full;
    let tail_runs = seg_runs(slen - min(slen, tail), slen, seg);
    let tail_here = fresh == 0u || tail_runs.y + tail_runs.z == tail;
    let cut = select(0u, tail, full > 0u && tail + fresh <= WG && tail_here);
    var runs = stored_runs;
    var start = 0u;
    var end = 0u;
    if s > 0u {
        let per = select(max((stored + ns - 1u) / ns, MIN_CHUNK), full, cut > 0u);
        start = min((s - 1u) * per, stored - cut);
        end = min(start + per, stored - cut);
    } else {
        if fresh == 0u {
            start = stored - cut;
            end = stored;
        } else {
            // The tail's positions and the new ones (cut > 0 only if lo <= len - cut; a step
            // of more than the window starts at lo).
            runs = seg_runs(max(slen - cut, lo), stot, seg);
            end = cut + fresh;
        }
        // This workgroup writes and reads the new rows: with several row groups (GQ > G),
        // each row group's split 0 writes the same rows (the same words, the same values: no
        // other workgroup reads them in this dispatch), as it cannot wait for another's.
        write_new_rows(lid, b, h, len);
        storageBarrier();
    }
    if K_ROTATED {
        rotate_query(lid, b, h);
    }

    let c = lid % VC;
    let j = lid / VC;
    var m$g = NEG;
    // The softmax sum of this invocation's own tokens (one per tile, the one it scores): kept
    // by the token's owner, once, rather than by every V column's invocation once per token
    // (4 of the V loop's 37 instructions a token); summed over the workgroup at the end.
    var l$g = 0.0;
    var acc$g = vec4<f32>(0.0);
    var acc2$g = vec4<f32>(0.0);
    let row0 = seg_row(b, h, seg.seg_start, seg);
#if CHUNK && EXACT
    // Row g's codes end where its ring starts (the RECENT positions up to its own are exact).
    let xend$g = x_ring_lo(xlo, first + $gu / G);
#endif

    for (var t0 = start; t0 < end; t0 += WG) {
        let tn = min(WG, end - t0);
#if CHUNK
        // The previous tile's V loop has read the weights, which share tile_sh.
        workgroupBarrier();
#endif
        // Keys: one token per thread; k_scores sets sc$g.
        sc$g = 0.0;
        if lid < tn {
            k_scores(row0 + run_slot(t0 + lid, runs));
        }
        // Whether row g attends this thread's token: in a chunk, its own causal end and
        // window start (the runs hold positions from lo on).
#if CHUNK
        let pos = run_pos(t0 + lid, runs, lo, seg);
#if EXACT
        let ok$g = lid < tn && pos < xend$g;
#else
        let f$g = first + $gu / G;
        let ok$g = lid < tn && pos < f$g && (!RING || pos >= f$g - min(f$g, WIN));
#endif
#else
        let ok$g = lid < tn;
#endif
#include "kernels/softmax_tile.wgsl"
        var vs = 1.0;
        if V_VSCALE {
            // Lanes past the tile read the tile's last row (their weight is 0), not rows past
            // the run (or the buffer).
            vs = v_row_scale(row0 + run_slot(t0 + min(lid, tn - 1u), runs));
        }
        {{weights}}[lid * GP + $g / 4u][$g % 4u] = pw$g * vs;
        workgroupBarrier();
        // Values: thread (c, j) accumulates columns VW c .. VW c + VW - 1 over tokens j, j+J, ...
        if j < J {
            acc$g *= alpha$g;
            acc2$g *= alpha$g;
            // Rows are loaded in batches, all of a batch before any math: a lone load per token
            // would leave the loop waiting on memory latency once per token. A full tile takes
            // VBF rows a batch where that is faster (KernelConfig::v_batch_full: more loads in
            // flight for the long contexts), then VB (32 values per invocation, divided among
            // a chunk's tokens), then one.
            var i = j;
            if VBF > VB && tn == WG {
                for (; i + (VBF - 1u) * J < tn; i += VBF * J) {
                    let v$x = v_load(row0 + run_slot(t0 + i + $x * J, runs), c);
                    let p$g$x = {{weights}}[(i + $x * J) * GP + $g / 4u][$g % 4u];
                    acc$g += p$g$x * v$x[0];
                    if VW == 8u { acc2$g += p$g$x * v$x[1]; }
                }
            }
            for (; i + (VB - 1u) * J < tn; i += VB * J) {
                let v$w = v_load(row0 + run_slot(t0 + i + $w * J, runs), c);
                let p$g$w = {{weights}}[(i + $w * J) * GP + $g / 4u][$g % 4u];
                acc$g += p$g$w * v$w[0];
                if VW == 8u { acc2$g += p$g$w * v$w[1]; }
            }
            for (; i < tn; i += J) {
                let v = v_load(row0 + run_slot(t0 + i, runs), c);
                let p$g = {{weights}}[i * GP + $g / 4u][$g % 4u];
                acc$g += p$g * v[0];
                if VW == 8u { acc2$g += p$g * v[1]; }
            }
        }
    }

    // The softmax sum over the workgroup's invocations (all share m), as the tile max: MXP
    // partial sums of 16, then every invocation adds the MXP of them. (The scores and mx_sh
    // were last read before the last tile's final barrier; in a chunk the weights share the
    // scores' array, and the V loop has just read them.)
#if CHUNK
    workgroupBarrier();
#endif
#include "kernels/softmax_sum.wgsl"

    // Merge the J token lanes into lane 0 (all lanes share m): lanes J - 1, ..., 1 in turn add
    // their sums into {{lanes}} (the first writes it), one barrier each, then lane 0 adds it to
    // its own sums and writes the partial. (Lane by lane into lane 0 took two barriers a lane.)
    for (var r = J - 1u; r > 0u; r--) {
        if j == r {
            var a$g = acc$g;
            var a2$g = acc2$g;
            if r < J - 1u {
                a$g += {{lanes}}[($g * VC + c) * (VW / 4u)];
                if VW == 8u { a2$g += {{lanes}}[($g * VC + c) * 2u + 1u]; }
            }
            {{lanes}}[($g * VC + c) * (VW / 4u)] = a$g;
            if VW == 8u { {{lanes}}[($g * VC + c) * 2u + 1u] = a2$g; }
        }
        workgroupBarrier();
    }
    if j == 0u {
        if J > 1u {
            acc$g += {{lanes}}[($g * VC + c) * (VW / 4u)];
            if VW == 8u { acc2$g += {{lanes}}[($g * VC + c) * 2u + 1u]; }
        }
        let pi = (pb * QH + hq) * PSLOTS + split_slot(s);
        if $gu / G < nz && row_real(hq, $gu) { write_partial($gu, pi, part_ml, c, acc$g, acc2$g, m$g, l$g); }
    }
}

const RED_WG: u32 = 256u;
// A rotor or iso V is un-rotated by group (VGROUPS of VGW coordinates), one invocation each.
const V_GROUPED: bool = V_KIND == KIND_ROTOR || V_KIND == KIND_ISO;
const VGW: u32 = select(4u, 3u, V_KIND == KIND_ROTOR);
const VGROUPS: u32 = (D + VGW - 1u) / VGW;
// Output columns (4 values each) and split lanes of the reduce workgroup.
const RC: u32 = PV4;
const RL: u32 = RED_WG / RC;
// Each lane folds RP = min(ceil(SPLITS_TOTAL / RL), 16) split slots per pass, so one pass
// usually covers every split with few slots past the last.
var<workgroup> lane_ml: array<vec2<f32>, RL>;
var<workgroup> lane_acc: array<vec4<f32>, RED_WG>;
#if EXACT
// A rotated V's exact output, weighted, added as the un-rotated output is stored.
var<workgroup> rx_sh: array<vec4<f32>, D / 4u>;
#endif

// Value i of a rotated V's exact output as the reduce adds it to the un-rotated output (0
// without exact tokens).
fn rx_add(i: u32) -> f32 {
#if EXACT
    return rx_sh[i / 4u][i % 4u];
#else
    return 0.0;
#endif
}

// Dispatch (QH, NB, 1), or (QH, NB, count) for a chunk's slice: merges the partials of one query
// head into out[b, first + z, qh, :].
// Thread (c, r) folds splits r, r+RL, ... of column vector c with the online-softmax rule; it
// issues all its loads (each split's (max, sum) and output vector) before any math, so a pass
// is one round trip to memory, and the lanes then merge in a tree. Its latency is what costs;
// loading the output vectors beside the (max, sum) pairs, not after them, and the old length
// at the start, not the end, shortened it (BENCHMARKS.md, "Kernel choices, measured").
@compute @workgroup_size(RED_WG)
fn reduce(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    // V's diagonal for the un-rotation, published by the barriers below.
    load_diag(lid, RED_WG, false, true);
    // A rotor or iso V: this invocation's group matrix for the un-rotation, loaded now beside
    // the partials (after the merge it would cost a round trip to memory).
    var um = mat4x4<f32>();
    if V_GROUPED && lid < VGROUPS {
        um = group_matrix(V_KIND, V_ROT, lid);
    }
    let qh = wid.x;
    let b = wid.y;
    // The query's row of the slice's [NB, count] partials and of the [NB, nq] outputs (z: the
    // slice's query, as in split).
#if CHUNK
    let pb = b * chunk.count + wid.z;
    let qb = b * chunk.n + chunk.first + wid.z;
    let part_ml = chunk.count * part_ml_at();
#else
    let pb = b;
    let qb = b;
    let part_ml = part_ml_at();
#endif
    // The committing invocation reads the length now, beside the partials.
    let commits = qh == 0u && lid == 0u && wid.z == 0u;
    var old_len = 0u;
    if commits {
        old_len = committed_len(b);
    }
    // The head's sink logit (loaded beside the partials too), or none.
    var sk = NEG;
    if SINKS != NO_SINKS {
        sk = bitcast<f32>(lens[SINKS + seg.layer * QH + qh]);
    }
    let base = (pb * QH + qh) * PSLOTS;
    let c = lid % RC;
    let r = lid / RC;
#if EXACT
    // The exact tokens' slot, loaded beside the partials (after the merge each load cost a
    // round trip to memory): its (max, sum), and lane 0's share of its D-wide output.
    let mlx = part[part_ml + base + SPLITS_TOTAL];
    var xo = vec4<f32>(0.0);
    if r == 0u && c < D / 4u {
        xo = part[(base + SPLITS_TOTAL) * PV4 + c];
    }
#endif
    var m = NEG;
    var l = 0.0;
    var o = vec4<f32>(0.0);
    let slots = split_slots();
    if r < RL {
        for (var s = r; s < slots; s += RP * RL) {
            // Slot p: split s + p RL, or (past the last split) the last split at weight 0.
            let s$p = min(s + $p * RL, slots - 1u);
            let ml$p = part[part_ml + base + s$p];
            let a$p = part[(base + s$p) * PV4 + c];
            // Expanded lines run one after another: take the pass max, rescale once, then add.
            var mb = m;
            mb = max(mb, ml$p.x);
            let f = exp(m - mb);
            o *= f;
            l *= f;
            let w$p = select(0.0, exp(ml$p.x - mb), s + $p * RL < slots);
            o += a$p * w$p;
            l += ml$p.y * w$p;
            m = mb;
        }
    }
    // Tree merge of the RL lanes into lane 0: at each level lane r < w takes lane r + w.
    var w = 1u;
    for (; 2u * w < RL; w *= 2u) {}
    for (; w > 0u; w /= 2u) {
        if r < RL && r >= w && r < 2u * w {
            if c == 0u {
                lane_ml[r] = vec2<f32>(m, l);
            }
            lane_acc[lid] = o;
        }
        workgroupBarrier();
        if r < w && r + w < RL {
            let ml = lane_ml[r + w];
            let mn = max(m, ml.x);
            let f = exp(m - mn);
            let g = exp(ml.x - mn);
            o = o * f + lane_acc[lid + w * RC] * g;
            l = l * f + ml.y * g;
            m = mn;
        }
        workgroupBarrier();
    }
#if EXACT
    // The exact tokens' slot joins the merge: its weight xs scales its output (in the
    // caller's domain, added below).
    let mx = max(m, mlx.x);
    let fr = exp(m - mx);
    var fx = exp(mlx.x - mx);
    m = mx;
    l = l * fr + mlx.y * fx;
    o *= fr;
#endif
    // A sink logit joins the denominator and carries no value (an empty sequence's output
    // stays zeros, its log-sum-exp becomes the sink's).
    if SINKS != NO_SINKS {
        let ms = max(m, sk);
        let f = exp(m - ms);
        l = l * f + exp(sk - ms);
        o *= f;
#if EXACT
        fx *= f;
#endif
        m = ms;
    }
#if EXACT
    let xs = select(0.0, fx / l, l > 0.0);
#endif
    // An empty sequence has l = 0: its output is defined as zeros.
    let y = o * select(0.0, 1.0 / l, l > 0.0);
    let p = (qb * QH + qh) * D;
#if CHUNK
    var qmu = 0.0;
#if KMEAN
    // Scores were taken against K less its mean (shared/exact.wgsl): the log-sum-exp adds
    // q . mean back, summed over the workgroup (lane_acc is free after the merge).
    if chunk.lse != 0u {
        workgroupBarrier();
        var d = 0.0;
        if lid < D / 4u && lens[len_index(seg.layer, b)] >= SINK {
            let o = (qb * QH + qh) * D + 4u * lid;
            d = dot(vec4<f32>(q_in[o], q_in[o + 1u], q_in[o + 2u], q_in[o + 3u]) * SCALE, kmu_load(b, qh / GQ, lid));
        }
        lane_acc[lid] = vec4<f32>(d, 0.0, 0.0, 0.0);
        workgroupBarrier();
        if lid == 0u {
            for (var i = 0u; i < D / 4u; i++) {
                qmu += lane_acc[i].x;
            }
        }
    }
#endif
    // The row's log-sum-exp (NEG for an empty sequence without a sink logit): lane 0 holds
    // the merged (m, l).
    if chunk.lse != 0u && lid == 0u {
        lse_out[qb * QH + qh] = select(NEG, m + log(l) + qmu, l > 0.0);
    }
#endif
    if V_ROTATED {
        // The output is still in the V codec's rotated domain: un-rotate it once, here.
        if r == 0u {
            rs_set(4u * c, y.x);
            rs_set(4u * c + 1u, y.y);
            rs_set(4u * c + 2u, y.z);
            rs_set(4u * c + 3u, y.w);
#if EXACT
            if c < D / 4u {
                rx_sh[c] = xo * xs;
            }
#endif
        }
        workgroupBarrier();
        if V_GROUPED {
            // x = M^T y per group.
            if lid < VGROUPS {
                let k = VGW * lid;
                var y = vec4<f32>(rs_get(k), rs_get(k + 1u), rs_get(k + 2u), 0.0);
                // (Not a select: it would read rot_sh past its end for rotor's last group.)
                if VGW == 4u {
                    y.w = rs_get(k + 3u);
                }
                let x = um * y;
                for (var e = 0u; e < VGW; e++) {
                    if k + e < D {
                        out[p + k + e] = x[e] + rx_add(k + e);
                    }
                }
            }
        } else {
            rotate_rows(V_KIND, V_ROT, 1u, lid, RED_WG, true);
            for (var i = lid; i < D; i += RED_WG) {
                out[p + i] = rs_get(i) + rx_add(i);
            }
        }
    } else if r == 0u {
        var z = y;
#if EXACT
        z += xo * xs;
#endif
        out[p + 4u * c] = z.x;
        out[p + 4u * c + 1u] = z.y;
        out[p + 4u * c + 2u] = z.z;
        out[p + 4u * c + 3u] = z.w;
    }
    if commits {
        commit_step(b, old_len);
    }
}
