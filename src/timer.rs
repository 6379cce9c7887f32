//! GPU time per kernel, for benchmarks: where a step's or a chunk's time goes (the prefill
//! kernel against its reduce, the appends).
//!
//! A [`DispatchTimer`] writes a timestamp before and after each dispatch kvq records into
//! the caller's compute pass ([`KvCache::chunk_in_timed_pass`],
//! [`KvCache::step_in_timed_pass`]), named by the kernel's entry point. Timestamps inside a
//! pass need the device feature `TIMESTAMP_QUERY_INSIDE_PASSES`
//! ([`crate::Capabilities::timestamps_in_passes`]); they may also separate dispatches the
//! driver would otherwise overlap, so time steps without the timer and use it for the split.

use crate::cache::{Bound, ChunkIo, KvCache, Recorder, StepIo};
use crate::context::GpuContext;
use crate::dispatch::{Dispatch, GridShape};
use crate::error::{KvqError, Result};

/// The most dispatches one timer holds: wgpu's query-set limit, two queries a dispatch.
pub const MAX_TIMED_DISPATCHES: u32 = wgpu::QUERY_SET_MAX_QUERIES / 2;

/// Timestamps around the dispatches kvq records, until [`DispatchTimer::clear`].
#[derive(Debug)]
pub struct DispatchTimer {
    set: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    capacity: u32,
    /// The entry point of each timed dispatch, in order.
    entries: Vec<&'static str>,
    /// Dispatches recorded untimed because the timer was full.
    dropped: u32,
}

/// The GPU time of one kernel's dispatches ([`DispatchTimer::read`]).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// The WGSL entry point (`split`, `reduce`, `prefill`, `prefill_q`, `append_small`, ...).
    pub entry: &'static str,
    /// Its timed dispatches.
    pub dispatches: u32,
    /// Their GPU time summed, in milliseconds.
    pub ms: f64,
}

impl DispatchTimer {
    /// A timer for up to `dispatches` dispatches (at most [`MAX_TIMED_DISPATCHES`]; later
    /// ones are recorded untimed and counted by [`DispatchTimer::dropped`]). A typed error
    /// where the device has no timestamps inside passes.
    pub fn new(ctx: &GpuContext, dispatches: u32) -> Result<DispatchTimer> {
        if !ctx.capabilities().timestamps_in_passes {
            return Err(KvqError::InvalidArgument(format!(
                "a dispatch timer needs timestamps inside compute passes, which '{}' does not offer",
                ctx.info.name
            )));
        }
        if dispatches == 0 || dispatches > MAX_TIMED_DISPATCHES {
            return Err(KvqError::InvalidArgument(format!(
                "a dispatch timer holds 1 to {MAX_TIMED_DISPATCHES} dispatches, not {dispatches}"
            )));
        }
        let queries = 2 * dispatches;
        Ok(DispatchTimer {
            set: ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("kvq dispatch timer"),
                ty: wgpu::QueryType::Timestamp,
                count: queries,
            }),
            resolved: ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kvq dispatch timer resolved"),
                size: 8 * queries as u64,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            capacity: dispatches,
            entries: Vec::new(),
            dropped: 0,
        })
    }

    /// Forgets every timed dispatch, so the timer can time the next step.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.dropped = 0;
    }

    /// Dispatches timed since the last [`DispatchTimer::clear`].
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no dispatch has been timed since the last [`DispatchTimer::clear`].
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Dispatches recorded untimed because the timer was full.
    pub fn dropped(&self) -> u32 {
        self.dropped
    }

    /// Records the resolve of the timed dispatches' timestamps into `encoder`, after the pass
    /// that holds them has ended; submit it before [`DispatchTimer::read`].
    pub fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        let n = 2 * self.entries.len() as u32;
        if n > 0 {
            encoder.resolve_query_set(&self.set, 0..n, &self.resolved, 0);
        }
    }

    /// Reads the resolved timestamps back (blocking; a download in [`GpuContext::stats`]) and
    /// sums each kernel's dispatches, in the order the kernels were first dispatched.
    /// Natively only; in a browser, [`DispatchTimer::read_async`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read(&self, ctx: &GpuContext) -> Result<Vec<KernelTime>> {
        pollster::block_on(self.read_async(ctx))
    }

    /// [`DispatchTimer::read`] without blocking (for a browser; natively it waits in place).
    pub async fn read_async(&self, ctx: &GpuContext) -> Result<Vec<KernelTime>> {
        let n = 2 * self.entries.len() as u64;
        if n == 0 {
            return Ok(Vec::new());
        }
        let bytes = ctx.read_back_async(&self.resolved, 0, 8 * n).await?;
        // (Copied out: a byte vector need not be aligned for u64.)
        let t: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes);
        let period = ctx.queue.get_timestamp_period() as f64;
        let mut times: Vec<KernelTime> = Vec::new();
        for (i, &entry) in self.entries.iter().enumerate() {
            let ms = t[2 * i + 1].wrapping_sub(t[2 * i]) as f64 * period / 1e6;
            match times.iter_mut().find(|k| k.entry == entry) {
                Some(k) => {
                    k.dispatches += 1;
                    k.ms += ms;
                }
                None => times.push(KernelTime {
                    entry,
                    dispatches: 1,
                    ms,
                }),
            }
        }
        Ok(times)
    }
}

/// A compute pass that writes the timer's timestamps around each dispatch.
struct TimedPass<'a, 'p> {
    pass: &'a mut wgpu::ComputePass<'p>,
    timer: &'a mut DispatchTimer,
}

impl Recorder for TimedPass<'_, '_> {
    fn set_pipeline(&mut self, pipeline: &wgpu::ComputePipeline) {
        self.pass.set_pipeline(pipeline);
    }
    fn set_bind_group(&mut self, index: u32, group: &Bound) {
        Recorder::set_bind_group(self.pass, index, group);
    }
    fn dispatch_workgroups(&mut self, x: u32, y: u32, z: u32) {
        self.pass.dispatch_workgroups(x, y, z);
    }
    fn dispatch(&mut self, rule: &Dispatch, shape: &GridShape) {
        let [x, y, z] = rule.workgroups(shape);
        let t = &mut *self.timer;
        let i = t.entries.len() as u32;
        if i < t.capacity {
            self.pass.write_timestamp(&t.set, 2 * i);
            self.pass.dispatch_workgroups(x, y, z);
            self.pass.write_timestamp(&t.set, 2 * i + 1);
            t.entries.push(rule.entry);
        } else {
            self.pass.dispatch_workgroups(x, y, z);
            t.dropped += 1;
        }
    }
}

impl KvCache {
    /// [`KvCache::chunk_in_pass`] with each dispatch timed by `timer`.
    pub fn chunk_in_timed_pass(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        layer: u32,
        io: &ChunkIo,
        timer: &mut DispatchTimer,
    ) -> Result<()> {
        self.record_chunk(&mut TimedPass { pass, timer }, layer, io)
    }

    /// [`KvCache::step_in_pass`] with each dispatch timed by `timer`.
    pub fn step_in_timed_pass(
        &mut self,
        pass: &mut wgpu::ComputePass<'_>,
        layer: u32,
        io: &StepIo,
        timer: &mut DispatchTimer,
    ) -> Result<()> {
        self.record_step(&mut TimedPass { pass, timer }, layer, io)
    }
}
