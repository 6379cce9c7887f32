// The parameters every kernel of a recording shares: one uniform for the decode step, one for
// a prompt (written before the prompt is submitted).
struct Params {
    // Rows (tokens) of the recording: batch * per_seq.
    tokens: u32,
    // New tokens per sequence: 1 in a decode step, the prompt's length in a prompt.
    per_seq: u32,
    // Where the embedding kernel's token ids start in its ids buffer.
    ids_base: u32,
    _pad0: u32,
    // Sampling: 0 for greedy, else the softmax temperature.
    temperature: f32,
    // Sampling: the nucleus (top-p) mass kept.
    top_p: f32,
    // Sampling: the random stream's seed.
    seed: u32,
    _pad: u32,
}
