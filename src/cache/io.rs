//! The handles of caller buffers prepared for the cache (`prepare.rs` builds them), and
//! the host API's staging.

use super::bind::Bound;
use crate::kernels::InputType;

/// Caller buffers prepared for [`KvCache::append`](crate::KvCache::append): bind groups are
/// built once here, so recording an append allocates nothing.
pub struct AppendInput {
    /// The cache that prepared it ([`KvCache::id`](crate::KvCache)).
    pub(super) cache: u64,
    pub(super) bind_group: Bound,
    pub(super) n: u32,
    pub(super) input: InputType,
    pub(super) wide_groups: u32,
    pub(super) params: wgpu::Buffer,
}

impl AppendInput {
    /// Tokens per sequence each append with this input writes.
    pub fn tokens(&self) -> u32 {
        self.n
    }
}

/// Caller buffers prepared for [`KvCache::attend`](crate::KvCache::attend): the query
/// `[B, q_heads, head_dim]` f32 and the output of the same shape.
pub struct AttendIo {
    /// The cache that prepared it ([`KvCache::id`](crate::KvCache)).
    pub(super) cache: u64,
    pub(super) bind_group: Bound,
}

/// Caller buffers prepared for [`KvCache::step`](crate::KvCache::step): the new tokens' K and
/// V (as for [`KvCache::append_input`](crate::KvCache::append_input)) with the query and
/// output (as for [`KvCache::attend_io`](crate::KvCache::attend_io)).
pub struct StepIo {
    /// The cache that prepared it ([`KvCache::id`](crate::KvCache)).
    pub(super) cache: u64,
    pub(super) path: StepPath,
    pub(super) n: u32,
    pub(super) input: InputType,
}

/// How a step is recorded: the fused step's split kernel and reduce, or, where the cache
/// attends chunks of one token by the prefill kernel on matrix units
/// ([`crate::KvCache::steps_as_chunks`]), a chunk of 1.
pub(super) enum StepPath {
    Fused(Bound),
    Chunk(ChunkIo),
}

impl StepIo {
    /// Tokens per sequence each step with these buffers appends.
    pub fn tokens(&self) -> u32 {
        self.n
    }
}

/// Caller buffers prepared for [`KvCache::chunk`](crate::KvCache::chunk): `n` new tokens per
/// sequence (K and V as for [`KvCache::append_input`](crate::KvCache::append_input)), their
/// queries `[batch, n, q_heads, head_dim]` f32 and the outputs of the same shape, with the
/// cache's chunk scratch bound (at least one slice's queries: [`ChunkIo::slice_tokens`];
/// shared with the cache's other `ChunkIo`s: [`ChunkIo::scratch_bytes`]).
pub struct ChunkIo {
    /// The cache that prepared it ([`KvCache::id`](crate::KvCache)).
    pub(super) cache: u64,
    /// Bytes of the cache's chunk scratch it is bound to.
    pub(super) scratch_bytes: u64,
    /// New tokens per sequence, and their element type.
    pub(super) n: u32,
    pub(super) input: InputType,
    /// The whole chunk's append, recorded before the slices are attended; none where each
    /// slice has its own ([`ChunkSlice::append`]).
    pub(super) append: Option<AppendInput>,
    /// The chunk's slices, attended one after another in the one scratch.
    pub(super) slices: Vec<ChunkSlice>,
    /// Per layer, per storage segment: the decode store bind group over this chunk's scratch.
    pub(super) store: Vec<Vec<Bound>>,
}

/// Queries `first .. first + count` of a chunk: their io bind group (query, output, the
/// slice's params, the log-sum-exp buffer or its stand-in), split workgroups per KV head
/// and split (`ceil(count / chunk_queries)`), the prefill kernel's where it attends the
/// slice, and any append of their own.
pub(super) struct ChunkSlice {
    pub(super) io: Bound,
    pub(super) count: u32,
    pub(super) query_groups: u32,
    /// Where the prefill kernel attends the slice: its workgroups per KV head and split
    /// (`ceil(count * gqa / prefill_rows)`).
    pub(super) row_tiles: Option<u32>,
    /// Splits per storage segment ([`crate::CacheSpec::chunk_splits`]).
    pub(super) splits: u32,
    /// With recent exact tokens: the slice's own append, recorded just before it is
    /// attended (else the chunk's append goes first, whole).
    pub(super) append: Option<AppendInput>,
}

impl ChunkIo {
    /// Tokens per sequence each chunk with these buffers appends and attends.
    pub fn tokens(&self) -> u32 {
        self.n
    }

    /// Whether the prefill kernel attends this chunk's slices ([`crate::CacheSpec::prefill_from`]);
    /// else the chunk's split kernel does.
    pub fn prefill(&self) -> bool {
        self.slices.iter().any(|s| s.row_tiles.is_some())
    }

    /// Bytes of the decode scratch this chunk is bound to: the cache's chunk scratch as it
    /// was when this io was prepared, as long as the longest slice prepared until then needs,
    /// and shared with every `ChunkIo` prepared while it was the cache's (so preparing one
    /// per layer costs no more scratch than one). A longer chunk's io replaces it with a longer
    /// one; ios prepared before keep theirs until they are dropped
    /// ([`crate::MemoryReport::chunk_scratch`] is the cache's current one).
    pub fn scratch_bytes(&self) -> u64 {
        self.scratch_bytes
    }

    /// New tokens per sequence attended together (a longer chunk is attended in slices of at
    /// most this many, one after another, in a scratch of at least this many queries'
    /// partials).
    pub fn slice_tokens(&self) -> u32 {
        self.slices.iter().map(|s| s.count).max().unwrap_or(0)
    }
}

/// The host API's staging for [`KvCache::append_host`](crate::KvCache::append_host), kept for
/// the next call of as many tokens.
pub(super) struct HostIo {
    pub(super) n: u32,
    pub(super) k: wgpu::Buffer,
    pub(super) v: wgpu::Buffer,
    pub(super) input: AppendInput,
}

/// The host API's staging for [`KvCache::attend_host`](crate::KvCache::attend_host).
pub(super) struct HostQuery {
    pub(super) q: wgpu::Buffer,
    pub(super) out: wgpu::Buffer,
    pub(super) io: AttendIo,
}
