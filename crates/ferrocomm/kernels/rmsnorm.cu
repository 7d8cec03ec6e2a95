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
