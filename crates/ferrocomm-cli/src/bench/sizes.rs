//! The collectives the bench runs, the size sweep, and what a size means per collective
//! (nccl-tests' conventions: element counts per rank and the bus-bandwidth factor).

use std::str::FromStr;

use anyhow::bail;
use ferrocomm::{Collective, DataType};

use super::args::Step;

/// A benchmarked collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    Reduce,
    /// Every rank sends to the next and receives from the previous (a ring), like nccl-tests.
    SendRecv,
}

impl Coll {
    pub const ALL: [Coll; 7] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::AllToAll,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::SendRecv,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllToAll => "all_to_all",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::SendRecv => "sendrecv",
        }
    }

    /// The library's name for it (algorithm selection).
    pub const fn collective(self) -> Collective {
        match self {
            Coll::AllReduce => Collective::AllReduce,
            Coll::AllGather => Collective::AllGather,
            Coll::ReduceScatter => Collective::ReduceScatter,
            Coll::AllToAll => Collective::AllToAll,
            Coll::Broadcast => Collective::Broadcast,
            Coll::Reduce => Collective::Reduce,
            Coll::SendRecv => Collective::Send,
        }
    }

    /// Whether it takes a reduction operator.
    pub const fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    /// Whether it has a root.
    pub const fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }

    /// nccl-tests' bus-bandwidth factor: busbw = algbw * factor.
    pub fn busbw_factor(self, world: usize) -> f64 {
        let n = world as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
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
            "broadcast" | "bcast" => Coll::Broadcast,
            "reduce" => Coll::Reduce,
            "sendrecv" | "send_recv" => Coll::SendRecv,
            _ => bail!(
                "unknown collective '{s}' (expected one of: {})",
                Coll::ALL.map(|c| c.name()).join(", ")
            ),
        })
    }
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
        })
    }

    /// Bytes per rank as algorithm selection counts them (input per rank; reduce_scatter's
    /// output per rank, as `FERROCOMM_REDUCESCATTER_MAX_BYTES` says).
    pub fn bytes_per_rank(&self) -> usize {
        let e = self.dtype.size();
        match self.coll {
            Coll::AllGather => self.in_count * e,
            Coll::ReduceScatter => self.out_count * e,
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
    fn names_parse() {
        for c in Coll::ALL {
            assert_eq!(c.name().parse::<Coll>().unwrap(), c);
        }
        assert_eq!("all_reduce_perf".parse::<Coll>().unwrap(), Coll::AllReduce);
        assert_eq!("allgather".parse::<Coll>().unwrap(), Coll::AllGather);
    }
}
