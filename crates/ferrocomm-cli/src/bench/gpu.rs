//! The GPU engine: device buffers allocated with `cuMemAlloc`, one non-blocking stream that
//! every collective goes on, CUDA events for timing, and stream capture into CUDA graphs.
//!
//! Everything CUDA-specific of the bench is here.

use std::sync::Arc;

use anyhow::Context;
use cudarc::driver::{result, CudaContext, CudaEvent, CudaGraph, CudaStream};
use ferrocomm::driver::{self, CaptureMode, EventFlags, GraphInstantiateFlags};
use ferrocomm::Device;

use super::engine::{Engine, Replay, Work, COUNTS_BYTES};

pub struct CudaEngine {
    ordinal: u32,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    input: u64,
    output: u64,
    scratch: u64,
    counts: u64,
    in_bytes: usize,
    out_bytes: usize,
    start: CudaEvent,
    stop: CudaEvent,
}

fn cuda<T>(r: Result<T, result::DriverError>, what: &str) -> anyhow::Result<T> {
    r.map_err(|e| anyhow::anyhow!("CUDA: {what}: {e}"))
}

impl CudaEngine {
    /// Buffers of the given sizes on GPU `ordinal`.
    pub fn new(ordinal: u32, in_bytes: usize, out_bytes: usize) -> anyhow::Result<Self> {
        // The bench never calls the driver without it (cudarc would panic).
        anyhow::ensure!(
            driver::libs::driver_present(),
            "libcuda is not present on this machine"
        );
        let ctx = cuda(CudaContext::new(ordinal as usize), "create context")?;
        // SAFETY: the bench orders its own work on one stream and frees buffers only after a
        // synchronize (Drop); cudarc's event tracking would synchronize inside graph capture.
        unsafe { ctx.disable_event_tracking() };
        let stream = cuda(ctx.new_stream(), "create stream")?;
        cuda(ctx.bind_to_thread(), "bind context")?;
        let alloc = |n: usize| {
            // SAFETY: plain device allocation; the memory is written before it is read
            // (uploads or poison precede every collective).
            cuda(unsafe { result::malloc_sync(n.max(1)) }, "cuMemAlloc")
        };
        let input = alloc(in_bytes)?;
        let free = |ptrs: &[u64]| {
            for &p in ptrs {
                // SAFETY: each was just allocated here and is not used by anything.
                let _ = unsafe { result::free_sync(p) };
            }
        };
        let output = alloc(out_bytes).inspect_err(|_| free(&[input]))?;
        let scratch = alloc(4).inspect_err(|_| free(&[input, output]))?;
        // SAFETY: `scratch` is a live allocation of four bytes, used by nothing yet.
        let zeroed = unsafe { result::memset_d8_sync(scratch, 0, 4) };
        cuda(zeroed, "cuMemsetD8").inspect_err(|_| free(&[input, output, scratch]))?;
        let counts = alloc(COUNTS_BYTES).inspect_err(|_| free(&[input, output, scratch]))?;
        let timing = Some(EventFlags::CU_EVENT_DEFAULT);
        let start = cuda(ctx.new_event(timing), "create event")?;
        let stop = cuda(ctx.new_event(timing), "create event")?;
        Ok(CudaEngine {
            ordinal,
            ctx,
            stream,
            input,
            output,
            scratch,
            counts,
            in_bytes,
            out_bytes,
            start,
            stop,
        })
    }

    fn upload(&self, dst: u64, cap: usize, bytes: &[u8]) -> anyhow::Result<()> {
        anyhow::ensure!(bytes.len() <= cap, "{} bytes do not fit {cap}", bytes.len());
        // On the collectives' stream, then waited for: a synchronous copy from pageable memory
        // may return before its DMA has landed, and it is not ordered with a non-blocking
        // stream, so the next collective could read (or overwrite) the buffer's tail before the
        // copy reaches it.
        self.sync()?;
        // SAFETY: `dst` is a live allocation of `cap >= bytes.len()` bytes and the stream is
        // idle, so no collective reads it meanwhile; `bytes` outlives the copy (synchronized
        // below before returning).
        let copied = unsafe { result::memcpy_htod_async(dst, bytes, self.stream.cu_stream()) };
        cuda(copied, "copy to GPU")?;
        self.sync()
    }
}

impl Drop for CudaEngine {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the stream is idle and the pointers came from `malloc_sync`, freed once here.
        unsafe {
            let _ = result::free_sync(self.input);
            let _ = result::free_sync(self.output);
            let _ = result::free_sync(self.scratch);
            let _ = result::free_sync(self.counts);
        }
    }
}

struct Graph(CudaGraph);

impl Replay for Graph {
    fn launch(&self) -> anyhow::Result<()> {
        cuda(self.0.launch(), "graph launch")
    }
}

impl Engine for CudaEngine {
    fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }
    fn stream(&self) -> u64 {
        self.stream.cu_stream() as u64
    }
    fn in_ptr(&self) -> *mut u8 {
        self.input as *mut u8
    }
    fn out_ptr(&self) -> *mut u8 {
        self.output as *mut u8
    }
    fn scratch(&self) -> Option<*mut u8> {
        Some(self.scratch as *mut u8)
    }
    fn counts_ptr(&self) -> *mut u8 {
        self.counts as *mut u8
    }
    fn upload_in(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.upload(self.input, self.in_bytes, bytes)
    }
    fn upload_counts(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.upload(self.counts, COUNTS_BYTES, bytes)
    }
    fn upload_out(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.upload(self.output, self.out_bytes, bytes)
    }
    fn download_out(&mut self, bytes: &mut [u8]) -> anyhow::Result<()> {
        anyhow::ensure!(bytes.len() <= self.out_bytes, "read past the output buffer");
        self.sync()?;
        // SAFETY: the output allocation holds at least `bytes.len()` bytes and the stream is
        // idle, so the collective's writes are complete.
        cuda(
            unsafe { result::memcpy_dtoh_sync(bytes, self.output) },
            "copy from GPU",
        )
    }
    fn sync(&self) -> anyhow::Result<()> {
        cuda(self.stream.synchronize(), "stream synchronize")
    }
    fn time(&self, work: &mut Work<'_>) -> anyhow::Result<f64> {
        cuda(self.start.record(&self.stream), "event record")?;
        work()?;
        cuda(self.stop.record(&self.stream), "event record")?;
        let ms = cuda(self.start.elapsed_ms(&self.stop), "event elapsed")?;
        Ok(ms as f64 / 1e3)
    }
    fn capture(&self, work: &mut Work<'_>) -> anyhow::Result<Box<dyn Replay>> {
        self.sync()?;
        cuda(
            self.stream
                .begin_capture(CaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED),
            "begin capture",
        )?;
        let issued = work();
        // End the capture even when issuing failed, so that the stream is usable again.
        let graph = self
            .stream
            .end_capture(GraphInstantiateFlags(0))
            .map_err(|e| anyhow::anyhow!("CUDA: end capture: {e}"));
        issued.context("issuing collectives inside a CUDA graph capture")?;
        let graph = graph?.context("CUDA: the capture recorded no work")?;
        cuda(graph.upload(), "graph upload")?;
        Ok(Box::new(Graph(graph)))
    }
}
