//! The kernel units: which entry points are compiled together, from which sources, with which
//! NVRTC options, and under which cache key.
//!
//! A unit is one group of entry points ([`Group`]) of one element type ([`Variant`]): the
//! sources up to the group's file, with `#define FC_T_<type>` and `#define FC_GROUP_<name>`
//! in front (the `.cu` files emit a group's entry points under its define only). A compile at
//! first use builds the unit a call needs, not every kernel of the element type.
//!
//! The crate's build script includes this file too (it compiles the built-in cubins), so it
//! uses std alone: the library and the build name and key every unit the same way.

/// The all-reduce source (push, flat, tree, stream, copy-engine and LL128 entry points per
/// operator; the start-up check).
pub const ALL_REDUCE_SOURCE: &str = include_str!("../../kernels/all_reduce.cu");
/// Its name in logs and errors.
pub const ALL_REDUCE_NAME: &str = "all_reduce.cu";
/// The other collectives (all-gather, reduce-scatter, all-to-all(v), broadcast, reduce), after
/// the all-reduce source (they share its helpers).
pub const COLLECTIVES_SOURCE: &str = include_str!("../../kernels/collectives.cu");
/// The low-precision kernels, after collectives.cu (float types only).
pub const LOWP_SOURCE: &str = include_str!("../../kernels/lowp.cu");
/// The residual add + RMSNorm of the fused all_reduce_rmsnorm call, after lowp.cu (float types
/// only).
pub const RMSNORM_SOURCE: &str = include_str!("../../kernels/rmsnorm.cu");

/// The window kernels (one-sided put, signal, wait; cuda/window.rs), after the all-reduce
/// source (they use its memory-model helpers) and nothing else.
pub const WINDOW_SOURCE: &str = include_str!("../../kernels/window.cu");

/// The sources in the order a unit concatenates them; a group takes some of them in this order
/// ([`Group::sources`]).
pub const SOURCES: [&str; 5] = [
    ALL_REDUCE_SOURCE,
    COLLECTIVES_SOURCE,
    LOWP_SOURCE,
    RMSNORM_SOURCE,
    WINDOW_SOURCE,
];

/// Algorithms with an entry point per operator: `fc_<algo>_<op>`.
pub const ALGOS: [&str; 6] = ["push", "flat", "tree", "stream", "ce", "ll128"];
/// Operators compiled for every element type (Avg and PremulSum run on `sum` with scale
/// factors).
pub const OPS: [&str; 4] = ["sum", "prod", "min", "max"];
/// Entry points of the start-up group.
pub const EXTRA_ENTRIES: [&str; 2] = ["fc_verify_write", "fc_ce_gate"];
/// Data-movement entry points of collectives.cu (byte kernels, `(Args, CArgs)`).
pub const COLL_ENTRIES: [&str; 12] = [
    "fc_all_gather_ll",
    "fc_all_gather_st",
    "fc_all_gather_rw",
    "fc_all_to_all_ll",
    "fc_all_to_all_st",
    "fc_all_to_all_rw",
    "fc_all_to_all_v_st",
    "fc_all_to_all_v_ll",
    "fc_all_to_all_v_pc",
    "fc_all_to_all_dyn",
    "fc_broadcast_ll",
    "fc_broadcast_st",
];
/// Reduction entry points of collectives.cu, one per operator: `<prefix>_<op>`.
pub const COLL_OP_ENTRIES: [&str; 5] = [
    "fc_reduce_scatter_ll",
    "fc_reduce_ll",
    "fc_reduce_scatter_st",
    "fc_reduce_scatter_rw",
    "fc_reduce_st",
];
/// Entry points of lowp.cu.
pub const LOWP_ENTRIES: [&str; 4] = [
    "fc_lp_encode",
    "fc_lp_move",
    "fc_lp_move_wide",
    "fc_lp_tree",
];
/// Entry points of rmsnorm.cu.
pub const RMSNORM_ENTRIES: [&str; 10] = [
    "fc_rmsnorm",
    "fc_rmsnorm_plain",
    "fc_rmsnorm_wide1",
    "fc_rmsnorm_wide2",
    "fc_rmsnorm_wide4",
    "fc_rmsnorm_wide",
    "fc_fused_flat",
    "fc_fused_flat_plain",
    "fc_fused_tree",
    "fc_fused_tree_plain",
];
/// Entry points of window.cu (byte kernels, `(WinArgs)`).
pub const WINDOW_ENTRIES: [&str; 3] = ["fc_win_put", "fc_win_signal", "fc_win_wait"];

/// One element type the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// The type's name (`DataType::name`), also in cache file names.
    pub dtype: &'static str,
    /// The define that selects it in the sources.
    pub define: &'static str,
    /// A float type: it has the low-precision and RMSNorm kernels.
    pub float: bool,
}

/// The element types, in the order the library's `VARIANTS` lists them.
pub const VARIANTS: [Variant; 7] = [
    Variant {
        dtype: "float",
        define: "FC_T_F32",
        float: true,
    },
    Variant {
        dtype: "half",
        define: "FC_T_F16",
        float: true,
    },
    Variant {
        dtype: "bfloat16",
        define: "FC_T_BF16",
        float: true,
    },
    Variant {
        dtype: "int32",
        define: "FC_T_I32",
        float: false,
    },
    Variant {
        dtype: "uint32",
        define: "FC_T_U32",
        float: false,
    },
    Variant {
        dtype: "int64",
        define: "FC_T_I64",
        float: false,
    },
    Variant {
        dtype: "uint64",
        define: "FC_T_U64",
        float: false,
    },
];

/// The variant whose units hold the kernels that do not depend on the element type (the
/// start-up check, byte moves): f32. The host launches them from its module for every dtype.
pub const BYTES_VARIANT: usize = 0;

/// A group of entry points compiled together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// `fc_verify_write` (the start-up check) and `fc_ce_gate` (f32 only).
    Setup,
    /// `fc_<algo>_<op>` for every algorithm, operator `OPS[i]`.
    AllReduce(usize),
    /// `fc_all_gather_*` (f32 only: bytes).
    AllGather,
    /// `fc_all_to_all_*`, the -v and device-count forms (f32 only: bytes).
    AllToAll,
    /// `fc_broadcast_*` (f32 only: bytes).
    Broadcast,
    /// Reduce-scatter and reduce, operator `OPS[i]`.
    Reduce(usize),
    /// The low-precision kernels (float types).
    LowPrecision,
    /// The residual add + RMSNorm and the fused all-reduce + norm (float types).
    RmsNorm,
    /// The window kernels: put, signal, wait (f32 only: bytes).
    Window,
}

impl Group {
    /// Every group, in a fixed order (the index of [`Group::index`]).
    pub const ALL: [Group; 15] = [
        Group::Setup,
        Group::AllReduce(0),
        Group::AllReduce(1),
        Group::AllReduce(2),
        Group::AllReduce(3),
        Group::AllGather,
        Group::AllToAll,
        Group::Broadcast,
        Group::Reduce(0),
        Group::Reduce(1),
        Group::Reduce(2),
        Group::Reduce(3),
        Group::LowPrecision,
        Group::RmsNorm,
        Group::Window,
    ];

    /// The position of this group in [`Group::ALL`].
    pub fn index(self) -> usize {
        match self {
            Group::Setup => 0,
            Group::AllReduce(op) => 1 + op,
            Group::AllGather => 5,
            Group::AllToAll => 6,
            Group::Broadcast => 7,
            Group::Reduce(op) => 8 + op,
            Group::LowPrecision => 12,
            Group::RmsNorm => 13,
            Group::Window => 14,
        }
    }

    /// Its name in messages and cache files (`all_reduce_sum`, `reduce_max`, `lowp`, ...).
    pub fn name(self) -> String {
        match self {
            Group::Setup => "setup".into(),
            Group::AllReduce(op) => format!("all_reduce_{}", OPS[op]),
            Group::AllGather => "all_gather".into(),
            Group::AllToAll => "all_to_all".into(),
            Group::Broadcast => "broadcast".into(),
            Group::Reduce(op) => format!("reduce_{}", OPS[op]),
            Group::LowPrecision => "lowp".into(),
            Group::RmsNorm => "rmsnorm".into(),
            Group::Window => "window".into(),
        }
    }

    /// The define that makes the sources emit this group's entry points.
    pub fn define(self) -> String {
        format!("FC_GROUP_{}", self.name().to_ascii_uppercase())
    }

    /// Which of the `SOURCES` files the group's unit holds, in order: a prefix for the
    /// collectives (each file uses the ones before it), the all-reduce source's helpers and
    /// window.cu for the windows.
    pub fn sources(self) -> &'static [usize] {
        match self {
            Group::Setup | Group::AllReduce(_) => &[0],
            Group::AllGather | Group::AllToAll | Group::Broadcast | Group::Reduce(_) => &[0, 1],
            Group::LowPrecision => &[0, 1, 2],
            Group::RmsNorm => &[0, 1, 2, 3],
            Group::Window => &[0, 4],
        }
    }

    /// Whether variant `v` has this group.
    pub fn applies(self, v: usize) -> bool {
        match self {
            Group::Setup
            | Group::AllGather
            | Group::AllToAll
            | Group::Broadcast
            | Group::Window => v == BYTES_VARIANT,
            Group::LowPrecision | Group::RmsNorm => VARIANTS[v].float,
            Group::AllReduce(_) | Group::Reduce(_) => true,
        }
    }

    /// The oldest architecture the group compiles for (`89`: the FP8 conversions of the
    /// low-precision kernels and of the norm's E4M3 rows are sm_89 instructions).
    pub fn min_arch(self) -> u32 {
        match self {
            Group::LowPrecision | Group::RmsNorm => 89,
            _ => 0,
        }
    }

    /// The entry points of the group.
    pub fn entries(self) -> Vec<String> {
        let with_prefix = |p: &str| {
            COLL_ENTRIES
                .iter()
                .filter(|e| e.starts_with(p))
                .map(|e| e.to_string())
                .collect()
        };
        match self {
            Group::Setup => EXTRA_ENTRIES.iter().map(|e| e.to_string()).collect(),
            Group::AllReduce(op) => ALGOS
                .iter()
                .map(|a| format!("fc_{a}_{}", OPS[op]))
                .collect(),
            Group::AllGather => with_prefix("fc_all_gather_"),
            Group::AllToAll => with_prefix("fc_all_to_all_"),
            Group::Broadcast => with_prefix("fc_broadcast_"),
            Group::Reduce(op) => COLL_OP_ENTRIES
                .iter()
                .map(|p| format!("{p}_{}", OPS[op]))
                .collect(),
            Group::LowPrecision => LOWP_ENTRIES.iter().map(|e| e.to_string()).collect(),
            Group::RmsNorm => RMSNORM_ENTRIES.iter().map(|e| e.to_string()).collect(),
            Group::Window => WINDOW_ENTRIES.iter().map(|e| e.to_string()).collect(),
        }
    }

    /// About how many seconds one core takes to compile the unit to a cubin (NVRTC 13.0,
    /// sm_90, measured on the build machine's x86 cores); for the message before a compile.
    pub fn about_seconds(self) -> u32 {
        match self {
            Group::Setup | Group::Window => 1,
            Group::AllReduce(_) => 4,
            Group::AllGather | Group::Broadcast => 6,
            Group::AllToAll => 25,
            Group::Reduce(_) => 10,
            Group::LowPrecision => 45,
            Group::RmsNorm => 15,
        }
    }
}

/// Every unit: (variant index, group), variants in order, groups in [`Group::ALL`] order.
pub fn units() -> impl Iterator<Item = (usize, Group)> {
    (0..VARIANTS.len()).flat_map(|v| {
        Group::ALL
            .into_iter()
            .filter(move |g| g.applies(v))
            .map(move |g| (v, g))
    })
}

/// The units compiled for `target`: every unit whose group compiles for its architecture.
pub fn units_for(target: &str) -> Vec<(usize, Group)> {
    let n = target_number(target).unwrap_or(0);
    units().filter(|(_, g)| n >= g.min_arch()).collect()
}

/// The full source of a unit.
pub fn unit_source(v: usize, g: Group) -> String {
    let mut s = format!(
        "#define {} 1\n#define {} 1\n",
        VARIANTS[v].define,
        g.define()
    );
    for &i in g.sources() {
        s.push_str(SOURCES[i]);
        s.push('\n');
    }
    s
}

/// The unit's name in messages and errors: `bfloat16 all_reduce_sum`.
pub fn unit_name(v: usize, g: Group) -> String {
    format!("{} {}", VARIANTS[v].dtype, g.name())
}

/// Whether `target` asks for PTX (`compute_90`) rather than a cubin (`sm_90`).
pub fn is_ptx(target: &str) -> bool {
    target.starts_with("compute_")
}

/// The compute capability in a target name (`sm_90` or `compute_90` -> 90, `sm_100` -> 100).
pub fn target_number(target: &str) -> Option<u32> {
    let n = target
        .strip_prefix("sm_")
        .or_else(|| target.strip_prefix("compute_"))?;
    (!n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit()))
        .then(|| n.parse().ok())
        .flatten()
}

/// NVRTC's options for `target` (`sm_90`: a cubin; `compute_90`: PTX).
pub fn options(target: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={target}"),
        "-std=c++17".into(),
        "--device-as-default-execution-space".into(),
    ]
}

/// FNV-1a, 64 bits: enough to key a cache (a collision would need a deliberate attack, and the
/// cache is the user's own directory).
pub fn fnv64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The key of a unit's code for `target`: its source and NVRTC options.
pub fn unit_key(v: usize, g: Group, target: &str) -> u64 {
    let src = unit_source(v, g);
    fnv64(&[src.as_bytes(), options(target).join(" ").as_bytes()])
}

/// The cache file of a unit's code for `target` made by NVRTC `ver`:
/// `<group>-<dtype>-<key>-<target>-nvrtc<major>.<minor>.cubin` (`.ptx` for PTX).
pub fn cache_file(v: usize, g: Group, target: &str, ver: (i32, i32)) -> String {
    format!(
        "{}-nvrtc{}.{}.{}",
        cache_stem(v, g, target),
        ver.0,
        ver.1,
        if is_ptx(target) { "ptx" } else { "cubin" }
    )
}

/// A cache file's name up to its NVRTC version: the same code from any NVRTC starts with it.
pub fn cache_stem(v: usize, g: Group, target: &str) -> String {
    format!(
        "{}-{}-{:016x}-{target}",
        g.name(),
        VARIANTS[v].dtype,
        unit_key(v, g, target)
    )
}
