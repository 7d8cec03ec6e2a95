// Copy engine against SM-issued NVLink traffic on two GPUs, and a chunked low-precision
// all-reduce pipeline (quantize on the SMs, copy by the copy engine, decode on the SMs) to see
// what a copy-engine design could reach before building it. One process, peer access on.
//
//   nvcc -O2 -arch=sm_90 -o ce_probe ce_probe.cu && ./ce_probe
//
// The quantizer/decoder here are simple block-32 E4M3 kernels (scale = absmax/448, no correctly
// rounded division): stand-ins for the library's, timed alone as well so the pipeline's figures
// can be read against them.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

typedef unsigned long long u64;
typedef unsigned int u32;
#ifndef BLK
#define BLK 128
#endif
#define LPB (BLK / 8)
#define REC (4 + BLK)

__global__ void delay_kernel(u64 ns) {
    u64 t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        u64 t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > ns) break;
    }
}

// SM copy: every thread moves 16-byte pieces from src to dst (dst may be peer memory).
__global__ void sm_copy(const uint4* __restrict__ src, uint4* __restrict__ dst, u64 n16) {
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride) dst[i] = src[i];
}

// Block-BLK E4M3 records: [f32 scale][BLK codes]. Each lane takes 8 elements; BLK/8 lanes make a
// block. n is a multiple of BLK.
__global__ void quant(const __nv_bfloat16* __restrict__ in, unsigned char* __restrict__ rec, u64 n) {
    u64 lanes = (u64)gridDim.x * blockDim.x;
    for (u64 l = (u64)blockIdx.x * blockDim.x + threadIdx.x; l * 8 < n; l += lanes) {
        uint4 r = *(const uint4*)(in + l * 8);
        const __nv_bfloat16* e = (const __nv_bfloat16*)&r;
        float x[8];
        float m = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) { x[i] = __bfloat162float(e[i]); m = fmaxf(m, fabsf(x[i])); }
#pragma unroll
        for (int o = 1; o < LPB; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float s = m / 448.f;
        float y = s > 0.f ? 1.f / s : 0.f;
        u32 w[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            unsigned short a, b;
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(a) : "f"(x[4*h+1]*y), "f"(x[4*h]*y));
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(b) : "f"(x[4*h+3]*y), "f"(x[4*h+2]*y));
            w[h] = a | ((u32)b << 16);
        }
        u64 blk = l / LPB;
        unsigned char* p = rec + blk * REC;
        if ((l % LPB) == 0) *(float*)p = s;
        u32* c = (u32*)(p + 4 + (l % LPB) * 8);
        c[0] = w[0];
        c[1] = w[1];
    }
}

__device__ __forceinline__ void dec8(const unsigned char* p, u64 l, float* v) {
    float s = *(const float*)p;
    const u32* c = (const u32*)(p + 4 + (l % LPB) * 8);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        u32 w = c[h];
        u32 f0, f1;
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(f0) : "h"((unsigned short)(w & 0xffff)));
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(f1) : "h"((unsigned short)(w >> 16)));
        __half2 a = *(__half2*)&f0, b = *(__half2*)&f1;
        v[4*h] = __low2float(a) * s; v[4*h+1] = __high2float(a) * s;
        v[4*h+2] = __low2float(b) * s; v[4*h+3] = __high2float(b) * s;
    }
}

// out = decode(r0) + decode(r1), in that order.
__global__ void decode2(const unsigned char* __restrict__ r0, const unsigned char* __restrict__ r1,
                        __nv_bfloat16* __restrict__ out, u64 n) {
    u64 lanes = (u64)gridDim.x * blockDim.x;
    for (u64 l = (u64)blockIdx.x * blockDim.x + threadIdx.x; l * 8 < n; l += lanes) {
        u64 blk = l / LPB;
        float a[8], b[8];
        dec8(r0 + blk * REC, l, a);
        dec8(r1 + blk * REC, l, b);
        uint4 r;
        __nv_bfloat16* e = (__nv_bfloat16*)&r;
#pragma unroll
        for (int i = 0; i < 8; i++) e[i] = __float2bfloat16(a[i] + b[i]);
        *(uint4*)(out + l * 8) = r;
    }
}


// Release store of `v` to a flag (a peer's, through peer access) once everything before it in the
// stream (the copy engine's copy included) is complete.
__global__ void signal_kernel(u32* flag, u32 v) {
    asm volatile("fence.acq_rel.sys;" ::: "memory");
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(v) : "memory");
}

__device__ bool wait_flag(const u32* flag, u32 v) {
    u64 t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        u32 x;
        asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(x) : "l"(flag) : "memory");
        if (x == v) return true;
        u64 t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > 2000000000ull) return false;
    }
}

// Decodes chunks k0..k1 in order, each once its flag reads v.
__global__ void decode_chunks(const unsigned char* __restrict__ r0, const unsigned char* __restrict__ r1,
                              __nv_bfloat16* __restrict__ out, u64 cn, u64 crb, int k0, int k1,
                              const u32* flags, u32 v, int* err) {
    for (int k = k0; k < k1; k++) {
        if (threadIdx.x == 0 && !wait_flag(flags + k, v)) atomicAdd(err, 1);
        __syncthreads();
        const unsigned char* a0 = r0 + k * crb;
        const unsigned char* a1 = r1 + k * crb;
        __nv_bfloat16* o = out + k * cn;
        u64 lanes = (u64)gridDim.x * blockDim.x;
        for (u64 l = (u64)blockIdx.x * blockDim.x + threadIdx.x; l * 8 < cn; l += lanes) {
            u64 blk = l / LPB;
            float a[8], b[8];
            dec8(a0 + blk * REC, l, a);
            dec8(a1 + blk * REC, l, b);
            uint4 r;
            __nv_bfloat16* e = (__nv_bfloat16*)&r;
#pragma unroll
            for (int i = 0; i < 8; i++) e[i] = __float2bfloat16(a[i] + b[i]);
            *(uint4*)(o + l * 8) = r;
        }
    }
}

// quant() that also stores every record into the peer's receive buffer (SM-issued push).
__global__ void quant_push(const __nv_bfloat16* __restrict__ in, unsigned char* __restrict__ rec,
                           unsigned char* __restrict__ peer, u64 n) {
    u64 lanes = (u64)gridDim.x * blockDim.x;
    for (u64 l = (u64)blockIdx.x * blockDim.x + threadIdx.x; l * 8 < n; l += lanes) {
        uint4 r = *(const uint4*)(in + l * 8);
        const __nv_bfloat16* e = (const __nv_bfloat16*)&r;
        float x[8];
        float m = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) { x[i] = __bfloat162float(e[i]); m = fmaxf(m, fabsf(x[i])); }
#pragma unroll
        for (int o = 1; o < LPB; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float s = m / 448.f;
        float y = s > 0.f ? 1.f / s : 0.f;
        u32 w[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            unsigned short a, b;
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(a) : "f"(x[4*h+1]*y), "f"(x[4*h]*y));
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(b) : "f"(x[4*h+3]*y), "f"(x[4*h+2]*y));
            w[h] = a | ((u32)b << 16);
        }
        u64 off = (l / LPB) * REC;
        if ((l % LPB) == 0) { *(float*)(rec + off) = s; *(float*)(peer + off) = s; }
        u64 co = off + 4 + (l % LPB) * 8;
        ((u32*)(rec + co))[0] = w[0]; ((u32*)(rec + co))[1] = w[1];
        ((u32*)(peer + co))[0] = w[0]; ((u32*)(peer + co))[1] = w[1];
    }
}


// Graph-mode variants: every replay first bumps the local epoch (tick), signals store it and
// waits compare against it, so replays need no new arguments.
__global__ void tick(u32* ep) { *ep += 1; }
__global__ void signal_ep(u32* flag, const u32* ep) {
    u32 v = *ep;
    asm volatile("fence.acq_rel.sys;" ::: "memory");
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(v) : "memory");
}
__global__ void decode_chunks_ep(const unsigned char* __restrict__ r0, const unsigned char* __restrict__ r1,
                                 __nv_bfloat16* __restrict__ out, u64 cn, u64 crb, int k0, int k1,
                                 const u32* flags, const u32* ep, int* err) {
    u32 v = *ep;
    for (int k = k0; k < k1; k++) {
        if (threadIdx.x == 0 && !wait_flag(flags + k, v)) atomicAdd(err, 1);
        __syncthreads();
        const unsigned char* a0 = r0 + k * crb;
        const unsigned char* a1 = r1 + k * crb;
        __nv_bfloat16* o = out + k * cn;
        u64 lanes = (u64)gridDim.x * blockDim.x;
        for (u64 l = (u64)blockIdx.x * blockDim.x + threadIdx.x; l * 8 < cn; l += lanes) {
            u64 blk = l / LPB;
            float a[8], b[8];
            dec8(a0 + blk * REC, l, a);
            dec8(a1 + blk * REC, l, b);
            uint4 r;
            __nv_bfloat16* e = (__nv_bfloat16*)&r;
#pragma unroll
            for (int i = 0; i < 8; i++) e[i] = __float2bfloat16(a[i] + b[i]);
            *(uint4*)(o + l * 8) = r;
        }
    }
}

__global__ void fill(__nv_bfloat16* x, u64 n, u32 seed) {
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        u32 h = (u32)i * 2654435761u ^ seed;
        h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        x[i] = __float2bfloat16(((int)(h & 0xffff) - 32768) / 8192.0f);
    }
}

struct Gpu {
    int dev;
    cudaStream_t q, c;
    __nv_bfloat16 *in, *out;
    unsigned char *own, *recv;  // own records; records received from the peer
    unsigned char *big, *big2;  // raw copy buffers
    u32* flags;  // per chunk, written by the peer
    u32* ep;
    int* err;
};

static int g_sms;

static float med(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

// Runs `body` on both GPUs between a common start and end; returns µs (median of reps).
template <typename F>
static float timed(Gpu* g, int reps, F body) {
    std::vector<float> t;
    for (int r = 0; r < reps + 2; r++) {
        cudaEvent_t s0, e0, d1, dc0, dc1;
        CK(cudaSetDevice(0));
        CK(cudaEventCreate(&s0)); CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&dc0));
        CK(cudaSetDevice(1));
        CK(cudaEventCreate(&d1)); CK(cudaEventCreate(&dc1));
        CK(cudaSetDevice(0));
        delay_kernel<<<1, 1, 0, g[0].q>>>(200000);  // host enqueues everything meanwhile
        CK(cudaEventRecord(s0, g[0].q));
        CK(cudaStreamWaitEvent(g[0].c, s0));
        CK(cudaSetDevice(1));
        CK(cudaStreamWaitEvent(g[1].q, s0));
        CK(cudaStreamWaitEvent(g[1].c, s0));
        body();
        CK(cudaSetDevice(1));
        CK(cudaEventRecord(dc1, g[1].c));
        CK(cudaStreamWaitEvent(g[1].q, dc1));
        CK(cudaEventRecord(d1, g[1].q));
        CK(cudaSetDevice(0));
        CK(cudaEventRecord(dc0, g[0].c));
        CK(cudaStreamWaitEvent(g[0].q, dc0));
        CK(cudaStreamWaitEvent(g[0].q, d1));
        CK(cudaEventRecord(e0, g[0].q));
        CK(cudaEventSynchronize(e0));
        float ms;
        CK(cudaEventElapsedTime(&ms, s0, e0));
        if (r >= 2) t.push_back(ms * 1000.f);
        cudaEventDestroy(s0); cudaEventDestroy(e0); cudaEventDestroy(dc0);
        CK(cudaSetDevice(1));
        cudaEventDestroy(d1); cudaEventDestroy(dc1);
    }
    CK(cudaSetDevice(0));
    return med(t);
}

int main() {
    int nd;
    CK(cudaGetDeviceCount(&nd));
    if (nd < 2) { printf("needs 2 GPUs\n"); return 1; }
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    g_sms = pr.multiProcessorCount;
    printf("%s, %d SMs, async engines %d\n", pr.name, g_sms, pr.asyncEngineCount);
    const u64 MAXB = 256ull << 20;  // bf16 bytes
    Gpu g[2];
    for (int i = 0; i < 2; i++) {
        g[i].dev = i;
        CK(cudaSetDevice(i));
        CK(cudaDeviceEnablePeerAccess(1 - i, 0));
        CK(cudaStreamCreateWithFlags(&g[i].q, cudaStreamNonBlocking));
        CK(cudaStreamCreateWithFlags(&g[i].c, cudaStreamNonBlocking));
        CK(cudaMalloc(&g[i].in, MAXB));
        CK(cudaMalloc(&g[i].out, MAXB));
        CK(cudaMalloc(&g[i].own, MAXB / 2 * REC / BLK + 64));
        CK(cudaMalloc(&g[i].recv, MAXB / 2 * REC / BLK + 64));
        CK(cudaMalloc(&g[i].big, MAXB));
        CK(cudaMalloc(&g[i].big2, MAXB));
        CK(cudaMalloc(&g[i].flags, 4096));
        CK(cudaMemset(g[i].flags, 0, 4096));
        CK(cudaMalloc(&g[i].err, 4));
        CK(cudaMalloc(&g[i].ep, 4));
        CK(cudaMemset(g[i].ep, 0, 4));
        CK(cudaMemset(g[i].err, 0, 4));
        fill<<<1024, 256>>>(g[i].in, MAXB / 2, 17 + i);
        CK(cudaMemset(g[i].big, 1, MAXB));
        CK(cudaDeviceSynchronize());
    }
    const int REPS = 7;
    printf("\n# raw transfer, us (GB/s per direction)\n");
    printf("%10s %18s %18s %18s %18s\n", "bytes", "CE one way", "CE both ways", "SM both (write)", "SM both (read)");
    for (u64 b = 4ull << 20; b <= MAXB; b *= 4) {
        float one = timed(g, REPS, [&] {
            CK(cudaSetDevice(0));
            CK(cudaMemcpyAsync(g[1].big2, g[0].big, b, cudaMemcpyDeviceToDevice, g[0].c));
        });
        float both = timed(g, REPS, [&] {
            for (int i = 0; i < 2; i++) {
                CK(cudaSetDevice(i));
                CK(cudaMemcpyAsync(g[1 - i].big2, g[i].big, b, cudaMemcpyDeviceToDevice, g[i].c));
            }
        });
        float smw = timed(g, REPS, [&] {
            for (int i = 0; i < 2; i++) {
                CK(cudaSetDevice(i));
                sm_copy<<<g_sms * 2, 512, 0, g[i].q>>>((const uint4*)g[i].big, (uint4*)g[1 - i].big2, b / 16);
            }
        });
        float smr = timed(g, REPS, [&] {
            for (int i = 0; i < 2; i++) {
                CK(cudaSetDevice(i));
                sm_copy<<<g_sms * 2, 512, 0, g[i].q>>>((const uint4*)g[1 - i].big, (uint4*)g[i].big2, b / 16);
            }
        });
        printf("%10llu %9.1f (%5.0f) %9.1f (%5.0f) %9.1f (%5.0f) %9.1f (%5.0f)\n", b, one, b / one / 1e3,
               both, b / both / 1e3, smw, b / smw / 1e3, smr, b / smr / 1e3);
    }

    printf("\n# low-precision all-reduce pieces (bf16 bytes per rank), us\n");
    printf("%10s %8s %8s %10s %8s %8s %8s %8s %8s %8s\n", "bytes", "quant", "decode", "CE(recs)",
           "serial", "K=2", "K=4", "K=8", "K=16", "K=32");
    for (u64 b = 4ull << 20; b <= MAXB; b *= 4) {
        u64 n = b / 2;
        u64 recb = n / BLK * REC;
        int qg = g_sms * 4, qb = 256;
        float tq = timed(g, REPS, [&] {
            for (int i = 0; i < 2; i++) {
                CK(cudaSetDevice(i));
                quant<<<qg, qb, 0, g[i].q>>>(g[i].in, g[i].own, n);
            }
        });
        float td = timed(g, REPS, [&] {
            for (int i = 0; i < 2; i++) {
                CK(cudaSetDevice(i));
                decode2<<<qg, qb, 0, g[i].q>>>(g[i].own, g[i].recv, g[i].out, n);
            }
        });
        float tc = timed(g, REPS, [&] {
            for (int i = 0; i < 2; i++) {
                CK(cudaSetDevice(i));
                CK(cudaMemcpyAsync(g[1 - i].recv, g[i].own, recb, cudaMemcpyDeviceToDevice, g[i].c));
            }
        });
        float tk[6];
        int ks[6] = {1, 2, 4, 8, 16, 32};
        for (int ki = 0; ki < 6; ki++) {
            int K = ks[ki];
            u64 cn = n / K;  // elements per chunk (multiple of 32 for these sizes)
            u64 crb = cn / BLK * REC;
            std::vector<cudaEvent_t> qe[2], ce[2];
            for (int i = 0; i < 2; i++) {
                CK(cudaSetDevice(i));
                qe[i].resize(K); ce[i].resize(K);
                for (int k = 0; k < K; k++) {
                    CK(cudaEventCreateWithFlags(&qe[i][k], cudaEventDisableTiming));
                    CK(cudaEventCreateWithFlags(&ce[i][k], cudaEventDisableTiming));
                }
            }
            int gq = std::max(1, std::min(qg, (int)(cn / 8 / qb)));
            tk[ki] = timed(g, REPS, [&] {
                // Issue order per GPU: quant 0, quant 1, decode 0, quant 2, decode 1, ...
                for (int k = 0; k <= K; k++) {
                    for (int i = 0; i < 2; i++) {
                        CK(cudaSetDevice(i));
                        if (k < K) {
                            quant<<<gq, qb, 0, g[i].q>>>(g[i].in + k * cn, g[i].own + k * crb, cn);
                            CK(cudaEventRecord(qe[i][k], g[i].q));
                            CK(cudaStreamWaitEvent(g[i].c, qe[i][k]));
                            CK(cudaMemcpyAsync(g[1 - i].recv + k * crb, g[i].own + k * crb, crb,
                                               cudaMemcpyDeviceToDevice, g[i].c));
                            CK(cudaEventRecord(ce[i][k], g[i].c));
                        }
                    }
                    if (k >= 1) {
                        int d = k - 1;
                        for (int i = 0; i < 2; i++) {
                            CK(cudaSetDevice(i));
                            CK(cudaStreamWaitEvent(g[i].q, ce[1 - i][d]));
                            decode2<<<gq, qb, 0, g[i].q>>>(g[i].own + d * crb, g[i].recv + d * crb,
                                                           g[i].out + d * cn, cn);
                        }
                    }
                }
            });
            for (int i = 0; i < 2; i++) {
                CK(cudaSetDevice(i));
                for (int k = 0; k < K; k++) { cudaEventDestroy(qe[i][k]); cudaEventDestroy(ce[i][k]); }
            }
        }
        printf("%10llu %8.1f %8.1f %10.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f\n", b, tq, td, tc, tk[0],
               tk[1], tk[2], tk[3], tk[4], tk[5]);
    }

    printf("\n# flag-signalled pipelines (no cross-device events inside), us; empty = harness alone\n");
    printf("%10s %8s | CE+signal kernel, one decode kernel: %6s %6s %6s %6s | CE, decode per chunk: %6s %6s %6s | SM push+signal: %6s %6s %6s\n",
           "bytes", "empty", "K=1", "K=2", "K=4", "K=8", "K=2", "K=4", "K=8", "K=1", "K=4", "K=8");
    static u32 epoch = 1;
    float empty = timed(g, REPS, [&] {});
    for (u64 b = 4ull << 20; b <= MAXB; b *= 4) {
        u64 n = b / 2;
        int qb = 256;
        printf("%10llu %8.1f |", b, empty);
        // mode 0: CE + signal, one decode kernel for all chunks; 1: CE, decode per chunk
        // interleaved; 2: SM push, signal kernel on the compute stream.
        int ks0[4] = {1, 2, 4, 8}, ks1[3] = {2, 4, 8}, ks2[3] = {1, 4, 8};
        for (int mode = 0; mode < 3; mode++) {
            int* ks = mode == 0 ? ks0 : (mode == 1 ? ks1 : ks2);
            int nk = mode == 0 ? 4 : 3;
            if (mode > 0) printf(" %*s", mode == 1 ? 22 : 17, "");
            for (int ki = 0; ki < nk; ki++) {
                int K = ks[ki];
                u64 cn = n / K, crb = cn / BLK * REC;
                int gq = std::max(1, std::min(g_sms * 4, (int)(cn / 8 / qb)));
                std::vector<cudaEvent_t> qe[2];
                for (int i = 0; i < 2; i++) {
                    CK(cudaSetDevice(i));
                    qe[i].resize(K);
                    for (int k = 0; k < K; k++) CK(cudaEventCreateWithFlags(&qe[i][k], cudaEventDisableTiming));
                }
                float t = timed(g, REPS, [&] {
                    u32 v = ++epoch;
                    for (int k = 0; k <= K; k++) {
                        for (int i = 0; i < 2; i++) {
                            CK(cudaSetDevice(i));
                            if (k < K) {
                                if (mode == 2) {
                                    quant_push<<<gq, qb, 0, g[i].q>>>(g[i].in + k * cn, g[i].own + k * crb,
                                                                      g[1 - i].recv + k * crb, cn);
                                    signal_kernel<<<1, 1, 0, g[i].q>>>(g[1 - i].flags + k, v);
                                } else {
                                    quant<<<gq, qb, 0, g[i].q>>>(g[i].in + k * cn, g[i].own + k * crb, cn);
                                    CK(cudaEventRecord(qe[i][k], g[i].q));
                                    CK(cudaStreamWaitEvent(g[i].c, qe[i][k]));
                                    CK(cudaMemcpyAsync(g[1 - i].recv + k * crb, g[i].own + k * crb, crb,
                                                       cudaMemcpyDeviceToDevice, g[i].c));
                                    signal_kernel<<<1, 1, 0, g[i].c>>>(g[1 - i].flags + k, v);
                                }
                            }
                            if (mode == 1 && k >= 1)
                                decode_chunks<<<gq, qb, 0, g[i].q>>>(g[i].own, g[i].recv, g[i].out, cn, crb,
                                                                     k - 1, k, g[i].flags, v, g[i].err);
                            if (mode != 1 && k == K)
                                decode_chunks<<<std::min(gq, g_sms * 4), qb, 0, g[i].q>>>(
                                    g[i].own, g[i].recv, g[i].out, cn, crb, 0, K, g[i].flags, v, g[i].err);
                        }
                    }
                });
                for (int i = 0; i < 2; i++) {
                    CK(cudaSetDevice(i));
                    for (int k = 0; k < K; k++) cudaEventDestroy(qe[i][k]);
                }
                printf(" %6.1f", t);
            }
        }
        printf("\n");
    }
    for (int i = 0; i < 2; i++) {
        int e;
        CK(cudaSetDevice(i));
        CK(cudaMemcpy(&e, g[i].err, 4, cudaMemcpyDeviceToHost));
        printf("GPU %d flag timeouts: %d\n", i, e);
    }

    printf("\n# the same pipelines in CUDA graphs (one graph per GPU, 20 replays each), us per replay\n");
    printf("%10s | CE one decode: %6s %6s %6s %6s %6s | CE decode/chunk: %6s %6s %6s | SM push: %6s %6s %6s | quant %6s decode %6s\n",
           "bytes", "K=1", "K=2", "K=4", "K=8", "K=16", "K=2", "K=4", "K=8", "K=1", "K=4", "K=8", "", "");
    for (u64 b = 4ull << 20; b <= MAXB; b *= 4) {
        u64 n = b / 2;
        int qb = 256;
        printf("%10llu |", b);
        int ks0[5] = {1, 2, 4, 8, 16}, ks1[3] = {2, 4, 8}, ks2[3] = {1, 4, 8};
        for (int mode = 0; mode < 5; mode++) {
            int* ks = mode == 0 ? ks0 : (mode == 1 ? ks1 : ks2);
            int nk = mode == 0 ? 5 : (mode <= 2 ? 3 : 1);
            if (mode == 1) printf(" %17s", "");
            if (mode == 2) printf(" %9s", "");
            if (mode == 3) printf(" %7s", "");
            for (int ki = 0; ki < nk; ki++) {
                int K = mode >= 3 ? 1 : ks[ki];
                u64 cn = n / K, crb = cn / BLK * REC;
                int gq = std::max(1, std::min(g_sms * 4, (int)(cn / 8 / qb)));
                cudaGraphExec_t ex[2];
                for (int i = 0; i < 2; i++) {
                    CK(cudaSetDevice(i));
                    std::vector<cudaEvent_t> qe(K + 2);
                    for (auto& e : qe) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
                    CK(cudaStreamBeginCapture(g[i].q, cudaStreamCaptureModeRelaxed));
                    tick<<<1, 1, 0, g[i].q>>>(g[i].ep);
                    if (mode == 3) {
                        quant<<<gq, qb, 0, g[i].q>>>(g[i].in, g[i].own, n);
                    } else if (mode == 4) {
                        decode2<<<gq, qb, 0, g[i].q>>>(g[i].own, g[i].recv, g[i].out, n);
                    } else {
                        for (int k = 0; k <= K; k++) {
                            if (k < K) {
                                if (mode == 2) {
                                    quant_push<<<gq, qb, 0, g[i].q>>>(g[i].in + k * cn, g[i].own + k * crb,
                                                                      g[1 - i].recv + k * crb, cn);
                                    signal_ep<<<1, 1, 0, g[i].q>>>(g[1 - i].flags + k, g[i].ep);
                                } else {
                                    quant<<<gq, qb, 0, g[i].q>>>(g[i].in + k * cn, g[i].own + k * crb, cn);
                                    CK(cudaEventRecord(qe[k], g[i].q));
                                    CK(cudaStreamWaitEvent(g[i].c, qe[k]));
                                    CK(cudaMemcpyAsync(g[1 - i].recv + k * crb, g[i].own + k * crb, crb,
                                                       cudaMemcpyDeviceToDevice, g[i].c));
                                    signal_ep<<<1, 1, 0, g[i].c>>>(g[1 - i].flags + k, g[i].ep);
                                }
                            }
                            if (mode == 1 && k >= 1)
                                decode_chunks_ep<<<gq, qb, 0, g[i].q>>>(g[i].own, g[i].recv, g[i].out, cn, crb,
                                                                        k - 1, k, g[i].flags, g[i].ep, g[i].err);
                            if (mode != 1 && k == K)
                                decode_chunks_ep<<<gq, qb, 0, g[i].q>>>(g[i].own, g[i].recv, g[i].out, cn, crb,
                                                                        0, K, g[i].flags, g[i].ep, g[i].err);
                        }
                        if (mode != 2) {
                            CK(cudaEventRecord(qe[K], g[i].c));
                            CK(cudaStreamWaitEvent(g[i].q, qe[K]));
                        }
                    }
                    cudaGraph_t gr;
                    CK(cudaStreamEndCapture(g[i].q, &gr));
                    CK(cudaGraphInstantiate(&ex[i], gr, 0));
                    CK(cudaGraphDestroy(gr));
                    for (auto& e : qe) cudaEventDestroy(e);
                }
                // Warm-up, then timed replays; both GPUs launched in turn from this thread.
                std::vector<float> per;
                for (int rep = 0; rep < 4; rep++) {
                    cudaEvent_t a[2], z[2];
                    for (int i = 0; i < 2; i++) {
                        CK(cudaSetDevice(i));
                        CK(cudaEventCreate(&a[i])); CK(cudaEventCreate(&z[i]));
                        delay_kernel<<<1, 1, 0, g[i].q>>>(300000);
                        CK(cudaEventRecord(a[i], g[i].q));
                    }
                    const int R = 20;
                    for (int r = 0; r < R; r++)
                        for (int i = 0; i < 2; i++) { CK(cudaSetDevice(i)); CK(cudaGraphLaunch(ex[i], g[i].q)); }
                    for (int i = 0; i < 2; i++) { CK(cudaSetDevice(i)); CK(cudaEventRecord(z[i], g[i].q)); }
                    float worst = 0;
                    for (int i = 0; i < 2; i++) {
                        CK(cudaSetDevice(i));
                        CK(cudaEventSynchronize(z[i]));
                        float ms;
                        CK(cudaEventElapsedTime(&ms, a[i], z[i]));
                        worst = std::max(worst, ms * 1000.f / R);
                        cudaEventDestroy(a[i]); cudaEventDestroy(z[i]);
                    }
                    if (rep > 0) per.push_back(worst);
                }
                for (int i = 0; i < 2; i++) { CK(cudaSetDevice(i)); CK(cudaGraphExecDestroy(ex[i])); }
                printf(" %6.1f", med(per));
            }
        }
        printf("\n");
    }
    for (int i = 0; i < 2; i++) {
        int e;
        CK(cudaSetDevice(i));
        CK(cudaMemcpy(&e, g[i].err, 4, cudaMemcpyDeviceToHost));
        printf("GPU %d flag timeouts after graphs: %d\n", i, e);
    }
    // Check the pipeline's result on GPU 0 for the last size against a host decode of both.
    {
        u64 n = MAXB / 2;
        std::vector<__nv_bfloat16> o(4096);
        CK(cudaSetDevice(0));
        CK(cudaMemcpy(o.data(), g[0].out, 4096 * 2, cudaMemcpyDeviceToHost));
        std::vector<__nv_bfloat16> a(4096), b2(4096);
        CK(cudaMemcpy(a.data(), g[0].in, 4096 * 2, cudaMemcpyDeviceToHost));
        CK(cudaSetDevice(1));
        CK(cudaMemcpy(b2.data(), g[1].in, 4096 * 2, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        for (int i = 0; i < 4096; i++) {
            double r = (double)__bfloat162float(a[i]) + __bfloat162float(b2[i]);
            double d = __bfloat162float(o[i]) - r;
            num += d * d; den += r * r;
        }
        printf("\npipeline result, first 4096 elements of GPU 0: relative L2 error %.4f (n=%llu)\n",
               sqrt(num / den), n);
    }
    return 0;
}
