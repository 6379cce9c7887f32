//! The main job: what each KV cache costs in decode step time and saves in memory against
//! `none` (f16). Measures the adapter's read bandwidth and FMA rate once, then for each cache
//! and context fills a cache to the context and times decode steps (append + attend for every
//! layer, one submit per step, recorded beforehand), in interleaved rounds. Prints progress
//! (stderr), the table, one line per noisy point saying why, each cache's memory by part and
//! its cost against `none` (stdout), and writes a CSV and an SVG plot (default
//! `out/sweep.csv`, `out/sweep.svg`, named at the end).
//!
//! `cargo run --release --example sweep` compares `none` with four caches worth picking
//! ([`args::DEFAULT_CODECS`]) at sizes that suit the adapter ([`plan::GPU_DEFAULT`],
//! [`plan::CPU_DEFAULT`]); `--help` lists the flags, examples/README.md what each output
//! holds. `--replot FILE.csv --plot FILE.svg` draws an earlier sweep's CSV again, without a
//! GPU.
//!
//! Modules: [`args`] (the command line), [`plan`] (what runs), [`probe`] (the bandwidth,
//! FMA and matrix probes; [`matrix`] and [`matrix_wgsl`] hold the last), [`measure`] (the timed
//! runs), [`timing`] (their clocks), [`noise`] (why a point is noisy), [`progress`] (stderr),
//! [`report`] (stdout), [`csv`] (the CSV, both ways), [`plot`] (the SVG).

mod args;
mod csv;
mod matrix;
mod matrix_wgsl;
mod measure;
mod noise;
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

use args::{Args, parse_args};
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
    let args = parse_args().unwrap_or_else(|e| fail(2, format!("{e}\n{}", args::usage())));
    if let Some(csv) = &args.replot {
        let (points, title) =
            csv::read_points(csv).unwrap_or_else(|e| fail(1, format!("cannot replot {csv}: {e}")));
        plot::save(args.plot_path(), &points, &title);
        eprintln!("wrote {}", shown(args.plot_path()));
        return;
    }
    let ctx = GpuContext::new()
        .unwrap_or_else(|e| fail(1, e))
        .with_shader_checks(args.shader_checks);
    // Where the chunk kernels' products run (KVQ_MATRIX=on or off overrides the tuning table).
    match ctx.matrix_units() {
        Some(m) => eprintln!("matrix units: {m:?} (the prefill kernel of Fast caches)"),
        None => eprintln!("matrix units: none"),
    }
    let wait = args.wait_on(&ctx);
    let plan = Plan::new(&args, &ctx).unwrap_or_else(|e| fail(2, e));
    let started = Instant::now();
    let peaks = probe::peaks(&ctx, &args.matrix, args.matrix_dump.as_deref());
    if args.probes_only {
        return;
    }
    let rows = run_points(&ctx, &plan, &args);
    let derived = report::derive(&rows, &peaks, ctx.is_cpu());
    report::print(&rows, &derived, &peaks, wait);
    let text = csv::text(&rows, &derived, plan.model.name, &peaks, wait);
    write_file(&args.csv, text.as_bytes());
    let m = plan.model;
    let title = plot_title(m.name, m.layers, &ctx.info.name);
    let points: Vec<Point> = rows
        .iter()
        .map(|r| Point {
            name: r.codec.clone(),
            queries: r.queries,
            ctx: r.ctx,
            mem_bytes: r.mem.total(),
            step_ms: r.step_ms,
        })
        .collect();
    plot::save(args.plot_path(), &points, &title);
    println!(
        "\n{} points in {:.0} s. Wrote {} (every column, one row per cache and context) and {} (step time against memory, each cache against none).",
        rows.len(),
        started.elapsed().as_secs_f64(),
        shown(&args.csv),
        shown(args.plot_path())
    );
}

/// Writes `bytes` to `path`, its folder created if missing; a failure ends the sweep (exit 1).
fn write_file(path: &str, bytes: &[u8]) {
    let path_ref = std::path::Path::new(path);
    let result = match path_ref.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::create_dir_all(dir),
        _ => Ok(()),
    }
    .and_then(|()| std::fs::File::create(path_ref))
    .and_then(|mut f| f.write_all(bytes));
    if let Err(e) = result {
        fail(1, format!("cannot write {path}: {e}"));
    }
}

/// `path` as the user can find it: absolute where the file exists.
fn shown(path: &str) -> String {
    std::fs::canonicalize(path)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.to_string())
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
                for entry in &plan.codecs {
                    let run = run_point(ctx, plan, args, &progress, entry, c, n);
                    done += 1;
                    if let Some(r) = run {
                        progress.line(format!(
                            "[{done}/{total}] round {round}/{}: {} ctx {c}: {:.3} ms/step, {} on the device",
                            args.rounds,
                            measure::label(&entry.name, n),
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
    entry: &plan::Entry,
    c: u32,
    n: u32,
) -> Option<Row> {
    let label = measure::label(&entry.name, n);
    let t = Instant::now();
    let result = match plan.over_budget(entry.codecs, c, n, args) {
        Some(why) => Err(Skip::Skipped(why)),
        None => PointRun {
            ctx,
            model: plan.model,
            args,
            steps: plan.steps,
            progress,
            name: &entry.name,
            codecs: entry.codecs,
            exact: entry.exact,
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
