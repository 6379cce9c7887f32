//! How each kvq kernel is dispatched: its workgroup grid as a rule over the cache's shape.
//!
//! One table, read by the cache when it records a pass and by [`crate::export`] when it tells
//! another WebGPU host how to dispatch the exported kernels, so the two cannot drift apart.

/// One dimension of a dispatch grid, as a term over the cache's shape and the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GridTerm {
    /// 1.
    One,
    /// Sequences in the batch.
    Batch,
    /// Query heads.
    QHeads,
    /// KV heads × sequences (one prefill workgroup per KV head of each sequence).
    KvHeadsBatch,
    /// KV heads × sequences × row groups (one split workgroup per row group of the GQA group of
    /// each KV head of each sequence: `ceil(gqa / 8)` of them, 1 up to GQA 8).
    KvHeadsBatchRowGroups,
    /// Splits per storage segment (the decode's, or a chunk slice's own), plus the one for
    /// the tokens a fused step appends, plus one for the exact tokens where the cache keeps
    /// them ([`crate::ExactTokens`]).
    SplitsPlusOne,
    /// `append_wide`'s workgroups for an append of `n` tokens: `max(ceil(n * kv_heads *
    /// tasks_per_row / (256 * items)), ceil(n * kv_heads / coop_rows))` with `items` and
    /// `coop_rows` the append params' second and third words (the second term only for a
    /// rotated codec).
    WideGroups,
    /// Queries per sequence of the call: 1 for a decode step or attend, the slice's count
    /// for a slice of a chunk ([`crate::KvCache::chunk`]: at most
    /// [`crate::CHUNK_SLICE_TOKENS`] of its new tokens).
    Queries,
    /// A chunk's split workgroups per KV head and split: `ceil(queries / chunk_queries)`, each
    /// serving `chunk_queries` of its new tokens (1 outside a chunk).
    QueryGroups,
    /// A prefill slice's workgroups per KV head and split: `ceil(queries * gqa /
    /// prefill_rows)`, each serving `prefill_rows` query rows (1 outside a prefill slice).
    RowTiles,
}

impl GridTerm {
    /// The term as a formula over the shape's names (`kv_heads * batch`).
    pub fn formula(self) -> &'static str {
        match self {
            GridTerm::One => "1",
            GridTerm::Batch => "batch",
            GridTerm::QHeads => "q_heads",
            GridTerm::KvHeadsBatch => "kv_heads * batch",
            GridTerm::KvHeadsBatchRowGroups => "kv_heads * batch * row_groups",
            GridTerm::SplitsPlusOne => "splits + 1 + exact",
            GridTerm::WideGroups => "wide_groups",
            GridTerm::Queries => "queries",
            GridTerm::QueryGroups => "query_groups",
            GridTerm::RowTiles => "row_tiles",
        }
    }

    /// The term's value for `s`.
    pub fn eval(self, s: &GridShape) -> u32 {
        match self {
            GridTerm::One => 1,
            GridTerm::Batch => s.batch,
            GridTerm::QHeads => s.q_heads,
            GridTerm::KvHeadsBatch => s.kv_heads * s.batch,
            GridTerm::KvHeadsBatchRowGroups => s.kv_heads * s.batch * s.row_groups,
            GridTerm::SplitsPlusOne => s.splits + 1 + s.exact,
            GridTerm::WideGroups => s.wide_groups,
            GridTerm::Queries => s.queries,
            GridTerm::QueryGroups => s.query_groups,
            GridTerm::RowTiles => s.row_tiles,
        }
    }
}

/// The numbers a [`Dispatch`] rule is evaluated on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GridShape {
    /// Sequences.
    pub batch: u32,
    /// Query heads.
    pub q_heads: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Split workgroups each KV head's GQA group of query heads is spread over:
    /// `ceil(gqa / 8)`.
    pub row_groups: u32,
    /// Splits per storage segment: the cache's decode splits (after its defaults and
    /// clamps), or for a chunk slice its own ([`crate::CacheSpec::chunk_splits`], at most
    /// those; the slice's params hold it for the kernels).
    pub splits: u32,
    /// 1 where the cache keeps exact tokens ([`crate::ExactTokens`]), else 0.
    pub exact: u32,
    /// [`GridTerm::WideGroups`] of the call (0 outside an `append_wide`).
    pub wide_groups: u32,
    /// [`GridTerm::Queries`] of the call (1 outside a chunk).
    pub queries: u32,
    /// [`GridTerm::QueryGroups`] of the call (1 outside a chunk).
    pub query_groups: u32,
    /// [`GridTerm::RowTiles`] of the call (1 outside a prefill slice).
    pub row_tiles: u32,
}

/// How one entry point is dispatched: its grid and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatch {
    /// The WGSL entry point.
    pub entry: &'static str,
    /// Workgroup counts (x, y, z).
    pub grid: [GridTerm; 3],
    /// When and how often it is dispatched, and with which bind groups.
    pub when: &'static str,
}

impl Dispatch {
    /// The workgroup counts for `s`.
    pub fn workgroups(&self, s: &GridShape) -> [u32; 3] {
        self.grid.map(|t| t.eval(s))
    }

    /// The grid as text: `(kv_heads * batch, splits + 1, 1)`.
    pub fn formula(&self) -> String {
        let [x, y, z] = self.grid.map(GridTerm::formula);
        format!("({x}, {y}, {z})")
    }
}

/// An append of at most [`SMALL_APPEND_MAX_TOKENS`] tokens: one workgroup per sequence.
pub const APPEND_SMALL: Dispatch = Dispatch {
    entry: "append_small",
    grid: [GridTerm::One, GridTerm::Batch, GridTerm::One],
    when: "once per storage segment of the layer, when n = 1 token; it also commits the lengths",
};

/// A longer append (prefill): many workgroups per sequence, then [`APPEND_COMMIT`].
pub const APPEND_WIDE: Dispatch = Dispatch {
    entry: "append_wide",
    grid: [GridTerm::WideGroups, GridTerm::Batch, GridTerm::One],
    when: "once per storage segment of the layer, when n > 1 token",
};

/// Commits the lengths after every segment's [`APPEND_WIDE`].
pub const APPEND_COMMIT: Dispatch = Dispatch {
    entry: "append_commit",
    grid: [GridTerm::One, GridTerm::Batch, GridTerm::One],
    when: "once after every segment's append_wide (same group-0 bind group as the last one)",
};

/// Decode attention (and the fused step's append): one workgroup per row group of each KV
/// head of each sequence and split; split 0 of each row attends the step's new tokens.
pub const SPLIT: Dispatch = Dispatch {
    entry: "split",
    grid: [
        GridTerm::KvHeadsBatchRowGroups,
        GridTerm::SplitsPlusOne,
        GridTerm::One,
    ],
    when: "once per storage segment of the layer",
};

/// A chunk's attention: one workgroup per row group of each KV head of each sequence, split
/// and group of `chunk_queries` new tokens.
pub const CHUNK_SPLIT: Dispatch = Dispatch {
    entry: "split",
    grid: [
        GridTerm::KvHeadsBatchRowGroups,
        GridTerm::SplitsPlusOne,
        GridTerm::QueryGroups,
    ],
    when: "once per storage segment of the layer",
};

/// A rotated K's queries of a prefill slice rotated into its scratch, before [`PREFILL`]: one
/// workgroup per row group of each KV head of each sequence and group of `chunk_queries` new
/// tokens.
pub const PREFILL_Q: Dispatch = Dispatch {
    entry: "prefill_q",
    grid: [
        GridTerm::KvHeadsBatchRowGroups,
        GridTerm::One,
        GridTerm::QueryGroups,
    ],
    when: "once per prefill slice, before its prefill dispatches, where K's codec is rotated (the first segment's group-0 bind group)",
};

/// A long chunk slice's attention tiled over queries and keys (the prefill kernel, in place
/// of [`CHUNK_SPLIT`]): one workgroup per KV head of each sequence, split and tile of
/// `prefill_rows` query rows.
pub const PREFILL: Dispatch = Dispatch {
    entry: "prefill",
    grid: [
        GridTerm::KvHeadsBatch,
        GridTerm::SplitsPlusOne,
        GridTerm::RowTiles,
    ],
    when: "once per storage segment of the layer, for a chunk slice of at least the cache's prefill_from tokens",
};

/// Merges the splits' partials: one workgroup per query head of each sequence and query.
pub const REDUCE: Dispatch = Dispatch {
    entry: "reduce",
    grid: [GridTerm::QHeads, GridTerm::Batch, GridTerm::Queries],
    when: "once after every segment's split (same group-0 bind group as the last one)",
};

/// Appends of at most this many tokens take [`APPEND_SMALL`]'s single dispatch, which writes
/// and commits; longer ones are spread over [`APPEND_WIDE`]'s workgroups plus a commit. One
/// workgroup encodes a small append's rows one batch after another, which for a rotated codec
/// took many times the wide dispatch's time already at 64 tokens: so only a single token (a
/// decode step) takes it.
pub const SMALL_APPEND_MAX_TOKENS: u32 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_read_as_their_terms() {
        assert_eq!(
            SPLIT.formula(),
            "(kv_heads * batch * row_groups, splits + 1 + exact, 1)"
        );
        assert_eq!(
            CHUNK_SPLIT.formula(),
            "(kv_heads * batch * row_groups, splits + 1 + exact, query_groups)"
        );
        let s = GridShape {
            batch: 3,
            q_heads: 16,
            kv_heads: 4,
            row_groups: 1,
            splits: 7,
            exact: 0,
            wide_groups: 9,
            queries: 5,
            query_groups: 2,
            row_tiles: 4,
        };
        assert_eq!(SPLIT.workgroups(&s), [12, 8, 1]);
        assert_eq!(CHUNK_SPLIT.workgroups(&s), [12, 8, 2]);
        assert_eq!(REDUCE.workgroups(&s), [16, 3, 5]);
        assert_eq!(APPEND_WIDE.workgroups(&s), [9, 3, 1]);
        assert_eq!(PREFILL.workgroups(&s), [12, 8, 4]);
        assert_eq!(PREFILL_Q.workgroups(&s), [12, 1, 2]);
        // GQA 16: two row groups of 8 heads for the split kernels, one tile grid for prefill.
        let wide = GridShape {
            q_heads: 64,
            row_groups: 2,
            ..s
        };
        assert_eq!(SPLIT.workgroups(&wide), [24, 8, 1]);
        assert_eq!(PREFILL.workgroups(&wide), [12, 8, 4]);
    }
}
