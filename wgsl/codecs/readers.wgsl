// The attention kernels' readers of the stores (contracts in wgsl/README.md): k_scores and
// k_load_pairs for K's codec, v_load and v_row_scale for V's.
#if K_KIND == KIND_NONE
#include "codecs/read_k_f16.wgsl"
#elif K_KIND == KIND_SYM && K_BITS == 8
#include "codecs/read_k_q8.wgsl"
#elif K_KIND == KIND_SYM
#include "codecs/read_k_q4.wgsl"
#else
#include "codecs/read_k_rot.wgsl"
#endif
#if V_KIND == KIND_NONE
#include "codecs/read_v_f16.wgsl"
#elif V_KIND == KIND_SYM
#include "codecs/read_v_sym.wgsl"
#else
#include "codecs/read_v_rot.wgsl"
#endif
