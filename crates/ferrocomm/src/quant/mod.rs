//! Block-scaled low-precision formats: B codes plus one f32 scale (absmax / format max) per block.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The code format of a low-precision block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Format {
    /// FP8 E4M3 (finite max 448).
    E4M3,
    /// FP8 E5M2 (finite max 57344).
    E5M2,
    /// Symmetric INT8 (max 127).
    Int8,
}

impl Format {
    pub const ALL: [Format; 3] = [Format::E4M3, Format::E5M2, Format::Int8];

    pub const fn name(self) -> &'static str {
        match self {
            Format::E4M3 => "e4m3",
            Format::E5M2 => "e5m2",
            Format::Int8 => "int8",
        }
    }

    /// The largest finite magnitude a code can hold.
    pub const fn max(self) -> f32 {
        match self {
            Format::E4M3 => 448.0,
            Format::E5M2 => 57344.0,
            Format::Int8 => 127.0,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "e4m3" | "fp8" | "f8e4m3" | "float8_e4m3fn" => Ok(Format::E4M3),
            "e5m2" | "f8e5m2" | "float8_e5m2" => Ok(Format::E5M2),
            "int8" | "i8" => Ok(Format::Int8),
            other => Err(Error::InvalidArgument(format!(
                "unknown low-precision format '{other}' (expected e4m3, e5m2 or int8)"
            ))),
        }
    }
}
