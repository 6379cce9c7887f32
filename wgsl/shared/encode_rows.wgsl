// Workgroup-cooperative encoding of new rows for the rotated codecs (their codes depend on
// the whole row: norm, rotation, bit packing across words). The caller lists up to ET
// tokens' rows in enc_dst / enc_src and calls encode_rows; the per-side encode_rows_k /
// encode_rows_v come from the codec files (empty for codecs encoded by independent tasks:
// f16, q8, q4).

// enc_dst entry of a row that lies outside this dispatch's segment: computed, not written.
const NO_ROW: u32 = 0xffffffffu;

var<workgroup> enc_dst: array<u32, ER>;
// Pair index (as for in_pair_k / in_pair_v) of the row's first input value.
var<workgroup> enc_src: array<u32, ER>;
var<workgroup> enc_x: array<f32, ER * RW>;
var<workgroup> enc_code: array<u32, ER * RW>;
var<workgroup> enc_s: array<f32, ER * SIDE_MAX>;
var<workgroup> enc_n: array<f32, ER>;
// Partial sums of squares of each row (8 per row), and the side's Lloyd–Max boundaries.
var<workgroup> enc_np: array<f32, ER * 8u>;
var<workgroup> enc_bd: array<f32, 16>;
var<workgroup> enc_rn: array<f32, ER>;

// Tokens per encode_rows call: with KV_JOINT (V's codec is K's) both sides' rows of a token
// are encoded together, so ER rows hold ER / 2 tokens.
const ET: u32 = select(ER, ER / 2u, KV_JOINT);

// Encodes the nr <= ET listed tokens' rows of both sides (every invocation calls it; barriers
// inside). With KV_JOINT one pass encodes both (one chain of a dozen barriers, not two: the
// fused step's split 0 runs it on the step's critical path).
fn encode_rows(lid: u32, nt: u32, nr: u32) {
    workgroupBarrier();
    if KV_JOINT {
        encode_rows_k(lid, nt, nr, 2u);
    } else {
        encode_rows_k(lid, nt, nr, 1u);
        encode_rows_v(lid, nt, nr, 1u);
    }
}
