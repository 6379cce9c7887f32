// The decode module: split-K attention over a layer's store (kernels/attention.wgsl) for one
// new query per sequence, with the store and the lengths read-only; with CHUNK, the chunk
// module: the queries of n new tokens per sequence, appended already.
#include "shared/common.wgsl"
#include "shared/rotate.wgsl"
#include "codecs/stores.wgsl" access=read
#include "codecs/readers.wgsl"
#if EXACT
#include "shared/exact.wgsl"
#endif

// [LAYERS * NB] lengths, then [LAYERS * NB] overflow flags, then the codec constants (cst).
@group(0) @binding(3) var<storage, read> lens: array<u32>;

// The attention kernels' step hooks, attend-only: no tokens are appended, nothing is
// committed.

fn step_tokens(len: u32) -> u32 {
    return 0u;
}

fn write_new_rows(lid: u32, b: u32, h: u32, len: u32) {}

fn write_exact_rows(lid: u32, b: u32, h: u32, len: u32) {}

fn committed_len(b: u32) -> u32 {
    return 0u;
}

fn commit_step(b: u32, len: u32) {}

#if CHUNK
#include "kernels/attention.wgsl" scores=tile_sh weights=tile_sh lanes=tile_sh
#include "kernels/prefill.wgsl"
#if MM
#include "kernels/prefill_matrix.wgsl"
#endif
#else
#include "kernels/attention.wgsl" scores=s_sh weights=p_sh lanes=comb
#endif
