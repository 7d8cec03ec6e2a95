//! Send and receive through per-pair mailboxes.
//!
//! Every ordered pair (src, dst) has its own mailbox of `p2p_bytes`, so pairs never wait on each
//! other. The sender writes a chunk, then bumps `sent` (release); the receiver waits for it
//! (acquire), copies the chunk out, then bumps `acked` (release); the sender writes the next chunk
//! only once `acked == sent`. A message that fits in one chunk is left in the mailbox and `send`
//! returns at once, so two ranks may both send before they receive; larger messages need the
//! receiver to be receiving, as with NCCL. A batch (`batch_send_recv`) moves all its messages
//! at once, a chunk of whichever can move, so its sends and receives never wait on each other;
//! between one pair and direction, messages go in the order given.

use std::sync::atomic::Ordering;

use super::collectives::copy;
use super::sync::{process_alive, Backoff, Stop};
use super::HostBackend;
use crate::backend::P2pOp;
use crate::error::{Error, Result};

/// One message of a batch in progress: the chunks it has moved of how many (a receive learns
/// the count from the first chunk's header) and, for a receive, a size or dtype that differed
/// from the sender's.
struct Moving<'o, 'a> {
    op: &'o P2pOp<'a>,
    k: usize,
    chunks: usize,
    mismatch: Option<Error>,
}

impl HostBackend {
    /// Moves every message of `ops` (see the module comment); `what` names the call in errors.
    pub(super) fn p2p_impl(&self, what: &'static str, ops: &[P2pOp<'_>]) -> Result<()> {
        let _one_at_a_time = self.p2p.lock().unwrap_or_else(|e| e.into_inner());
        let cap = self.seg.layout.p2p_bytes;
        let mut moving: Vec<Moving<'_, '_>> = ops
            .iter()
            .map(|op| Moving {
                op,
                k: 0,
                // A receive learns its count from the first chunk.
                chunks: match op {
                    P2pOp::Send { data, .. } => data.bytes_len().div_ceil(cap).max(1),
                    P2pOp::Recv { .. } => 1,
                },
                mismatch: None,
            })
            .collect();
        let mut backoff = Backoff::new(self.timeout());
        // Only the first unfinished message of each pair and direction may move.
        let mut claimed = vec![[false; 2]; self.world];
        // Set once a wait has failed: the next pass is the last look before the error.
        let mut last_look = false;
        loop {
            let mut moved = false;
            claimed.fill([false; 2]);
            for m in moving.iter_mut().filter(|m| m.k < m.chunks) {
                let dir = usize::from(matches!(m.op, P2pOp::Recv { .. }));
                if std::mem::replace(&mut claimed[m.op.peer()][dir], true) {
                    continue;
                }
                moved |= if dir == 0 {
                    self.send_chunk(m)
                } else {
                    self.recv_chunk(m)
                };
            }
            let Some(waiting) = moving.iter().find(|m| m.k < m.chunks) else {
                break;
            };
            if moved {
                // The timeout bounds each wait for a peer, as for a single message.
                backoff = Backoff::new(self.timeout());
                last_look = false;
                continue;
            }
            let mut pending = moving
                .iter()
                .filter(|m| m.k < m.chunks)
                .map(|m| m.op.peer());
            if let Some(p) = pending
                .clone()
                .find(|&p| self.seg.failed(p).load(Ordering::Relaxed) != 0)
            {
                return Err(self.stop_error(Stop::PeerFailed, what, p));
            }
            if self.aborted.load(Ordering::Relaxed) {
                return Err(self.stop_error(Stop::Aborted, what, waiting.op.peer()));
            }
            let mut dead = None;
            let alive = || {
                dead = pending
                    .find(|&p| !process_alive(self.seg.pid(p).load(Ordering::Relaxed) as u32));
                dead.is_none()
            };
            if let Err(stop) = backoff.pause(alive) {
                if !last_look {
                    // The peer may have published its last chunk and exited between our pass
                    // and the liveness check: what it published still counts, so one more pass.
                    last_look = true;
                    continue;
                }
                return Err(self.stop_error(stop, what, dead.unwrap_or(waiting.op.peer())));
            }
        }
        match moving.into_iter().find_map(|m| m.mismatch) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The next chunk of a send into its mailbox, if the receiver has taken the previous one.
    fn send_chunk(&self, m: &mut Moving<'_, '_>) -> bool {
        let P2pOp::Send { data, peer } = m.op else {
            unreachable!("a send")
        };
        let (seg, me, cap) = (&self.seg, self.rank, self.seg.layout.p2p_bytes);
        let mail = seg.pair(me, *peer);
        // `sent` is written by this rank only.
        let sent = mail.sent.load(Ordering::Relaxed);
        // acquire: the receiver has finished copying the previous chunk out.
        if mail.acked.load(Ordering::Acquire) != sent {
            return false;
        }
        let bytes = data.bytes_len();
        mail.msg_bytes.store(bytes as u64, Ordering::Relaxed);
        mail.msg_dtype
            .store(data.dtype().code() as u64, Ordering::Relaxed);
        let len = (bytes - m.k * cap).min(cap);
        // SAFETY: the view holds `bytes` bytes; the mailbox is ours until `sent` moves (the
        // receiver finished with it: acked == sent).
        unsafe { copy(data.ptr().add(m.k * cap), seg.pair_data(me, *peer), len) };
        // release: the chunk and its header before the count that announces them.
        mail.sent.store(sent + 1, Ordering::Release);
        m.k += 1;
        true
    }

    /// The next chunk of a receive out of its mailbox, if the sender has put it there. On a
    /// size or dtype that differs from the sender's the message is drained chunk by chunk
    /// unread, so the sender does not hang, and the receive fails.
    fn recv_chunk(&self, m: &mut Moving<'_, '_>) -> bool {
        let P2pOp::Recv { out, peer } = m.op else {
            unreachable!("a receive")
        };
        let (seg, me, cap) = (&self.seg, self.rank, self.seg.layout.p2p_bytes);
        let mail = seg.pair(*peer, me);
        // `acked` is written by this rank only.
        let acked = mail.acked.load(Ordering::Relaxed);
        // acquire: the sender's chunk and header are visible.
        if mail.sent.load(Ordering::Acquire) <= acked {
            return false;
        }
        let bytes = out.bytes_len();
        if m.k == 0 {
            let their_bytes = mail.msg_bytes.load(Ordering::Relaxed) as usize;
            let their_dtype = mail.msg_dtype.load(Ordering::Relaxed) as u8;
            m.chunks = their_bytes.div_ceil(cap).max(1);
            if their_bytes != bytes || their_dtype != out.dtype().code() {
                let theirs = crate::types::DataType::from_code(their_dtype)
                    .map_or("?".to_string(), |d| d.to_string());
                m.mismatch = Some(Error::Mismatch {
                    seq: 0,
                    rank: me,
                    mine: format!("recv of {bytes} bytes of {} from rank {peer}", out.dtype()),
                    peer: *peer,
                    theirs: format!("send of {their_bytes} bytes of {theirs} to rank {me}"),
                });
            }
        }
        if m.mismatch.is_none() {
            let len = (bytes - m.k * cap).min(cap);
            // SAFETY: the sender does not touch the mailbox until we ack; the output holds
            // `bytes` bytes and no one else writes it meanwhile.
            unsafe { copy(seg.pair_data(*peer, me), out.ptr().add(m.k * cap), len) };
        }
        // release: we are done reading the mailbox.
        mail.acked.store(acked + 1, Ordering::Release);
        m.k += 1;
        true
    }
}
