//! A Llama-architecture forward pass on the CPU (SmolLM2-135M from its GGUF), with attention
//! left to a caller-supplied [`Attention`]: kvq's GPU kernels over its cache, or the f64
//! reference. Weights are dequantized to f32 once (candle reads the GGUF and does the matmuls);
//! the forward runs layer by layer over every token, so a layer's attention sees all its
//! queries, keys and values at once and can record every token's decode step in one submit.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{Device, Tensor};

/// What the forward needs from the GGUF's metadata.
#[derive(Clone, Debug)]
pub struct Config {
    /// Transformer layers.
    pub layers: usize,
    /// Residual width.
    pub dim: usize,
    /// Query heads.
    pub q_heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// RoPE base frequency.
    pub rope_base: f64,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// Vocabulary size.
    pub vocab: usize,
}

/// One layer's queries, keys and values for every token, after RoPE.
pub struct LayerQkv<'a> {
    /// Layer index.
    pub layer: usize,
    /// `[tokens, q_heads, head_dim]`.
    pub q: &'a [f32],
    /// `[tokens, kv_heads, head_dim]`.
    pub k: &'a [f32],
    /// `[tokens, kv_heads, head_dim]`.
    pub v: &'a [f32],
}

/// Causal attention of a layer: token `t`'s query attends keys `0..=t`. Returns
/// `[tokens, q_heads, head_dim]`.
pub trait Attention {
    /// Attends one layer (called for layers 0, 1, … in order, once per forward).
    fn attend(&mut self, qkv: &LayerQkv<'_>) -> Result<Vec<f32>, String>;
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    ffn_norm: Vec<f32>,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// The model: weights (f32) and the tokenizer's vocabulary and merges.
pub struct Model {
    /// Shapes and constants.
    pub cfg: Config,
    embed: Tensor,
    output: Tensor,
    out_norm: Vec<f32>,
    layers: Vec<Layer>,
    /// Token strings (byte-level BPE alphabet), by id.
    pub tokens: Vec<String>,
    /// Token types (3 = control), by id.
    pub token_types: Vec<i32>,
    /// BPE merges, in rank order.
    pub merges: Vec<(String, String)>,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn meta<'a>(md: &'a HashMap<String, Value>, key: &str) -> Result<&'a Value, String> {
    md.get(key)
        .ok_or_else(|| format!("GGUF metadata lacks {key}"))
}

fn meta_u32(md: &HashMap<String, Value>, key: &str) -> Result<usize, String> {
    Ok(meta(md, key)?.to_u32().map_err(err)? as usize)
}

fn meta_f32(md: &HashMap<String, Value>, key: &str) -> Result<f64, String> {
    Ok(meta(md, key)?.to_f32().map_err(err)? as f64)
}

impl Model {
    /// Reads a Llama-architecture GGUF: metadata, tokenizer tables and every weight.
    pub fn load(path: &Path) -> Result<Model, String> {
        let mut f =
            BufReader::new(File::open(path).map_err(|e| format!("{}: {e}", path.display()))?);
        let content = Content::read(&mut f).map_err(|e| format!("{}: {e}", path.display()))?;
        let md = &content.metadata;
        let arch = meta(md, "general.architecture")?.to_string().map_err(err)?;
        if arch != "llama" {
            return Err(format!(
                "{}: architecture {arch}, not llama",
                path.display()
            ));
        }
        let dim = meta_u32(md, "llama.embedding_length")?;
        let q_heads = meta_u32(md, "llama.attention.head_count")?;
        let cfg = Config {
            layers: meta_u32(md, "llama.block_count")?,
            dim,
            q_heads,
            kv_heads: meta_u32(md, "llama.attention.head_count_kv")?,
            head_dim: dim / q_heads,
            rope_base: meta_f32(md, "llama.rope.freq_base")?,
            eps: meta_f32(md, "llama.attention.layer_norm_rms_epsilon")?,
            vocab: 0,
        };
        let dev = Device::Cpu;
        let mut get = |name: &str| -> Result<Tensor, String> {
            content
                .tensor(&mut f, name, &dev)
                .and_then(|q| q.dequantize(&dev))
                .map_err(|e| format!("tensor {name}: {e}"))
        };
        let vec = |t: Tensor| -> Result<Vec<f32>, String> { t.to_vec1::<f32>().map_err(err) };
        let embed = get("token_embd.weight")?;
        // Tied embeddings when the file has no output matrix (SmolLM2 ties them).
        let output = if content.tensor_infos.contains_key("output.weight") {
            get("output.weight")?
        } else {
            embed.clone()
        };
        let out_norm = vec(get("output_norm.weight")?)?;
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let p = |s: &str| format!("blk.{l}.{s}.weight");
            layers.push(Layer {
                attn_norm: vec(get(&p("attn_norm"))?)?,
                wq: get(&p("attn_q"))?,
                wk: get(&p("attn_k"))?,
                wv: get(&p("attn_v"))?,
                wo: get(&p("attn_output"))?,
                ffn_norm: vec(get(&p("ffn_norm"))?)?,
                gate: get(&p("ffn_gate"))?,
                up: get(&p("ffn_up"))?,
                down: get(&p("ffn_down"))?,
            });
        }
        let strings = |key: &str| -> Result<Vec<String>, String> {
            meta(md, key)?
                .to_vec()
                .map_err(err)?
                .iter()
                .map(|v| v.to_string().cloned().map_err(err))
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let token_types = meta(md, "tokenizer.ggml.token_type")?
            .to_vec()
            .map_err(err)?
            .iter()
            .map(|v| v.to_i32().map_err(err))
            .collect::<Result<Vec<_>, _>>()?;
        let merges = strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| format!("bad merge '{m}'"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let vocab = embed.dims2().map_err(err)?.0;
        Ok(Model {
            cfg: Config { vocab, ..cfg },
            embed,
            output,
            out_norm,
            layers,
            tokens,
            token_types,
            merges,
        })
    }

    /// Runs `tokens` through the model, every layer's attention by `attn`; returns the
    /// logits `[tokens, vocab]`, row-major.
    pub fn forward(&self, tokens: &[u32], attn: &mut dyn Attention) -> Result<Vec<f32>, String> {
        let c = &self.cfg;
        let n = tokens.len();
        let ids = Tensor::new(tokens, &Device::Cpu).map_err(err)?;
        let mut h = self.embed.index_select(&ids, 0).map_err(err)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let x = rms_norm(&h, &layer.attn_norm, c.eps)?;
            let mut q = matmul_t(&x, &layer.wq)?;
            let mut k = matmul_t(&x, &layer.wk)?;
            let v = matmul_t(&x, &layer.wv)?;
            rope(&mut q, c.q_heads, c.head_dim, c.rope_base);
            rope(&mut k, c.kv_heads, c.head_dim, c.rope_base);
            let o = attn.attend(&LayerQkv {
                layer: l,
                q: &q,
                k: &k,
                v: &v,
            })?;
            let o = Tensor::from_vec(o, (n, c.dim), &Device::Cpu).map_err(err)?;
            h = (h + o.matmul(&layer.wo.t().map_err(err)?).map_err(err)?).map_err(err)?;
            let x = tensor(rms_norm(&h, &layer.ffn_norm, c.eps)?, n)?;
            let g = x.matmul(&layer.gate.t().map_err(err)?).map_err(err)?;
            let u = x.matmul(&layer.up.t().map_err(err)?).map_err(err)?;
            let a = (g.silu().map_err(err)? * u).map_err(err)?;
            h = (h + a.matmul(&layer.down.t().map_err(err)?).map_err(err)?).map_err(err)?;
        }
        let x = tensor(rms_norm(&h, &self.out_norm, c.eps)?, n)?;
        x.matmul(&self.output.t().map_err(err)?)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(err)
    }
}

fn tensor(x: Vec<f32>, rows: usize) -> Result<Tensor, String> {
    let cols = x.len() / rows;
    Tensor::from_vec(x, (rows, cols), &Device::Cpu).map_err(err)
}

/// `x W^T` for `x` given as rows of f32 (a `Vec` from [`rms_norm`]); returns rows.
fn matmul_t(x: &[f32], w: &Tensor) -> Result<Vec<f32>, String> {
    let cols = w.dims2().map_err(err)?.1;
    let x = Tensor::from_slice(x, (x.len() / cols, cols), &Device::Cpu).map_err(err)?;
    x.matmul(&w.t().map_err(err)?)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(err)
}

/// RMSNorm of every row of `h` with gain `w`, in f64 per row.
fn rms_norm(h: &Tensor, w: &[f32], eps: f64) -> Result<Vec<f32>, String> {
    let x = h
        .flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(err)?;
    let d = w.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(d) {
        let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64;
        let r = 1.0 / (ms + eps).sqrt();
        out.extend(row.iter().zip(w).map(|(&v, &g)| (v as f64 * r) as f32 * g));
    }
    Ok(out)
}

/// RoPE on `[tokens, heads, head_dim]` rows at positions 0, 1, …: adjacent pairs
/// `(2i, 2i + 1)` rotate by `pos · base^(-2i / head_dim)` (the GGUF's Q/K weights are permuted
/// for this interleaved form; the half-split form gives perplexity ~240 on this model).
fn rope(x: &mut [f32], heads: usize, d: usize, base: f64) {
    for (t, tok) in x.chunks_mut(heads * d).enumerate() {
        for head in tok.chunks_mut(d) {
            for i in 0..d / 2 {
                let theta = t as f64 * base.powf(-2.0 * i as f64 / d as f64);
                let (s, c) = theta.sin_cos();
                let (a, b) = (head[2 * i] as f64, head[2 * i + 1] as f64);
                head[2 * i] = (a * c - b * s) as f32;
                head[2 * i + 1] = (a * s + b * c) as f32;
            }
        }
    }
}
