// ferrocomm all-reduce kernels: push (LL one-shot), flat (one-shot pull), tree (two-shot),
// stream (one-shot push-write through chunk slots: flat for messages larger than the staging).
//
// Header-free on purpose: NVRTC ships no bf16/fp16 headers, so narrow floats are raw 16-bit
// integers converted with inline PTX. The host prepends one `#define FC_T_<dtype>` line; every
// module holds the same sixteen entry points (4 algorithms x 4 operators) for that dtype.
//
// Memory of each rank (one cuMemAlloc, shared over CUDA IPC), see cuda/layout.rs:
//   flags  : u32 [2 barriers][2 parities][FC_MAX_BLOCKS][FC_MAX_RANKS]   (written by peers)
//   state  : u32 epoch, u32 done, u32 verify[FC_MAX_RANKS] at +64,
//            u32 block_epoch[FC_MAX_BLOCKS] at +1024                      (local)
//   cflags : u64 [2 kinds: data, ack][2 parities][FC_MAX_BLOCKS*16 warps][FC_MAX_RANKS] (by peers)
//   push   : [2 parities][world senders][2 * push_cap] LL lines            (written by peers)
//   staging: [2 parities][staging_bytes]                                  (read by peers)
//
// One epoch counter per communicator (state.epoch, device memory, advanced by the last block of
// every kernel) numbers the calls, so CUDA graph replays advance it too (protocol rule 9).
// Every call waits for data or flags of every peer, so a peer is never more than one call ahead:
// buffers and flag slots alternate by epoch parity and a slot is rewritten only two calls later.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef int i32;
typedef long long i64;

#define FC_MAX_RANKS 16
#define FC_MAX_BLOCKS 256

#define OP_SUM 0
#define OP_PROD 1
#define OP_MIN 2
#define OP_MAX 3

struct Args {
    u64 staging[FC_MAX_RANKS];  // every rank's staging base, mapped here (own one included)
    u64 push[FC_MAX_RANKS];     // every rank's push region
    u64 flags[FC_MAX_RANKS];    // every rank's flag area
    u64 state;                  // this rank's state words
    u64 error;                  // host-mapped error record (u32[4])
    u64 input;
    u64 output;
    u64 count;                  // elements
    u64 staging_bytes;          // bytes of one staging parity
    u64 push_cap;               // payload bytes per sender in one push parity
    u64 timeout_ns;
    i64 int_div;                // integer Avg divisor (1: none)
    float pre;                  // PremulSum factor (1: none)
    float post_div;             // float Avg divisor (1: none)
    u32 rank;
    u32 world;
    u32 has_pre;
    u32 has_div;
    // Added for the chunked push-write flat kernel:
    u64 chunk_bytes;            // bytes of one chunk slot (multiple of 16)
    u64 cflag_off;              // offset of the chunk flags from each rank's flags base
    // Where the hello words sit (from flags[r]; every kernel that sends hellos uses them), and
    // the all-reduce's call signature (collective, dtype, count, op, algorithm; equal on every
    // rank of a matching call; the collectives carry theirs in CArgs.sig).
    u64 hello_off;
    u32 sig;
    u32 pad_;
    // The copy-engine all-reduce's words (CE_* below), from flags[r] of every rank.
    u64 ce_words_off;
    // The LL128 all-reduce's region (from flags[r] of every rank; 0: none) and the bytes of one
    // sender's lines in one parity.
    u64 ll128_off;
    u64 ll128_row;
    // The flight recorder's mark (docs/reliability.md): where the call's record id plus one
    // goes once the kernel runs (host-mapped; 0: an unrecorded or captured call), and the value.
    u64 mark;
    u64 mark_id;
};

// ---------------------------------------------------------------- memory-model helpers

__device__ __forceinline__ void st_release_sys(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ u32 ld_acquire_sys(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u32 ld_volatile_u32(const u32* p) {
    u32 v;
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release_sys64(u64* p, u64 v) {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ u64 ld_acquire_sys64(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u64 globaltimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// LL line: {data_lo, flag, data_hi, flag}; 8-byte halves arrive whole (as in NCCL's LL).
__device__ __forceinline__ void st_ll(uint4* p, u32 lo, u32 hi, u32 flag) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(lo), "r"(flag),
                 "r"(hi), "r"(flag)
                 : "memory");
}
__device__ __forceinline__ uint4 ld_v4(const uint4* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

// ---------------------------------------------------------------- programmatic dependent launch
//
// The host may launch every kernel with programmatic stream serialization (cuda/launch.rs): the
// grid is then scheduled while the previous kernel on the stream is still running. The epoch
// protocol (and plain data dependences: the input may be the previous kernel's output, staging
// and flags are rewritten by every call) assumes "the next kernel starts after this one
// completed". griddepcontrol.wait restores exactly that: it returns once every prerequisite grid
// has completed and all its memory operations are performed and visible to this grid (PTX ISA,
// griddepcontrol). So every entry point calls pdl_wait() before anything else: before any load
// or store of user buffers, state/epoch words, staging, flags, LL lines, and before reading the
// clock its timeouts count from. Without the launch attribute the wait returns at once; below
// sm_90 the instruction does not exist and the host never sets the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel on the stream (when launched with the attribute) be scheduled now, so its
// launch overlaps our run. Safe anywhere for correctness: it only starts the dependent's CTAs, and
// their own pdl_wait() still waits for this grid's full completion and memory flush. Called right
// after pdl_wait(): the signal takes effect only once every CTA of this grid has issued it (or
// exited), i.e. all our CTAs are resident, so a dependent's waiting CTAs never keep one of ours
// from starting (our blocks wait on each other through peers' flags); and a dependent issues its
// own signal only after its wait, so at most two of our grids are resident at once.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Records a timeout in host-mapped memory: word 0 last, so the host never sees a half record.
__device__ void report_timeout(const Args& a, u32 peer, u32 phase) {
    volatile u32* e = (volatile u32*)a.error;
    e[1] = peer;
    e[2] = phase;
    e[3] = blockIdx.x;
    __threadfence_system();
    e[0] = 1;
    __threadfence_system();
}

// pdl_wait(), then the call's mark for the flight recorder: its record id plus one written to
// a host-mapped word by one thread (docs/reliability.md, "CUDA calls"). Past the wait the
// grids before this one on the stream have completed, so the word says "this call began and
// the work before it on this stream is done". That holds for work whose kernels complete
// before the next grid starts: ours, and any launched without programmatic serialization; a
// foreign kernel launched with it that never waits for its own predecessor could let this one
// start while an earlier call still runs. Only a call's first kernel needs the mark; every
// kernel of the call writes the same value. Every entry point taking Args starts with this
// (tests/cuda_kernels.rs checks it), fc_verify_write aside.
__device__ __forceinline__ void pdl_wait_mark(const Args& a) {
    pdl_wait();
    if (a.mark != 0 && blockIdx.x == 0 && threadIdx.x == 0)
        asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(a.mark), "l"(a.mark_id) : "memory");
}

// Bad-input codes of the error record (collectives.cu has the others).
#define ERR_MISMATCH 2

// Records a bad-input error in the host-mapped record (word 0 last). Not sticky: the host clears
// it after reporting. A timeout (code 1) already there is kept.
__device__ void report_error(const Args& a, u32 code, u32 peer, u32 detail) {
    volatile u32* e = (volatile u32*)a.error;
    if (e[0] == 1) return;
    e[1] = peer;
    e[2] = detail;
    e[3] = blockIdx.x;
    __threadfence_system();
    e[0] = code;
    __threadfence_system();
}

#define SPIN_CHECK 512

// Word of the host-mapped error page (u32 index) that the communicator's watcher raises when a
// peer died or gave up on the communicator (cuda/dda: ABORT_WORD): every wait ends at its next
// look, with nothing recorded (the host names the peer). Read over the bus only on the slow path.
#define FC_ABORT_WORD 16

// ---------------------------------------------------------------- call signatures
//
// Ranks that disagree on a call (count, dtype, op, algorithm) would otherwise wait for data that
// never comes or reduce what does not belong together. Block 0 of every rank stores a hello word
// `e << 32 | sig` into every peer (parity e & 1, row = sender): push at the start from its last
// warp, flat and tree after their first barrier (met or not), stream at the start; block 0
// checks every peer's at the end, and every wait that spins long enough to check its clock also
// looks at the peers' hellos, so a call whose partner runs another call, or another grid, ends
// with the mismatch recorded (code 2, on every rank: each sees the other's signature) instead of
// a timeout or a wrong sum. A matching call pays one store and one load per peer in block 0: on
// 2xH200 push 1 KB 3.27 -> 3.56 us, 64 KB 4.82 -> 5.23, flat 256 KB 5.11 -> 5.32, 1 MB 7.74 ->
// 7.80 (run 2026-11-30-h200x2-call-signatures, commit d63541b and -hello-warp). Push's hello stored
// after its data by the data threads themselves took 3.90 us at 1 KB; stored first and awaited
// by block 0 before its data, 4.9; as a release store, 6.0.
// The words are the collectives' hello words (one epoch is one call on every rank, whatever its
// kind).
__device__ __forceinline__ u64* hello_word(const Args& a, u32 owner, u32 e, u32 sender) {
    return (u64*)(a.flags[owner] + a.hello_off) + ((e & 1) * FC_MAX_RANKS + sender);
}

// The thread of block 0 that stores the hello into peer p and checks p's: thread `base + p`
// (flat, tree and stream: base 0; push and the LL collectives: their last warp, which carries
// no data in a small call, so neither the store nor the check sits on the data's path).
__device__ __forceinline__ bool hello_thread(const Args& a, u32 base, u32* p) {
    *p = threadIdx.x - base;
    return blockIdx.x == 0 && threadIdx.x >= base && *p < a.world && *p != a.rank;
}

// A plain (volatile) store: the hello orders nothing, and a release at system scope would wait
// for the thread's earlier accesses to reach the system first.
__device__ __forceinline__ void hello_send(const Args& a, u32 sig, u32 e, u32 base) {
    u32 p;
    if (hello_thread(a, base, &p)) *(volatile u64*)hello_word(a, p, e, a.rank) = ((u64)e << 32) | sig;
}

// Whether some peer's hello of call e carries another signature than `sig` (recorded when it
// does).
__device__ bool hello_differs(const Args& a, u32 sig, u32 e) {
    for (u32 p = 0; p < a.world; p++) {
        if (p == a.rank) continue;
        u64 v = *(volatile const u64*)hello_word(a, a.rank, e, p);
        if ((u32)(v >> 32) == e && (u32)v != sig) {
            report_error(a, ERR_MISMATCH, p, (u32)v);
            return true;
        }
    }
    return false;
}

// Every spin loop's slow path: true (keep spinning) except every SPIN_CHECK-th call, where the
// watcher's abort word, a peer's hello of call e with another signature than `sig` (when `peek`:
// the kernel's peers send hellos) or the timeout ends the wait, the latter two recorded (peer,
// phase).
__device__ __forceinline__ bool spin_ok(const Args& a, u32& spins, u32 peer, u32 phase, u64 t0,
                                        bool peek, u32 sig, u32 e) {
    if (++spins < SPIN_CHECK) return true;
    spins = 0;
    if (a.error != 0 && ((volatile const u32*)a.error)[FC_ABORT_WORD] != 0) return false;
    if (peek && hello_differs(a, sig, e)) return false;
    if (globaltimer() - t0 > a.timeout_ns) {
        report_timeout(a, peer, phase);
        return false;
    }
    return true;
}

// The hello threads of block 0 (one per peer, hello_thread): that peer's hello of call e,
// compared with `sig`; false (recorded) on a timeout or another signature. Other threads: true.
__device__ bool hello_check(const Args& a, u32 sig, u32 e, u64 t0, u32 base, u32 phase) {
    u32 p;
    if (!hello_thread(a, base, &p)) return true;
    const u64* w = hello_word(a, a.rank, e, p);
    u32 spins = 0;
    u64 v;
    while ((u32)((v = *(volatile const u64*)w) >> 32) != e)
        if (!spin_ok(a, spins, p, phase, t0, false, sig, e)) return false;
    if ((u32)v != sig) {
        report_error(a, ERR_MISMATCH, p, (u32)v);
        return false;
    }
    return true;
}

// Waits until *p == want (acquire, system scope); false on timeout or mismatch (recorded).
__device__ bool wait_flag(const Args& a, const u32* p, u32 want, u32 peer, u32 phase, u64 t0) {
    u32 spins = 0;
    while (ld_acquire_sys(p) != want)
        if (!spin_ok(a, spins, peer, phase, t0, true, a.sig, want)) return false;
    return true;
}

// ---------------------------------------------------------------- element types

struct bf16 { u16 bits; };
struct f16 { u16 bits; };

template <typename T> struct Ty {  // f32 and the integers: accumulate natively
    typedef T Acc;
    static __device__ __forceinline__ Acc to_acc(T x) { return x; }
    static __device__ __forceinline__ T from_acc(Acc a) { return a; }
};
template <> struct Ty<bf16> {
    typedef float Acc;
    static __device__ __forceinline__ float to_acc(bf16 x) {
        return __uint_as_float(((u32)x.bits) << 16);
    }
    static __device__ __forceinline__ bf16 from_acc(float f) {
        bf16 r;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
        return r;
    }
};
template <> struct Ty<f16> {
    typedef float Acc;
    static __device__ __forceinline__ float to_acc(f16 x) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
        return f;
    }
    static __device__ __forceinline__ f16 from_acc(float f) {
        f16 r;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
        return r;
    }
};

template <typename A> struct IsFloat { enum { value = 0 }; };
template <> struct IsFloat<float> { enum { value = 1 }; };

template <int OP, typename A> __device__ __forceinline__ A combine(A acc, A x) {
    if (OP == OP_SUM) return acc + x;
    if (OP == OP_PROD) return acc * x;
    if (OP == OP_MIN) return x < acc ? x : acc;
    return x > acc ? x : acc;
}

// An input value as the reduction sees it (PremulSum scales every input first).
template <typename T, int OP>
__device__ __forceinline__ typename Ty<T>::Acc load_acc(const Args& a, T x) {
    typedef typename Ty<T>::Acc A;
    A v = Ty<T>::to_acc(x);
    if (IsFloat<A>::value && OP == OP_SUM && a.has_pre) v = (A)((float)v * a.pre);
    return v;
}

// Final step (Avg divides the sum).
template <typename T, int OP>
__device__ __forceinline__ T finish(const Args& a, typename Ty<T>::Acc acc) {
    typedef typename Ty<T>::Acc A;
    if (OP == OP_SUM && a.has_div) {
        if (IsFloat<A>::value) acc = (A)((float)acc / a.post_div);
        else acc = (A)((i64)acc / a.int_div);
    }
    return Ty<T>::from_acc(acc);
}

#if defined(FC_T_F32)
typedef float T;
#elif defined(FC_T_F16)
typedef f16 T;
#elif defined(FC_T_BF16)
typedef bf16 T;
#elif defined(FC_T_I32)
typedef i32 T;
#elif defined(FC_T_U32)
typedef u32 T;
#elif defined(FC_T_I64)
typedef i64 T;
#elif defined(FC_T_U64)
typedef u64 T;
#else
#error "define one of FC_T_F32 FC_T_F16 FC_T_BF16 FC_T_I32 FC_T_U32 FC_T_I64 FC_T_U64"
#endif

typedef typename Ty<T>::Acc Acc;
#define VEC_ELEMS (16 / sizeof(T))

union Vec {
    uint4 u;
    T e[VEC_ELEMS];
};

// Reduces entries 0..min(W, world) of `in` element by element in rank order 0..n-1 (rule 5: the
// same order on every rank, so results are bit-identical), accumulating narrow floats in f32
// (rule 6); PremulSum scales every input and Avg divides the sum (load_acc, finish). V is a
// union of elements `e` (Vec, Unit).
template <int OP, int W, typename V>
__device__ __forceinline__ V reduce_ranks(const Args& a, const V* in) {
    constexpr u32 E = sizeof(V) / sizeof(T);
    Acc acc[E];
#pragma unroll
    for (u32 i = 0; i < E; i++) acc[i] = load_acc<T, OP>(a, in[0].e[i]);
#pragma unroll
    for (u32 r = 1; r < W; r++)
        if (r < a.world) {
#pragma unroll
            for (u32 i = 0; i < E; i++) acc[i] = combine<OP>(acc[i], load_acc<T, OP>(a, in[r].e[i]));
        }
    V res;
#pragma unroll
    for (u32 i = 0; i < E; i++) res.e[i] = finish<T, OP>(a, acc[i]);
    return res;
}

// reduce_ranks one rank at a time, for loops that receive the ranks' values in turn (r = 0,
// 1, ... in order): the same fold, so the same bits, without holding every rank's value.
template <int OP, typename V>
__device__ __forceinline__ void fold_rank(const Args& a, Acc* acc, const V& x, u32 r) {
    constexpr u32 E = sizeof(V) / sizeof(T);
#pragma unroll
    for (u32 i = 0; i < E; i++)
        acc[i] = r == 0 ? load_acc<T, OP>(a, x.e[i]) : combine<OP>(acc[i], load_acc<T, OP>(a, x.e[i]));
}

template <int OP, typename V>
__device__ __forceinline__ V fold_finish(const Args& a, const Acc* acc) {
    constexpr u32 E = sizeof(V) / sizeof(T);
    V res;
#pragma unroll
    for (u32 i = 0; i < E; i++) res.e[i] = finish<T, OP>(a, acc[i]);
    return res;
}

// ---------------------------------------------------------------- per-call bookkeeping

// Every block index owns one epoch word (state + 1024 bytes), so no block waits for another
// to publish the next epoch: block b reads its word at start and writes `e` back at its end;
// block 0 also writes the words of the indices this grid does not use (nobody in this call
// reads them) and the legacy word state.epoch. The next kernel on the stream starts after this
// one completed, so every word it reads holds `e` whatever its grid (no trailing atomics).
#define FC_BLOCK_EPOCH_OFF 1024

__device__ __forceinline__ u32 call_epoch(const Args& a) {
    // The epoch of this call; the previous kernel on this stream wrote the word.
    return ld_volatile_u32((const u32*)(a.state + FC_BLOCK_EPOCH_OFF) + blockIdx.x) + 1;
}

__device__ __forceinline__ void end_call(const Args& a, u32 e) {
    __syncthreads();
    u32* words = (u32*)(a.state + FC_BLOCK_EPOCH_OFF);
    if (threadIdx.x == 0) words[blockIdx.x] = e;
    if (blockIdx.x == 0) {
        for (u32 j = gridDim.x + threadIdx.x; j < FC_MAX_BLOCKS; j += blockDim.x) words[j] = e;
        if (threadIdx.x == 0) ((u32*)a.state)[0] = e;
    }
}

__device__ __forceinline__ u32* flag_slot(const Args& a, u32 owner, u32 barrier, u32 e, u32 sender) {
    u32* f = (u32*)a.flags[owner];
    return f + (((barrier * 2 + (e & 1)) * FC_MAX_BLOCKS + blockIdx.x) * FC_MAX_RANKS + sender);
}

// Block b meets block b of every rank (rule 2: per-block slots, epochs compared for equality,
// start and middle barriers in separate slot arrays, parity against a peer one call ahead).
// Rule 1: the release store publishes this block's earlier staging writes (ordered before it
// by bar.sync); the acquire load makes the peer's visible to the whole block after bar.sync.
__device__ bool block_barrier(const Args& a, u32 barrier, u32 e, u64 t0) {
    __syncthreads();
    bool ok = true;
    if (threadIdx.x < a.world) {
        u32 peer = threadIdx.x;
        st_release_sys(flag_slot(a, peer, barrier, e, a.rank), e);
        ok = wait_flag(a, flag_slot(a, a.rank, barrier, e, peer), e, peer, 10 + barrier, t0);
    }
    return __syncthreads_and(ok) != 0;
}

// ---------------------------------------------------------------- element access helpers

// Reads vector v of the user's buffer (elements past `count` are left as they were).
__device__ __forceinline__ void load_user(const Args& a, u64 v, bool aligned, Vec& out) {
    const T* in = (const T*)a.input;
    u64 first = v * VEC_ELEMS;
    if (aligned && first + VEC_ELEMS <= a.count) {
        out.u = *(const uint4*)(in + first);
    } else {
#pragma unroll
        for (u32 i = 0; i < VEC_ELEMS; i++)
            if (first + i < a.count) out.e[i] = in[first + i];
    }
}

// Writes vector v of the user's output (a Vec of 16 bytes, or push's Unit of 8; elements past
// `count` are not written).
template <typename V>
__device__ __forceinline__ void store_user(const Args& a, u64 v, bool aligned, const V& x) {
    constexpr u32 E = sizeof(V) / sizeof(T);
    T* out = (T*)a.output;
    u64 first = v * E;
    if (aligned && first + E <= a.count) {
        *(decltype(x.u)*)(out + first) = x.u;
    } else {
#pragma unroll
        for (u32 i = 0; i < E; i++)
            if (first + i < a.count) out[first + i] = x.e[i];
    }
}

// Reduces vector v of every rank's staging buffer (parity p) in rank order 0..n-1 (rule 5),
// accumulating narrow floats in f32 (rule 6). All loads are issued before the arithmetic.
template <int OP>
__device__ __forceinline__ void reduce_vec(const Args& a, u64 byte_off, Vec& out) {
    Vec in[FC_MAX_RANKS];
#pragma unroll
    for (u32 r = 0; r < FC_MAX_RANKS; r++)
        if (r < a.world) in[r].u = ld_v4((const uint4*)(a.staging[r] + byte_off));
    out = reduce_ranks<OP, FC_MAX_RANKS>(a, in);
}

// ---------------------------------------------------------------- flat: one-shot pull

// Copy own input to own staging (parity e&1), barrier, every rank reads all staging buffers
// for the vectors this block owns and writes them out. The staging parity alternates, so the
// next call never overwrites what a slow peer is still reading (rule 3). Both passes take
// FC_FLAT_UNROLL of a thread's vectors per step with every load issued first (two ranks: the
// read pass too): a store to the user's or the staging buffer may alias the next load, so a
// plain loop holds one load in flight per thread. The thread's vectors are the same either way.
// The stream kernel below moves its chunks the same way.
#define FC_FLAT_UNROLL 4
template <int OP>
__device__ void flat(const Args& a) {
    constexpr u32 U = FC_FLAT_UNROLL;
    u64 t0 = globaltimer();
    u32 e = call_epoch(a);
    u64 par = (u64)(e & 1) * a.staging_bytes;
    u64 nvec = (a.count + VEC_ELEMS - 1) / VEC_ELEMS;
    bool aligned = ((a.input | a.output) & 15) == 0;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (u64 b = first; b < nvec; b += U * stride) {
        Vec x[U];
#pragma unroll
        for (u32 k = 0; k < U; k++) {
            x[k].u = make_uint4(0, 0, 0, 0);
            if (b + k * stride < nvec) load_user(a, b + k * stride, aligned, x[k]);
        }
#pragma unroll
        for (u32 k = 0; k < U; k++)
            if (b + k * stride < nvec)
                *(uint4*)(a.staging[a.rank] + par + (b + k * stride) * 16) = x[k].u;
    }
    bool met = block_barrier(a, 0, e, t0);
    // After the barrier, so that its release does not wait for the hello to cross first, and
    // whether it met or not (a peer in another kernel waits for it to see the mismatch); block 0
    // reads the peers' at the end, after the read pass (they are there by then).
    hello_send(a, a.sig, e, 0);
    if (met) {
        if (a.world == 2) {
            for (u64 b = first; b < nvec; b += U * stride) {
                uint4 x[U][2];
#pragma unroll
                for (u32 k = 0; k < U; k++)
                    if (b + k * stride < nvec) {
#pragma unroll
                        for (u32 r = 0; r < 2; r++)
                            x[k][r] = ld_v4(
                                (const uint4*)(a.staging[r] + par + (b + k * stride) * 16));
                    }
#pragma unroll
                for (u32 k = 0; k < U; k++)
                    if (b + k * stride < nvec) {
                        Vec in[2];
                        in[0].u = x[k][0];
                        in[1].u = x[k][1];
                        store_user(a, b + k * stride, aligned, reduce_ranks<OP, 2>(a, in));
                    }
            }
        } else {
            for (u64 v = first; v < nvec; v += stride) {
                Vec r;
                reduce_vec<OP>(a, par + v * 16, r);
                store_user(a, v, aligned, r);
            }
        }
        hello_check(a, a.sig, e, t0, 0, 9);
    }
    end_call(a, e);
}

// ---------------------------------------------------------------- stream: one-shot push-write, chunked

// The flat algorithm for messages larger than the staging (and without NCCL): measured on
// 2xH200 it beats the pull form only there (docs/tuning.md).

#define FC_FLAT_SLOTS 2      // chunk slots per (warp, sender): double buffering
#define FC_CFLAG_DATA 0
#define FC_CFLAG_ACK 1
#define FC_FLAT_WARPS 16     // warps per block of the flat kernel (512 threads)
#define FC_FLAT_GROUPS (FC_MAX_BLOCKS * FC_FLAT_WARPS)

// Chunk flag of kind `kind` in `owner`'s memory for warp group g, written by `sender`.
// Value = (epoch << 32) | chunks: the epoch is compared for equality (a stale slot holds an
// older epoch; parity keeps a peer one call ahead off the slot the reader still polls), the
// count grows within a call (rule 2: one slot per warp group, sender and parity).
__device__ __forceinline__ u64* cflag(const Args& a, u32 owner, u32 kind, u32 e, u32 sender,
                                      u32 g) {
    u64* f = (u64*)(a.flags[owner] + a.cflag_off);
    return f + (((u64)(kind * 2 + (e & 1)) * FC_FLAT_GROUPS + g) * FC_MAX_RANKS + sender);
}

// Lanes 0..world-1 (not `rank`) wait until that peer's flag of `kind` reaches `count` in epoch
// e; the whole warp agrees on the outcome, and __syncwarp orders the lanes' later reads after
// the acquire (rule 1).
__device__ __forceinline__ bool wait_cflag(const Args& a, u32 kind, u32 e, u64 count, u32 g,
                                           u32 phase, u64 t0) {
    bool ok = true;
    u32 peer = threadIdx.x & 31;
    if (peer < a.world && peer != a.rank) {
        const u64* p = cflag(a, a.rank, kind, e, peer, g);
        u32 spins = 0;
        for (;;) {
            u64 v = ld_acquire_sys64(p);
            if ((u32)(v >> 32) == e && (v & 0xffffffffull) >= count) break;
            if (!spin_ok(a, spins, peer, phase, t0, true, a.sig, e)) {
                ok = false;
                break;
            }
        }
    }
    bool all = __all_sync(0xffffffffu, ok) != 0;
    __syncwarp();
    return all;
}

// After __syncwarp (which orders every lane's earlier accesses before it), lane r releases
// `count` into rank r's flag of `kind` (rule 1: system scope, cumulative over the warp).
__device__ __forceinline__ void post_cflag(const Args& a, u32 kind, u32 e, u64 count, u32 g) {
    __syncwarp();
    u32 peer = threadIdx.x & 31;
    if (peer < a.world && peer != a.rank)
        st_release_sys64(cflag(a, peer, kind, e, a.rank, g), ((u64)e << 32) | count);
}

// Reduces vectors [v0, v1) of one tile with one warp: own input plus every peer's received
// chunk (sender r's slot at `slots + r * SLOTS * slot_stride`), rank order 0..n-1 (rule 5),
// f32 for narrow floats (rule 6). W bounds the ranks held in registers, U the vectors per lane
// in flight; all loads are issued before the arithmetic.
template <int OP, int W, int U>
__device__ __forceinline__ void flat_reduce_tile(const Args& a, const u8* slots, u64 slot_stride,
                                                 u64 v0, u64 v1, bool aligned) {
    for (u64 b = v0 + (threadIdx.x & 31); b < v1; b += 32ull * U) {
        Vec in[U][W];
#pragma unroll
        for (u32 k = 0; k < U; k++) {
            u64 v = b + 32ull * k;
            if (v < v1) {
#pragma unroll
                for (u32 r = 0; r < W; r++) {
                    if (r >= a.world) continue;
                    if (r == a.rank) {
                        in[k][r].u = make_uint4(0, 0, 0, 0);
                        load_user(a, v, aligned, in[k][r]);
                    } else {
                        in[k][r].u = ld_v4((const uint4*)(slots + (u64)r * FC_FLAT_SLOTS * slot_stride +
                                                          (v - v0) * 16));
                    }
                }
            }
        }
#pragma unroll
        for (u32 k = 0; k < U; k++) {
            u64 v = b + 32ull * k;
            if (v < v1) store_user(a, v, aligned, reduce_ranks<OP, W>(a, in[k]));
        }
    }
}

// Each rank writes its input straight into every peer's staging over NVLink (no local copy).
// Every warp is an independent pipeline (no block-wide barrier: while one warp waits for its
// release to land, the others keep the link busy): warp group g owns tiles g, g+G, g+2G, ...
// of `chunk_bytes`, one chunk slot pair per (g, sender), double buffered; a per-chunk flag
// follows each chunk and the reader acknowledges each consumed chunk so that the writer can
// reuse the slot. The group writes tile c+1 before reducing tile c. The receiver reduces its
// own input and the received chunks in rank order 0..n-1 (rule 5), so messages of any size
// stream through a fixed staging area. Staging parity e&1 holds a call's slots: a peer one
// call ahead writes the other parity, and two calls ahead it has seen this call's data
// complete on our side (rule 3).
template <int OP>
__device__ void stream(const Args& a) {
    u64 t0 = globaltimer();
    u32 e = call_epoch(a);
    u64 par = (u64)(e & 1) * a.staging_bytes;
    u64 nvec = (a.count + VEC_ELEMS - 1) / VEC_ELEMS;
    u64 cvec = a.chunk_bytes / 16;
    u64 ntiles = (nvec + cvec - 1) / cvec;
    u32 nwarps = blockDim.x >> 5;
    u32 g = blockIdx.x * nwarps + (threadIdx.x >> 5);
    u64 G = (u64)gridDim.x * nwarps;
    u64 nch = ntiles > g ? (ntiles - g + G - 1) / G : 0;
    bool aligned = ((a.input | a.output) & 15) == 0;
    u64 slot_stride = a.chunk_bytes;
    u64 grp_off = par + (u64)g * a.world * FC_FLAT_SLOTS * slot_stride;
    u32 lane = threadIdx.x & 31;
    bool ok = true;

    // Writes the tile of chunk c into slot c % SLOTS of every peer, then posts the data flag.
    auto write_chunk = [&](u64 c) {
        u64 v0 = (g + c * G) * cvec;
        u64 v1 = v0 + cvec < nvec ? v0 + cvec : nvec;
        u64 soff = grp_off + ((u64)a.rank * FC_FLAT_SLOTS + (c % FC_FLAT_SLOTS)) * slot_stride;
        for (u64 b = v0 + lane; b < v1; b += 32ull * FC_FLAT_UNROLL) {
            Vec x[FC_FLAT_UNROLL];
#pragma unroll
            for (u32 k = 0; k < FC_FLAT_UNROLL; k++) {
                u64 v = b + 32ull * k;
                x[k].u = make_uint4(0, 0, 0, 0);
                if (v < v1) load_user(a, v, aligned, x[k]);
            }
#pragma unroll
            for (u32 k = 0; k < FC_FLAT_UNROLL; k++) {
                u64 v = b + 32ull * k;
                if (v < v1) {
#pragma unroll
                    for (u32 r = 0; r < FC_MAX_RANKS; r++)
                        if (r < a.world && r != a.rank)
                            *(uint4*)(a.staging[r] + soff + (v - v0) * 16) = x[k].u;
                }
            }
        }
        post_cflag(a, FC_CFLAG_DATA, e, c + 1, g);
    };

    hello_send(a, a.sig, e, 0);
    if (nch > 0) write_chunk(0);
    for (u64 c = 0; c < nch && ok; c++) {
        if (c + 1 < nch) {
            // Slot (c+1) % SLOTS last held chunk c+1-SLOTS: wait until every reader freed it.
            if (c + 1 >= FC_FLAT_SLOTS)
                ok = wait_cflag(a, FC_CFLAG_ACK, e, c + 2 - FC_FLAT_SLOTS, g, 21, t0);
            if (!ok) break;
            write_chunk(c + 1);
        }
        ok = wait_cflag(a, FC_CFLAG_DATA, e, c + 1, g, 20, t0);
        if (!ok) break;
        u64 v0 = (g + c * G) * cvec;
        u64 v1 = v0 + cvec < nvec ? v0 + cvec : nvec;
        const u8* slots = (const u8*)a.staging[a.rank] + grp_off + (c % FC_FLAT_SLOTS) * slot_stride;
        if (a.world == 2)
            flat_reduce_tile<OP, 2, FC_FLAT_UNROLL>(a, slots, slot_stride, v0, v1, aligned);
        else
            flat_reduce_tile<OP, FC_MAX_RANKS, 1>(a, slots, slot_stride, v0, v1, aligned);
        // Free the slot only if the writer will reuse it in this call.
        if (c + FC_FLAT_SLOTS < nch) post_cflag(a, FC_CFLAG_ACK, e, c + 1, g);
    }
    // A large call: block 0 checks the hellos at the end, unless a wait of its own failed.
    if (!__syncthreads_or(!ok)) hello_check(a, a.sig, e, t0, 0, 9);
    end_call(a, e);
}

// ---------------------------------------------------------------- ce: one-shot through the copy engines
//
// Two ranks, opt-in (FERROCOMM_ALLREDUCE_CE_MIN_BYTES): each rank's copy engine moves its input,
// chunk by chunk, into the peer's copy-engine region (after the staging's two parities), each
// chunk followed by a 4-byte copy of the call's epoch into the peer's flag of that chunk (the
// same stream, so the flag lands after the chunk: cuda/dda.rs issues the copies). The SMs only
// reduce: fc_ce_<op>'s blocks take every chunk once its flag holds the epoch, out = in + received
// in rank order (rule 5, bit-identical on both ranks). The region has one buffer: fc_ce_gate, on
// the caller's stream before the copies, waits until the peer's reduce of our previous
// copy-engine call has finished reading it (the peer's last block stores that call's epoch into
// our DONE word; a peer that ran another call then, which the hellos reported, never will), and
// publishes this call's epoch as the flags' source word (SEQ). Every wait has the timeout; the
// reduce also looks at the peers' hellos while it waits.
#define CE_SEQ 0         // this call's epoch: the source of the flag copies (local)
#define CE_LAST 1        // epoch of this rank's previous copy-engine call (local)
#define CE_ARRIVED 2     // blocks of the reduce that finished (local, reset by the last one)
#define CE_DONE 3        // epoch of the peer's last finished copy-engine reduce (peer-written)
#define CE_FLAGS 16      // chunk flags (peer-written by its copy engine), FC_CE_MAX_CHUNKS of them
#define FC_CE_MAX_CHUNKS 64

// In place (the buffers overlap), a chunk of the output may be written only once our own copy
// of that chunk has left, which our flag of it in the peer's memory says (read over the link:
// a copy into our own memory may run as a kernel, which our spinning blocks could keep out).
__device__ __forceinline__ bool ce_overlap(const Args& a, u64 bytes) {
    return a.input < a.output + bytes && a.output < a.input + bytes;
}

__device__ __forceinline__ u32* ce_words(const Args& a, u32 r) {
    return (u32*)(a.flags[r] + a.ce_words_off);
}

__device__ void ce_gate(const Args& a) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    u64 t0 = globaltimer();
    u32* w = ce_words(a, a.rank);
    u32 last = ld_volatile_u32(w + CE_LAST);
    u32 spins = 0;
    while (last != 0 && (i32)(ld_acquire_sys(w + CE_DONE) - last) < 0) {
        // A peer whose SEQ word holds another epoch is past that call, or never ran it by copy
        // engine (calls that disagreed: reported then), so it reads nothing of ours.
        if (ld_volatile_u32(ce_words(a, 1 - a.rank) + CE_SEQ) != last) break;
        if (!spin_ok(a, spins, 1 - a.rank, 30, t0, false, a.sig, 0)) break;
    }
    // The copies of this call read it after this kernel completed.
    w[CE_SEQ] = call_epoch(a);
}

template <int OP>
__device__ void ce(const Args& a) {
    constexpr u32 U = FC_FLAT_UNROLL;
    u64 t0 = globaltimer();
    u32 e = call_epoch(a);
    u32 peer = 1 - a.rank;
    u32* w = ce_words(a, a.rank);
    const u8* got = (const u8*)a.staging[a.rank] + 2 * a.staging_bytes;
    u64 nvec = (a.count + VEC_ELEMS - 1) / VEC_ELEMS;
    u64 cvec = a.chunk_bytes / 16;
    u64 nch = (nvec + cvec - 1) / cvec;
    bool aligned = ((a.input | a.output) & 15) == 0;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    bool ok = true;
    bool in_place = ce_overlap(a, a.count * sizeof(T));
    hello_send(a, a.sig, e, 0);
    for (u64 c = 0; c < nch && ok; c++) {
        if (threadIdx.x == 0) {
            u32 spins = 0;
            while (ld_acquire_sys(w + CE_FLAGS + c) != e)
                if (!spin_ok(a, spins, peer, 31, t0, true, a.sig, e)) {
                    ok = false;
                    break;
                }
            while (ok && in_place && ld_acquire_sys(ce_words(a, peer) + CE_FLAGS + c) != e)
                if (!spin_ok(a, spins, a.rank, 32, t0, true, a.sig, e)) ok = false;
        }
        // bar.sync orders the acquire before every thread's reads of the chunk (rule 1).
        ok = __syncthreads_and(ok) != 0;
        if (!ok) break;
        u64 v1 = (c + 1) * cvec < nvec ? (c + 1) * cvec : nvec;
        for (u64 b = c * cvec + first; b < v1; b += U * stride) {
            Vec mine[U];
            uint4 theirs[U];
#pragma unroll
            for (u32 k = 0; k < U; k++) {
                u64 v = b + k * stride;
                mine[k].u = make_uint4(0, 0, 0, 0);
                if (v < v1) {
                    load_user(a, v, aligned, mine[k]);
                    theirs[k] = ld_v4((const uint4*)(got + v * 16));
                }
            }
#pragma unroll
            for (u32 k = 0; k < U; k++)
                if (b + k * stride < v1) {
                    Vec in[2];
                    in[0].u = a.rank == 0 ? mine[k].u : theirs[k];
                    in[1].u = a.rank == 0 ? theirs[k] : mine[k].u;
                    store_user(a, b + k * stride, aligned, reduce_ranks<OP, 2>(a, in));
                }
        }
    }
    if (ok) ok = hello_check(a, a.sig, e, t0, 0, 9);
    // The last block to finish tells the peer that its copies may rewrite the region.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(w + CE_ARRIVED, 1) + 1 == gridDim.x) {
            w[CE_ARRIVED] = 0;
            w[CE_LAST] = e;
            st_release_sys(ce_words(a, peer) + CE_DONE, e);
        }
    }
    end_call(a, e);
}

// ---------------------------------------------------------------- tree: two-shot

// Stripe k (of `world`) is reduced by rank k into its own staging, then everyone gathers the
// reduced stripes. Block b handles the same offsets inside every stripe on every rank, so the
// per-block barriers cover exactly the data each block exchanges.
template <int OP>
__device__ void tree(const Args& a) {
    u64 t0 = globaltimer();
    u32 e = call_epoch(a);
    u64 par = (u64)(e & 1) * a.staging_bytes;
    u64 nvec = (a.count + VEC_ELEMS - 1) / VEC_ELEMS;
    u64 svec = (nvec + a.world - 1) / a.world;  // vectors per stripe
    bool aligned = ((a.input | a.output) & 15) == 0;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (u32 k = 0; k < a.world; k++) {
        for (u64 o = first; o < svec; o += stride) {
            u64 v = k * svec + o;
            if (v >= nvec) break;
            Vec x;
            x.u = make_uint4(0, 0, 0, 0);
            load_user(a, v, aligned, x);
            *(uint4*)(a.staging[a.rank] + par + v * 16) = x.u;
        }
    }
    bool ok = block_barrier(a, 0, e, t0);
    hello_send(a, a.sig, e, 0);  // after the barrier, met or not, as in flat
    bool hello = ok;
    if (ok) {
        for (u64 o = first; o < svec; o += stride) {
            u64 v = a.rank * svec + o;
            if (v >= nvec) break;
            Vec r;
            reduce_vec<OP>(a, par + v * 16, r);
            // Only this rank touches its own stripe before the next barrier.
            *(uint4*)(a.staging[a.rank] + par + v * 16) = r.u;
            store_user(a, v, aligned, r);
        }
        ok = block_barrier(a, 1, e, t0);
    }
    if (ok) {
        for (u32 i = 1; i < a.world; i++) {
            u32 k = (a.rank + i) % a.world;
            for (u64 o = first; o < svec; o += stride) {
                u64 v = k * svec + o;
                if (v >= nvec) break;
                Vec r;
                r.u = ld_v4((const uint4*)(a.staging[k] + par + v * 16));
                store_user(a, v, aligned, r);
            }
        }
    }
    if (hello) hello_check(a, a.sig, e, t0, 0, 9);
    end_call(a, e);
}

// ---------------------------------------------------------------- push: barrier-free LL one-shot

#define UNIT_ELEMS (8 / sizeof(T))
union Unit {
    uint2 u;
    T e[UNIT_ELEMS];
};

// Each rank stores every 8-byte unit of its input, with the epoch as flag beside each 4-byte
// half, into every rank's push buffer (parity e&1, row = sender); then it polls its own buffer
// until every sender's unit carries this epoch. No barrier, no clearing: flags are compared for
// equality with an epoch that a stale line (two calls old) can never hold (rule 4's LL form).
// Unit u of the user's input (zeros past `count`).
__device__ __forceinline__ void load_unit(const Args& a, u64 u, bool aligned, Unit& x) {
    const T* in = (const T*)a.input;
    x.u = make_uint2(0, 0);
    u64 f = u * UNIT_ELEMS;
    if (aligned && f + UNIT_ELEMS <= a.count) {
        x.u = *(const uint2*)(in + f);
    } else {
#pragma unroll
        for (u32 i = 0; i < UNIT_ELEMS; i++)
            if (f + i < a.count) x.e[i] = in[f + i];
    }
}

template <int OP, u32 W>
__device__ __forceinline__ void push(const Args& a) {
    u64 nunit = (a.count * sizeof(T) + 7) / 8;
    bool aligned = ((a.input | a.output) & 7) == 0;
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    // The first unit is loaded before the epoch word is read, so the two loads overlap
    // (a small message is one unit per thread: this is the whole input). Both come after the
    // entry's pdl_wait(): the input may be the previous kernel's output.
    Unit x0;
    if (first < nunit) load_unit(a, first, aligned, x0);
    u64 t0 = globaltimer();
    u32 e = call_epoch(a);
    // The hellos go first and are read at the end, by the last warp of block 0: nothing waits
    // for them on the way, and a small message leaves that warp without data (off the path).
    u32 hello_base = blockDim.x - 32;
    hello_send(a, a.sig, e, hello_base);
    u64 row = 2 * a.push_cap;               // bytes of one sender's LL lines
    u64 par = (u64)(e & 1) * a.world * row;
    const u8* mine = (const u8*)a.push[a.rank];
    for (u64 u = first; u < nunit; u += stride) {
        Unit x;
        if (u == first) x = x0;
        else load_unit(a, u, aligned, x);
        u64 off = par + a.rank * row + u * 16;
#pragma unroll
        for (u32 r = 0; r < FC_MAX_RANKS; r++)
            if (r < a.world) st_ll((uint4*)(a.push[r] + off), x.u.x, x.u.y, e);
    }
    bool ok = true;
    for (u64 u = first; u < nunit && ok; u += stride) {
        // One rank at a time (the own line too), folded as it arrives. The loop this replaces,
        // unrolled over sixteen ranks with a spin loop in every step, cost about a microsecond
        // per call on 2xH200; a two-rank path (wait for the peer's line, read the own one back)
        // won most of it, and this loop a little more: 1 KB 3.64 -> 2.75 (two-rank path) ->
        // 2.62 us, 64 KB 5.23 -> 3.74 -> 3.38 (run 2026-11-30-h200x2-ll-256k, commit 269ccb2,
        // -push-fold). Taking the own unit from the input instead of its line was slower
        // (run 2026-11-30-h200x2-push-own, commit 269ccb2).
        Acc acc[UNIT_ELEMS];
        auto step = [&](u32 r) {
            const uint4* p = (const uint4*)(mine + par + r * row + u * 16);
            uint4 l = ld_v4(p);
            u32 spins = 0;
            // Check both flags: each covers its own 4-byte half (rule 4: every element).
            while (l.y != e || l.w != e) {
                if (!spin_ok(a, spins, r, 1, t0, true, a.sig, e)) return false;
                l = ld_v4(p);
            }
            Unit x;
            x.u = make_uint2(l.x, l.z);
            fold_rank<OP>(a, acc, x, r);
            return true;
        };
        // Two ranks: both steps known at compile time (see W in collectives.cu's LL helpers).
        if (W) {
#pragma unroll
            for (u32 r = 0; r < W && ok; r++) ok = step(r);
        } else {
#pragma unroll 1
            for (u32 r = 0; r < a.world && ok; r++) ok = step(r);
        }
        if (!ok) break;
        store_user(a, u, aligned, fold_finish<OP, Unit>(a, acc));
    }
    if (ok) hello_check(a, a.sig, e, t0, hello_base, 9);
    end_call(a, e);
}

// ---------------------------------------------------------------- ll128: barrier-free one-shot, 128-byte lines

// Opt-in (FERROCOMM_ALLREDUCE_LL128_MAX_BYTES): flat all-reduces up to that size. The input is
// cut into 8-byte words, 15 to a line; a line is 128 bytes, its last word the flag (this call's
// epoch), and eight lanes of a warp store it with one 16-byte store each (lane 7 its last data
// word and the flag), so a warp instruction writes four whole lines. The receiver loads a line
// the same way and takes it once lane 7's word holds the epoch: this relies on a warp's 128-byte
// line reaching the peer whole, as NCCL's LL128 protocol does over NVLink (94% of the link's
// bytes are data, against LL's 50%, and no fence anywhere). Lines go into every peer's region
// (parity e&1, row = the sender's place among the receiver's peers), which only these lines
// ever touch, so a stale line holds an older epoch (rule 4's LL form; the region starts zeroed,
// epochs from 1). A warp stores its lines of step k, then folds its lines of step k-1 (own words
// kept in registers, the peers' from the own region, ranks in order 0..n-1: rule 5), so the
// link carries the next lines while the last ones are summed. Each line's input words are read
// and its output words written by the same eight lanes, a step apart: in place is safe. The
// grid needs no agreement between ranks (no per-block flags): any warp takes any line.
#define LL128_WORDS 15

__device__ __forceinline__ void st_v2u64(u64* p, u64 x, u64 y) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1,%2};" ::"l"(p), "l"(x), "l"(y) : "memory");
}
__device__ __forceinline__ void ld_v2u64(const u64* p, u64& x, u64& y) {
    asm volatile("ld.volatile.global.v2.u64 {%0,%1}, [%2];" : "=l"(x), "=l"(y) : "l"(p) : "memory");
}

// Word w of the input (a unit: 8 bytes of elements; zeros past `count`).
__device__ __forceinline__ u64 ll128_load(const Args& a, u64 w, bool aligned) {
    Unit x;
    load_unit(a, w, aligned, x);
    return ((u64)x.u.y << 32) | x.u.x;
}

__device__ __forceinline__ Unit ll128_unit(u64 v) {
    Unit x;
    x.u = make_uint2((u32)v, (u32)(v >> 32));
    return x;
}

// The row of sender s in receiver r's region: its place among r's peers (`world` the kernel's
// compile-time count where it has one, so the two-rank build does no division per line).
__device__ __forceinline__ u64 ll128_row_of(u32 world, u32 s, u32 r) {
    return (u64)((s + world - r - 1) % world);
}

template <int OP, u32 W>
__device__ __forceinline__ void ll128(const Args& a) {
    u64 nword = (a.count * sizeof(T) + 7) / 8;
    u64 nline = (nword + LL128_WORDS - 1) / LL128_WORDS;
    bool ain = (a.input & 7) == 0, aout = (a.output & 7) == 0;
    u32 lane = threadIdx.x & 31, j = lane & 7;
    u64 warps = (u64)gridDim.x * (blockDim.x >> 5);
    u64 gw = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    u32 world = W ? W : a.world;
    u64 t0 = globaltimer();
    u32 e = call_epoch(a);
    u32 hello_base = blockDim.x - 32;
    hello_send(a, a.sig, e, hello_base);
    u64 par = (u64)(e & 1) * (world - 1) * a.ll128_row;
    const u8* mine = (const u8*)(a.flags[a.rank] + a.ll128_off) + par;
    // This lane's two words of a line: data words 2j and 2j+1, or for lane 7 word 14 and the flag.
    u64 x0 = 0, x1 = 0, p0 = 0, p1 = 0, prev = ~0ull;
    bool ok = true;
    for (u64 g = gw;; g += warps) {
        bool more = g * 4 < nline;  // the same for the whole warp
        u64 line = g * 4 + (lane >> 3);
        if (more && line < nline) {
            u64 w = line * LL128_WORDS + 2 * j;
            x0 = w < nword ? ll128_load(a, w, ain) : 0;
            x1 = j == 7 ? (u64)e : w + 1 < nword ? ll128_load(a, w + 1, ain) : 0;
            u64 off = line * 128 + j * 16;
#pragma unroll
            for (u32 r = 0; r < FC_MAX_RANKS; r++)
                if (r < world && r != a.rank)
                    st_v2u64((u64*)(a.flags[r] + a.ll128_off + par +
                                    ll128_row_of(world, a.rank, r) * a.ll128_row + off),
                             x0, x1);
        }
        if (prev != ~0ull) {
            // Fold the previous step's line (`prev`, this lane's words p0, p1) over the ranks.
            bool valid = prev < nline;
            Acc acc[2][UNIT_ELEMS];
#pragma unroll 1
            for (u32 r = 0; r < world && ok; r++) {
                u64 v0 = p0, v1 = p1;
                if (r != a.rank) {
                    const u64* src = (const u64*)(mine + ll128_row_of(world, r, a.rank) * a.ll128_row +
                                                  prev * 128 + j * 16);
                    u32 spins = 0;
                    for (;;) {
                        if (valid) ld_v2u64(src, v0, v1);
                        u64 flag = __shfl_sync(0xffffffffu, v1, lane | 7);
                        if (__all_sync(0xffffffffu, !valid || flag == (u64)e)) break;
                        bool stop = lane == 0 && !spin_ok(a, spins, r, 33, t0, true, a.sig, e);
                        if (__shfl_sync(0xffffffffu, stop, 0)) {
                            ok = false;
                            break;
                        }
                    }
                    if (!ok) break;
                }
                fold_rank<OP>(a, acc[0], ll128_unit(v0), r);
                fold_rank<OP>(a, acc[1], ll128_unit(v1), r);
            }
            if (!ok) break;
            if (valid) {
                u64 w = prev * LL128_WORDS + 2 * j;
                if (w < nword) store_user(a, w, aout, fold_finish<OP, Unit>(a, acc[0]));
                if (j != 7 && w + 1 < nword) store_user(a, w + 1, aout, fold_finish<OP, Unit>(a, acc[1]));
            }
        }
        if (!more) break;
        prev = line;
        p0 = x0;
        p1 = x1;
    }
    if (ok) hello_check(a, a.sig, e, t0, hello_base, 9);
    end_call(a, e);
}

// ---------------------------------------------------------------- start-up check

// Entry points are compiled in groups (crates/ferrocomm/src/cuda/kernel_units.rs): the host
// defines FC_GROUP_<NAME> for the one group a unit holds, so a compile at first use builds the
// kernels a call needs and nothing else.
#ifdef FC_GROUP_SETUP
// Writes `magic + rank` into slot `rank` of every peer's verify words through the IPC mapping;
// the host then reads its own words back to prove that peer writes really land (rule 7).
extern "C" __global__ void fc_verify_write(Args a, u32 magic, u64 verify_off) {
    pdl_wait();
    pdl_launch_dependents();
    if (blockIdx.x == 0 && threadIdx.x < a.world) {
        u32* p = (u32*)(a.flags[threadIdx.x] + verify_off) + a.rank;
        st_release_sys(p, magic + a.rank);
    }
}

// Lets the copy-engine all-reduce's copies start (the flat all-reduce over the copy engines).
extern "C" __global__ void fc_ce_gate(Args a) { pdl_wait_mark(a); pdl_launch_dependents(); ce_gate(a); }
#endif

// ---------------------------------------------------------------- entry points

#define FC_ENTRY(NAME, OPV)                                                             \
    extern "C" __global__ void __launch_bounds__(512) fc_push_##NAME(Args a) { pdl_wait_mark(a); pdl_launch_dependents(); if (a.world == 2) push<OPV, 2>(a); else push<OPV, 0>(a); } \
    extern "C" __global__ void __launch_bounds__(512) fc_flat_##NAME(Args a) { pdl_wait_mark(a); pdl_launch_dependents(); flat<OPV>(a); } \
    extern "C" __global__ void __launch_bounds__(512) fc_tree_##NAME(Args a) { pdl_wait_mark(a); pdl_launch_dependents(); tree<OPV>(a); } \
    extern "C" __global__ void __launch_bounds__(512) fc_stream_##NAME(Args a) { pdl_wait_mark(a); pdl_launch_dependents(); stream<OPV>(a); } \
    extern "C" __global__ void __launch_bounds__(512) fc_ce_##NAME(Args a) { pdl_wait_mark(a); pdl_launch_dependents(); ce<OPV>(a); } \
    extern "C" __global__ void __launch_bounds__(512, 2) fc_ll128_##NAME(Args a) { pdl_wait_mark(a); pdl_launch_dependents(); if (a.world == 2) ll128<OPV, 2>(a); else ll128<OPV, 0>(a); }

#ifdef FC_GROUP_ALL_REDUCE_SUM
FC_ENTRY(sum, OP_SUM)
#endif
#ifdef FC_GROUP_ALL_REDUCE_PROD
FC_ENTRY(prod, OP_PROD)
#endif
#ifdef FC_GROUP_ALL_REDUCE_MIN
FC_ENTRY(min, OP_MIN)
#endif
#ifdef FC_GROUP_ALL_REDUCE_MAX
FC_ENTRY(max, OP_MAX)
#endif
