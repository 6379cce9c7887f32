// The prefill kernel: a chunk slice's attention tiled over queries and keys, for long chunks
// (prompts). Included by the chunk module after kernels/attention.wgsl, whose partial slots and
// reduce it shares: each workgroup writes, for every query row of its tile, the same partial
// (max, sum, un-normalised output) the chunk's split kernel would write for that split.
//
// Where the split kernel decodes a K/V tile for the 8 query rows of one workgroup and scores
// one key per invocation against every row, a prefill workgroup serves PBR query rows
// (8 row groups of PRB rows: up to 32) of one KV head and decodes each K/V tile once into
// workgroup memory for all of them; each invocation then multiplies a block of PRB rows by 4
// keys (scores) and PRB rows by PVU output vectors (values) out of workgroup memory, so a
// load feeds several multiply-adds and a decoded value serves every row of the tile.
//
// Rows are (token, head) pairs of the slice: row r is its token r / GQ, head r % GQ of the
// KV head's whole GQA group (the split kernel's row groups do not apply: rows are tiled). A rotated K's queries are rotated first, by `prefill_q` (the split kernel's own
// rotation, into scratch after the slice's partials), so the tile loads them as they are.
// With exact tokens, one more workgroup per row tile attends them as exact_partial does
// (f16 rows in the caller's domain, K less its mean), the same tile loop over other loads.
#unroll $i PRB
#unroll $j PKT
#unroll $u PVU
#unroll $r QV
#unroll $l PLK
#unroll $m PLV

// The tiles' element type: f32, or with PH (the cache's fast precision on an adapter with
// shader-f16) f16 operands whose products are summed in f16, at most 16 to a sum (32 of a
// K pass's coordinates in two lanes; 16 V rows), and then added into the f32 scores and outputs; the
// softmax, its maxima and sums stay f32.
#if PH
alias pf = f16;
#else
alias pf = f32;
#endif
alias pf4 = vec4<pf>;

// A score's partial sum over a K pass's columns, and its products of one vec4 column: with
// f16, two lanes of f16 (each takes two products a column, at most 16 to a sum) then two
// conversions into f32; with f32, one scalar. Either way the accumulator takes the fewest
// registers (a vec4 of them held 32 more with f16, 48 more with f32) for the same multiply-adds.
#if PH
alias pacc = vec2<f16>;

fn pfma(q: pf4, k: pf4, h: pacc) -> pacc {
    return fma(q.zw, k.zw, fma(q.xy, k.xy, h));
}

fn psum(h: pacc) -> f32 {
    return f32(h.x) + f32(h.y);
}
#else
alias pacc = f32;

fn pfma(q: pf4, k: pf4, h: pacc) -> pacc {
    return fma(q.w, k.w, fma(q.z, k.z, fma(q.y, k.y, fma(q.x, k.x, h))));
}

fn psum(h: pacc) -> f32 {
    return h;
}
#endif

// Invocations: PTR row groups of PTK lanes; each lane scores PKT keys of a tile.
const PWG: u32 = PTR * PTK;
const PBC: u32 = PTK * PKT;
// vec4s of a query row, and vec4 columns of K decoded per pass of the K/V tile.
const PQW4: u32 = PQW / 4u;
const PKC: u32 = PKV / (4u * PBC);
// K columns summed before the sum goes into f32: with f16, PF16_SUM / 2 (each of the
// accumulator's two lanes takes two products a column); with f32, a whole pass.
#if PH
const PKS: u32 = PF16_SUM / 2u;
#else
const PKS: u32 = PKC;
#endif

// The query tile: PBR rows of PQW values (a rotated K's codes' coordinates, then QJL's S q).
var<workgroup> pq_sh: array<pf4, PBR * PQW4>;
// The K/V tile: PKC vec4 columns of PBC keys (column-major, so lanes read neighbouring keys),
// then PVK decoded V rows of PV4 vec4s.
var<workgroup> pkv_sh: array<pf4, PKV / 4u>;
// Softmax weights, key-major: per key, each row group's PRB rows as one vec4.
var<workgroup> pp_sh: array<pf4, PBC * PTR>;
// Per-lane row maxima, then sums, exchanged within a row group.
var<workgroup> pm_sh: array<vec4<f32>, PWG>;

// Where a rotated K's rotated queries lie in the scratch: after the slice's partials.
fn prefill_q_base() -> u32 {
    return chunk.count * (part_ml_at() + NB * QH * PSLOTS);
}

// Row of (sequence b, token z of the slice, query head qh) in the slice's [NB, count, QH]
// queries and partials.
fn prefill_row(b: u32, z: u32, qh: u32) -> u32 {
    return (b * chunk.count + z) * QH + qh;
}

// vec4 c of row r's query (of KV head h): rotated by prefill_q, or scaled from q_in (`plain`:
// in the caller's domain whatever K's codec, for the exact tokens); zeros for a row past the
// slice's `rows` (a tile's padding).
fn prefill_query(b: u32, h: u32, r: u32, c: u32, rows: u32, plain: bool) -> vec4<f32> {
    if r >= rows {
        return vec4<f32>(0.0);
    }
    let qh = h * GQ + r % GQ;
    if K_ROTATED && !plain {
        return part[prefill_q_base() + prefill_row(b, r / GQ, qh) * PQW4 + c];
    }
    if c >= D / 4u {
        return vec4<f32>(0.0);
    }
    let o = ((b * chunk.n + chunk.first + r / GQ) * QH + qh) * D + 4u * c;
    return vec4<f32>(q_in[o], q_in[o + 1u], q_in[o + 2u], q_in[o + 3u]) * SCALE;
}

// Dispatch (KVH * NB * NRG, 1, ceil(count / CQ)) per slice, before `prefill`, for a rotated K
// only: rotates the queries of CQ tokens (GR rows: G heads of a row group, as the split
// kernel's) as the split kernel does and stores them, with QJL's S q, in the scratch.
@compute @workgroup_size(WG)
fn prefill_q(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let rg = wid.x % NRG;
    let h = (wid.x / NRG) % KVH;
    let b = wid.x / NRG / KVH;
    let hq = h * GQ + rg * G;
    let z = wid.z * CQ;
    let nz = min(CQ, chunk.count - z);
    qv$r = query_task(b * chunk.n + chunk.first + z, hq, nz, lid + $ru * WG);
    load_diag(lid, WG, K_QJL, false);
    rotate_query(lid, b, h);
    workgroupBarrier();
    for (var i = lid; i < GR * PQW4; i += WG) {
        let g = i / PQW4;
        let c = i % PQW4;
        if g / G < nz && row_real(hq, g) {
            var x: vec4<f32>;
            if c < PQA / 4u {
                x = rot_sh[g * (RW / 4u) + c];
            } else {
                x = sq_sh[g * (D / 4u) + c - PQA / 4u];
            }
            part[prefill_q_base() + prefill_row(b, z + g / G, hq + g % G) * PQW4 + c] = x;
        }
    }
}

// The K/V tile is filled a step ahead: each invocation loads its share of the next K pass
// (PLK vec4s) or V batch (PLV slots) into registers before the products of the current one,
// and stores them after the next barrier, so that a pass's memory latency can hide behind
// the current pass's products. The tile's keys are t0 .. t0 + tn; lanes past them load its last key (masked
// later). The exact workgroup (xw) loads the exact rows (f16, in the caller's domain) from
// the sink's ns positions and the ring's from rl.
struct PrefillSrc {
    t0: u32,
    tn: u32,
    row0: u32,
    runs: vec3<u32>,
    xw: bool,
    b: u32,
    h: u32,
    ns: u32,
    rl: u32,
}

// Vec4 x of the K pass at vec4 column cc: column cc + x / PBC of key x % PBC.
fn prefill_k(x: u32, cc: u32, s: PrefillSrc) -> pf4 {
    let u = s.t0 + min(x % PBC, s.tn - 1u);
    let c = cc + x / PBC;
    // Columns past D of an f16 or int K row or an exact row (a head size that is no multiple
    // of 32: the query rows are padded to whole passes) are zeros.
    if D % 32u != 0u && (s.xw || !K_ROTATED) && c >= D / 4u {
        return pf4(0.0);
    }
#if EXACT
    if s.xw {
        var k = x_load(s.b, s.h, x_pos(u, s.ns, s.rl), 0u, c);
#if KMEAN
        k -= xmu_sh[c];
#endif
        return pf4(k);
    }
#endif
    return pf4(k_dec4(s.row0 + run_slot(u, s.runs), c));
}

// V slots of a row: 8 values each (one v_load of a rotated V, two of another, two vec4s of
// an exact row), held as tile values, so a lane's step-ahead registers are two pf4 a slot.
fn prefill_v_width(xw: bool) -> u32 {
    return select(VC * VW / 8u, D / 8u, xw);
}

// V slot x of the batch of rows vb .. of the tile (values 8 (x % width) .. of its row), its
// row's scale applied.
fn prefill_v(x: u32, vb: u32, s: PrefillSrc) -> array<pf4, 2> {
    let w = prefill_v_width(s.xw);
    let u = s.t0 + min(vb + x / w, s.tn - 1u);
    let c = x % w;
#if EXACT
    if s.xw {
        let p = x_pos(u, s.ns, s.rl);
        return array<pf4, 2>(pf4(x_load(s.b, s.h, p, xv(), 2u * c)), pf4(x_load(s.b, s.h, p, xv(), 2u * c + 1u)));
    }
#endif
    let row = s.row0 + run_slot(u, s.runs);
    var vs = 1.0;
    if V_VSCALE {
        vs = v_row_scale(row);
    }
    if VW == 8u {
        let v = v_load(row, c);
        return array<pf4, 2>(pf4(v[0] * vs), pf4(v[1] * vs));
    }
    return array<pf4, 2>(pf4(v_load(row, 2u * c)[0] * vs), pf4(v_load(row, 2u * c + 1u)[0] * vs));
}

// Stores V slot x (loaded by prefill_v) into the tile, PV4 vec4s a row (lanes past the batch's
// slots store nothing).
fn prefill_v_store(x: u32, v: array<pf4, 2>, xw: bool) {
    let w = prefill_v_width(xw);
    if x < PVK * w {
        let at = (x / w) * PV4 + 2u * (x % w);
        pkv_sh[at] = v[0];
        pkv_sh[at + 1u] = v[1];
    }
}

// (With matrix units, MM, kernels/prefill_matrix.wgsl's `prefill` takes this one's place.)
#if !MM
// Dispatch (KVH * NB, chunk.splits + 1 (+ 1 with exact tokens), ceil(count GQ / PBR)) per segment, then
// the reduce: workgroup (s, z) attends the rows PBR z .. of one KV head over split s of the
// positions the tile's rows attend in this segment (whole 64-key tiles), each row masked to
// its own causal end and window; with exact tokens, the codes up to each row's ring start,
// and the first segment's workgroup chunk.splits + 1 the exact rows (f16, in the caller's domain,
// into the exact slot, as exact_partial).
@compute @workgroup_size(PWG)
fn prefill(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let s = wid.y;
    let h = wid.x % KVH;
    let b = wid.x / KVH;
    let rows = chunk.count * GQ;
    let rb = wid.z * PBR;
    let tr = lid / PTK;
    let tk = lid % PTK;
    // The exact workgroup (uniform): only the first segment's attends.
    let xw = EXACT && s == nsplit() + 1u;
    if xw && seg.split_base != 0u {
        return;
    }
    // Query and value widths in vec4s: the codes', or D for the exact rows.
    let qw4 = select(PQW4, (D / 4u + PKC - 1u) / PKC * PKC, xw);
    let vw4 = select(PV4, D / 4u, xw);
    for (var i = lid; i < PBR * PQW4; i += PWG) {
        pq_sh[i] = pf4(prefill_query(b, h, rb + i / PQW4, i % PQW4, rows, xw));
    }
    k_load_levels(lid);
    v_load_levels(lid);
    if lid == 0u {
        len_sh = lens[len_index(seg.layer, b)];
#if EXACT
        // (Loaded beside the length: one round trip for both.)
        xlo_sh = x_at(b);
#endif
    }
    // (Its barrier also publishes the query tile and the level tables.)
    let len = workgroupUniformLoad(&len_sh);
    // Slice token z attends the positions before base + z + 1 (its own included), the last
    // WIN of them with a sliding window.
    let base = len - chunk.appended + chunk.first;
    let e_lo = base + rb / GQ + 1u;
    let e_hi = base + (min(rb + PBR, rows) - 1u) / GQ + 1u;
    // This invocation's rows (of its row group) and their causal ends.
    let e$i = base + (rb + tr * PRB + $iu) / GQ + 1u;
#if EXACT
    let xlo = workgroupUniformLoad(&xlo_sh);
#if KMEAN
    // The codes hold K less its mean: the exact rows are scored less it too.
    x_load_mean(lid, b, h, len, len);
    workgroupBarrier();
#endif
    // Codes from the sink's end up to each row's ring start (the exact workgroup attends the
    // rest): the tile's range ends at its last row's.
    let lo = min(SINK, e_hi);
    let hi = min(e_hi, max(SINK, x_ring_lo(xlo, e_hi)));
    let xend$i = x_ring_lo(xlo, e$i);
    // The exact rows: the sink's ns positions, then the ring's from rl (the first row's ring
    // start; each row masks its own).
    let ns = min(SINK, e_hi);
    let rl = max(ns, x_ring_lo(xlo, e_lo));
#else
    let lo = e_lo - min(e_lo, WIN);
    let hi = e_hi;
    let ns = 0u;
    let rl = 0u;
#endif
    let runs = seg_runs(lo, hi, seg);
    let stored = runs.y + runs.z;
    let per = ((stored + nsplit()) / (nsplit() + 1u) + PBC - 1u) / PBC * PBC;
    var start = min(s * per, stored);
    var end = min(start + per, stored);
#if EXACT
    if xw {
        start = 0u;
        end = ns + (e_hi - rl);
    }
#endif
    let row0 = seg_row(b, h, seg.seg_start, seg);
    var m$i = NEG;
    var l$i = 0.0;
    var o$i$u = vec4<f32>(0.0);

    for (var t0 = start; t0 < end; t0 += PBC) {
        let tn = min(PBC, end - t0);
        let src = PrefillSrc(t0, tn, row0, runs, xw, b, h, ns, rl);
        // Scores: K decoded PKC vec4 columns a pass, the next pass's loads in flight during
        // this one's products.
        var s$i$j = 0.0;
        var kn$l = prefill_k(lid + $lu * PWG, 0u, src);
        for (var cc = 0u; cc < qw4; cc += PKC) {
            // The previous pass (or tile's V rows) has been read.
            workgroupBarrier();
            pkv_sh[lid + $lu * PWG] = kn$l;
            workgroupBarrier();
            if cc + PKC < qw4 {
                kn$l = prefill_k(lid + $lu * PWG, cc + PKC, src);
            }
            for (var c0 = 0u; c0 < PKC; c0 += PKS) {
                var h$i$j = pacc(0.0);
                for (var c = c0; c < c0 + PKS; c++) {
                    let q$i = pq_sh[(tr * PRB + $iu) * PQW4 + cc + c];
                    let k$j = pkv_sh[c * PBC + tk + $ju * PTK];
                    h$i$j = pfma(q$i, k$j, h$i$j);
                }
                s$i$j += psum(h$i$j);
            }
        }
        s$i$j = capped(s$i$j);
#if EXACT
        var pos$j: u32;
        var ok$i$j: bool;
        if xw {
            pos$j = x_pos(t0 + tk + $ju * PTK, ns, rl);
            ok$i$j = tk + $ju * PTK < tn && pos$j < e$i && (pos$j < SINK || pos$j >= xend$i);
        } else {
            pos$j = run_pos(t0 + tk + $ju * PTK, runs, lo, seg);
            ok$i$j = tk + $ju * PTK < tn && pos$j < xend$i;
        }
#else
        let pos$j = run_pos(t0 + tk + $ju * PTK, runs, lo, seg);
        let ok$i$j = tk + $ju * PTK < tn && pos$j < e$i && pos$j >= e$i - min(e$i, WIN);
#endif
        // The first V batch's loads, in flight during the softmax.
        var vn$m = prefill_v(lid + $mu * PWG, 0u, src);
        // Online softmax per row: the lanes of a row group exchange their maxima, so every lane
        // of the group derives the same max (and the same rescale of its outputs).
        var mx = vec4<f32>(NEG);
        mx[$iu] = max(mx[$iu], select(NEG, s$i$j, ok$i$j));
        pm_sh[lid] = mx;
        workgroupBarrier();
        var mt = vec4<f32>(NEG);
        for (var x = 0u; x < PTK; x++) {
            mt = max(mt, pm_sh[tr * PTK + x]);
        }
        let mn$i = max(m$i, mt[$iu]);
        let al$i = exp(m$i - mn$i);
        m$i = mn$i;
        // (With f16 weights the sums add them as rounded, so that a weight the f16 tile
        // flushes to zero leaves the sum as it leaves the output.)
        let p$i$j = f32(pf(select(0.0, exp(s$i$j - mn$i), ok$i$j)));
        l$i *= al$i;
        l$i += p$i$j;
        o$i$u *= al$i;
        var pw$j = vec4<f32>(0.0);
        pw$j[$iu] = p$i$j;
        pp_sh[(tk + $ju * PTK) * PTR + tr] = pf4(pw$j);
        // Values: PVK rows decoded at a time (a rotated V in its rotated domain, the reduce
        // un-rotates; a row's one scale applied here), then each lane adds its row group's
        // weighted rows to its output vectors tk, tk + PTK, ...
        for (var vb = 0u; vb < tn; vb += PVK) {
            // The weights are written, the previous V rows (or the last K pass) read.
            workgroupBarrier();
            prefill_v_store(lid + $mu * PWG, vn$m, xw);
            workgroupBarrier();
            if vb + PVK < tn {
                vn$m = prefill_v(lid + $mu * PWG, vb + PVK, src);
            }
            let vn = min(PVK, tn - vb);
            // (Summed in pf over the batch's at most 16 rows, then into the f32 outputs.)
            var oh$i$u = pf4(0.0);
            for (var t = 0u; t < vn; t++) {
                let pr = pp_sh[(vb + t) * PTR + tr];
                let v$u = pkv_sh[t * PV4 + min(tk + $uu * PTK, PV4 - 1u)];
                oh$i$u = fma(pf4(pr[$iu]), v$u, oh$i$u);
            }
            o$i$u += vec4<f32>(oh$i$u);
        }
    }

    // Each row's sum over its group's lanes, then the partials (split s of this segment).
    workgroupBarrier();
    var lv = vec4<f32>(0.0);
    lv[$iu] = l$i;
    pm_sh[lid] = lv;
    workgroupBarrier();
    var lt = vec4<f32>(0.0);
    for (var x = 0u; x < PTK; x++) {
        lt += pm_sh[tr * PTK + x];
    }
    let part_ml = chunk.count * part_ml_at();
    let ri$i = rb + tr * PRB + $iu;
    // (The exact rows' slot is the last, SPLITS_TOTAL; their outputs are D wide.)
    let slot = select(split_slot(s), SPLITS_TOTAL, xw);
    let at$i = prefill_row(b, ri$i / GQ, h * GQ + ri$i % GQ) * PSLOTS + slot;
    if ri$i < rows && tk + $uu * PTK < vw4 { part[at$i * PV4 + tk + $uu * PTK] = o$i$u; }
    if ri$i < rows && tk == 0u { part[part_ml + at$i] = vec4<f32>(m$i, lt[$iu], 0.0, 0.0); }
}
#endif
