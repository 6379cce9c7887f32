//! The real-model check: SmolLM2-135M over the first tokens of the GPL-3 with its attention
//! through kvq (the `perplexity` example's harness). Fails when the f16 cache's perplexity
//! drifts from the forward's known value, when kvq's f16 cache leaves the f64 reference, or
//! when a codec's KL divergence from the f16 cache rises above its bound. The model comes from
//! `bench/fetch-smollm2.sh` (run here when it is missing); a failed fetch fails the test.

#[allow(dead_code)]
#[path = "../examples/perplexity/attention.rs"]
mod attention;
// The harness's GPU forward (the chat example's engine).
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
#[path = "../examples/perplexity/harness.rs"]
mod harness;
#[allow(dead_code)]
#[path = "../examples/chat/kernels.rs"]
mod kernels;
#[allow(dead_code)]
#[path = "../examples/perplexity/levers.rs"]
mod levers;
#[allow(dead_code)]
#[path = "../examples/chat/llama.rs"]
mod llama;
#[allow(dead_code)]
#[path = "../examples/perplexity/metrics.rs"]
mod metrics;
#[allow(dead_code)]
#[path = "../examples/perplexity/model.rs"]
mod model;
#[allow(dead_code)]
#[path = "../examples/perplexity/tokenize.rs"]
mod tokenize;
#[allow(dead_code)]
#[path = "../examples/chat/weights.rs"]
mod weights;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use harness::{Cache, DEFAULT_TEXT, Setup};
use kvq::KvCodecs;

/// Tokens of the text the test scores.
const TOKENS: usize = 256;
/// The f16 cache's perplexity on them (lavapipe; 18.855 at 600 tokens, the known 18.86).
const F16_PPL: f64 = 21.661;
/// How far it may drift (relative).
const PPL_TOL: f64 = 0.005;

/// Each codec's KL-divergence bound against the f16 cache on these tokens: today's figure
/// (q8_sym 0.0019, turbo4_sym 0.146, k_q4 0.410) with a margin, so a codec that gets worse
/// fails.
const KLD_BOUNDS: &[(&str, f64)] = &[("q8_sym", 0.0025), ("turbo4_sym", 0.18), ("k_q4", 0.5)];

/// The f16 cache's perplexity, kvq's f16 cache against the f64 reference, and the plain codecs'
/// KL bounds. (Two tests, each with a device of its own, so that the harness's threads run
/// them at once: a CPU driver takes minutes for each.)
#[test]
fn real_model_perplexity_and_plain_codec_bounds() {
    let setup = setup();
    let vocab = setup.model.cfg.vocab;
    let tokens = &setup.tokens;
    let none = setup.run(Cache::Kvq(KvCodecs::NONE), &mut || {}).unwrap();
    let ppl = metrics::perplexity(&none.log_probs, vocab, tokens);
    eprintln!(
        "none: PPL {ppl:.4}, attention error by layer {:?}",
        none.layer_err
    );
    assert!(
        (ppl / F16_PPL - 1.0).abs() < PPL_TOL,
        "f16 cache PPL {ppl:.4} drifted from {F16_PPL} (tolerance {PPL_TOL})"
    );
    // kvq's f16 cache against the f64 reference on the same inputs, layer by layer, and in
    // what the model predicts.
    let worst = none.layer_err.iter().cloned().fold(0.0, f64::max);
    assert!(
        worst < 2e-3,
        "f16 cache attention error {worst:.2e} against f64"
    );
    let exact = setup.run(Cache::Exact, &mut || {}).unwrap();
    let s = metrics::score(&exact.log_probs, &none.log_probs, vocab, tokens);
    eprintln!("exact vs none: {s:?}");
    assert!(
        s.kld < 1e-4 && s.top1 > 0.99,
        "f64 reference vs f16 cache: {s:?}"
    );
    for &(name, bound) in KLD_BOUNDS {
        let run = setup
            .run(Cache::Kvq(KvCodecs::parse(name).unwrap()), &mut || {})
            .unwrap();
        let s = metrics::score(&run.log_probs, &none.log_probs, vocab, tokens);
        eprintln!("{name}: {s:?}");
        assert!(
            s.kld <= bound,
            "{name}: KLD {:.5} above its bound {bound}",
            s.kld
        );
    }
}

/// The recommended 4-bit cache (turbo4 with the first 16 and newest 32 tokens exact) and
/// k_iso3 with K's mean removed as well, the text as one chunk (each query sees the exact
/// tokens a decode step would), held to the 4-bit and the iso/rotor KL targets against the
/// f16 cache.
#[test]
fn real_model_exact_token_codec_bounds() {
    let setup = setup();
    let vocab = setup.model.cfg.vocab;
    let tokens = &setup.tokens;
    let none = setup.run(Cache::Kvq(KvCodecs::NONE), &mut || {}).unwrap();
    let exact = kvq::ExactTokens::new(16, 32);
    let k_mean = kvq::ExactTokens {
        k_mean: true,
        ..exact
    };
    for (name, x, bound) in [("turbo4_sym", exact, 0.03), ("k_iso3", k_mean, 0.10)] {
        let cache = Cache::KvqExact(KvCodecs::parse(name).unwrap(), x);
        let label = cache.name();
        let run = setup.run(cache, &mut || {}).unwrap();
        let s = metrics::score(&run.log_probs, &none.log_probs, vocab, tokens);
        eprintln!("{label}: {s:?}");
        assert!(
            s.kld <= bound,
            "{label}: KLD {:.5} above its target {bound}",
            s.kld
        );
    }
}

/// The model and the text's first [`TOKENS`] tokens, with a device of its own. (The model's
/// path is found, and the model fetched where missing, once for both tests.)
fn setup() -> Setup {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    let path = MODEL.get_or_init(|| harness::model_path(None).unwrap());
    Setup::new(path, Path::new(DEFAULT_TEXT), TOKENS).unwrap()
}
