//! [`KvCache`]: the GPU-resident store of one model's K and V, with append and decode attention.
//!
//! Creating a cache is planning (`plan.rs`: segments, splits and kernel configuration from the
//! spec, the device's limits and its [`crate::tuning`] entry), allocation (`buffers.rs`) and
//! binding (`bind.rs`); `prepare.rs` binds caller buffers, `record.rs` records the dispatches
//! and `host.rs` holds the host API (`io.rs`: the handles they share).

mod bind;
mod buffers;
mod host;
mod io;
mod kv_cache;
mod plan;
mod prepare;
mod record;

pub(crate) use bind::Bound;
pub use io::{AppendInput, AttendIo, ChunkIo, StepIo};
pub use kv_cache::KvCache;
pub use plan::Layout;
pub use prepare::CHUNK_SLICE_TOKENS;
pub(crate) use record::Recorder;
