//! CUDA IPC between the ranks of one host: what a rank sends so that its peers map a buffer
//! of its memory (the IPC handle of the allocation holding it and the buffer's offset in it,
//! rule 7), and the peers' side, which opens each allocation once per process however many
//! buffers of it are mapped (the direct-access staging, and every window registered in it).

use std::collections::HashMap;
use std::sync::Mutex;

use super::peer_staging;
use crate::driver::result::{self, IPC_HANDLE_BYTES};
use crate::error::{Error, Result};

/// Bytes of an export message: the 64-byte handle of the allocation, then the buffer's offset
/// in it (u64, little endian).
pub(crate) const IPC_MSG_BYTES: usize = IPC_HANDLE_BYTES + 8;

/// The message peers need to map the memory at `ptr` of the current context's device: the
/// handle of the allocation that holds it and its offset there. `what` names the memory in
/// errors. Memory legacy IPC cannot share (`cuMemCreate`, the stream-ordered pool) fails
/// here, with the driver's reason.
pub(crate) fn export(ptr: u64, what: &str) -> Result<[u8; IPC_MSG_BYTES]> {
    let (base, _) = result::mem_get_address_range(ptr, &format!("cuMemGetAddressRange of {what}"))?;
    let handle =
        result::ipc_get_mem_handle(base).map_err(|e| Error::Cuda(format!("{e} (of {what})")))?;
    let mut msg = [0u8; IPC_MSG_BYTES];
    msg[..IPC_HANDLE_BYTES].copy_from_slice(&handle);
    msg[IPC_HANDLE_BYTES..].copy_from_slice(&(ptr - base).to_le_bytes());
    Ok(msg)
}

/// Allocations of peers opened in this process: (device, handle) -> (mapped base, bytes from
/// there to the allocation's end, users). One open per allocation: a second
/// `cuIpcOpenMemHandle` of a handle already open in the process is refused by the driver.
type OpenTable = HashMap<(i32, [u8; IPC_HANDLE_BYTES]), (u64, u64, usize)>;
static OPEN: Mutex<Option<OpenTable>> = Mutex::new(None);

/// A buffer of a peer's memory mapped in this process; the allocation closes when its last
/// mapped buffer drops.
pub(crate) struct Opened {
    key: (i32, [u8; IPC_HANDLE_BYTES]),
    /// The buffer's address here.
    pub ptr: u64,
}

/// Maps `bytes` of a peer's memory from its [`export`] message (`who` names it in errors):
/// the offset it sent must leave `bytes` inside the allocation (a forged or corrupt offset
/// would make every access through the mapping stray outside it). The current context's
/// device opens it.
pub(crate) fn open(msg: &[u8], bytes: u64, who: &str) -> Result<Opened> {
    if msg.len() < IPC_MSG_BYTES {
        return Err(Error::Cuda(format!(
            "{who}: a malformed IPC handle ({} bytes)",
            msg.len()
        )));
    }
    let handle: [u8; IPC_HANDLE_BYTES] = msg[..IPC_HANDLE_BYTES]
        .try_into()
        .expect("the message is longer than a handle");
    let off = u64::from_le_bytes(
        msg[IPC_HANDLE_BYTES..IPC_MSG_BYTES]
            .try_into()
            .expect("8 bytes"),
    );
    let key = (result::ctx_get_device()?, handle);
    let mut table = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    let table = table.get_or_insert_with(HashMap::new);
    let (base, size) = match table.get_mut(&key) {
        Some((base, size, users)) => {
            *users += 1;
            (*base, *size)
        }
        None => {
            let (base, size) = open_allocation(&handle, who)?;
            table.insert(key, (base, size, 1));
            (base, size)
        }
    };
    // This use of the mapping, given back when dropped (also on the error below).
    let mut opened = Opened { key, ptr: 0 };
    match peer_staging(base, size, off, bytes) {
        Some(ptr) => {
            // The same value, not a copy: `Opened { ptr, ..opened }` copied the key and dropped
            // `opened`, which closed the mapping it had just opened.
            opened.ptr = ptr;
            Ok(opened)
        }
        // `opened` drops here and gives the allocation back.
        None => Err(Error::Cuda(format!(
            "{who}: an offset of {off} bytes into an allocation of {size} bytes, which cannot \
             hold {bytes} bytes there"
        ))),
    }
}

/// Opens an allocation from its handle: (mapped base, bytes from there to its end).
fn open_allocation(handle: &[u8; IPC_HANDLE_BYTES], who: &str) -> Result<(u64, u64)> {
    // SAFETY: a handle exported by a peer process; closed once, when its last user drops (or
    // just below when its range cannot be read).
    let p = unsafe { result::ipc_open_mem_handle(handle, &format!("cuIpcOpenMemHandle of {who}")) }
        .map_err(|e| {
            Error::Cuda(format!(
                "{e} (ranks must be separate processes on one host with peer access)"
            ))
        })?;
    match result::mem_get_address_range(p, &format!("cuMemGetAddressRange of {who}")) {
        Ok((start, size)) => Ok((p, (size as u64).saturating_sub(p - start.min(p)))),
        Err(e) => {
            // SAFETY: opened just above, closed once; nothing used it.
            let _ = unsafe { result::ipc_close_mem_handle(p) };
            Err(e)
        }
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        let mut table = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        let Some(table) = table.as_mut() else { return };
        let last = match table.get_mut(&self.key) {
            Some((_, _, users)) => {
                *users -= 1;
                *users == 0
            }
            None => false,
        };
        if last {
            if let Some((base, _, _)) = table.remove(&self.key) {
                // SAFETY: opened once by `open_allocation`, closed once, by its last user.
                // An error at teardown has nowhere to go.
                let _ = unsafe { result::ipc_close_mem_handle(base) };
            }
        }
    }
}
