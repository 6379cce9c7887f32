//! What a cache does to the model's predictions: perplexity on the text, and against a
//! baseline run (the f16 cache) the KL divergence of the next-token distributions and how
//! often the top token agrees.

/// Log-softmax of every row of `logits` (`[tokens, vocab]`), in f64, stored f32.
pub fn log_probs(logits: &[f32], vocab: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(logits.len());
    for row in logits.chunks(vocab) {
        let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
        out.extend(row.iter().map(|&x| (x as f64 - lse) as f32));
    }
    out
}

/// One run's figures against the baseline.
#[derive(Clone, Debug)]
pub struct Scores {
    /// Perplexity over the predicted tokens (positions `0..n-1` of the scored slice predicting
    /// `1..n`; the example's `--score-from` slices the text).
    pub ppl: f64,
    /// Mean KL(baseline ‖ run) over those positions, nats.
    pub kld: f64,
    /// The 99th percentile of the per-position KL divergence.
    pub kld_p99: f64,
    /// Share of positions whose most likely token equals the baseline's.
    pub top1: f64,
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv { (i, v) } else { (bi, bv) }
        })
        .0
}

/// Perplexity of `tokens` under `lp` (log-probs `[tokens, vocab]`).
pub fn perplexity(lp: &[f32], vocab: usize, tokens: &[u32]) -> f64 {
    let n = tokens.len() - 1;
    let nll: f64 = (0..n)
        .map(|t| -(lp[t * vocab + tokens[t + 1] as usize] as f64))
        .sum();
    (nll / n as f64).exp()
}

/// Scores of `lp` against `base` (both log-probs `[tokens, vocab]`) on `tokens`.
pub fn score(lp: &[f32], base: &[f32], vocab: usize, tokens: &[u32]) -> Scores {
    let n = tokens.len() - 1;
    let mut klds: Vec<f64> = (0..n)
        .map(|t| {
            let (a, b) = (&base[t * vocab..][..vocab], &lp[t * vocab..][..vocab]);
            a.iter()
                .zip(b)
                .map(|(&pa, &pb)| (pa as f64).exp() * (pa as f64 - pb as f64))
                .sum::<f64>()
                .max(0.0)
        })
        .collect();
    let agree = (0..n)
        .filter(|&t| argmax(&lp[t * vocab..][..vocab]) == argmax(&base[t * vocab..][..vocab]))
        .count();
    let kld = klds.iter().sum::<f64>() / n as f64;
    klds.sort_by(f64::total_cmp);
    let p99 = klds[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1];
    Scores {
        ppl: perplexity(lp, vocab, tokens),
        kld,
        kld_p99: p99,
        top1: agree as f64 / n as f64,
    }
}
