//! The collectives the bench runs, the size sweep, and what a size means per collective
//! (nccl-tests' conventions: element counts per rank and the bus-bandwidth factor).

use std::str::FromStr;

use anyhow::bail;
use ferrocomm::{Collective, DataType, Splits};

use super::args::Step;

/// A benchmarked collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    /// Uneven parts ([`a2av_parts`]): every rank sends and receives the whole size, split
    /// unevenly between the ranks; out of place only.
    AllToAllV,
    /// The same parts with both sides' counts in device memory, the output packed
    /// (`all_to_all_v_dynamic_packed`, NCCLX's device_alltoallv_single); NCCL's side runs its
    /// all-to-all-v with the counts on the host, the same call it has.
    DeviceAllToAllV,
    Broadcast,
    Reduce,
    /// Every rank sends to the next and receives from the previous (a ring), like nccl-tests.
    SendRecv,
    /// The same ring by one-sided communication: every rank puts its input into the next
    /// rank's window (its output buffer, registered once), signals it and waits for the
    /// previous rank's signal. NCCL's side runs sendrecv's send and receive.
    Put,
    /// The fused all-reduce + residual add + RMSNorm (`all_reduce_rmsnorm`) of rows of
    /// `--hidden` elements: the size is the all-reduced rows; each rank's input buffer holds
    /// them, the residual and the weight, its output the normalized rows and the new residual.
    /// Out of place only; NCCL's side is NCCL's all-reduce followed by the norm kernel.
    AllReduceRmsNorm,
}

impl Coll {
    pub const ALL: [Coll; 11] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::AllToAll,
        Coll::AllToAllV,
        Coll::DeviceAllToAllV,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::SendRecv,
        Coll::Put,
        Coll::AllReduceRmsNorm,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllToAll => "all_to_all",
            Coll::AllToAllV => "all_to_all_v",
            Coll::DeviceAllToAllV => "device_alltoallv",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::SendRecv => "sendrecv",
            Coll::Put => "put",
            Coll::AllReduceRmsNorm => "all_reduce_rmsnorm",
        }
    }

    /// The library's name for it (algorithm selection).
    pub const fn collective(self) -> Collective {
        match self {
            Coll::AllReduce | Coll::AllReduceRmsNorm => Collective::AllReduce,
            Coll::AllGather => Collective::AllGather,
            Coll::ReduceScatter => Collective::ReduceScatter,
            Coll::AllToAll => Collective::AllToAll,
            Coll::AllToAllV | Coll::DeviceAllToAllV => Collective::AllToAllV,
            Coll::Broadcast => Collective::Broadcast,
            Coll::Reduce => Collective::Reduce,
            Coll::SendRecv | Coll::Put => Collective::Send,
        }
    }

    /// Whether it takes a reduction operator.
    pub const fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    /// Whether its parts are the uneven ones of [`a2av_parts`] (out of place only).
    pub const fn uneven(self) -> bool {
        matches!(self, Coll::AllToAllV | Coll::DeviceAllToAllV)
    }

    /// Whether it has a root.
    pub const fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }

    /// nccl-tests' bus-bandwidth factor: busbw = algbw * factor.
    pub fn busbw_factor(self, world: usize) -> f64 {
        let n = world as f64;
        match self {
            Coll::AllReduce | Coll::AllReduceRmsNorm => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (n - 1.0) / n,
            // Every rank keeps its own part (the smallest, see a2av_parts) and sends the rest.
            Coll::AllToAllV | Coll::DeviceAllToAllV => 1.0 - a2av_weight(0, world),
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv | Coll::Put => 1.0,
        }
    }
}

impl FromStr for Coll {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let t = s.trim().to_ascii_lowercase().replace('-', "_");
        let t = t.strip_suffix("_perf").unwrap_or(&t);
        Ok(match t {
            "all_reduce" | "allreduce" => Coll::AllReduce,
            "all_gather" | "allgather" => Coll::AllGather,
            "reduce_scatter" | "reducescatter" => Coll::ReduceScatter,
            "all_to_all" | "alltoall" => Coll::AllToAll,
            "all_to_all_v" | "alltoallv" => Coll::AllToAllV,
            "device_alltoallv" | "device_alltoallv_single" | "all_to_all_v_dynamic_packed" => {
                Coll::DeviceAllToAllV
            }
            "broadcast" | "bcast" => Coll::Broadcast,
            "reduce" => Coll::Reduce,
            "sendrecv" | "send_recv" => Coll::SendRecv,
            "put" => Coll::Put,
            "all_reduce_rmsnorm" | "allreduce_rmsnorm" => Coll::AllReduceRmsNorm,
            _ => bail!(
                "unknown collective '{s}' (expected one of: {})",
                Coll::ALL.map(|c| c.name()).join(", ")
            ),
        })
    }
}

/// Share of a rank's buffer in the all-to-all-v part `k` ranks ahead of it (k = 0: its own
/// part): (k + 1) / (1 + 2 + ... + world), so the own part is the smallest and the farthest rank
/// gets the most.
fn a2av_weight(k: usize, world: usize) -> f64 {
    (k + 1) as f64 / (world * (world + 1) / 2) as f64
}

/// Elements of the all-to-all-v part `k` ranks ahead (k < world) for a buffer of `count`:
/// `count * (k + 1) / T` rounded down (T = world(world + 1)/2), the last part taking what the
/// rounding left. The count matrix is circulant (rank s sends part `(d - s) mod world` to rank
/// d), so every rank sends and receives `count` elements, in parts of different sizes.
pub fn a2av_parts(count: usize, world: usize) -> Vec<usize> {
    let t = world * (world + 1) / 2;
    let mut v: Vec<usize> = (0..world).map(|k| count * (k + 1) / t).collect();
    let rest = count - v.iter().sum::<usize>();
    if let Some(last) = v.last_mut() {
        *last += rest;
    }
    v
}

/// The sizes of a sweep from `min` to `max` (inclusive when a step lands on it).
pub fn sweep(min: usize, max: usize, step: Step) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = min;
    loop {
        v.push(s);
        let next = match step {
            Step::Factor(f) => s.saturating_mul(f as usize),
            Step::Bytes(b) => s.saturating_add(b),
        };
        if next > max || next == s {
            break;
        }
        s = next;
    }
    v
}

/// What one row of the table moves, in elements.
///
/// `size` is nccl-tests' size: the whole buffer of every collective, which for all_gather is the
/// gathered output (`world` parts) and for reduce_scatter the full input (`world` parts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub coll: Coll,
    pub dtype: DataType,
    pub world: usize,
    /// Bytes (the size column).
    pub size: usize,
    /// Elements of `size` (the count column).
    pub count: usize,
    /// Elements of each rank's input buffer.
    pub in_count: usize,
    /// Elements of each rank's output buffer (out of place).
    pub out_count: usize,
    /// Elements of the buffer an in-place call works on.
    pub inplace_count: usize,
    /// all_reduce_rmsnorm: elements per row (0 for the other collectives).
    pub hidden: usize,
}

/// Send and receive counts of `rank` in an all-to-all-v of `count` elements per rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct A2avCounts {
    pub send: Vec<usize>,
    pub recv: Vec<usize>,
}

impl A2avCounts {
    /// The counts as the library takes them (parts packed in rank order).
    pub fn splits(&self) -> Splits {
        Splits::packed(self.send.clone(), self.recv.clone())
    }

    pub fn new(count: usize, world: usize, rank: usize) -> A2avCounts {
        let parts = a2av_parts(count, world);
        A2avCounts {
            send: (0..world)
                .map(|d| parts[(d + world - rank) % world])
                .collect(),
            recv: (0..world)
                .map(|s| parts[(rank + world - s) % world])
                .collect(),
        }
    }

    /// Where part `p` starts (the parts packed in rank order).
    pub fn displ(counts: &[usize], p: usize) -> usize {
        counts[..p].iter().sum()
    }
}

impl Shape {
    pub fn new(coll: Coll, size: usize, dtype: DataType, world: usize) -> anyhow::Result<Shape> {
        let e = dtype.size();
        if size % e != 0 {
            bail!(
                "size {size} bytes is not a whole number of {} elements ({e} bytes each)",
                dtype.name()
            );
        }
        let count = size / e;
        let parts = matches!(coll, Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll);
        if parts && count % world != 0 {
            bail!(
                "{}: size {size} bytes ({count} {} elements) does not divide into {world} ranks' \
                 equal parts; choose sizes that are multiples of {} bytes",
                coll.name(),
                dtype.name(),
                e * world
            );
        }
        let part = count / world;
        let (in_count, out_count) = match coll {
            Coll::AllGather => (part, count),
            Coll::ReduceScatter => (count, part),
            _ => (count, count),
        };
        Ok(Shape {
            coll,
            dtype,
            world,
            size,
            count,
            in_count,
            out_count,
            inplace_count: count,
            hidden: 0,
        })
    }

    /// The shape of a row of the run: [`Shape::new`], and for all_reduce_rmsnorm rows of
    /// `hidden` elements, its buffers laid out as [`Coll::AllReduceRmsNorm`] says (input: rows,
    /// residual, weight; output: normalized rows, new residual).
    pub fn of_run(
        coll: Coll,
        size: usize,
        dtype: DataType,
        world: usize,
        hidden: usize,
    ) -> anyhow::Result<Shape> {
        let mut s = Shape::new(coll, size, dtype, world)?;
        if coll == Coll::AllReduceRmsNorm {
            if hidden == 0 || s.count % hidden != 0 {
                bail!(
                    "all_reduce_rmsnorm: size {size} bytes ({} {} elements) is not a whole number \
                     of rows of --hidden {hidden}; choose sizes that are multiples of {} bytes",
                    s.count,
                    dtype.name(),
                    hidden * dtype.size()
                );
            }
            s.hidden = hidden;
            s.in_count = 2 * s.count + hidden;
            s.out_count = 2 * s.count;
            s.inplace_count = 0;
        }
        Ok(s)
    }

    /// Bytes per rank as algorithm selection counts them (input per rank; reduce_scatter's
    /// output per rank, as `FERROCOMM_REDUCESCATTER_MAX_BYTES` says; all-to-all-v: `world` times
    /// its largest part to another rank, as the cuda backend counts it).
    pub fn bytes_per_rank(&self) -> usize {
        let e = self.dtype.size();
        match self.coll {
            Coll::AllGather => self.in_count * e,
            Coll::ReduceScatter => self.out_count * e,
            Coll::AllToAllV | Coll::DeviceAllToAllV => {
                let parts = a2av_parts(self.count, self.world);
                self.world * parts.iter().skip(1).max().copied().unwrap_or(0) * e
            }
            _ => self.count * e,
        }
    }

    /// (algbw, busbw) in GB/s for a time in seconds (nccl-tests: algbw = size / time).
    pub fn bandwidths(&self, seconds: f64) -> (f64, f64) {
        if seconds <= 0.0 {
            return (0.0, 0.0);
        }
        let alg = self.size as f64 / 1e9 / seconds;
        (alg, alg * self.coll.busbw_factor(self.world))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_includes_both_ends() {
        assert_eq!(sweep(8, 64, Step::Factor(2)), vec![8, 16, 32, 64]);
        assert_eq!(sweep(8, 70, Step::Factor(4)), vec![8, 32]);
        assert_eq!(sweep(10, 30, Step::Bytes(10)), vec![10, 20, 30]);
        assert_eq!(sweep(5, 5, Step::Bytes(0)), vec![5]);
    }

    #[test]
    fn busbw_factors_match_nccl_tests() {
        assert_eq!(Coll::AllReduce.busbw_factor(4), 1.5);
        assert_eq!(Coll::AllGather.busbw_factor(4), 0.75);
        assert_eq!(Coll::ReduceScatter.busbw_factor(2), 0.5);
        assert_eq!(Coll::AllToAll.busbw_factor(8), 0.875);
        assert_eq!(Coll::Broadcast.busbw_factor(8), 1.0);
        assert_eq!(Coll::Reduce.busbw_factor(8), 1.0);
        assert_eq!(Coll::SendRecv.busbw_factor(2), 1.0);
    }

    #[test]
    fn shapes_follow_nccl_tests_size_semantics() {
        let s = Shape::new(Coll::AllGather, 4096, DataType::F32, 4).unwrap();
        assert_eq!((s.count, s.in_count, s.out_count), (1024, 256, 1024));
        assert_eq!(s.bytes_per_rank(), 1024);
        let s = Shape::new(Coll::ReduceScatter, 4096, DataType::BF16, 2).unwrap();
        assert_eq!((s.count, s.in_count, s.out_count), (2048, 2048, 1024));
        let s = Shape::new(Coll::AllReduce, 4096, DataType::F64, 3).unwrap();
        assert_eq!((s.count, s.in_count, s.out_count), (512, 512, 512));
        // 1 GB in 1 ms: algbw 1000 GB/s; all_reduce on 4 ranks: busbw 1.5x.
        let s = Shape::new(Coll::AllReduce, 1_000_000_000, DataType::U8, 4).unwrap();
        let (a, b) = s.bandwidths(1e-3);
        assert!((a - 1000.0).abs() < 1e-9 && (b - 1500.0).abs() < 1e-9);
        assert!(Shape::new(Coll::AllToAll, 4096, DataType::F32, 3).is_err());
        assert!(Shape::new(Coll::AllReduce, 4097, DataType::F32, 2).is_err());
        // A broadcast of any whole number of elements works on 3 ranks.
        assert!(Shape::new(Coll::Broadcast, 4096, DataType::F32, 3).is_ok());
    }

    #[test]
    fn all_to_all_v_parts_are_uneven_and_every_rank_sends_and_receives_the_size() {
        assert_eq!(a2av_parts(96, 3), vec![16, 32, 48]);
        assert_eq!(a2av_parts(100, 3), vec![16, 33, 51]);
        assert_eq!(a2av_parts(7, 1), vec![7]);
        assert_eq!(a2av_parts(0, 4), vec![0, 0, 0, 0]);
        for (count, world) in [(1000, 2), (1001, 3), (4099, 4), (5, 8)] {
            let all: Vec<A2avCounts> = (0..world)
                .map(|r| A2avCounts::new(count, world, r))
                .collect();
            for (r, c) in all.iter().enumerate() {
                assert_eq!(c.send.iter().sum::<usize>(), count);
                assert_eq!(c.recv.iter().sum::<usize>(), count);
                for (s, cs) in all.iter().enumerate() {
                    // What r receives from s is what s sends to r.
                    assert_eq!(c.recv[s], cs.send[r], "{count} {world}: {r} <- {s}");
                }
            }
        }
        assert_eq!(A2avCounts::displ(&[3, 4, 5], 2), 7);
        assert!((Coll::AllToAllV.busbw_factor(2) - 2.0 / 3.0).abs() < 1e-12);
        // Selection sees world x the largest part sent to another rank.
        let s = Shape::new(Coll::AllToAllV, 96 * 4, DataType::F32, 3).unwrap();
        assert_eq!(
            (s.in_count, s.out_count, s.bytes_per_rank()),
            (96, 96, 3 * 48 * 4)
        );
    }

    #[test]
    fn names_parse() {
        for c in Coll::ALL {
            assert_eq!(c.name().parse::<Coll>().unwrap(), c);
        }
        assert_eq!("all_reduce_perf".parse::<Coll>().unwrap(), Coll::AllReduce);
        assert_eq!("allgather".parse::<Coll>().unwrap(), Coll::AllGather);
    }
}
