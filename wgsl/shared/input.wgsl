// The caller's K/V input elements, read as pairs: in_pair_k(i) / in_pair_v(i) return elements
// 2i and 2i + 1 of k_in / v_in (declared by the kernel), the only way the encoders read
// inputs. Non-finite values read as 0 (finite_or_zero). IN_F16: two f16 per u32 word (element
// 2i in the low half); otherwise f32.
#if IN_F16
alias IN_T = u32;
fn in_pair_k(i: u32) -> vec2<f32> { return finite_or_zero(unpack2x16float(k_in[i])); }
fn in_pair_v(i: u32) -> vec2<f32> { return finite_or_zero(unpack2x16float(v_in[i])); }
#else
alias IN_T = f32;
fn in_pair_k(i: u32) -> vec2<f32> { return finite_or_zero(vec2<f32>(k_in[2u * i], k_in[2u * i + 1u])); }
fn in_pair_v(i: u32) -> vec2<f32> { return finite_or_zero(vec2<f32>(v_in[2u * i], v_in[2u * i + 1u])); }
#endif

// What the encoders (the codec files' encode_*) read: V's input, and K's less K's mean where
// the cache removes it (KMEAN: in_code_k in shared/exact.wgsl).
fn in_code_v(i: u32) -> vec2<f32> { return in_pair_v(i); }
#if !KMEAN
fn in_code_k(i: u32) -> vec2<f32> { return in_pair_k(i); }
#endif
