// The K store (binding 1, rows interleaved in blocks of KB tokens) and the V store (binding
// 2), each through its codec family's file, which every family provides alike (see
// wgsl/README.md): parameters side (k, v), S (K, V: the side's header constants are S_...),
// binding, lanes (u32 words per f16 chunk) and access (the includer's: `read` or
// `read_write`).
#if K_KIND == KIND_NONE
#include "codecs/f16.wgsl" side=k S=K binding=1 lanes=4
#elif K_KIND == KIND_SYM
#include "codecs/sym.wgsl" side=k S=K binding=1 lanes=4
#else
#include "codecs/rot.wgsl" side=k S=K binding=1 lanes=4
#endif
#if V_KIND == KIND_NONE
#include "codecs/f16.wgsl" side=v S=V binding=2 lanes=2
#elif V_KIND == KIND_SYM
#include "codecs/sym.wgsl" side=v S=V binding=2 lanes=2
#else
#include "codecs/rot.wgsl" side=v S=V binding=2 lanes=2
#endif
