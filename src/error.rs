//! kvq's typed errors: every public failure is one of these, never a panic.

use thiserror::Error;

/// Everything that can go wrong in kvq.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum KvqError {
    /// No GPU adapter matched the request.
    #[error(
        "no GPU adapter found ({detail}); on a machine without a GPU install a software Vulkan driver (Debian: mesa-vulkan-drivers) and set WGPU_BACKEND=vulkan"
    )]
    NoAdapter {
        /// What was asked for and what exists.
        detail: String,
    },
    /// The adapter lacks a limit or feature kvq needs.
    #[error(
        "adapter '{adapter}' is below what kvq needs: {what} (needed {needed}, adapter has {have})"
    )]
    AdapterTooWeak {
        /// Adapter name.
        adapter: String,
        /// The limit or feature.
        what: String,
        /// Value needed.
        needed: u64,
        /// Value the adapter offers.
        have: u64,
    },
    /// `request_device` failed.
    #[error("could not open the GPU device: {0}")]
    RequestDevice(String),
    /// The device was lost (driver reset, unplugged GPU, out-of-memory kill).
    #[error("the GPU device was lost: {0}")]
    DeviceLost(String),
    /// wgpu reported a validation or out-of-memory error for kvq's own work.
    #[error("GPU error: {0}")]
    Gpu(String),
    /// The device could not allocate what kvq asked for: the driver ran out of memory, or the
    /// allocation would pass wgpu's memory budget threshold (see [`crate::GpuContext::new`]).
    /// Nothing of the failed object is kept.
    #[error("out of GPU memory on '{adapter}': {what} needs {needed} bytes of buffers ({detail})")]
    OutOfMemory {
        /// Adapter name.
        adapter: String,
        /// What was being allocated.
        what: String,
        /// Bytes of buffers that object needs in all.
        needed: u64,
        /// wgpu's report.
        detail: String,
    },
    /// A cache specification that cannot be built.
    #[error("invalid cache spec: {0}")]
    InvalidSpec(String),
    /// The head dimension cannot be served by this codec.
    #[error("head_dim {head_dim} is not supported by codec '{codec}': {reason}")]
    UnsupportedHeadDim {
        /// The requested head dimension.
        head_dim: u32,
        /// The codec name.
        codec: String,
        /// Why.
        reason: String,
    },
    /// A codec name that does not exist.
    #[error("unknown codec '{name}'{hint}; valid names: {valid}")]
    UnknownCodec {
        /// The name given.
        name: String,
        /// What was probably meant (` (did you mean ...?)`), or empty.
        hint: String,
        /// The accepted names, in short.
        valid: String,
    },
    /// A layer index past the cache's layers.
    #[error("layer {layer} out of range (cache has {layers} layers)")]
    LayerOutOfRange {
        /// The layer asked for.
        layer: u32,
        /// Layers in the cache.
        layers: u32,
    },
    /// Appending would pass the capacity; nothing was written.
    #[error(
        "append of {n} tokens to layer {layer} would exceed capacity {capacity} (length {len}); the store was left as it was"
    )]
    CapacityExceeded {
        /// Layer.
        layer: u32,
        /// Current length.
        len: u32,
        /// Tokens asked to append.
        n: u32,
        /// Capacity in tokens.
        capacity: u32,
    },
    /// Host attention ([`crate::KvCache::attend_host`]) over a sequence that holds no tokens.
    #[error("sequence {seq} of layer {layer} holds no tokens: append before attending")]
    EmptySequence {
        /// Layer.
        layer: u32,
        /// Sequence.
        seq: u32,
    },
    /// A sequence index past the cache's batch; nothing was changed.
    #[error("sequence {seq} out of range (the cache holds {batch} sequences)")]
    SequenceOutOfRange {
        /// The sequence asked for.
        seq: u32,
        /// Sequences in the cache.
        batch: u32,
    },
    /// An argument the call cannot take (no new tokens, a cut past a sequence's length or
    /// past what a sliding window's ring still holds); nothing was changed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An io object ([`crate::AppendInput`], [`crate::AttendIo`], [`crate::StepIo`],
    /// [`crate::ChunkIo`]) recorded on a cache other than the one that prepared it, even one
    /// of the same shape: its bindings and sizes are that cache's, so prepare one per cache.
    /// Nothing was recorded.
    #[error("{what} was prepared by another KvCache: prepare it with the cache that records it")]
    WrongCache {
        /// Which io object.
        what: &'static str,
    },
    /// A host slice of the wrong length.
    #[error("{what}: expected {expected} values, got {got}")]
    WrongLength {
        /// Which argument.
        what: String,
        /// Expected element count.
        expected: usize,
        /// Given element count.
        got: usize,
    },
    /// A caller's GPU buffer that is too small, lacks a usage, or belongs to another device.
    #[error("buffer '{what}': {problem}")]
    BadBuffer {
        /// Which argument.
        what: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Anything else (an internal inconsistency kvq detected, with what it found).
    #[error("{0}")]
    Other(String),
}

/// kvq's result type.
pub type Result<T, E = KvqError> = std::result::Result<T, E>;
