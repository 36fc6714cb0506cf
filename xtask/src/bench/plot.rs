//! SVG charts of benchmark results, drawn with `plotters`' SVG backend: text stays text (no font
//! file to find, no pixels to encode), and the backend adds no feature to any crate Burn compiles.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

/// A named series of (x, y) points; `None` where the system has no value at that x (for
/// `bench schedule`, no configuration meeting that latency bound), drawn as a gap.
pub type Series = (String, Vec<(f64, Option<f64>)>);

/// One chart.
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
}

/// A chart's axes: their titles, and whether x is logarithmic.
pub struct Axes {
    pub x: &'static str,
    pub y: &'static str,
    pub log_x: bool,
}

/// Draws throughput (requests/s) against latency bound (log scale), one panel per workload, to
/// `path`; returns where it went.
pub fn schedule_svg(path: &Path, panels: &[Panel]) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let axes = Axes { x: "latency bound (s)", y: "requests/s meeting the bound", log_x: true };
    line_svg(path, panels, &axes)
}

/// Draws each panel's series as lines with points on `axes`, side by side, to `path` (an SVG
/// file, its folder created if missing); returns where it went.
pub fn line_svg(path: &Path, panels: &[Panel], axes: &Axes) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let svg = render(panels, axes)?;
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    std::fs::write(path, svg)?;
    Ok(path.to_owned())
}

/// The SVG document of [`line_svg`]'s chart.
fn render(panels: &[Panel], axes: &Axes) -> Result<String, Box<dyn std::error::Error>> {
    let (width, height) = (520 * panels.len().max(1) as u32, 380);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let colors = [RGBColor(200, 60, 60), RGBColor(50, 110, 200), RGBColor(30, 150, 60), RGBColor(120, 120, 120)];
        for (area, panel) in root.split_evenly((1, panels.len().max(1))).iter().zip(panels) {
            let points = panel.series.iter().flat_map(|(_, p)| p.iter());
            let (mut x_lo, mut x_hi, mut y_hi) = (f64::MAX, f64::MIN, 0f64);
            for &(x, y) in points {
                (x_lo, x_hi, y_hi) = (x_lo.min(x), x_hi.max(x), y_hi.max(y.unwrap_or(0.0)));
            }
            if x_lo > x_hi {
                continue;
            }
            // A log axis is drawn as a linear axis over log10(x), labelled with x.
            let (to_axis, x_range): (fn(f64) -> f64, _) = if axes.log_x {
                (f64::log10, (x_lo / 1.3).log10()..(x_hi * 1.3).log10())
            } else {
                (|x| x, 0.0..x_hi * 1.1)
            };
            // Three decimals at most, trailing zeros dropped (0.1 + 0.2 is labelled 0.3).
            let label = |x: &f64| {
                let x = if axes.log_x { 10f64.powf(*x) } else { *x };
                let text = format!("{x:.3}");
                text.trim_end_matches('0').trim_end_matches('.').to_string()
            };
            let mut chart = ChartBuilder::on(area)
                .caption(&panel.title, ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(55)
                .build_cartesian_2d(x_range, 0f64..(y_hi * 1.2).max(1e-3))?;
            chart.configure_mesh().x_desc(axes.x).y_desc(axes.y).x_label_formatter(&label).draw()?;
            for ((name, series), color) in panel.series.iter().zip(colors.iter().cycle()) {
                let shown: Vec<(f64, f64)> = series.iter().filter_map(|&(x, y)| y.map(|y| (to_axis(x), y))).collect();
                let color = *color;
                chart
                    .draw_series(LineSeries::new(shown.clone(), color.stroke_width(2)))?
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                chart.draw_series(shown.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()?;
        }
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panels() -> Vec<Panel> {
        vec![
            Panel {
                title: "ShareGPT-like".into(),
                series: vec![
                    ("FCFS tuned".into(), vec![(1.0, Some(2.0)), (10.0, Some(4.0)), (100.0, Some(5.0))]),
                    ("ExeGPT plan".into(), vec![(1.0, None), (10.0, Some(4.5)), (100.0, Some(6.0))]),
                ],
            },
            Panel { title: "Alpaca-like".into(), series: vec![("static batching".into(), vec![(2.0, Some(1.0))])] },
        ]
    }

    /// The text of every `<text>` element of `svg` (the backend writes it between newlines).
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>').and_then(|(_, rest)| rest.split_once("</text>")))
            .map(|(t, _)| t.trim().to_string())
            .collect()
    }

    #[test]
    fn svg_holds_every_panel_series_and_axis_title() {
        let axes = Axes { x: "latency bound (s)", y: "requests/s meeting the bound", log_x: true };
        let svg = render(&panels(), &axes).unwrap_or_default();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains(r#"width="1040""#) && svg.contains(r#"height="380""#), "two panels side by side");
        let texts = texts(&svg);
        for want in [
            "ShareGPT-like",
            "Alpaca-like",
            "FCFS tuned",
            "ExeGPT plan",
            "static batching",
            "latency bound (s)",
            "requests/s meeting the bound",
        ] {
            assert!(texts.iter().any(|t| t == want), "no text {want:?} in {texts:?}");
        }
        // One marker per point with a value: the plan's gap at x = 1 draws none.
        assert_eq!(svg.matches("<circle").count(), 3 + 2 + 1);
        // Each series is a line and a legend entry.
        assert!(svg.matches("<polyline").count() >= 2 * 3);
    }

    #[test]
    fn a_log_axis_is_labelled_with_the_values() {
        let axes = Axes { x: "latency bound (s)", y: "requests/s", log_x: true };
        let texts = texts(&render(&panels()[..1], &axes).unwrap_or_default());
        // x runs 1 to 100 on a log axis (y stays under 8): labels at 10 and 100, not their logs.
        assert!(texts.iter().any(|t| t == "10") && texts.iter().any(|t| t == "100"), "{texts:?}");
    }

    #[test]
    fn a_panel_without_points_is_left_blank() {
        let axes = Axes { x: "rate", y: "latency", log_x: false };
        let empty = [Panel { title: "nothing".into(), series: vec![("none".into(), Vec::new())] }];
        let svg = render(&empty, &axes).unwrap_or_default();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<circle").count(), 0);
        assert!(!texts(&svg).iter().any(|t| t == "nothing"));
    }

    #[test]
    fn line_svg_writes_the_file_and_refuses_a_path_it_cannot_write() {
        let dir = std::env::temp_dir().join(format!("xtask-plot-{}", std::process::id()));
        let axes = Axes { x: "request rate (req/s)", y: "normalized latency (s/token)", log_x: false };
        let path = dir.join("sub").join("chart.svg");
        let written = line_svg(&path, &panels(), &axes).ok();
        assert_eq!(written.as_deref(), Some(path.as_path()));
        let svg = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(svg.starts_with("<svg") && svg.contains("request rate (req/s)"));
        // A file where the folder should be.
        let blocked = dir.join("sub").join("chart.svg").join("inner.svg");
        assert!(line_svg(&blocked, &panels(), &axes).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
