//! The model: a Llama-architecture configuration (from a GGUF's metadata, or a named shape
//! such as `qwen3-8b` with random 4-bit weights) and its weights on the GPU, fused for the
//! kernels: Q, K and V as one matrix, the SwiGLU's gate and up rows interleaved.

use wgpu::util::DeviceExt;

use crate::error::{ChatError, Result};
use crate::gguf::{self, Gguf, Value};
use crate::kernels::{Const, Kernels, Kind};
use crate::weights::{Format, HostMatrix};

/// How RoPE pairs a head's dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rope {
    /// Adjacent pairs (2i, 2i + 1): a GGUF's Llama layout (its Q/K rows permuted for it).
    Interleaved,
    /// Pairs (i, i + head_dim / 2): the Hugging Face / NeoX layout (Qwen3).
    Neox,
}

/// A model's shape and constants.
#[derive(Clone, Debug)]
pub struct Config {
    /// For tables and errors.
    pub name: String,
    /// Transformer layers.
    pub layers: u32,
    /// Residual width.
    pub dim: u32,
    /// Query heads.
    pub q_heads: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Values per head.
    pub head_dim: u32,
    /// The SwiGLU's hidden width.
    pub ffn: u32,
    /// Vocabulary size.
    pub vocab: u32,
    /// RoPE base frequency.
    pub rope_base: f64,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// RoPE's pairing.
    pub rope: Rope,
    /// An RMSNorm over each q and k head before RoPE (Qwen3).
    pub qk_norm: bool,
    /// The output matrix is the embedding's.
    pub tied: bool,
}

impl Config {
    /// Rows of the fused Q/K/V matrix.
    pub fn qkv_rows(&self) -> u32 {
        (self.q_heads + 2 * self.kv_heads) * self.head_dim
    }

    /// The shapes `--shape` builds with random weights: the sweep's `qwen3-8b` and `llama3-8b`
    /// (examples/shared/models.rs) as whole models, SmolLM2-135M's and a tiny one.
    pub fn shape(name: &str) -> Result<Config> {
        let c =
            |layers, dim, q_heads, kv_heads, head_dim, ffn, vocab, rope_base, rope, qk, tied| {
                Config {
                    name: name.to_string(),
                    layers,
                    dim,
                    q_heads,
                    kv_heads,
                    head_dim,
                    ffn,
                    vocab,
                    rope_base,
                    eps: 1e-6,
                    rope,
                    qk_norm: qk,
                    tied,
                }
            };
        use Rope::*;
        Ok(match name {
            "qwen3-8b" => c(36, 4096, 32, 8, 128, 12288, 151936, 1e6, Neox, true, false),
            "llama3-8b" => c(
                32,
                4096,
                32,
                8,
                128,
                14336,
                128256,
                5e5,
                Interleaved,
                false,
                false,
            ),
            "smollm2-135m" => c(
                30,
                576,
                9,
                3,
                64,
                1536,
                49152,
                1e5,
                Interleaved,
                false,
                true,
            ),
            "tiny" => c(2, 256, 4, 2, 64, 512, 1024, 1e4, Neox, true, false),
            _ => {
                return Err(ChatError::Argument(format!(
                    "--shape {name}: qwen3-8b, llama3-8b, smollm2-135m or tiny"
                )));
            }
        })
    }

    /// Reads the configuration of a Llama-architecture GGUF.
    pub fn from_gguf(g: &Gguf) -> Result<Config> {
        let arch = g.str("general.architecture")?;
        if arch != "llama" {
            return Err(ChatError::Architecture {
                path: g.path.clone(),
                found: arch.to_string(),
            });
        }
        let dim = g.usize("llama.embedding_length")? as u32;
        let q_heads = g.usize("llama.attention.head_count")? as u32;
        let kv_heads = g.usize("llama.attention.head_count_kv")? as u32;
        let head_dim = match g.metadata.get("llama.attention.key_length") {
            Some(_) => g.usize("llama.attention.key_length")? as u32,
            None => dim / q_heads,
        };
        let embed = g
            .tensors
            .get("token_embd.weight")
            .ok_or_else(|| ChatError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        if embed.dims.len() != 2 || embed.dims[0] != dim as u64 || embed.dims[1] > u32::MAX as u64 {
            return Err(ChatError::TensorShape {
                name: "token_embd.weight".into(),
                expected: vec![dim as u64, embed.dims.get(1).copied().unwrap_or(0)],
                found: embed.dims.clone(),
            });
        }
        let cfg = Config {
            name: g.str("general.name").unwrap_or("llama").to_string(),
            layers: g.usize("llama.block_count")? as u32,
            dim,
            q_heads,
            kv_heads,
            head_dim,
            ffn: g.usize("llama.feed_forward_length")? as u32,
            vocab: embed.dims[1] as u32,
            rope_base: g.float("llama.rope.freq_base").unwrap_or(10000.0),
            eps: g.float("llama.attention.layer_norm_rms_epsilon")?,
            rope: Rope::Interleaved,
            qk_norm: false,
            tied: !g.tensors.contains_key("output.weight"),
        };
        cfg.check()?;
        Ok(cfg)
    }

    /// The shape rules of the kernels (and of kvq).
    pub fn check(&self) -> Result<()> {
        let bad = |s: String| Err(ChatError::Shape(s));
        if self.q_heads == 0 || self.kv_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} query heads over {} KV heads",
                self.q_heads, self.kv_heads
            ));
        }
        if !self.dim.is_multiple_of(32) || !self.ffn.is_multiple_of(32) {
            return bad(format!(
                "width {} and hidden width {} must be multiples of 32",
                self.dim, self.ffn
            ));
        }
        if !self.head_dim.is_multiple_of(32) || self.head_dim > 256 {
            return bad(format!(
                "head_dim {} (the kernels take multiples of 32 up to 256)",
                self.head_dim
            ));
        }
        if !(self.q_heads * self.head_dim).is_multiple_of(32) || self.layers == 0 || self.vocab == 0
        {
            return bad(format!(
                "{} layers, {} query heads of {}, vocabulary {}",
                self.layers, self.q_heads, self.head_dim, self.vocab
            ));
        }
        Ok(())
    }

    /// Weights the GPU holds (parameters; the embedding counted once when tied).
    pub fn params(&self) -> u64 {
        let (d, f) = (self.dim as u64, self.ffn as u64);
        let attn = d * self.qkv_rows() as u64 + self.q_heads as u64 * self.head_dim as u64 * d;
        let out = if self.tied { 0 } else { self.vocab as u64 * d };
        self.layers as u64 * (attn + 3 * d * f) + self.vocab as u64 * d + out
    }
}

/// A matrix on the GPU, in the kernels' layout.
pub struct Matrix {
    /// Rows (outputs).
    pub rows: u32,
    /// Columns (inputs).
    pub cols: u32,
    /// Its block layout.
    pub format: Format,
    /// Code words.
    pub codes: wgpu::Buffer,
    /// Scale words (one dummy word for f16).
    pub scales: wgpu::Buffer,
}

impl Matrix {
    /// Bytes a product reads: every block once.
    pub fn bytes(&self) -> u64 {
        self.rows as u64 * self.cols as u64 / 32 * self.format.block_bytes()
    }

    fn upload(device: &wgpu::Device, m: &HostMatrix, label: &str) -> Matrix {
        let buf = |words: &[u32]| {
            let dummy = [0u32];
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: bytemuck::cast_slice(if words.is_empty() { &dummy } else { words }),
                usage: wgpu::BufferUsages::STORAGE,
            })
        };
        Matrix {
            rows: m.rows as u32,
            cols: m.cols as u32,
            format: m.format,
            codes: buf(&m.codes),
            scales: buf(&m.scales),
        }
    }

    /// A matrix of random weights, generated on the GPU (`kernels/fill.wgsl`).
    fn random(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        kernels: &Kernels,
        rows: u32,
        cols: u32,
        format: Format,
        seed: u32,
    ) -> Result<Matrix> {
        let blocks = rows as u64 * cols as u64 / 32;
        let make = |words: u64| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("random weights"),
                size: 4 * words.max(1),
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        };
        let codes = make(blocks * format.words() as u64);
        let scales = make(blocks * format.scale_words() as u64);
        let k = kernels.get(
            Kind::Fill,
            &[
                ("K", Const::U(cols)),
                ("FORMAT", Const::U(format.id())),
                ("SEED", Const::U(seed.wrapping_mul(0x9e37_79b9))),
            ],
        )?;
        let bg = kernels.bind(&k, &[&codes, &scales]);
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&k.pipeline);
            pass.set_bind_group(0, &bg, &[]);
            pass.dispatch_workgroups(4096, 1, 1);
        }
        queue.submit([enc.finish()]);
        Ok(Matrix {
            rows,
            cols,
            format,
            codes,
            scales,
        })
    }
}

/// One layer's weights.
pub struct Layer {
    /// RMSNorm gain before attention, `[dim]`.
    pub attn_norm: wgpu::Buffer,
    /// Q, K and V rows, `[(q_heads + 2 kv_heads) head_dim, dim]`.
    pub qkv: Matrix,
    /// The attention output projection, `[dim, q_heads head_dim]`.
    pub o: Matrix,
    /// RMSNorm gain before the MLP.
    pub ffn_norm: wgpu::Buffer,
    /// Gate and up rows interleaved, `[2 ffn, dim]`.
    pub gate_up: Matrix,
    /// `[dim, ffn]`.
    pub down: Matrix,
    /// RoPE frequencies `[head_dim / 2]`, then the q-norm and k-norm gains `[head_dim]` each
    /// (ones where the model has none).
    pub rope_consts: wgpu::Buffer,
}

/// The whole model on the GPU.
pub struct Weights {
    /// Its configuration.
    pub cfg: Config,
    /// `[vocab, dim]`.
    pub embed: Matrix,
    /// `[vocab, dim]`; None when tied to the embedding.
    pub output: Option<Matrix>,
    /// The final RMSNorm's gain.
    pub out_norm: wgpu::Buffer,
    /// The layers.
    pub layers: Vec<Layer>,
}

fn f32_buffer(device: &wgpu::Device, label: &str, v: &[f32]) -> wgpu::Buffer {
    device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some(label),
        contents: bytemuck::cast_slice(v),
        usage: wgpu::BufferUsages::STORAGE,
    })
}

/// The RoPE frequencies of `cfg` (in f64, stored f32) and norm gains (`qn`, `kn`).
fn rope_consts(cfg: &Config, qn: Option<Vec<f32>>, kn: Option<Vec<f32>>) -> Vec<f32> {
    let d = cfg.head_dim as usize;
    let mut v: Vec<f32> = (0..d / 2)
        .map(|i| cfg.rope_base.powf(-2.0 * i as f64 / d as f64) as f32)
        .collect();
    v.extend(qn.unwrap_or_else(|| vec![1.0; d]));
    v.extend(kn.unwrap_or_else(|| vec![1.0; d]));
    v
}

/// Reads a norm's gain vector (f32 or f16) of `n` values.
fn read_vector(g: &mut Gguf, name: &str, n: u32) -> Result<Vec<f32>> {
    let (ty, raw) = g.read(name, &[n as u64])?;
    Ok(match ty {
        gguf::F32 => bytemuck::pod_collect_to_vec(&raw),
        gguf::F16 => raw
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => {
            return Err(ChatError::TensorType {
                name: name.into(),
                ty,
            });
        }
    })
}

fn read_matrix(g: &mut Gguf, name: &str, rows: u32, cols: u32) -> Result<HostMatrix> {
    let (ty, raw) = g.read(name, &[cols as u64, rows as u64])?;
    HostMatrix::from_gguf(name, ty, &raw, rows as usize, cols as usize)
}

impl Weights {
    /// Reads every weight of a Llama-architecture GGUF, fuses and repacks it, and uploads it
    /// (a layer at a time); `convert` forces one format on every matrix (f16: dequantized at
    /// load). `progress` is called after each layer.
    pub fn from_gguf(
        device: &wgpu::Device,
        g: &mut Gguf,
        convert: Option<Format>,
        progress: &mut dyn FnMut(u32),
    ) -> Result<Weights> {
        let cfg = Config::from_gguf(g)?;
        let conv = |m: HostMatrix| -> Result<HostMatrix> {
            match convert {
                None => Ok(m),
                Some(f) if f == m.format => Ok(m),
                Some(Format::F16) => Ok(m.to_f16()),
                Some(f) => Err(ChatError::Argument(format!(
                    "--weights {f:?}: a {:?} matrix cannot be requantized; use f16",
                    m.format
                ))),
            }
        };
        let (d, f, hd) = (cfg.dim, cfg.ffn, cfg.head_dim);
        let embed = conv(read_matrix(g, "token_embd.weight", cfg.vocab, d)?)?;
        let embed_gpu = Matrix::upload(device, &embed, "token_embd");
        drop(embed);
        let output = match cfg.tied {
            true => None,
            false => {
                let m = conv(read_matrix(g, "output.weight", cfg.vocab, d)?)?;
                Some(Matrix::upload(device, &m, "output"))
            }
        };
        let out_norm = f32_buffer(
            device,
            "output_norm",
            &read_vector(g, "output_norm.weight", d)?,
        );
        let mut layers = Vec::with_capacity(cfg.layers as usize);
        for l in 0..cfg.layers {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            let q = read_matrix(g, &n("attn_q"), cfg.q_heads * hd, d)?;
            let k = read_matrix(g, &n("attn_k"), cfg.kv_heads * hd, d)?;
            let v = read_matrix(g, &n("attn_v"), cfg.kv_heads * hd, d)?;
            let qkv = conv(HostMatrix::concat(&[q, k, v]))?;
            let o = conv(read_matrix(g, &n("attn_output"), d, cfg.q_heads * hd)?)?;
            let gate = read_matrix(g, &n("ffn_gate"), f, d)?;
            let up = read_matrix(g, &n("ffn_up"), f, d)?;
            let gate_up = conv(HostMatrix::interleave(&gate, &up))?;
            let down = conv(read_matrix(g, &n("ffn_down"), d, f)?)?;
            let an = read_vector(g, &n("attn_norm"), d)?;
            let fnm = read_vector(g, &n("ffn_norm"), d)?;
            layers.push(Layer {
                attn_norm: f32_buffer(device, "attn_norm", &an),
                qkv: Matrix::upload(device, &qkv, "qkv"),
                o: Matrix::upload(device, &o, "attn_output"),
                ffn_norm: f32_buffer(device, "ffn_norm", &fnm),
                gate_up: Matrix::upload(device, &gate_up, "gate_up"),
                down: Matrix::upload(device, &down, "ffn_down"),
                rope_consts: f32_buffer(device, "rope", &rope_consts(&cfg, None, None)),
            });
            progress(l + 1);
        }
        Ok(Weights {
            cfg,
            embed: embed_gpu,
            output,
            out_norm,
            layers,
        })
    }

    /// A model of `cfg`'s shape with random weights in `format`, generated on the GPU.
    pub fn random(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        kernels: &Kernels,
        cfg: &Config,
        format: Format,
    ) -> Result<Weights> {
        cfg.check()?;
        let mut seed = 0;
        let mut m = |rows: u32, cols: u32| {
            seed += 1;
            Matrix::random(device, queue, kernels, rows, cols, format, seed)
        };
        let ones = |n: u32| f32_buffer(device, "norm", &vec![1.0; n as usize]);
        let (d, f) = (cfg.dim, cfg.ffn);
        let embed = m(cfg.vocab, d)?;
        let output = match cfg.tied {
            true => None,
            false => Some(m(cfg.vocab, d)?),
        };
        let mut layers = Vec::with_capacity(cfg.layers as usize);
        for _ in 0..cfg.layers {
            layers.push(Layer {
                attn_norm: ones(d),
                qkv: m(cfg.qkv_rows(), d)?,
                o: m(d, cfg.q_heads * cfg.head_dim)?,
                ffn_norm: ones(d),
                gate_up: m(2 * f, d)?,
                down: m(d, f)?,
                rope_consts: f32_buffer(device, "rope", &rope_consts(cfg, None, None)),
            });
        }
        queue.submit([]);
        Ok(Weights {
            cfg: cfg.clone(),
            embed,
            output,
            out_norm: ones(d),
            layers,
        })
    }

    /// The output (logits) matrix.
    pub fn output(&self) -> &Matrix {
        self.output.as_ref().unwrap_or(&self.embed)
    }

    /// Bytes of weights a decode step reads: every layer matrix and the output matrix once,
    /// one embedding row per sequence (`batch`), the norms.
    pub fn bytes_per_step(&self, batch: u32) -> u64 {
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                l.qkv.bytes()
                    + l.o.bytes()
                    + l.gate_up.bytes()
                    + l.down.bytes()
                    + l.attn_norm.size()
                    + l.ffn_norm.size()
            })
            .sum();
        let e = &self.embed;
        layers
            + self.output().bytes()
            + batch as u64 * e.bytes() / e.rows as u64
            + self.out_norm.size()
    }

    /// Bytes of every weight buffer on the GPU.
    pub fn device_bytes(&self) -> u64 {
        let m = |m: &Matrix| m.codes.size() + m.scales.size();
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                m(&l.qkv)
                    + m(&l.o)
                    + m(&l.gate_up)
                    + m(&l.down)
                    + l.attn_norm.size()
                    + l.ffn_norm.size()
                    + l.rope_consts.size()
            })
            .sum();
        layers + m(&self.embed) + self.output.as_ref().map_or(0, m) + self.out_norm.size()
    }
}

/// The tokenizer tables of a GGUF: token strings, token types, merges.
pub struct Vocab {
    /// Token strings by id.
    pub tokens: Vec<String>,
    /// Token types by id (3 = control).
    pub types: Vec<i32>,
    /// BPE merges in rank order.
    pub merges: Vec<(String, String)>,
    /// Ids that end a reply.
    pub stop: Vec<u32>,
    /// The chat template (Jinja) where the file has one.
    pub template: Option<String>,
}

impl Vocab {
    /// Reads the tokenizer tables of `g`.
    pub fn from_gguf(g: &Gguf) -> Result<Vocab> {
        let strings = |key: &str| -> Result<Vec<String>> {
            g.array(key)?
                .iter()
                .map(|v| match v {
                    Value::Str(s) => Ok(s.clone()),
                    _ => Err(ChatError::Metadata {
                        key: key.into(),
                        problem: "holds a non-string".into(),
                    }),
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let types = g
            .array("tokenizer.ggml.token_type")?
            .iter()
            .map(|v| match v {
                Value::Int(i) => Ok(*i as i32),
                _ => Err(ChatError::Metadata {
                    key: "tokenizer.ggml.token_type".into(),
                    problem: "holds a non-integer".into(),
                }),
            })
            .collect::<Result<Vec<_>>>()?;
        let merges = strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| ChatError::Metadata {
                        key: "tokenizer.ggml.merges".into(),
                        problem: format!("holds '{m}', not 'a b'"),
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut stop: Vec<u32> = Vec::new();
        if let Ok(id) = g.usize("tokenizer.ggml.eos_token_id") {
            stop.push(id as u32);
        }
        for name in ["<|im_end|>", "<|endoftext|>", "<|eot_id|>"] {
            if let Some(i) = tokens.iter().position(|t| t == name) {
                stop.push(i as u32);
            }
        }
        let template = g.str("tokenizer.chat_template").ok().map(str::to_string);
        Ok(Vocab {
            tokens,
            types,
            merges,
            stop,
            template,
        })
    }
}
