//! The chat example's GPU forward (`examples/chat`: every layer in WGSL, kvq as the cache)
//! against the perplexity harness's CPU forward (`examples/perplexity/model.rs`: candle's f32
//! matmuls, f64 attention over the unquantized K/V) on the same tokens of SmolLM2-135M: the
//! logits of every position agree within [`LOGIT_TOL`], and greedy decoding with the f16 cache
//! (`none`) picks the CPU's most likely token at every one of [`STEPS`] steps; the GPU's
//! sampler is greedy with a nucleus of one token, repeats a seeded draw, and draws every token
//! from the nucleus of the logits it was drawn from; a batch of two sequences decodes as each
//! does alone. Bad input (a
//! GGUF of another architecture, a missing or misshapen tensor, a file that is no GGUF, a prompt
//! longer than the cache) is a typed error. The model comes from `bench/fetch-smollm2.sh` (run
//! here when it is missing; a failed fetch fails the test).

#[allow(dead_code)]
#[path = "../examples/chat/chat.rs"]
mod chat;
#[allow(dead_code)]
#[path = "../examples/chat/engine.rs"]
mod engine;
#[allow(dead_code)]
#[path = "../examples/chat/error.rs"]
mod error;
#[allow(dead_code)]
#[path = "../examples/chat/gguf.rs"]
mod gguf;
#[allow(dead_code)]
#[path = "../examples/chat/kernels.rs"]
mod kernels;
#[allow(dead_code)]
#[path = "../examples/chat/llama.rs"]
mod llama;
#[allow(dead_code)]
#[path = "../examples/shared/model_file.rs"]
mod model_file;
#[allow(dead_code)]
#[path = "../examples/chat/weights.rs"]
mod weights;

#[allow(dead_code)]
#[path = "../examples/perplexity/attention.rs"]
mod attention;
#[allow(dead_code)]
#[path = "../examples/perplexity/model.rs"]
mod model;
#[allow(dead_code)]
#[path = "../examples/perplexity/tokenize.rs"]
mod tokenize;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvq::{GpuContext, KvCodecs};

use engine::{Engine, Options, Sampling};
use error::ChatError;

/// Greedy decode steps after the prompt.
const STEPS: usize = 40;
/// Largest |GPU logit - CPU logit| allowed at any position, relative to the largest |logit| of
/// that position: the GPU's cache holds K/V in f16 where the CPU attends them in f64, and sums
/// run in another order (lavapipe measured 9.8e-4 over these 41 positions).
const LOGIT_TOL: f64 = 3e-3;

fn model_path() -> PathBuf {
    model_file::model_path(None).unwrap()
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
        )
        .0
}

#[test]
fn gpu_forward_matches_cpu_forward() {
    let path = model_path();
    let ctx = GpuContext::new().unwrap();
    let mut g = gguf::Gguf::open(&path).unwrap();
    let vocab = llama::Vocab::from_gguf(&g).unwrap();
    let weights =
        Arc::new(llama::Weights::from_gguf(&ctx.device, &mut g, None, &mut |_| {}).unwrap());
    let tok = tokenize::tokenizer(&vocab.tokens, &vocab.types, &vocab.merges).unwrap();
    let capacity = 128;
    let mut e = Engine::new(&ctx, weights, Options::new(capacity, KvCodecs::NONE)).unwrap();
    let prompt = {
        let chat = chat::Chat::new(&mut e, &tok, &vocab, chat::DEFAULT_SYSTEM);
        chat.turn_ids("What is the capital of France?").unwrap()
    };
    // The GPU: the prompt as one chunk, then greedy steps; the logits of each.
    let mut tokens = prompt.clone();
    let mut gpu_logits = Vec::new();
    let mut next = e.prompt(std::slice::from_ref(&prompt)).unwrap()[0];
    gpu_logits.push(e.read_logits().unwrap());
    for _ in 0..STEPS {
        tokens.push(next);
        next = e.step().unwrap()[0];
        gpu_logits.push(e.read_logits().unwrap());
    }
    tokens.push(next);
    assert_eq!(e.len() as usize, tokens.len() - 1);
    // A prompt past the cache's room is refused, typed, and leaves the cache as it was.
    let long = vec![prompt.clone(); 1].concat().repeat(4);
    match e.prompt(&[long]) {
        Err(ChatError::PromptTooLong { capacity: c, .. }) => assert_eq!(c, capacity),
        other => panic!("expected PromptTooLong, got {:?}", other.map(|_| ())),
    }
    assert_eq!(e.len() as usize, tokens.len() - 1);
    // The CPU: one forward over every token.
    let cpu = model::Model::load(&path).unwrap();
    let cfg = cpu.cfg.clone();
    let n = tokens.len() - 1;
    let cpu_logits = cpu
        .forward(&tokens[..n], &mut attention::Exact(cfg.clone()))
        .unwrap();
    let v = cfg.vocab;
    let mut worst: f64 = 0.0;
    for (i, gl) in gpu_logits.iter().enumerate() {
        let pos = prompt.len() - 1 + i;
        let cl = &cpu_logits[pos * v..(pos + 1) * v];
        let scale = cl.iter().fold(0f64, |m, &x| m.max(x.abs() as f64));
        let diff = gl
            .iter()
            .zip(cl)
            .fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()));
        worst = worst.max(diff / scale);
        assert_eq!(
            tokens[pos + 1] as usize,
            argmax(cl),
            "greedy step {i} (position {pos}): the GPU chose {} where the CPU's most likely is {}",
            tokens[pos + 1],
            argmax(cl)
        );
    }
    eprintln!(
        "{} positions: worst |GPU - CPU| logit / max |logit| = {worst:.2e}; reply: {:?}",
        gpu_logits.len(),
        tok.decode(&tokens[prompt.len()..], true).unwrap()
    );
    assert!(
        worst < LOGIT_TOL,
        "logits differ by {worst:.2e} of their scale"
    );
    // Sampling on the GPU: a nucleus of one token is greedy; a seeded draw repeats; every drawn
    // token lies in the nucleus of the logits it was drawn from.
    let short = prompt[prompt.len() - 8..].to_vec();
    let mut draw = |s: Sampling, n: usize| draw_from(&mut e, &short, s, n);
    let greedy = draw(Sampling::GREEDY, 6).0;
    let narrow = Sampling {
        temperature: 0.7,
        top_p: 1e-6,
        seed: 3,
    };
    assert_eq!(
        draw(narrow, 6).0,
        greedy,
        "a nucleus of one token is greedy"
    );
    let s = Sampling {
        temperature: 1.0,
        top_p: 0.9,
        seed: 11,
    };
    let (a, logits) = draw(s, 12);
    assert_eq!(draw(s, 12).0, a, "a seeded draw repeats");
    for (step, (&t, l)) in a.iter().zip(&logits).enumerate() {
        // The nucleus on the CPU: the fewest most likely tokens holding top_p of the mass.
        let m = l.iter().fold(f64::MIN, |m, &x| m.max(x as f64));
        let mut p: Vec<f64> = l.iter().map(|&x| (x as f64 - m).exp()).collect();
        let z: f64 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= z);
        let mut sorted = p.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let mut acc = 0.0;
        let last = sorted
            .iter()
            .find(|&&x| {
                acc += x;
                acc >= s.top_p as f64
            })
            .copied()
            .unwrap_or(0.0);
        assert!(
            p[t as usize] >= last * (1.0 - 1e-3),
            "step {step}: drew token {t} (p {:.3e}) outside the nucleus (smallest p {last:.3e})",
            p[t as usize]
        );
    }
    // A batch of two sequences with different prompts: each decodes as it does alone.
    let other = prompt[prompt.len() - 12..prompt.len() - 4].to_vec();
    let alone = draw_from(&mut e, &other, Sampling::GREEDY, 6).0;
    let mut o = Options::new(32, KvCodecs::NONE);
    o.batch = 2;
    let mut pair = Engine::new(&ctx, e.weights.clone(), o).unwrap();
    let mut seqs = vec![pair.prompt(&[short.clone(), other.clone()]).unwrap()];
    for _ in 1..6 {
        seqs.push(pair.step().unwrap());
    }
    let col = |i: usize| seqs.iter().map(|s| s[i]).collect::<Vec<u32>>();
    assert_eq!(
        (col(0), col(1)),
        (greedy, alone),
        "batch of two against each alone"
    );
}

/// Runs `prompt` from an empty cache with `s`, then `n - 1` steps: the `n` tokens drawn and the
/// logits each was drawn from.
fn draw_from(e: &mut Engine, prompt: &[u32], s: Sampling, n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    e.reset().unwrap();
    e.set_sampling(s);
    let mut ids = vec![e.prompt(&[prompt.to_vec()]).unwrap()[0]];
    let mut logits = vec![e.read_logits().unwrap()];
    for _ in 1..n {
        ids.push(e.step().unwrap()[0]);
        logits.push(e.read_logits().unwrap());
    }
    (ids, logits)
}

/// A GGUF file of `kvs` (key, type, value bytes) and `tensors` (name, dims, ggml type, bytes).
fn gguf_file(
    name: &str,
    kvs: &[(&str, u32, Vec<u8>)],
    tensors: &[(&str, Vec<u64>, u32, Vec<u8>)],
) -> PathBuf {
    let mut b: Vec<u8> = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    let s = |b: &mut Vec<u8>, t: &str| {
        b.extend((t.len() as u64).to_le_bytes());
        b.extend(t.as_bytes());
    };
    for (k, ty, v) in kvs {
        s(&mut b, k);
        b.extend(ty.to_le_bytes());
        b.extend(v);
    }
    let mut offset = 0u64;
    for (n, dims, ty, data) in tensors {
        s(&mut b, n);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
        offset += (data.len() as u64).div_ceil(32) * 32;
    }
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    for (_, _, _, data) in tensors {
        b.extend(data);
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
    }
    let path = std::env::temp_dir().join(format!("kvq-chat-{}-{name}.gguf", std::process::id()));
    std::fs::write(&path, b).unwrap();
    path
}

fn text(v: &str) -> Vec<u8> {
    let mut b = (v.len() as u64).to_le_bytes().to_vec();
    b.extend(v.as_bytes());
    b
}

fn load(path: &Path) -> Result<llama::Weights, ChatError> {
    let ctx = GpuContext::new().map_err(ChatError::Kvq)?;
    let mut g = gguf::Gguf::open(path)?;
    llama::Weights::from_gguf(&ctx.device, &mut g, None, &mut |_| {})
}

#[test]
fn bad_inputs_are_typed_errors() {
    let u32v = |v: u32| v.to_le_bytes().to_vec();
    let llama_meta = |dim: u32| -> Vec<(&'static str, u32, Vec<u8>)> {
        vec![
            ("general.architecture", 8, text("llama")),
            ("llama.embedding_length", 4, u32v(dim)),
            ("llama.attention.head_count", 4, u32v(2)),
            ("llama.attention.head_count_kv", 4, u32v(1)),
            ("llama.block_count", 4, u32v(1)),
            ("llama.feed_forward_length", 4, u32v(64)),
            (
                "llama.attention.layer_norm_rms_epsilon",
                6,
                1e-5f32.to_le_bytes().to_vec(),
            ),
        ]
    };
    // Another architecture.
    let p = gguf_file("arch", &[("general.architecture", 8, text("gpt2"))], &[]);
    match load(&p) {
        Err(ChatError::Architecture { found, .. }) => assert_eq!(found, "gpt2"),
        other => panic!("expected Architecture, got {:?}", other.map(|_| ())),
    }
    // No embedding at all.
    let p = gguf_file("missing", &llama_meta(64), &[]);
    match load(&p) {
        Err(ChatError::MissingTensor { name }) => assert_eq!(name, "token_embd.weight"),
        other => panic!("expected MissingTensor, got {:?}", other.map(|_| ())),
    }
    // The embedding right (f32 [64, 16]), the first layer's Q missing.
    let embd = ("token_embd.weight", vec![64, 16], 0, vec![0u8; 64 * 16 * 4]);
    let norm = ("output_norm.weight", vec![64], 0, vec![0u8; 64 * 4]);
    let p = gguf_file("layer", &llama_meta(64), &[embd.clone(), norm.clone()]);
    match load(&p) {
        Err(ChatError::MissingTensor { name }) => assert_eq!(name, "blk.0.attn_q.weight"),
        other => panic!("expected MissingTensor, got {:?}", other.map(|_| ())),
    }
    // Q of the wrong shape.
    let q = (
        "blk.0.attn_q.weight",
        vec![64, 32],
        0,
        vec![0u8; 64 * 32 * 4],
    );
    let p = gguf_file("shape", &llama_meta(64), &[embd.clone(), norm.clone(), q]);
    match load(&p) {
        Err(ChatError::TensorShape {
            name,
            expected,
            found,
        }) => {
            assert_eq!(name, "blk.0.attn_q.weight");
            assert_eq!((expected, found), (vec![64, 64], vec![64, 32]));
        }
        other => panic!("expected TensorShape, got {:?}", other.map(|_| ())),
    }
    // A tensor past the end of the file.
    let short = ("token_embd.weight", vec![64, 16], 0, vec![0u8; 64]);
    let p = gguf_file("short", &llama_meta(64), &[short, norm]);
    match load(&p) {
        Err(ChatError::BadGguf { .. }) => {}
        other => panic!("expected BadGguf, got {:?}", other.map(|_| ())),
    }
    // No GGUF at all, and a missing metadata key.
    let p = std::env::temp_dir().join(format!("kvq-chat-{}-text.gguf", std::process::id()));
    std::fs::write(&p, b"hello, not a model").unwrap();
    assert!(matches!(load(&p), Err(ChatError::BadGguf { .. })));
    let p = gguf_file("meta", &llama_meta(64)[..3], &[]);
    assert!(matches!(load(&p), Err(ChatError::Metadata { .. })));
    assert!(matches!(
        load(Path::new("/nonexistent.gguf")),
        Err(ChatError::Io { .. })
    ));
}
