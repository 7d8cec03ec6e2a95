//! Element types, reduction operators, where a buffer lives, and the names of collectives and
//! algorithms: the words every other module speaks (this module imports none of them).

use std::fmt;
use std::str::FromStr;

/// A name that is not one of the accepted spellings (a dtype, an op, a device, an algorithm);
/// it becomes [`crate::Error::InvalidArgument`] with the same message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid argument: {}", self.0)
    }
}

impl std::error::Error for ParseError {}

type Result<T> = std::result::Result<T, ParseError>;

/// The element type of a buffer, as NCCL and torch know them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DataType {
    /// 32-bit IEEE float (`float`).
    F32,
    /// 64-bit IEEE float (`double`).
    F64,
    /// 16-bit IEEE float (`half`).
    F16,
    /// bfloat16: the exponent range of f32 with 8 bits of mantissa.
    BF16,
    /// FP8 with 4 exponent and 3 mantissa bits (OCP E4M3, finite only, max 448).
    F8E4M3,
    /// FP8 with 5 exponent and 2 mantissa bits (OCP E5M2, max 57344).
    F8E5M2,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl DataType {
    /// Every dtype, in a stable order (used for codes on the wire and in tests).
    pub const ALL: [DataType; 12] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::BF16,
        DataType::F8E4M3,
        DataType::F8E5M2,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F16 | DataType::BF16 => 2,
            DataType::F8E4M3 | DataType::F8E5M2 | DataType::I8 | DataType::U8 => 1,
        }
    }

    /// The name used in tables and on the command line (nccl-tests' spelling where it has one).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::F16 => "half",
            DataType::BF16 => "bfloat16",
            DataType::F8E4M3 => "f8e4m3",
            DataType::F8E5M2 => "f8e5m2",
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
        }
    }

    /// A stable small code (index in [`DataType::ALL`]) for signatures and kernels.
    pub fn code(self) -> u8 {
        DataType::ALL.iter().position(|d| *d == self).unwrap_or(0) as u8
    }

    /// The dtype of a [`DataType::code`], or `None` for a code no dtype has (from a peer or a kernel).
    pub fn from_code(code: u8) -> Option<DataType> {
        DataType::ALL.get(code as usize).copied()
    }

    /// The floating-point types, FP8 included.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F32
                | DataType::F64
                | DataType::F16
                | DataType::BF16
                | DataType::F8E4M3
                | DataType::F8E5M2
        )
    }

    /// The integer types: every type that is not a float.
    pub const fn is_integer(self) -> bool {
        !self.is_float()
    }

    /// Narrow float types that are reduced in f32 (docs/design.md, rule 6).
    pub const fn accumulates_in_f32(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::BF16 | DataType::F8E4M3 | DataType::F8E5M2
        )
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataType {
    type Err = ParseError;

    /// Accepts nccl-tests names (`float`, `half`, `bfloat16`, `int32`...), torch names
    /// (`float32`, `torch.bfloat16`, `float8_e4m3fn`...) and short forms (`f32`, `bf16`, `e4m3`).
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().trim_start_matches("torch.").to_ascii_lowercase();
        let d = match s.as_str() {
            "float" | "float32" | "f32" | "fp32" => DataType::F32,
            "double" | "float64" | "f64" | "fp64" => DataType::F64,
            "half" | "float16" | "f16" | "fp16" => DataType::F16,
            "bfloat16" | "bf16" => DataType::BF16,
            "f8e4m3" | "e4m3" | "fp8" | "float8_e4m3fn" | "fp8_e4m3" => DataType::F8E4M3,
            "f8e5m2" | "e5m2" | "float8_e5m2" | "fp8_e5m2" => DataType::F8E5M2,
            "int8" | "i8" | "char" => DataType::I8,
            "uint8" | "u8" => DataType::U8,
            "int32" | "i32" | "int" => DataType::I32,
            "uint32" | "u32" => DataType::U32,
            "int64" | "i64" | "long" => DataType::I64,
            "uint64" | "u64" => DataType::U64,
            _ => {
                return Err(ParseError(format!(
                    "unknown dtype '{s}' (expected one of: float, double, half, bfloat16, f8e4m3, \
                     f8e5m2, int8, uint8, int32, uint32, int64, uint64)"
                )))
            }
        };
        Ok(d)
    }
}

/// A reduction operator. `PremulSum(s)` multiplies every input by `s` before summing.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The product.
    Prod,
    /// The minimum.
    Min,
    /// The maximum.
    Max,
    /// The sum divided by the number of ranks (truncated for integers, as in NCCL).
    Avg,
    /// The sum of every input multiplied by the factor first (floats only, finite factor).
    PremulSum(f64),
    /// Bitwise and (integers only).
    BitAnd,
    /// Bitwise or (integers only).
    BitOr,
    /// Bitwise exclusive or (integers only).
    BitXor,
}

impl ReduceOp {
    /// nccl-tests' name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
            ReduceOp::PremulSum(_) => "premulsum",
            ReduceOp::BitAnd => "band",
            ReduceOp::BitOr => "bor",
            ReduceOp::BitXor => "bxor",
        }
    }

    /// A stable small code for signatures and kernels.
    pub const fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
            ReduceOp::Avg => 4,
            ReduceOp::PremulSum(_) => 5,
            ReduceOp::BitAnd => 6,
            ReduceOp::BitOr => 7,
            ReduceOp::BitXor => 8,
        }
    }

    /// The name of the operator whose [`ReduceOp::code`] is `code` (`None` for no operator's),
    /// for descriptions kept as codes (a PreMulSum's factor is not part of its code).
    pub fn name_of_code(code: u64) -> Option<&'static str> {
        [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Avg,
            ReduceOp::PremulSum(1.0),
            ReduceOp::BitAnd,
            ReduceOp::BitOr,
            ReduceOp::BitXor,
        ]
        .into_iter()
        .find(|o| u64::from(o.code()) == code)
        .map(ReduceOp::name)
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReduceOp::PremulSum(s) => write!(f, "premulsum({s})"),
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for ReduceOp {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "sum" => ReduceOp::Sum,
            "prod" | "product" => ReduceOp::Prod,
            "min" => ReduceOp::Min,
            "max" => ReduceOp::Max,
            "avg" | "mean" => ReduceOp::Avg,
            "premulsum" | "premul_sum" => ReduceOp::PremulSum(1.0),
            "band" | "bitand" => ReduceOp::BitAnd,
            "bor" | "bitor" => ReduceOp::BitOr,
            "bxor" | "bitxor" => ReduceOp::BitXor,
            other => {
                return Err(ParseError(format!(
                    "unknown reduce op '{other}' (expected sum, prod, min, max, avg, premulsum, \
                     band, bor, bxor)"
                )))
            }
        })
    }
}

impl ReduceOp {
    /// The operator named `name` (as [`FromStr`] reads it), a PremulSum with its `factor`.
    pub fn named(name: &str, factor: f64) -> Result<ReduceOp> {
        Ok(match name.parse()? {
            ReduceOp::PremulSum(_) => ReduceOp::PremulSum(factor),
            other => other,
        })
    }
}

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Device {
    /// Ordinary (pageable or pinned) host memory.
    Host,
    /// Memory of the CUDA device with this ordinal.
    Cuda(u32),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Host => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl FromStr for Device {
    type Err = ParseError;

    /// `cpu`, `cuda`, `cuda:N` (a bare `cuda` means the local rank's GPU and parses as `cuda:0`
    /// here; the communicator resolves it).
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        if s == "cpu" || s == "host" {
            return Ok(Device::Host);
        }
        if s == "cuda" || s == "gpu" {
            return Ok(Device::Cuda(0));
        }
        if let Some(n) = s.strip_prefix("cuda:") {
            return n
                .parse()
                .map(Device::Cuda)
                .map_err(|_| ParseError(format!("bad device ordinal in '{s}'")));
        }
        Err(ParseError(format!(
            "unknown device '{s}' (expected cpu, cuda or cuda:N)"
        )))
    }
}

/// How a collective is carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Algo {
    /// Let the planner decide ([`crate::plan`]).
    Auto,
    /// Barrier-free one-shot: data travels with flags or sentinels (smallest messages).
    Push,
    /// One-shot pull: every rank reads every staging slot and reduces locally.
    Flat,
    /// Two-shot: reduce-scatter of stripes, then all-gather of the reduced stripes.
    Tree,
    /// Direct access for the data-movement collectives (each rank copies what it needs).
    Direct,
    /// NCCL carries the collective.
    Nccl,
}

impl Algo {
    /// Every algorithm, in declaration order.
    pub const ALL: [Algo; 6] = [
        Algo::Auto,
        Algo::Push,
        Algo::Flat,
        Algo::Tree,
        Algo::Direct,
        Algo::Nccl,
    ];

    /// The name used in settings, `FERROCOMM_ALGO` and the bench (`auto`, `push`, `flat`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Algo::Auto => "auto",
            Algo::Push => "push",
            Algo::Flat => "flat",
            Algo::Tree => "tree",
            Algo::Direct => "direct",
            Algo::Nccl => "nccl",
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algo {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Algo::Auto,
            "push" | "oneshot_push" => Algo::Push,
            "flat" | "oneshot" | "one_shot" => Algo::Flat,
            "tree" | "twoshot" | "two_shot" => Algo::Tree,
            "direct" | "dda" => Algo::Direct,
            "nccl" => Algo::Nccl,
            other => {
                return Err(ParseError(format!(
                    "unknown algorithm '{other}' (expected auto, push, flat, tree, direct, nccl)"
                )))
            }
        })
    }
}

/// The collectives, as the planner and signatures name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Collective {
    /// `all_reduce`.
    AllReduce,
    /// `reduce` to one root.
    Reduce,
    /// `broadcast` from one root.
    Broadcast,
    /// `all_gather`.
    AllGather,
    /// `reduce_scatter`.
    ReduceScatter,
    /// `all_to_all` with equal parts.
    AllToAll,
    /// `all_to_all_v`, with per-rank counts and displacements.
    AllToAllV,
    /// `barrier`.
    Barrier,
    /// Point-to-point `send`.
    Send,
    /// Point-to-point `recv`.
    Recv,
}

impl Collective {
    /// Every collective, in declaration order (their codes).
    pub const ALL: [Collective; 10] = [
        Collective::AllReduce,
        Collective::Reduce,
        Collective::Broadcast,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::AllToAllV,
        Collective::Barrier,
        Collective::Send,
        Collective::Recv,
    ];

    /// The snake-case name (`all_reduce`, ...), as in logs, signatures and the bench.
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Reduce => "reduce",
            Collective::Broadcast => "broadcast",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllToAll => "all_to_all",
            Collective::AllToAllV => "all_to_all_v",
            Collective::Barrier => "barrier",
            Collective::Send => "send",
            Collective::Recv => "recv",
        }
    }

    /// A stable small code for signatures and kernels (the variant's index).
    pub const fn code(self) -> u8 {
        self as u8
    }
}

impl FromStr for Collective {
    type Err = ParseError;

    /// The snake-case name [`Collective::name`] gives.
    fn from_str(s: &str) -> Result<Self> {
        Collective::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| ParseError(format!("unknown collective '{s}'")))
    }
}

/// A Rust type that is one of the [`DataType`]s.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The dtype of this Rust type.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t { const DTYPE: DataType = DataType::$d; })*
    };
}

element! {
    f32 => F32, f64 => F64, half::f16 => F16, half::bf16 => BF16,
    i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
}

/// FP8 E4M3 code, stored as its raw byte (the `float8` crate gives the arithmetic).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct F8E4M3(pub u8);

/// FP8 E5M2 code, stored as its raw byte.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct F8E5M2(pub u8);

element! { F8E4M3 => F8E4M3, F8E5M2 => F8E5M2 }

/// Count `i` of a counts buffer of `dtype` (i32, u32, i64 or u64, native byte order). A
/// negative count sends nothing.
pub(crate) fn read_count(dtype: DataType, bytes: &[u8], i: usize) -> usize {
    let w = dtype.size();
    let b = &bytes[i * w..(i + 1) * w];
    let v: i128 = match dtype {
        DataType::I32 => i32::from_ne_bytes(b.try_into().expect("4 bytes")).into(),
        DataType::U32 => u32::from_ne_bytes(b.try_into().expect("4 bytes")).into(),
        DataType::I64 => i64::from_ne_bytes(b.try_into().expect("8 bytes")).into(),
        _ => u64::from_ne_bytes(b.try_into().expect("8 bytes")).into(),
    };
    usize::try_from(v.max(0)).unwrap_or(usize::MAX)
}

/// Writes count `i` of a counts buffer of `dtype`, saturated to the type's largest value.
pub(crate) fn write_count(dtype: DataType, bytes: &mut [u8], i: usize, v: usize) {
    let w = dtype.size();
    let b = &mut bytes[i * w..(i + 1) * w];
    match dtype {
        DataType::I32 => b.copy_from_slice(&i32::try_from(v).unwrap_or(i32::MAX).to_ne_bytes()),
        DataType::U32 => b.copy_from_slice(&u32::try_from(v).unwrap_or(u32::MAX).to_ne_bytes()),
        DataType::I64 => b.copy_from_slice(&i64::try_from(v).unwrap_or(i64::MAX).to_ne_bytes()),
        _ => b.copy_from_slice(&(v as u64).to_ne_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(d.name().parse::<DataType>().unwrap(), d);
            assert_eq!(DataType::from_code(d.code()), Some(d));
        }
        assert_eq!(
            "torch.bfloat16".parse::<DataType>().unwrap(),
            DataType::BF16
        );
        assert!("complex64".parse::<DataType>().is_err());
    }

    #[test]
    fn op_support() {
        assert!(ReduceOp::BitXor.check(DataType::I32, "all_reduce").is_ok());
        let e = ReduceOp::BitXor
            .check(DataType::F32, "all_reduce")
            .unwrap_err();
        assert!(e.to_string().contains("bxor"), "{e}");
        assert!(ReduceOp::PremulSum(2.0)
            .check(DataType::I64, "all_reduce")
            .is_err());
        assert!(ReduceOp::PremulSum(0.5)
            .check(DataType::BF16, "all_reduce")
            .is_ok());
    }

    #[test]
    fn devices_parse() {
        assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda(3));
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Host);
        assert!("tpu".parse::<Device>().is_err());
    }
}
