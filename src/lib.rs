//! # kvq — a quantized LLM KV cache on the GPU
//!
//! kvq keeps a transformer's K and V caches on the GPU, optionally quantized, and runs decode
//! attention directly over the stored codes with WGSL compute shaders through wgpu (Metal,
//! Vulkan, DX12, browsers). A decode step uploads nothing and reads nothing back: sequence
//! lengths live on the GPU, and kvq records into your `wgpu::CommandEncoder`.
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
pub use context::{Capabilities, GpuContext, TransferStats};
pub use error::{KvqError, Result};
pub use kernels::{InputType, KernelConfig, KernelModule};
pub use memory::{MemoryReport, StoreBytes};
pub use spec::{
    CacheSpec, EXACT_CHUNK_SLICE, ExactTokens, MAX_CAPACITY, MAX_EXACT_TOKENS, Precision,
};
pub use timer::{DispatchTimer, KernelTime};

// The README's Rust snippet, compiled with the doctests (not run: it opens a GPU).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
