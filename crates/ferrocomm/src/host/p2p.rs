//! Send and receive through per-pair mailboxes.
//!
//! Every ordered pair (src, dst) has its own mailbox of `p2p_bytes`, so pairs never wait on each
//! other. The sender writes a chunk, then bumps `sent` (release); the receiver waits for it
//! (acquire), copies the chunk out, then bumps `acked` (release); the sender writes the next chunk
//! only once `acked == sent`. A message that fits in one chunk is left in the mailbox and `send`
//! returns at once, so two ranks may both send before they receive; larger messages need the
//! receiver to be receiving, as with NCCL.

use std::sync::atomic::Ordering;

use super::collectives::copy;
use super::HostBackend;
use crate::error::{Error, Result};
use crate::select::Collective;
use crate::types::Device;
use crate::view::{View, ViewMut};

fn host_only(coll: Collective, d: Device) -> Result<()> {
    if d == Device::Host {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{}: the host backend needs host buffers, got one on {d}",
            coll.name()
        )))
    }
}

impl HostBackend {
    pub(super) fn send_impl(&self, data: View<'_>, peer: usize) -> Result<()> {
        let coll = Collective::Send;
        host_only(coll, data.device())?;
        let _one_at_a_time = self.p2p.lock().unwrap_or_else(|e| e.into_inner());
        let (seg, me) = (&self.seg, self.rank);
        let cap = seg.layout.p2p_bytes;
        let bytes = data.bytes_len();
        let mail = seg.pair(me, peer);
        let chunks = bytes.div_ceil(cap).max(1);
        for k in 0..chunks {
            // `sent` is written by this rank only.
            let sent = mail.sent.load(Ordering::Relaxed);
            // acquire: the receiver has finished copying the previous chunk out.
            self.wait_on(peer, || mail.acked.load(Ordering::Acquire) == sent)
                .map_err(|stop| self.stop_error(stop, coll, peer))?;
            mail.msg_bytes.store(bytes as u64, Ordering::Relaxed);
            mail.msg_dtype
                .store(data.dtype().code() as u64, Ordering::Relaxed);
            let len = (bytes - k * cap).min(cap);
            // SAFETY: the view holds `bytes` bytes; the mailbox is ours until `sent` moves
            // (the receiver finished with it: acked == sent).
            unsafe { copy(data.ptr().add(k * cap), seg.pair_data(me, peer), len) };
            // release: the chunk and its header before the count that announces them.
            mail.sent.store(sent + 1, Ordering::Release);
        }
        Ok(())
    }

    pub(super) fn recv_impl(&self, out: ViewMut<'_>, peer: usize) -> Result<()> {
        let coll = Collective::Recv;
        host_only(coll, out.device())?;
        let _one_at_a_time = self.p2p.lock().unwrap_or_else(|e| e.into_inner());
        let (seg, me) = (&self.seg, self.rank);
        let cap = seg.layout.p2p_bytes;
        let bytes = out.bytes_len();
        let mail = seg.pair(peer, me);
        let mut k = 0;
        let mut chunks = 1;
        let mut mismatch = None;
        while k < chunks {
            // `acked` is written by this rank only.
            let acked = mail.acked.load(Ordering::Relaxed);
            // acquire: the sender's chunk and header are visible.
            self.wait_on(peer, || mail.sent.load(Ordering::Acquire) > acked)
                .map_err(|stop| self.stop_error(stop, coll, peer))?;
            let their_bytes = mail.msg_bytes.load(Ordering::Relaxed) as usize;
            let their_dtype = mail.msg_dtype.load(Ordering::Relaxed) as u8;
            if k == 0 {
                chunks = their_bytes.div_ceil(cap).max(1);
                if their_bytes != bytes || their_dtype != out.dtype().code() {
                    let theirs = crate::types::DataType::from_code(their_dtype)
                        .map_or("?".to_string(), |d| d.to_string());
                    mismatch = Some(Error::Mismatch {
                        seq: 0,
                        rank: me,
                        mine: format!("recv of {bytes} bytes of {} from rank {peer}", out.dtype()),
                        peer,
                        theirs: format!("send of {their_bytes} bytes of {theirs} to rank {me}"),
                    });
                }
            }
            if mismatch.is_none() {
                let len = (bytes - k * cap).min(cap);
                // SAFETY: the sender does not touch the mailbox until we ack; the output holds
                // `bytes` bytes and is ours.
                unsafe { copy(seg.pair_data(peer, me), out.ptr().add(k * cap), len) };
            }
            // release: we are done reading the mailbox. On a mismatch the message is drained
            // chunk by chunk, so the sender does not hang.
            mail.acked.store(acked + 1, Ordering::Release);
            k += 1;
        }
        match mismatch {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
