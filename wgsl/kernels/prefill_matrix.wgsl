// The prefill kernel on matrix units: the same dispatch, rows, splits and partials as
// kernels/prefill.wgsl (which it replaces in the chunk module where MM is on), with Q·Kᵀ and
// P·V as f16 matrix products summed in f32: wgpu's cooperative matrices (tensor cores,
// Apple's simdgroup matrices) where MMN is on, else the same products written out per
// invocation (the emulation: the kernel's tiling, decode, masks and softmax, tested where no
// adapter has matrix units).
//
// A workgroup of PWG invocations (4 subgroups) serves MR = MRF MF (token, head) rows of one
// KV head (MRF: 2, or 1 where the adapter's workgroup memory holds only that) over tiles of
// MT = 2 MF keys. Per tile:
// 1. K decoded into an f16 tile MKP coordinates at a time (the next pass's loads in
//    registers during this pass's products); S = Q·Kᵀ accumulates in one MF × MF fragment per
//    subgroup over the passes (with one row fragment, two subgroups a fragment, each over every
//    other MF coordinates: MSK = 2 partial sums), then goes to workgroup memory.
// 2. The online softmax: ML lanes per row mask their keys (causal end, window), exchange
//    maxima, write P as f16 and rescale the row's output, which lives in workgroup memory (f32).
// 3. V decoded into the same f16 tile MVB values at a time (rows padded with zeros to PVM); O += P·V on fragments loaded from
//    and stored back to the output rows.
// The rows' Q stays in an f16 tile for the whole kernel. Exact tokens are not served here
// (the cache keeps the FP32 kernel for them).
#unroll $l MLK
#unroll $v MLV
#unroll $e ME
#unroll $j MKL

#if MMN
#if MF == 16
alias mm_a = coop_mat16x16<f16, A>;
alias mm_b = coop_mat16x16<f16, B>;
alias mm_c = coop_mat16x16<f32, C>;
#else
alias mm_a = coop_mat8x8<f16, A>;
alias mm_b = coop_mat8x8<f16, B>;
alias mm_c = coop_mat8x8<f32, C>;
#endif
#endif

// The f16 tiles, led by a vec4 so that their rows (padded by 8 values: 16 bytes) start
// 16-byte aligned, as fragment loads want: the rows' queries (MR × PQW), the K pass or V
// block (MT × MKP or MT × MVB), the softmax weights (MR × MT).
struct MmTiles {
    align: vec4<f32>,
    q: array<f16, MR * MQS>,
    kv: array<f16, MT * MKS>,
    p: array<f16, MR * MPS>,
}
var<workgroup> mm: MmTiles;
// The tile's scores (MSK partial sums of MR × MT), and the rows' un-normalised outputs
// (MR × PVM), f32, 16-byte aligned as the fragments loaded from and stored to them want.
struct MmRows {
    align: vec4<f32>,
    s: array<f32, MSK * MR * MSS>,
    o: array<f32, MR * MOS>,
}
var<workgroup> mr: MmRows;
// Per-lane maxima, then sums, exchanged between the ML lanes of a row.
var<workgroup> mm_x: array<f32, PWG>;

// Stores vec4 x of a K pass (loaded by mm_k) into the tile: key x / (MKP / 4), coordinates
// 4 (x % (MKP / 4)) ...
fn mm_k_store(x: u32, k: vec4<f32>) {
    if x < MT * MKP / 4u {
        let at = (x / (MKP / 4u)) * MKS + 4u * (x % (MKP / 4u));
        mm.kv[at] = f16(k.x);
        mm.kv[at + 1u] = f16(k.y);
        mm.kv[at + 2u] = f16(k.z);
        mm.kv[at + 3u] = f16(k.w);
    }
}

// Vec4 x of the K pass at vec4 column c4 of the tile's keys t0 .. t0 + tn (lanes past them
// load its last key, masked later).
fn mm_k(x: u32, c4: u32, t0: u32, tn: u32, row0: u32, runs: vec3<u32>) -> vec4<f32> {
    let key = min(x / (MKP / 4u), MT - 1u);
    let u = t0 + min(key, tn - 1u);
    return k_dec4(row0 + run_slot(u, runs), c4 + x % (MKP / 4u));
}

// V slot x of the block at value column vc of the tile's keys (8 values of a row, its
// scale applied; zeros past the row's PV values, up to PVM).
fn mm_v(x: u32, vc: u32, t0: u32, tn: u32, row0: u32, runs: vec3<u32>) -> array<vec4<f32>, 2> {
    let key = min(x / (MVB / 8u), MT - 1u);
    let row = row0 + run_slot(t0 + min(key, tn - 1u), runs);
    let c = vc / 8u + x % (MVB / 8u);
    if c >= PV / 8u {
        return array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0));
    }
    var vs = 1.0;
    if V_VSCALE {
        vs = v_row_scale(row);
    }
    if VW == 8u {
        let v = v_load(row, c);
        return array<vec4<f32>, 2>(v[0] * vs, v[1] * vs);
    }
    return array<vec4<f32>, 2>(v_load(row, 2u * c)[0] * vs, v_load(row, 2u * c + 1u)[0] * vs);
}

// Stores V slot x (loaded by mm_v) into the tile: key x / (MVB / 8), values 8 (x % (MVB / 8)) ...
fn mm_v_store(x: u32, v: array<vec4<f32>, 2>) {
    if x < MT * MVB / 8u {
        let at = (x / (MVB / 8u)) * MKS + 8u * (x % (MVB / 8u));
        for (var i = 0u; i < 4u; i++) {
            mm.kv[at + i] = f16(v[0][i]);
            mm.kv[at + 4u + i] = f16(v[1][i]);
        }
    }
}

// Dispatch as `prefill` (kernels/prefill.wgsl), MR rows a workgroup.
@compute @workgroup_size(PWG)
#if MMN
fn prefill(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_id) sg: u32) {
#else
fn prefill(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
#endif
    let s = wid.y;
    let h = wid.x % KVH;
    let b = wid.x / KVH;
    let rows = chunk.count * GQ;
    let rb = wid.z * MR;
    // This invocation's row of the softmax and the outputs, and its lane in the row.
    let r = lid / ML;
    let ln = lid % ML;
    for (var i = lid; i < MR * PQW4; i += PWG) {
        let c = i % PQW4;
        let x = prefill_query(b, h, rb + i / PQW4, c, rows, false);
        let at = (i / PQW4) * MQS + 4u * c;
        mm.q[at] = f16(x.x);
        mm.q[at + 1u] = f16(x.y);
        mm.q[at + 2u] = f16(x.z);
        mm.q[at + 3u] = f16(x.w);
    }
    for (var c = ln; c < PVM; c += ML) {
        mr.o[r * MOS + c] = 0.0;
    }
    k_load_levels(lid);
    v_load_levels(lid);
    if lid == 0u {
        len_sh = lens[len_index(seg.layer, b)];
    }
    // (Its barrier also publishes the query tile, the outputs' zeros and the level tables.)
    let len = workgroupUniformLoad(&len_sh);
    // Slice token z attends the positions before base + z + 1 (its own included), the last
    // WIN of them with a sliding window.
    let base = len - chunk.appended + chunk.first;
    let e_lo = base + rb / GQ + 1u;
    let e_hi = base + (min(rb + MR, rows) - 1u) / GQ + 1u;
    let e = base + (rb + r) / GQ + 1u;
    let lo = e_lo - min(e_lo, WIN);
    let runs = seg_runs(lo, e_hi, seg);
    let stored = runs.y + runs.z;
    let per = ((stored + nsplit()) / (nsplit() + 1u) + MT - 1u) / MT * MT;
    let start = min(s * per, stored);
    let end = min(start + per, stored);
    let row0 = seg_row(b, h, seg.seg_start, seg);
    var m = NEG;
    var l = 0.0;
#if MMN
    // The subgroup's fragment of S (row fragment sf / 2, key fragment sf % 2) and its part ks
    // of each pass's coordinates.
    let sf = sg % (2u * MRF);
    let ks = sg / (2u * MRF);
    let s_at = ks * MR * MSS + (sf / 2u) * MF * MSS + (sf % 2u) * MF;
    let q_at = (sf / 2u) * MF * MQS;
    let k_at = (sf % 2u) * MF * MKS;
#endif

    for (var t0 = start; t0 < end; t0 += MT) {
        let tn = min(MT, end - t0);
        // S = Q·Kᵀ over K passes of MKP coordinates, the next pass's loads in flight.
#if MMN
        var sacc = mm_c();
#else
        // (Per partial sum: with MSK = 2, coordinates of every other MF-wide step, as the
        // subgroup pairs split them.)
        var se$e = vec2<f32>(0.0);
#endif
        var kn$l = mm_k(lid + $lu * PWG, 0u, t0, tn, row0, runs);
        for (var cc = 0u; cc < PQW; cc += MKP) {
            // The previous pass (or the tile's last V block) has been read.
            workgroupBarrier();
            mm_k_store(lid + $lu * PWG, kn$l);
            workgroupBarrier();
            if cc + MKP < PQW {
                kn$l = mm_k(lid + $lu * PWG, (cc + MKP) / 4u, t0, tn, row0, runs);
            }
#if MMN
            for (var i = 0u; i < MKP / (MSK * MF); i++) {
                let kk = (i * MSK + ks) * MF;
                let qa = coopLoadT<mm_a>(&mm.q[q_at + cc + kk], MQS);
                let kb = coopLoad<mm_b>(&mm.kv[k_at + kk], MKS);
                sacc = coopMultiplyAdd(qa, kb, sacc);
            }
#else
            for (var kk = 0u; kk < MKP; kk++) {
                let ei$e = lid + $eu * PWG;
                let x = (kk / MF) % MSK;
                se$e[x] = fma(f32(mm.q[(ei$e / MT) * MQS + cc + kk]), f32(mm.kv[(ei$e % MT) * MKS + kk]), se$e[x]);
            }
#endif
        }
#if MMN
        coopStoreT(sacc, &mr.s[s_at], MSS);
#else
        for (var x = 0u; x < MSK; x++) {
            mr.s[x * MR * MSS + ((lid + $eu * PWG) / MT) * MSS + (lid + $eu * PWG) % MT] = se$e[x];
        }
#endif
        // The first V block's loads, in flight during the softmax.
        var vn$v = mm_v(lid + $vu * PWG, 0u, t0, tn, row0, runs);
        workgroupBarrier();
        // The online softmax of row r over its lane's keys ln, ln + ML, ...
        let key$j = ln + $ju * ML;
        let pos$j = run_pos(t0 + key$j, runs, lo, seg);
        let ok$j = key$j < tn && pos$j < e && pos$j >= e - min(e, WIN);
        var sc$j = 0.0;
        for (var x = 0u; x < MSK; x++) {
            sc$j += mr.s[x * MR * MSS + r * MSS + key$j];
        }
        // (Capped where the cache has a softcap, as every kernel's scores.)
        sc$j = select(NEG, capped(sc$j), ok$j);
        var mt = NEG;
        mt = max(mt, sc$j);
        mm_x[lid] = mt;
        workgroupBarrier();
        for (var x = 0u; x < ML; x++) {
            mt = max(mt, mm_x[r * ML + x]);
        }
        let mn = max(m, mt);
        let al = exp(m - mn);
        m = mn;
        // (The sums add the weights as rounded to f16, as the products take them.)
        let p$j = f16(select(0.0, exp(sc$j - mn), ok$j));
        mm.p[r * MPS + key$j] = p$j;
        l *= al;
        l += f32(p$j);
        for (var c = ln; c < PVM; c += ML) {
            mr.o[r * MOS + c] *= al;
        }
        // O += P·V, V decoded MVB columns at a time.
        for (var vc = 0u; vc < PVM; vc += MVB) {
            // The weights and rescaled outputs are written, the K tile (or the last V block) read.
            workgroupBarrier();
            mm_v_store(lid + $vu * PWG, vn$v);
            workgroupBarrier();
            if vc + MVB < PVM {
                vn$v = mm_v(lid + $vu * PWG, vc + MVB, t0, tn, row0, runs);
            }
#if MMN
            // (A loop the same for every subgroup: cooperative operations need uniform control flow.)
            for (var i = 0u; i < MOF; i++) {
                let f = sg * MOF + i;
                let o_at = (f / (MVB / MF)) * MF * MOS + vc + (f % (MVB / MF)) * MF;
                var oacc = coopLoadT<mm_c>(&mr.o[o_at], MOS);
                for (var kt = 0u; kt < MT; kt += MF) {
                    let pa = coopLoadT<mm_a>(&mm.p[(f / (MVB / MF)) * MF * MPS + kt], MPS);
                    let vb = coopLoadT<mm_b>(&mm.kv[kt * MKS + (f % (MVB / MF)) * MF], MKS);
                    oacc = coopMultiplyAdd(pa, vb, oacc);
                }
                coopStoreT(oacc, &mr.o[o_at], MOS);
            }
#else
            for (var i = lid; i < MR * MVB; i += PWG) {
                let orow = i / MVB;
                let oc = i % MVB;
                var acc = mr.o[orow * MOS + vc + oc];
                for (var t = 0u; t < MT; t++) {
                    acc = fma(f32(mm.p[orow * MPS + t]), f32(mm.kv[t * MKS + oc]), acc);
                }
                mr.o[orow * MOS + vc + oc] = acc;
            }
#endif
        }
    }

    // Each row's sum over its lanes, then the partials (split s of this segment).
    workgroupBarrier();
    mm_x[lid] = l;
    workgroupBarrier();
    var lt = 0.0;
    for (var x = 0u; x < ML; x++) {
        lt += mm_x[r * ML + x];
    }
    let ri = rb + r;
    if ri < rows {
        let at = prefill_row(b, ri / GQ, h * GQ + ri % GQ) * PSLOTS + split_slot(s);
        for (var c = ln; c < PV4; c += ML) {
            let o = r * MOS + 4u * c;
            part[at * PV4 + c] = vec4<f32>(mr.o[o], mr.o[o + 1u], mr.o[o + 2u], mr.o[o + 3u]);
        }
        if ln == 0u {
            part[chunk.count * part_ml_at() + at] = vec4<f32>(m, lt, 0.0, 0.0);
        }
    }
}
