//! The nccl-tests table: header, one line per size, and the footer, with ferrocomm's extra
//! columns (algorithm, and NCCL's time with the ratio under `--vs nccl`) after nccl-tests' own,
//! so that scripts that read nccl-tests' columns by position keep working.

use std::fmt::Write as _;

/// One half of a row (out of place or in place).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Measure {
    /// Median time per operation, microseconds.
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    /// Wrong elements over all ranks; `None` when not checked.
    pub wrong: Option<u64>,
}

/// NCCL's times for the same row, and ours over theirs.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Versus {
    pub oop_time_us: f64,
    pub oop_busbw: f64,
    pub oop_ratio: f64,
    pub ip_time_us: Option<f64>,
    pub ip_busbw: Option<f64>,
    pub ip_ratio: Option<f64>,
}

/// One line of the table.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    pub collective: &'static str,
    pub size: usize,
    pub count: usize,
    pub dtype: &'static str,
    /// `none` for collectives without an operator.
    pub redop: &'static str,
    /// -1 for collectives without a root.
    pub root: i64,
    /// The path that ran (`Communicator::path_for`: `flat`, ..., `lp-flat` when low precision).
    pub algo: String,
    pub oop: Measure,
    /// `None` where in place has no meaning (sendrecv).
    pub ip: Option<Measure>,
    pub nccl: Option<Versus>,
}

/// nccl-tests' time format: fewer decimals as the number grows.
fn time_str(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

fn measure_str(m: Option<&Measure>) -> String {
    match m {
        None => format!("  {:>7}  {:>6}  {:>6}  {:>5}", "N/A", "N/A", "N/A", "N/A"),
        Some(m) => {
            let wrong = m.wrong.map_or("N/A".to_string(), |w| w.to_string());
            format!(
                "  {}  {:6.2}  {:6.2}  {:>5}",
                time_str(m.time_us),
                m.algbw,
                m.busbw,
                wrong
            )
        }
    }
}

/// The column headings (after the `#` lines describing the run).
pub fn header(vs_nccl: bool) -> String {
    let mut s = String::new();
    let extra = if vs_nccl {
        format!(
            "  {:>8}  {:>7}  {:>6}  {:>7}  {:>6}",
            "", "nccl", "", "nccl", ""
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:^31}  {:^31}{}",
        "", "", "", "", "", "out-of-place", "in-place", extra
    );
    let extra = if vs_nccl {
        format!(
            "  {:>9}  {:>7}  {:>6}  {:>7}  {:>6}",
            "algo", "time", "ratio", "time", "ratio"
        )
    } else {
        format!("  {:>9}", "algo")
    };
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}{}",
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
        "algbw", "busbw", "#wrong", extra
    );
    let extra = if vs_nccl {
        format!(
            "  {:>9}  {:>7}  {:>6}  {:>7}  {:>6}",
            "", "(us)", "", "(us)", ""
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}{}",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
        "(GB/s)", "", extra
    );
    s
}

/// One line of the table.
pub fn line(r: &Row) -> String {
    let mut s = format!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
        r.size, r.count, r.dtype, r.redop, r.root
    );
    s.push_str(&measure_str(Some(&r.oop)));
    s.push_str(&measure_str(r.ip.as_ref()));
    let _ = write!(s, "  {:>9}", r.algo);
    if let Some(v) = &r.nccl {
        let _ = write!(s, "  {}  {:6.2}", time_str(v.oop_time_us), v.oop_ratio);
        match (v.ip_time_us, v.ip_ratio) {
            (Some(t), Some(q)) => {
                let _ = write!(s, "  {}  {:6.2}", time_str(t), q);
            }
            _ => {
                let _ = write!(s, "  {:>7}  {:>6}", "N/A", "N/A");
            }
        }
    }
    s
}

/// Totals for the footer.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Wrong elements over every checked row (nccl-tests' "out of bounds values").
    pub wrong: u64,
    /// Mean bus bandwidth over every measurement shown (out of place and in place).
    pub avg_busbw: f64,
}

pub fn summarize(rows: &[Row]) -> Summary {
    let mut wrong = 0;
    let mut bw = Vec::new();
    for r in rows {
        for m in std::iter::once(&r.oop).chain(r.ip.as_ref()) {
            wrong += m.wrong.unwrap_or(0);
            bw.push(m.busbw);
        }
    }
    let avg_busbw = if bw.is_empty() {
        0.0
    } else {
        bw.iter().sum::<f64>() / bw.len() as f64
    };
    Summary { wrong, avg_busbw }
}

/// nccl-tests' footer.
pub fn footer(s: &Summary) -> String {
    let verdict = if s.wrong == 0 { "OK" } else { "FAILED" };
    format!(
        "# Out of bounds values : {} {verdict}\n# Avg bus bandwidth    : {:.4} \n#\n",
        s.wrong, s.avg_busbw
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Row {
        Row {
            collective: "all_reduce",
            size: 1048576,
            count: 262144,
            dtype: "float",
            redop: "sum",
            root: -1,
            algo: "flat".into(),
            oop: Measure {
                time_us: 16.04,
                algbw: 65.37,
                busbw: 65.37,
                wrong: Some(0),
            },
            ip: Some(Measure {
                time_us: 123.456,
                algbw: 8.49,
                busbw: 8.49,
                wrong: Some(3),
            }),
            nccl: None,
        }
    }

    #[test]
    fn line_has_nccl_tests_columns() {
        let l = line(&row());
        let cols: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(
            cols,
            vec![
                "1048576", "262144", "float", "sum", "-1", "16.04", "65.37", "65.37", "0", "123.5",
                "8.49", "8.49", "3", "flat"
            ]
        );
        // nccl-tests' widths: size and count right-aligned in 12 columns.
        assert!(l.starts_with("     1048576        262144"));
    }

    #[test]
    fn header_columns_line_up_with_rows() {
        let h = header(false);
        let names = h.lines().nth(1).unwrap();
        let l = line(&row());
        // "#wrong" of the out-of-place half ends where the row's first #wrong field ends.
        let hdr_end = names.find("#wrong").unwrap() + "#wrong".len();
        // End offsets of the row's fields.
        let b = l.as_bytes();
        let fields: Vec<usize> = (0..b.len())
            .filter(|&i| b[i] != b' ' && (i + 1 == b.len() || b[i + 1] == b' '))
            .map(|i| i + 1)
            .collect();
        assert_eq!(fields[8], hdr_end, "\n{names}\n{l}");
        assert!(h.contains("out-of-place") && h.contains("in-place"));
        assert!(names.contains("size") && names.contains("redop") && names.contains("algo"));
    }

    #[test]
    fn versus_columns_and_missing_in_place() {
        let mut r = row();
        r.ip = None;
        r.nccl = Some(Versus {
            oop_time_us: 20.0,
            oop_busbw: 52.0,
            oop_ratio: 0.802,
            ip_time_us: None,
            ip_busbw: None,
            ip_ratio: None,
        });
        let cols: Vec<String> = line(&r).split_whitespace().map(String::from).collect();
        assert_eq!(&cols[9..13], &["N/A", "N/A", "N/A", "N/A"]);
        assert_eq!(&cols[13..], &["flat", "20.00", "0.80", "N/A", "N/A"]);
        assert!(header(true).contains("ratio"));
    }

    #[test]
    fn footer_reports_wrong_values_and_average() {
        let mut r2 = row();
        r2.ip = None;
        let s = summarize(&[row(), r2]);
        assert_eq!(s.wrong, 3);
        assert!((s.avg_busbw - (65.37 + 8.49 + 65.37) / 3.0).abs() < 1e-9);
        let f = footer(&s);
        assert!(f.contains("# Out of bounds values : 3 FAILED"), "{f}");
        assert!(f.contains("# Avg bus bandwidth    : 46.4100"), "{f}");
        let ok = footer(&Summary {
            wrong: 0,
            avg_busbw: 1.0,
        });
        assert!(ok.starts_with("# Out of bounds values : 0 OK"));
    }
}
