// Workgroup-cooperative encoding of new rows for the rotated codecs (their codes depend on
// the whole row: norm, rotation, bit packing across words). The caller lists up to ER rows
// in enc_dst / enc_src and calls encode_rows; the per-side encode_rows_k / encode_rows_v come
// from the codec files (empty for codecs encoded by independent tasks: f16, q8, q4).

// enc_dst entry of a row that lies outside this dispatch's segment: computed, not written.
const NO_ROW: u32 = 0xffffffffu;

var<workgroup> enc_dst: array<u32, ER>;
// Pair index (as for in_pair_k / in_pair_v) of the row's first input value.
var<workgroup> enc_src: array<u32, ER>;
var<workgroup> enc_x: array<f32, ER * RW>;
var<workgroup> enc_code: array<u32, ER * RW>;
var<workgroup> enc_s: array<f32, ER * SIDE_MAX>;
var<workgroup> enc_n: array<f32, ER>;
var<workgroup> enc_rn: array<f32, ER>;

// Encodes the nr listed rows of both sides (every invocation calls it; barriers inside).
fn encode_rows(lid: u32, nt: u32, nr: u32) {
    workgroupBarrier();
    encode_rows_k(lid, nt, nr);
    encode_rows_v(lid, nt, nr);
}
