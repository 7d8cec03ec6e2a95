// ferrocomm direct-access collectives beside the all-reduce: all-gather, reduce-scatter,
// all-to-all, all-to-all-v (host counts and device counts), broadcast, reduce.
//
// Concatenated after all_reduce.cu in every module, so it shares `Args`, the element type `T`,
// the epoch helpers (call_epoch / end_call), the LL line helpers and the reduction helpers.
// Data-movement kernels move bytes (any dtype, fp8 and int8 included); the host launches them
// from any module. Reductions use the module's `T` and accumulate half types in f32.
//
// Two protocols, one launch each:
// - LL (small parts: all-gather, all-to-all(-v), broadcast, reduce-scatter, reduce): every sender stores
//   8-byte units with the epoch beside each 4-byte half into the receiver's push region (parity
//   e&1, row = sender), exactly like the push all-reduce; no barrier. Block 0 of every rank also
//   sends a "hello" word (epoch << 32 | a signature of the call) to every peer at the start and
//   checks every peer's before the kernel ends, so that a rank never runs more than one call
//   ahead of any peer even when it receives nothing (the broadcast root): the parity buffers are
//   then never overwritten while read. A receiver whose wait for units goes on peeks at the
//   hellos, so a peer in another call is reported, not waited for (ll_begin, ll_end).
// - staged (larger parts): every sender writes its parts straight into the receivers' staging
//   (parity e&1, one slot per sender), then a per-block barrier whose flags carry a 32-bit payload
//   (the signature, or the element count of that pair for all-to-all-v), then every receiver
//   copies or reduces from its own local staging. Block b of every rank handles the same 16-byte
//   vectors of every part, so the per-block barrier covers exactly the data the block reads.
//
// Bad input: a signature or count that disagrees between ranks sets the error record (code 2),
// too much data for a capacity sets code 3, counts past the input code 4, a mismatch a peer found
// (all-to-all-v above two ranks) code 5; lengths are always
// clamped to what this rank's own buffers hold, so nothing is written past a buffer.

#define ERR_CAPACITY 3
#define ERR_INPUT 4
#define ERR_PEER_MISMATCH 5  // all-to-all-v above two ranks: a peer received a count it did not expect
#define ERR_OUTPUT 6  // packed device counts: the receive counts add up past the output
#define ERR_SLOT 7    // packed device counts: a part larger than a staging slot
#define ERR_PEER_FAULT 8  // packed device counts: another rank found one of the faults above
#define DYN_SIGNED 1u  // count_flags: i32/i64 counts (a negative count sends nothing)
#define DYN_PACKED 2u  // count_flags: receive counts given, the output packed at their prefix sums
#define FC_MAX_ROUNDS 8  // rounds of a pipelined staged call (barrier words per block and sender)

struct CArgs {
    u64 scount[FC_MAX_RANKS];  // all-to-all-v: elements sent to each peer
    u64 sdispl[FC_MAX_RANKS];  // ... and their offsets in the input
    u64 rcount[FC_MAX_RANKS];  // elements received from each peer
    u64 rdispl[FC_MAX_RANKS];  // ... and their offsets in the output
    u64 n;                     // elements per part (equal parts) or per message
    u64 es;                    // element size in bytes
    u64 slot_bytes;            // staging bytes per sender slot
    u64 bar_off;               // offset of the payload-barrier words
    u64 dyn_send;              // device counts: elements to send to each peer (dynamic)
    u64 dyn_recv;              // device counts: elements received from each peer (out; packed: in)
    u64 cap;                   // dynamic: output capacity per peer (packed: of the whole output)
    u64 in_count;              // dynamic: elements in the input
    u32 root;
    u32 sig;                   // signature of the call (equal on every rank)
    u32 count_bytes;           // dynamic: width of a count (4 or 8)
    u32 count_flags;           // dynamic: DYN_SIGNED, DYN_PACKED
    u32 rounds;                // pipelined kernels: rounds (1..FC_MAX_ROUNDS)
};

// (report_error, ERR_MISMATCH and the 64-bit release/acquire helpers are in all_reduce.cu.)

// Waits until the high half of *p equals the epoch; returns the low half (payload).
__device__ bool wait_word(const Args& a, const u64* p, u32 e, u32 peer, u32 phase, u64 t0,
                          u32* payload) {
    u32 spins = 0;
    u64 v;
    while (((v = ld_acquire_sys64(p)) >> 32) != e)
        if (!spin_ok(a, spins, peer, phase, t0, false, 0, e)) return false;
    *payload = (u32)v;
    return true;
}

// Waits until *p holds exactly `want` (an epoch and a payload that tells one use of the word
// in a call from an earlier one).
__device__ bool wait_exact(const Args& a, const u64* p, u64 want, u32 peer, u32 phase, u64 t0) {
    u32 spins = 0;
    while (ld_acquire_sys64(p) != want)
        if (!spin_ok(a, spins, peer, phase, t0, false, 0, 0)) return false;
    return true;
}

// ---------------------------------------------------------------- user memory, any alignment

// A register vector V (uint4: 16 bytes, uint2: 8) seen as the words a user address allows.
template <class V>
union UserVec {
    V u;
    u64 d[sizeof(V) / 8];
    u32 w[sizeof(V) / 4];
    u16 h[sizeof(V) / 2];
    u8 b[sizeof(V)];
};

// `n` valid bytes (1..sizeof(V), a multiple of the element size) at `p`; the rest reads as zero.
// Vector access when aligned, the widest scalar access the address allows otherwise (rule 8;
// 8-byte words only in a 16-byte vector: an aligned 8-byte unit is a whole uint2).
template <class V>
__device__ __forceinline__ V ld_user(const u8* p, u32 n) {
    UserVec<V> x;
    u64 ad = (u64)p;
    if (n == sizeof(V) && (ad & (sizeof(V) - 1)) == 0) return *(const V*)p;
    x.u = V{};
    if (sizeof(V) == 16 && (ad & 7) == 0 && (n & 7) == 0) {
        for (u32 i = 0; i < n / 8; i++) x.d[i] = ((const u64*)p)[i];
    } else if ((ad & 3) == 0 && (n & 3) == 0) {
        for (u32 i = 0; i < n / 4; i++) x.w[i] = ((const u32*)p)[i];
    } else if ((ad & 1) == 0 && (n & 1) == 0) {
        for (u32 i = 0; i < n / 2; i++) x.h[i] = ((const u16*)p)[i];
    } else {
        for (u32 i = 0; i < n; i++) x.b[i] = p[i];
    }
    return x.u;
}

template <class V>
__device__ __forceinline__ void st_user(u8* p, u32 n, V v) {
    UserVec<V> x;
    x.u = v;
    u64 ad = (u64)p;
    if (n == sizeof(V) && (ad & (sizeof(V) - 1)) == 0) {
        *(V*)p = v;
    } else if (sizeof(V) == 16 && (ad & 7) == 0 && (n & 7) == 0) {
        for (u32 i = 0; i < n / 8; i++) ((u64*)p)[i] = x.d[i];
    } else if ((ad & 3) == 0 && (n & 3) == 0) {
        for (u32 i = 0; i < n / 4; i++) ((u32*)p)[i] = x.w[i];
    } else if ((ad & 1) == 0 && (n & 1) == 0) {
        for (u32 i = 0; i < n / 2; i++) ((u16*)p)[i] = x.h[i];
    } else {
        for (u32 i = 0; i < n; i++) p[i] = x.b[i];
    }
}

__device__ __forceinline__ u32 min_u32(u64 a, u64 b) { return (u32)(a < b ? a : b); }

// A thread's 16-byte vectors of a part: first, first + stride, ... below end (the whole part,
// or one round of the pipelined kernels).
struct Span {
    u64 first, stride, end;
};

// Every vector of a part of `bytes` for the thread at `first` of `stride` threads.
__device__ __forceinline__ Span span_all(u64 bytes, u64 first, u64 stride) {
    return Span{first, stride, (bytes + 15) / 16};
}

// Moving a span: whole 16-byte vectors between 16-byte aligned ends take COLL_UNROLL of the
// thread's vectors per step with every load issued before any store (a store to a user buffer may
// alias the next load and the staging loads are volatile, so a plain loop holds one load in
// flight per thread and the local passes after the barrier run far below memory bandwidth); the
// rest (a partial last vector, or every vector of an unaligned buffer) goes one vector at a time
// through the scalar-safe accessors. The thread's set of vectors is the same either way.
#define COLL_UNROLL 4

struct UserSrc {  // a user buffer read
    const u8* p;
    __device__ uint4 fast(u64 v) const { return *(const uint4*)(p + v * 16); }
    __device__ uint4 slow(u64 v, u32 n) const { return ld_user<uint4>(p + v * 16, n); }
};
struct SlotSrc {  // a local staging slot read after the barrier (16-byte aligned and padded)
    const u8* p;
    __device__ uint4 fast(u64 v) const { return ld_v4((const uint4*)(p + v * 16)); }
    __device__ uint4 slow(u64 v, u32) const { return fast(v); }
};
struct UserDst {  // a user buffer written
    u8* p;
    __device__ void fast(u64 v, uint4 x) const { *(uint4*)(p + v * 16) = x; }
    __device__ void slow(u64 v, u32 n, uint4 x) const { st_user(p + v * 16, n, x); }
};
struct SlotDst {  // a staging slot written (a peer's over NVLink)
    u8* p;
    __device__ void fast(u64 v, uint4 x) const { *(uint4*)(p + v * 16) = x; }
    __device__ void slow(u64 v, u32, uint4 x) const { fast(v, x); }
};

__device__ __forceinline__ bool al16(const void* p) { return ((u64)p & 15) == 0; }

// The end of the unrolled part of a span (whole vectors, both ends aligned) and the thread's
// first vector at or after it.
__device__ __forceinline__ u64 fast_end(Span q, u64 bytes, bool aligned) {
    u64 nfull = aligned ? bytes / 16 : 0;
    return q.end < nfull ? q.end : nfull;
}
__device__ __forceinline__ u64 first_from(Span q, u64 lo) {
    return lo <= q.first ? q.first : q.first + (lo - q.first + q.stride - 1) / q.stride * q.stride;
}

template <class Dst, class Src>
__device__ __forceinline__ void move_span(Dst d, Src s, u64 bytes, Span q, bool aligned) {
    u64 fend = fast_end(q, bytes, aligned);
    for (u64 b = q.first; b < fend; b += COLL_UNROLL * q.stride) {
        uint4 x[COLL_UNROLL];
#pragma unroll
        for (u32 k = 0; k < COLL_UNROLL; k++)
            if (b + k * q.stride < fend) x[k] = s.fast(b + k * q.stride);
#pragma unroll
        for (u32 k = 0; k < COLL_UNROLL; k++)
            if (b + k * q.stride < fend) d.fast(b + k * q.stride, x[k]);
    }
    for (u64 v = first_from(q, fend); v < q.end; v += q.stride) {
        u32 n = min_u32(16, bytes - v * 16);
        d.slow(v, n, s.slow(v, n));
    }
}

// The span's vectors of `src` (a user buffer) into a staging slot.
__device__ __forceinline__ void put_span(u8* slot, const u8* src, u64 bytes, Span q) {
    move_span(SlotDst{slot}, UserSrc{src}, bytes, q, al16(src));
}

// The span's vectors of a local staging slot into `dst` (a user buffer).
__device__ __forceinline__ void get_span(u8* dst, const u8* slot, u64 bytes, Span q) {
    move_span(UserDst{dst}, SlotSrc{slot}, bytes, q, al16(dst));
}

// The span's vectors between distinct user buffers.
__device__ __forceinline__ void copy_span(u8* dst, const u8* src, u64 bytes, Span q) {
    move_span(UserDst{dst}, UserSrc{src}, bytes, q, al16(dst) && al16(src));
}

// Local copy of `bytes` from src to dst by every thread of the grid (no partition constraint).
__device__ void copy_local(u8* dst, const u8* src, u64 bytes) {
    if (dst == src || bytes == 0) return;
    copy_span(dst, src, bytes,
              span_all(bytes, (u64)blockIdx.x * blockDim.x + threadIdx.x, (u64)gridDim.x * blockDim.x));
}

// ---------------------------------------------------------------- staged protocol helpers

__device__ __forceinline__ u8* slot_ptr(const Args& a, const CArgs& c, u32 owner, u32 e, u32 sender) {
    return (u8*)(a.staging[owner] + (u64)(e & 1) * a.staging_bytes + (u64)sender * c.slot_bytes);
}

__device__ __forceinline__ u64* bar_word(const Args& a, const CArgs& c, u32 owner, u32 e, u32 sender,
                                         u32 round = 0) {
    return (u64*)(a.flags[owner] + c.bar_off) +
           ((((e & 1) * FC_MAX_ROUNDS + round) * FC_MAX_BLOCKS + blockIdx.x) * FC_MAX_RANKS + sender);
}

// Block b meets block b of every rank, each word carrying `out[peer]` to that peer; the words
// received land in `in[peer]` (shared memory). Rule 1: bar.sync orders the block's staging
// writes before the release store; the acquire makes the peers' writes visible after bar.sync.
// Rule 2: per-block words, epochs in the high half compared for equality, parity by epoch.
// The remote (NVLink) staging stores of every thread are ordered before the release by bar.sync
// and the release's cumulativity, as in the all-reduce's stream kernel (no per-thread fence).
__device__ bool payload_barrier(const Args& a, const CArgs& c, u32 e, u64 t0, const u32* out,
                                u32* in) {
    __syncthreads();
    bool ok = true;
    if (threadIdx.x < a.world) {
        u32 p = threadIdx.x;
        st_release_sys64(bar_word(a, c, p, e, a.rank), ((u64)e << 32) | out[p]);
        ok = wait_word(a, bar_word(a, c, a.rank, e, p), e, p, 20, t0, &in[p]);
    }
    return __syncthreads_and(ok) != 0;
}

// One staged call as a kernel sees it, taken at its start: its clock and epoch, the user
// buffers, and this thread's first vector and the grid's stride (every rank's grid is alike).
struct St {
    u64 t0;
    u32 e;
    const u8* in;
    u8* out;
    u64 first, stride;
};

__device__ __forceinline__ St st_begin(const Args& a) {
    St s;
    s.t0 = globaltimer();
    s.e = call_epoch(a);
    s.in = (const u8*)a.input;
    s.out = (u8*)a.output;
    s.first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    s.stride = (u64)gridDim.x * blockDim.x;
    return s;
}

// Sender side of one part: this block's vectors of `bytes` at `src` into a peer's slot.
__device__ __forceinline__ void put_part(u8* slot, const u8* src, u64 bytes, u64 first, u64 stride) {
    put_span(slot, src, bytes, span_all(bytes, first, stride));
}

// Receiver side: the same vectors from the local slot into the user's buffer.
__device__ __forceinline__ void get_part(u8* dst, const u8* slot, u64 bytes, u64 first, u64 stride) {
    get_span(dst, slot, bytes, span_all(bytes, first, stride));
}

// Reduces vector v of the part held in rank order: the own part from `own`, every other
// rank's from its slot in the local staging (rule 5: fixed order; rule 6: f32 for half types).
template <int OP>
__device__ __forceinline__ void reduce_part_vec(const Args& a, const CArgs& c, u32 e, const u8* own,
                                                u64 bytes, u64 v, u8* dst) {
    u32 n = min_u32(16, bytes - v * 16);
    Vec in[FC_MAX_RANKS];
#pragma unroll
    for (u32 r = 0; r < FC_MAX_RANKS; r++)
        if (r < a.world) {
            if (r == a.rank) in[r].u = ld_user<uint4>(own + v * 16, n);
            else in[r].u = ld_v4((const uint4*)(slot_ptr(a, c, a.rank, e, r) + v * 16));
        }
    st_user(dst + v * 16, n, reduce_ranks<OP, FC_MAX_RANKS>(a, in).u);
}

// reduce_part_vec over the span's vectors into `dst`. With two ranks and aligned ends the whole
// vectors go U per step, every load first (see move_span). The pipelined kernel takes U = 2: it
// sits at the 128-register limit of 512-thread blocks and keeps part of the loaded vectors in
// local memory even so (at 4, all of them); its 64 MB reduce-scatter gained 117.7 -> 114.0 us.
template <int OP, int U = COLL_UNROLL>
__device__ __forceinline__ void reduce_span(const Args& a, const CArgs& c, u32 e, const u8* own,
                                            u64 bytes, Span q, u8* dst) {
    u64 fend = a.world == 2 ? fast_end(q, bytes, al16(own) && al16(dst)) : 0;
    const u8* peer = slot_ptr(a, c, a.rank, e, a.rank ^ 1);  // read only when world == 2
    for (u64 b = q.first; b < fend; b += U * q.stride) {
        uint4 mine[U], theirs[U];
#pragma unroll
        for (u32 k = 0; k < U; k++) {
            u64 v = b + k * q.stride;
            if (v < fend) {
                mine[k] = *(const uint4*)(own + v * 16);
                theirs[k] = ld_v4((const uint4*)(peer + v * 16));
            }
        }
#pragma unroll
        for (u32 k = 0; k < U; k++) {
            u64 v = b + k * q.stride;
            if (v < fend) {
                Vec in[2];  // rank order
                in[0].u = a.rank == 0 ? mine[k] : theirs[k];
                in[1].u = a.rank == 0 ? theirs[k] : mine[k];
                *(uint4*)(dst + v * 16) = reduce_ranks<OP, 2>(a, in).u;
            }
        }
    }
    for (u64 v = first_from(q, fend); v < q.end; v += q.stride)
        reduce_part_vec<OP>(a, c, e, own, bytes, v, dst);
}

// ---------------------------------------------------------------- LL protocol helpers

// One LL call as a kernel sees it: its clock and epoch, its own lines of this call's parity, and
// this thread's first unit and the grid's stride, computed once per call; sends go peer by peer,
// each peer's region taken once.
struct Ll {
    u64 t0;
    u32 e;
    u64 row;         // bytes of one sender's lines
    u64 par;         // offset of this call's parity in every rank's push region
    const u8* mine;  // own push region
    u64 first;       // this thread's first unit
    u64 stride;      // units between a thread's units
};

__device__ __forceinline__ u64 ll_first() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }

// The LL kernels' hellos (all_reduce.cu: hello_send, hello_check) go from and to the last warp
// of block 0: stored at the start, checked at the end. A receiver reads its units without
// waiting for the sender's hello first (every unit's flags prove it is this call's), and a wait
// that spins long enough to check its clock also looks at the peers' hellos, so a peer in
// another call is reported instead of waited for. At the end block 0 has heard from every peer,
// so no rank runs two calls ahead of another even when it receives nothing (the broadcast root).
__device__ __forceinline__ u32 ll_hello_base() { return blockDim.x - 32; }

// Every LL kernel's start: the clock, the epoch word and the hellos out. Kernels load their
// first input unit before calling it, so that load and the epoch word's overlap (a small
// message is one unit per thread).
__device__ __forceinline__ Ll ll_begin(const Args& a, const CArgs& c) {
    Ll l;
    l.t0 = globaltimer();
    l.e = call_epoch(a);
    l.row = 2 * a.push_cap;
    l.par = (u64)(l.e & 1) * a.world * l.row;
    l.mine = (const u8*)a.push[a.rank];
    l.first = ll_first();
    l.stride = (u64)gridDim.x * blockDim.x;
    hello_send(a, c.sig, l.e, ll_hello_base());
    return l;
}

__device__ void ll_end(const Args& a, const CArgs& c, const Ll& l) {
    hello_check(a, c.sig, l.e, l.t0, ll_hello_base(), 30);
    end_call(a, l.e);
}

// Unit u of the user buffer `p` of `bytes` bytes (the last one may be short).
__device__ __forceinline__ uint2 ll_load(const u8* p, u64 bytes, u64 u) {
    return ld_user<uint2>(p + u * 8, min_u32(8, bytes - u * 8));
}
__device__ __forceinline__ void ll_store(u8* p, u64 bytes, u64 u, uint2 x) {
    st_user(p + u * 8, min_u32(8, bytes - u * 8), x);
}

// Unit u into this rank's lines in the push region at `base` (a peer's).
__device__ __forceinline__ void ll_send_at(const Args& a, const Ll& l, u64 base, u64 u, uint2 x) {
    st_ll((uint4*)(base + l.par + a.rank * l.row + u * 16), x.x, x.y, l.e);
}

// The LL kernels are built twice, for any world (W = 0) and for two ranks (W = 2), where every
// loop over peers has one step known at compile time: on 2xH200 a 1 KB all-gather with its
// loops over peers ran 1.94 us per kernel against 1.82 without them
// (run 2026-11-30-h200x2-ll-probe, commit 4a4720e, T2 against T0).
template <u32 W>
__device__ __forceinline__ u32 ll_world(const Args& a) { return W ? W : a.world; }

// The k-th rank after this one (k = 1 .. world-1): every peer once.
template <u32 W>
__device__ __forceinline__ u32 ll_peer(const Args& a, u32 k) {
    u32 p = a.rank + k;
    return p >= ll_world<W>(a) ? p - ll_world<W>(a) : p;
}

// Polls unit u from `from` in the own lines; false on timeout (recorded).
__device__ __forceinline__ bool ll_recv(const Args& a, const CArgs& c, const Ll& l, u32 from, u64 u,
                                        uint2* out) {
    const uint4* p = (const uint4*)(l.mine + l.par + from * l.row + u * 16);
    uint4 v = ld_v4(p);
    u32 spins = 0;
    // Both flags: each covers its own 4-byte half (rule 4: every element checked).
    while (v.y != l.e || v.w != l.e) {
        if (!spin_ok(a, spins, from, 31, l.t0, true, c.sig, l.e)) return false;
        v = ld_v4(p);
    }
    *out = make_uint2(v.x, v.z);
    return true;
}

// LL receive side of the data movers: each peer's units into part s of `out`. False on a
// timeout or a peer in another call (recorded).
template <u32 W>
__device__ __forceinline__ bool ll_receive_parts(const Args& a, const CArgs& c, const Ll& l, u8* out,
                                                 u64 bytes) {
    u64 nunit = (bytes + 7) / 8;
    bool ok = true;
    for (u32 k = 1; k < ll_world<W>(a) && ok; k++) {
        u32 s = ll_peer<W>(a, k);
        for (u64 u = l.first; u < nunit && ok; u += l.stride) {
            uint2 x;
            ok = ll_recv(a, c, l, s, u, &x);
            if (ok) ll_store(out + s * bytes, bytes, u, x);
        }
    }
    return ok;
}

// The entry of an LL kernel `name`: its two-rank build at two ranks, the other one elsewhere.
#define LL_ENTRY(name)                                                                        \
    extern "C" __global__ void __launch_bounds__(512) fc_##name(Args a, CArgs c) {           \
        pdl_wait_mark(a);                                                                           \
        pdl_launch_dependents();                                                              \
        if (a.world == 2) name<2>(a, c);                                                      \
        else name<0>(a, c);                                                                   \
    }

// Staged kernels meet through the payload barrier, which carries this call's signature to every
// peer; block 0 reports a peer whose signature differs. False when a peer timed out.
__device__ bool st_meet(const Args& a, const CArgs& c, u32 e, u64 t0, u32* out_w, u32* in_w) {
    if (threadIdx.x < a.world) out_w[threadIdx.x] = c.sig;
    bool ok = payload_barrier(a, c, e, t0, out_w, in_w);
    if (ok && blockIdx.x == 0 && threadIdx.x < a.world && in_w[threadIdx.x] != c.sig)
        report_error(a, ERR_MISMATCH, threadIdx.x, in_w[threadIdx.x]);
    return ok;
}

// Part p of `in` into every peer p's slot (the staged senders' side); parts lie `part_stride`
// bytes apart, 0 sending the whole input to every peer.
__device__ __forceinline__ void put_parts(const Args& a, const CArgs& c, u32 e, const u8* in,
                                          u64 part_stride, u64 bytes, u64 first, u64 stride) {
    for (u32 p = 0; p < a.world; p++)
        if (p != a.rank) put_part(slot_ptr(a, c, p, e, a.rank), in + p * part_stride, bytes, first, stride);
}

// Every peer's slot of this call into part s of `out` (the data movers' receive side).
__device__ void get_parts(const Args& a, const CArgs& c, u32 e, u8* out, u64 bytes, u64 first,
                          u64 stride) {
    for (u32 s = 0; s < a.world; s++)
        if (s != a.rank) get_part(out + s * bytes, slot_ptr(a, c, a.rank, e, s), bytes, first, stride);
}
// `bytes` of `in` (this thread's first unit `x` already loaded) into every peer's lines, then
// into `own` unless they are there already (the all-gather's own part, the broadcast root's
// output).
template <u32 W>
__device__ __forceinline__ void ll_send_all(const Args& a, const Ll& l, const u8* in, u64 bytes,
                                            u64 first, uint2 x, u8* own) {
    u64 nunit = (bytes + 7) / 8;
    for (u32 k = 1; k < ll_world<W>(a); k++) {
        u64 to = a.push[ll_peer<W>(a, k)];
        for (u64 u = first; u < nunit; u += l.stride)
            ll_send_at(a, l, to, u, u == first ? x : ll_load(in, bytes, u));
    }
    if (in != own)
        for (u64 u = first; u < nunit; u += l.stride)
            ll_store(own, bytes, u, u == first ? x : ll_load(in, bytes, u));
}

// The staged data movers: the all-gather sends its whole input to every rank, the all-to-all
// (A2A) part p of its input to rank p; every rank's remote stores go first, then the own part's
// local copy while they travel (all-to-all in place: in rank order, rank 0 copied before it sent
// anything and the barrier waited for it).
template <bool A2A>
__device__ __forceinline__ void move_st(const Args& a, const CArgs& c) {
    __shared__ u32 out_w[FC_MAX_RANKS], in_w[FC_MAX_RANKS];
    auto [t0, e, in, out, first, stride] = st_begin(a);
    u64 bytes = c.n * c.es;
    put_parts(a, c, e, in, A2A ? bytes : 0, bytes, first, stride);
    copy_local(out + a.rank * bytes, A2A ? in + a.rank * bytes : in, bytes);
    if (st_meet(a, c, e, t0, out_w, in_w)) get_parts(a, c, e, out, bytes, first, stride);
    end_call(a, e);
}

// ---------------------------------------------------------------- all-gather

// input: n elements; output: world * n, part r from rank r. In place: input == own part.
template <u32 W>
__device__ __forceinline__ void all_gather_ll(const Args& a, const CArgs& c) {
    u64 bytes = c.n * c.es;
    u64 nunit = (bytes + 7) / 8;
    const u8* in = (const u8*)a.input;
    u8* out = (u8*)a.output;
    u64 first = ll_first();
    uint2 x = first < nunit ? ll_load(in, bytes, first) : make_uint2(0, 0);
    Ll l = ll_begin(a, c);
    ll_send_all<W>(a, l, in, bytes, first, x, out + a.rank * bytes);
    ll_receive_parts<W>(a, c, l, out, bytes);
    ll_end(a, c, l);
}

#ifdef FC_GROUP_ALL_GATHER
LL_ENTRY(all_gather_ll)
#endif

#ifdef FC_GROUP_ALL_GATHER
extern "C" __global__ void __launch_bounds__(512) fc_all_gather_st(Args a, CArgs c) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    move_st<false>(a, c);
}
#endif

// ---------------------------------------------------------------- all-to-all (equal parts)

// input and output: world * n; part p of the input goes to rank p, part s of the output comes
// from rank s. In place: each thread reads a unit of part p before writing that unit of part p.
template <u32 W>
__device__ __forceinline__ void all_to_all_ll(const Args& a, const CArgs& c) {
    u64 bytes = c.n * c.es;
    const u8* in = (const u8*)a.input;
    u8* out = (u8*)a.output;
    Ll l = ll_begin(a, c);
    u64 nunit = (bytes + 7) / 8;
    for (u32 k = 1; k < ll_world<W>(a); k++) {
        u32 p = ll_peer<W>(a, k);
        u64 to = a.push[p];
        for (u64 u = l.first; u < nunit; u += l.stride)
            ll_send_at(a, l, to, u, ll_load(in + p * bytes, bytes, u));
    }
    if (in != out)
        for (u64 u = l.first; u < nunit; u += l.stride)
            ll_store(out + a.rank * bytes, bytes, u, ll_load(in + a.rank * bytes, bytes, u));
    ll_receive_parts<W>(a, c, l, out, bytes);
    ll_end(a, c, l);
}

#ifdef FC_GROUP_ALL_TO_ALL
LL_ENTRY(all_to_all_ll)
#endif

#ifdef FC_GROUP_ALL_TO_ALL
extern "C" __global__ void __launch_bounds__(512) fc_all_to_all_st(Args a, CArgs c) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    move_st<true>(a, c);
}
#endif

// ---------------------------------------------------------------- all-to-all-v (host counts)

// Staged, on a grid every rank launches alike. With c.sig set (two ranks: a signature over
// both crossing counts, cuda/collectives.rs) the barrier words carry it and a rank whose peer's
// differs reports it and reads nothing from that peer, so both ranks see the mismatch. Without
// it (more ranks, where no rank sees every count) the word to peer p carries the count sent to
// p; the receiver compares it with the count it expects from p and takes the smaller (a
// mismatch is reported by that receiver). Counts were checked against the slot size on the host.
#ifdef FC_GROUP_ALL_TO_ALL
extern "C" __global__ void __launch_bounds__(512) fc_all_to_all_v_st(Args a, CArgs c) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    __shared__ u32 out_w[FC_MAX_RANKS], in_w[FC_MAX_RANKS];
    auto [t0, e, in, out, first, stride] = st_begin(a);
    u64 es = c.es;
    for (u32 p = 0; p < a.world; p++) {
        if (p == a.rank) continue;
        put_part(slot_ptr(a, c, p, e, a.rank), in + c.sdispl[p] * es, c.scount[p] * es, first, stride);
    }
    if (threadIdx.x < a.world) out_w[threadIdx.x] = c.sig ? c.sig : (u32)c.scount[threadIdx.x];
    bool ok = payload_barrier(a, c, e, t0, out_w, in_w);
    if (ok) {
        // In place (host: only with equal send and receive counts) the thread that sent a
        // vector of part p is the one that overwrites it, after the barrier.
        for (u32 s = 0; s < a.world; s++) {
            u64 want = c.rcount[s];
            if (s == a.rank) {
                u64 take = want < c.scount[s] ? want : c.scount[s];
                if (want != c.scount[s] && blockIdx.x == 0 && threadIdx.x == 0)
                    report_error(a, ERR_MISMATCH, s, (u32)c.scount[s]);
                u8* dst = out + c.rdispl[s] * es;
                const u8* src = in + c.sdispl[s] * es;
                copy_local(dst, src, take * es);
                continue;
            }
            u64 got = in_w[s];
            bool bad = c.sig ? got != c.sig : got != want;
            if (bad && blockIdx.x == 0 && threadIdx.x == 0) report_error(a, ERR_MISMATCH, s, (u32)got);
            u64 take = c.sig ? (bad ? 0 : want) : (got < want ? got : want);
            get_part(out + c.rdispl[s] * es, slot_ptr(a, c, a.rank, e, s), take * es, first, stride);
        }
    }
    end_call(a, e);
}
#endif

// Any number of ranks, any counts, one launch: every part that crosses goes in pieces of
// c.n elements through half of its sender slot (piece k in half k & 1), pair by pair, so no rank
// needs a count it does not see. Per block, sender s and receiver r meet through two words in
// the payload-barrier area (rounds 0-1: data, in r's memory; rounds 2-3: acknowledgements, in
// s's memory), the epoch in the high half as everywhere:
// - s writes its vectors of piece k into r's slot half k & 1, then (bar.sync, release) the data
//   word with the piece's element count, bit 31 set on the pair's last piece. A pair always has
//   a piece 0, empty or not, so r learns where the pair ends from s alone.
// - r waits for that word, zeroes it (its own memory: the next piece in this half is written
//   only after r's acknowledgement, so the zero comes first), copies the piece out, and
//   acknowledges with k in the ack word. s waits for the acknowledgement of k - 2 before it
//   writes piece k into the same half; the payload k tells acknowledgements of one call apart.
// r copies only what it expects (rcount), at the piece's offset, never past a part; where the
// elements s sent differ from that it reports a mismatch, and a last exchange of words (round 4)
// carries that verdict to every rank, so all of them report it. Every block moves the same
// vectors of every piece on every rank (one grid for all ranks), so per-block words cover
// exactly what the block reads. The next call in this parity comes two calls later, after every
// peer has sent at least its piece 0 of the call in between (so has finished this one).
#define PC_LAST 0x80000000u

#ifdef FC_GROUP_ALL_TO_ALL
extern "C" __global__ void __launch_bounds__(512) fc_all_to_all_v_pc(Args a, CArgs c) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    __shared__ u32 got_w[FC_MAX_RANKS];
    __shared__ u64 got_total[FC_MAX_RANKS];
    __shared__ u32 recv_done[FC_MAX_RANKS];
    __shared__ u32 verdict;  // 1 + the first sender whose elements differed from rcount, or 0
    auto [t0, e, in, out, first, stride] = st_begin(a);
    u64 es = c.es, piece = c.n;
    u64 half = piece * es;  // bytes of one slot half (a multiple of 16)
    u32 me = a.rank, t = threadIdx.x;
    if (t < a.world) {
        got_total[t] = 0;
        recv_done[t] = t == me;
    }
    if (t == 0) verdict = 0;
    // Pieces of each part sent (at least one), and the most of them.
    u64 send_pieces_max = 1;
    for (u32 p = 0; p < a.world; p++) {
        u64 n = p == me ? 1 : (c.scount[p] + piece - 1) / piece;
        if (n > send_pieces_max) send_pieces_max = n;
    }
    copy_local(out + c.rdispl[me] * es, in + c.sdispl[me] * es,
               (c.rcount[me] < c.scount[me] ? c.rcount[me] : c.scount[me]) * es);
    __syncthreads();
    bool ok = true;
    for (u64 k = 0;; k++) {
        // Send piece k of every part that has one: after the acknowledgement of piece k - 2.
        if (t < a.world && t != me) {
            u64 n = c.scount[t] > 0 ? (c.scount[t] + piece - 1) / piece : 1;
            // The word may still hold the acknowledgement of k - 4: wait for k - 2 itself.
            if (k < n && k >= 2)
                ok = wait_exact(a, bar_word(a, c, me, e, t, 2 + (k & 1)), ((u64)e << 32) | (u32)(k - 2),
                                t, 21, t0);
        }
        if (!__syncthreads_and(ok)) break;
        for (u32 p = 0; p < a.world; p++) {
            if (p == me) continue;
            u64 at = k * piece;
            if (at >= c.scount[p] && !(k == 0 && c.scount[p] == 0)) continue;
            u64 n = c.scount[p] - at < piece ? c.scount[p] - at : piece;
            put_part(slot_ptr(a, c, p, e, me) + (k & 1) * half, in + (c.sdispl[p] + at) * es, n * es,
                     first, stride);
        }
        __syncthreads();
        if (t < a.world && t != me) {
            u64 at = k * piece, cnt = c.scount[t];
            if (at < cnt || (k == 0 && cnt == 0)) {
                u64 n = cnt - at < piece ? cnt - at : piece;
                u32 w = (u32)n | (at + n >= cnt ? PC_LAST : 0u);
                st_release_sys64(bar_word(a, c, t, e, me, k & 1), ((u64)e << 32) | w);
            }
        }
        // Receive piece k from every sender whose pair has not ended.
        if (t < a.world && !recv_done[t]) {
            u64* wp = bar_word(a, c, me, e, t, k & 1);
            ok = wait_word(a, wp, e, t, 22, t0, &got_w[t]);
            if (ok) *(volatile u64*)wp = 0;
        }
        if (!__syncthreads_and(ok)) break;
        bool more = false;
        for (u32 s = 0; s < a.world; s++) {
            if (recv_done[s]) continue;
            u64 n = got_w[s] & ~PC_LAST, at = k * piece, want = c.rcount[s];
            u64 take = at >= want ? 0 : (want - at < n ? want - at : n);
            get_part(out + (c.rdispl[s] + at) * es, slot_ptr(a, c, me, e, s) + (k & 1) * half,
                     take * es, first, stride);
        }
        __syncthreads();
        if (t < a.world && !recv_done[t]) {
            st_release_sys64(bar_word(a, c, t, e, me, 2 + (k & 1)), ((u64)e << 32) | (u32)k);
            got_total[t] += got_w[t] & ~PC_LAST;
            if (got_w[t] & PC_LAST) {
                recv_done[t] = 1;
                if (got_total[t] != c.rcount[t]) {
                    atomicCAS(&verdict, 0u, t + 1);
                    if (blockIdx.x == 0) report_error(a, ERR_MISMATCH, t, (u32)got_total[t]);
                }
            }
        }
        __syncthreads();
        for (u32 s = 0; s < a.world; s++) more |= !recv_done[s];
        if (!more && k + 1 >= send_pieces_max) break;
    }
    // Verdict: only a receiver sees that a sender's count differs from its own, so every rank
    // tells every peer (round 4 words) whether its receives matched; a mismatch found anywhere
    // is then reported on every rank, which all leave their next call alike.
    if (ok) {
        if (t < a.world && t != me) {
            st_release_sys64(bar_word(a, c, t, e, me, 4), ((u64)e << 32) | verdict);
            ok = wait_word(a, bar_word(a, c, me, e, t, 4), e, t, 23, t0, &got_w[t]);
            if (ok && got_w[t] != 0 && blockIdx.x == 0)
                report_error(a, ERR_PEER_MISMATCH, t, got_w[t] - 1);
        }
        __syncthreads();
    }
    end_call(a, e);
}
#endif

// LL form for two ranks with crossing parts up to LL_MAX_BYTES (cuda/collectives.rs): as
// fc_all_to_all_ll with each part's count and displacement. The hello carries the call's
// signature, which covers both crossing counts in rank order, so ranks whose counts differ
// report it (at the end, or as soon as a receiver waits for units its peer never sends); what a
// receiver took meanwhile stays within its own counts. No per-block barrier: every unit carries its
// own flags, so the grid need not be the same on both ranks (each sizes it to its own parts,
// the own one included). In place (equal counts, so equal displacements) each thread reads a
// unit of part p before it writes that unit of part p.
#ifdef FC_GROUP_ALL_TO_ALL
extern "C" __global__ void __launch_bounds__(512) fc_all_to_all_v_ll(Args a, CArgs c) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    const u8* in = (const u8*)a.input;
    u8* out = (u8*)a.output;
    u64 es = c.es;
    Ll l = ll_begin(a, c);
    for (u32 p = 0; p < a.world; p++) {
        u64 bytes = c.scount[p] * es;
        const u8* src = in + c.sdispl[p] * es;
        u8* own = out + c.rdispl[p] * es;  // p == rank only
        if (p == a.rank && src == own) continue;
        u64 to = a.push[p];  // once per peer, not per unit
        for (u64 u = l.first; u < (bytes + 7) / 8; u += l.stride) {
            uint2 x = ll_load(src, bytes, u);
            if (p != a.rank) ll_send_at(a, l, to, u, x);
            else ll_store(own, bytes, u, x);
        }
    }
    bool ok = true;
    for (u32 s = 0; s < a.world && ok; s++) {
        if (s == a.rank) continue;
        u64 bytes = c.rcount[s] * es;
        u64 nunit = (bytes + 7) / 8;
        for (u64 u = l.first; u < nunit && ok; u += l.stride) {
            uint2 x;
            ok = ll_recv(a, c, l, s, u, &x);
            if (ok) ll_store(out + c.rdispl[s] * es, bytes, u, x);
        }
    }
    ll_end(a, c, l);
}
#endif

// ---------------------------------------------------------------- all-to-all-v (device counts)

// Reads a count written by an earlier kernel on the stream (i32, u32, i64 or u64, as the host
// backend's read_count): a negative signed count sends nothing.
__device__ __forceinline__ u64 dev_count(const CArgs& c, u64 base, u32 i) {
    if (c.count_bytes == 4) {
        u32 v = ((const u32*)base)[i];
        return (c.count_flags & DYN_SIGNED) && (i32)v < 0 ? 0 : (u64)v;
    }
    u64 v = ((const u64*)base)[i];
    return (c.count_flags & DYN_SIGNED) && (i64)v < 0 ? 0 : v;
}

// Mixture-of-experts dispatch: send counts live on the device (no host sync). The input is
// packed in rank order (offsets = prefix sums of the counts); the part from rank s lands at
// s * cap in the output, at most `cap` elements; the counts received go to `dyn_recv`. More than
// `cap` (or past the input, or past a staging slot): truncated and reported, never written past.
// Packed (DYN_PACKED, NCCLX's device_alltoallv_single): `dyn_recv` holds the counts expected
// from each rank and the part from rank s lands at their prefix sum, within `cap` elements in
// all; a part whose length differs from the one expected is a mismatch (what fits both is
// copied), told to every rank by a verdict line; parts past the output or a slot: truncated
// and reported.
//
// No rank knows what the others send before the call, so each pair chooses its own protocol by
// the count its sender announces, which both ends then know: block 0 of every sender stores the
// count as LL unit 0 of its lines in the receiver's push region, then a part of at most c.n bytes
// follows as LL units 1.. (no barrier: a small dispatch costs one flight), a larger one goes into
// the receiver's staging slot and every sender block releases its barrier word to the receiver
// once its vectors are there (block b of both ranks handles the same vectors; the grid is the
// same on every rank, a2av_grid). Slots and lines are reused two calls later, after every rank
// has heard every peer's hello of the call between (ll_end), as in the LL collectives. In packed
// mode each rank knows its verdict as soon as it has the headers and stores it as the last LL
// unit of its lines in every peer; every rank reads its peers' at the end, so a fault one rank
// finds is reported on all of them without a round trip of its own.
#ifdef FC_GROUP_ALL_TO_ALL
extern "C" __global__ void __launch_bounds__(512) fc_all_to_all_dyn(Args a, CArgs c) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    __shared__ u64 told[FC_MAX_RANKS], sent[FC_MAX_RANKS], displ[FC_MAX_RANKS];
    __shared__ u64 got[FC_MAX_RANKS], take[FC_MAX_RANKS];
    __shared__ u64 rlen[FC_MAX_RANKS], rdispl[FC_MAX_RANKS];
    __shared__ u32 verdict;
    bool packed = (c.count_flags & DYN_PACKED) != 0;
    const u8* in = (const u8*)a.input;
    u8* out = (u8*)a.output;
    u64 es = c.es, ll_bytes = c.n;
    u64 slot_elems = c.slot_bytes / es;
    u32 me = a.rank, t = threadIdx.x;
    u64 vunit = a.push_cap / 8 - 1;  // the verdict's unit: the last of a sender's lines
    Ll l = ll_begin(a, c);
    if (t == 0) {
        u64 d = 0;
        bool over = false;
        for (u32 p = 0; p < a.world; p++) {
            u64 want = dev_count(c, c.dyn_send, p);
            u64 avail = d < c.in_count ? c.in_count - d : 0;
            u64 n = want < avail ? want : avail;
            if (n < want) over = true;
            // The receiver is told what really exists (elements past the input are never
            // announced, so it never copies a stale slot); it compares that with its capacity
            // (<= the slot), so a part cut at the slot is always reported there.
            told[p] = n;
            sent[p] = n < slot_elems ? n : slot_elems;
            displ[p] = d;
            d += want;
        }
        if (over && blockIdx.x == 0) report_error(a, ERR_INPUT, me, (u32)d);
        // The verdict this rank tells its peers in packed mode: 0, or the fault it found (the
        // kind in the high half, the rank concerned + 1 in the low half).
        verdict = over ? (ERR_INPUT << 16) | (me + 1) : 0;
        if (packed) {
            u64 r = 0;
            for (u32 s = 0; s < a.world; s++) {
                rlen[s] = dev_count(c, c.dyn_recv, s);
                rdispl[s] = r < c.cap ? r : c.cap;
                r += rlen[s];
            }
            if (r > c.cap) {
                verdict = (ERR_OUTPUT << 16) | (me + 1);
                if (blockIdx.x == 0) report_error(a, ERR_OUTPUT, me, (u32)r);
            }
        }
    }
    __syncthreads();
    if (blockIdx.x == 0 && t < a.world && t != me)
        ll_send_at(a, l, a.push[t], 0, make_uint2((u32)told[t], (u32)(told[t] >> 32)));
    for (u32 p = 0; p < a.world; p++) {
        if (p == me) continue;
        u64 bytes = sent[p] * es;
        const u8* src = in + displ[p] * es;
        if (told[p] * es <= ll_bytes) {
            u64 to = a.push[p];
            for (u64 u = l.first; u < (bytes + 7) / 8; u += l.stride)
                ll_send_at(a, l, to, u + 1, ll_load(src, bytes, u));
        } else {
            put_part(slot_ptr(a, c, p, l.e, me), src, bytes, l.first, l.stride);
        }
    }
    // Staged parts: this block's vectors are in the peer's slot (bar.sync, then the release's
    // cumulativity, as payload_barrier).
    __syncthreads();
    if (t < a.world && t != me && told[t] * es > ll_bytes)
        st_release_sys64(bar_word(a, c, t, l.e, me), ((u64)l.e << 32) | 1u);
    // Every sender's header.
    bool ok = true;
    if (t < a.world) {
        uint2 x = make_uint2((u32)told[me], (u32)(told[me] >> 32));
        if (t != me) ok = ll_recv(a, c, l, t, 0, &x);
        got[t] = ((u64)x.y << 32) | x.x;
    }
    ok = __syncthreads_and(ok) != 0;
    if (ok && t == 0) {
        for (u32 s = 0; s < a.world; s++) {
            u64 g = got[s];
            u64 room = packed ? c.cap - rdispl[s] : c.cap;
            u64 n = g < room ? g : room;
            if (packed && n > rlen[s]) n = rlen[s];
            if (s == me) {
                if (n > sent[s]) n = sent[s];
            } else if (n > slot_elems) {
                n = slot_elems;
            }
            take[s] = n;
            if (blockIdx.x != 0) continue;
            if (packed) {
                if (g != rlen[s]) {
                    verdict = (ERR_MISMATCH << 16) | (s + 1);
                    report_error(a, ERR_MISMATCH, s, (u32)g);
                } else if (s != me && g > slot_elems) {
                    verdict = (ERR_SLOT << 16) | (s + 1);
                    report_error(a, ERR_SLOT, s, (u32)g);
                }
            } else {
                if (g > c.cap) report_error(a, ERR_CAPACITY, s, (u32)g);
                if (c.count_bytes == 4) ((u32*)c.dyn_recv)[s] = (u32)n;
                else ((u64*)c.dyn_recv)[s] = n;
            }
        }
    }
    __syncthreads();
    if (ok && packed && blockIdx.x == 0 && t < a.world && t != me)
        ll_send_at(a, l, a.push[t], vunit, make_uint2(verdict, 0));
    for (u32 s = 0; s < a.world && ok; s++) {
        u8* dst = out + (packed ? rdispl[s] : s * c.cap) * es;
        u64 bytes = take[s] * es;
        if (s == me) {
            copy_local(dst, in + displ[s] * es, bytes);
        } else if (got[s] * es <= ll_bytes) {
            bool fine = true;
            for (u64 u = l.first; u < (bytes + 7) / 8 && fine; u += l.stride) {
                uint2 x;
                fine = ll_recv(a, c, l, s, u + 1, &x);
                if (fine) ll_store(dst, bytes, u, x);
            }
            ok = __syncthreads_and(fine) != 0;
        } else {
            u32 unused;
            bool fine = t != 0 || wait_word(a, bar_word(a, c, me, l.e, s), l.e, s, 22, l.t0, &unused);
            ok = __syncthreads_and(fine) != 0;
            if (ok) get_part(dst, slot_ptr(a, c, me, l.e, s), bytes, l.first, l.stride);
        }
    }
    if (ok && packed && blockIdx.x == 0 && t < a.world && t != me) {
        uint2 x;
        if (ll_recv(a, c, l, t, vunit, &x) && x.x != 0 && verdict == 0)
            report_error(a, ERR_PEER_FAULT, t, x.x);
    }
    ll_end(a, c, l);
}
#endif

// ---------------------------------------------------------------- broadcast

// Root's input (or its output, in place) into every rank's output.
template <u32 W>
__device__ __forceinline__ void broadcast_ll(const Args& a, const CArgs& c) {
    u64 bytes = c.n * c.es;
    u64 nunit = (bytes + 7) / 8;
    const u8* in = (const u8*)a.input;
    u8* out = (u8*)a.output;
    u64 first = ll_first();
    bool root = a.rank == c.root;
    uint2 x = root && first < nunit ? ll_load(in, bytes, first) : make_uint2(0, 0);
    Ll l = ll_begin(a, c);
    if (root) {
        ll_send_all<W>(a, l, in, bytes, first, x, out);
    } else {
        bool ok = true;
        for (u64 u = first; u < nunit && ok; u += l.stride) {
            ok = ll_recv(a, c, l, c.root, u, &x);
            if (ok) ll_store(out, bytes, u, x);
        }
    }
    ll_end(a, c, l);
}

#ifdef FC_GROUP_BROADCAST
LL_ENTRY(broadcast_ll)
#endif

#ifdef FC_GROUP_BROADCAST
extern "C" __global__ void __launch_bounds__(512) fc_broadcast_st(Args a, CArgs c) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    __shared__ u32 out_w[FC_MAX_RANKS], in_w[FC_MAX_RANKS];
    auto [t0, e, in, out, first, stride] = st_begin(a);
    u64 bytes = c.n * c.es;
    if (a.rank == c.root) {
        u64 nvec = (bytes + 15) / 16;
        for (u64 v = first; v < nvec; v += stride) {
            u32 n = min_u32(16, bytes - v * 16);
            uint4 x = ld_user<uint4>(in + v * 16, n);
            for (u32 p = 0; p < a.world; p++)
                if (p != a.rank) *(uint4*)(slot_ptr(a, c, p, e, 0) + v * 16) = x;
            if (in != out) st_user(out + v * 16, n, x);
        }
    }
    bool ok = st_meet(a, c, e, t0, out_w, in_w);
    if (ok && a.rank != c.root) get_part(out, slot_ptr(a, c, a.rank, e, 0), bytes, first, stride);
    end_call(a, e);
}
#endif

// ---------------------------------------------------------------- pipelined staged protocol

// Large parts of all-gather and all-to-all (from 8 MiB) and reduce-scatter (from 16 MiB;
// cuda/collectives.rs part_form): a block's vectors cut into c.rounds rounds, each with its own
// barrier word per sender (payload: the signature), so that a block copies or reduces round
// r - 1 from its staging while its stores of round r travel, instead of the link and the local
// pass taking turns. Round r of block b covers the same vectors on every rank (the rounds follow
// the part size, which every rank shares), so its words cover exactly what the block reads. The
// last warp of a block only signals (st_pipeline), so the workers never stall on a release,
// which waits for their stores to land. Measured on 2xH200
// (run 2026-11-30-h200x2-coll-rounds, commit 9a08340, -a2a-rw): all-gather 64 MB 141.1 -> 104.8 us,
// reduce-scatter 64 MB 141.4 -> 117.1, all-to-all 64 MB 141.0 -> 113.4; every thread releasing
// each round itself was slower, and so were rounds for smaller parts (reduce-scatter 4 MB 12.2
// -> 14.0) and for broadcast (16 MB 49.1 -> 52.5; -pipeline folder).
// A signature that differs stops every block at round 0 (the rounds may differ too); block 0
// reports it.

// Round r of c.rounds for the thread at `first` of `stride` threads: consecutive grid-stride
// iterations over the part of `bytes`.
__device__ __forceinline__ Span span_round(const CArgs& c, u64 bytes, u64 first, u64 stride, u32 r) {
    u64 nvec = (bytes + 15) / 16;
    u64 per = ((nvec + stride - 1) / stride + c.rounds - 1) / c.rounds;  // iterations per round
    u64 hi = first + (r + 1) * per * stride;
    return Span{first + r * per * stride, stride, hi < nvec ? hi : nvec};
}

__device__ __forceinline__ void bar_arrive(u32 id, u32 n) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_sync_n(u32 id, u32 n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
// A full barrier of n threads that returns the AND of every participant's v (no shared memory).
__device__ __forceinline__ bool bar_and_n(u32 id, u32 n, bool v) {
    u32 all;
    asm volatile(
        "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.and.pred q, %2, %3, p;\n"
        " selp.u32 %0, 1, 0, q;\n}" : "=r"(all) : "r"((u32)v), "r"(id), "r"(n) : "memory");
    return all != 0;
}

// Lane p < world releases round r of this block into rank p's words (rule 1: the block's stores
// before it are ordered by the preceding barrier and the release's cumulativity).
__device__ __forceinline__ void round_post(const Args& a, const CArgs& c, u32 e, u32 r, u32 p) {
    if (p < a.world) st_release_sys64(bar_word(a, c, p, e, a.rank, r), ((u64)e << 32) | c.sig);
}

// Lane p < world waits for rank p's round r and compares its signature; false on a timeout or a
// differing signature (block 0 reports the latter).
__device__ __forceinline__ bool round_wait1(const Args& a, const CArgs& c, u32 e, u32 r, u64 t0, u32 p) {
    if (p >= a.world) return true;
    u32 sig = 0;
    if (!wait_word(a, bar_word(a, c, a.rank, e, p, r), e, p, 20, t0, &sig)) return false;
    if (sig != c.sig) {
        if (blockIdx.x == 0) report_error(a, ERR_MISMATCH, p, sig);
        return false;
    }
    return true;
}

// send(span) stores this block's vectors of a round into the receivers' staging, recv(span)
// reads them from the local staging after every rank posted that round; false when a peer timed
// out or disagreed (recorded). Warps 0..14 work, warp 15 signals: per round r it meets the
// workers once they issued round r (bar.arrive: they do not wait), waits for every rank's round
// r - 1, hands the verdict over in a reducing barrier (bar.red.and: no shared word to race on),
// then releases round r, which waits for the workers' stores of round r to land while they
// already read round r - 1 and send round r + 1.
template <class Send, class Recv>
__device__ bool st_pipeline(const Args& a, const CArgs& c, u32 e, u64 t0, u64 bytes, Send send,
                            Recv recv) {
    u32 n = blockDim.x, nwork = n - 32;
    if (threadIdx.x >= nwork) {
        u32 p = threadIdx.x - nwork;
        bool ok = true;
        for (u32 r = 0; r <= c.rounds; r++) {
            if (r < c.rounds) bar_sync_n(1, n);  // the workers' stores of round r are issued
            if (r > 0) ok = __all_sync(0xffffffffu, ok && round_wait1(a, c, e, r - 1, t0, p));
            ok = bar_and_n(2, n, ok);  // round r - 1 may be read
            // Round r was sent (the workers' verdict then was at least as good as this one) and
            // lands before its word; after a failure no further round is posted, so a late peer
            // times out instead of reading rounds that were never sent.
            if (r < c.rounds && ok) round_post(a, c, e, r, p);
        }
        return ok;
    }
    u64 stride = (u64)gridDim.x * nwork;
    u64 first = (u64)blockIdx.x * nwork + threadIdx.x;
    bool ok = true;
    for (u32 r = 0; r <= c.rounds; r++) {
        if (r < c.rounds) {
            if (ok) send(span_round(c, bytes, first, stride, r));
            bar_arrive(1, n);
        }
        ok = bar_and_n(2, n, true);
        if (r > 0 && ok) recv(span_round(c, bytes, first, stride, r - 1));
    }
    return ok;
}

// The data movers in rounds: the all-gather sends its whole input to every rank, the all-to-all
// (A2A) part p of its input to rank p; the own part is copied beside each round's stores unless
// it is already in place. In place (all-to-all), a thread reads each vector of part s (sending
// it) rounds before it writes that vector of part s (receiving it).
template <bool A2A>
__device__ __forceinline__ void move_rw(const Args& a, const CArgs& c) {
    u64 t0 = globaltimer();
    u32 e = call_epoch(a);
    u64 bytes = c.n * c.es;
    const u8* in = (const u8*)a.input;
    u8* out = (u8*)a.output;
    u8* own = out + a.rank * bytes;
    st_pipeline(
        a, c, e, t0, bytes,
        [&](Span q) {
            for (u32 p = 0; p < a.world; p++)
                if (p != a.rank)
                    put_span(slot_ptr(a, c, p, e, a.rank), A2A ? in + p * bytes : in, bytes, q);
            if (A2A ? in != out : in != own) copy_span(own, A2A ? in + a.rank * bytes : in, bytes, q);
        },
        [&](Span q) {
            for (u32 s = 0; s < a.world; s++)
                if (s != a.rank) get_span(out + s * bytes, slot_ptr(a, c, a.rank, e, s), bytes, q);
        });
    end_call(a, e);
}

#ifdef FC_GROUP_ALL_GATHER
extern "C" __global__ void __launch_bounds__(512) fc_all_gather_rw(Args a, CArgs c) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    move_rw<false>(a, c);
}
#endif

#ifdef FC_GROUP_ALL_TO_ALL
extern "C" __global__ void __launch_bounds__(512) fc_all_to_all_rw(Args a, CArgs c) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    move_rw<true>(a, c);
}
#endif

// ---------------------------------------------------------------- reductions (module dtype T)

// input: world * n elements, part p reduced on rank p into output (n elements; in place the
// output pointer is already the own part of the full buffer, input the full buffer).
template <int OP>
__device__ void reduce_scatter_st(const Args& a, const CArgs& c) {
    __shared__ u32 out_w[FC_MAX_RANKS], in_w[FC_MAX_RANKS];
    auto [t0, e, in, out, first, stride] = st_begin(a);
    u64 bytes = c.n * sizeof(T);
    put_parts(a, c, e, in, bytes, bytes, first, stride);
    if (st_meet(a, c, e, t0, out_w, in_w))
        reduce_span<OP>(a, c, e, in + a.rank * bytes, bytes, span_all(bytes, first, stride), out);
    end_call(a, e);
}

// Every rank's input reduced into root's output (other outputs untouched).
template <int OP>
__device__ void reduce_st(const Args& a, const CArgs& c) {
    __shared__ u32 out_w[FC_MAX_RANKS], in_w[FC_MAX_RANKS];
    auto [t0, e, in, out, first, stride] = st_begin(a);
    u64 bytes = c.n * sizeof(T);
    if (a.rank != c.root) put_part(slot_ptr(a, c, c.root, e, a.rank), in, bytes, first, stride);
    bool ok = st_meet(a, c, e, t0, out_w, in_w);
    if (ok && a.rank == c.root) reduce_span<OP>(a, c, e, in, bytes, span_all(bytes, first, stride), out);
    end_call(a, e);
}

// Pipelined reduce-scatter (see above): in place, the output is the own part of the input, read
// and written by the same thread for the same vector.
template <int OP>
__device__ void reduce_scatter_rw(const Args& a, const CArgs& c) {
    u64 t0 = globaltimer();
    u32 e = call_epoch(a);
    u64 bytes = c.n * sizeof(T);
    const u8* in = (const u8*)a.input;
    u8* out = (u8*)a.output;
    st_pipeline(
        a, c, e, t0, bytes,
        [&](Span q) {
            for (u32 p = 0; p < a.world; p++)
                if (p != a.rank) put_span(slot_ptr(a, c, p, e, a.rank), in + p * bytes, bytes, q);
        },
        [&](Span q) { reduce_span<OP, 2>(a, c, e, in + a.rank * bytes, bytes, q, out); });
    end_call(a, e);
}

// LL reductions (parts up to the LL limit): the push all-reduce's lines carry rank p's part to
// rank p (reduce-scatter) or every rank's input to the root (reduce); the receiver reduces its
// own input with the peers' lines in rank order 0..n-1 (rule 5; f32 for half types, rule 6).
// Units of 8 bytes hold whole elements (the element size divides 8); the zeros past a part's
// end in its last unit are reduced too, and never stored.

// Unit u of every peer's line reduced with the own unit `mine`, one rank at a time in rank order
// (as push); false on a timeout or a peer in another call (recorded). push walks the ranks the
// same way, written as `r < W && ok`: one helper for both compiled one of them differently (more
// instructions in push, or in these reductions), so each keeps the form it was measured in.
template <int OP, u32 W>
__device__ __forceinline__ bool ll_reduce_unit(const Args& a, const CArgs& c, const Ll& l, u64 u,
                                               uint2 mine, uint2* res) {
    Acc acc[UNIT_ELEMS];
    auto step = [&](u32 r) {
        Unit x;
        if (r == a.rank) x.u = mine;
        else if (!ll_recv(a, c, l, r, u, &x.u)) return false;
        fold_rank<OP>(a, acc, x, r);
        return true;
    };
    if (W) {
#pragma unroll
        for (u32 r = 0; r < W; r++)
            if (!step(r)) return false;
    } else {
#pragma unroll 1
        for (u32 r = 0; r < a.world; r++)
            if (!step(r)) return false;
    }
    *res = fold_finish<OP, Unit>(a, acc).u;
    return true;
}

// input: world * n elements, part p to rank p; output: n elements (in place: the own part of the
// input, each unit read before the same thread writes it). Every unit is sent before the first
// one is awaited.
template <int OP, u32 W>
__device__ __forceinline__ void reduce_scatter_ll(const Args& a, const CArgs& c) {
    u64 bytes = c.n * sizeof(T);
    u64 nunit = (bytes + 7) / 8;
    const u8* in = (const u8*)a.input;
    u8* out = (u8*)a.output;
    const u8* own = in + a.rank * bytes;
    // The first own unit, and at two ranks the first unit for the peer, before the epoch word.
    u64 first = ll_first();
    bool has = first < nunit;
    uint2 mine0 = has ? ll_load(own, bytes, first) : make_uint2(0, 0);
    uint2 peer0 = W == 2 && has ? ll_load(in + (1 - a.rank) * bytes, bytes, first) : make_uint2(0, 0);
    Ll l = ll_begin(a, c);
    for (u32 k = 1; k < ll_world<W>(a); k++) {
        u32 p = ll_peer<W>(a, k);
        u64 to = a.push[p];
        for (u64 u = first; u < nunit; u += l.stride)
            ll_send_at(a, l, to, u, W == 2 && u == first ? peer0 : ll_load(in + p * bytes, bytes, u));
    }
    bool ok = true;
    for (u64 u = first; u < nunit && ok; u += l.stride) {
        uint2 r;
        ok = ll_reduce_unit<OP, W>(a, c, l, u, u == first ? mine0 : ll_load(own, bytes, u), &r);
        if (ok) ll_store(out, bytes, u, r);
    }
    ll_end(a, c, l);
}

// Every rank's input reduced into root's output (other outputs untouched).
template <int OP, u32 W>
__device__ __forceinline__ void reduce_ll(const Args& a, const CArgs& c) {
    u64 bytes = c.n * sizeof(T);
    u64 nunit = (bytes + 7) / 8;
    const u8* in = (const u8*)a.input;
    u8* out = (u8*)a.output;
    Ll l = ll_begin(a, c);
    bool ok = true;
    for (u64 u = l.first; u < nunit && ok; u += l.stride) {
        uint2 x = ll_load(in, bytes, u);
        if (a.rank != c.root) {
            ll_send_at(a, l, a.push[c.root], u, x);
        } else {
            uint2 r;
            ok = ll_reduce_unit<OP, W>(a, c, l, u, x, &r);
            if (ok) ll_store(out, bytes, u, r);
        }
    }
    ll_end(a, c, l);
}

#define FC_COLL_ENTRY(NAME, OPV)                                                               \
    extern "C" __global__ void __launch_bounds__(512) fc_reduce_scatter_ll_##NAME(Args a, CArgs c) { \
        pdl_wait_mark(a);                                                                            \
        pdl_launch_dependents();                                                               \
        if (a.world == 2) reduce_scatter_ll<OPV, 2>(a, c);                                     \
        else reduce_scatter_ll<OPV, 0>(a, c);                                                  \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(512) fc_reduce_ll_##NAME(Args a, CArgs c) {   \
        pdl_wait_mark(a);                                                                            \
        pdl_launch_dependents();                                                               \
        if (a.world == 2) reduce_ll<OPV, 2>(a, c);                                             \
        else reduce_ll<OPV, 0>(a, c);                                                          \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(512) fc_reduce_scatter_st_##NAME(Args a, CArgs c) { \
        pdl_wait_mark(a);                                                                            \
        pdl_launch_dependents();                                                               \
        reduce_scatter_st<OPV>(a, c);                                                          \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(512) fc_reduce_st_##NAME(Args a, CArgs c) {   \
        pdl_wait_mark(a);                                                                            \
        pdl_launch_dependents();                                                               \
        reduce_st<OPV>(a, c);                                                                  \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(512) fc_reduce_scatter_rw_##NAME(Args a, CArgs c) { \
        pdl_wait_mark(a);                                                                            \
        pdl_launch_dependents();                                                               \
        reduce_scatter_rw<OPV>(a, c);                                                          \
    }

#ifdef FC_GROUP_REDUCE_SUM
FC_COLL_ENTRY(sum, OP_SUM)
#endif
#ifdef FC_GROUP_REDUCE_PROD
FC_COLL_ENTRY(prod, OP_PROD)
#endif
#ifdef FC_GROUP_REDUCE_MIN
FC_COLL_ENTRY(min, OP_MIN)
#endif
#ifdef FC_GROUP_REDUCE_MAX
FC_COLL_ENTRY(max, OP_MAX)
#endif
