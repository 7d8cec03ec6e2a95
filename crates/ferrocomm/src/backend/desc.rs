//! A call described by plain values ([`CallDesc`]): what a binding hands over (the Python
//! package describes each call once, as a tuple of names, addresses and numbers), and the one
//! place that turns such a description into a [`CallKind`] ([`CallDesc::kind`]).

use std::fmt;
use std::str::FromStr;

use super::{CallKind, CallOpts, DeviceCounts, P2pOp, PackedCounts, Splits};
use crate::error::{Error, Result};
use crate::plan::Collective;
use crate::rmsnorm::{AllReduceRmsNorm, Fp8Rows, Fp8Scale};
use crate::types::{DataType, Device, ReduceOp};
use crate::view::{Input, View, ViewMut};

/// A buffer as plain values: its address, element count, element type and device, as a binding
/// receives them for a numpy array or a torch tensor (`data_ptr()`, `numel()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawBuf {
    ptr: u64,
    count: usize,
    dtype: DataType,
    device: Device,
}

impl RawBuf {
    /// A buffer of `count` elements of `dtype` at `ptr` on `device`. Refused: a null address
    /// with elements, and a size or an end address that does not fit the address space (the
    /// numbers come from a caller ferrocomm cannot see behind).
    pub fn new(ptr: u64, count: usize, dtype: DataType, device: Device) -> Result<RawBuf> {
        if ptr == 0 && count > 0 {
            return Err(Error::InvalidArgument(format!(
                "a buffer of {count} {dtype} elements at the null address"
            )));
        }
        let end = count
            .checked_mul(dtype.size())
            .filter(|&bytes| bytes <= isize::MAX as usize)
            .and_then(|bytes| ptr.checked_add(bytes as u64));
        if end.is_none() {
            return Err(Error::InvalidArgument(format!(
                "a buffer of {count} {dtype} elements at {ptr:#x} runs past the address space"
            )));
        }
        Ok(RawBuf {
            ptr,
            count,
            dtype,
            device,
        })
    }

    /// The buffer as a [`View`], for the calls no [`CallDesc`] describes (a window's put, the
    /// persistent all-gather's input).
    ///
    /// # Safety
    /// `ptr` holds `count` readable elements on `device`, valid and unmodified for `'a` (for
    /// CUDA: until the call's work on its stream has finished).
    pub unsafe fn view<'a>(&self) -> View<'a> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { View::from_raw(self.ptr as *const u8, self.count, self.dtype, self.device) }
    }

    /// The buffer as a [`ViewMut`] (a window's registered buffer, the persistent all-gather's
    /// output).
    ///
    /// # Safety
    /// As for [`RawBuf::view`], writable, and nothing else accesses the memory for `'a`.
    pub unsafe fn view_mut<'a>(&self) -> ViewMut<'a> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { ViewMut::from_raw(self.ptr as *mut u8, self.count, self.dtype, self.device) }
    }
}

/// The calls a [`CallDesc`] can name, spelled as bindings and error messages spell them
/// ([`CallName::name`], parsed back by [`FromStr`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallName {
    /// `all_reduce`.
    AllReduce,
    /// `reduce`.
    Reduce,
    /// `broadcast`.
    Broadcast,
    /// `all_gather`.
    AllGather,
    /// `reduce_scatter`.
    ReduceScatter,
    /// `all_to_all`.
    AllToAll,
    /// `all_to_all_v`.
    AllToAllV,
    /// `all_to_all_v_dynamic` (counts in device memory, a capacity per sender).
    AllToAllVDynamic,
    /// `all_to_all_v_dynamic_packed` (both sides' counts in device memory, output packed).
    AllToAllVDynamicPacked,
    /// `barrier`.
    Barrier,
    /// `send`.
    Send,
    /// `recv`.
    Recv,
    /// `batch_send_recv`.
    BatchSendRecv,
    /// `all_reduce_rmsnorm`, the fused all-reduce + residual add + RMSNorm.
    AllReduceRmsNorm,
}

impl CallName {
    /// Every call, in declaration order.
    pub const ALL: [CallName; 14] = [
        CallName::AllReduce,
        CallName::Reduce,
        CallName::Broadcast,
        CallName::AllGather,
        CallName::ReduceScatter,
        CallName::AllToAll,
        CallName::AllToAllV,
        CallName::AllToAllVDynamic,
        CallName::AllToAllVDynamicPacked,
        CallName::Barrier,
        CallName::Send,
        CallName::Recv,
        CallName::BatchSendRecv,
        CallName::AllReduceRmsNorm,
    ];

    /// The call's name (`all_reduce`, `all_to_all_v_dynamic`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            CallName::AllReduce => "all_reduce",
            CallName::Reduce => "reduce",
            CallName::Broadcast => "broadcast",
            CallName::AllGather => "all_gather",
            CallName::ReduceScatter => "reduce_scatter",
            CallName::AllToAll => "all_to_all",
            CallName::AllToAllV => "all_to_all_v",
            CallName::AllToAllVDynamic => "all_to_all_v_dynamic",
            CallName::AllToAllVDynamicPacked => "all_to_all_v_dynamic_packed",
            CallName::Barrier => "barrier",
            CallName::Send => "send",
            CallName::Recv => "recv",
            CallName::BatchSendRecv => "batch_send_recv",
            CallName::AllReduceRmsNorm => crate::rmsnorm::NAME,
        }
    }

    /// Whether the call is point to point (a send, a receive, a batch of them): not numbered
    /// among the collective calls, and never refused for the peers (a send/recv mismatch is
    /// found by the pair itself).
    pub const fn is_p2p(self) -> bool {
        matches!(
            self,
            CallName::Send | CallName::Recv | CallName::BatchSendRecv
        )
    }

    /// The collective as the planner names it: the device-count calls are all-to-all-v's, a
    /// batch is planned as its sends, the fused call as the all-reduce it starts with.
    pub const fn collective(self) -> Collective {
        match self {
            CallName::AllReduce | CallName::AllReduceRmsNorm => Collective::AllReduce,
            CallName::Reduce => Collective::Reduce,
            CallName::Broadcast => Collective::Broadcast,
            CallName::AllGather => Collective::AllGather,
            CallName::ReduceScatter => Collective::ReduceScatter,
            CallName::AllToAll => Collective::AllToAll,
            CallName::AllToAllV | CallName::AllToAllVDynamic | CallName::AllToAllVDynamicPacked => {
                Collective::AllToAllV
            }
            CallName::Barrier => Collective::Barrier,
            CallName::Send | CallName::BatchSendRecv => Collective::Send,
            CallName::Recv => Collective::Recv,
        }
    }
}

impl fmt::Display for CallName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CallName {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        CallName::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| Error::InvalidArgument(format!("unknown collective '{s}'")))
    }
}

/// The counts of the device-count all-to-all-v calls ([`DeviceCounts`], [`PackedCounts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountsDesc {
    /// Units this rank sends to each rank.
    pub send: RawBuf,
    /// Units received from each rank (written by `all_to_all_v_dynamic`, read by the packed
    /// call).
    pub recv: RawBuf,
    /// Output units per sender (`all_to_all_v_dynamic`; unused by the packed call).
    pub capacity: usize,
    /// Elements per unit.
    pub unit: usize,
}

/// The fused call's operands beside `x` and `out` ([`AllReduceRmsNorm`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormDesc {
    /// The residual, or `None` when it is in `residual_out` (in place).
    pub residual: Option<RawBuf>,
    /// Receives the sum plus the residual.
    pub residual_out: RawBuf,
    /// The norm's weight.
    pub weight: RawBuf,
    /// Added to the mean square.
    pub eps: f32,
    /// The FP8 rows, when asked for.
    pub fp8: Option<Fp8Desc>,
}

/// The fused call's FP8 outputs ([`Fp8Rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8Desc {
    /// The E4M3 codes, written.
    pub codes: RawBuf,
    /// The scales: one per row, written; or with `given` one scale for the tensor, read.
    pub scale: RawBuf,
    /// Whether `scale` is given ([`Fp8Scale::Given`]) rather than computed per row.
    pub given: bool,
}

/// One call described by plain values, as a binding builds it once from the caller's
/// arguments: which call, its buffers, its operator and peer, the splits, counts, batch or norm
/// operands of the calls that have them, and its options. Owned and `Send`, so a binding may
/// run it on another thread. [`CallDesc::kind`] turns it into the [`CallKind`] the communicator
/// checks and runs ([`crate::Communicator::run_desc`]).
#[derive(Debug, Clone)]
pub struct CallDesc {
    /// Which call.
    pub name: CallName,
    /// The buffer the call writes (a recv's, the fused call's `out`); `None` for the barrier
    /// and the batch, whose buffers are in `batch`.
    pub output: Option<RawBuf>,
    /// The separate input (a send's data, the fused call's `x`); `None`: in place, the
    /// output is the input.
    pub input: Option<RawBuf>,
    /// The reduction of the reducing calls.
    pub op: ReduceOp,
    /// The root (reduce, broadcast) or the peer (send, recv).
    pub peer: usize,
    /// The all-to-all-v's counts and displacements.
    pub splits: Option<Splits>,
    /// The device-count all-to-all-v calls' counts.
    pub counts: Option<CountsDesc>,
    /// The batch's operations in order: (send?, buffer, peer).
    pub batch: Vec<(bool, RawBuf, usize)>,
    /// The fused call's other operands.
    pub norm: Option<NormDesc>,
    /// The call's options (stream, algorithm, low precision, timeout).
    pub opts: CallOpts,
}

impl CallDesc {
    /// A description of `name` with no buffers, a Sum, peer 0 and default options: the fields
    /// a call needs are set on it.
    pub fn new(name: CallName) -> CallDesc {
        CallDesc {
            name,
            output: None,
            input: None,
            op: ReduceOp::Sum,
            peer: 0,
            splits: None,
            counts: None,
            batch: Vec::new(),
            norm: None,
            opts: CallOpts::default(),
        }
    }

    /// The [`CallKind`] this description names, its views made from the raw buffers; an error
    /// names an operand the call needs and the description lacks. Its arguments are not checked
    /// yet ([`CallKind::check`] does).
    ///
    /// # Safety
    /// Every buffer must hold its elements on its device, readable, and writable where the call
    /// writes it (`output`, a batch's receives, the device counts' `recv`, the fused call's
    /// outputs), valid until the call is complete (for CUDA: until its work on the stream has
    /// finished), and nothing else may access the written buffers meanwhile.
    pub unsafe fn kind(&self) -> Result<CallKind<'_>> {
        let c = self.name.name();
        let missing = |what: &str| Error::InvalidArgument(format!("{c}: no {what} given"));
        let (op, peer) = (self.op, self.peer);
        // SAFETY: every view is made of a buffer of this description, which the caller's
        // contract keeps valid (and unaliased where written) for the call.
        unsafe {
            let output = || -> Result<ViewMut<'_>> {
                let o = self
                    .output
                    .as_ref()
                    .ok_or_else(|| missing("output buffer"))?;
                Ok(o.view_mut())
            };
            let input = |b: &Option<RawBuf>| match b {
                Some(b) => Input::Buf(b.view()),
                None => Input::InPlace,
            };
            let separate = || -> Result<View<'_>> {
                let i = self.input.as_ref().ok_or_else(|| missing("input buffer"))?;
                Ok(i.view())
            };
            let counts = || self.counts.as_ref().ok_or_else(|| missing("counts"));
            Ok(match self.name {
                CallName::AllReduce => CallKind::AllReduce {
                    input: input(&self.input),
                    output: output()?,
                    op,
                },
                CallName::Reduce => CallKind::Reduce {
                    input: input(&self.input),
                    output: output()?,
                    op,
                    root: peer,
                },
                CallName::Broadcast => CallKind::Broadcast {
                    input: input(&self.input),
                    output: output()?,
                    root: peer,
                },
                CallName::AllGather => CallKind::AllGather {
                    input: input(&self.input),
                    output: output()?,
                },
                CallName::ReduceScatter => CallKind::ReduceScatter {
                    input: input(&self.input),
                    output: output()?,
                    op,
                },
                CallName::AllToAll => CallKind::AllToAll {
                    input: input(&self.input),
                    output: output()?,
                },
                CallName::AllToAllV => CallKind::AllToAllV {
                    input: input(&self.input),
                    output: output()?,
                    splits: self.splits.as_ref().ok_or_else(|| missing("splits"))?,
                },
                CallName::AllToAllVDynamic => {
                    let n = counts()?;
                    CallKind::AllToAllVDynamic {
                        input: separate()?,
                        output: output()?,
                        counts: DeviceCounts {
                            send: n.send.view(),
                            recv: n.recv.view_mut(),
                            capacity: n.capacity,
                            unit: n.unit,
                        },
                    }
                }
                CallName::AllToAllVDynamicPacked => {
                    let n = counts()?;
                    CallKind::AllToAllVDynamicPacked {
                        input: separate()?,
                        output: output()?,
                        counts: PackedCounts {
                            send: n.send.view(),
                            recv: n.recv.view(),
                            unit: n.unit,
                        },
                    }
                }
                CallName::Barrier => CallKind::Barrier,
                CallName::Send => CallKind::Send {
                    data: separate()?,
                    peer,
                },
                CallName::Recv => CallKind::Recv {
                    out: output()?,
                    peer,
                },
                CallName::BatchSendRecv => CallKind::BatchSendRecv {
                    ops: self
                        .batch
                        .iter()
                        .map(|&(send, b, peer)| {
                            if send {
                                P2pOp::Send {
                                    data: b.view(),
                                    peer,
                                }
                            } else {
                                P2pOp::Recv {
                                    out: b.view_mut(),
                                    peer,
                                }
                            }
                        })
                        .collect(),
                },
                CallName::AllReduceRmsNorm => {
                    let n = self.norm.as_ref().ok_or_else(|| missing("norm operands"))?;
                    CallKind::AllReduceRmsNorm(AllReduceRmsNorm {
                        x: input(&self.input),
                        out: output()?,
                        residual: input(&n.residual),
                        residual_out: n.residual_out.view_mut(),
                        weight: n.weight.view(),
                        eps: n.eps,
                        fp8: n.fp8.map(|q| Fp8Rows {
                            codes: q.codes.view_mut(),
                            scale: if q.given {
                                Fp8Scale::Given(q.scale.view())
                            } else {
                                Fp8Scale::PerRow(q.scale.view_mut())
                            },
                        }),
                    })
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_and_names_its_kind() {
        let mut data = [0f32; 16];
        let mut counts = [0i32; 2];
        let buf = |p: &mut [f32]| {
            RawBuf::new(p.as_mut_ptr() as u64, p.len(), DataType::F32, Device::Host).unwrap()
        };
        let (a, b) = data.split_at_mut(8);
        let (a, b) = (buf(a), buf(b));
        let c = RawBuf::new(counts.as_mut_ptr() as u64, 2, DataType::I32, Device::Host).unwrap();
        for name in CallName::ALL {
            assert_eq!(name.name().parse::<CallName>().unwrap(), name);
            let mut d = CallDesc::new(name);
            d.output = Some(a);
            d.input = Some(b);
            d.splits = Some(Splits::packed(vec![4, 4], vec![4, 4]));
            d.counts = Some(CountsDesc {
                send: c,
                recv: c,
                capacity: 4,
                unit: 1,
            });
            d.batch = vec![(true, a, 1), (false, b, 1)];
            d.norm = Some(NormDesc {
                residual: None,
                residual_out: b,
                weight: a,
                eps: 1e-6,
                fp8: None,
            });
            // SAFETY: the buffers above outlive the kinds, which are only inspected.
            let kind = unsafe { d.kind() }.unwrap();
            assert_eq!(kind.name(), name, "{name}");
            assert_eq!(kind.collective(), name.collective(), "{name}");
        }
        let e = "gather".parse::<CallName>().unwrap_err().to_string();
        assert!(e.contains("unknown collective 'gather'"), "{e}");
    }

    #[test]
    fn a_missing_operand_is_named() {
        for (name, what) in [
            (CallName::AllReduce, "no output buffer"),
            (CallName::Send, "no input buffer"),
            (CallName::AllToAllV, "no output buffer"),
            (CallName::AllToAllVDynamic, "no counts"),
            (CallName::AllReduceRmsNorm, "no norm operands"),
        ] {
            let mut d = CallDesc::new(name);
            if name == CallName::AllToAllVDynamic {
                let mut v = [0f32; 4];
                let b = RawBuf::new(v.as_mut_ptr() as u64, 4, DataType::F32, Device::Host);
                d.output = Some(b.unwrap());
            }
            // SAFETY: no buffer is given, none is made.
            let e = unsafe { d.kind() }.unwrap_err().to_string();
            assert!(e.contains(&format!("{name}: {what}")), "{name}: {e}");
        }
    }

    #[test]
    fn raw_buffers_stay_inside_the_address_space() {
        let f32 = DataType::F32;
        assert!(RawBuf::new(0, 0, f32, Device::Host).is_ok());
        let e = RawBuf::new(0, 1, f32, Device::Host)
            .unwrap_err()
            .to_string();
        assert!(e.contains("null address"), "{e}");
        for (ptr, count) in [
            (16, usize::MAX / 2),
            (16, usize::MAX),
            (u64::MAX - 8, 4),
            (16, isize::MAX as usize / 4 + 1),
        ] {
            let e = RawBuf::new(ptr, count, f32, Device::Cuda(0)).unwrap_err();
            assert!(e.to_string().contains("past the address space"), "{e}");
        }
        assert!(RawBuf::new(u64::MAX - 8, 2, f32, Device::Cuda(0)).is_ok());
    }
}
