//! The two attention backends of the forward: kvq on the GPU (every token's K/V encoded into
//! the cache by kvq's own kernels, attention over the stored codes by its chunk kernels), and
//! the f64 CPU reference over the unquantized K/V.

use kvq::{CacheSpec, ChunkIo, ExactTokens, GpuContext, InputType, KvCache, KvCodecs};
use rayon::prelude::*;

use crate::model::{Attention, Config, LayerQkv};

/// Exact causal attention in f64 over unquantized `q`, `k`, `v` (`[tokens, heads, head_dim]`):
/// token `t` attends `0..=t`. Returns f64 `[tokens, q_heads, head_dim]`.
pub fn exact(cfg: &Config, qkv: &LayerQkv<'_>) -> Vec<f64> {
    let (hq, hk, d) = (cfg.q_heads, cfg.kv_heads, cfg.head_dim);
    let wide = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    let (q, k, v) = (wide(qkv.q), wide(qkv.k), wide(qkv.v));
    let scale = 1.0 / (d as f64).sqrt();
    let tokens = q.len() / (hq * d);
    (0..tokens)
        .into_par_iter()
        .flat_map_iter(|t| {
            let kv = (t + 1) * hk * d;
            kvq::reference::attention(
                &q[t * hq * d..(t + 1) * hq * d],
                &k[..kv],
                &v[..kv],
                hq,
                hk,
                d,
                scale,
            )
        })
        .collect()
}

/// `‖a − b‖ / ‖b‖` over whole vectors.
pub fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y).powi(2);
        den += y * y;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// The f64 reference as the model's attention.
pub struct Exact(pub Config);

impl Attention for Exact {
    fn attend(&mut self, qkv: &LayerQkv<'_>) -> Result<Vec<f32>, String> {
        Ok(exact(&self.0, qkv).into_iter().map(|x| x as f32).collect())
    }
}

fn buffer(ctx: &GpuContext, label: &str, bytes: u64, usage: wgpu::BufferUsages) -> wgpu::Buffer {
    ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes,
        usage,
        mapped_at_creation: false,
    })
}

/// kvq as the model's attention: a cache of `cfg`'s shape holding `tokens` positions per
/// layer. A layer's tokens run as one chunk (`KvCache::chunk`: every token's K/V appended by
/// kvq's encoder, then each token's query attending the stored codes of `0..=t`), so the host
/// uploads the layer's Q/K/V once and reads its outputs back once. With exact tokens every
/// query of the chunk sees the exact tokens a decode step at its position would.
pub struct Kvq {
    cfg: Config,
    ctx: GpuContext,
    cache: KvCache,
    chunk: ChunkIo,
    /// Every token's K, V, Q and output: `[tokens, heads, head_dim]` f32, bound to `chunk`.
    all: [wgpu::Buffer; 4],
    readback: wgpu::Buffer,
}

impl Kvq {
    /// A cache with `codecs` for `tokens` positions on `ctx`'s device (a layer's forward runs
    /// exactly that many tokens), chunk slices of at least `prefill_from` tokens attended by
    /// the prefill kernel, its products' arithmetic `precision`.
    pub fn new(
        ctx: &GpuContext,
        cfg: &Config,
        codecs: KvCodecs,
        exact: ExactTokens,
        tokens: u32,
        prefill_from: Option<u32>,
        precision: kvq::Precision,
    ) -> Result<Kvq, String> {
        let mut spec = CacheSpec::new(
            cfg.layers as u32,
            cfg.q_heads as u32,
            cfg.kv_heads as u32,
            cfg.head_dim as u32,
            tokens,
        )
        .with_codecs(codecs);
        spec.exact = exact;
        spec.prefill_from = prefill_from;
        spec.precision = precision;
        let cache = KvCache::new(ctx, spec).map_err(|e| e.to_string())?;
        let kv_row = (cfg.kv_heads * cfg.head_dim * 4) as u64;
        let q_row = (cfg.q_heads * cfg.head_dim * 4) as u64;
        let rows = [kv_row, kv_row, q_row, q_row];
        use wgpu::BufferUsages as U;
        let all = rows.map(|r| {
            let usage = U::STORAGE | U::COPY_SRC | U::COPY_DST;
            buffer(ctx, "ppl all", r * tokens as u64, usage)
        });
        let readback = buffer(
            ctx,
            "ppl readback",
            q_row * tokens as u64,
            U::MAP_READ | U::COPY_DST,
        );
        let chunk = cache
            .chunk_io(&all[0], &all[1], tokens, InputType::F32, &all[2], &all[3])
            .map_err(|e| e.to_string())?;
        Ok(Kvq {
            cfg: cfg.clone(),
            ctx: ctx.clone(),
            cache,
            chunk,
            all,
            readback,
        })
    }

    fn run_layer(&mut self, qkv: &LayerQkv<'_>) -> Result<Vec<f32>, String> {
        let layer = qkv.layer as u32;
        let len = self.cache.len(layer, 0).map_err(|e| e.to_string())?;
        if len != 0 {
            return Err(format!("layer {layer} already holds {len} tokens"));
        }
        let tokens = (qkv.q.len() / (self.cfg.q_heads * self.cfg.head_dim)) as u32;
        if tokens != self.chunk.tokens() {
            return Err(format!(
                "layer {layer}: {tokens} tokens for a cache built for {}",
                self.chunk.tokens()
            ));
        }
        let q = &self.ctx.queue;
        for (buf, data) in self.all.iter().zip([qkv.k, qkv.v, qkv.q]) {
            q.write_buffer(buf, 0, bytemuck::cast_slice(data));
        }
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        self.cache
            .chunk(&mut enc, layer, &self.chunk)
            .map_err(|e| e.to_string())?;
        let bytes = self.readback.size();
        enc.copy_buffer_to_buffer(&self.all[3], 0, &self.readback, 0, bytes);
        q.submit([enc.finish()]);
        let slice = self.readback.slice(..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.ctx
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| format!("GPU: {e}"))?;
        rx.recv()
            .map_err(|e| format!("GPU: {e}"))?
            .map_err(|e| format!("GPU: {e}"))?;
        let view = slice.get_mapped_range().map_err(|e| format!("GPU: {e}"))?;
        let out = bytemuck::cast_slice::<u8, f32>(&view).to_vec();
        drop(view);
        self.readback.unmap();
        Ok(out)
    }
}

impl Attention for Kvq {
    fn attend(&mut self, qkv: &LayerQkv<'_>) -> Result<Vec<f32>, String> {
        self.run_layer(qkv)
    }
}
