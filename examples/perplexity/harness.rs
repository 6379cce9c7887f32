//! The harness both the `perplexity` example and its CI test drive: load the model and the
//! text once, then run the forward once per cache configuration.

use std::path::{Path, PathBuf};
use std::time::Instant;

use std::sync::Arc;

use kvq::{ExactTokens, GpuContext, KvCodecs};

use crate::attention::{Exact, Kvq, exact, rel_err};
use crate::engine::{Engine, Options};
use crate::levers::{Levers, Sim};
use crate::metrics::log_probs;
use crate::model::{Attention, Config, LayerQkv, Model};
use crate::tokenize::{encode, tokenizer};

#[path = "../shared/model_file.rs"]
mod model_file;
pub use model_file::model_path;
/// The text: the GPL-3, which every Debian machine carries (package `base-files`).
pub const DEFAULT_TEXT: &str = "/usr/share/common-licenses/GPL-3";

/// Tokens per chunk of a GPU forward (its logits buffer: chunk x vocabulary f32, 50 MB for
/// SmolLM2, within lavapipe's 128 MiB binding).
pub const GPU_CHUNK: u32 = 256;

/// A cache configuration to run.
#[derive(Clone, Copy, Debug)]
pub enum Cache {
    /// Attention by the f64 CPU reference over the unquantized (f32) K/V.
    Exact,
    /// kvq on the GPU with these codecs (`none` = the f16 cache).
    Kvq(KvCodecs),
    /// The codecs' CPU reference with candidate levers around it ([`crate::levers`]).
    Sim(KvCodecs, Levers),
    /// kvq on the GPU with these codecs and exact tokens (`CacheSpec::with_exact`, with K's
    /// mean removed where `k_mean`): each query sees the exact tokens a decode step would.
    KvqExact(KvCodecs, ExactTokens),
}

impl Cache {
    /// The name in tables and CSVs: `exact`, or kvq's codec name.
    pub fn name(&self) -> String {
        match self {
            Cache::Exact => "exact".into(),
            Cache::Kvq(c) => c.name(),
            Cache::Sim(c, l) => format!("{}@{}", c.name(), l.name()),
            Cache::KvqExact(c, x) => {
                let kmean = if x.k_mean { "kmean+" } else { "" };
                format!("{} [{kmean}sink{}+recent{}]", c.name(), x.sink, x.recent)
            }
        }
    }
}

/// Where the model's forward runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forward {
    /// On the CPU (candle, f32), kvq attending each layer's tokens on the GPU.
    Cpu,
    /// Wholly on the GPU (the `chat` example's engine): the kvq rows only; `exact` and lever
    /// rows stay on the CPU.
    Gpu,
}

/// One forward's outputs.
pub struct Run {
    /// Log-probabilities `[tokens, vocab]`.
    pub log_probs: Vec<f32>,
    /// Per-layer relative error of the attention output against the f64 reference on the
    /// same layer's inputs (empty for a GPU forward, whose Q/K/V stay on the GPU).
    pub layer_err: Vec<f64>,
    /// Stored bits per value of K and V (a lever row's at the text's length, exact tokens and
    /// means included).
    pub bits: (f64, f64),
    /// Wall time of the forward, seconds.
    pub seconds: f64,
}

/// The model, the tokens of the text, and the GPU.
pub struct Setup {
    /// The model.
    pub model: Model,
    /// The first tokens of the text.
    pub tokens: Vec<u32>,
    /// kvq's device.
    pub ctx: GpuContext,
    /// Chunk slices of at least this many tokens take kvq's prefill kernel
    /// (`CacheSpec::prefill_from`); None: the adapter's tuning.
    pub prefill_from: Option<u32>,
    /// The caches' products (`CacheSpec::precision`).
    pub precision: kvq::Precision,
    /// Where the kvq rows' forward runs.
    pub forward: Forward,
    /// The model file (the GPU forward loads its own weights from it).
    pub path: PathBuf,
    /// The GPU forward's weights, loaded on first use.
    gpu_weights: std::sync::OnceLock<Arc<crate::llama::Weights>>,
}

impl Setup {
    /// Loads the model and the first `n` tokens of `text` (an error if it has fewer), and
    /// opens kvq's device.
    pub fn new(model: &Path, text: &Path, n: usize) -> Result<Setup, String> {
        if !model.exists() {
            return Err(format!("{} does not exist", model.display()));
        }
        let path = model;
        let model = Model::load(model)?;
        let tok = tokenizer(&model.tokens, &model.token_types, &model.merges)?;
        let body = std::fs::read_to_string(text).map_err(|e| format!("{}: {e}", text.display()))?;
        if n < 2 {
            return Err(format!(
                "--tokens {n}: perplexity needs at least 2 tokens (one predicted)"
            ));
        }
        let mut tokens = encode(&tok, &body)?;
        if tokens.len() < n {
            return Err(format!(
                "{} has {} tokens, fewer than --tokens {n}",
                text.display(),
                tokens.len()
            ));
        }
        tokens.truncate(n);
        let ctx = GpuContext::new().map_err(|e| e.to_string())?;
        Ok(Setup {
            model,
            tokens,
            ctx,
            prefill_from: None,
            precision: kvq::Precision::Auto,
            forward: Forward::Cpu,
            path: path.to_path_buf(),
            gpu_weights: std::sync::OnceLock::new(),
        })
    }

    /// The whole forward on the GPU with kvq `codecs` and `exact` tokens: every position's
    /// log-probabilities; `progress` is called after each chunk of tokens.
    fn run_gpu(
        &self,
        codecs: KvCodecs,
        exact: ExactTokens,
        progress: &mut dyn FnMut(),
    ) -> Result<Vec<f32>, String> {
        if self.gpu_weights.get().is_none() {
            let mut g = crate::gguf::Gguf::open(&self.path).map_err(|e| e.to_string())?;
            let w = crate::llama::Weights::from_gguf(&self.ctx.device, &mut g, None, &mut |_| {})
                .map_err(|e| e.to_string())?;
            let _ = self.gpu_weights.set(Arc::new(w));
        }
        let weights = self.gpu_weights.get().expect("loaded above").clone();
        let n = self.tokens.len() as u32;
        let mut opts = Options::new(n, codecs);
        opts.exact = exact;
        opts.score = true;
        opts.prompt_max = GPU_CHUNK.min(n);
        opts.prefill_from = self.prefill_from;
        opts.precision = self.precision;
        let mut e = Engine::new(&self.ctx, weights, opts).map_err(|e| e.to_string())?;
        let logits = e
            .score(&self.tokens, &mut |_| progress())
            .map_err(|e| e.to_string())?;
        Ok(log_probs(&logits, self.model.cfg.vocab))
    }

    /// Progress calls a run of `cache` makes: one per layer on the CPU, one per chunk of
    /// [`GPU_CHUNK`] tokens on the GPU.
    pub fn progress_steps(&self, cache: Cache) -> usize {
        match (self.forward, cache) {
            (Forward::Gpu, Cache::Kvq(_) | Cache::KvqExact(..)) => {
                self.tokens.len().div_ceil(GPU_CHUNK as usize)
            }
            _ => self.model.cfg.layers,
        }
    }

    /// Runs the forward with `cache`; `progress` is called after each layer (each chunk of
    /// tokens for a GPU forward).
    pub fn run(&self, cache: Cache, progress: &mut dyn FnMut()) -> Result<Run, String> {
        if self.forward == Forward::Gpu
            && let Cache::Kvq(c) | Cache::KvqExact(c, _) = cache
        {
            let start = Instant::now();
            let exact = match cache {
                Cache::KvqExact(_, x) => x,
                _ => ExactTokens::NONE,
            };
            let lp = self.run_gpu(c, exact, progress)?;
            let d = self.model.cfg.head_dim as u32;
            let t = self.tokens.len();
            let extra = 16.0 * exact.rows().min(t as u32) as f64 / t as f64;
            let mean = if exact.k_mean { 32.0 / t as f64 } else { 0.0 };
            return Ok(Run {
                log_probs: lp,
                layer_err: Vec::new(),
                bits: (
                    c.k.bits_per_value(d) + extra + mean,
                    c.v.bits_per_value(d) + extra,
                ),
                seconds: start.elapsed().as_secs_f64(),
            });
        }
        let cfg = &self.model.cfg;
        let d = cfg.head_dim as u32;
        let start = Instant::now();
        let (inner, bits): (Box<dyn Attention>, _) = match cache {
            Cache::Exact => (Box::new(Exact(cfg.clone())), (32.0, 32.0)),
            Cache::KvqExact(c, x) => {
                // Every token's codes, and the exact tokens' f16 copies beside them.
                let t = self.tokens.len();
                let extra = 16.0 * x.rows().min(t as u32) as f64 / t as f64;
                // K's mean: one f32 per channel, KV head and layer.
                let mean = if x.k_mean { 32.0 / t as f64 } else { 0.0 };
                let bits = (
                    c.k.bits_per_value(d) + extra + mean,
                    c.v.bits_per_value(d) + extra,
                );
                let n = self.tokens.len() as u32;
                let a = Kvq::new(&self.ctx, cfg, c, x, n, self.prefill_from, self.precision)?;
                (Box::new(a) as Box<dyn Attention>, bits)
            }
            Cache::Kvq(c) | Cache::Sim(c, _) => {
                let mut bits = (c.k.bits_per_value(d), c.v.bits_per_value(d));
                if let Cache::Sim(_, l) = cache {
                    // Exact tokens and calibration means count at this text's length.
                    let t = self.tokens.len();
                    bits = (
                        l.stored_bits(bits.0, t, l.k_mean as u32 + l.k_scale as u32),
                        l.stored_bits(bits.1, t, l.v_mean as u32),
                    );
                }
                let a: Box<dyn Attention> = match cache {
                    Cache::Sim(_, levers) => Box::new(Sim::new(cfg, c, levers)?),
                    _ => Box::new(Kvq::new(
                        &self.ctx,
                        cfg,
                        c,
                        ExactTokens::NONE,
                        self.tokens.len() as u32,
                        self.prefill_from,
                        self.precision,
                    )?),
                };
                (a, bits)
            }
        };
        let mut m = Measured {
            inner,
            cfg,
            reference: !matches!(cache, Cache::Exact),
            layer_err: Vec::new(),
            progress,
        };
        let logits = self.model.forward(&self.tokens, &mut m)?;
        Ok(Run {
            log_probs: log_probs(&logits, cfg.vocab),
            layer_err: m.layer_err,
            bits,
            seconds: start.elapsed().as_secs_f64(),
        })
    }
}

/// A backend with each layer's output error against the f64 reference on the same inputs
/// (0 for the reference itself), and progress after each layer.
struct Measured<'a> {
    inner: Box<dyn Attention>,
    cfg: &'a Config,
    reference: bool,
    layer_err: Vec<f64>,
    progress: &'a mut dyn FnMut(),
}

impl Attention for Measured<'_> {
    fn attend(&mut self, qkv: &LayerQkv<'_>) -> Result<Vec<f32>, String> {
        let out = self.inner.attend(qkv)?;
        self.layer_err.push(if self.reference {
            rel_err(&out, &exact(self.cfg, qkv))
        } else {
            0.0
        });
        (self.progress)();
        Ok(out)
    }
}
