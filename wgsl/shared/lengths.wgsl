// Advancing a sequence's length by n new tokens: the append module's commit and the fused
// step's commit_step. Included by the roots that declare `lens` read_write.

// Overflow (len + n > CAP, never for a ring) writes nothing and raises the sequence's overflow
// flag instead.
fn advance_len(b: u32, len: u32, n: u32) {
    let li = len_index(seg.layer, b);
    if fits(len, n) {
        lens[li] = len + n;
    } else {
        lens[LAYERS * NB + li] = 1u;
    }
}
