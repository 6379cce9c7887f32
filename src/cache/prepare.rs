//! Preparing caller buffers for appends, attention and fused steps: checked once and bound
//! once, so that recording allocates nothing.

use super::bind::{Bound, bind_buffers};
use super::buffers::init_buffer;
use super::io::{AppendInput, AttendIo, ChunkIo, ChunkSlice, StepIo, StepPath};
use super::kv_cache::KvCache;
use super::plan;
use crate::error::{KvqError, Result};
use crate::kernels::InputType;
use crate::spec::EXACT_CHUNK_SLICE;

/// Most new tokens per sequence a chunk attends together: a longer chunk is attended in slices
/// of this many, one after another, so its decode scratch (every split's partials per query)
/// stays that of this many queries (qwen3-8b at 64 splits: 1.1 MB a query).
pub const CHUNK_SLICE_TOKENS: u32 = 256;

/// New tokens' K and V as every preparing call takes them: `k`, `v` hold `n` tokens per
/// sequence, `[batch, n, kv_heads, head_dim]` of `input` elements.
#[derive(Clone, Copy)]
struct NewTokens<'a> {
    k: &'a wgpu::Buffer,
    v: &'a wgpu::Buffer,
    n: u32,
    input: InputType,
}

/// A query and its output, `[batch, tokens, q_heads, head_dim]` f32 each.
#[derive(Clone, Copy)]
struct Queries<'a> {
    q: &'a wgpu::Buffer,
    out: &'a wgpu::Buffer,
}

/// Words each invocation of the wide append handles at least.
const WIDE_ITEMS: u32 = 16;
/// Rows of a rotated codec each wide-append workgroup encodes (several cooperative passes).
const COOP_ROWS: u32 = 16;

impl KvCache {
    /// Prepares caller buffers holding `n` new tokens per sequence, layout
    /// `[batch, n, kv_heads, head_dim]` of `input` elements, for [`KvCache::append`].
    ///
    /// # Non-finite inputs
    /// Every append path (this one, [`KvCache::append_host`] and the fused
    /// [`KvCache::step`]) stores a NaN or ±Inf input value exactly as it would store 0, for
    /// every codec: the encoders read non-finite values as 0 before computing scales, norms or
    /// codes. So a bad value changes only its own row (its K or V vector of that token and KV
    /// head), attention outputs stay finite, the sequence's other tokens keep their weight,
    /// and other sequences are not affected at all (bit for bit). kvq does not report such
    /// values; check your inputs if you need to know. With codec `none` (f16 rows) a finite
    /// value beyond f16's range is stored as ±65504, not ±Inf.
    pub fn append_input(
        &self,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        n: u32,
        input: InputType,
    ) -> Result<AppendInput> {
        let new = NewTokens { k, v, n, input };
        self.check_new_tokens(new)?;
        self.append_slice(new, 0, n)
    }

    /// An append of tokens `first .. first + n` of `new`'s (checked by the caller).
    fn append_slice(&self, new: NewTokens, first: u32, n: u32) -> Result<AppendInput> {
        let NewTokens {
            k,
            v,
            n: stride,
            input,
        } = new;
        // Built here, once, so that recording an append never compiles a pipeline.
        self.pipes.append(input, n)?;
        let s = &self.spec;
        let row_tasks = crate::kernels::encode_tasks(s.codecs.k, s.head_dim)
            + crate::kernels::encode_tasks(s.codecs.v, s.head_dim);
        let tasks = n as u64 * s.kv_heads as u64 * row_tasks as u64;
        let max_groups = self
            .ctx
            .device
            .limits()
            .max_compute_workgroups_per_dimension as u64;
        let items = (WIDE_ITEMS as u64).max(tasks.div_ceil(256 * max_groups)) as u32;
        // Rows a wide workgroup encodes cooperatively (rotated codecs): a few passes each.
        let rows = n as u64 * s.kv_heads as u64;
        let coop_rows = (COOP_ROWS as u64).max(rows.div_ceil(max_groups)) as u32;
        let cooperative = s.codecs.k.kind.is_rotated() || s.codecs.v.kind.is_rotated();
        let coop_groups = if cooperative {
            rows.div_ceil(coop_rows as u64)
        } else {
            0
        };
        let wide_groups = tasks.div_ceil(256 * items as u64).max(coop_groups) as u32;
        let params = self.uniform(
            "kvq append params",
            [n, items, coop_rows, first, stride, 0, 0, 0],
        )?;
        let bind_group = self.bind(
            "kvq append input",
            &self.pipes.layouts().append_input,
            &[k, v, &params],
        )?;
        Ok(AppendInput {
            cache: self.id,
            bind_group,
            n,
            input,
            wide_groups,
            params,
        })
    }

    /// Prepares a caller's query buffer (`[batch, q_heads, head_dim]` f32, STORAGE) and output
    /// buffer (same shape, STORAGE) for [`KvCache::attend`].
    pub fn attend_io(&self, q: &wgpu::Buffer, out: &wgpu::Buffer) -> Result<AttendIo> {
        self.check_queries(Queries { q, out }, 1)?;
        check_distinct(&[("out", out)], &[("q", q)])?;
        Ok(AttendIo {
            cache: self.id,
            bind_group: self.bind("kvq attend io", &self.pipes.layouts().decode_io, &[q, out])?,
        })
    }

    /// Prepares the buffers of a fused decode step: `k`, `v` hold `n` new tokens per
    /// sequence (`[batch, n, kv_heads, head_dim]` of `input` elements); `q` and `out` are
    /// `[batch, q_heads, head_dim]` f32. All need STORAGE usage. Where
    /// [`KvCache::steps_as_chunks`], a step of one token is prepared and recorded as a chunk
    /// of 1 ([`KvCache::chunk_io`]).
    pub fn step_io(
        &self,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        n: u32,
        input: InputType,
        q: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Result<StepIo> {
        self.check_new_tokens(NewTokens { k, v, n, input })?;
        self.check_queries(Queries { q, out }, 1)?;
        check_distinct(&[("out", out)], &[("q", q), ("k", k), ("v", v)])?;
        if n == 1 && self.steps_as_chunks() {
            return Ok(StepIo {
                cache: self.id,
                path: StepPath::Chunk(self.chunk_io(k, v, 1, input, q, out)?),
                n,
                input,
            });
        }
        // Built here, once, so that recording a step never compiles a pipeline.
        self.pipes.step(input)?;
        let params = self.uniform("kvq step params", [n, 0, 0, 0])?;
        let bind_group = self.bind(
            "kvq step io",
            &self.pipes.layouts().step_io,
            &[q, out, k, v, &params],
        )?;
        Ok(StepIo {
            cache: self.id,
            path: StepPath::Fused(bind_group),
            n,
            input,
        })
    }

    /// Prepares the buffers of a chunk of `n` new tokens per sequence attended causally
    /// ([`KvCache::chunk`]): `k`, `v` as for [`KvCache::append_input`]; `q` and `out` are
    /// `[batch, n, q_heads, head_dim]` f32, new token `i`'s queries at row `i`. All need STORAGE
    /// usage. The chunk binds the cache's chunk scratch, shared with its other `ChunkIo`s
    /// ([`ChunkIo::scratch_bytes`]), for the queries of one slice (at most
    /// [`CHUNK_SLICE_TOKENS`], and as many as the adapter's binding limit holds; a longer
    /// chunk is attended slice after slice in one recording; with recent exact tokens, slices
    /// of [`EXACT_CHUNK_SLICE`], each appended just before it is attended, so that every query
    /// sees the exact tokens a decode step at its position would; with a sliding window, a
    /// chunk longer than its slack, `ring - window + 1` tokens (with a window per layer the
    /// smallest over the layers, [`crate::CacheSpec::layer_capacity`]), goes so too, in slices
    /// of at most the slack, so that no ring overwrites a position a query attends); an
    /// adapter whose binding limit holds not even one query's is refused, typed.
    pub fn chunk_io(
        &self,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        n: u32,
        input: InputType,
        q: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Result<ChunkIo> {
        self.chunk_io_with(NewTokens { k, v, n, input }, Queries { q, out }, None)
    }

    /// [`KvCache::chunk_io`], and each output row's log-sum-exp of its scaled scores
    /// (`ln Σ exp(q·k · scale)` over the positions it attends, in the codec's arithmetic) to
    /// `lse`, `[batch, n, q_heads]` f32 with STORAGE usage, so that an engine can merge kvq's
    /// attention with its own over other keys (rows of an empty sequence get -3e38).
    #[allow(clippy::too_many_arguments)]
    pub fn chunk_io_lse(
        &self,
        k: &wgpu::Buffer,
        v: &wgpu::Buffer,
        n: u32,
        input: InputType,
        q: &wgpu::Buffer,
        out: &wgpu::Buffer,
        lse: &wgpu::Buffer,
    ) -> Result<ChunkIo> {
        self.chunk_io_with(NewTokens { k, v, n, input }, Queries { q, out }, Some(lse))
    }

    fn chunk_io_with(
        &self,
        new: NewTokens,
        io: Queries,
        lse: Option<&wgpu::Buffer>,
    ) -> Result<ChunkIo> {
        let s = &self.spec;
        let NewTokens { k, v, n, input } = new;
        let Queries { q, out } = io;
        self.check_new_tokens(new)?;
        self.check_queries(io, n)?;
        if let Some(b) = lse {
            let need = s.batch as u64 * n as u64 * s.q_heads as u64 * 4;
            self.check_buffer("lse", b, need, wgpu::BufferUsages::STORAGE)?;
        }
        // With recent exact tokens, slices of at most EXACT_CHUNK_SLICE, each appended before
        // it is attended: the ring then still holds the recent tokens before each query. A
        // chunk longer than a sliding window's slack (a ring of `ring` slots holds the window
        // of its first query only while at most `ring - window + 1` tokens are appended
        // before it is attended) goes so too, in slices of at most the slack.
        let slack = self.window_slack();
        let interleaved = s.exact.recent > 0 || n > slack;
        let most = if s.exact.recent > 0 {
            EXACT_CHUNK_SLICE
        } else {
            CHUNK_SLICE_TOKENS.min(slack)
        };
        // K and V are read by the appends, before the slices' attention writes out and lse:
        // they may share a buffer with those, but not where each slice is appended just before
        // it is attended, as a slice's outputs would then overwrite later slices' K/V.
        let reads = [("q", q), ("k", k), ("v", v)];
        let reads = &reads[..if interleaved { 3 } else { 1 }];
        match lse {
            Some(l) => check_distinct(&[("out", out), ("lse", l)], reads)?,
            None => check_distinct(&[("out", out)], reads)?,
        }
        // The prefill kernel takes slices of at least `from` tokens, with scratch of its own
        // after the partials.
        let prefill = self.layout.prefill.filter(|&(_, from)| from <= n.min(most));
        let prefill_bytes = match prefill {
            Some(_) => plan::prefill_query_floats(s, &self.cfg) * 4,
            None => 0,
        };
        // Slices of at most `most` queries, and as many as the binding limit holds.
        let per_query = self.partials_bytes() + prefill_bytes;
        let limit = self.ctx.device.limits().max_storage_buffer_binding_size;
        let fit = (limit / per_query).min(u32::MAX as u64) as u32;
        if fit == 0 {
            return Err(KvqError::AdapterTooWeak {
                adapter: self.ctx.info.name.clone(),
                what: "max_storage_buffer_binding_size (the decode scratch of one chunk query)"
                    .into(),
                needed: per_query,
                have: limit,
            });
        }
        let slice = n.clamp(1, most.min(fit));
        let scratch = per_query * slice as u64;
        let append = if interleaved {
            None
        } else {
            Some(self.append_slice(new, 0, n)?)
        };
        // Built here, once, so that recording a chunk never compiles a pipeline.
        self.pipes.chunk()?;
        if prefill.is_some() {
            self.pipes.prefill_rotate()?;
            self.pipes.prefill()?;
        }
        let partials = self.chunk_scratch(scratch)?;
        let cq = self.cfg.chunk_queries();
        // Where no log-sum-exp is asked for, the binding is a stand-in the kernel never writes.
        let standin;
        let lse_buf = match lse {
            Some(b) => b,
            None => {
                standin = self.ctx.create_buffer_checked(&wgpu::BufferDescriptor {
                    label: Some("kvq chunk lse stand-in"),
                    size: 16,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                })?;
                &standin
            }
        };
        let mut slices = Vec::new();
        for first in (0..n).step_by(slice as usize) {
            let count = slice.min(n - first);
            // Tokens of the chunk appended when the slice is attended.
            let appended = if interleaved { first + count } else { n };
            let query_groups = count.div_ceil(cq);
            let row_tiles = prefill
                .filter(|&(_, from)| count >= from)
                .map(|(rows, _)| (count * s.gqa()).div_ceil(rows));
            let groups = row_tiles.unwrap_or(query_groups);
            let tiled = row_tiles.is_some();
            let splits = self
                .ctx
                .tuning()
                .chunk_splits(s, groups, tiled, self.layout.splits);
            let words = [
                n,
                first,
                count,
                lse.is_some() as u32,
                appended,
                splits,
                0,
                0,
            ];
            let params = self.uniform("kvq chunk slice", words)?;
            let bufs = [q, out, &params, lse_buf];
            let append = if interleaved {
                Some(self.append_slice(new, first, count)?)
            } else {
                None
            };
            slices.push(ChunkSlice {
                io: self.bind("kvq chunk io", &self.pipes.layouts().chunk_io, &bufs)?,
                count,
                query_groups,
                row_tiles,
                splits,
                append,
            });
        }
        let mut store = Vec::with_capacity(self.layers.len());
        for segs in &self.layers {
            let mut groups = Vec::with_capacity(segs.len());
            for seg in segs {
                // The segment's decode group (params, K, V, lengths) with this scratch.
                let mut bufs: Vec<&wgpu::Buffer> = seg.decode_bg.buffers.iter().collect();
                bufs[4] = &partials;
                groups.push(self.bind(
                    "kvq chunk store",
                    &self.pipes.layouts().decode_store,
                    &bufs,
                )?);
            }
            store.push(groups);
        }
        Ok(ChunkIo {
            cache: self.id,
            scratch_bytes: partials.size(),
            n,
            input,
            append,
            slices,
            store,
        })
    }

    /// The most new tokens a chunk may append before it attends them: over every layer with
    /// a window, `ring - window + 1` (its ring still holds the window of the chunk's first
    /// query); unbounded without a window.
    fn window_slack(&self) -> u32 {
        let s = &self.spec;
        (0..s.layers)
            .filter_map(|l| s.layer_window(l).map(|w| s.layer_capacity(l) - w + 1))
            .min()
            .unwrap_or(u32::MAX)
    }

    /// The chunks' shared decode scratch, at least `bytes` long: the cache's own while it is
    /// that long, else a longer one that takes its place (the ChunkIos bound to the old one
    /// keep it alive).
    fn chunk_scratch(&self, bytes: u64) -> Result<wgpu::Buffer> {
        let mut held = self.chunk_scratch.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = held.as_ref().filter(|b| b.size() >= bytes) {
            return Ok(b.clone());
        }
        let b = self.ctx.create_buffer_checked(&wgpu::BufferDescriptor {
            label: Some("kvq chunk partials"),
            size: bytes,
            // COPY_SRC: crate::export reads every buffer's initial bytes.
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })?;
        *held = Some(b.clone());
        Ok(b)
    }

    fn check_buffer(
        &self,
        what: &str,
        buf: &wgpu::Buffer,
        need: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<()> {
        if buf.size() < need {
            return Err(KvqError::BadBuffer {
                what: what.into(),
                problem: format!("{} bytes, needs at least {need}", buf.size()),
            });
        }
        if !buf.usage().contains(usage) {
            return Err(KvqError::BadBuffer {
                what: what.into(),
                problem: format!("usage {:?} lacks {usage:?}", buf.usage()),
            });
        }
        Ok(())
    }

    fn check_new_tokens(&self, new: NewTokens) -> Result<()> {
        let NewTokens { k, v, n, input } = new;
        let s = &self.spec;
        if n == 0 {
            return Err(KvqError::InvalidArgument(
                "an append, step or chunk needs at least one new token per sequence".into(),
            ));
        }
        // (A layer with a window never fills; one without holds at most `capacity`.)
        let global = (0..s.layers).any(|l| s.layer_window(l).is_none());
        if n > s.capacity && global {
            return Err(KvqError::CapacityExceeded {
                layer: 0,
                len: 0,
                n,
                capacity: s.capacity,
            });
        }
        let need = s.batch as u64 * n as u64 * s.kv_heads as u64 * s.head_dim as u64 * input.size();
        self.check_buffer("k", k, need, wgpu::BufferUsages::STORAGE)?;
        self.check_buffer("v", v, need, wgpu::BufferUsages::STORAGE)
    }

    /// Query and output buffers for `tokens` queries per sequence.
    fn check_queries(&self, io: Queries, tokens: u32) -> Result<()> {
        let Queries { q, out } = io;
        let s = &self.spec;
        let need = s.batch as u64 * tokens as u64 * s.q_heads as u64 * s.head_dim as u64 * 4;
        self.check_buffer("q", q, need, wgpu::BufferUsages::STORAGE)?;
        self.check_buffer("out", out, need, wgpu::BufferUsages::STORAGE)
    }

    /// A 16-byte uniform written once when a binding is prepared, never per step.
    fn uniform<const N: usize>(&self, label: &str, words: [u32; N]) -> Result<wgpu::Buffer> {
        let device = &self.ctx.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buf = init_buffer(
            device,
            label,
            bytemuck::cast_slice(&words),
            // COPY_SRC: crate::export reads every buffer's initial bytes.
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_SRC,
        );
        let (adapter, what, needed) = (self.ctx.info.name.clone(), label.to_string(), buf.size());
        crate::wait::check_scope(device, scope, move |e| KvqError::OutOfMemory {
            adapter,
            what,
            needed,
            detail: e.to_string(),
        })?;
        self.ctx.counters().add_upload(16);
        Ok(buf)
    }

    /// Binds caller buffers; a buffer wgpu refuses to bind (one of another device, say) is a
    /// typed error here rather than a report to the device's uncaptured-error handler.
    fn bind(
        &self,
        label: &str,
        layout: &wgpu::BindGroupLayout,
        bufs: &[&wgpu::Buffer],
    ) -> Result<Bound> {
        let scope = self
            .ctx
            .device
            .push_error_scope(wgpu::ErrorFilter::Validation);
        let bound = bind_buffers(&self.ctx.device, label, layout, bufs);
        let what = label.to_string();
        crate::wait::check_scope(&self.ctx.device, scope, move |e| KvqError::BadBuffer {
            what,
            problem: format!("wgpu cannot bind it to this cache's device: {e}"),
        })?;
        Ok(bound)
    }
}

/// That no buffer kvq writes (`writes`) is also passed as another argument: wgpu refuses a
/// buffer bound both writable and read-only in one dispatch, and would say so only when the
/// caller's encoder is finished (as a panic there).
fn check_distinct(writes: &[(&str, &wgpu::Buffer)], reads: &[(&str, &wgpu::Buffer)]) -> Result<()> {
    for (i, &(w, wb)) in writes.iter().enumerate() {
        let others = writes[i + 1..].iter().chain(reads);
        if let Some((o, _)) = others.into_iter().find(|(_, b)| *b == wb) {
            return Err(KvqError::BadBuffer {
                what: w.into(),
                problem: format!(
                    "is also passed as '{o}': kvq writes it, so it needs a buffer of its own"
                ),
            });
        }
    }
    Ok(())
}
