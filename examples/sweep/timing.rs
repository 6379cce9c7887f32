//! Clocks shared by the decode steps and the bandwidth probe: GPU timestamp pairs around a
//! compute pass, the host's ways to wait for a submission, and the median both report.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kvq::GpuContext;

use crate::args::Wait;

/// Each timed pass's two timestamps resolve to their own aligned slot.
const RESOLVE_STRIDE: u64 = wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT;

/// A begin/end timestamp pair per slot, for passes timed on the GPU's own clock.
pub struct Timestamps {
    set: wgpu::QuerySet,
    resolved: wgpu::Buffer,
}

impl Timestamps {
    /// Room for `slots` timed passes; None where the device has no timestamps (the caller
    /// falls back on the host clock).
    pub fn new(ctx: &GpuContext, slots: usize) -> Option<Timestamps> {
        ctx.capabilities().timestamps.then(|| Timestamps {
            set: ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: None,
                ty: wgpu::QueryType::Timestamp,
                count: 2 * slots as u32,
            }),
            resolved: ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: RESOLVE_STRIDE * slots as u64,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
        })
    }

    /// The writes that time one compute pass into `slot`.
    pub fn writes(&self, slot: usize) -> wgpu::ComputePassTimestampWrites<'_> {
        wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(2 * slot as u32),
            end_of_pass_write_index: Some(2 * slot as u32 + 1),
        }
    }

    /// Resolves `slot`'s pair (after its pass, in the same encoder).
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder, slot: usize) {
        let s = slot as u32;
        enc.resolve_query_set(
            &self.set,
            2 * s..2 * s + 2,
            &self.resolved,
            RESOLVE_STRIDE * slot as u64,
        );
    }

    /// Milliseconds between each resolved pair of `slots`, read back from the device.
    pub fn read_ms(&self, ctx: &GpuContext, slots: Range<usize>) -> Result<Vec<f64>, String> {
        let qb = &self.resolved;
        let rb = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: qb.size(),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(qb, 0, &rb, 0, qb.size());
        ctx.queue.submit([enc.finish()]);
        rb.map_async(wgpu::MapMode::Read, .., |_| {});
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| e.to_string())?;
        let view = rb.get_mapped_range(..).map_err(|e| format!("{e:?}"))?;
        let t: &[u64] = bytemuck::cast_slice(&view);
        let w = (RESOLVE_STRIDE / 8) as usize;
        let period = ctx.queue.get_timestamp_period() as f64;
        Ok(slots
            .map(|s| t[w * s + 1].wrapping_sub(t[w * s]) as f64 * period / 1e6)
            .collect())
    }
}

/// Blocks in the driver until submission `idx` is done.
pub fn wait_for(ctx: &GpuContext, idx: wgpu::SubmissionIndex) -> Result<(), wgpu::PollError> {
    ctx.device.poll(wgpu::PollType::Wait {
        submission_index: Some(idx),
        timeout: None,
    })?;
    Ok(())
}

/// Submits `cmd` and returns once the GPU has finished it.
pub fn submit_and_wait(
    ctx: &GpuContext,
    cmd: wgpu::CommandBuffer,
    wait: Wait,
) -> Result<(), wgpu::PollError> {
    match wait {
        Wait::Block => wait_for(ctx, ctx.queue.submit([cmd]))?,
        Wait::Spin => {
            let done = Arc::new(AtomicBool::new(false));
            let flag = done.clone();
            ctx.queue.submit([cmd]);
            ctx.queue
                .on_submitted_work_done(move || flag.store(true, Ordering::Release));
            while !done.load(Ordering::Acquire) {
                ctx.device.poll(wgpu::PollType::Poll)?;
            }
        }
    }
    Ok(())
}

/// The middle value (the mean of the middle two of an even count); sorts `v`.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A duration in milliseconds, the unit of every time the sweep reports.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// GB/s of reading `bytes` in `ms` milliseconds.
pub fn gbps(bytes: u64, ms: f64) -> f64 {
    bytes as f64 / (ms * 1e-3) / 1e9
}
