//! PNG charts of benchmark results: `plotters` draws into an RGB buffer, and [`encode_png`]
//! writes it with `flate2` and `crc32fast` (already in Burn's build, with the features Burn
//! enables), so that charting adds no feature to any crate Burn compiles.

use std::io::Write;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

/// Fonts tried for the chart's text (plotters' `ab_glyph` backend ships none).
const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// A named series of (latency bound, throughput) points; `None` where the system has no
/// configuration meeting that bound (drawn as a gap).
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
/// `path`; returns where it went. Fails without a usable font.
pub fn schedule_png(path: &Path, panels: &[Panel]) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let axes = Axes { x: "latency bound (s)", y: "requests/s meeting the bound", log_x: true };
    line_png(path, panels, &axes)
}

/// Draws each panel's series as lines with points on `axes`, side by side, to `path`; returns
/// where it went. Fails without a usable font.
pub fn line_png(path: &Path, panels: &[Panel], axes: &Axes) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let font = FONTS
        .iter()
        .find_map(|f| std::fs::read(f).ok())
        .ok_or_else(|| format!("no font found for the chart's text (looked for {FONTS:?})"))?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(font.into_boxed_slice()))
        .map_err(|_| "the chart's font cannot be read")?;
    let (width, height) = (520 * panels.len().max(1) as u32, 380);
    let mut rgb = vec![0u8; (width * height * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area();
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
                let met: Vec<(f64, f64)> = series.iter().filter_map(|&(x, y)| y.map(|y| (to_axis(x), y))).collect();
                let color = *color;
                chart
                    .draw_series(LineSeries::new(met.clone(), color.stroke_width(2)))?
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                chart.draw_series(met.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
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
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    std::fs::write(path, encode_png(&rgb, width, height)?)?;
    Ok(path.to_owned())
}

/// An 8-bit RGB PNG of `rgb` (`width × height` pixels, rows top to bottom).
pub fn encode_png(rgb: &[u8], width: u32, height: u32) -> std::io::Result<Vec<u8>> {
    let row = width as usize * 3;
    if rgb.len() != row * height as usize {
        return Err(std::io::Error::other(format!("{} bytes are not {width}×{height} RGB pixels", rgb.len())));
    }
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    for line in rgb.chunks(row.max(1)) {
        z.write_all(&[0])?; // filter: none
        z.write_all(line)?;
    }
    let mut header = width.to_be_bytes().to_vec();
    header.extend(height.to_be_bytes());
    header.extend([8, 2, 0, 0, 0]); // 8 bits, RGB, deflate, no filter set, no interlace
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    for (kind, data) in [(b"IHDR", header), (b"IDAT", z.finish()?), (b"IEND", Vec::new())] {
        png.extend((data.len() as u32).to_be_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(kind);
        crc.update(&data);
        png.extend(kind);
        png.extend(&data);
        png.extend(crc.finalize().to_be_bytes());
    }
    Ok(png)
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// Splits a PNG into (kind, data) chunks, checking each CRC.
    fn chunks(png: &[u8]) -> Vec<([u8; 4], Vec<u8>)> {
        let mut out = Vec::new();
        let mut rest = &png[8..];
        while rest.len() >= 12 {
            let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            let kind: [u8; 4] = [rest[4], rest[5], rest[6], rest[7]];
            let data = rest[8..8 + len].to_vec();
            let crc = u32::from_be_bytes([rest[8 + len], rest[9 + len], rest[10 + len], rest[11 + len]]);
            assert_eq!(crc, crc32fast::hash(&rest[4..8 + len]), "CRC of {kind:?}");
            out.push((kind, data));
            rest = &rest[12 + len..];
        }
        assert!(rest.is_empty());
        out
    }

    #[test]
    fn png_holds_the_pixels_with_valid_chunks() {
        let rgb = [255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 9, 9];
        let png = encode_png(&rgb, 2, 2).unwrap_or_default();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let chunks = chunks(&png);
        let kinds: Vec<&[u8; 4]> = chunks.iter().map(|(k, _)| k).collect();
        assert_eq!(kinds, [b"IHDR", b"IDAT", b"IEND"]);
        assert_eq!(chunks[0].1, [0, 0, 0, 2, 0, 0, 0, 2, 8, 2, 0, 0, 0]);
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(&chunks[1].1[..]).read_to_end(&mut raw).unwrap_or_default();
        assert_eq!(raw, [0, 255, 0, 0, 0, 255, 0, 0, 0, 0, 255, 9, 9, 9]);
    }

    #[test]
    fn png_refuses_a_buffer_of_the_wrong_size() {
        assert!(encode_png(&[0; 5], 1, 2).is_err());
    }
}
