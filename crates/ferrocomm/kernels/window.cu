// ferrocomm window kernels (one-sided communication, cuda/window.rs): a put by the SMs, a
// signal and a wait. The window unit (f32 only: they move bytes) is all_reduce.cu, whose
// typedefs and memory-model helpers they use, then this file; the kernels are emitted under
// FC_GROUP_WINDOW only.
//
// A rank's signal counters (cuMemAlloc, shared over CUDA IPC):
//   incoming : u64 [world senders][slots]   (added to by the senders, over the peer mapping)
//   consumed : u64 [world senders][slots]   (local: signals its waits have taken)
// Both live in device memory and only kernels touch them, so a CUDA graph replay counts on.
//
// Ordering (docs/design.md, rule 1): a put's stores complete before the signal kernel starts (stream
// order: a put kernel's threads fence at system scope before they exit, a copy-engine put is
// complete when the next operation of the stream begins); the signal kernel then fences and
// adds with release at system scope; the waiting kernel loads the counter with acquire at
// system scope, and the work after it on the waiting stream starts after it completes.

struct WinArgs {
    u64 dst;         // put: the target; signal: the peer's incoming counter; wait: own counter
    u64 src;         // put: the source
    u64 bytes;       // put: how many
    u64 consumed;    // wait: this rank's count of the peer's signals it has taken
    u64 error;       // wait: the host-mapped error record (u32[4], all_reduce.cu's layout)
    u64 abort;       // wait: the host-mapped abort word (u32; nonzero ends the wait)
    u64 timeout_ns;  // wait
    u32 peer;        // wait: the rank waited for, named in a timeout record
    u32 pad_;
};

// The phase a wait's timeout record carries (all_reduce.cu's phases are below 64).
#define WIN_WAIT_PHASE 90

#ifdef FC_GROUP_WINDOW

// Copies `bytes` from `src` to `dst`: 16-byte vectors where both are 16-byte aligned, the
// rest (and anything unaligned) byte by byte. Grid-stride; every thread fences at system
// scope before it exits, so the signal kernel after it publishes these stores.
extern "C" __global__ void __launch_bounds__(512) fc_win_put(WinArgs a) {
    pdl_wait();
    pdl_launch_dependents();
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u8* dst = (u8*)a.dst;
    const u8* src = (const u8*)a.src;
    u64 vec = 0;
    if (((a.dst | a.src) & 15) == 0) {
        vec = a.bytes / 16;
        uint4* d = (uint4*)dst;
        const uint4* s = (const uint4*)src;
        for (u64 i = tid; i < vec; i += stride) d[i] = s[i];
    }
    for (u64 i = vec * 16 + tid; i < a.bytes; i += stride) dst[i] = src[i];
    __threadfence_system();
}

// Adds one to the peer's counter of this rank's signals, after everything before it on the
// stream (release at system scope).
extern "C" __global__ void fc_win_signal(WinArgs a) {
    pdl_wait();
    pdl_launch_dependents();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        asm volatile("fence.acq_rel.sys;" ::: "memory");
        asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(a.dst), "l"((u64)1)
                     : "memory");
    }
}

// Waits until the counter at `dst` passes the signals taken so far (acquire at system scope),
// then takes one. A timeout records (peer, WIN_WAIT_PHASE) in the error record, as the other
// kernels' do (the host reports it at the next call); an abort word set by the host ends the
// wait quietly (every later call refuses the aborted communicator). Either way the count
// taken stays as it was.
extern "C" __global__ void fc_win_wait(WinArgs a) {
    pdl_wait();
    pdl_launch_dependents();
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    u64* taken = (u64*)a.consumed;
    const u64 want = *taken + 1;
    const u64* count = (const u64*)a.dst;
    const u64 t0 = globaltimer();
    u32 spins = 0;
    while (ld_acquire_sys64(count) < want) {
        if (++spins < SPIN_CHECK) continue;
        spins = 0;
        if (ld_volatile_u32((const u32*)a.abort) != 0) return;
        if (globaltimer() - t0 > a.timeout_ns) {
            volatile u32* e = (volatile u32*)a.error;
            e[1] = a.peer;
            e[2] = WIN_WAIT_PHASE;
            e[3] = 0;
            __threadfence_system();
            e[0] = 1;
            __threadfence_system();
            return;
        }
    }
    *taken = want;
}

#endif  // FC_GROUP_WINDOW
