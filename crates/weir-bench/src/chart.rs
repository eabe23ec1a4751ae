//! PNG charts in the seeds' style: one line per target (or per series), the steps on
//! the x axis in order, axes labelled, a title and a legend.
//!
//! Text is drawn with plotters' `ab_glyph` backend from a TrueType file we load
//! ourselves (DejaVu Sans from Debian's `fonts-dejavu-core` by default, or `--font`),
//! so rendering needs no fontconfig and no font lookup that a fresh machine may lack.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::report::{Cell, Report};

/// Where we look for a font when `--font` is not given (Debian, then other layouts).
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

static FONT: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// Loads and registers the chart font once; errors say which package provides one.
pub fn init_font(explicit: Option<&Path>) -> Result<PathBuf> {
    let loaded = FONT.get_or_init(|| load_font(explicit).map_err(|e| format!("{e:#}")));
    loaded.clone().map_err(|e| anyhow!(e))
}

fn load_font(explicit: Option<&Path>) -> Result<PathBuf> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => FONT_CANDIDATES
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or_else(|| {
                anyhow!(
                    "no TrueType font found for the charts (looked for {}); install Debian's fonts-dejavu-core or pass --font FILE.ttf",
                    FONT_CANDIDATES.join(", ")
                )
            })?,
    };
    let bytes = std::fs::read(&path).with_context(|| format!("reading font {}", path.display()))?;
    // plotters keeps fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    for style in [
        FontStyle::Normal,
        FontStyle::Bold,
        FontStyle::Italic,
        FontStyle::Oblique,
    ] {
        plotters::style::register_font("sans-serif", style, bytes)
            .map_err(|_| anyhow!("{} is not a usable TrueType font", path.display()))?;
    }
    Ok(path)
}

/// What to plot from a report.
#[derive(Clone, Copy)]
pub struct ChartSpec<'a> {
    /// File stem in the output directory.
    pub file: &'a str,
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Column naming the step (its values label the x axis, in order of appearance).
    pub x_key: &'a str,
    /// Column plotted on the y axis.
    pub y_key: &'a str,
    /// Divide y values by this (e.g. 1048576 for MiB).
    pub y_div: f64,
    /// Column whose value names the line a row belongs to.
    pub series_key: &'a str,
    /// Log-scale y axis (for values spanning orders of magnitude).
    pub log_y: bool,
}

const COLORS: [RGBColor; 6] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

/// A number as a short label: 1.5k, 2.3M.
pub fn human(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn label_of(cell: Option<&Cell>) -> String {
    match cell {
        Some(Cell::Int(v)) if *v < 10_000 => v.to_string(),
        Some(Cell::Int(v)) => human(*v as f64),
        Some(Cell::Float(v, _)) => human(*v),
        Some(Cell::Text(s)) => s.clone(),
        _ => "-".to_string(),
    }
}

/// Draws the chart into `DIR/FILE.png` and returns the path.
/// A chart's points: its x labels, and each series with its points (x is the step's
/// index, y scaled by `y_div`, as log10 when `log_y`).
type Points = (Vec<String>, Vec<(String, Vec<(f64, f64)>)>);

fn points(report: &Report, spec: &ChartSpec) -> Result<Points> {
    let mut labels: Vec<String> = Vec::new();
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for row in &report.rows {
        let Some(y) = row.get(spec.y_key).and_then(Cell::as_f64) else {
            continue;
        };
        let label = label_of(row.get(spec.x_key));
        let name = label_of(row.get(spec.series_key));
        let idx = match series.iter().position(|(n, _)| *n == name) {
            Some(i) => i,
            None => {
                series.push((name, Vec::new()));
                series.len() - 1
            }
        };
        // Every series runs the same steps in the same order (packing-unpacking
        // repeats values on its way down), so a point's x is its index in its series.
        let x = series[idx].1.len();
        if x == labels.len() {
            labels.push(label);
        }
        let y = y / spec.y_div;
        let y = if spec.log_y { y.max(1e-3).log10() } else { y };
        series[idx].1.push((x as f64, y));
    }
    if series.is_empty() {
        bail!("nothing to plot for {}", spec.file);
    }
    Ok((labels, series))
}

/// The y axis: from 0 (or the lowest decade, on a log scale) to a little above the top.
fn y_range(series: &[(String, Vec<(f64, f64)>)], log_y: bool) -> (f64, f64) {
    let ys = series.iter().flat_map(|(_, p)| p.iter().map(|(_, y)| *y));
    let (y_min, y_max) = ys.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    if log_y {
        (y_min.floor(), (y_max.ceil()).max(y_min.floor() + 1.0))
    } else {
        (0.0, if y_max > 0.0 { y_max * 1.12 } else { 1.0 })
    }
}

/// The label of a step on the x axis (none between steps).
fn x_label(labels: &[String], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() < 0.01 && i >= 0.0 && (i as usize) < labels.len() {
        labels[i as usize].clone()
    } else {
        String::new()
    }
}

pub fn draw(report: &Report, spec: &ChartSpec, dir: &Path, font: Option<&Path>) -> Result<PathBuf> {
    init_font(font)?;
    let (labels, series) = points(report, spec)?;
    let path = dir.join(format!("{}.png", spec.file));
    let (y_lo, y_hi) = y_range(&series, spec.log_y);
    let n = labels.len().max(1);
    let x_range = -0.3f64..(n as f64 - 0.7);
    let draw_err = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", path.display());
    {
        let root = BitMapBackend::new(&path, (960, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(spec.title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(56)
            .y_label_area_size(84)
            .build_cartesian_2d(x_range, y_lo..y_hi)
            .map_err(|e| draw_err(&e))?;
        let x_fmt = |x: &f64| x_label(&labels, *x);
        let log_y = spec.log_y;
        let y_fmt = move |y: &f64| human(if log_y { 10f64.powf(*y) } else { *y });
        chart
            .configure_mesh()
            // Only the bold grid: the fine one adds clutter and triples the PNG size.
            .light_line_style(TRANSPARENT)
            .x_desc(spec.x_label)
            .y_desc(spec.y_label)
            .x_labels(n.min(40))
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .axis_desc_style(("sans-serif", 17))
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| draw_err(&e))?;
        for (i, (name, points)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|e| draw_err(&e))?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2))
                });
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| draw_err(&e))?;
        }
        chart
            .configure_series_labels()
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| draw_err(&e))?;
        root.present().map_err(|e| draw_err(&e))?;
    }
    Ok(path)
}
