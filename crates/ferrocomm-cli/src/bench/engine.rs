//! Where a rank's buffers live and how it times work: host memory with `Instant`, or a GPU with
//! device buffers, one stream, CUDA events and CUDA graphs (see `gpu.rs`).

use std::time::Instant;

use ferrocomm::Device;

/// Work to time or capture: issues one or more collectives.
pub type Work<'a> = dyn FnMut() -> anyhow::Result<()> + 'a;

/// Bytes of the counts buffer beside a rank's data buffers: two i64 counts per rank (send and
/// receive) for worlds up to 1024 ranks.
pub const COUNTS_BYTES: usize = 2 * 8 * 1024;

/// A captured graph of operations that can be replayed.
pub trait Replay {
    fn launch(&self) -> anyhow::Result<()>;
}

/// A rank's input and output buffers and its clock.
pub trait Engine {
    fn device(&self) -> Device;
    /// The stream collectives go on (0 on the host).
    fn stream(&self) -> u64;
    fn in_ptr(&self) -> *mut u8;
    fn out_ptr(&self) -> *mut u8;
    /// Four zeroed bytes of device memory for the line-up before a measurement (GPU only).
    fn scratch(&self) -> Option<*mut u8> {
        None
    }
    /// [`COUNTS_BYTES`] in the buffers' memory for a call's counts (the device-count
    /// all-to-all-v).
    fn counts_ptr(&self) -> *mut u8;
    fn upload_in(&mut self, bytes: &[u8]) -> anyhow::Result<()>;
    fn upload_out(&mut self, bytes: &[u8]) -> anyhow::Result<()>;
    fn upload_counts(&mut self, bytes: &[u8]) -> anyhow::Result<()>;
    fn download_out(&mut self, bytes: &mut [u8]) -> anyhow::Result<()>;
    /// Waits for everything issued so far.
    fn sync(&self) -> anyhow::Result<()>;
    /// Seconds the work took, from its first issue to its completion.
    fn time(&self, work: &mut Work<'_>) -> anyhow::Result<f64>;
    /// Captures `work` into a replayable graph (GPU only).
    fn capture(&self, work: &mut Work<'_>) -> anyhow::Result<Box<dyn Replay>>;
}

/// Host buffers; collectives on the host backend return when done, so `Instant` times them.
/// The output lies in shared memory, so that `put` can register it in a window.
pub struct HostEngine {
    // u64 storage keeps every element type aligned (the shared output is page-aligned).
    input: Vec<u64>,
    output: ferrocomm::SharedMem,
    counts: Vec<u64>,
}

impl HostEngine {
    pub fn new(in_bytes: usize, out_bytes: usize) -> anyhow::Result<Self> {
        Ok(HostEngine {
            input: vec![0; in_bytes.div_ceil(8).max(1)],
            output: ferrocomm::SharedMem::new(out_bytes.max(8))?,
            counts: vec![0; COUNTS_BYTES / 8],
        })
    }

    /// The output's bytes.
    fn output_bytes(&mut self) -> &mut [u8] {
        // SAFETY: the shared memory is `len()` bytes, mapped as long as the engine lives; the
        // bench touches it only between collectives (and a window's peers write into it only
        // inside one, which the bench has waited for).
        unsafe { std::slice::from_raw_parts_mut(self.output.as_mut_ptr(), self.output.len()) }
    }
}

fn copy_into(dst: &mut [u64], src: &[u8], what: &str) -> anyhow::Result<()> {
    let d: &mut [u8] = bytemuck::cast_slice_mut(dst);
    anyhow::ensure!(
        src.len() <= d.len(),
        "{what}: {} bytes do not fit the {}-byte buffer",
        src.len(),
        d.len()
    );
    d[..src.len()].copy_from_slice(src);
    Ok(())
}

impl Engine for HostEngine {
    fn device(&self) -> Device {
        Device::Host
    }
    fn stream(&self) -> u64 {
        0
    }
    fn in_ptr(&self) -> *mut u8 {
        self.input.as_ptr() as *mut u8
    }
    fn out_ptr(&self) -> *mut u8 {
        self.output.as_mut_ptr()
    }
    fn counts_ptr(&self) -> *mut u8 {
        self.counts.as_ptr() as *mut u8
    }
    fn upload_in(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        copy_into(&mut self.input, bytes, "input")
    }
    fn upload_counts(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        copy_into(&mut self.counts, bytes, "counts")
    }
    fn upload_out(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let d = self.output_bytes();
        anyhow::ensure!(
            bytes.len() <= d.len(),
            "output: {} bytes do not fit the {}-byte buffer",
            bytes.len(),
            d.len()
        );
        d[..bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
    fn download_out(&mut self, bytes: &mut [u8]) -> anyhow::Result<()> {
        bytes.copy_from_slice(&self.output_bytes()[..bytes.len()]);
        Ok(())
    }
    fn sync(&self) -> anyhow::Result<()> {
        Ok(())
    }
    fn time(&self, work: &mut Work<'_>) -> anyhow::Result<f64> {
        let t = Instant::now();
        work()?;
        Ok(t.elapsed().as_secs_f64())
    }
    fn capture(&self, _work: &mut Work<'_>) -> anyhow::Result<Box<dyn Replay>> {
        anyhow::bail!("CUDA graph mode (-G) needs a GPU; the host backend runs eager or --isolated")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffers_round_trip_and_time() {
        let mut e = HostEngine::new(12, 16).unwrap();
        e.upload_out(&[1, 2, 3]).unwrap();
        let mut b = [0u8; 3];
        e.download_out(&mut b).unwrap();
        assert_eq!(b, [1, 2, 3]);
        assert!(e.upload_in(&[0; 17]).is_err());
        assert_eq!(e.in_ptr() as usize % 8, 0);
        let t = e
            .time(&mut || {
                std::thread::sleep(std::time::Duration::from_millis(2));
                Ok(())
            })
            .unwrap();
        assert!(t >= 0.002);
        assert!(e.capture(&mut || Ok(())).is_err());
    }
}
