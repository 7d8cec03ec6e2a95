// ferrocomm residual add + RMSNorm (+ E4M3 rows): the local half of the all_reduce_rmsnorm call
// (crates/ferrocomm/src/rmsnorm.rs has the arithmetic and the host reference), alone after an
// all-reduce (fc_rmsnorm and, for few rows, fc_rmsnorm_wide*: two launches, or a one-rank
// communicator's whole call) or inside the one-launch direct-access forms (fc_fused_flat,
// fc_fused_tree). Appended after all_reduce.cu and lowp.cu for the float types (the entry
// points in the FC_GROUP_RMSNORM unit, cuda/kernel_units.rs); uses T, Ty<T>, Vec, VEC_ELEMS,
// the all-reduce's epoch, barrier and hello helpers, pdl_wait/pdl_launch_dependents, and
// lowp.cu's lp_scale and LP_E4M3.
//
// Per row: r = round(sum + residual) -> residual_out; inv = 1 / sqrt(sum(r^2) / hidden + eps);
// y = round(r * inv * w) -> out; with FP8 rows, codes = e4m3(y / scale) where scale is the
// row's lp_scale(absmax(y)) (written to scales[row]) or one scale given for the whole tensor
// (read from scales[0], nothing written). Products and sums are explicit _rn intrinsics (no FMA
// contraction), as the host's f32 arithmetic; only the sum of squares is ordered differently
// (a reduction over the row's threads), so results match the host's within an ulp of the row's
// norm. The geometry below depends on the shape alone (and FERROCOMM_RMSNORM_WIDE_MAX_ROWS,
// which every rank shares), so every rank computes every row alike: bit-identical results
// everywhere.
//
// Geometry (NormArgs.tpr and, for the wide entry points, NormArgs.v, chosen by the host from the
// shape, cuda/dda/fused_norm.rs): a row is handled by `tpr` threads (whole warps, at most the
// block), blockDim / tpr rows at a time per block. Thread t of a row holds the row's 16-byte
// vectors t, t + tpr, ..., V of them per chunk (fc_rmsnorm and fc_rmsnorm_plain: NORM_V; the
// wide entry points below: 1, 2 or 4; the fused forms NORM_V_STAGED, their sums coming from
// every rank's staging); a row of at most V * tpr vectors is one chunk and stays in registers
// from its loads to its last store: one read of each input and one write of each output. A
// longer row takes chunks and reads its own residual_out (and out, for per-row FP8 scales) back.
// Every thread of a block runs the same row loop (a row's sum synchronizes its slot: the whole
// block in fc_rmsnorm, whose blocks are many an SM, the slot alone in the fused forms, one
// block an SM); a row slot past the last row loads and stores nothing. Calls of few rows run
// the wide entry points instead (fc_rmsnorm_wide*, below: the row over up to 512 threads, in
// one chunk).

struct NormArgs {
    u64 sum;           // all-reduced rows (T), rows * hidden (fc_rmsnorm; the fused forms: x)
    u64 residual;      // T, rows * hidden
    u64 weight;        // T, hidden
    u64 out;           // T, rows * hidden
    u64 residual_out;  // T, rows * hidden
    u64 codes;         // u8 E4M3, rows * hidden; 0: no FP8 output
    u64 scales;        // f32: rows scales written, or (fp8_given) the tensor's scale, read
    u64 rows;
    u64 hidden;
    float eps;
    u32 tpr;           // threads per row: a multiple of 32 dividing blockDim.x
    u32 fp8_given;     // 1: codes = e4m3(y / scales[0]), one scale given for the tensor
    u32 loopback;      // the fused forms, measurement only: every peer's staging is this rank's
                       // own (Args.staging), no barrier, no hello (cuda/dda/fused_norm.rs)
    u32 lp_block;      // the fused forms: 0 full precision; else B of the block-scaled records
                       // the rows cross in (hidden a multiple of B, B / VEC_ELEMS <= 32)
    u32 lp_format;     // LP_E4M3 / LP_E5M2 / LP_INT8
    u32 v;             // the wide entry points: vectors a thread holds (1, 2 or 4)
    u32 pad_;
};

#define NORM_THREADS 512
#define NORM_WARPS (NORM_THREADS / 32)
#define NORM_V 4         // vectors per thread per chunk, sums read from one buffer
#define NORM_V_STAGED 2  // the same with every rank's staged copy to reduce (registers)

// Synchronizes the calling row slot (`tpr` threads, two or more warps). `apart` (the fused
// forms, one block an SM): a named barrier per slot (1 + slot; a block has at most 8 slots of
// two warps), so the slots of a block run their rows apart and one slot's loads are in flight
// while another waits on its row's sum (two-shot 4096 x 16384 bf16 in loopback 2-3% faster,
// bench/results/2026-12-04-h200-norm-knobs). Otherwise the block (fc_rmsnorm, whose many
// blocks follow each other on an SM; a kernel naming barriers by a register is given all 16).
__device__ __forceinline__ void norm_slot_sync(u32 tpr, bool apart) {
    if (!apart || tpr == blockDim.x)
        __syncthreads();
    else
        asm volatile("bar.sync %0, %1;" ::"r"(1 + threadIdx.x / tpr), "r"(tpr) : "memory");
}

// The sum over the `tpr` threads of each row slot of one value per thread, on every thread of
// the slot (warp sums in a fixed shuffle order, then the slot's warps in order; a slot of one
// warp has its sum from the shuffles: 0 + v is v for a sum of squares). `red` holds one word per
// warp. Every thread of the block calls it.
__device__ __forceinline__ float norm_row_sum(float v, float* red, u32 tpr, bool apart) {
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wpr = tpr >> 5;
    if (wpr == 1) return v;
    norm_slot_sync(tpr, apart);  // red is reused row after row
    if (lane == 0) red[warp] = v;
    norm_slot_sync(tpr, apart);
    const u32 w0 = (threadIdx.x / tpr) * wpr;
    float s = 0.0f;
    for (u32 w = 0; w < wpr; w++) s = __fadd_rn(s, red[w0 + w]);
    return s;
}

// The largest of one value per thread over each row slot, on every thread of the slot.
__device__ __forceinline__ u32 norm_row_max(u32 v, u32* red, u32 tpr, bool apart) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wpr = tpr >> 5;
    if (wpr == 1) return v;
    norm_slot_sync(tpr, apart);
    if (lane == 0) red[warp] = v;
    norm_slot_sync(tpr, apart);
    const u32 w0 = (threadIdx.x / tpr) * wpr;
    u32 m = 0;
    for (u32 w = 0; w < wpr; w++) m = max(m, red[w0 + w]);
    return m;
}

// Asks the L2 for `bytes` (a multiple of 16) at `p` (16-byte aligned) ahead of their loads: one
// bulk prefetch (sm_90's cp.async.bulk; nothing below sm_90, where the loads simply wait).
__device__ __forceinline__ void l2_prefetch(const void* p, u64 bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"((u32)bytes) : "memory");
#endif
}

// Vector i (VEC_ELEMS elements from element i) of a user buffer: one 16-byte access when every
// user pointer is 16-byte aligned, element by element otherwise.
__device__ __forceinline__ void fused_ld(const T* p, u64 i, bool aligned, Vec& v) {
    if (aligned) {
        v.u = *(const uint4*)(p + i);
    } else {
#pragma unroll
        for (u32 k = 0; k < VEC_ELEMS; k++) v.e[k] = p[i + k];
    }
}

__device__ __forceinline__ void fused_st(T* p, u64 i, bool aligned, const Vec& v) {
    if (aligned) {
        *(uint4*)(p + i) = v.u;
    } else {
#pragma unroll
        for (u32 k = 0; k < VEC_ELEMS; k++) p[i + k] = v.e[k];
    }
}

// Whether every user pointer of the call allows 16-byte accesses (and the codes whole-vector
// stores of VEC_ELEMS bytes).
__device__ __forceinline__ bool fused_aligned(const NormArgs& n) {
    return ((n.sum | n.residual | n.weight | n.out | n.residual_out) & 15) == 0 &&
           (n.codes & (VEC_ELEMS - 1)) == 0;
}

// r = round(s + rs) of a vector, the squares of its stored values added to `sq` in element
// order (the residual add and the norm's first step, as the host's arithmetic).
__device__ __forceinline__ void norm_add(const Vec& s, const Vec& rs, Vec& r, float& sq) {
#pragma unroll
    for (u32 e = 0; e < VEC_ELEMS; e++) {
        r.e[e] = Ty<T>::from_acc(__fadd_rn(Ty<T>::to_acc(s.e[e]), Ty<T>::to_acc(rs.e[e])));
        const float rf = Ty<T>::to_acc(r.e[e]);
        sq = __fadd_rn(sq, __fmul_rn(rf, rf));
    }
}

// y = round(r * inv * w) of a vector.
__device__ __forceinline__ void norm_scale(const Vec& r, float inv, const Vec& w, Vec& y) {
#pragma unroll
    for (u32 e = 0; e < VEC_ELEMS; e++)
        y.e[e] = Ty<T>::from_acc(__fmul_rn(__fmul_rn(Ty<T>::to_acc(r.e[e]), inv), Ty<T>::to_acc(w.e[e])));
}

// The E4M3 codes of a vector's y values divided by `scale` (0 codes when the scale is not
// usable), stored at codes[i..i + VEC_ELEMS): one store when aligned.
__device__ __forceinline__ void norm_store_codes(const NormArgs& n, u64 i, bool aligned,
                                                 const Vec& y, float scale, bool usable) {
    u8 c[VEC_ELEMS];
#pragma unroll
    for (u32 k = 0; k < VEC_ELEMS; k += 2) {
        u16 h = 0;
        if (usable) {
            const float q0 = __fdiv_rn(Ty<T>::to_acc(y.e[k]), scale);
            const float q1 = __fdiv_rn(Ty<T>::to_acc(y.e[k + 1]), scale);
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(q1), "f"(q0));
        }
        c[k] = (u8)(h & 0xff);
        c[k + 1] = (u8)(h >> 8);
    }
    u8* dst = (u8*)n.codes + i;
    if (aligned) {
        if (VEC_ELEMS == 8) {
            u64 w = 0;
#pragma unroll
            for (u32 k = 0; k < VEC_ELEMS; k++) w |= (u64)c[k] << (8 * k);
            *(u64*)dst = w;
        } else {
            u32 w = 0;
#pragma unroll
            for (u32 k = 0; k < VEC_ELEMS; k++) w |= (u32)c[k] << (8 * k);
            *(u32*)dst = w;
        }
    } else {
#pragma unroll
        for (u32 k = 0; k < VEC_ELEMS; k++) dst[k] = c[k];
    }
}

// The tensor's given FP8 scale (fp8_given), or 0 (per-row scales).
__device__ __forceinline__ float norm_given_scale(const NormArgs& n) {
    return n.codes != 0 && n.fp8_given ? *(const float*)n.scales : 0.0f;
}

// Whether codes can be made with `scale` (NaN, infinite, zero or negative scales give codes 0).
__device__ __forceinline__ bool norm_usable(float scale) {
    return scale > 0.0f && !isinf(scale) && !isnan(scale);
}

// |y| of a vector as bits, folded into `amax`: NaN (any payload) > Inf > finite, so a
// non-finite row gets a NaN scale.
__device__ __forceinline__ u32 norm_amax(u32 amax, const Vec& y) {
#pragma unroll
    for (u32 k = 0; k < VEC_ELEMS; k++)
        amax = max(amax, __float_as_uint(Ty<T>::to_acc(y.e[k])) & 0x7fffffffu);
    return amax;
}

// Where the sums of a row come from: the user's buffer n.sum (fc_rmsnorm), or every rank's
// staged copy of the row at parity offset `par` of the direct-access staging, reduced in rank
// order 0..n-1 (rule 5) with the plain all-reduce's fold (so the sum has its bits).
struct SumFromBuffer {
    static constexpr bool apart = false;  // fc_rmsnorm: blocks enough an SM
    const T* p;
    bool aligned;
    __device__ __forceinline__ void load(u64 i, Vec& s) const { fused_ld(p, i, aligned, s); }
};

template <int V>
struct SumFromStaging {
    static constexpr bool apart = true;  // the fused forms: one block an SM
    const Args* a;
    u64 par;
    // The sums of vectors i[k] (element indices, where live[k]), every rank's loads of a pair of
    // ranks issued before their arithmetic.
    __device__ __forceinline__ void load_all(const u64* i, const bool* live, Vec* s) const {
        Acc acc[V][VEC_ELEMS];
        for (u32 r0 = 0; r0 < a->world; r0 += 2) {
            Vec x[V][2];
#pragma unroll
            for (int k = 0; k < V; k++)
#pragma unroll
                for (u32 d = 0; d < 2; d++)
                    if (live[k] && r0 + d < a->world)
                        x[k][d].u = ld_v4((const uint4*)(a->staging[r0 + d] + par + i[k] * sizeof(T)));
#pragma unroll
            for (int k = 0; k < V; k++)
#pragma unroll
                for (u32 d = 0; d < 2; d++)
                    if (live[k] && r0 + d < a->world) fold_rank<OP_SUM>(*a, acc[k], x[k][d], r0 + d);
        }
#pragma unroll
        for (int k = 0; k < V; k++)
            if (live[k]) s[k] = fold_finish<OP_SUM, Vec>(*a, acc[k]);
    }
};

// Low precision on the wire (NormArgs.lp_block): every rank's rows sit in its staging as the
// low-precision all-reduce's block-scaled records (kernels/lowp.cu's layout: block m of the flat
// stream of rows at byte m * (4 + B), [f32 scale][B codes]; hidden is a multiple of B, so a row
// is a whole number of records). A codec block is S = B / VEC_ELEMS consecutive vectors of a
// row, which the row's threads hold in S consecutive lanes (tpr and the chunk are whole warps):
// a block's absmax is a segmented shuffle over those lanes. The sums are what the
// low-precision all-reduce gives (quant/reference.rs one_shot, two_shot): every rank's decoded
// values added in rank order from rank 0's, in f32, then rounded to T as that all-reduce
// stores them; so the call's results are those of its two launches.

// Encodes the vectors i[k] (element indices, live[k]; every lane of the warp calls it) of the
// f32 values x[k] into the records at `enc`: the block's scale by its first lane, VEC_ELEMS
// codes by every lane.
template <int V>
__device__ __forceinline__ void lp_rows_encode(const NormArgs& n, u8* enc, const u64* i,
                                               const bool* live, const float (*x)[VEC_ELEMS]) {
    const u32 B = n.lp_block, S = B / VEC_ELEMS;
#pragma unroll
    for (int k = 0; k < V; k++) {
        u32 m = 0;
        if (live[k])
#pragma unroll
            for (u32 e = 0; e < VEC_ELEMS; e++) m = max(m, __float_as_uint(x[k][e]) & 0x7fffffffu);
        m = seg_max(m, S);  // warp-uniform: live is the same over a block's S lanes
        if (!live[k]) continue;
        const float s = lp_scale(m, n.lp_format);
        const float y = lp_recip(s);
        u8* rec = enc + (i[k] >> lp_log2(B)) * (u64)(4 + B);
        const u32 j = (u32)i[k] & (B - 1);
        if (j == 0) *(float*)rec = s;
#pragma unroll
        for (u32 e = 0; e < VEC_ELEMS; e += 4)
            *(u32*)(rec + 4 + j + e) = lp_encode4(&x[k][e], s, y, n.lp_format);
    }
}

// Stages the calling slot's row `row` (when live) of x as records into this rank's staging at
// `enc`. Every lane of the warp calls it.
template <int V>
__device__ __forceinline__ void lp_stage_row(const NormArgs& n, u8* enc, u64 row, bool live,
                                             bool aligned) {
    const u32 tpr = n.tpr, lt = threadIdx.x % tpr;
    const u64 nv = n.hidden / VEC_ELEMS, base = row * n.hidden;
    const u64 chunk = (u64)V * tpr, chunks = (nv + chunk - 1) / chunk;
    for (u64 c = 0; c < chunks; c++) {
        u64 idx[V];
        bool on[V];
        Vec xv[V];
        float x[V][VEC_ELEMS];
#pragma unroll
        for (int k = 0; k < V; k++) {
            const u64 v = c * chunk + (u64)k * tpr + lt;
            on[k] = live && v < nv;
            idx[k] = base + v * VEC_ELEMS;
            if (on[k]) fused_ld((const T*)n.sum, idx[k], aligned, xv[k]);
        }
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
            for (u32 e = 0; e < VEC_ELEMS; e++) x[k][e] = on[k] ? Ty<T>::to_acc(xv[k].e[e]) : 0.0f;
        lp_rows_encode<V>(n, enc, idx, on, x);
    }
}

// The f32 sums of vectors i[k] (live[k]) over the records of ranks base[0..k) (each at byte
// `par` of its staging), decoded and added in rank order; every load issued first.
template <int V>
__device__ __forceinline__ void lp_sum_records(const NormArgs& n, const u64* base, u32 ranks,
                                               u64 par, const u64* i, const bool* live,
                                               float (*acc)[VEC_ELEMS]) {
    const u32 B = n.lp_block;
    for (u32 r0 = 0; r0 < ranks; r0 += 2) {
        float sc[V][2];
        u32 w[V][2][VEC_ELEMS / 4];
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
            for (u32 d = 0; d < 2; d++)
                if (live[k] && r0 + d < ranks) {
                    const u8* rec = (const u8*)(base[r0 + d] + par) +
                                    (i[k] >> lp_log2(B)) * (u64)(4 + B);
                    const u32 j = (u32)i[k] & (B - 1);
                    sc[k][d] = __uint_as_float(ld_u32_vol(rec));
#pragma unroll
                    for (u32 q = 0; q < VEC_ELEMS / 4; q++) w[k][d][q] = ld_u32_vol(rec + 4 + j + 4 * q);
                }
#pragma unroll
        for (int k = 0; k < V; k++)
#pragma unroll
            for (u32 d = 0; d < 2; d++)
                if (live[k] && r0 + d < ranks)
#pragma unroll
                    for (u32 q = 0; q < VEC_ELEMS / 4; q++)
                        lp_decode_into(sc[k][d], w[k][d][q], n.lp_format, r0 + d == 0,
                                       &acc[k][4 * q]);
    }
}

// Sums from the records of `ranks` ranks (one-shot: every rank's; the two-shot's last step: the
// stripe owner's alone), rounded to T.
template <int V>
struct SumFromRecords {
    static constexpr bool apart = true;
    const NormArgs* n;
    const u64* base;  // the ranks' staging bases (Args.staging, or &staging[owner])
    u32 ranks;
    u64 par;
    __device__ __forceinline__ void load_all(const u64* i, const bool* live, Vec* s) const {
        float acc[V][VEC_ELEMS];
        lp_sum_records<V>(*n, base, ranks, par, i, live, acc);
#pragma unroll
        for (int k = 0; k < V; k++)
            if (live[k])
#pragma unroll
                for (u32 e = 0; e < VEC_ELEMS; e++) s[k].e[e] = Ty<T>::from_acc(acc[k][e]);
    }
};

// The two-shot owner's step for the calling slot's row `row` (live): the row summed over every
// rank's records in f32 and quantized once, into this rank's own records of the row (which only
// it reads: every lane's loads of a block precede the block's shuffle, hence its stores). Every
// lane of the warp calls it.
template <int V>
__device__ __forceinline__ void lp_reduce_row(const Args& a, const NormArgs& n, u64 par, u64 row,
                                              bool live) {
    const u32 tpr = n.tpr, lt = threadIdx.x % tpr;
    const u64 nv = n.hidden / VEC_ELEMS, base = row * n.hidden;
    const u64 chunk = (u64)V * tpr, chunks = (nv + chunk - 1) / chunk;
    u8* own = (u8*)(a.staging[a.rank] + par);
    for (u64 c = 0; c < chunks; c++) {
        u64 idx[V];
        bool on[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            const u64 v = c * chunk + (u64)k * tpr + lt;
            on[k] = live && v < nv;
            idx[k] = base + v * VEC_ELEMS;
        }
        float x[V][VEC_ELEMS];
        lp_sum_records<V>(n, a.staging, a.world, par, idx, on, x);
#pragma unroll
        for (int k = 0; k < V; k++)
            if (!on[k])
#pragma unroll
                for (u32 e = 0; e < VEC_ELEMS; e++) x[k][e] = 0.0f;
        lp_rows_encode<V>(n, own, idx, on, x);
    }
}

// Loads the sums of the vectors i[k] of the row (live[k]) from `src`.
template <int V>
__device__ __forceinline__ void norm_load_sums(const SumFromBuffer& src, const u64* i,
                                               const bool* live, Vec* s) {
#pragma unroll
    for (int k = 0; k < V; k++)
        if (live[k]) src.load(i[k], s[k]);
}
template <int V>
__device__ __forceinline__ void norm_load_sums(const SumFromStaging<V>& src, const u64* i,
                                               const bool* live, Vec* s) {
    src.load_all(i, live, s);
}
template <int V>
__device__ __forceinline__ void norm_load_sums(const SumFromRecords<V>& src, const u64* i,
                                               const bool* live, Vec* s) {
    src.load_all(i, live, s);
}

// Where a row's results also go: nowhere (fc_rmsnorm, the one-shot form), or the two-shot
// owner's staging (y over its own staged copy of the row, which only it read; r in the
// staging's second area, at rows * hidden elements), for the peers to copy.
struct Publish {
    u8* stage;  // this rank's staging at the call's parity; null: nothing published
    u64 r_area;
};

// The weight's vectors a thread of a one-chunk row uses (the same columns in every row), loaded
// once per kernel, in flight with the first row's loads.
template <int V>
__device__ __forceinline__ void norm_load_weight(const NormArgs& n, bool aligned, Vec* wv) {
    const u32 tpr = n.tpr, lt = threadIdx.x % tpr;
    const u64 nv = n.hidden / VEC_ELEMS;
#pragma unroll
    for (int k = 0; k < V; k++) {
        const u64 v = (u64)k * tpr + lt;
        if (v < nv) fused_ld((const T*)n.weight, v * VEC_ELEMS, aligned, wv[k]);
    }
}

// Whether rows of the call are one chunk of V vectors per thread (the weight preloaded, the
// row held in registers).
template <int V>
__device__ __forceinline__ bool norm_one_chunk(const NormArgs& n) {
    return n.hidden / VEC_ELEMS <= (u64)V * n.tpr;
}

// How norm_row knows the alignment of the user's buffers and the FP8 output: fixed at compile
// time (fc_rmsnorm, whose one-rank launches are short enough for the instruction fetch of the
// paths it does not take to show) or read at run time (the fused forms).
#define NORM_AL_RUNTIME 2
#define NORM_FP8_OFF 0
#define NORM_FP8_ROW 1
#define NORM_FP8_GIVEN 2
#define NORM_FP8_RUNTIME 3

// Row `row` of the calling thread's row slot (`live`: the slot has a row): sums from `src`, the
// residual added, normalized, outputs written (and published). `wpre`: the weight's vectors
// (norm_load_weight), used when `pre` (the row is one chunk; an array in registers, never a
// pointer, which would put it on the stack). AL: 0 or 1 (the buffers' alignment), or
// NORM_AL_RUNTIME (`aligned_rt` says); FP8: one of NORM_FP8_*. Every thread of the block calls
// it, live or not.
template <int V, int AL, int FP8, typename Src>
__device__ void norm_row(const NormArgs& n, const Src& src, const Publish& pub, u64 row,
                         bool live, bool aligned_rt, const Vec (&wpre)[V], bool pre, float* red_f,
                         u32* red_u) {
    const bool aligned = AL == NORM_AL_RUNTIME ? aligned_rt : AL == 1;
    const int fp8 = FP8 != NORM_FP8_RUNTIME
                        ? FP8
                        : (n.codes == 0 ? NORM_FP8_OFF : n.fp8_given ? NORM_FP8_GIVEN : NORM_FP8_ROW);
    const u32 tpr = n.tpr, lt = threadIdx.x % tpr;
    const u64 h = n.hidden, nv = h / VEC_ELEMS, base = row * h;
    const u64 chunk = (u64)V * tpr;
    // The same on every thread (h is the call's); one chunk without a division.
    const u64 chunks = nv <= chunk ? 1 : (nv + chunk - 1) / chunk;
    const T* res = (const T*)n.residual;
    const T* w = (const T*)n.weight;
    T* out = (T*)n.out;
    T* rout = (T*)n.residual_out;
    const float given = fp8 == NORM_FP8_GIVEN ? *(const float*)n.scales : 0.0f;
    Vec r[V];
    u64 idx[V];
    bool on[V];
    float sq = 0.0f;
    for (u64 c = 0; c < chunks; c++) {
#pragma unroll
        for (int k = 0; k < V; k++) {
            const u64 v = c * chunk + (u64)k * tpr + lt;
            on[k] = live && v < nv;
            idx[k] = base + v * VEC_ELEMS;
        }
        Vec s[V], rs[V];
        // Every load of the chunk issued before its arithmetic: the residual's first (the sums'
        // loads from the staging are volatile, which keeps later loads behind them).
#pragma unroll
        for (int k = 0; k < V; k++)
            if (on[k]) fused_ld(res, idx[k], aligned, rs[k]);
        norm_load_sums<V>(src, idx, on, s);
#pragma unroll
        for (int k = 0; k < V; k++) {
            if (!on[k]) continue;
            norm_add(s[k], rs[k], r[k], sq);
            fused_st(rout, idx[k], aligned, r[k]);
            if (pub.stage) *(uint4*)(pub.stage + pub.r_area + idx[k] * sizeof(T)) = r[k].u;
        }
    }
    const float total = norm_row_sum(sq, red_f, tpr, Src::apart);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(total, (float)h), n.eps)));
    const bool row_scales = fp8 == NORM_FP8_ROW;
    u32 amax = 0;
    for (u64 c = 0; c < chunks; c++) {
        Vec wv[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            const u64 v = c * chunk + (u64)k * tpr + lt;
            on[k] = live && v < nv;
            idx[k] = base + v * VEC_ELEMS;
            if (!on[k]) continue;
            if (chunks > 1) fused_ld(rout, idx[k], aligned, r[k]);  // this thread's own stores
            if (chunks > 1 || !pre)
                fused_ld(w, v * VEC_ELEMS, aligned, wv[k]);
            else
                wv[k] = wpre[k];
        }
#pragma unroll
        for (int k = 0; k < V; k++) {
            if (!on[k]) continue;
            Vec y;
            norm_scale(r[k], inv, wv[k], y);
            fused_st(out, idx[k], aligned, y);
            // Over this rank's own staged copy of the row: no peer reads it (two-shot).
            if (pub.stage) *(uint4*)(pub.stage + idx[k] * sizeof(T)) = y.u;
            if (row_scales) amax = norm_amax(amax, y);
            if (fp8 == NORM_FP8_GIVEN) norm_store_codes(n, idx[k], aligned, y, given, norm_usable(given));
            r[k] = y;  // a one-chunk row keeps y for its codes
        }
    }
    if (!row_scales) return;
    const float scale = lp_scale(norm_row_max(amax, red_u, tpr, Src::apart), LP_E4M3);
    const bool usable = norm_usable(scale);
    for (u64 c = 0; c < chunks; c++) {
#pragma unroll
        for (int k = 0; k < V; k++) {
            const u64 v = c * chunk + (u64)k * tpr + lt;
            if (!(live && v < nv)) continue;
            const u64 i = base + v * VEC_ELEMS;
            if (chunks > 1) fused_ld(out, i, aligned, r[k]);  // this thread's own stores
            norm_store_codes(n, i, aligned, r[k], scale, usable);
        }
    }
    if (live && lt == 0) ((float*)n.scales)[row] = scale;
}

// The rows of this block: row slot g = threadIdx / tpr of step `step` holds row
// (step * gridDim + blockIdx) * slots + g, where slots = blockDim / tpr; `count` rows in all.
__device__ __forceinline__ u64 norm_slot_row(const NormArgs& n, u64 step) {
    const u32 slots = blockDim.x / n.tpr;
    return (step * gridDim.x + blockIdx.x) * slots + threadIdx.x / n.tpr;
}
__device__ __forceinline__ u64 norm_steps(const NormArgs& n, u64 count) {
    const u64 per_step = (u64)gridDim.x * (blockDim.x / n.tpr);
    return (count + per_step - 1) / per_step;
}

// fc_rmsnorm's rows: V vectors a thread, the alignment (AL) and the FP8 output fixed at compile
// time.
template <int V, int AL, int FP8>
__device__ __forceinline__ void norm_rows_local(const NormArgs& n, float* red_f, u32* red_u) {
    const bool aligned = AL == 1;
    const SumFromBuffer src{(const T*)n.sum, aligned};
    const Publish none{nullptr, 0};
    Vec wv[V];
    const bool pre = norm_one_chunk<V>(n);
    if (pre) norm_load_weight<V>(n, aligned, wv);
    const u64 per_step = (u64)gridDim.x * (blockDim.x / n.tpr);
    const u64 steps = n.rows <= per_step ? 1 : (n.rows + per_step - 1) / per_step;
    for (u64 s = 0; s < steps; s++) {
        const u64 row = norm_slot_row(n, s);
        norm_row<V, AL, FP8>(n, src, none, row, row < n.rows, aligned, wv, pre, red_f, red_u);
    }
}

// The residual add and norm of every row, four vectors a thread, the sums in n.sum (the
// all-reduce ran before it, or a one-rank communicator's x itself). Reads and writes of an
// element by the same thread, so out may be the sum (in place) and residual_out the residual.
// fc_rmsnorm_plain runs the common call (every pointer 16-byte aligned, no FP8 rows: the host's
// choice, cuda/dda/fused_norm.rs) without the registers of the other paths; fc_rmsnorm runs
// every call (FP8 rows, buffers off 16 bytes, accessed element by element in the same order).
#ifdef FC_GROUP_RMSNORM
extern "C" __global__ void __launch_bounds__(NORM_THREADS) fc_rmsnorm_plain(NormArgs n) {
    pdl_wait();
    pdl_launch_dependents();
    __shared__ float red_f[NORM_WARPS];
    norm_rows_local<NORM_V, 1, NORM_FP8_OFF>(n, red_f, nullptr);
}

extern "C" __global__ void __launch_bounds__(NORM_THREADS) fc_rmsnorm(NormArgs n) {
    pdl_wait();
    pdl_launch_dependents();
    __shared__ float red_f[NORM_WARPS];
    __shared__ u32 red_u[NORM_WARPS];
    if (fused_aligned(n))
        norm_rows_local<NORM_V, 1, NORM_FP8_RUNTIME>(n, red_f, red_u);
    else
        norm_rows_local<NORM_V, 0, NORM_FP8_RUNTIME>(n, red_f, red_u);
}
#endif

// ---------------------------------------------------------------- fc_rmsnorm_wide: few rows
//
// A call of few rows is not a matter of bandwidth but of the chain of dependent instructions
// between a row's loads and its last store, which no other row hides. fc_rmsnorm's chain is long
// for them: four vectors a thread (32 squares summed one after another), integer divisions and
// a chunk loop around every row, and the register budget and stack of every path it carries
// (one 512-thread block an SM). The wide geometry (NormArgs.v, the fewest vectors a thread that
// hold the row in 512 threads, and tpr, cuda/dda/fused_norm.rs, for calls of up to
// FERROCOMM_RMSNORM_WIDE_MAX_ROWS rows) spreads the row over as many threads as hold it; these entry points run it with nothing
// else on the way: one chunk (the row in registers from its loads to its last store), no
// division where a block is one row, the weight's and the row's loads issued together, the
// row's warps' partial sums read in one step, and an entry per vector count whose launch bounds
// keep the registers low enough for several blocks an SM.
//
// The order of a row's sum of squares: a thread's vectors and elements in order, the warp's
// xor shuffles, then a tree of the row's warp sums (fc_rmsnorm adds those in order instead),
// fixed by the shape and FERROCOMM_RMSNORM_WIDE_MAX_ROWS, which every rank shares.

// The sum over the row slot `slot` (`wpr` warps) of one value per thread, on every thread of
// the slot: each warp's xor shuffles, then the slot's warp sums in a second xor tree over the
// whole warp (lane w holds warp w's; the lanes past the slot's warps hold 0, which leaves a sum
// of squares, never -0, as it is, and the step across 16 lanes brings the total to every
// lane): one shared-memory step instead of a chain of loads and adds. The xor trees give every
// lane the same bits (IEEE addition commutes). Every warp of the block calls it, once per
// kernel: `red` holds nothing before (no barrier ahead of the writes).
__device__ __forceinline__ float norm_wide_sum(float v, float* red, u32 slot, u32 wpr) {
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    const u32 lane = threadIdx.x & 31;
    if (lane == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = lane < wpr ? red[slot * wpr + lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
    return s;
}

// The largest of one value per thread over the row slot, on every thread of the slot (the
// same two steps, once per kernel, on a `red` of its own).
__device__ __forceinline__ u32 norm_wide_max(u32 v, u32* red, u32 slot, u32 wpr) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    const u32 lane = threadIdx.x & 31;
    if (lane == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    u32 m = lane < wpr ? red[slot * wpr + lane] : 0u;
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

// Row blockIdx * slots + slot of the call, V vectors a thread, one chunk (the host's wide
// geometry: V * tpr vectors hold the row, and the grid holds every row). AL: 1 (every pointer
// aligned, as the host checked) or NORM_AL_RUNTIME; FP8: NORM_FP8_OFF (red_u unused) or
// NORM_FP8_RUNTIME. No loop over rows: a loop would keep the weight (loaded once) converted in
// registers across it, past what the launch bounds give.
template <int V, int AL, int FP8>
__device__ __forceinline__ void norm_wide(const NormArgs& n, float* red_f, u32* red_u) {
    const bool aligned = AL == 1 ? true : fused_aligned(n);
    const int fp8 = FP8 != NORM_FP8_RUNTIME
                        ? FP8
                        : (n.codes == 0 ? NORM_FP8_OFF : n.fp8_given ? NORM_FP8_GIVEN : NORM_FP8_ROW);
    const u32 tpr = n.tpr;
    // A block of one row (tpr = 512, or as many threads as the only row needs) divides nothing.
    const bool one = blockDim.x == tpr;
    const u32 slot = one ? 0 : threadIdx.x / tpr;
    const u32 lt = threadIdx.x - slot * tpr;
    const u64 row = (u64)blockIdx.x * (one ? 1 : blockDim.x / tpr) + slot;
    const bool live = row < n.rows;
    const u64 h = n.hidden, nv = h / VEC_ELEMS, base = row * h;
    const T* res = (const T*)n.residual;
    T* out = (T*)n.out;
    T* rout = (T*)n.residual_out;
    u64 col[V];  // the thread's vectors of the row, as element offsets
    bool on[V];
    Vec wv[V], s[V], rs[V];
    // The weight's, the residual's and the sums' loads issued together.
#pragma unroll
    for (int k = 0; k < V; k++) {
        const u64 v = (u64)k * tpr + lt;
        on[k] = live && v < nv;
        col[k] = v * VEC_ELEMS;
        if (on[k]) {
            fused_ld((const T*)n.weight, col[k], aligned, wv[k]);
            fused_ld(res, base + col[k], aligned, rs[k]);
            fused_ld((const T*)n.sum, base + col[k], aligned, s[k]);
        }
    }
    const float given = fp8 == NORM_FP8_GIVEN ? *(const float*)n.scales : 0.0f;
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < V; k++) {
        if (!on[k]) continue;
        norm_add(s[k], rs[k], s[k], sq);
        fused_st(rout, base + col[k], aligned, s[k]);
    }
    const float total = norm_wide_sum(sq, red_f, slot, tpr >> 5);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(total, (float)h), n.eps)));
    u32 amax = 0;
#pragma unroll
    for (int k = 0; k < V; k++) {
        if (!on[k]) continue;
        norm_scale(s[k], inv, wv[k], s[k]);
        fused_st(out, base + col[k], aligned, s[k]);
        if (fp8 == NORM_FP8_ROW) amax = norm_amax(amax, s[k]);
        if (fp8 == NORM_FP8_GIVEN)
            norm_store_codes(n, base + col[k], aligned, s[k], given, norm_usable(given));
    }
    if (fp8 != NORM_FP8_ROW) return;
    const float scale = lp_scale(norm_wide_max(amax, red_u, slot, tpr >> 5), LP_E4M3);
    const bool usable = norm_usable(scale);
#pragma unroll
    for (int k = 0; k < V; k++)
        if (on[k]) norm_store_codes(n, base + col[k], aligned, s[k], scale, usable);
    if (live && lt == 0) ((float*)n.scales)[row] = scale;
}

// An entry point per vector count for the common call (every pointer aligned, no FP8 rows: the
// host's choice, cuda/dda/fused_norm.rs), whose launch bounds (512 threads, and the blocks an SM
// that the registers of V vectors a thread allow) apply to that path alone; fc_rmsnorm_wide
// runs every other call of the wide geometry (FP8 rows, unaligned buffers) with the same order,
// two blocks an SM: 64 registers hold its one- and two-vector paths (sm_90), where the
// four-vector one (rows of more than 1,024 vectors) spills some; without the bound all three
// took 99 and one block an SM, a wave of 132 rows at a time.
#ifdef FC_GROUP_RMSNORM
extern "C" __global__ void __launch_bounds__(NORM_THREADS, 4) fc_rmsnorm_wide1(NormArgs n) {
    pdl_wait();
    pdl_launch_dependents();
    __shared__ float red_f[NORM_WARPS];
    norm_wide<1, 1, NORM_FP8_OFF>(n, red_f, nullptr);
}
extern "C" __global__ void __launch_bounds__(NORM_THREADS, 3) fc_rmsnorm_wide2(NormArgs n) {
    pdl_wait();
    pdl_launch_dependents();
    __shared__ float red_f[NORM_WARPS];
    norm_wide<2, 1, NORM_FP8_OFF>(n, red_f, nullptr);
}
extern "C" __global__ void __launch_bounds__(NORM_THREADS) fc_rmsnorm_wide4(NormArgs n) {
    pdl_wait();
    pdl_launch_dependents();
    __shared__ float red_f[NORM_WARPS];
    norm_wide<4, 1, NORM_FP8_OFF>(n, red_f, nullptr);
}
extern "C" __global__ void __launch_bounds__(NORM_THREADS, 2) fc_rmsnorm_wide(NormArgs n) {
    pdl_wait();
    pdl_launch_dependents();
    __shared__ float red_f[NORM_WARPS];
    __shared__ u32 red_u[NORM_WARPS];
    if (n.v == 1)
        norm_wide<1, NORM_AL_RUNTIME, NORM_FP8_RUNTIME>(n, red_f, red_u);
    else if (n.v == 2)
        norm_wide<2, NORM_AL_RUNTIME, NORM_FP8_RUNTIME>(n, red_f, red_u);
    else
        norm_wide<4, NORM_AL_RUNTIME, NORM_FP8_RUNTIME>(n, red_f, red_u);
}
#endif

// ---------------------------------------------------------------- one launch: the fused forms
//
// The all-reduce and the norm in one kernel on the direct-access staging (all_reduce.cu's
// protocol: call epochs in device memory, staging parity e & 1, per-block barriers with a
// system-scope release / acquire, hellos carrying the call's signature, timeouts). A row sits in
// the staging as it sits in x (row r at r * hidden elements, a multiple of 16 bytes since hidden
// is a multiple of 8). Block b stages exactly the rows it reads after the barrier on every rank
// (the same geometry everywhere), so the per-block barriers cover exactly what each block
// exchanges.
//
// fc_fused_flat (one-shot pull): every rank stages its x rows, meets every peer's same block,
// and reduces every rank's copy of each row in rank order 0..n-1 before the residual add and
// the norm. Every rank computes every row the same way: identical results.
//
// fc_fused_tree (two-shot): rows are striped across ranks (stripe k: rows k * srows ..
// (k + 1) * srows, srows = ceil(rows / world)). After the first barrier rank k reduces the rows
// of its stripe, adds its residual (the residual is the same on every rank, as in tensor
// parallelism), normalizes, and publishes y over its own staged copy of the row (only it read
// that copy) and residual_out in a second area of its staging (at rows * hidden elements); after
// the second barrier every rank copies the other stripes' y and residual_out rows and computes
// their E4M3 codes and scales from y itself (the same bits and the same absmax give the same
// codes as the owner's). The staging parity alternates by call epoch, and every call waits for
// every peer, so a peer still reading this call's rows never sees them overwritten (rule 3).

// Stages the calling slot's row `row` of x (when live) into this rank's staging at `stage`.
template <int V>
__device__ __forceinline__ void fused_stage_row(const NormArgs& n, u8* stage, u64 row, bool live,
                                                bool aligned) {
    if (!live) return;
    const u32 tpr = n.tpr, lt = threadIdx.x % tpr;
    const u64 nv = n.hidden / VEC_ELEMS, base = row * n.hidden;
    for (u64 v0 = lt; v0 < nv; v0 += (u64)V * tpr) {
        Vec x[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            const u64 v = v0 + (u64)k * tpr;
            if (v < nv) fused_ld((const T*)n.sum, base + v * VEC_ELEMS, aligned, x[k]);
        }
#pragma unroll
        for (int k = 0; k < V; k++) {
            const u64 v = v0 + (u64)k * tpr;
            if (v < nv) *(uint4*)(stage + (base + v * VEC_ELEMS) * sizeof(T)) = x[k].u;
        }
    }
}

// The rows a slot reads at its next step, asked of the L2 while it works on this one (the fused
// forms' slots wait on a row's sum once a row, one block an SM: without it their loads start
// from DRAM after every wait): row `row` (live) of this rank's staged copy at `stage` (null: the
// rows are records, not asked for) and of the residual (aligned buffers), one bulk prefetch
// each by a lane of the slot. The peers' copies are not asked for: their home is their GPU's L2.
// Where a slot takes NORM_PREFETCH_STEPS steps or more (bf16 4096 in loopback on one H200,
// bench/results/2026-12-04-h200-norm-knobs, -tree and -gate): there it saved 1% (one-shot,
// eight steps) to 10% (sixteen) and 5-6% for the two-shot; at one to four steps the kernels
// with it ran 2-3% (one-shot) and 0.3-0.5 µs (two-shot) slower, but gating it there recovered
// at most 1.5%: most of that cost is in the kernel carrying the prefetch, not in issuing it.
#define NORM_PREFETCH_STEPS 8

__device__ __forceinline__ void fused_prefetch_row(const NormArgs& n, const u8* stage, u64 row,
                                                   bool live, bool aligned) {
    if (!live) return;
    const u32 lt = threadIdx.x % n.tpr;
    const u64 bytes = n.hidden * sizeof(T), off = row * bytes;
    if (stage && lt == 0) l2_prefetch(stage + off, bytes);
    if (aligned && lt == (n.tpr > 32 ? 32u : 0u)) l2_prefetch((const u8*)n.residual + off, bytes);
}

// Row `row` (live) of stripe owner k copied from k's staging (y and r, published by norm_row),
// with its E4M3 codes computed from y (FP8: NORM_FP8_OFF, or NORM_FP8_RUNTIME: n.codes says).
// Every thread of the block calls it.
template <int V, int FP8>
__device__ void fused_gather_row(const Args& a, const NormArgs& n, u64 par, u32 k, u64 row,
                                 bool live, bool aligned, u32* red_u) {
    const u32 tpr = n.tpr, lt = threadIdx.x % tpr;
    const u64 h = n.hidden, nv = h / VEC_ELEMS, base = row * h;
    const u64 r_area = n.rows * h * sizeof(T);
    const u8* stage = (const u8*)(a.staging[k] + par);
    const bool fp8 = FP8 != NORM_FP8_OFF && n.codes != 0;
    const float given = fp8 ? norm_given_scale(n) : 0.0f;
    const bool row_scales = fp8 && !n.fp8_given;
    u32 amax = 0;
    for (u64 v0 = lt; v0 < nv; v0 += (u64)V * tpr) {
        Vec y[V], r[V];
#pragma unroll
        for (int j = 0; j < V; j++) {
            const u64 v = v0 + (u64)j * tpr;
            if (live && v < nv) {
                const u64 i = base + v * VEC_ELEMS;
                y[j].u = ld_v4((const uint4*)(stage + i * sizeof(T)));
                r[j].u = ld_v4((const uint4*)(stage + r_area + i * sizeof(T)));
            }
        }
#pragma unroll
        for (int j = 0; j < V; j++) {
            const u64 v = v0 + (u64)j * tpr;
            if (!(live && v < nv)) continue;
            const u64 i = base + v * VEC_ELEMS;
            fused_st((T*)n.out, i, aligned, y[j]);
            fused_st((T*)n.residual_out, i, aligned, r[j]);
            if (row_scales) amax = norm_amax(amax, y[j]);
            if (fp8 && n.fp8_given) norm_store_codes(n, i, aligned, y[j], given, norm_usable(given));
        }
    }
    if (!row_scales) return;
    const float scale = lp_scale(norm_row_max(amax, red_u, tpr, true), LP_E4M3);
    const bool usable = norm_usable(scale);
    if (!live) return;
    for (u64 v = lt; v < nv; v += tpr) {
        const u64 i = base + v * VEC_ELEMS;
        Vec y;
        fused_ld((const T*)n.out, i, aligned, y);  // this thread's own stores
        norm_store_codes(n, i, aligned, y, scale, usable);
    }
    if (lt == 0) ((float*)n.scales)[row] = scale;
}

// The one-shot's body. AL and FP8 as norm_row takes them; LP: whether the rows may cross as
// records (n.lp_block).
template <int AL, int FP8, bool LP>
__device__ __forceinline__ void fused_flat(const Args& a, const NormArgs& n) {
    __shared__ float red_f[NORM_WARPS];
    __shared__ u32 red_u[NORM_WARPS];
    const u64 t0 = globaltimer();
    const u32 e = call_epoch(a);
    const u64 par = (u64)(e & 1) * a.staging_bytes;
    const bool aligned = AL == NORM_AL_RUNTIME ? fused_aligned(n) : AL == 1;
    const u64 steps = norm_steps(n, n.rows);
    u8* own = (u8*)(a.staging[a.rank] + par);
    Vec wv[NORM_V_STAGED];
    const bool pre = norm_one_chunk<NORM_V_STAGED>(n);
    if (pre) norm_load_weight<NORM_V_STAGED>(n, aligned, wv);
    for (u64 s = 0; s < steps; s++) {
        const u64 row = norm_slot_row(n, s);
        if (LP && n.lp_block)
            lp_stage_row<NORM_V_STAGED>(n, own, row, row < n.rows, aligned);
        else
            fused_stage_row<NORM_V>(n, own, row, row < n.rows, aligned);
    }
    const u8* ahead = LP && n.lp_block ? nullptr : own;
    const bool far = steps >= NORM_PREFETCH_STEPS;
    fused_prefetch_row(n, ahead, norm_slot_row(n, 0), far && norm_slot_row(n, 0) < n.rows, aligned);
    const bool met = n.loopback ? (__syncthreads(), true) : block_barrier(a, 0, e, t0);
    if (!n.loopback) hello_send(a, a.sig, e, 0);  // after the barrier, met or not, as in flat
    if (met) {
        const Publish none{nullptr, 0};
        for (u64 s = 0; s < steps; s++) {
            const u64 row = norm_slot_row(n, s), next = norm_slot_row(n, s + 1);
            fused_prefetch_row(n, ahead, next, far && s + 1 < steps && next < n.rows, aligned);
            if (LP && n.lp_block) {
                const SumFromRecords<NORM_V_STAGED> src{&n, a.staging, a.world, par};
                norm_row<NORM_V_STAGED, AL, FP8>(n, src, none, row, row < n.rows, aligned, wv, pre,
                                                 red_f, red_u);
            } else {
                const SumFromStaging<NORM_V_STAGED> src{&a, par};
                norm_row<NORM_V_STAGED, AL, FP8>(n, src, none, row, row < n.rows, aligned, wv, pre,
                                                 red_f, red_u);
            }
        }
        if (!n.loopback) hello_check(a, a.sig, e, t0, 0, 9);
    }
    end_call(a, e);
}

#ifdef FC_GROUP_RMSNORM
extern "C" __global__ void __launch_bounds__(NORM_THREADS) fc_fused_flat(Args a, NormArgs n) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    fused_flat<NORM_AL_RUNTIME, NORM_FP8_RUNTIME, true>(a, n);
}

// The common one-shot (every user pointer 16-byte aligned, no FP8 rows, full precision on the
// wire: the host's choice, cuda/dda/fused_norm.rs) without the registers of the paths it does
// not take; the same arithmetic, protocol and results as fc_fused_flat's.
extern "C" __global__ void __launch_bounds__(NORM_THREADS) fc_fused_flat_plain(Args a, NormArgs n) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    fused_flat<1, NORM_FP8_OFF, false>(a, n);
}
#endif

// The two-shot with low precision on the wire: every rank stages all its rows as records; the
// owner of a stripe sums its rows over every rank's records and quantizes the sum once over its
// own records of them (the low-precision tree all-reduce's owner step); after the second
// barrier every rank, the owner too, decodes every stripe from its owner's records and adds the
// residual and normalizes every row itself (the rows cross once more as records, not as y and r).
__device__ void fused_tree_lp(const Args& a, const NormArgs& n, u32 e, u64 t0, u64 par,
                              bool aligned, float* red_f, u32* red_u) {
    const u64 srows = (n.rows + a.world - 1) / a.world;
    const u64 steps = norm_steps(n, srows);
    u8* own = (u8*)(a.staging[a.rank] + par);
    Vec wv[NORM_V_STAGED];
    const bool pre = norm_one_chunk<NORM_V_STAGED>(n);
    if (pre) norm_load_weight<NORM_V_STAGED>(n, aligned, wv);
    for (u32 k = 0; k < a.world; k++)
        for (u64 s = 0; s < steps; s++) {
            const u64 o = norm_slot_row(n, s);
            lp_stage_row<NORM_V_STAGED>(n, own, k * srows + o, o < srows && k * srows + o < n.rows,
                                        aligned);
        }
    bool ok = n.loopback ? (__syncthreads(), true) : block_barrier(a, 0, e, t0);
    if (!n.loopback) hello_send(a, a.sig, e, 0);
    const bool hello = ok && !n.loopback;
    if (ok) {
        for (u64 s = 0; s < steps; s++) {
            const u64 o = norm_slot_row(n, s);
            const u64 row = a.rank * srows + o;
            lp_reduce_row<NORM_V_STAGED>(a, n, par, row, o < srows && row < n.rows);
        }
        // release: the peers decode the records quantized above after seeing this flag.
        ok = n.loopback ? (__syncthreads(), true) : block_barrier(a, 1, e, t0);
    }
    if (ok) {
        const Publish none{nullptr, 0};
        for (u32 i = 0; i < a.world; i++) {
            const u32 k = (a.rank + i) % a.world;
            const SumFromRecords<NORM_V_STAGED> src{&n, &a.staging[k], 1, par};
            for (u64 s = 0; s < steps; s++) {
                const u64 o = norm_slot_row(n, s);
                const u64 row = k * srows + o;
                norm_row<NORM_V_STAGED, NORM_AL_RUNTIME, NORM_FP8_RUNTIME>(
                    n, src, none, row, o < srows && row < n.rows, aligned, wv, pre, red_f, red_u);
            }
        }
    }
    if (hello) hello_check(a, a.sig, e, t0, 0, 9);
}

// The two-shot's body, AL, FP8 and LP as fused_flat's.
template <int AL, int FP8, bool LP>
__device__ __forceinline__ void fused_tree(const Args& a, const NormArgs& n) {
    __shared__ float red_f[NORM_WARPS];
    __shared__ u32 red_u[NORM_WARPS];
    const u64 t0 = globaltimer();
    const u32 e = call_epoch(a);
    const u64 par = (u64)(e & 1) * a.staging_bytes;
    const bool aligned = AL == NORM_AL_RUNTIME ? fused_aligned(n) : AL == 1;
    if (LP && n.lp_block) {
        fused_tree_lp(a, n, e, t0, par, aligned, red_f, red_u);
        end_call(a, e);
        return;
    }
    const u64 srows = (n.rows + a.world - 1) / a.world;  // rows per stripe
    const u64 steps = norm_steps(n, srows);
    u8* own = (u8*)(a.staging[a.rank] + par);
    Vec wv[NORM_V_STAGED];
    const bool pre = norm_one_chunk<NORM_V_STAGED>(n);
    if (pre) norm_load_weight<NORM_V_STAGED>(n, aligned, wv);
    // Slot o of every stripe: the rows the peers' same block reduces.
    for (u32 k = 0; k < a.world; k++)
        for (u64 s = 0; s < steps; s++) {
            const u64 o = norm_slot_row(n, s);
            fused_stage_row<NORM_V>(n, own, k * srows + o, o < srows && k * srows + o < n.rows,
                                    aligned);
        }
    const u64 o0 = norm_slot_row(n, 0), row0 = a.rank * srows + o0;  // the slot's first row
    const bool far = steps >= NORM_PREFETCH_STEPS;
    fused_prefetch_row(n, own, row0, far && o0 < srows && row0 < n.rows, aligned);
    bool ok = n.loopback ? (__syncthreads(), true) : block_barrier(a, 0, e, t0);
    if (!n.loopback) hello_send(a, a.sig, e, 0);  // after the barrier, met or not, as in tree
    const bool hello = ok && !n.loopback;
    if (ok) {
        const SumFromStaging<NORM_V_STAGED> src{&a, par};
        const Publish pub{own, n.rows * n.hidden * sizeof(T)};
        for (u64 s = 0; s < steps; s++) {
            const u64 o = norm_slot_row(n, s), row = a.rank * srows + o;
            const u64 o1 = norm_slot_row(n, s + 1), next = a.rank * srows + o1;
            fused_prefetch_row(n, own, next, far && s + 1 < steps && o1 < srows && next < n.rows,
                               aligned);
            norm_row<NORM_V_STAGED, AL, FP8>(n, src, pub, row, o < srows && row < n.rows, aligned,
                                             wv, pre, red_f, red_u);
        }
        // release: the peers copy the y and r rows published above after seeing this flag.
        ok = n.loopback ? (__syncthreads(), true) : block_barrier(a, 1, e, t0);
    }
    if (ok) {
        for (u32 i = 1; i < a.world; i++) {
            const u32 k = (a.rank + i) % a.world;
            for (u64 s = 0; s < steps; s++) {
                const u64 o = norm_slot_row(n, s);
                const u64 row = k * srows + o;
                fused_gather_row<NORM_V_STAGED, FP8>(a, n, par, k, row, o < srows && row < n.rows,
                                                aligned, red_u);
            }
        }
    }
    if (hello) hello_check(a, a.sig, e, t0, 0, 9);
    end_call(a, e);
}

#ifdef FC_GROUP_RMSNORM
extern "C" __global__ void __launch_bounds__(NORM_THREADS) fc_fused_tree(Args a, NormArgs n) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    fused_tree<NORM_AL_RUNTIME, NORM_FP8_RUNTIME, true>(a, n);
}

// The common two-shot (as fc_fused_flat_plain: the host's choice) without the other paths'
// registers; the same arithmetic, protocol and results as fc_fused_tree's.
extern "C" __global__ void __launch_bounds__(NORM_THREADS) fc_fused_tree_plain(Args a, NormArgs n) {
    pdl_wait_mark(a);
    pdl_launch_dependents();
    fused_tree<1, NORM_FP8_OFF, false>(a, n);
}
#endif
