//! Decode sweep: measures the adapter's read bandwidth once, then for each (codec, context)
//! fills a cache to the context and times decode steps (append + attend for every layer, one
//! submit per step; the step time is the host clock around submit + wait, the recording is
//! timed on its own; on a GPU the wait spins on the queue, as CUDA's default synchronize does,
//! unless `--wait block`). Prints a progress bar (stderr, on a terminal; plain lines
//! otherwise), a table (stdout), each codec's device memory by part, and writes a CSV and an
//! SVG plot.
//!
//! `cargo run --release --example sweep -- --model qwen3-8b --ctx 1024,4096,32768 --codecs all
//! --csv out.csv --plot out.svg`. On a CPU adapter it picks small sizes where none are
//! given (the tiny model without --model, short contexts without --ctx) so the default command finishes in seconds. `--replot FILE.csv --plot
//! FILE.svg` plots an earlier sweep's CSV again without measuring (or needing a GPU); its
//! title names the CSV file where a sweep's names the device.
//!
//! Modules: [`args`] (the command line), [`plan`] (what runs), [`probe`] (the bandwidth,
//! FMA and matrix probes; [`matrix`] and [`matrix_wgsl`] hold the last), [`measure`] (the timed runs), [`timing`] (their clocks), [`progress`] (stderr),
//! [`report`] (the table), [`csv`] (the CSV, both ways), [`plot`] (the SVG).

mod args;
mod csv;
mod matrix;
mod matrix_wgsl;
mod measure;
mod plan;
mod plot;
mod probe;
mod progress;
mod report;
mod timing;

#[path = "../shared/codec_list.rs"]
mod codec_list;
#[path = "../shared/models.rs"]
mod models;

use std::io::Write;
use std::time::Instant;

use kvq::GpuContext;
use kvq::memory::fmt_bytes;

use args::{Args, USAGE, parse_args};
use measure::{PointRun, Row, Skip};
use plan::Plan;
use plot::{Point, plot_title};
use progress::Progress;

/// Ends the sweep with `sweep: {msg}` on stderr: exit 2 for a bad command line, 1 otherwise.
fn fail(code: i32, msg: impl std::fmt::Display) -> ! {
    eprintln!("sweep: {msg}");
    std::process::exit(code);
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| fail(2, format!("{e}\n{USAGE}")));
    if let (Some(csv), Some(svg)) = (&args.replot, &args.plot) {
        let (points, title) =
            csv::read_points(csv).unwrap_or_else(|e| fail(1, format!("cannot replot {csv}: {e}")));
        plot::save(svg, &points, &title);
        return;
    }
    let ctx = GpuContext::new()
        .unwrap_or_else(|e| fail(1, e))
        .with_shader_checks(args.shader_checks);
    let wait = args.wait_on(&ctx);
    let plan = Plan::new(&args, &ctx).unwrap_or_else(|e| fail(2, e));
    let peaks = probe::peaks(&ctx, &args.matrix, args.matrix_dump.as_deref());
    if args.probes_only {
        return;
    }
    let rows = run_points(&ctx, &plan, &args);
    let derived = report::derive(&rows, &peaks);
    report::print(&rows, &derived, &peaks, wait);
    if let Some(path) = &args.csv {
        let text = csv::text(&rows, &derived, plan.model.name, &peaks, wait);
        match std::fs::File::create(path).and_then(|mut f| f.write_all(text.as_bytes())) {
            Ok(()) => eprintln!("wrote {path}"),
            Err(e) => fail(1, format!("cannot write {path}: {e}")),
        }
    }
    if let Some(path) = &args.plot {
        let m = plan.model;
        let title = plot_title(m.name, m.layers, &ctx.info.name);
        let points: Vec<Point> = rows
            .iter()
            .map(|r| Point {
                codec: r.label(),
                ctx: r.ctx,
                tok_s: r.tok_s(),
            })
            .collect();
        plot::save(path, &points, &title);
    }
}

/// Every (context, queries, codec) point, contexts outermost, in `args.rounds` interleaved
/// rounds: all points of a context run once, then again, so a slow stretch of the GPU (a
/// clock ramp, another process) lands in one round of many points, not in every round of one.
/// One line each as a run ends (measured, skipped or failed); the measured rows, each merged
/// over its rounds, in point order.
fn run_points(ctx: &GpuContext, plan: &Plan, args: &Args) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    let total = plan.codecs.len() * plan.ctxs.len() * args.queries.len() * args.rounds;
    let progress = Progress::new(total);
    let mut done = 0;
    for &c in &plan.ctxs {
        // Per (queries, codec) of this context: its rows of the rounds so far.
        let mut runs: Vec<Vec<Row>> = Vec::new();
        for round in 1..=args.rounds {
            let mut at = 0;
            for &n in &args.queries {
                for (name, codecs) in &plan.codecs {
                    let run = run_point(ctx, plan, args, &progress, (name, *codecs), c, n);
                    done += 1;
                    if let Some(r) = run {
                        progress.line(format!(
                            "[{done}/{total}] round {round}/{}: {} ctx {c}: {:.3} ms/step, {} on the device",
                            args.rounds,
                            measure::label(name, n),
                            r.step_ms,
                            fmt_bytes(r.mem.total()),
                        ));
                        if !r.kernel_ms.is_empty() {
                            progress.line(format!("  GPU ms per kernel: {}", r.kernel_times()));
                        }
                        if runs.len() <= at {
                            runs.resize_with(at + 1, Vec::new);
                        }
                        runs[at].push(r);
                    }
                    at += 1;
                    progress.point_done();
                }
            }
        }
        rows.extend(runs.into_iter().filter(|r| !r.is_empty()).map(Row::merge));
    }
    progress.finish();
    rows
}

/// One run of one point: its row, or None after a line saying why it was skipped or failed.
fn run_point(
    ctx: &GpuContext,
    plan: &Plan,
    args: &Args,
    progress: &Progress,
    (name, codecs): (&str, kvq::KvCodecs),
    c: u32,
    n: u32,
) -> Option<Row> {
    let label = measure::label(name, n);
    let t = Instant::now();
    let result = match plan.over_budget(codecs, c, n, args) {
        Some(why) => Err(Skip::Skipped(why)),
        None => PointRun {
            ctx,
            model: plan.model,
            args,
            steps: plan.steps,
            progress,
            name,
            codecs,
            context: c,
            queries: n,
        }
        .run(),
    };
    match result {
        Ok(r) => {
            progress.status(format!(
                "{label} ctx {c}: {:.1} s",
                t.elapsed().as_secs_f64()
            ));
            Some(r)
        }
        Err(Skip::Skipped(why)) => {
            progress.line(format!("skipped ctx={c} codec={label}: {why}"));
            None
        }
        Err(Skip::Failed(why)) => {
            progress.line(format!("failed ctx={c} codec={label}: {why}"));
            None
        }
    }
}
