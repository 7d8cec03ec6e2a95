//! `--plot FILE.png`: time and bus bandwidth against size (log axes), one series per algorithm
//! that ran, NCCL beside ours.
//!
//! Text is drawn with a font compiled into the binary (DejaVu Sans Mono, plotters' `ab_glyph`
//! feature): no fontconfig or system fonts are needed, so the binary runs unchanged on the GPU
//! machines.

use std::collections::BTreeMap;
use std::path::Path;

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

/// A named line of (size, time us, busbw GB/s) points.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64, f64)>,
}

/// Groups out-of-place results into series: one per algorithm that ran (and per dtype/op when
/// the run had several), plus NCCL's when it ran.
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
    let mut m: BTreeMap<String, Series> = BTreeMap::new();
    for r in rows {
        let label = format!("ferrocomm {}{}", r.algo, qual(r));
        let s = m.entry(label.clone()).or_default();
        s.label = label;
        s.points.push((r.size as f64, r.oop.time_us, r.oop.busbw));
        if let Some(v) = &r.nccl {
            let label = format!("nccl{}", qual(r));
            let s = m.entry(label.clone()).or_default();
            s.label = label;
            s.points.push((r.size as f64, v.oop_time_us, v.oop_busbw));
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

/// Draws the two panels into `path`.
pub fn draw(path: &Path, title: &str, rows: &[Row]) -> anyhow::Result<()> {
    register_font()?;
    let all = series(rows);
    let root = BitMapBackend::new(path, (1400, 600)).into_drawing_area();
    let e = |e: DrawingAreaErrorKind<_>| anyhow!("plot {}: {e:?}", path.display());
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(e)?;
    let (left, right) = root.split_horizontally(700);
    let xr = pos_range(all.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let panels: [(_, &str, Pick); 2] = [
        (left, "time per op (us)", |p| p.1),
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
        for (i, s) in all.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .map(|p| (p.0, pick(p)))
                .filter(|p| p.1 > 0.0 && p.1.is_finite())
                .collect();
            let style = ShapeStyle::from(&color).stroke_width(2);
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(e)?
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
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
            ip: Some(m),
            nccl: Some(Versus {
                oop_time_us: t * 1.5,
                oop_busbw: m.busbw / 1.5,
                oop_ratio: 1.0 / 1.5,
                ip_time_us: None,
                ip_busbw: None,
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
        assert_eq!(labels, vec!["ferrocomm flat", "ferrocomm push", "nccl"]);
        assert_eq!(s[1].points.len(), 2);
        assert_eq!(s[2].points.len(), 3);
        assert_eq!(s[2].points[0].1, 3.0);
    }

    #[test]
    fn draws_a_png_with_text() {
        let dir = std::env::temp_dir().join(format!("ferrocomm-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.png");
        let rows: Vec<Row> = (10..20).map(|k| row(1 << k, "flat", k as f64)).collect();
        draw(&p, "all_reduce float sum, 2 ranks", &rows).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        // A plain white 1400x600 image compresses to almost nothing; lines and text do not.
        assert!(bytes.len() > 20_000, "{} bytes", bytes.len());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
