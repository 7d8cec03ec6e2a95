//! `--plot FILE.png`: time and bus bandwidth against size (log axes), one series per algorithm
//! that ran, NCCL beside ours, out-of-place as solid lines and in-place as thin ones.
//!
//! Text is drawn with a font compiled into the binary (DejaVu Sans Mono, plotters' `ab_glyph`
//! feature): no fontconfig or system fonts are needed, so the binary runs unchanged on the GPU
//! machines.

use std::collections::BTreeMap;

use anyhow::anyhow;
use plotters::prelude::*;

use super::table::Row;

static FONT: &[u8] = include_bytes!("../../assets/DejaVuSansMono.ttf");

fn register_font() -> anyhow::Result<()> {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    ok.then_some(())
        .ok_or_else(|| anyhow!("the bundled plot font did not load"))
}

/// A named line of (size, time µs, busbw GB/s) points.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    /// In-place results (drawn thin, in the colour of the out-of-place line they go with).
    pub in_place: bool,
    pub points: Vec<(f64, f64, f64)>,
}

/// Groups results into series: one per algorithm that ran (and per dtype/op when the run had
/// several), plus NCCL's when it ran; each out-of-place series followed by its in-place one when
/// in-place ran.
pub fn series(rows: &[Row]) -> Vec<Series> {
    let kinds: std::collections::BTreeSet<(&str, &str, i64)> =
        rows.iter().map(|r| (r.dtype, r.redop, r.root)).collect();
    let qual = |r: &Row| {
        if kinds.len() > 1 {
            format!(" {} {} r{}", r.dtype, r.redop, r.root)
        } else {
            String::new()
        }
    };
    // Keyed by (base label, in place) so that each in-place series follows its out-of-place one.
    let mut m: BTreeMap<(String, bool), Series> = BTreeMap::new();
    let mut add = |base: String, in_place: bool, point: (f64, f64, f64)| {
        let s = m.entry((base.clone(), in_place)).or_default();
        if s.label.is_empty() {
            s.label = if in_place {
                format!("{base} in-place")
            } else {
                base
            };
            s.in_place = in_place;
        }
        s.points.push(point);
    };
    for r in rows {
        let size = r.size as f64;
        let ours = format!("ferrocomm {}{}", r.algo, qual(r));
        add(ours.clone(), false, (size, r.oop.time_us, r.oop.busbw));
        if let Some(ip) = &r.ip {
            add(ours, true, (size, ip.time_us, ip.busbw));
        }
        if let Some(v) = &r.nccl {
            let theirs = format!("nccl{}", qual(r));
            add(theirs.clone(), false, (size, v.oop_time_us, v.oop_busbw));
            if let (Some(t), Some(bw)) = (v.ip_time_us, v.ip_busbw) {
                add(theirs, true, (size, t, bw));
            }
        }
    }
    m.into_values().collect()
}

fn pos_range(v: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = v
        .filter(|x| *x > 0.0 && x.is_finite())
        .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    if lo > hi {
        (1.0, 10.0)
    } else {
        (lo / 1.5, hi * 1.5)
    }
}

fn size_label(b: &f64) -> String {
    let b = *b;
    if b >= (1u64 << 30) as f64 {
        format!("{:.0}G", b / (1u64 << 30) as f64)
    } else if b >= (1 << 20) as f64 {
        format!("{:.0}M", b / (1 << 20) as f64)
    } else if b >= 1024.0 {
        format!("{:.0}K", b / 1024.0)
    } else {
        format!("{b:.0}")
    }
}

/// Which coordinate of a (size, time, busbw) point a panel shows.
type Pick = fn(&(f64, f64, f64)) -> f64;

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 600;

/// The two panels as a PNG file's bytes (made in memory: see `output` for why).
pub fn render(title: &str, rows: &[Row]) -> anyhow::Result<Vec<u8>> {
    let mut rgb = vec![0u8; WIDTH as usize * HEIGHT as usize * 3];
    draw(&mut rgb, title, rows)?;
    let mut png = Vec::new();
    let mut enc = png::Encoder::new(&mut png, WIDTH, HEIGHT);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header()?.write_image_data(&rgb)?;
    Ok(png)
}

/// Draws the two panels into an RGB buffer of WIDTH x HEIGHT.
fn draw(rgb: &mut [u8], title: &str, rows: &[Row]) -> anyhow::Result<()> {
    register_font()?;
    let all = series(rows);
    let root = BitMapBackend::with_buffer(rgb, (WIDTH, HEIGHT)).into_drawing_area();
    let e = |e: DrawingAreaErrorKind<_>| anyhow!("plot: {e:?}");
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(e)?;
    let (left, right) = root.split_horizontally(WIDTH / 2);
    let xr = pos_range(all.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let panels: [(_, &str, Pick); 2] = [
        (left, "time per op (µs)", |p| p.1),
        (right, "bus bandwidth (GB/s)", |p| p.2),
    ];
    for (area, ylabel, pick) in panels {
        let yr = pos_range(all.iter().flat_map(|s| s.points.iter().map(pick)));
        let mut chart = ChartBuilder::on(&area)
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            // Sizes are powers of two: ticks at powers of 4 land on them.
            .build_cartesian_2d((xr.0..xr.1).log_scale().base(4.0), (yr.0..yr.1).log_scale())
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("size (bytes)")
            .y_desc(ylabel)
            .x_label_formatter(&size_label)
            .y_label_formatter(&|v| format!("{}", (v * 1000.0).round() / 1000.0))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(e)?;
        let mut colour = 0;
        for s in &all {
            if !s.in_place {
                colour += 1;
            }
            let color = Palette99::pick(colour).to_rgba();
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .map(|p| (p.0, pick(p)))
                .filter(|p| p.1 > 0.0 && p.1.is_finite())
                .collect();
            let style = ShapeStyle::from(&color).stroke_width(if s.in_place { 1 } else { 2 });
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(e)?
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            let dot = if s.in_place {
                color.stroke_width(1)
            } else {
                color.filled()
            };
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, dot)))
                .map_err(e)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::table::{Measure, Versus};

    fn row(size: usize, algo: &str, t: f64) -> Row {
        let m = Measure {
            time_us: t,
            algbw: size as f64 / t / 1e3,
            busbw: size as f64 / t / 1e3,
            wrong: Some(0),
        };
        Row {
            collective: "all_reduce",
            size,
            count: size / 4,
            dtype: "float",
            redop: "sum",
            root: -1,
            algo: algo.into(),
            oop: m,
            ip: Some(Measure {
                time_us: t * 1.1,
                algbw: size as f64 / (t * 1.1) / 1e3,
                busbw: size as f64 / (t * 1.1) / 1e3,
                wrong: Some(0),
            }),
            nccl: Some(Versus {
                oop_time_us: t * 1.5,
                oop_busbw: m.busbw / 1.5,
                oop_ratio: 1.0 / 1.5,
                ip_time_us: Some(t * 1.2),
                ip_busbw: Some(m.busbw / 1.2),
                ip_ratio: None,
            }),
        }
    }

    #[test]
    fn series_per_algorithm_and_nccl() {
        let rows = vec![
            row(1024, "push", 2.0),
            row(2048, "push", 3.0),
            row(4096, "flat", 5.0),
        ];
        let s = series(&rows);
        let labels: Vec<&str> = s.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(
            labels,
            vec![
                "ferrocomm flat",
                "ferrocomm flat in-place",
                "ferrocomm push",
                "ferrocomm push in-place",
                "nccl",
                "nccl in-place"
            ]
        );
        let in_place: Vec<bool> = s.iter().map(|s| s.in_place).collect();
        assert_eq!(in_place, [false, true, false, true, false, true]);
        assert_eq!(s[2].points.len(), 2);
        assert_eq!(
            s[3].points[1],
            (2048.0, 3.0 * 1.1, 2048.0 / (3.0 * 1.1) / 1e3)
        );
        assert_eq!(s[4].points.len(), 3);
        assert_eq!(s[4].points[0].1, 2.0 * 1.5);
        assert_eq!(s[5].points[0].1, 2.0 * 1.2);
    }

    #[test]
    fn draws_a_png_with_text() {
        let rows: Vec<Row> = (10..20).map(|k| row(1 << k, "flat", k as f64)).collect();
        let bytes = render("all_reduce float sum, 2 ranks", &rows).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        let mut png = png::Decoder::new(bytes.as_slice()).read_info().unwrap();
        assert_eq!((png.info().width, png.info().height), (WIDTH, HEIGHT));
        // A plain white image compresses to almost nothing; lines and text do not.
        assert!(bytes.len() > 20_000, "{} bytes", bytes.len());
        let mut rgb = vec![0; png.output_buffer_size()];
        png.next_frame(&mut rgb).unwrap();
        assert!(rgb.iter().any(|&b| b != 255), "something is drawn");
    }
}
