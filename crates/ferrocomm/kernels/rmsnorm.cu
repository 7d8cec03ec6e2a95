// ferrocomm residual add + RMSNorm (+ E4M3 rows) after an all-reduce: the second half of the
// fused all_reduce_rmsnorm call (crates/ferrocomm/src/rmsnorm.rs has the arithmetic and the host
// reference). Appended after all_reduce.cu and lowp.cu in the f32/f16/bf16 modules; uses T,
// Ty<T>, pdl_wait/pdl_launch_dependents, and lowp.cu's lp_scale and LP_E4M3.
//
// One block per row (grid-stride over rows), thread t handles elements t, t + blockDim, ...:
//   pass 1: r = round(sum + residual) -> residual_out, and the sum of squares of the stored r;
//   pass 2: y = round(r * inv * w) -> out, inv = 1 / sqrt(sumsq / hidden + eps), and absmax(y);
//   pass 3 (FP8): scale = lp_scale(absmax), codes = e4m3(y / scale) (correctly rounded division,
//   saturating), codes 0 when the scale is 0 or not finite.
// Every element is read and written by the same thread in every pass, so `out` may be the sum
// (in place) and `residual_out` the residual. Products and sums are explicit _rn intrinsics (no
// FMA contraction), as the host's f32 arithmetic; only the sum of squares is ordered differently
// (a block reduction), so results match the host's within an ulp of the row's norm. The same
// grid on every rank gives bit-identical rows everywhere.

struct NormArgs {
    u64 sum;           // all-reduced rows (T), rows * hidden
    u64 residual;      // T, rows * hidden
    u64 weight;        // T, hidden
    u64 out;           // T, rows * hidden
    u64 residual_out;  // T, rows * hidden
    u64 codes;         // u8 E4M3, rows * hidden; 0: no FP8 output
    u64 scales;        // f32, rows
    u64 rows;
    u64 hidden;
    float eps;
    u32 pad_;
};

#define NORM_THREADS 512

// The sum of one value per thread over the block, the same on every thread (warp sums in a
// fixed shuffle order, then the warps' in order). `red` holds one word per warp.
__device__ __forceinline__ float norm_block_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    __syncthreads();  // red is reused row after row
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (u32 w = 0; w < warps; w++) s = __fadd_rn(s, red[w]);
    return s;
}

// The largest of one value per thread over the block, on every thread.
__device__ __forceinline__ u32 norm_block_max(u32 v, u32* red) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    u32 m = 0;
    for (u32 w = 0; w < warps; w++) m = max(m, red[w]);
    return m;
}

// The E4M3 code of q (nearest even, saturating to +-448; NaN gives the NaN code).
__device__ __forceinline__ u8 norm_e4m3(float q) {
    u16 h;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(0.0f), "f"(q));
    return (u8)(h & 0xff);
}

#ifdef FC_GROUP_RMSNORM
extern "C" __global__ void __launch_bounds__(NORM_THREADS) fc_rmsnorm(NormArgs n) {
    pdl_wait();
    pdl_launch_dependents();
    __shared__ float red_f[NORM_THREADS / 32];
    __shared__ u32 red_u[NORM_THREADS / 32];
    const T* sum = (const T*)n.sum;
    const T* res = (const T*)n.residual;
    const T* w = (const T*)n.weight;
    T* out = (T*)n.out;
    T* rout = (T*)n.residual_out;
    const u64 h = n.hidden;
    for (u64 row = blockIdx.x; row < n.rows; row += gridDim.x) {
        const u64 base = row * h;
        float sq = 0.0f;
        for (u64 j = threadIdx.x; j < h; j += blockDim.x) {
            const float s = Ty<T>::to_acc(sum[base + j]);
            const T r = Ty<T>::from_acc(__fadd_rn(s, Ty<T>::to_acc(res[base + j])));
            rout[base + j] = r;
            const float rf = Ty<T>::to_acc(r);
            sq = __fadd_rn(sq, __fmul_rn(rf, rf));
        }
        const float total = norm_block_sum(sq, red_f);
        const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(total, (float)h), n.eps)));
        u32 amax = 0;
        for (u64 j = threadIdx.x; j < h; j += blockDim.x) {
            const float r = Ty<T>::to_acc(rout[base + j]);
            const T y = Ty<T>::from_acc(__fmul_rn(__fmul_rn(r, inv), Ty<T>::to_acc(w[j])));
            out[base + j] = y;
            // NaN (any payload) > Inf > finite as bits: a non-finite row gets a NaN scale.
            amax = max(amax, __float_as_uint(Ty<T>::to_acc(y)) & 0x7fffffffu);
        }
        if (n.codes == 0) continue;
        const float scale = lp_scale(norm_block_max(amax, red_u), LP_E4M3);
        const bool usable = scale > 0.0f && !isinf(scale) && !isnan(scale);
        u8* codes = (u8*)n.codes;
        for (u64 j = threadIdx.x; j < h; j += blockDim.x)
            codes[base + j] = usable ? norm_e4m3(__fdiv_rn(Ty<T>::to_acc(out[base + j]), scale)) : 0;
        if (threadIdx.x == 0) ((float*)n.scales)[row] = scale;
    }
}
#endif

// ---------------------------------------------------------------- one launch: the fused forms
//
// The all-reduce and the norm in one kernel on the direct-access staging (all_reduce.cu's
// protocol: call epochs in device memory, staging parity e & 1, per-block barriers with a
// system-scope release / acquire, hellos carrying the call's signature, timeouts). Whole rows
// per block: block b handles rows b, b + grid, ... (the grid is the same on every rank: it
// comes from the call's shape, which the signature covers), thread t the 16-byte vectors t,
// t + blockDim, ... of a row. A row sits in the staging as it sits in x (row r at r * hidden
// elements, a multiple of 16 bytes since hidden is a multiple of 8).
//
// fc_fused_flat (one-shot pull): every rank stages its x rows, meets every peer's same block,
// and reduces every rank's copy of each row in rank order 0..n-1 (reduce_vec, the plain
// all-reduce's fold, so the sum has its bits) before the residual add and the norm, which are
// fc_rmsnorm's arithmetic. Every rank computes every row the same way: identical results.
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

// Vector v (VEC_ELEMS elements from element i) of a user buffer: one 16-byte access when every
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

// Whether every user pointer of the call allows 16-byte accesses.
__device__ __forceinline__ bool fused_aligned(const NormArgs& n) {
    return ((n.sum | n.residual | n.weight | n.out | n.residual_out) & 15) == 0;
}

// Stages row `row` of x into this rank's staging (parity offset `par`).
__device__ __forceinline__ void fused_stage_row(const Args& a, const NormArgs& n, u64 par,
                                                u64 row, bool aligned) {
    const u64 nv = n.hidden / VEC_ELEMS, base = row * n.hidden;
    for (u64 v = threadIdx.x; v < nv; v += blockDim.x) {
        Vec x;
        fused_ld((const T*)n.sum, base + v * VEC_ELEMS, aligned, x);
        *(uint4*)(a.staging[a.rank] + par + (base + v * VEC_ELEMS) * sizeof(T)) = x.u;
    }
}

// The E4M3 codes and scale of row `row` from its y in `out` (amax: this thread's largest |y|
// as bits), as fc_rmsnorm computes them. Every thread of the block calls it.
__device__ __forceinline__ void fused_fp8_row(const NormArgs& n, u64 row, u32 amax, u32* red) {
    const float scale = lp_scale(norm_block_max(amax, red), LP_E4M3);
    const bool usable = scale > 0.0f && !isinf(scale) && !isnan(scale);
    const T* out = (const T*)n.out;
    u8* codes = (u8*)n.codes;
    const u64 nv = n.hidden / VEC_ELEMS, base = row * n.hidden;
    for (u64 v = threadIdx.x; v < nv; v += blockDim.x)
#pragma unroll
        for (u32 k = 0; k < VEC_ELEMS; k++) {
            const u64 i = base + v * VEC_ELEMS + k;
            codes[i] = usable ? norm_e4m3(__fdiv_rn(Ty<T>::to_acc(out[i]), scale)) : 0;
        }
    if (threadIdx.x == 0) ((float*)n.scales)[row] = scale;
}

// Row `row` reduced over every rank's staged copy (parity `par`), the residual added, normalized;
// outputs written. With `publish` (two-shot) y goes over this rank's staged copy of the row and
// r into the staging's second area, for the peers to copy. Every thread of the block calls it.
__device__ void fused_norm_row(const Args& a, const NormArgs& n, u64 par, u64 row, bool aligned,
                               bool publish, float* red_f, u32* red_u) {
    const T* res = (const T*)n.residual;
    const T* w = (const T*)n.weight;
    T* out = (T*)n.out;
    T* rout = (T*)n.residual_out;
    const u64 h = n.hidden, nv = h / VEC_ELEMS, base = row * h;
    const u64 r_area = n.rows * h * sizeof(T);
    float sq = 0.0f;
    for (u64 v = threadIdx.x; v < nv; v += blockDim.x) {
        const u64 i = base + v * VEC_ELEMS;
        Vec s, rs, r;
        reduce_vec<OP_SUM>(a, par + i * sizeof(T), s);  // rank order 0..n-1 (rule 5)
        fused_ld(res, i, aligned, rs);
#pragma unroll
        for (u32 k = 0; k < VEC_ELEMS; k++) {
            r.e[k] = Ty<T>::from_acc(__fadd_rn(Ty<T>::to_acc(s.e[k]), Ty<T>::to_acc(rs.e[k])));
            const float rf = Ty<T>::to_acc(r.e[k]);
            sq = __fadd_rn(sq, __fmul_rn(rf, rf));
        }
        fused_st(rout, i, aligned, r);
        if (publish) *(uint4*)(a.staging[a.rank] + par + r_area + i * sizeof(T)) = r.u;
    }
    const float total = norm_block_sum(sq, red_f);
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(total, (float)h), n.eps)));
    u32 amax = 0;
    for (u64 v = threadIdx.x; v < nv; v += blockDim.x) {
        const u64 i = base + v * VEC_ELEMS;
        Vec r, wv, y;
        fused_ld(rout, i, aligned, r);  // this thread's own stores above
        fused_ld(w, v * VEC_ELEMS, aligned, wv);
#pragma unroll
        for (u32 k = 0; k < VEC_ELEMS; k++) {
            y.e[k] = Ty<T>::from_acc(
                __fmul_rn(__fmul_rn(Ty<T>::to_acc(r.e[k]), inv), Ty<T>::to_acc(wv.e[k])));
            amax = max(amax, __float_as_uint(Ty<T>::to_acc(y.e[k])) & 0x7fffffffu);
        }
        fused_st(out, i, aligned, y);
        // Over this rank's own staged copy of the row: no peer reads it (two-shot).
        if (publish) *(uint4*)(a.staging[a.rank] + par + i * sizeof(T)) = y.u;
    }
    if (n.codes != 0) fused_fp8_row(n, row, amax, red_u);
}

// Row `row` of stripe owner `k` copied from k's staging (y and r, published by fused_norm_row),
// with its E4M3 codes computed from y. Every thread of the block calls it.
__device__ void fused_gather_row(const Args& a, const NormArgs& n, u64 par, u32 k, u64 row,
                                 bool aligned, u32* red_u) {
    const u64 h = n.hidden, nv = h / VEC_ELEMS, base = row * h;
    const u64 r_area = n.rows * h * sizeof(T);
    u32 amax = 0;
    for (u64 v = threadIdx.x; v < nv; v += blockDim.x) {
        const u64 i = base + v * VEC_ELEMS;
        Vec y, r;
        y.u = ld_v4((const uint4*)(a.staging[k] + par + i * sizeof(T)));
        r.u = ld_v4((const uint4*)(a.staging[k] + par + r_area + i * sizeof(T)));
        fused_st((T*)n.out, i, aligned, y);
        fused_st((T*)n.residual_out, i, aligned, r);
#pragma unroll
        for (u32 e = 0; e < VEC_ELEMS; e++)
            amax = max(amax, __float_as_uint(Ty<T>::to_acc(y.e[e])) & 0x7fffffffu);
    }
    if (n.codes != 0) fused_fp8_row(n, row, amax, red_u);
}

#ifdef FC_GROUP_RMSNORM
extern "C" __global__ void __launch_bounds__(NORM_THREADS) fc_fused_flat(Args a, NormArgs n) {
    pdl_wait();
    pdl_launch_dependents();
    __shared__ float red_f[NORM_THREADS / 32];
    __shared__ u32 red_u[NORM_THREADS / 32];
    const u64 t0 = globaltimer();
    const u32 e = call_epoch(a);
    const u64 par = (u64)(e & 1) * a.staging_bytes;
    const bool aligned = fused_aligned(n);
    for (u64 row = blockIdx.x; row < n.rows; row += gridDim.x)
        fused_stage_row(a, n, par, row, aligned);
    const bool met = block_barrier(a, 0, e, t0);
    hello_send(a, a.sig, e, 0);  // after the barrier, met or not, as in flat
    if (met) {
        for (u64 row = blockIdx.x; row < n.rows; row += gridDim.x)
            fused_norm_row(a, n, par, row, aligned, false, red_f, red_u);
        hello_check(a, a.sig, e, t0, 0, 9);
    }
    end_call(a, e);
}
#endif

#ifdef FC_GROUP_RMSNORM
extern "C" __global__ void __launch_bounds__(NORM_THREADS) fc_fused_tree(Args a, NormArgs n) {
    pdl_wait();
    pdl_launch_dependents();
    __shared__ float red_f[NORM_THREADS / 32];
    __shared__ u32 red_u[NORM_THREADS / 32];
    const u64 t0 = globaltimer();
    const u32 e = call_epoch(a);
    const u64 par = (u64)(e & 1) * a.staging_bytes;
    const bool aligned = fused_aligned(n);
    const u64 srows = (n.rows + a.world - 1) / a.world;  // rows per stripe
    // Block b stages row o of every stripe, o = b, b + grid, ...: the rows its peers' block b
    // reduces, so the per-block barriers cover exactly what each block exchanges.
    for (u32 k = 0; k < a.world; k++)
        for (u64 o = blockIdx.x; o < srows && k * srows + o < n.rows; o += gridDim.x)
            fused_stage_row(a, n, par, k * srows + o, aligned);
    bool ok = block_barrier(a, 0, e, t0);
    hello_send(a, a.sig, e, 0);  // after the barrier, met or not, as in tree
    const bool hello = ok;
    if (ok) {
        for (u64 o = blockIdx.x; o < srows && a.rank * srows + o < n.rows; o += gridDim.x)
            fused_norm_row(a, n, par, a.rank * srows + o, aligned, true, red_f, red_u);
        // release: the peers copy the y and r rows published above after seeing this flag.
        ok = block_barrier(a, 1, e, t0);
    }
    if (ok) {
        for (u32 i = 1; i < a.world; i++) {
            const u32 k = (a.rank + i) % a.world;
            for (u64 o = blockIdx.x; o < srows && k * srows + o < n.rows; o += gridDim.x)
                fused_gather_row(a, n, par, k, k * srows + o, aligned, red_u);
        }
    }
    if (hello) hello_check(a, a.sig, e, t0, 0, 9);
    end_call(a, e);
}
#endif
