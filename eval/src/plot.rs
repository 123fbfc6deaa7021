//! Loss-curve PNG of several runs (plotters, bitmap backend).
//!
//! Text is drawn with DejaVu Sans Mono embedded in the binary (`eval/assets/`, Bitstream Vera
//! licence, `eval/assets/DejaVu-LICENSE.txt`) through plotters' `ab_glyph` feature, so rendering
//! needs no system fonts or fontconfig.

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

/// Draws every run's `(step, loss)` curve into a `width x height` PNG at `path`. The y range
/// leaves out the first 5% of steps (initial losses near ln(vocab) would flatten the rest).
pub fn loss_curves(runs: &[Run], path: &Path, width: u32, height: u32) -> Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    draw(root, runs).map_err(|msg| Error::Plot {
        path: path.into(),
        msg,
    })
}

/// The same plot as RGB pixels (`width * height * 3` bytes), for tests.
pub fn render_rgb(runs: &[Run], width: u32, height: u32) -> Result<Vec<u8>> {
    register_font()?;
    let mut buf = vec![0u8; width as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (width, height)).into_drawing_area();
        draw(root, runs).map_err(|msg| Error::Plot {
            path: "<memory>".into(),
            msg,
        })?;
    }
    Ok(buf)
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, runs: &[Run]) -> std::result::Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let max_step = runs.iter().map(Run::last_step).max().unwrap_or(1).max(1);
    let skip = max_step / 20;
    let ys: Vec<f64> = runs
        .iter()
        .flat_map(|r| {
            r.losses
                .iter()
                .filter(|l| l.0 >= skip && l.1.is_finite())
                .map(|l| l.1)
        })
        .collect();
    let (mut lo, mut hi) = ys.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &y| {
        (a.min(y), b.max(y))
    });
    if !lo.is_finite() || !hi.is_finite() {
        return Err("no finite loss to plot".into());
    }
    if hi - lo < 1e-6 {
        hi += 0.5;
        lo -= 0.5;
    }
    let pad = (hi - lo) * 0.05;
    root.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("training loss", (FAMILY, 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..max_step as f64, (lo - pad)..(hi + pad))
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .label_style((FAMILY, 14))
        .draw()
        .map_err(e)?;
    for (i, run) in runs.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let label = if i == 0 {
            format!("{} (control)", run.label)
        } else {
            run.label.clone()
        };
        chart
            .draw_series(LineSeries::new(
                run.losses
                    .iter()
                    .filter(|l| l.1.is_finite())
                    .map(|&(s, l)| (s as f64, l)),
                color.stroke_width(2),
            ))
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
    root.present().map_err(e)?;
    Ok(())
}
