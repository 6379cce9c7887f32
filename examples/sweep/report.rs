//! The results on stdout: the table, the notes on what its columns mean, and each codec's
//! device memory by part.

use kvq::memory::fmt_bytes;

use crate::args::Wait;
use crate::measure::{NOISY_SPREAD, Row};
use crate::probe::Peaks;
use crate::timing::gbps;

/// A row's values that depend on other rows or on the peak: computed once for the table and
/// the CSV, which must agree.
pub struct Derived {
    /// K/V bytes a step must read over its GPU time (host time where untimed).
    pub gbps: f64,
    /// step_ms over `none`'s at the same context and queries.
    pub ratio: Option<f64>,
    /// The cache's device memory over `none`'s at the same context and queries.
    pub mem_ratio: Option<f64>,
    /// Why the point's rounds disagree, where they do ([`Row::noisy`]).
    pub noisy_why: Option<String>,
    /// `gbps` over the peak.
    pub frac: Option<f64>,
    /// Attention GFLOP/s over the GPU time (host time where untimed).
    pub gflops: f64,
    /// `gflops` over the FP32 multiply-add peak.
    pub fma_frac: Option<f64>,
}

/// Each row's [`Derived`]; `cpu_adapter`: the device runs on the host's cores.
pub fn derive(rows: &[Row], peaks: &Peaks, cpu_adapter: bool) -> Vec<Derived> {
    let none = |c: u32, n: u32| {
        rows.iter()
            .find(|r| r.codec == "none" && r.ctx == c && r.queries == n)
    };
    rows.iter()
        .map(|r| {
            let t = r.gpu_ms.unwrap_or(r.step_ms);
            let gbps = gbps(r.bytes, t);
            let gflops = r.flop / (t * 1e-3) / 1e9;
            Derived {
                gbps,
                ratio: none(r.ctx, r.queries).map(|n| r.step_ms / n.step_ms),
                mem_ratio: none(r.ctx, r.queries)
                    .map(|n| r.mem.total() as f64 / n.mem.total() as f64),
                noisy_why: r.noisy().then(|| crate::noise::why(r, cpu_adapter)),
                frac: peaks.read.as_ref().map(|p| gbps / p.gbps),
                gflops,
                fma_frac: peaks.fma.as_ref().map(|p| gflops / p.gflops),
            }
        })
        .collect()
}

/// `v` to `p` decimals, `-` where there is none (untimed, no baseline, no peak).
pub fn fmt_opt(v: Option<f64>, p: usize) -> String {
    v.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "-".into())
}

/// Distinct names in the order they first come (the plot's legend, the memory lines).
pub fn first_seen<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen: Vec<&str> = Vec::new();
    for n in names {
        if !seen.contains(&n) {
            seen.push(n);
        }
    }
    seen
}

/// Prints the table, its notes and the memory by part.
pub fn print(rows: &[Row], derived: &[Derived], peaks: &Peaks, wait: Wait) {
    print_table(rows, derived);
    println!(
        "step_ms: host clock around submit + wait ({}), the step recorded beforehand; record_ms: the recording",
        wait.name()
    );
    // (A point that failed in a round merges the rounds it has: the CSV's `rounds` column.)
    let rounds = rows.iter().map(|r| r.rounds.len()).max().unwrap_or(1);
    let noisy = rows.iter().filter(|r| r.noisy()).count();
    println!(
        "timings: the median of {rounds} interleaved rounds' medians; spread: (max - min) / median of the rounds' {} ms, '!' past {:.0} % ({noisy} of {} points)",
        if rows.iter().any(|r| r.gpu_ms.is_some()) {
            "GPU"
        } else {
            "step"
        },
        100.0 * NOISY_SPREAD,
        rows.len()
    );
    if let Some(p) = &peaks.read {
        println!(
            "GB/s: K/V bytes a step must read over its GPU time (host time where untimed); %peak: that over {:.1} GB/s, the adapter's streaming read bandwidth ({})",
            p.gbps, p.how
        );
    }
    if let Some(p) = &peaks.fma {
        println!(
            "GFLOP/s: attention FLOP a step (QK and PV, 4 FLOP per query row, key and dimension) over its GPU time; %fma: that over {:.0} GFLOP/s, the adapter's FP32 multiply-add rate ({})",
            p.gflops, p.how
        );
    }
    let noisy: Vec<String> = rows
        .iter()
        .zip(derived)
        .filter_map(|(r, d)| {
            let why = d.noisy_why.as_ref()?;
            Some(format!(
                "  {} ctx {}: spread {:.0} %: {why}",
                r.label(),
                r.ctx,
                100.0 * r.spread()
            ))
        })
        .collect();
    if !noisy.is_empty() {
        println!("noisy points ('!'), each with the likeliest reason:");
        for line in noisy {
            println!("{line}");
        }
    }
    print_memory(rows);
    print_against_none(rows, derived);
}

/// What each cache costs and saves against `none` at the same context: the question the
/// plot answers.
fn print_against_none(rows: &[Row], derived: &[Derived]) {
    let lines: Vec<String> = rows
        .iter()
        .zip(derived)
        .filter(|(r, _)| r.codec != "none")
        .filter_map(|(r, d)| {
            let none = rows
                .iter()
                .find(|n| n.codec == "none" && n.ctx == r.ctx && n.queries == r.queries)?;
            Some(format!(
                "{:<22} ctx {:>7}: {:.2}x the step time, {:.2}x the memory ({} against {}){}",
                r.label(),
                r.ctx,
                d.ratio?,
                d.mem_ratio?,
                fmt_bytes(r.mem.total()),
                fmt_bytes(none.mem.total()),
                if r.noisy() || none.noisy() {
                    ", time noisy ('!')"
                } else {
                    ""
                }
            ))
        })
        .collect();
    if !lines.is_empty() {
        println!("\nagainst none at the same context (step time, device memory):");
        for l in lines {
            println!("{l}");
        }
    }
}
fn print_table(rows: &[Row], derived: &[Derived]) {
    println!(
        "\n{:<22} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>8} {:>5} {:>7} {:>7} {:>5} {:>5} {:>6} {:>5} {:>10}",
        "codec",
        "ctx",
        "step_ms",
        "record_ms",
        "gpu_ms",
        "tok/s",
        "GB/s",
        "%peak",
        "GFLOP/s",
        "%fma",
        "vs_none",
        "spread",
        "bitsK",
        "bitsV",
        "host_B",
        "disp",
        "device_mem"
    );
    for (r, d) in rows.iter().zip(derived) {
        println!(
            "{:<22} {:>7} {:>9.3} {:>9.3} {:>9} {:>9.1} {:>8.1} {:>6} {:>8.0} {:>5} {:>7} {:>7} {:>5.2} {:>5.2} {:>6.0} {:>5.0} {:>10}",
            r.label(),
            r.ctx,
            r.step_ms,
            r.record_ms,
            fmt_opt(r.gpu_ms, 3),
            r.tok_s(),
            d.gbps,
            fmt_opt(d.frac.map(|f| 100.0 * f), 1),
            d.gflops,
            fmt_opt(d.fma_frac.map(|f| 100.0 * f), 1),
            fmt_opt(d.ratio, 3),
            format!(
                "{:.1}%{}",
                100.0 * r.spread(),
                if r.noisy() { "!" } else { "" }
            ),
            r.bits_k,
            r.bits_v,
            r.host_bytes,
            r.dispatches,
            fmt_bytes(r.mem.total())
        );
    }
}

/// Device memory by part: one line per codec, at the largest context it ran, in the order
/// the codecs last ran.
fn print_memory(rows: &[Row]) {
    println!("\ndevice memory by part (largest context run):");
    let last_first = first_seen(rows.iter().rev().map(|r| r.codec.as_str()));
    for name in last_first.iter().rev() {
        if let Some(r) = rows
            .iter()
            .filter(|r| r.codec == *name)
            .max_by_key(|r| r.ctx)
        {
            println!("{:<22} ctx {:>7}: {}", r.codec, r.ctx, r.mem);
        }
    }
}
