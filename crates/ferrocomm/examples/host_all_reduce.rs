//! A first ferrocomm program: every rank sums a vector with the others on the host backend
//! (processes sharing memory, no GPU needed).
//!
//! ```text
//! cargo build --example host_all_reduce
//! ferrocomm launch -n 4 -- target/debug/examples/host_all_reduce
//! ```
//!
//! `ferrocomm launch` starts the ranks with torchrun's variables (`RANK`, `WORLD_SIZE`, ...) and
//! hosts the store they meet through; `CommOptions::new` takes all of it from the environment.
//! Each rank contributes `rank + 1` in every element, so every element of the sum is
//! `1 + 2 + ... + n`; the program checks that and exits 1 if any element differs.

use ferrocomm::config::BackendChoice;
use ferrocomm::{CallOpts, CommOptions, Communicator, Input, ReduceOp, View, ViewMut};

fn main() {
    match run() {
        Ok(0) => {}
        Ok(wrong) => {
            eprintln!("host_all_reduce: {wrong} wrong elements");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("host_all_reduce: {e} (start it with `ferrocomm launch -n 2 -- ...`)");
            std::process::exit(2);
        }
    }
}

/// The number of wrong elements in the sum.
fn run() -> ferrocomm::Result<usize> {
    let comm = Communicator::new(CommOptions {
        backend: Some(BackendChoice::Host),
        ..CommOptions::new("example")
    })?;
    let (rank, size) = (comm.rank(), comm.size());

    let mine = vec![(rank + 1) as f32; 1000];
    let mut sum = vec![0.0f32; mine.len()];
    comm.all_reduce(
        Input::Buf(View::host(&mine)),
        ViewMut::host(&mut sum),
        ReduceOp::Sum,
        &CallOpts::default(),
    )?;

    let want = (size * (size + 1) / 2) as f32;
    let wrong = sum.iter().filter(|&&x| x != want).count();
    println!(
        "rank {rank} of {size}: all_reduce sum of {} floats = {} ({} wrong)",
        sum.len(),
        sum[0],
        wrong
    );
    comm.finalize()?;
    Ok(wrong)
}
