//! A Llama-architecture model run entirely on the GPU through wgpu, with kvq as its KV cache:
//! the forward's own WGSL kernels (`kernels/`: embedding, RMSNorm, matrix-vector and
//! matrix-matrix products over 4/8-bit blocks dequantized in-kernel, RoPE, SwiGLU, residuals,
//! logits, sampling) and kvq's attention over the quantized cache, one compute pass per decode
//! step, only the sampled token ids read back.
//!
//! ```text
//! cargo run --release --example chat                                  # talk to SmolLM2-135M
//! cargo run --release --example chat -- --prompt "What is the capital of France?"
//! cargo run --release --example chat -- --codecs turbo3_sym --exact 16,32
//! cargo run --release --example chat -- --bench --shape qwen3-8b --codecs none,turbo3_sym
//! ```
//!
//! The model is `.models/SmolLM2-135M-Instruct.Q4_1.gguf` (`bench/fetch-smollm2.sh`, run when
//! it is missing) or `--model FILE`; `--shape NAME` builds a model of that shape with random
//! 4-bit weights on the GPU instead (no file).

mod bench;
mod chat;
#[allow(dead_code)]
mod engine;
mod error;
#[allow(dead_code)]
mod gguf;
mod kernels;
mod llama;
mod weights;

#[path = "../shared/codec_list.rs"]
mod codec_list;
#[path = "../shared/model_file.rs"]
mod model_file;
#[allow(dead_code)]
#[path = "../perplexity/tokenize.rs"]
mod tokenize;

use std::path::PathBuf;
use std::process::ExitCode;

use kvq::{ExactTokens, GpuContext, KvCodecs};

use engine::{Engine, Options, Sampling};
use error::{ChatError, Result};
use weights::Format;

const USAGE: &str =
    "usage: chat [--model GGUF | --shape NAME] [--codecs LIST] [--exact S,R[,kmean]]
            [--ctx N] [--prompt TEXT]... [--system TEXT] [--max-tokens N]
            [--temperature T] [--top-p P] [--seed S] [--weights q4|q8|f16]
            [--bench [--batch LIST] [--contexts LIST] [--steps N] [--prompt-tokens N]
                     [--prompt-codecs LIST] [--csv FILE] [--plot FILE.svg]]
  --model GGUF     a Llama-architecture GGUF (default $KVQ_MODEL, else
                   .models/SmolLM2-135M-Instruct.Q4_1.gguf, fetched by bench/fetch-smollm2.sh)
  --shape NAME     instead, a model of this shape with random weights made on the GPU:
                   qwen3-8b, llama3-8b, smollm2-135m, tiny
  --codecs LIST    the KV cache's codecs (kvq names; chat takes the first; default none)
  --exact S,R      keep each sequence's first S and newest R tokens exact (CacheSpec::with_exact)
  --ctx N          tokens the cache holds (default 2048)
  --prompt TEXT    a user turn (repeatable); without it, turns are read from stdin
  --system TEXT    the system message (default SmolLM2's)
  --max-tokens N   most tokens per reply (default 256)
  --temperature T  0 (default): greedy; else sample at this temperature, nucleus --top-p P
                   (default 0.9), seeded by --seed S (default 0)
  --weights FMT    convert every matrix to FMT at load (f16: dequantized once) instead of
                   dequantizing the file's blocks in the kernels; random shapes: their format
                   (default q4)
  --bench          decode and prompt tokens/s per codec, context and batch (bench.rs): the
                   cache filled to each of --contexts (default 1024,4096,32768) with random K/V,
                   --steps decode steps (default 20) per point for each of --batch (default
                   1,4); --exact goes to the codecs of at most 4 bits; a prompt point (batch 1)
                   of min(context, --prompt-tokens) tokens (default 4096; 0: none) for the
                   --prompt-codecs (default all); --csv, --plot (tokens/s against context)";

/// Parsed command line.
pub struct Args {
    pub model: Option<PathBuf>,
    pub shape: Option<String>,
    pub codecs: Vec<KvCodecs>,
    pub exact: ExactTokens,
    pub ctx: u32,
    pub prompts: Vec<String>,
    pub system: String,
    pub max_tokens: u32,
    pub sampling: Sampling,
    pub weights: Option<Format>,
    pub bench: bool,
    pub batches: Vec<u32>,
    pub contexts: Vec<u32>,
    pub steps: u32,
    pub prompt_tokens: u32,
    pub prompt_codecs: Option<Vec<KvCodecs>>,
    pub csv: Option<PathBuf>,
    pub plot: Option<PathBuf>,
}

fn list<T: std::str::FromStr>(flag: &str, v: &str) -> Result<Vec<T>> {
    v.split(',')
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| ChatError::Argument(format!("bad {flag} value '{s}'")))
        })
        .collect()
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        model: None,
        shape: None,
        codecs: vec![KvCodecs::NONE],
        exact: ExactTokens::NONE,
        ctx: 2048,
        prompts: Vec::new(),
        system: chat::DEFAULT_SYSTEM.to_string(),
        max_tokens: 256,
        sampling: Sampling {
            temperature: 0.0,
            top_p: 0.9,
            seed: 0,
        },
        weights: None,
        bench: false,
        batches: vec![1, 4],
        contexts: vec![1024, 4096, 32768],
        steps: 20,
        prompt_tokens: 4096,
        prompt_codecs: None,
        csv: None,
        plot: None,
    };
    let mut it = std::env::args().skip(1);
    let one = |flag: &str, v: &str| -> Result<u32> {
        v.parse()
            .map_err(|_| ChatError::Argument(format!("bad {flag} value '{v}'")))
    };
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--help" | "-h" => return Err(ChatError::Argument(String::new())),
            "--bench" => {
                a.bench = true;
                continue;
            }
            _ => {}
        }
        let v = it
            .next()
            .ok_or_else(|| ChatError::Argument(format!("{flag} needs a value")))?;
        match flag.as_str() {
            "--model" => a.model = Some(v.into()),
            "--shape" => a.shape = Some(v),
            "--codecs" => {
                a.codecs = codec_list::split_codecs(&v)
                    .iter()
                    .map(|n| KvCodecs::parse(n))
                    .collect::<std::result::Result<_, _>>()?
            }
            "--exact" => {
                a.exact = v
                    .parse()
                    .map_err(|e| ChatError::Argument(format!("--exact: {e}")))?
            }
            "--ctx" => a.ctx = one(&flag, &v)?,
            "--prompt" => a.prompts.push(v),
            "--system" => a.system = v,
            "--max-tokens" => a.max_tokens = one(&flag, &v)?,
            "--temperature" => {
                a.sampling.temperature = v
                    .parse()
                    .map_err(|_| ChatError::Argument(format!("bad --temperature '{v}'")))?
            }
            "--top-p" => {
                a.sampling.top_p = v
                    .parse()
                    .map_err(|_| ChatError::Argument(format!("bad --top-p '{v}'")))?
            }
            "--seed" => a.sampling.seed = one(&flag, &v)?,
            "--weights" => a.weights = Some(Format::parse(&v)?),
            "--batch" => a.batches = list(&flag, &v)?,
            "--contexts" => a.contexts = list(&flag, &v)?,
            "--steps" => a.steps = one(&flag, &v)?.max(1),
            "--prompt-tokens" => a.prompt_tokens = one(&flag, &v)?,
            "--prompt-codecs" => {
                a.prompt_codecs = Some(
                    codec_list::split_codecs(&v)
                        .iter()
                        .map(|n| KvCodecs::parse(n))
                        .collect::<std::result::Result<_, _>>()?,
                )
            }
            "--csv" => a.csv = Some(v.into()),
            "--plot" => a.plot = Some(v.into()),
            _ => return Err(ChatError::Argument(format!("unknown flag {flag}"))),
        }
    }
    if a.codecs.is_empty() {
        return Err(ChatError::Argument("--codecs needs at least one".into()));
    }
    if !(a.sampling.temperature >= 0.0 && a.sampling.top_p > 0.0 && a.sampling.top_p <= 1.0) {
        return Err(ChatError::Argument(
            "--temperature must be >= 0 and --top-p in (0, 1]".into(),
        ));
    }
    Ok(a)
}

/// Opens the engine's own device (as an embedding engine does) with what kvq needs, and
/// wraps it for kvq.
pub fn open_device() -> Result<GpuContext> {
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    }))
    .map_err(|e| ChatError::Gpu(format!("no adapter: {e}")))?;
    let (features, limits) = GpuContext::device_requirements(&adapter)?;
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("chat"),
        required_features: features,
        required_limits: limits,
        ..Default::default()
    }))
    .map_err(|e| ChatError::Gpu(format!("request device: {e}")))?;
    Ok(GpuContext::from_device(device, queue, adapter.get_info()))
}

/// The model path: `path`, else `$KVQ_MODEL`, else the default under the crate root (fetched
/// when missing; a failed fetch is an error).
pub fn model_path(path: Option<PathBuf>) -> Result<PathBuf> {
    model_file::model_path(path).map_err(ChatError::Argument)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            let msg = e.to_string();
            if !msg.is_empty() {
                eprintln!("chat: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chat: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    let ctx = open_device()?;
    eprintln!("device: {} ({:?})", ctx.info.name, ctx.info.backend);
    if args.bench {
        return bench::run(&ctx, args);
    }
    let path = model_path(args.model.clone())?;
    let t0 = std::time::Instant::now();
    let mut g = gguf::Gguf::open(&path)?;
    let vocab = llama::Vocab::from_gguf(&g)?;
    let weights = llama::Weights::from_gguf(&ctx.device, &mut g, args.weights, &mut |_| {})?;
    let tok = tokenize::tokenizer(&vocab.tokens, &vocab.types, &vocab.merges)
        .map_err(ChatError::Tokenizer)?;
    let mut opts = Options::new(args.ctx, args.codecs[0]);
    opts.exact = args.exact;
    let cfg = weights.cfg.clone();
    let wbytes = weights.device_bytes();
    let mut engine = Engine::new(&ctx, std::sync::Arc::new(weights), opts)?;
    engine.set_sampling(args.sampling);
    eprintln!(
        "{}: {} layers, {} / {} heads of {}, vocabulary {}; weights {} on the GPU; cache {} ({}); {} pipelines; ready in {:.1} s",
        cfg.name,
        cfg.layers,
        cfg.q_heads,
        cfg.kv_heads,
        cfg.head_dim,
        cfg.vocab,
        kvq::memory::fmt_bytes(wbytes),
        args.codecs[0].name(),
        kvq::memory::fmt_bytes(engine.cache.memory().total()),
        engine.pipelines(),
        t0.elapsed().as_secs_f64()
    );
    if vocab
        .template
        .as_deref()
        .is_some_and(|t| !t.contains("<|im_start|>"))
    {
        eprintln!("note: the file's chat template is not ChatML; using ChatML anyway");
    }
    let mut chat = chat::Chat::new(&mut engine, &tok, &vocab, &args.system);
    chat.max_tokens = args.max_tokens;
    chat::run(&mut chat, &args.prompts)
}
