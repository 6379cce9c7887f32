//! KV codecs: names, the stored row layout (a bit-exact contract), and the CPU reference
//! encoders in the submodules.
//!
//! Every stored (token, kv-head) vector of `D = head_dim` values is one *row* of `u32`
//! words. A codec fixes the row's layout; the GPU kernels and the CPU reference
//! ([`reference::CodecRef`]) read and write exactly the same bits. [`Codec::layout`] gives
//! every offset below as a [`RowLayout`].
//!
//! # Codecs and names
//! | name | kind | code bits | sideband |
//! |---|---|---|---|
//! | `none` | [`CodecKind::None`] | 16 (f16 values) | none |
//! | `q8`, `q4` | [`CodecKind::Sym`] | 8, 4 | one f16 scale per 32 values |
//! | `turbo1`..`turbo4` | [`CodecKind::Turbo`] (randomized Hadamard) | 1..4 | one f16 scale |
//! | `rotor1`..`rotor4` | [`CodecKind::Rotor`] (Cl(3,0) rotor per 3 coords) | 1..4 | one f16 scale |
//! | `iso1`..`iso4` | [`CodecKind::Iso`] (unit quaternion per 4 coords) | 1..4 | one f16 scale |
//!
//! A rotated name takes an optional `b` suffix for [`ScaleMode::Block32`] (one scale per 32
//! rotated coordinates: `iso3b`, `rotor4b`, `turbo3b`) and an optional `+qjl` suffix for the
//! 1-bit QJL residual sketch (`turbo3+qjl`, `iso3b+qjl`; meaningful for K only). `turbo0+qjl`
//! (and `rotor0+qjl`, `iso0+qjl`) is the QJL-only configuration (no MSE stage) used by the
//! quality tests. The defaults are `turbo3`/`iso3`/`rotor3` = per-vector scale (3.25 bits per
//! value at `D = 128`).
//!
//! Cache names ([`KvCodecs::parse`]): `none`; `k_<codec>` (K quantized, V f16:
//! `k_iso3`, `k_turbo3+qjl`); `<codec>_sym` (K and V both `<codec>`; a `+qjl` applies to K
//! only: `turbo3+qjl_sym` is K `turbo3+qjl`, V `turbo3`); `k=<codec>,v=<codec>`.
//!
//! # Row layout (the contract)
//! **Bit stream.** Row bit `k` is bit `k % 32` of word `k / 32`. A field of `b` bits at bit
//! offset `o` holds its value LSB-first in row bits `[o, o + b)`; it may straddle two words.
//! See [`reference::get_bits`] / [`reference::put_bits`].
//!
//! **`none`.** `D` f16 values: value `i` at bits `[16 i, 16 i + 16)` (so value `2i` is the low
//! half of word `i`). `words = D / 2`.
//!
//! **Codes.** `n_codes` codes of `b` bits: code `i` at bits `[i b, i b + b)`.
//! `n_codes = D` for sym, turbo and iso, `3 * ceil(D/3)` for rotor.
//!
//! **Sideband.** f16 values (16 bits each, IEEE binary16 bit patterns) from bit
//! `side_offset = round_up(n_codes * b, 16)`, in order:
//! * sym: one scale per block of 32 values (`D / 32` of them);
//! * rotated, [`ScaleMode::PerVector`]: one value `s`;
//! * rotated, [`ScaleMode::Block32`]: one `s_j` per block of 32 *rotated* coordinates
//!   (`ceil(n_codes / 32)` of them; the last block may be shorter, e.g. rotor at `D = 128`
//!   has 129 coordinates: blocks of 32, 32, 32, 32, 1).
//!
//! **Sym values.** `qmax = 127` (q8) or `7` (q4). Per block: `absmax = max |x_i|`;
//! stored scale `d = f16(min(absmax / qmax, 65504))` (round to nearest even); with
//! `d` the stored value as a float, `c_i = clamp(round(x_i / d), -qmax, qmax)` where `round`
//! rounds half away from zero (`c_i = 0` when `d == 0`); the code field holds
//! `u_i = c_i + 2^(b-1)`. Decode: `x̂_i = (u_i - 2^(b-1)) * d`.
//!
//! **Rotated codecs** (turbo, rotor, iso).
//! 1. `x` (length `D`; rotor zero-pads it to `n_codes = 3 ceil(D/3)`) is rotated:
//!    `y = R x` with the codec's rotation from [`rotation`] (turbo: signs then per-block
//!    orthonormal Walsh–Hadamard; rotor: 3x3 matrix per group; iso: 4x4 left-quaternion
//!    matrix per group), using the `f32` coefficients those functions return.
//! 2. Scale: `PerVector`: `s = ||x|| / sqrt(D)` (the true `D`, not the padded one);
//!    `Block32`: `s_j = sqrt(mean of y_i^2 over block j)`. Stored as f16 (round to nearest
//!    even, clamped to 65504); everything below uses the stored (rounded) value.
//! 3. Code `k_i` = the index into the ascending Lloyd–Max level list for N(0, 1)
//!    ([`lloyd::codebook`]`(b)`, `f32`-rounded levels and boundaries) of `t_i = y_i / s`:
//!    `k_i = #{j : boundary_j <= t_i}` (a value on a boundary goes to the upper bin; codes
//!    below `2^(b-1)` are negative levels). If `s == 0`, `t_i = 0` (so `k_i = 2^(b-1)`).
//! 4. Decode: `ŷ_i = s * level[k_i]`, `x̂ = R^T ŷ` (rotor: drop the pad coordinates).
//!
//! **QJL residual** (`+qjl`, K only), after the sideband:
//! * `qjl_offset = round_up(side_offset + 16 n_side, 32)`; then `m = D` sign bits, bit `j`
//!   at `qjl_offset + j`, `1` when `(S r)_j >= 0`, where `S` is [`rotation::qjl_matrix`]
//!   (`m x D`) and `r = (x − x̂) / ||x||` (un-rotated domain, `x̂` the decoded MSE stage,
//!   `||x||` the exact norm of the input; `r = 0` when `x = 0`);
//! * `qjl_norm_offset = round_up(qjl_offset + m, 16)`: one f16 holding `||r||`.
//! * Estimator of `<q, x>`: `<q, x̂> + n · sqrt(π/2) / m · ||r|| · Σ_j (S q)_j · (±1)_j`
//!   where `n` is the norm recovered from the row's scales (`PerVector`: `s · sqrt(D)`;
//!   `Block32`: `sqrt(Σ_j len_j · s_j^2)`) and `(±1)_j` is `+1` for a set bit.
//!
//! **Words.** `words = ceil(total_bits / 32)`; unused tail bits are zero. At `D = 128`:
//! `none` 64, `q8` 34 (8.5 bits/value), `q4` 18 (4.5), `turbo3`/`iso3`/`rotor3` 13 (3.25),
//! `iso3b` 14 (3.5), `rotor3b` 15 (3.75), `turbo3+qjl` 18 (4.5).

mod codecs;
mod family;
pub mod lloyd;
pub mod reference;
pub mod rotation;
#[cfg(test)]
mod tests;

pub use codecs::{Codec, KvCodecs, RowLayout, ScaleMode};
pub use family::CodecKind;
pub use lloyd::{Codebook, codebook};
pub use reference::{CodecRef, get_bits, put_bits};

pub(crate) use family::FAMILIES;
