//! Recording appends, decode attention and fused steps, into a compute pass or any
//! [`Recorder`].

use super::bind::Bound;
use super::io::{AppendInput, AttendIo, ChunkIo, StepIo, StepPath};
use super::kv_cache::KvCache;
use crate::dispatch::{self, Dispatch, GridShape, SMALL_APPEND_MAX_TOKENS};
use crate::error::{KvqError, Result};
use crate::kernels::InputType;

/// Where kvq records its dispatches: a compute pass, or [`crate::export`]'s plan recorder.
/// Every dispatch kvq records goes through one of the `record_*` functions below, so an
/// exported plan is exactly what the cache records natively.
pub(crate) trait Recorder {
    fn set_pipeline(&mut self, pipeline: &wgpu::ComputePipeline);
    fn set_bind_group(&mut self, index: u32, group: &Bound);
    fn dispatch_workgroups(&mut self, x: u32, y: u32, z: u32);
    /// Dispatches by `rule`'s grid for `shape`: the only way kvq dispatches a kernel.
    fn dispatch(&mut self, rule: &Dispatch, shape: &GridShape) {
        let [x, y, z] = rule.workgroups(shape);
        self.dispatch_workgroups(x, y, z);
    }
}

impl Recorder for wgpu::ComputePass<'_> {
    fn set_pipeline(&mut self, pipeline: &wgpu::ComputePipeline) {
        wgpu::ComputePass::set_pipeline(self, pipeline);
    }
    fn set_bind_group(&mut self, index: u32, group: &Bound) {
        wgpu::ComputePass::set_bind_group(self, index, &group.group, &[]);
    }
    fn dispatch_workgroups(&mut self, x: u32, y: u32, z: u32) {
        wgpu::ComputePass::dispatch_workgroups(self, x, y, z);
    }
}

/// A compute pass of kvq's own in the caller's encoder (for the encoder-level calls).
fn own_pass<'e>(encoder: &'e mut wgpu::CommandEncoder, label: &str) -> wgpu::ComputePass<'e> {
    encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
        label: Some(label),
        timestamp_writes: None,
    })
}

impl KvCache {
    /// Records an append into `encoder` (in a compute pass of its own). A NaN or ±Inf input
    /// value is stored as 0 (see [`KvCache::append_input`]).
    pub fn append(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        layer: u32,
        input: &AppendInput,
    ) -> Result<()> {
        self.append_in_pass(&mut own_pass(encoder, "kvq append"), layer, input)
    }

    /// Records decode attention into `encoder` (in a compute pass of its own).
    pub fn attend(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        layer: u32,
        io: &AttendIo,
    ) -> Result<()> {
        self.attend_in_pass(&mut own_pass(encoder, "kvq attend"), layer, io)
    }

    /// Records a fused decode step into `encoder` (in a compute pass of its own).
    pub fn step(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        layer: u32,
        io: &StepIo,
    ) -> Result<()> {
        self.step_in_pass(&mut own_pass(encoder, "kvq step"), layer, io)
    }

    /// Records an append of `input`'s tokens to `layer` into an open compute pass.
    ///
    /// Refused (nothing recorded) when any sequence would pass the capacity.
    pub fn append_in_pass(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        layer: u32,
        input: &AppendInput,
    ) -> Result<()> {
        self.record_append(pass, layer, input)
    }

    /// Records decode attention of `io`'s query over `layer`'s stored prefix into an open
    /// compute pass. Reads the lengths on the GPU: nothing is uploaded. A sequence with no
    /// tokens gets a zero output.
    pub fn attend_in_pass(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        layer: u32,
        io: &AttendIo,
    ) -> Result<()> {
        self.record_attend(pass, layer, io)
    }

    /// Records a fused decode step for `layer` into an open compute pass: appends the new
    /// tokens and attends the query over the whole prefix including them, in two dispatches
    /// (the split kernel writes the new rows it covers; the reduce commits the length).
    /// Same result as [`KvCache::append_in_pass`] then [`KvCache::attend_in_pass`]; a NaN or
    /// ±Inf input value is stored as 0 (see [`KvCache::append_input`]).
    pub fn step_in_pass(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        layer: u32,
        io: &StepIo,
    ) -> Result<()> {
        self.record_step(pass, layer, io)
    }

    /// Records a chunk into its own compute pass of `encoder` (see [`KvCache::chunk_in_pass`]).
    pub fn chunk(
        &mut self,
        encoder: &mut wgpu::CommandEncoder,
        layer: u32,
        io: &ChunkIo,
    ) -> Result<()> {
        self.record_chunk(&mut own_pass(encoder, "kvq chunk"), layer, io)
    }

    /// Records `io`'s `n` new tokens per sequence into `layer` and their causal attention
    /// over the cache: new token `i` attends every stored position up to and including its
    /// own (`len + i`, `len` the length before the chunk), within the sliding window where one
    /// is set; the outputs go to `io`'s output buffer, `[batch, n, q_heads, head_dim]`. A
    /// chunk that would pass the capacity is refused, typed, with nothing recorded.
    ///
    /// For drafts and prompts: a speculative verify of `n` drafted tokens is one chunk, then
    /// [`KvCache::truncate`] drops the rejected ones. The attention is the split-K decode
    /// kernel with the query rows of several new tokens per workgroup (8 rows: 2 tokens at GQA
    /// 4, 8 at GQA 1), so a chunk reads the stored K/V once per workgroup's tokens, not once per
    /// token; each row still reads its query once per key, which is what bounds it on the
    /// measured GPUs (BENCHMARKS.md, "Chunks").
    pub fn chunk_in_pass(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        layer: u32,
        io: &ChunkIo,
    ) -> Result<()> {
        self.record_chunk(pass, layer, io)
    }

    /// [`KvCache::chunk_in_pass`] into any [`Recorder`].
    pub(crate) fn record_chunk(
        &mut self,
        pass: &mut impl Recorder,
        layer: u32,
        io: &ChunkIo,
    ) -> Result<()> {
        self.check_io(io.cache, "ChunkIo")?;
        self.check_layer(layer)?;
        let [split, reduce] = self.pipes.chunk()?.clone();
        // Only where a slice takes it (chunk_io built it then: recording compiles nothing).
        let prefill = match io.prefill() {
            true => Some((
                self.pipes.prefill_rotate()?.cloned(),
                self.pipes.prefill()?.clone(),
            )),
            false => None,
        };
        // The whole chunk is reserved first: a chunk that would pass the capacity records
        // nothing.
        self.reserve_append(layer, io.input, io.n)?;
        if let Some(a) = &io.append {
            self.dispatch_append(pass, layer, a)?;
        }
        for slice in &io.slices {
            if let Some(a) = &slice.append {
                self.dispatch_append(pass, layer, a)?;
            }
            let shape = GridShape {
                queries: slice.count,
                query_groups: slice.query_groups,
                row_tiles: slice.row_tiles.unwrap_or(1),
                splits: slice.splits,
                ..self.grid_shape()
            };
            let stores = &io.store[layer as usize];
            let kernel = match (&prefill, slice.row_tiles) {
                (Some((rotate, tiled)), Some(_)) => {
                    // A rotated K's queries are rotated into the scratch first.
                    if let Some(rotate) = rotate {
                        pass.set_bind_group(1, &slice.io);
                        pass.set_pipeline(rotate);
                        pass.set_bind_group(0, &stores[0]);
                        pass.dispatch(&dispatch::PREFILL_Q, &shape);
                        self.ctx.counters().add_dispatches(1);
                    }
                    (tiled, &dispatch::PREFILL)
                }
                _ => (&split, &dispatch::CHUNK_SPLIT),
            };
            self.record_attention(pass, kernel, &reduce, &slice.io, stores.iter(), &shape);
        }
        Ok(())
    }

    /// [`KvCache::append_in_pass`] into any [`Recorder`].
    pub(crate) fn record_append(
        &mut self,
        pass: &mut impl Recorder,
        layer: u32,
        input: &AppendInput,
    ) -> Result<()> {
        self.check_io(input.cache, "AppendInput")?;
        self.reserve_append(layer, input.input, input.n)?;
        self.dispatch_append(pass, layer, input)
    }

    /// Reserves `n` tokens of every sequence of `layer` for an append of `input` elements,
    /// its pipelines built first (an error leaves the lengths as they were).
    fn reserve_append(&mut self, layer: u32, input: InputType, n: u32) -> Result<()> {
        self.pipes.append(input, n)?;
        self.reserve(layer, n)
    }

    /// An append's dispatches, its tokens reserved already.
    fn dispatch_append(
        &mut self,
        pass: &mut impl Recorder,
        layer: u32,
        input: &AppendInput,
    ) -> Result<()> {
        let pipes = self.pipes.append(input.input, input.n)?.to_vec();
        let segs = &self.layers[layer as usize];
        pass.set_bind_group(1, &input.bind_group);
        let mut dispatches = 0;
        let shape = GridShape {
            wide_groups: input.wide_groups,
            ..self.grid_shape()
        };
        if input.n <= SMALL_APPEND_MAX_TOKENS {
            pass.set_pipeline(&pipes[0]);
            for seg in segs {
                pass.set_bind_group(0, &seg.append_bg);
                pass.dispatch(&dispatch::APPEND_SMALL, &shape);
                dispatches += 1;
            }
        } else {
            pass.set_pipeline(&pipes[0]);
            for seg in segs {
                pass.set_bind_group(0, &seg.append_bg);
                pass.dispatch(&dispatch::APPEND_WIDE, &shape);
                dispatches += 1;
            }
            pass.set_pipeline(&pipes[1]);
            pass.dispatch(&dispatch::APPEND_COMMIT, &shape);
            dispatches += 1;
        }
        self.ctx.counters().add_dispatches(dispatches);
        Ok(())
    }

    /// [`KvCache::attend_in_pass`] into any [`Recorder`].
    pub(crate) fn record_attend(
        &self,
        pass: &mut impl Recorder,
        layer: u32,
        io: &AttendIo,
    ) -> Result<()> {
        self.check_io(io.cache, "AttendIo")?;
        self.check_layer(layer)?;
        let [split, reduce] = self.pipes.attend();
        let stores = self.layers[layer as usize].iter().map(|s| &s.decode_bg);
        let shape = self.grid_shape();
        let split = (split, &dispatch::SPLIT);
        self.record_attention(pass, split, reduce, &io.bind_group, stores, &shape);
        Ok(())
    }

    /// [`KvCache::step_in_pass`] into any [`Recorder`].
    pub(crate) fn record_step(
        &mut self,
        pass: &mut impl Recorder,
        layer: u32,
        io: &StepIo,
    ) -> Result<()> {
        self.check_io(io.cache, "StepIo")?;
        let bind_group = match &io.path {
            StepPath::Fused(b) => b,
            StepPath::Chunk(c) => return self.record_chunk(pass, layer, c),
        };
        self.check_layer(layer)?;
        let [split, reduce] = self.pipes.step(io.input)?.clone();
        self.reserve(layer, io.n)?;
        let stores = self.layers[layer as usize].iter().map(|s| &s.step_bg);
        let shape = self.grid_shape();
        let split = (&split, &dispatch::SPLIT);
        self.record_attention(pass, split, &reduce, bind_group, stores, &shape);
        Ok(())
    }

    /// The split dispatch of every storage segment (`stores`: their group-0 bind groups; `split`:
    /// the pipeline and its grid rule), then the reduce: shared by attend, the fused step and
    /// chunks, which differ in pipelines, bind groups and queries only. (An iterator, not a collected list: this runs every
    /// decode step and allocates nothing.)
    fn record_attention<'a>(
        &self,
        pass: &mut impl Recorder,
        split: (&wgpu::ComputePipeline, &Dispatch),
        reduce: &wgpu::ComputePipeline,
        io: &Bound,
        stores: impl Iterator<Item = &'a Bound>,
        shape: &GridShape,
    ) {
        pass.set_bind_group(1, io);
        pass.set_pipeline(split.0);
        let mut dispatches = 1;
        for store in stores {
            pass.set_bind_group(0, store);
            pass.dispatch(split.1, shape);
            dispatches += 1;
        }
        pass.set_pipeline(reduce);
        pass.dispatch(&dispatch::REDUCE, shape);
        self.ctx.counters().add_dispatches(dispatches);
    }

    /// What this cache's dispatch grids are evaluated on ([`crate::dispatch`]).
    pub fn grid_shape(&self) -> GridShape {
        GridShape {
            batch: self.spec.batch,
            q_heads: self.spec.q_heads,
            kv_heads: self.spec.kv_heads,
            row_groups: crate::kernels::row_groups(self.spec.gqa()).1,
            splits: self.layout.splits,
            exact: self.spec.exact.any() as u32,
            wide_groups: 0,
            queries: 1,
            query_groups: 1,
            row_tiles: 1,
        }
    }

    /// Refuses (with the host mirror unchanged) an append of `n` tokens that would pass the
    /// capacity of any sequence of `layer` (for a layer with a sliding window, which never
    /// fills: the range of its u32 position count); otherwise advances the mirror.
    fn reserve(&mut self, layer: u32, n: u32) -> Result<()> {
        self.check_layer(layer)?;
        let b = self.spec.batch as usize;
        let limit = match self.spec.layer_window(layer) {
            Some(_) => u32::MAX as u64,
            None => self.spec.capacity as u64,
        };
        let lens = &mut self.host_lens[layer as usize * b..(layer as usize + 1) * b];
        if let Some(&len) = lens.iter().find(|&&l| l as u64 + n as u64 > limit) {
            return Err(KvqError::CapacityExceeded {
                layer,
                len,
                n,
                capacity: self.spec.capacity,
            });
        }
        lens.iter_mut().for_each(|l| *l += n);
        Ok(())
    }
}
