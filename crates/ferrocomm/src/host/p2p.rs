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
//!
//! A size or dtype that differs between a send and its receive fails both: the receiver posts
//! what it expects when it starts waiting, and a sender that comes later compares; a sender
//! that came first (its message buffered, its send returned) learns it from the receiver's
//! refusal at its next send or receive with that peer (which moves its own messages first).

use std::sync::atomic::Ordering;

use super::collectives::copy;
use super::sync::{Backoff, Stop};
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
    /// A send's message number in its mailbox (its first chunk's number + 1; 0 until sent).
    key: u64,
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
                key: 0,
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
                dead = pending.find(|&p| self.peers.gone(p));
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
        // A send the receiver refused while it took the chunks (it was there: a message of
        // several chunks, or one it was waiting for) fails here too.
        for m in moving.iter_mut() {
            if let (P2pOp::Send { data, peer }, None) = (m.op, &m.mismatch) {
                let mail = self.seg.pair(self.rank, *peer);
                if m.key != 0 && mail.refused.load(Ordering::Acquire) == m.key {
                    self.p2p_refused_seen
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())[*peer] = m.key;
                    m.mismatch = Some(Error::Mismatch {
                        seq: 0,
                        rank: self.rank,
                        mine: format!(
                            "send of {} bytes of {} to rank {peer}",
                            data.bytes_len(),
                            data.dtype()
                        ),
                        peer: *peer,
                        theirs: format!(
                            "recv of {} bytes from rank {}",
                            mail.refused_bytes.load(Ordering::Relaxed),
                            self.rank
                        ),
                    });
                }
            }
        }
        if let Some(e) = moving.into_iter().find_map(|m| m.mismatch) {
            return Err(e);
        }
        // An earlier send, buffered before its receive existed, that the receive refused: this
        // call's messages have moved (the peers are not left waiting), and it reports that one.
        for op in ops {
            self.check_refused(what, op.peer())?;
        }
        Ok(())
    }

    /// An earlier send of this rank to `peer` that the receiver refused (its size or dtype
    /// differed from the receive's), reported once.
    fn check_refused(&self, what: &'static str, peer: usize) -> Result<()> {
        let mail = self.seg.pair(self.rank, peer);
        let r = mail.refused.load(Ordering::Acquire);
        let mut seen = self
            .p2p_refused_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if r == 0 || seen.get(peer).copied() == Some(r) {
            return Ok(());
        }
        if let Some(s) = seen.get_mut(peer) {
            *s = r;
        }
        Err(Error::InvalidArgument(format!(
            "{what} on rank {}: an earlier send to rank {peer} was refused by its receive, which \
             expected {} bytes (sizes or dtypes of a send and its receive differ)",
            self.rank,
            mail.refused_bytes.load(Ordering::Relaxed)
        )))
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
        if m.k == 0 {
            m.key = sent + 1;
            // A receive already waiting for this message: both fail on a size or dtype that
            // differs (the message still goes, drained unread by the receiver).
            if mail.expect.load(Ordering::Acquire) == sent + 1 {
                let (want, wd) = (
                    mail.expect_bytes.load(Ordering::Relaxed) as usize,
                    mail.expect_dtype.load(Ordering::Relaxed) as u8,
                );
                if want != bytes || wd != data.dtype().code() {
                    let theirs = crate::types::DataType::from_code(wd)
                        .map_or("?".to_string(), |d| d.to_string());
                    m.mismatch = Some(Error::Mismatch {
                        seq: 0,
                        rank: me,
                        mine: format!("send of {bytes} bytes of {} to rank {peer}", data.dtype()),
                        peer: *peer,
                        theirs: format!("recv of {want} bytes of {theirs} from rank {me}"),
                    });
                    // Reported here: the receiver's refusal of it is not news at the next call.
                    if let Some(s) = self
                        .p2p_refused_seen
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_mut(*peer)
                    {
                        *s = sent + 1;
                    }
                }
            }
        }
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
        let bytes = out.bytes_len();
        if m.k == 0 && mail.expect.load(Ordering::Relaxed) != acked + 1 {
            // What this receive expects, for a sender that comes later (release: the size
            // and dtype before the number that announces them).
            mail.expect_bytes.store(bytes as u64, Ordering::Relaxed);
            mail.expect_dtype
                .store(out.dtype().code() as u64, Ordering::Relaxed);
            mail.expect.store(acked + 1, Ordering::Release);
        }
        // acquire: the sender's chunk and header are visible.
        if mail.sent.load(Ordering::Acquire) <= acked {
            return false;
        }
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
                // For a sender that returned already (release: the size before the number).
                mail.refused_bytes.store(bytes as u64, Ordering::Relaxed);
                mail.refused.store(acked + 1, Ordering::Release);
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
