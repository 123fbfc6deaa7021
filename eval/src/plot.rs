//! Loss-curve PNG of several arms of runs (plotters, bitmap backend): smoothed curves, each arm's
//! mean over its runs, a panel of arm − control, integer step ticks.
//!
//! Text is drawn with DejaVu Sans Mono embedded in the binary (`eval/assets/`, Bitstream Vera
//! licence, `eval/assets/DejaVu-LICENSE.txt`) through plotters' `ab_glyph` feature, so rendering
//! needs no system fonts or fontconfig.

use crate::compare::Arm;
use crate::error::{Error, Result};
use crate::runs::Run;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::Path;
use std::sync::OnceLock;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSansMono.ttf");
const FAMILY: &str = "sans-serif";

/// Line colours, control first.
const COLORS: [RGBColor; 6] = [
    RGBColor(0, 0, 0),
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
];

fn register_font() -> Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(
            "embedded font DejaVuSansMono.ttf did not parse".into(),
        ))
    }
}

/// A step-indexed curve.
pub type Curve = Vec<(u64, f64)>;

/// Trailing moving average over `window` points (finite points only).
pub fn smooth(points: &[(u64, f64)], window: usize) -> Curve {
    let pts: Vec<(u64, f64)> = points.iter().copied().filter(|p| p.1.is_finite()).collect();
    let w = window.max(1);
    let mut sum = 0.0;
    pts.iter()
        .enumerate()
        .map(|(i, &(step, y))| {
            sum += y;
            if i >= w {
                sum -= pts[i - w].1;
            }
            (step, sum / (i + 1).min(w) as f64)
        })
        .collect()
}

/// The smoothing window of a curve of `n` points: 4% of them (at least 1).
pub fn window(n: usize) -> usize {
    (n / 25).max(1)
}

/// Mean of several runs' curves at the steps every one of them logged.
pub fn mean_curve(curves: &[Curve]) -> Curve {
    let Some(first) = curves.first() else {
        return Vec::new();
    };
    let maps: Vec<std::collections::BTreeMap<u64, f64>> =
        curves.iter().map(|c| c.iter().copied().collect()).collect();
    first
        .iter()
        .filter_map(|&(step, _)| {
            let ys: Option<Vec<f64>> = maps.iter().map(|m| m.get(&step).copied()).collect();
            ys.map(|ys| (step, ys.iter().sum::<f64>() / ys.len() as f64))
        })
        .collect()
}

/// `b - a` at the steps both curves have.
pub fn difference(a: &[(u64, f64)], b: &[(u64, f64)]) -> Curve {
    let am: std::collections::BTreeMap<u64, f64> = a.iter().copied().collect();
    b.iter()
        .filter_map(|&(s, y)| am.get(&s).map(|x| (s, y - x)))
        .collect()
}

/// Per arm: each run's smoothed curve and the arm's mean of them.
pub fn arm_curves(arms: &[Arm]) -> Vec<(Vec<Curve>, Curve)> {
    arms.iter()
        .map(|a| {
            let runs: Vec<Curve> = a
                .runs
                .iter()
                .map(|r| smooth(&r.losses, window(r.losses.len())))
                .collect();
            let mean = mean_curve(&runs);
            (runs, mean)
        })
        .collect()
}

/// Draws the arms' smoothed loss curves (each run thin, the arm's mean over runs thick) above a
/// panel of each arm's mean minus the control's, into a `width x height` PNG at `path`. Steps are
/// integer ticks. The loss panel's y range leaves out the first 5% of steps (initial losses near
/// ln(vocab) would flatten the rest).
pub fn loss_curves(arms: &[Arm], path: &Path, width: u32, height: u32) -> Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    draw(root, arms).map_err(|msg| Error::Plot {
        path: path.into(),
        msg,
    })
}

/// The same plot as RGB pixels (`width * height * 3` bytes), for tests.
pub fn render_rgb(arms: &[Arm], width: u32, height: u32) -> Result<Vec<u8>> {
    register_font()?;
    let mut buf = vec![0u8; width as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (width, height)).into_drawing_area();
        draw(root, arms).map_err(|msg| Error::Plot {
            path: "<memory>".into(),
            msg,
        })?;
    }
    Ok(buf)
}

fn range(ys: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (mut lo, mut hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
        (a.min(y), b.max(y))
    });
    if !lo.is_finite() || !hi.is_finite() {
        return None;
    }
    if hi - lo < 1e-6 {
        hi += 0.5;
        lo -= 0.5;
    }
    let pad = (hi - lo) * 0.05;
    Some((lo - pad, hi + pad))
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, arms: &[Arm]) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let max_step = arms
        .iter()
        .flat_map(|a| &a.runs)
        .map(Run::last_step)
        .max()
        .unwrap_or(1)
        .max(1);
    let skip = max_step / 20;
    let curves = arm_curves(arms);
    let (lo, hi) = range(
        curves
            .iter()
            .flat_map(|(runs, _)| runs.iter().flatten())
            .filter(|p| p.0 >= skip)
            .map(|p| p.1),
    )
    .ok_or("no finite loss to plot")?;
    root.fill(&WHITE).map_err(e)?;
    let diffs: Vec<Curve> = curves
        .iter()
        .skip(1)
        .map(|(_, m)| difference(&curves[0].1, m))
        .collect();
    let (top, bottom) = if diffs.is_empty() {
        (root.clone(), None)
    } else {
        let h = root.dim_in_pixel().1;
        let (t, b) = root.split_vertically(h * 2 / 3);
        (t, Some(b))
    };
    let mut chart = ChartBuilder::on(&top)
        .caption("training loss (smoothed)", (FAMILY, 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..max_step, lo..hi)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .label_style((FAMILY, 14))
        .draw()
        .map_err(e)?;
    for (i, (arm, (runs, mean))) in arms.iter().zip(&curves).enumerate() {
        let color = COLORS[i % COLORS.len()];
        if runs.len() > 1 {
            for r in runs {
                chart
                    .draw_series(LineSeries::new(
                        r.iter().copied(),
                        color.mix(0.35).stroke_width(1),
                    ))
                    .map_err(e)?;
            }
        }
        let label = match (i, arm.runs.len()) {
            (0, 1) => format!("{} (control)", arm.label),
            (0, n) => format!("{} (control, mean of {n})", arm.label),
            (_, 1) => arm.label.clone(),
            (_, n) => format!("{} (mean of {n})", arm.label),
        };
        chart
            .draw_series(LineSeries::new(mean.iter().copied(), color.stroke_width(2)))
            .map_err(e)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    if let Some(bottom) = bottom {
        let (dlo, dhi) = range(
            diffs
                .iter()
                .flatten()
                .filter(|p| p.0 >= skip)
                .map(|p| p.1)
                .chain([0.0]),
        )
        .ok_or("no finite loss difference to plot")?;
        let mut chart = ChartBuilder::on(&bottom)
            .caption(format!("minus {} (smoothed means)", arms[0].label), (FAMILY, 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0u64..max_step, dlo..dhi)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("loss difference")
            .label_style((FAMILY, 14))
            .draw()
            .map_err(e)?;
        chart
            .draw_series(LineSeries::new(
                [(0, 0.0), (max_step, 0.0)],
                BLACK.stroke_width(1),
            ))
            .map_err(e)?;
        for (i, d) in diffs.iter().enumerate() {
            let color = COLORS[(i + 1) % COLORS.len()];
            chart
                .draw_series(LineSeries::new(d.iter().copied(), color.stroke_width(2)))
                .map_err(e)?;
        }
    }
    root.present().map_err(e)?;
    Ok(())
}
