//! The sweep CSV, both ways: written from the rows, and read back by `--replot` (which finds
//! its columns by name, so older CSVs without later columns still plot).

use crate::args::Wait;
use crate::measure::Row;
use crate::plot::{Point, plot_title};
use crate::probe::Peaks;
use crate::report::{Derived, fmt_opt};

const HEADER: &str = "codec,model,ctx,layers,step_ms,gpu_ms,tok_s,gbps,bits_k,bits_v,ratio_vs_none,host_bytes_per_step,dispatches_per_step,record_ms,copy_gbps,bw_fraction,device_bytes,wall_ms,splits,wait,batch,queries,rounds,spread,noisy,attn_gflops,fma_peak_gflops,fma_fraction,kernel,precision,kernel_ms,noisy_why\n";

/// The whole CSV text: the header, then one line per row.
pub fn text(rows: &[Row], derived: &[Derived], model: &str, peaks: &Peaks, wait: Wait) -> String {
    let mut csv = String::from(HEADER);
    for (r, d) in rows.iter().zip(derived) {
        csv += &format!(
            "{},{},{},{},{:.4},{},{:.2},{:.1},{:.3},{:.3},{},{},{},{:.4},{},{},{},{:.4},{},{},{},{},{},{:.4},{},{:.1},{},{},{},{},{},{}\n",
            field(&r.codec),
            model,
            r.ctx,
            r.layers,
            r.step_ms,
            fmt_opt(r.gpu_ms, 4),
            r.tok_s(),
            d.gbps,
            r.bits_k,
            r.bits_v,
            fmt_opt(d.ratio, 4),
            r.host_bytes,
            r.dispatches,
            r.record_ms,
            fmt_opt(peaks.read.as_ref().map(|p| p.gbps), 1),
            fmt_opt(d.frac, 4),
            r.mem.total(),
            r.wall_ms,
            r.splits,
            wait.name(),
            r.batch,
            r.queries,
            r.rounds.len(),
            r.spread(),
            r.noisy(),
            d.gflops,
            fmt_opt(peaks.fma.as_ref().map(|p| p.gflops), 1),
            fmt_opt(d.fma_frac, 4),
            r.kernel,
            r.precision.name(),
            field(&r.kernel_times()),
            field(d.noisy_why.as_deref().unwrap_or(""))
        );
    }
    csv
}

/// A CSV field as the sweep writes it: quoted (`"` doubled inside) where it holds a comma or a
/// quote, as a `k=q4,v=q8` codec name does.
fn field(s: &str) -> String {
    if s.contains([',', '"']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The fields of one CSV line: commas outside double quotes separate them; `""` inside quotes
/// is a quote; fields are trimmed.
fn fields(line: &str) -> Vec<String> {
    let (mut fields, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(ch),
        }
    }
    fields.push(cur.trim().to_string());
    fields
}

/// The plot's points and title from a sweep CSV (this example's header; `batch` and
/// `queries` may be absent, as in CSVs older than them). The title names the CSV file where a
/// sweep's names the device.
pub fn read_points(csv: &str) -> Result<(Vec<Point>, String), String> {
    let text = std::fs::read_to_string(csv).map_err(|e| e.to_string())?;
    let mut lines = text.lines();
    let first = lines.next().ok_or("empty file")?;
    let header = fields(first.trim_start_matches('\u{feff}'));
    let col = |name: &str| header.iter().position(|h| h == name);
    let need = |name: &str| col(name).ok_or(format!("no '{name}' column"));
    let (codec, model, ctx, layers, step, mem) = (
        need("codec")?,
        need("model")?,
        need("ctx")?,
        need("layers")?,
        need("step_ms")?,
        need("device_bytes")?,
    );
    let queries = col("queries");
    let mut points = Vec::new();
    let mut title = String::new();
    for (i, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let n = i + 2;
        let f = fields(line);
        if f.len() != header.len() {
            return Err(format!(
                "line {n}: {} fields, the header has {}",
                f.len(),
                header.len()
            ));
        }
        let num = |c: usize| -> Result<f64, String> {
            f[c].parse::<f64>()
                .map_err(|_| format!("line {n}: '{}' is not a number", f[c]))
        };
        let (step_ms, ctx, mem) = (num(step)?, num(ctx)?, num(mem)?);
        let q = queries.map_or(Ok(1.0), num)?;
        if !(step_ms > 0.0 && step_ms.is_finite() && mem > 0.0 && q >= 1.0) {
            return Err(format!(
                "line {n}: step_ms, device_bytes or queries out of range"
            ));
        }
        if !(1.0..=u32::MAX as f64).contains(&ctx) || ctx.fract() != 0.0 {
            return Err(format!("line {n}: ctx is not a token count"));
        }
        if title.is_empty() {
            let file = std::path::Path::new(csv)
                .file_name()
                .map_or(csv.into(), |n| n.to_string_lossy());
            title = plot_title(&f[model], &f[layers], &format!("from {file}"));
        }
        points.push(Point {
            name: f[codec].clone(),
            queries: q as u32,
            ctx: ctx as u32,
            mem_bytes: mem as u64,
            step_ms,
        });
    }
    Ok((points, title))
}
