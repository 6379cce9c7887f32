//! The host API: uploads, read-backs and length edits that wait for the GPU (conveniences,
//! tests and diagnostics; not the hot path). Each read-back has an `async` form, for a
//! browser (`wasm32`), where the blocking forms do not exist (see `crate::wait`).

use super::io::{HostIo, HostQuery};
use super::kv_cache::KvCache;
use crate::codec::CodecKind;
use crate::error::{KvqError, Result};
use crate::kernels::{InputType, K_BLOCK};

impl KvCache {
    /// Host convenience: uploads `k` and `v` (`[batch, n, kv_heads, head_dim]` f32) and appends
    /// them to `layer`, waiting for the GPU (in a browser it submits without waiting: the
    /// queue orders what comes after). A NaN or ±Inf value is stored as 0 (see
    /// [`KvCache::append_input`]).
    pub fn append_host(&mut self, layer: u32, k: &[f32], v: &[f32]) -> Result<()> {
        self.check_layer(layer)?;
        let s = &self.spec;
        let per_tok = (s.batch * s.kv_heads * s.head_dim) as usize;
        if k.is_empty() || !k.len().is_multiple_of(per_tok) {
            return Err(KvqError::WrongLength {
                what: format!(
                    "k (a whole number of tokens of batch*kv_heads*head_dim = {per_tok})"
                ),
                expected: per_tok * (k.len() / per_tok).max(1),
                got: k.len(),
            });
        }
        if v.len() != k.len() {
            return Err(KvqError::WrongLength {
                what: "v (same as k)".into(),
                expected: k.len(),
                got: v.len(),
            });
        }
        let n = (k.len() / per_tok) as u32;
        let mut slot = self
            .host_io
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if slot.as_ref().map(|h| h.n) != Some(n) {
            let buf = |label| {
                self.ctx.create_buffer_checked(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size: (k.len() * 4) as u64,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            };
            let (kb, vb) = (buf("kvq host k")?, buf("kvq host v")?);
            let input = self.append_input(&kb, &vb, n, InputType::F32)?;
            slot = Some(HostIo {
                n,
                k: kb,
                v: vb,
                input,
            });
        }
        let io = slot.expect("host io set above");
        self.ctx.upload(&io.k, 0, bytemuck::cast_slice(k));
        self.ctx.upload(&io.v, 0, bytemuck::cast_slice(v));
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        let res = self.append(&mut enc, layer, &io.input);
        if res.is_ok() {
            self.ctx.submit_and_wait(enc.finish())?;
        }
        *self.host_io.lock().unwrap_or_else(|e| e.into_inner()) = Some(io);
        res
    }

    /// Host convenience: attends `q` (`[batch, q_heads, head_dim]` f32) over `layer` and
    /// returns the output, same shape, waiting for the GPU (natively only; in a browser,
    /// [`KvCache::attend_host_async`]). Unlike [`KvCache::attend_in_pass`], which writes a
    /// zero output for a sequence with no tokens, this refuses such a call
    /// ([`KvqError::EmptySequence`]): on the host, attending nothing is a caller's mistake.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn attend_host(&self, layer: u32, q: &[f32]) -> Result<Vec<f32>> {
        pollster::block_on(self.attend_host_async(layer, q))
    }

    /// [`KvCache::attend_host`] without blocking: for a browser, where the read-back resolves
    /// through the page's event loop (natively it waits in place).
    pub async fn attend_host_async(&self, layer: u32, q: &[f32]) -> Result<Vec<f32>> {
        self.check_layer(layer)?;
        let s = &self.spec;
        let want = (s.batch * s.q_heads * s.head_dim) as usize;
        if q.len() != want {
            return Err(KvqError::WrongLength {
                what: "q ([batch, q_heads, head_dim])".into(),
                expected: want,
                got: q.len(),
            });
        }
        for b in 0..s.batch {
            if self.len(layer, b)? == 0 {
                return Err(KvqError::EmptySequence { layer, seq: b });
            }
        }
        let out = {
            let mut guard = self.host_query.lock().unwrap_or_else(|e| e.into_inner());
            if guard.is_none() {
                let buf = |label, usage| {
                    self.ctx.create_buffer_checked(&wgpu::BufferDescriptor {
                        label: Some(label),
                        size: (want * 4) as u64,
                        usage,
                        mapped_at_creation: false,
                    })
                };
                let q = buf(
                    "kvq host q",
                    wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                )?;
                let out = buf(
                    "kvq host out",
                    wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                )?;
                let io = self.attend_io(&q, &out)?;
                *guard = Some(HostQuery { q, out, io });
            }
            let hq = guard.as_ref().expect("host query set above");
            self.ctx.upload(&hq.q, 0, bytemuck::cast_slice(q));
            let mut enc = self.ctx.device.create_command_encoder(&Default::default());
            self.attend(&mut enc, layer, &hq.io)?;
            self.ctx.submit_and_wait(enc.finish())?;
            // (The read-back's copy is submitted before anything else can run: no other
            // attend can overwrite `out` first.)
            hq.out.clone()
        };
        let bytes = self.ctx.read_back_async(&out, 0, (want * 4) as u64).await?;
        Ok(bytemuck::cast_slice(&bytes).to_vec())
    }

    /// Host convenience: appends `k` and `v` (`[batch, n, kv_heads, head_dim]` f32) to
    /// `layer` and returns the causal attention of their queries `q` (`[batch, n, q_heads,
    /// head_dim]` f32) over the cache, same shape as `q`, waiting for the GPU: a chunk (see
    /// [`KvCache::chunk_in_pass`]). Natively only; in a browser, [`KvCache::chunk_host_async`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn chunk_host(&mut self, layer: u32, k: &[f32], v: &[f32], q: &[f32]) -> Result<Vec<f32>> {
        pollster::block_on(self.chunk_host_async(layer, k, v, q))
    }

    /// [`KvCache::chunk_host`] without blocking: for a browser, where the read-back resolves
    /// through the page's event loop (natively it waits in place).
    pub async fn chunk_host_async(
        &mut self,
        layer: u32,
        k: &[f32],
        v: &[f32],
        q: &[f32],
    ) -> Result<Vec<f32>> {
        self.check_layer(layer)?;
        let s = &self.spec;
        let per_tok = (s.batch * s.kv_heads * s.head_dim) as usize;
        if k.is_empty() || !k.len().is_multiple_of(per_tok) || v.len() != k.len() {
            return Err(KvqError::WrongLength {
                what: format!(
                    "k and v (a whole number of tokens of batch*kv_heads*head_dim = {per_tok})"
                ),
                expected: per_tok * (k.len() / per_tok).max(1),
                got: if v.len() != k.len() { v.len() } else { k.len() },
            });
        }
        let n = (k.len() / per_tok) as u32;
        let want = (s.batch * n * s.q_heads * s.head_dim) as usize;
        if q.len() != want {
            return Err(KvqError::WrongLength {
                what: "q ([batch, n, q_heads, head_dim])".into(),
                expected: want,
                got: q.len(),
            });
        }
        let buf = |label, bytes: usize, usage| {
            self.ctx.create_buffer_checked(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes as u64,
                usage,
                mapped_at_creation: false,
            })
        };
        let input = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST;
        let (kb, vb) = (
            buf("kvq host k", k.len() * 4, input)?,
            buf("kvq host v", v.len() * 4, input)?,
        );
        let qb = buf("kvq host q", want * 4, input)?;
        let ob = buf(
            "kvq host out",
            want * 4,
            input | wgpu::BufferUsages::COPY_SRC,
        )?;
        let io = self.chunk_io(&kb, &vb, n, InputType::F32, &qb, &ob)?;
        self.ctx.upload(&kb, 0, bytemuck::cast_slice(k));
        self.ctx.upload(&vb, 0, bytemuck::cast_slice(v));
        self.ctx.upload(&qb, 0, bytemuck::cast_slice(q));
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        self.chunk(&mut enc, layer, &io)?;
        self.ctx.submit_and_wait(enc.finish())?;
        let bytes = self.ctx.read_back_async(&ob, 0, (want * 4) as u64).await?;
        Ok(bytemuck::cast_slice(&bytes).to_vec())
    }

    /// Cuts sequence `seq` back to its first `len` tokens in every layer (speculative decoding
    /// rejecting drafted tokens, say) and clears its overflow flags. Nothing is reallocated; the
    /// rows past `len` are overwritten by later appends.
    ///
    /// With a sliding window, a layer's ring holds a sequence's last `ring` tokens (the
    /// capacity, or with a window per layer that layer's [`crate::CacheSpec::layer_capacity`]),
    /// so a cut is refused (nothing changed) when the window ending at `len` would need a token
    /// some layer's ring has already overwritten: allowed while the sequence holds at most
    /// `ring` tokens, or when `len >= current - (ring - window)` in every layer with a window.
    /// [`KvCache::reset`] (`len` 0) always works.
    ///
    /// With exact tokens ([`crate::ExactTokens`]) the newest kept exact are those the ring still
    /// holds: after a cut, positions whose ring slot later tokens had overwritten are attended
    /// through their codes until they fall out of the window.
    ///
    /// The new lengths are written through the queue and submitted at once, so they land after
    /// everything already submitted: submit any recorded work on this cache first (or, having
    /// dropped it, call [`KvCache::sync_lengths`]).
    pub fn truncate(&mut self, seq: u32, len: u32) -> Result<()> {
        let s = &self.spec;
        if seq >= s.batch {
            return Err(KvqError::SequenceOutOfRange {
                seq,
                batch: s.batch,
            });
        }
        for layer in 0..s.layers {
            let cur = self.host_lens[(layer * s.batch + seq) as usize];
            if len > cur {
                return Err(KvqError::InvalidArgument(format!(
                    "cannot truncate sequence {seq} to {len} tokens: layer {layer} holds {cur}"
                )));
            }
            if let Some(w) = s.layer_window(layer) {
                // Oldest position still in the layer's ring, and oldest the window at `len`
                // needs.
                let ring = s.layer_capacity(layer);
                let kept = cur.saturating_sub(ring);
                if len > 0 && len.saturating_sub(w) < kept {
                    return Err(KvqError::InvalidArgument(format!(
                        "cannot truncate sequence {seq} to {len} tokens: layer {layer} holds {cur} and its ring of {ring} slots no longer has position {} that a window of {w} ending there needs (at most {} tokens can be rolled back now)",
                        len.saturating_sub(w),
                        cur - (kept + w).min(cur)
                    )));
                }
            }
        }
        let n = s.layers * s.batch;
        let ring = s.exact.ring();
        let exact = s.exact.any();
        for layer in 0..s.layers {
            let i = layer * s.batch + seq;
            if exact {
                // Ring slots of positions below cur - ring were overwritten: from there on
                // (or from len, past which every position will be written again) the ring holds
                // what it says.
                let cur = self.host_lens[i as usize];
                let e = &mut self.host_exact_lo[i as usize];
                *e = len.min((*e).max(cur.saturating_sub(ring)));
                for (si, seg) in self.layers[layer as usize].iter().enumerate() {
                    let tail = super::buffers::exact_tail(s, si as u32);
                    let at = seg.v.size() - tail + 4 * seq as u64;
                    self.ctx.upload(&seg.v, at, bytemuck::bytes_of(e));
                }
            }
            self.ctx
                .upload(&self.lens, 4 * i as u64, bytemuck::bytes_of(&len));
            self.ctx
                .upload(&self.lens, 4 * (n + i) as u64, bytemuck::bytes_of(&0u32));
            self.host_lens[i as usize] = len;
        }
        let enc = self.ctx.device.create_command_encoder(&Default::default());
        self.ctx.counters().add_submit();
        self.ctx.queue.submit([enc.finish()]);
        Ok(())
    }

    /// Empties sequence `seq` in every layer so its slot can serve a new sequence (see
    /// [`KvCache::truncate`]).
    pub fn reset(&mut self, seq: u32) -> Result<()> {
        self.truncate(seq, 0)
    }

    /// Sets the host mirror of the lengths ([`KvCache::len`]) to the GPU's, by a blocking read
    /// back. The mirror advances when kvq work is recorded, not when it is submitted: a
    /// recording dropped instead of submitted (an error part-way through a loop over the
    /// layers, an encoder discarded) leaves it ahead of the GPU, and then appends' capacity
    /// checks and [`KvCache::truncate`] would act on lengths the GPU never reached (a cut
    /// "back" to such a length would attend rows never written). Call this after dropping such
    /// a recording, once any recorded work you keep is submitted. Natively only; in a
    /// browser, [`KvCache::sync_lengths_async`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn sync_lengths(&mut self) -> Result<()> {
        pollster::block_on(self.sync_lengths_async())
    }

    /// [`KvCache::sync_lengths`] without blocking (for a browser; natively it waits in place).
    pub async fn sync_lengths_async(&mut self) -> Result<()> {
        let (lens, _) = self.read_gpu_lengths_async().await?;
        self.host_lens = lens;
        Ok(())
    }

    /// Reads the lengths and overflow flags from the GPU (`[layers * batch]` each): for tests
    /// and diagnostics, not for the hot path. Natively only; in a browser,
    /// [`KvCache::read_gpu_lengths_async`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_gpu_lengths(&self) -> Result<(Vec<u32>, Vec<u32>)> {
        pollster::block_on(self.read_gpu_lengths_async())
    }

    /// [`KvCache::read_gpu_lengths`] without blocking (for a browser; natively it waits in
    /// place).
    pub async fn read_gpu_lengths_async(&self) -> Result<(Vec<u32>, Vec<u32>)> {
        let n = (self.spec.layers * self.spec.batch) as usize;
        let bytes = self
            .ctx
            .read_back_async(&self.lens, 0, (2 * n * 4) as u64)
            .await?;
        let all: &[u32] = bytemuck::cast_slice(&bytes);
        Ok((all[..n].to_vec(), all[n..].to_vec()))
    }

    /// Reads the stored rows of `layer` by slot: K then V, each
    /// `[batch, kv_heads, slots, row_words]` words exactly as the codec's row layout
    /// defines them (storage interleaving and segments undone), `slots` the layer's
    /// [`crate::CacheSpec::layer_capacity`]. Slot = token position, or position % slots with a
    /// sliding window. For tests and diagnostics. Natively only;
    /// in a browser, [`KvCache::read_rows_async`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_rows(&self, layer: u32) -> Result<(Vec<u32>, Vec<u32>)> {
        pollster::block_on(self.read_rows_async(layer))
    }

    /// [`KvCache::read_rows`] without blocking (for a browser; natively it waits in place).
    pub async fn read_rows_async(&self, layer: u32) -> Result<(Vec<u32>, Vec<u32>)> {
        self.check_layer(layer)?;
        let s = &self.spec;
        let (kw, vw) = (
            s.codecs.k.row_words(s.head_dim) as usize,
            s.codecs.v.row_words(s.head_dim) as usize,
        );
        let runs = (s.batch * s.kv_heads) as usize;
        let cap = s.layer_capacity(layer) as usize;
        let mut k = vec![0u32; runs * cap * kw];
        let mut v = vec![0u32; runs * cap * vw];
        for (si, seg) in self.layers[layer as usize].iter().enumerate() {
            let kraw: Vec<u32> =
                bytemuck::cast_slice(&self.ctx.read_back_async(&seg.k, 0, seg.k.size()).await?)
                    .to_vec();
            let vraw: Vec<u32> =
                bytemuck::cast_slice(&self.ctx.read_back_async(&seg.v, 0, seg.v.size()).await?)
                    .to_vec();
            let start = si * self.layout.segment_tokens as usize;
            let stride = kraw.len() / (runs * kw); // allocated tokens per run in this segment
            for run in 0..runs {
                for p in 0..stride.min(cap.saturating_sub(start)) {
                    let row = run * stride + p;
                    let dst = (run * cap + start + p) * kw;
                    for w in 0..kw {
                        // K interleave: f16 by 16-byte chunks, q8/q4 by words (wgsl/codecs/f16.wgsl, sym.wgsl).
                        let idx = if s.codecs.k.kind == CodecKind::None {
                            4 * ((row - row % K_BLOCK as usize) * (kw / 4)
                                + (w / 4) * K_BLOCK as usize
                                + row % K_BLOCK as usize)
                                + w % 4
                        } else {
                            (row - row % K_BLOCK as usize) * kw
                                + w * K_BLOCK as usize
                                + row % K_BLOCK as usize
                        };
                        k[dst + w] = kraw[idx];
                    }
                    let vdst = (run * cap + start + p) * vw;
                    v[vdst..vdst + vw].copy_from_slice(&vraw[row * vw..(row + 1) * vw]);
                }
            }
        }
        Ok((k, v))
    }
}
