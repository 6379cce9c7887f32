//! The SVG plot: what each cache costs in step time and saves in memory against `none`. One
//! point per cache and context: the cache's device memory across (log scale), its step time
//! over `none`'s at the same context up (1 = as fast as f16; below is faster). Drawn from a
//! sweep's rows or from a sweep CSV read back (`--replot`).

use plotters::coord::Shift;
use plotters::prelude::*;

/// One measured point of the plot.
pub struct Point {
    /// The cache's name as the sweep was asked for it (`turbo3_sym+exact`).
    pub name: String,
    /// New tokens per sequence a step (1: a decode step; more: a chunk, its own series).
    pub queries: u32,
    pub ctx: u32,
    /// The cache's device memory (`KvCache::memory().total()`).
    pub mem_bytes: u64,
    pub step_ms: f64,
}

/// The plot's title; `source` is the device (a sweep) or `from FILE.csv` (a replot).
pub fn plot_title(model: &str, layers: impl std::fmt::Display, source: &str) -> String {
    format!("{model} ({layers} layers), {source}")
}

/// Plots to `path` (its folder created if missing); a plot that cannot be drawn ends the
/// sweep (exit 1).
pub fn save(path: &str, points: &[Point], title: &str) {
    if let Some(dir) = std::path::Path::new(path).parent() {
        if !dir.as_os_str().is_empty() {
            if let Err(e) = std::fs::create_dir_all(dir) {
                crate::fail(1, format!("cannot create {}: {e}", dir.display()));
            }
        }
    }
    if let Err(e) = plot(path, points, title) {
        crate::fail(1, format!("cannot plot to {path}: {e}"));
    }
}

/// Context lengths as `1k`, `32k`, `128k` (exact thousands of 1024), else the number.
fn fmt_ctx(c: u32) -> String {
    if c >= 1024 && c.is_multiple_of(1024) {
        format!("{}k", c / 1024)
    } else {
        c.to_string()
    }
}

/// Memory in MiB as an axis label: no more digits than it needs.
fn fmt_mib(m: f64) -> String {
    if m >= 10.0 {
        format!("{m:.0}")
    } else if m >= 1.0 {
        format!("{m:.1}")
    } else {
        format!("{m:.2}")
    }
}

/// Ticks at 1, 2 and 5 times each power of ten in `lo..=hi` (a log axis alone labels only the
/// powers of ten, often just one or two).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    for e in (lo.log10().floor() as i32)..=(hi.log10().ceil() as i32) {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(e);
            if (lo..=hi).contains(&v) {
                ticks.push(v);
            }
        }
    }
    ticks
}

/// One colour per K codec (none, q8, turbo3, …, with exact tokens another); a K-only cache
/// takes its K codec's colour in hollow markers. Past the palette, colours come back.
const HUES: [RGBColor; 12] = [
    RGBColor(0, 0, 0),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(255, 187, 120),
];

/// How one cache's markers look: filled, or hollow where only K is quantized.
fn style(name: &str, families: &mut Vec<String>) -> ShapeStyle {
    let (family, k_only) = match crate::plan::parse_entry(name, kvq::ExactTokens::NONE) {
        Ok(e) => {
            let c = e.codecs;
            (
                format!(
                    "{}{}",
                    c.k.name(),
                    if e.exact.any() { "+exact" } else { "" }
                ),
                c.v == kvq::Codec::NONE && c.k != kvq::Codec::NONE,
            )
        }
        Err(_) => (name.to_string(), false),
    };
    let i = families
        .iter()
        .position(|f| *f == family)
        .unwrap_or_else(|| {
            families.push(family);
            families.len() - 1
        });
    let color = HUES[i % HUES.len()];
    if k_only {
        color.stroke_width(2)
    } else {
        color.filled()
    }
}

/// Marker shapes, one per context (the `i`-th context of the sweep takes shape `i % 4`), so
/// that a point's context reads without its memory: circle, square, triangle, diamond.
const SHAPES: usize = 4;

/// The marker of shape `shape` at pixel `at` of the legend panel.
fn legend_marker(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    shape: usize,
    at: (i32, i32),
    style: ShapeStyle,
) -> Result<(), Box<dyn std::error::Error>> {
    match shape % SHAPES {
        0 => area.draw(&Circle::new(at, 5, style))?,
        1 => area.draw(&(EmptyElement::at(at) + Rectangle::new([(-4, -4), (4, 4)], style)))?,
        2 => area.draw(&TriangleMarker::new(at, 6, style))?,
        _ if style.filled => area.draw(&(EmptyElement::at(at) + Polygon::new(diamond(), style)))?,
        _ => area.draw(&(EmptyElement::at(at) + PathElement::new(diamond(), style)))?,
    }
    Ok(())
}

/// The diamond marker's corners around its point, in pixels (the first again at the end, so
/// that a hollow one closes).
fn diamond() -> Vec<(i32, i32)> {
    vec![(0, -6), (5, 0), (0, 6), (-5, 0), (0, -6)]
}

/// Each point's step time over `none`'s at its context and queries; None where some point has
/// no `none` beside it (the plot then shows step times themselves).
fn ratios(points: &[Point]) -> Option<Vec<f64>> {
    points
        .iter()
        .map(|p| {
            let none = points
                .iter()
                .find(|n| n.name == "none" && n.ctx == p.ctx && n.queries == p.queries)?;
            Some(p.step_ms / none.step_ms)
        })
        .collect()
}

/// Step time over `none`'s (or step ms, without `none`) against device memory.
fn plot(path: &str, points: &[Point], title: &str) -> Result<(), Box<dyn std::error::Error>> {
    if points.is_empty() {
        return Err("no measured points to plot".into());
    }
    let ratios = ratios(points);
    let relative = ratios.is_some();
    let ys: Vec<f64> = ratios.unwrap_or_else(|| points.iter().map(|p| p.step_ms).collect());
    let mib: Vec<f64> = points
        .iter()
        .map(|p| p.mem_bytes as f64 / (1u64 << 20) as f64)
        .collect();
    let (x_lo, x_hi) = mib
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), &m| (lo.min(m), hi.max(m)));
    let (y_lo, y_hi) = ys
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), &y| (lo.min(y), hi.max(y)));
    let (y_lo, y_hi) = if relative {
        (y_lo.min(1.0), y_hi.max(1.0))
    } else {
        (y_lo, y_hi)
    };
    let pad = ((y_hi - y_lo) * 0.08).max(0.02 * y_hi);
    let (x0, x1, y0, y1) = (x_lo / 1.4, x_hi * 1.4, (y_lo - pad).max(0.0), y_hi + pad);
    if !(x0 > 0.0 && x1.is_finite() && y1.is_finite() && y1 > y0) {
        return Err("memory or step time out of the axes' range".into());
    }
    let mut ctxs: Vec<u32> = points.iter().map(|p| p.ctx).collect();
    ctxs.sort_unstable();
    ctxs.dedup();
    let ctx_index = |c: u32| ctxs.iter().position(|&x| x == c).unwrap_or(0);

    let root = SVGBackend::new(path, (1120, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title_area, body) = root.split_vertically(86);
    let heading = if relative {
        "kvq: what each cache costs in step time and saves in memory against none"
    } else {
        "kvq: decode step time against cache memory"
    };
    title_area.draw(&Text::new(heading, (16, 8), ("sans-serif", 22).into_font()))?;
    title_area.draw(&Text::new(title, (16, 38), ("sans-serif", 16).into_font()))?;
    if relative {
        title_area.draw(&Text::new(
            "Below the dashed line a cache is faster than none at the same context; left of none's point it takes less memory.",
            (16, 62),
            ("sans-serif", 14).into_font().color(&BLACK.mix(0.7)),
        ))?;
    }
    let (plot_area, legend_area) = body.split_horizontally(830);
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (x0..x1).log_scale().with_key_points(log_ticks(x0, x1)),
            y0..y1,
        )?;
    chart
        .configure_mesh()
        .x_desc("cache memory on the device (MiB, log scale)")
        .y_desc(if relative {
            "decode step time / none's at the same context"
        } else {
            "decode step time (ms)"
        })
        .x_label_formatter(&|x| fmt_mib(*x))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.12))
        .draw()?;
    if relative {
        // The f16 cache's time: below the line a cache is faster than none.
        let gray = BLACK.mix(0.45).stroke_width(1);
        chart.draw_series(DashedLineSeries::new([(x0, 1.0), (x1, 1.0)], 6, 4, gray))?;
    }
    let names = crate::report::first_seen(points.iter().map(|p| p.name.as_str()));
    let mut families: Vec<String> = Vec::new();
    let mut legend = Vec::new();
    for name in names {
        let s = style(name, &mut families);
        let mut queries: Vec<u32> = points
            .iter()
            .filter(|p| p.name == name)
            .map(|p| p.queries)
            .collect();
        queries.sort_unstable();
        queries.dedup();
        for q in queries {
            let mut series: Vec<(u32, f64, f64)> = points
                .iter()
                .zip(mib.iter().zip(&ys))
                .filter(|(p, _)| p.name == name && p.queries == q)
                .map(|(p, (&m, &y))| (p.ctx, m, y))
                .collect();
            series.sort_by_key(|s| s.0);
            let shaped = |k: usize| {
                series
                    .iter()
                    .filter(move |&&(c, _, _)| ctx_index(c) % SHAPES == k)
                    .map(|&(_, m, y)| (m, y))
            };
            let st = s;
            chart.draw_series(shaped(0).map(|p| Circle::new(p, 5, st)))?;
            chart.draw_series(
                shaped(1).map(|p| EmptyElement::at(p) + Rectangle::new([(-4, -4), (4, 4)], st)),
            )?;
            chart.draw_series(shaped(2).map(|p| TriangleMarker::new(p, 6, st)))?;
            if st.filled {
                chart.draw_series(
                    shaped(3).map(|p| EmptyElement::at(p) + Polygon::new(diamond(), st)),
                )?;
            } else {
                chart.draw_series(
                    shaped(3).map(|p| EmptyElement::at(p) + PathElement::new(diamond(), st)),
                )?;
            }
            if name == "none" {
                // Each context's name above its f16 point: the memory every other point of
                // that context is compared with.
                chart.draw_series(series.iter().map(|&(c, m, y)| {
                    EmptyElement::at((m, y))
                        + Text::new(
                            format!("{} tokens", fmt_ctx(c)),
                            (-24, -24),
                            ("sans-serif", 14).into_font(),
                        )
                }))?;
            }
            legend.push((crate::measure::label(name, q), s));
        }
    }
    draw_legend(&legend_area, &legend, &ctxs)?;
    root.present()?;
    Ok(())
}

/// The legend in its own panel, so it never covers a point: a marker per cache, then the
/// context of each marker shape.
fn draw_legend(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    legend: &[(String, ShapeStyle)],
    ctxs: &[u32],
) -> Result<(), Box<dyn std::error::Error>> {
    let font = ("sans-serif", 15).into_font();
    area.draw(&Text::new("cache (hollow: K only)", (8, 18), font.clone()))?;
    let step = (400 / legend.len().max(1) as i32).clamp(12, 24);
    let mut y = 46;
    for (name, s) in legend {
        area.draw(&Circle::new((23, y), 5, *s))?;
        area.draw(&Text::new(name.clone(), (46, y - 10), font.clone()))?;
        y += step;
    }
    y += 16;
    area.draw(&Text::new("context (marker)", (8, y - 10), font.clone()))?;
    y += 22;
    let gray = BLACK.mix(0.6).filled();
    for (i, &c) in ctxs.iter().enumerate() {
        legend_marker(area, i, (23, y), gray)?;
        area.draw(&Text::new(
            format!("{} tokens", fmt_ctx(c)),
            (46, y - 10),
            font.clone(),
        ))?;
        y += 24;
    }
    Ok(())
}
