// What NVLink carries between two GPUs when the copy engines move the bytes instead of the SMs,
// and whether a 2-rank all-reduce whose transfer is the copy engines' beats the SM-driven one
// at 4-256 MB. One process drives both GPUs, peer access on.
//
//   nvcc -O2 -arch=sm_90 -o ce_probe ce_probe.cu && ./ce_probe [SIZES...]   (default 4M 16M 64M 256M)
//
// 1. raw: S bytes into the other GPU's memory, 20 copies, one direction alone and both at once:
//    copy engines (cudaMemcpyAsync between the two devices' pointers; also split into 2 or 4
//    copies on as many streams, which may take more engines) and SM kernels of B blocks of 512
//    threads, 16-byte stores into the peer (push) or 16-byte loads from it (pull).
// 2. all-reduce (bf16 sum, S bytes per rank): each GPU's copy stream copies its input, chunk by
//    chunk, into the other GPU's staging, each chunk followed by a 4-byte flag copy (the call's
//    epoch), while its compute stream runs one reduce kernel whose blocks take each chunk once its
//    flag is there (out = in + staging). The staging has two parities; a copy stream starts a call
//    only once the other GPU's reduce of the call two back has finished (its last block stores
//    that epoch into this GPU's memory). CUDA graphs of 10 calls per GPU (fork and join by
//    events), replayed; µs per call and GB/s each way.
// Every all-reduce result is checked against the host's sum (random bf16 data, output poisoned).
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

typedef unsigned long long u64;
typedef unsigned int u32;

static const int MAXCHUNK = 1024;
static const int CALLS = 10;  // per graph (even: the parities baked into a graph repeat)

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(u32* p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__global__ void __launch_bounds__(512) push_k(uint4* dst, const uint4* src, u64 n16) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (u64)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

// The copy stream's gate of a call: the epoch of this call into `seq` (the flag copies' source),
// after the other GPU's reduce of the call two back has finished (`done`, written by it).
__global__ void gate_k(u32* seq, const u32* done, u32* err) {
    u32 e = seq[0] + 1;
    u64 n = 0;
    while (e > 2 && ld_acquire(done) < e - 2)
        if (++n > (1ull << 32)) { atomicAdd(err, 1); break; }
    seq[0] = e;
    __threadfence_system();
}

// out = in + staging, chunk by chunk as their flags arrive. `ctr` is this GPU's reduce epoch
// (advanced by the last block), `peer_done` the other GPU's word that says which call this
// GPU's reduce finished.
__global__ void __launch_bounds__(512) reduce_k(const __nv_bfloat162* in, const __nv_bfloat162* stg,
                                                const u32* flags, u32* ctr, u32* arrived, u32* peer_done,
                                                __nv_bfloat162* out, u64 bytes, u64 chunk, u32* err) {
    __shared__ u32 e_s;
    if (threadIdx.x == 0) e_s = *(volatile u32*)ctr + 1;
    __syncthreads();
    u32 e = e_s;
    u64 nchunk = (bytes + chunk - 1) / chunk;
    for (u64 k = 0; k < nchunk; k++) {
        if (threadIdx.x == 0) {
            u64 n = 0;
            while (ld_acquire(flags + k) != e)
                if (++n > (1ull << 32)) { atomicAdd(err, 1); break; }
        }
        __syncthreads();
        u64 lo = k * chunk / 16, hi = ((k + 1) * chunk < bytes ? (k + 1) * chunk : bytes) / 16;
        for (u64 i = lo + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += (u64)gridDim.x * blockDim.x) {
            uint4 a = ((const uint4*)in)[i];
            uint4 b = ((const uint4*)stg)[i];
            __nv_bfloat162* pa = (__nv_bfloat162*)&a;
            const __nv_bfloat162* pb = (const __nv_bfloat162*)&b;
#pragma unroll
            for (int j = 0; j < 4; j++) pa[j] = __hadd2(pa[j], pb[j]);
            ((uint4*)out)[i] = a;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        u32 old = atomicAdd(arrived, 1);
        if (old + 1 == e * gridDim.x) {  // the last block of this call
            *(volatile u32*)ctr = e;
            st_release(peer_done, e);
        }
    }
}

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static u64 parse_size(const char* s) {
    char* end;
    u64 v = strtoull(s, &end, 10);
    if (*end == 'K') v <<= 10;
    if (*end == 'M') v <<= 20;
    if (*end == 'G') v <<= 30;
    return v;
}
static void sync_both() {
    for (int g = 0; g < 2; g++) { CK(cudaSetDevice(g)); CK(cudaDeviceSynchronize()); }
}
static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct Gpu {
    cudaStream_t ms, cs;
    cudaStream_t xs[4];  // extra copy streams: one copy split over several copy engines
    cudaEvent_t fork, join;
    uint4* in;
    uint4* out;
    uint4* stg;      // [2][bytes], written by the other GPU
    u32* flags;      // [2][MAXCHUNK], written by the other GPU's copy engine
    u32* words;      // seq, ctr, arrived, done (done written by the other GPU), err
};

int main(int argc, char** argv) {
    std::vector<u64> sizes;
    for (int i = 1; i < argc; i++) sizes.push_back(parse_size(argv[i]));
    if (sizes.empty()) sizes = {4ull << 20, 16ull << 20, 64ull << 20, 256ull << 20};
    u64 maxb = *std::max_element(sizes.begin(), sizes.end());
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    if (ndev < 2) { fprintf(stderr, "needs 2 GPUs, found %d\n", ndev); return 2; }
    Gpu G[2];
    for (int g = 0; g < 2; g++) {
        CK(cudaSetDevice(g));
        CK(cudaDeviceEnablePeerAccess(1 - g, 0));
        CK(cudaStreamCreateWithFlags(&G[g].ms, cudaStreamNonBlocking));
        CK(cudaStreamCreateWithFlags(&G[g].cs, cudaStreamNonBlocking));
        for (auto& x : G[g].xs) CK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&G[g].fork, cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&G[g].join, cudaEventDisableTiming));
        CK(cudaMalloc(&G[g].in, maxb));
        CK(cudaMalloc(&G[g].out, maxb));
        CK(cudaMalloc(&G[g].stg, 2 * maxb));
        CK(cudaMalloc(&G[g].flags, 2 * MAXCHUNK * 4));
        CK(cudaMalloc(&G[g].words, 64));
    }
    // Random bf16 inputs in [-1, 1), kept on the host for the check.
    std::vector<std::vector<uint16_t>> host(2, std::vector<uint16_t>(maxb / 2));
    u64 x = 88172645463325252ull;
    for (int g = 0; g < 2; g++) {
        for (auto& h : host[g]) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            float f = (float)((x >> 40) & 0xffff) / 32768.0f - 1.0f;
            __nv_bfloat16 b = __float2bfloat16(f);
            memcpy(&h, &b, 2);
        }
        CK(cudaSetDevice(g));
        CK(cudaMemcpy(G[g].in, host[g].data(), maxb, cudaMemcpyHostToDevice));
    }
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("2 GPUs, %d SMs each; GB/s per direction (1 GB = 1e9 bytes), median of 5\n", sms);

    // ---- 1. raw transfers
    const int N = 20;
    printf("\n%-10s %-26s %10s %10s\n", "bytes", "mover", "one way", "both ways");
    for (u64 S : sizes) {
        // kinds: 0 = copy engine, 1000 + k = the copy split over k streams at once, 1.. = push
        // with B blocks, then pull with B blocks
        std::vector<std::pair<std::string, int>> kinds = {{"copy engine", 0}};
        for (int k : {2, 4}) kinds.push_back({"copy engines, " + std::to_string(k) + " streams", 1000 + k});
        for (int b : {16, 32, 66, 132}) kinds.push_back({"SM push, " + std::to_string(b) + " blocks", b});
        for (int b : {32, 132}) kinds.push_back({"SM pull, " + std::to_string(b) + " blocks", -b});
        for (auto& kd : kinds) {
            double r[2];
            for (int both = 0; both < 2; both++) {
                std::vector<double> t;
                for (int rep = 0; rep < 5; rep++) {
                    sync_both();
                    double t0 = now_us();
                    for (int i = 0; i < N; i++)
                        for (int g = 0; g < (both ? 2 : 1); g++) {
                            CK(cudaSetDevice(g));
                            int p = 1 - g;
                            if (kd.second == 0)
                                CK(cudaMemcpyAsync(G[p].stg, G[g].in, S, cudaMemcpyDeviceToDevice, G[g].ms));
                            else if (kd.second > 1000)
                                for (int x = 0; x < kd.second - 1000; x++) {
                                    u64 part = S / (kd.second - 1000);
                                    CK(cudaMemcpyAsync((char*)G[p].stg + x * part, (char*)G[g].in + x * part, part,
                                                       cudaMemcpyDeviceToDevice, G[g].xs[x]));
                                }
                            else if (kd.second > 0)
                                push_k<<<kd.second, 512, 0, G[g].ms>>>(G[p].stg, G[g].in, S / 16);
                            else  // pull: this GPU reads the other's input into its own staging
                                push_k<<<-kd.second, 512, 0, G[g].ms>>>(G[g].stg, G[p].in, S / 16);
                        }
                    sync_both();
                    t.push_back((now_us() - t0) / N);
                }
                CK(cudaGetLastError());
                r[both] = S / median(t) / 1e3;
            }
            printf("%-10llu %-26s %10.1f %10.1f\n", S, kd.first.c_str(), r[0], r[1]);
        }
    }

    // ---- 2. the all-reduce with the copy engines
    printf("\n%-10s %-8s %10s %10s %8s\n", "bytes", "chunk", "us/call", "GB/s/dir", "check");
    for (u64 S : sizes) {
        for (u64 C : {1ull << 20, 2ull << 20, 4ull << 20, 8ull << 20}) {
            if (C > S || (S + C - 1) / C > MAXCHUNK) continue;
            u64 nchunk = (S + C - 1) / C;
            int blocks = sms;
            cudaGraphExec_t exec[2];
            for (int g = 0; g < 2; g++) {
                CK(cudaSetDevice(g));
                CK(cudaMemset(G[g].words, 0, 64));
                CK(cudaMemset(G[g].flags, 0, 2 * MAXCHUNK * 4));
                CK(cudaMemset(G[g].out, 0xff, S));
            }
            sync_both();
            for (int g = 0; g < 2; g++) {
                CK(cudaSetDevice(g));
                int p = 1 - g;
                u32* w = G[g].words;  // seq 0, ctr 1, arrived 2, done 3, err 4
                cudaGraph_t graph;
                CK(cudaStreamBeginCapture(G[g].ms, cudaStreamCaptureModeThreadLocal));
                for (int c = 0; c < CALLS; c++) {
                    int par = c & 1;
                    CK(cudaEventRecord(G[g].fork, G[g].ms));
                    CK(cudaStreamWaitEvent(G[g].cs, G[g].fork, 0));
                    gate_k<<<1, 1, 0, G[g].cs>>>(w + 0, w + 3, w + 4);
                    for (u64 k = 0; k < nchunk; k++) {
                        u64 len = std::min(C, S - k * C);
                        CK(cudaMemcpyAsync((char*)G[p].stg + par * S + k * C, (char*)G[g].in + k * C, len,
                                           cudaMemcpyDeviceToDevice, G[g].cs));
                        CK(cudaMemcpyAsync(G[p].flags + par * MAXCHUNK + k, w + 0, 4, cudaMemcpyDeviceToDevice, G[g].cs));
                    }
                    reduce_k<<<blocks, 512, 0, G[g].ms>>>(
                        (const __nv_bfloat162*)G[g].in, (const __nv_bfloat162*)((char*)G[g].stg + par * S),
                        G[g].flags + par * MAXCHUNK, w + 1, w + 2, G[p].words + 3, (__nv_bfloat162*)G[g].out, S, C, w + 4);
                    CK(cudaEventRecord(G[g].join, G[g].cs));
                    CK(cudaStreamWaitEvent(G[g].ms, G[g].join, 0));
                }
                CK(cudaStreamEndCapture(G[g].ms, &graph));
                CK(cudaGraphInstantiate(&exec[g], graph, 0));
                CK(cudaGraphDestroy(graph));
            }
            std::vector<double> t;
            for (int rep = 0; rep < 6; rep++) {
                sync_both();
                double t0 = now_us();
                for (int g = 0; g < 2; g++) { CK(cudaSetDevice(g)); CK(cudaGraphLaunch(exec[g], G[g].ms)); }
                sync_both();
                if (rep > 0) t.push_back((now_us() - t0) / CALLS);  // the first replay warms up
            }
            // check: both outputs against the host's bf16 sum, and no error counted
            u64 bad = 0;
            u32 errs = 0;
            std::vector<uint16_t> o(S / 2);
            for (int g = 0; g < 2; g++) {
                CK(cudaSetDevice(g));
                CK(cudaMemcpy(o.data(), G[g].out, S, cudaMemcpyDeviceToHost));
                u32 e = 0;
                CK(cudaMemcpy(&e, G[g].words + 4, 4, cudaMemcpyDeviceToHost));
                errs += e;
                for (u64 i = 0; i < S / 2; i++) {
                    __nv_bfloat16 a, b;
                    memcpy(&a, &host[0][i], 2);
                    memcpy(&b, &host[1][i], 2);
                    __nv_bfloat16 s = __float2bfloat16(__bfloat162float(a) + __bfloat162float(b));
                    uint16_t sv;
                    memcpy(&sv, &s, 2);
                    bad += sv != o[i];
                }
            }
            double us = median(t);
            printf("%-10llu %-8llu %10.2f %10.1f %8s\n", S, C, us, S / us / 1e3,
                   bad == 0 && errs == 0 ? "ok" : (std::to_string(bad) + " bad, " + std::to_string(errs) + " timeouts").c_str());
            for (int g = 0; g < 2; g++) { CK(cudaSetDevice(g)); CK(cudaGraphExecDestroy(exec[g])); }
        }
    }
    return 0;
}
