//! # kvq — a quantized LLM KV cache on the GPU
//!
//! kvq keeps a transformer's K and V caches on the GPU, optionally quantized, and runs decode
//! attention directly over the stored codes with WGSL compute shaders through wgpu (Metal,
//! Vulkan, DX12, browsers). A decode step uploads nothing and reads nothing back: sequence
//! lengths live on the GPU, and kvq records into your `wgpu::CommandEncoder`. The README has
//! the codec to pick and an engine's decode loop; this page is the reference.
//!
//! ```no_run
//! use kvq::{CacheSpec, GpuContext, KvCache};
//! # fn main() -> Result<(), kvq::KvqError> {
//! let ctx = GpuContext::new()?;
//! // 2 layers, 8 query heads over 2 KV heads, head_dim 64, room for 1024 tokens.
//! let mut cache = KvCache::new(&ctx, CacheSpec::new(2, 8, 2, 64, 1024))?;
//! let k = vec![0.1f32; 2 * 64]; // one token: [n, kv_heads, head_dim]
//! let v = vec![0.2f32; 2 * 64];
//! cache.append_host(0, &k, &v)?;
//! let out = cache.attend_host(0, &vec![0.3f32; 8 * 64])?; // [q_heads, head_dim]
//! assert_eq!(out.len(), 8 * 64);
//! # Ok(()) }
//! ```
//!
//! # The pieces
//! - [`GpuContext`] opens a device (honouring `WGPU_BACKEND` and `WGPU_ADAPTER_NAME`) or wraps
//!   an engine's ([`GpuContext::from_device`], with [`GpuContext::device_requirements`]); it
//!   counts every byte kvq moves between host and GPU and every dispatch it records
//!   ([`GpuContext::stats`]).
//! - [`CacheSpec`] is a cache's shape: layers, heads, head_dim, capacity, batch, codecs
//!   ([`KvCodecs`]; names and the bit-exact row layout in [`codec`]) and options below.
//! - [`KvCache`] holds `layers × batch × kv_heads × capacity` rows of K and V, allocated once;
//!   a capacity beyond one storage binding's limit is split over several buffers. Every buffer
//!   is checked against the adapter's limits before anything is allocated: a cache that does
//!   not fit is a typed [`KvqError`] (`OutOfMemory`, `AdapterTooWeak`), never a panic.
//! - [`reference`](mod@reference) (f64 attention) and [`codec::CodecRef`] (every codec, bit-exact) are the
//!   CPU oracles every kernel is tested against.
//!
//! Kernels compile once per context: the caches made on a [`GpuContext`] (and its clones)
//! share every compiled pipeline whose WGSL text and compile options match, and a cache's
//! capacity, batch, window, layers and splits are uniforms its kernels read, not part of the
//! text. So a second cache of another size, or a cache rebuilt for a longer conversation or
//! another batch slot, starts without compiling ([`GpuContext::compiled_pipelines`] counts
//! them; the `startup` example times it). The measured NVIDIA GPUs are the exception: there
//! the uniforms cost the kernels up to a few per cent and a compile well under a second, so
//! their tuning bakes the shape into the text ([`tuning::DeviceTuning::baked_shape`]). What changes the text compiles anew: the codecs,
//! head_dim, the GQA ratio, the decode workgroup, the exact-token layout, the precision, and
//! [`GpuContext::with_shader_checks`] or [`GpuContext::with_workgroup_poison`]. The decode
//! kernels compile with the cache; the others when their io is first prepared, never while
//! recording.
//!
//! # A decode step
//! Bind your buffers once ([`KvCache::step_io`]: the new token's K/V `[n, kv_heads,
//! head_dim]` in f16 or f32, the query and output `[q_heads, head_dim]` in f32), then record
//! [`KvCache::step_in_pass`] per layer inside your own compute pass: the fused step appends
//! the token and attends in 2 dispatches a layer (the split kernel writes the new rows, the
//! reduce merges the splits' partials and commits the length). [`KvCache::append_input`] /
//! [`KvCache::append_in_pass`] and [`KvCache::attend_io`] / [`KvCache::attend_in_pass`] do
//! the two halves separately. [`KvCache::truncate`] and [`KvCache::reset`] cut a sequence
//! back (speculative decoding) or free its slot, without reallocating.
//! [`KvCache::len`] counts what was recorded: if a recording is dropped instead of submitted,
//! call [`KvCache::sync_lengths`] before the next append or cut.
//!
//! Attention is split-K flash decoding: one workgroup serves a whole GQA group of up to 8
//! query heads, so every KV byte is read once per KV head; a larger group (any ratio up to
//! 128) is spread over row groups of at most 8 heads, each reading the codes once for its
//! rows, adjacent in dispatch order so that their reads of the same codes run together.
//! Splits take whole 128-token tiles where the length allows.
//! The split count is the adapter's [`tuning`] entry's unless [`CacheSpec::with_splits`] sets
//! one: the measured devices get the largest grid that fits one wave of resident workgroups,
//! a CPU driver 1–4, every other adapter one wave of a small GPU.
//!
//! # Exact tokens
//! [`CacheSpec::with_exact`]`(sink, recent)` keeps each sequence's first `sink` and newest
//! `recent` tokens as f16 copies beside their codes and attends the copies instead ([`ExactTokens`]):
//! on a real model this is what a 3- or 4-bit cache needs (QUALITY.md, "Exact tokens on the
//! GPU"). One more workgroup per KV head attends them beside the splits; the store still
//! encodes every token, so nothing is re-encoded as tokens age. Every query, of a step or of a
//! chunk, sees the sink and the `recent` positions up to its own exact: a chunk is appended and
//! attended [`EXACT_CHUNK_SLICE`] tokens at a time, and the ring keeps that many slots beyond
//! `recent`. Cost: `(sink + recent + 64) × head_dim × 4` bytes per sequence, KV head and layer,
//! whatever the context ([`MemoryReport::exact`]). After a truncate, positions whose ring
//! slots later tokens overwrote are attended through their codes until they leave the window.
//! [`CacheSpec::with_k_mean`] also removes K's per-channel mean over the sink before the codec
//! (attention is unchanged in exact arithmetic): what `iso` and `rotor`, whose small block
//! rotations cannot spread real K's channel means, need. Not with a sliding window.
//!
//! # Sliding windows
//! [`CacheSpec::with_window`]`(w)` attends only each sequence's last `w` tokens and keeps its
//! last `capacity` tokens in a ring (slot = position % capacity), so a sequence never fills and
//! `capacity - w` tokens can still be rolled back after the ring wraps. The kernels are the same,
//! indexing through the ring.
//!
//! # Chunks: many new tokens at once
//! Prompts over the cache, chat turns and speculative verification: [`KvCache::chunk_io`]
//! then [`KvCache::chunk_in_pass`] append `n` new tokens per sequence (K/V `[batch, n,
//! kv_heads, head_dim]`) and attend their queries `[batch, n, q_heads, head_dim]` causally: new
//! token `i` sees every stored position up to its own, within the window where one is set.
//! A chunk of any length is one recording, attended in slices of up to
//! [`CHUNK_SLICE_TOKENS`] new tokens in one scratch that every [`ChunkIo`] of the cache
//! shares ([`ChunkIo::scratch_bytes`]). [`KvCache::chunk_io_lse`] also writes each output row's
//! log-sum-exp (`[batch, n, q_heads]` f32), to merge kvq's attention with an engine's own over
//! other keys.
//!
//! Two kernels attend a slice; both compute the same attention. The split kernel serves the
//! query rows of several new tokens per workgroup (8 rows: 2 tokens at GQA 4) and reads the
//! stored K/V once for them. The prefill kernel, for long slices, serves up to 32 query rows of
//! one KV head, decodes each 64-key K/V tile once into workgroup memory for all of them and
//! multiplies blocks of rows by keys out of it. [`CacheSpec::with_prefill_from`] picks it from a
//! slice size; by default the adapter's [`tuning`] entry does (the measured GPUs take it from
//! 64 new tokens with f16 products, not for a QJL K). A slice's split count follows from its
//! size ([`CacheSpec::with_chunk_splits`] sets one).
//!
//! # Sink logits, softcaps and head sizes
//! [`CacheSpec::with_sink_logits`] gives each query head a logit that joins its softmax's
//! denominator and carries no value (a host slice, or a GPU buffer copied in once);
//! [`CacheSpec::with_softcap`] caps every scaled score `s` at `c · tanh(s / c)`. Every kernel
//! that attends (the split kernel and its reduce, the fused step, both prefill kernels, the
//! exact tokens) applies them, and the log-sum-exps count the sink. Both are uniforms, not
//! kernel text. Head sizes are any multiple of 8 from 32 to 256 where the codecs' rows allow
//! (sym and turbo blocks and a QJL residual need multiples of 32: typed errors otherwise).
//! A window per layer ([`CacheSpec::with_layer_windows`], Gemma 2 and 3, gpt-oss) keeps each
//! local layer's store to its window and slack (Gemma 3's five local layers of 1,024 to one
//! global: under a third of the memory at 32k). K and V of different widths (the MLA shapes)
//! have the CPU reference ([`reference::Heads`]) only: the GPU kernels refuse them, typed.
//!
//! # Precision
//! [`CacheSpec::with_precision`]: [`Precision::Auto`] (the default) is `Fast` for caches whose
//! quantized sides all store codes of at most 4 bits and `Exact` for `none` and any cache with
//! an 8-bit side. `Fast` gives the prefill kernel f16 tiles and products (summed in f16 at most
//! 16 to a sum, then in f32; every softmax maximum, sum and rescale in f32) on adapters with
//! `shader-f16`, and changes nothing else. It trades attention within 1e-2 of the reference
//! over the stored codes (about 1e-6 with `Exact`); against the original K/V a 3/4-bit codec's
//! error is unchanged within the tests' 5 %. `Auto` does not check the values' range: for a
//! model whose K or query · key products may pass f16's ±65504 (or V past about ±4000), set
//! `Exact`. [`KernelConfig::precision`] says what a cache got.
//!
//! # Host API
//! For quick use and tests: [`KvCache::append_host`], [`KvCache::attend_host`] and
//! [`KvCache::chunk_host`] upload `f32` slices and return a `Vec<f32>` (blocking). K and V are
//! `[batch, n, kv_heads, head_dim]`, queries and outputs `[batch, q_heads, head_dim]` (a chunk's
//! `[batch, n, q_heads, head_dim]`). `attend_host` refuses a batch with an empty sequence
//! ([`KvqError::EmptySequence`]); the recorded attend writes zeros for it.
//!
//! # Memory
//! [`KvCache::memory`] is a [`MemoryReport`] of every byte the cache allocated on the device,
//! from its buffers' sizes: K and V codes, scales, norms and row padding (by the codec's row
//! layout), lengths, codec constants, exact tokens, decode scratch, the chunks' shared scratch,
//! parameter uniforms and host-API staging. `total()` is their sum; `Display` prints one line.
//!
//! # Bad input
//! Every bad input is a typed [`KvqError`]; nothing is written when an append is refused.
//! A NaN or ±Inf K/V value is stored exactly as 0 would be, by every codec and append path, so
//! it changes only its own row: outputs stay finite and other sequences are untouched bit for
//! bit. kvq does not report such values. Codec `none` stores a finite value beyond f16's range
//! as ±65504.
//!
//! # Other WebGPU hosts
//! [`export`] gives each kernel's exact WGSL per target (native wgpu or browser) with its bind
//! group layouts and dispatch rules ([`dispatch`]: data, the table the cache itself dispatches
//! by), and replay plans of whole decode scenarios recorded from a real [`KvCache`]; CI replays
//! them in Dawn (`docs/testing.md`).
//!
//! # Timing
//! [`DispatchTimer`] times each dispatch of a recording ([`KvCache::step_in_timed_pass`]), where
//! the adapter has timestamps inside compute passes.
#![warn(missing_docs)]
// The docs link the blocking forms (`GpuContext::new`, `KvCache::attend_host`, ...), which
// exist only natively: built for wasm32 those links stay plain text.
#![cfg_attr(target_arch = "wasm32", allow(rustdoc::broken_intra_doc_links))]

pub mod cache;
pub mod codec;
pub mod context;
pub mod dispatch;
pub mod error;
pub mod export;
pub mod kernels;
pub mod memory;
pub mod reference;
pub mod spec;
pub mod timer;
pub mod tuning;
mod wait;

pub use cache::{AppendInput, AttendIo, CHUNK_SLICE_TOKENS, ChunkIo, KvCache, Layout, StepIo};
pub use codec::{Codec, CodecKind, KvCodecs};
pub use context::{Capabilities, GpuContext, MatrixUnits, TransferStats};
pub use error::{KvqError, Result};
pub use kernels::{InputType, KernelConfig, KernelModule};
pub use memory::{MemoryReport, StoreBytes};
pub use spec::{
    CacheSpec, EXACT_CHUNK_SLICE, ExactTokens, MAX_CAPACITY, MAX_EXACT_TOKENS, Precision,
    SinkLogits,
};
pub use timer::{DispatchTimer, KernelTime};

// The README's Rust snippet, compiled with the doctests (not run: it opens a GPU).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
