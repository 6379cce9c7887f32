//! Waiting for the GPU, and not waiting where a browser forbids it.
//!
//! kvq waits for the device in two places: it checks its own GPU work (allocations, kernel
//! builds, bindings) through wgpu error scopes, so that a failure is a typed error of the call
//! that caused it, and it reads buffers back (the host API, timers, replay plans). Natively
//! (Vulkan, Metal, DX12) both wait in place. In a browser (`wasm32`) both are answered only
//! through the page's event loop, which a wasm call must first return to, so there kvq never
//! blocks:
//! * an error scope the browser has not answered by the time the call that opened it returns
//!   is kept, per device, until [`GpuContext::check_errors_async`] awaits it (which
//!   [`crate::KvCache::new_async`] does for a new cache);
//! * read-backs are `async` ([`crate::KvCache::attend_host_async`] and the other `_async`
//!   forms, which also work natively, waiting in place there); their blocking forms, and
//!   [`GpuContext::new`], exist only natively.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::context::GpuContext;
use crate::error::{KvqError, Result};

/// Pops `scope` and turns the error it caught, if any, into `err(e)`.
///
/// Natively this waits for the device's answer. On `wasm32` it takes the answer if the browser
/// has already given it, and otherwise keeps the scope for [`GpuContext::check_errors_async`]
/// and returns `Ok(())`.
pub(crate) fn check_scope(
    device: &wgpu::Device,
    scope: wgpu::ErrorScopeGuard,
    err: impl FnOnce(wgpu::Error) -> KvqError + 'static,
) -> Result<()> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let _ = device;
        match pollster::block_on(scope.pop()) {
            Some(e) => Err(err(e)),
            None => Ok(()),
        }
    }
    #[cfg(target_arch = "wasm32")]
    {
        let mut fut: browser::ScopeFuture = Box::pin(scope.pop());
        match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Some(e)) => Err(err(e)),
            Poll::Ready(None) => Ok(()),
            Poll::Pending => {
                browser::defer(device, fut, Box::new(err));
                Ok(())
            }
        }
    }
}

/// Error scopes the browser had not answered when the call that opened them returned.
#[cfg(target_arch = "wasm32")]
mod browser {
    use std::cell::RefCell;
    use std::future::Future;
    use std::pin::Pin;

    use crate::error::KvqError;

    /// Turns the error a scope caught into kvq's typed error for the call that opened it.
    pub(super) type MakeError = Box<dyn FnOnce(wgpu::Error) -> KvqError>;

    pub(super) type ScopeFuture = Pin<Box<dyn Future<Output = Option<wgpu::Error>>>>;

    pub(super) struct Unanswered {
        pub(super) device: wgpu::Device,
        pub(super) answer: ScopeFuture,
        pub(super) err: MakeError,
    }

    thread_local! {
        // A browser's wgpu objects live on the thread that made them, as do their scopes.
        static UNANSWERED: RefCell<Vec<Unanswered>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn defer(device: &wgpu::Device, answer: ScopeFuture, err: MakeError) {
        UNANSWERED.with(|u| {
            u.borrow_mut().push(Unanswered {
                device: device.clone(),
                answer,
                err,
            })
        });
    }

    /// Takes `device`'s unanswered scopes, oldest first.
    pub(super) fn take(device: &wgpu::Device) -> Vec<Unanswered> {
        UNANSWERED.with(|u| {
            let mut u = u.borrow_mut();
            let (mine, rest) = std::mem::take(&mut *u)
                .into_iter()
                .partition(|x| x.device == *device);
            *u = rest;
            mine
        })
    }
}

impl GpuContext {
    /// Waits for the answers to every error check of kvq's own GPU work on this device that
    /// is still open, and returns the first error among them (an out-of-memory error before
    /// any other: a buffer that could not be allocated makes what binds it fail too).
    ///
    /// In a browser (`wasm32`) the device answers kvq's checks of its allocations, kernel
    /// builds and bindings only through the page's event loop, so a call such as
    /// [`crate::KvCache::new`], [`crate::KvCache::step_io`] or [`crate::KvCache::chunk_io`]
    /// that returns `Ok` may still have failed on the GPU: await this after creating a cache
    /// or binding buffers ([`crate::KvCache::new_async`] does so for a new cache). Natively
    /// every check is answered before its call returns, and this returns `Ok(())` at once.
    pub async fn check_errors_async(&self) -> Result<()> {
        #[cfg(target_arch = "wasm32")]
        {
            let mut first = None;
            for u in browser::take(&self.device) {
                if let Some(e) = u.answer.await {
                    let oom = matches!(e, wgpu::Error::OutOfMemory { .. });
                    let e = (u.err)(e);
                    match &first {
                        None => first = Some((oom, e)),
                        Some((false, _)) if oom => first = Some((oom, e)),
                        Some(_) => {}
                    }
                }
            }
            if let Some((_, e)) = first {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Waits for submitted work natively; in a browser, returns at once (queue order alone
    /// makes later work and read-backs see the results).
    pub(crate) fn wait_for_queue(&self) -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .map_err(|e| KvqError::DeviceLost(e.to_string()))?;
        Ok(())
    }

    /// Copies `size` bytes of `src` at `offset` back to the host, counted as a download.
    /// Natively the copy is waited for in place.
    pub(crate) async fn read_back_async(
        &self,
        src: &wgpu::Buffer,
        offset: u64,
        size: u64,
    ) -> Result<Vec<u8>> {
        let staging = self.create_buffer_checked(&wgpu::BufferDescriptor {
            label: Some("kvq readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })?;
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(src, offset, &staging, 0, size);
        self.counters().add_submit();
        self.queue.submit([enc.finish()]);
        let mapped = map_read(&staging);
        self.wait_for_queue()?;
        mapped
            .await
            .map_err(|e| KvqError::Gpu(format!("map failed: {e}")))?;
        let bytes = staging
            .get_mapped_range(..)
            .map_err(|e| KvqError::Gpu(format!("map failed: {e:?}")))?
            .to_vec();
        staging.unmap();
        self.counters().add_download(size);
        Ok(bytes)
    }
}

/// A one-shot result set by a wgpu callback, awaited by kvq.
struct Signal<T>(Arc<Mutex<SignalState<T>>>);

struct SignalState<T> {
    value: Option<T>,
    waker: Option<Waker>,
}

impl<T> Default for Signal<T> {
    fn default() -> Self {
        Signal(Arc::new(Mutex::new(SignalState {
            value: None,
            waker: None,
        })))
    }
}

impl<T> Clone for Signal<T> {
    fn clone(&self) -> Self {
        Signal(self.0.clone())
    }
}

impl<T> Signal<T> {
    fn set(&self, value: T) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.value = Some(value);
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    }
}

impl<T> Future for Signal<T> {
    type Output = T;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match s.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Maps `buffer` for reading: resolves when wgpu calls back.
fn map_read(buffer: &wgpu::Buffer) -> Signal<std::result::Result<(), wgpu::BufferAsyncError>> {
    let done = Signal::default();
    let tx = done.clone();
    buffer.map_async(wgpu::MapMode::Read, .., move |r| tx.set(r));
    done
}
