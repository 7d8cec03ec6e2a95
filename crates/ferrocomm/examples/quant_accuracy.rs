//! Accuracy of the low-precision all-reduce, simulated exactly as the library computes it
//! (`quant::reference`), against an f64 sum. Prints markdown tables (docs/quant-accuracy.md).
//!
//! cargo run --release -p ferrocomm --example quant_accuracy [elements_per_rank]

use ferrocomm::quant::reference::{error_stats, exact_sum, one_shot, two_shot, Data, ErrorStats};
use ferrocomm::quant::{Codec, Format};

const WORLDS: [usize; 2] = [2, 8];
const BLOCKS: [usize; 4] = [32, 64, 128, 256];

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("elements per rank must be a number"))
        .unwrap_or(1 << 20);
    println!("{n} elements per rank; error of the result against the f64 sum of the f32 inputs.\n");
    for data in [Data::Normal, Data::StudentT3, Data::Outliers] {
        println!("### {}\n", data.name());
        let outliers = data == Data::Outliers;
        print!("| ranks | format | block | one-shot rel L2 | one-shot max abs | two-shot rel L2 | two-shot max abs |");
        if outliers {
            print!(" one-shot rel L2 off outliers |");
        }
        println!();
        println!(
            "|---|---|---|---|---|---|---|{}",
            if outliers { "---|" } else { "" }
        );
        for world in WORLDS {
            let x: Vec<Vec<f32>> = (0..world).map(|r| data.generate(n, 1 + r as u64)).collect();
            let want = exact_sum(&x);
            // Elements where no rank has an outlier: the error the bulk of the data sees.
            let bulk: Vec<bool> = (0..n)
                .map(|i| x.iter().all(|v| v[i].abs() < 50.0))
                .collect();
            let bf16 = bf16_all_reduce(&x);
            let e = error_stats(&bf16, &want, None);
            print!(
                "| {world} | bf16 (for scale) | - | {} | {:.3e} | - | - |",
                pct(e),
                e.max_abs
            );
            if outliers {
                print!(" {} |", pct(error_stats(&bf16, &want, Some(&bulk))));
            }
            println!();
            for format in Format::ALL {
                for block in BLOCKS {
                    let codec = Codec::new(format, block).unwrap();
                    let one = one_shot(&codec, &x);
                    let (e1, e2) = (
                        error_stats(&one, &want, None),
                        error_stats(&two_shot(&codec, &x), &want, None),
                    );
                    print!(
                        "| {world} | {format} | {block} | {} | {:.3e} | {} | {:.3e} |",
                        pct(e1),
                        e1.max_abs,
                        pct(e2),
                        e2.max_abs
                    );
                    if outliers {
                        print!(" {} |", pct(error_stats(&one, &want, Some(&bulk))));
                    }
                    println!();
                }
            }
        }
        println!();
    }
}

fn pct(e: ErrorStats) -> String {
    format!("{:.3}%", e.rel_l2 * 100.0)
}

/// What a full-precision bf16 all-reduce gives: bf16 inputs, f32 sum, bf16 result.
fn bf16_all_reduce(x: &[Vec<f32>]) -> Vec<f32> {
    let round = |v: f32| half::bf16::from_f32(v).to_f32();
    let mut acc: Vec<f32> = x[0].iter().map(|&v| round(v)).collect();
    for r in &x[1..] {
        for (a, &v) in acc.iter_mut().zip(r) {
            *a += round(v);
        }
    }
    acc.iter().map(|&v| round(v)).collect()
}
