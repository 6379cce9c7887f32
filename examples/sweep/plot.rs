//! The SVG plot: attention tokens/s against context, one line per codec, from a sweep's rows
//! or from a sweep CSV read back (`--replot`).

use plotters::coord::Shift;
use plotters::prelude::*;

/// One point of the plot.
pub struct Point {
    pub codec: String,
    pub ctx: u32,
    /// Attention tokens/s: one per sequence per step.
    pub tok_s: f64,
}

/// The plot's title; `source` is the device (a sweep) or `from FILE.csv` (a replot).
pub fn plot_title(model: &str, layers: impl std::fmt::Display, source: &str) -> String {
    format!("kvq decode attention: {model} ({layers} layers), {source}")
}

/// Plots to `path` and says so on stderr; a plot that cannot be drawn ends the sweep (exit 1).
pub fn save(path: &str, points: &[Point], title: &str) {
    match plot(path, points, title) {
        Ok(()) => eprintln!("wrote {path}"),
        Err(e) => crate::fail(1, format!("cannot plot to {path}: {e}")),
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

/// Ticks at 1, 2 and 5 times each power of ten in `y0..=y1` (a log axis alone labels only the
/// powers of ten, often just one or two).
fn y_ticks(y0: f64, y1: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    for e in (y0.log10().floor() as i32)..=(y1.log10().ceil() as i32) {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(e);
            if (y0..=y1).contains(&v) {
                ticks.push(v);
            }
        }
    }
    ticks
}

/// One colour per K codec (none, q8, turbo3, …); solid where V is quantized too, dashed
/// where only K is. Past the palette, colours come back with hollow markers.
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

/// How one codec's line looks.
struct Style {
    line: ShapeStyle,
    marker: ShapeStyle,
    k_only: bool,
}

/// `name`'s style; `families` holds the K codecs given a colour so far (a new one is added).
fn style(name: &str, families: &mut Vec<String>) -> Style {
    let (family, k_only) = match kvq::KvCodecs::parse(name) {
        Ok(c) => (
            c.k.name(),
            c.v == kvq::Codec::NONE && c.k != kvq::Codec::NONE,
        ),
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
    let line = color.stroke_width(2);
    let marker = if i < HUES.len() { color.filled() } else { line };
    Style {
        line,
        marker,
        k_only,
    }
}

/// Attention tokens/s against context, one line per codec, log-scale axes.
fn plot(path: &str, points: &[Point], title: &str) -> Result<(), Box<dyn std::error::Error>> {
    let codecs = crate::report::first_seen(points.iter().map(|p| p.codec.as_str()));
    let mut ctxs: Vec<u32> = points.iter().map(|p| p.ctx).collect();
    ctxs.sort_unstable();
    ctxs.dedup();
    let (Some(&c0), Some(&c1)) = (ctxs.first(), ctxs.last()) else {
        return Err("no measured points to plot".into());
    };
    let (lo, hi) = points
        .iter()
        .map(|p| p.tok_s)
        .fold((f64::MAX, 0f64), |(lo, hi), t| (lo.min(t), hi.max(t)));
    let (y0, y1) = (lo / 1.5, hi * 1.5);
    if !(y0 > 0.0 && y1.is_finite()) {
        return Err("tokens/s out of a log axis's range".into());
    }
    let root = SVGBackend::new(path, (1120, 660)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title_area, body) = root.split_vertically(44);
    title_area.titled(title, ("sans-serif", 22))?;
    let (plot_area, legend_area) = body.split_horizontally(850);
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (c0 as f64 / 1.3..c1 as f64 * 1.3)
                .log_scale()
                .with_key_points(ctxs.iter().map(|&c| c as f64).collect()),
            (y0..y1).log_scale().with_key_points(y_ticks(y0, y1)),
        )?;
    chart
        .configure_mesh()
        .x_desc("context (tokens, log scale)")
        .y_desc("attention tokens/s (decode steps/s, log scale)")
        .x_label_formatter(&|x| fmt_ctx(x.round() as u32))
        .y_label_formatter(&|y| {
            if *y >= 1.0 {
                format!("{y:.0}")
            } else {
                format!("{y:.2}")
            }
        })
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.12))
        .draw()?;
    let mut families: Vec<String> = Vec::new();
    let mut legend = Vec::new();
    for name in codecs {
        let s = style(name, &mut families);
        let mut pts: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.codec == name)
            .map(|p| (p.ctx as f64, p.tok_s))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        if s.k_only {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 7, 5, s.line))?;
        } else {
            chart.draw_series(LineSeries::new(pts.clone(), s.line))?;
        }
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, s.marker)))?;
        legend.push((name, s));
    }
    draw_legend(&legend_area, &legend)?;
    root.present()?;
    Ok(())
}

/// The legend in its own panel, so it never covers a line.
fn draw_legend(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    legend: &[(&str, Style)],
) -> Result<(), Box<dyn std::error::Error>> {
    let font = ("sans-serif", 15).into_font();
    area.draw(&Text::new("codec (dashed: K only)", (8, 18), font.clone()))?;
    let step = (560 / legend.len().max(1) as i32).clamp(12, 24);
    for (j, (name, s)) in legend.iter().enumerate() {
        let y = 46 + j as i32 * step;
        if s.k_only {
            for x in [8, 22] {
                area.draw(&PathElement::new(vec![(x, y), (x + 9, y)], s.line))?;
            }
        } else {
            area.draw(&PathElement::new(vec![(8, y), (38, y)], s.line))?;
        }
        area.draw(&Circle::new((23, y), 4, s.marker))?;
        area.draw(&Text::new(name.to_string(), (46, y - 10), font.clone()))?;
    }
    Ok(())
}
