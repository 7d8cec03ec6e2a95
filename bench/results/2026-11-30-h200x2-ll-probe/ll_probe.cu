// Where the time of a small LL collective goes on two GPUs: a 2-rank all-gather of 1 KiB per
// rank written as the library's fc_all_gather_ll is (epoch word, hello words, LL lines with the
// epoch as flag, end-of-call epoch store), with each piece switchable, against an empty kernel
// and a one-flag ping-pong, in CUDA graphs of 20 kernels per GPU, with and without programmatic
// dependent launch. One process, peer access on.
//
//   nvcc -O2 -arch=sm_90 -o ll_probe ll_probe.cu && ./ll_probe
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

struct P {
    u32 rank;
    u32 bytes;          // per rank
    const u8* in;
    u8* out;            // 2 * bytes
    u32* state;         // epoch word per block
    uint4* lines_mine;  // [2 parity][2 sender][units]
    uint4* lines_peer;
    u64* hello_mine;    // [2 parity][2 sender]
    u64* hello_peer;
    u32* err;
};

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_go() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ u64 gtimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void st_ll(uint4* p, u32 lo, u32 hi, u32 flag) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(lo), "r"(flag), "r"(hi), "r"(flag) : "memory");
}
__device__ __forceinline__ uint4 ld_v4(const uint4* p) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ u32 ld_vol(const u32* p) { return *(volatile const u32*)p; }

__global__ void empty_k() { pdl_wait(); pdl_go(); }

// One flag each way: thread 0 stores the epoch into the peer's word and waits for the peer's.
__global__ void pingpong(P p) {
    pdl_wait();
    pdl_go();
    if (threadIdx.x != 0) return;
    u32 e = ld_vol(p.state) + 1;
    st_ll(p.lines_peer + (e & 1) * 2 + p.rank, e, e, e);
    const uint4* w = p.lines_mine + (e & 1) * 2 + (1 - p.rank);
    u64 n = 0;
    while (ld_v4(w).y != e)
        if (++n > (1ull << 30)) { atomicAdd(p.err, 1); break; }
    p.state[0] = e;
}

// The all-gather. PF: first unit loaded before the epoch; TM: globaltimer read at the start;
// HE: hello words (last warp of block 0: stored first, checked at the end); ES: end with
// __syncthreads then the epoch store (else thread 0 stores it at once, which a real kernel may not
// do: a slow warp could read the new epoch); V: poll with ld.volatile (else ld.relaxed.gpu).
template <bool PF, bool TM, bool HE, bool ES>
__global__ void __launch_bounds__(256) ag(P p) {
    pdl_wait();
    pdl_go();
    u32 units = (p.bytes + 7) / 8;
    u32 u = threadIdx.x;
    uint2 x = make_uint2(0, 0);
    if (PF && u < units) x = *(const uint2*)(p.in + u * 8);
    u64 t0 = TM ? gtimer() : 0;
    u32 e = ld_vol(p.state) + 1;
    u32 hb = blockDim.x - 32;
    if (HE && threadIdx.x == hb + (1 - p.rank)) *(volatile u64*)(p.hello_peer + (e & 1) * 2 + p.rank) = ((u64)e << 32) | 7;
    u32 par = (e & 1) * 2 * units;
    if (u < units) {
        if (!PF) x = *(const uint2*)(p.in + u * 8);
        st_ll(p.lines_peer + par + p.rank * units + u, x.x, x.y, e);
        *(uint2*)(p.out + p.rank * p.bytes + u * 8) = x;
        const uint4* l = p.lines_mine + par + (1 - p.rank) * units + u;
        uint4 v = ld_v4(l);
        u32 spins = 0;
        while (v.y != e || v.w != e) {
            if (++spins == 512) {
                spins = 0;
                if (TM && gtimer() - t0 > 2000000000ull) { atomicAdd(p.err, 1); break; }
            }
            v = ld_v4(l);
        }
        *(uint2*)(p.out + (1 - p.rank) * p.bytes + u * 8) = make_uint2(v.x, v.z);
    }
    if (HE && threadIdx.x == hb + (1 - p.rank)) {
        const u64* w = p.hello_mine + (e & 1) * 2 + (1 - p.rank);
        u64 n = 0;
        while ((u32)(*(volatile const u64*)w >> 32) != e)
            if (++n > (1ull << 30)) { atomicAdd(p.err, 1); break; }
    }
    if (ES) {
        __syncthreads();
        if (threadIdx.x == 0) p.state[0] = e;
    } else if (threadIdx.x == 0) {
        p.state[0] = e;
    }
}

// The library's kernels take ~1.1 KB of parameters (Args + CArgs): the same kernel with P padded
// to that size.
struct PBig {
    P p;
    u8 pad[1088];
};
template <bool PF>
__global__ void __launch_bounds__(256) ag_big(PBig b) {
    P& p = b.p;
    pdl_wait();
    pdl_go();
    u32 units = (p.bytes + 7) / 8;
    u32 u = threadIdx.x;
    uint2 x = make_uint2(0, 0);
    if (PF && u < units) x = *(const uint2*)(p.in + u * 8);
    u64 t0 = gtimer();
    u32 e = ld_vol(p.state) + 1;
    u32 hb = blockDim.x - 32;
    if (threadIdx.x == hb + (1 - p.rank)) *(volatile u64*)(p.hello_peer + (e & 1) * 2 + p.rank) = ((u64)e << 32) | 7;
    u32 par = (e & 1) * 2 * units;
    if (u < units) {
        if (!PF) x = *(const uint2*)(p.in + u * 8);
        st_ll(p.lines_peer + par + p.rank * units + u, x.x, x.y, e);
        *(uint2*)(p.out + p.rank * p.bytes + u * 8) = x;
        const uint4* l = p.lines_mine + par + (1 - p.rank) * units + u;
        uint4 v = ld_v4(l);
        u32 spins = 0;
        while (v.y != e || v.w != e) {
            if (++spins == 512) {
                spins = 0;
                if (gtimer() - t0 > 2000000000ull) { atomicAdd(p.err, 1); break; }
            }
            v = ld_v4(l);
        }
        *(uint2*)(p.out + (1 - p.rank) * p.bytes + u * 8) = make_uint2(v.x, v.z);
    }
    if (threadIdx.x == hb + (1 - p.rank)) {
        const u64* w = p.hello_mine + (e & 1) * 2 + (1 - p.rank);
        u64 n = 0;
        while ((u32)(*(volatile const u64*)w >> 32) != e)
            if (++n > (1ull << 30)) { atomicAdd(p.err, 1); break; }
    }
    __syncthreads();
    if (threadIdx.x == 0) p.state[0] = e;
}

struct G {
    cudaStream_t s;
    P p;
    PBig big;
};

static float med(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

__global__ void delay_kernel(u64 ns) {
    u64 t0 = gtimer();
    while (gtimer() - t0 < ns) {}
}

typedef void (*Kfn)(P);

// µs per kernel: a graph of `per` launches per GPU, replayed 20 times after warm-up, median of 5.
// bench_like: timed as `ferrocomm bench -n 10 --reps 2 -G 10` times (no delay before the start
// event, 10 graph launches per sample, median of 2 samples).
static float run(G* g, const void* fn, bool has_arg, bool pdl, int per = 20, bool big = false, bool bench_like = false) {
    cudaGraphExec_t ex[2];
    for (int i = 0; i < 2; i++) {
        CK(cudaSetDevice(i));
        CK(cudaStreamBeginCapture(g[i].s, cudaStreamCaptureModeRelaxed));
        for (int k = 0; k < per; k++) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(1);
            cfg.blockDim = dim3(256);
            cfg.stream = g[i].s;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = at;
            cfg.numAttrs = pdl ? 1 : 0;
            void* args[1] = {big ? (void*)&g[i].big : (void*)&g[i].p};
            CK(cudaLaunchKernelExC(&cfg, fn, has_arg ? args : nullptr));
        }
        cudaGraph_t gr;
        CK(cudaStreamEndCapture(g[i].s, &gr));
        CK(cudaGraphInstantiate(&ex[i], gr, 0));
        CK(cudaGraphDestroy(gr));
    }
    std::vector<float> t;
    int reps = bench_like ? 3 : 6;
    for (int rep = 0; rep < reps; rep++) {
        cudaEvent_t a[2], z[2];
        for (int i = 0; i < 2; i++) {
            CK(cudaSetDevice(i));
            CK(cudaEventCreate(&a[i])); CK(cudaEventCreate(&z[i]));
            if (!bench_like) delay_kernel<<<1, 1, 0, g[i].s>>>(200000);
            else CK(cudaStreamSynchronize(g[i].s));
            CK(cudaEventRecord(a[i], g[i].s));
        }
        const int R = bench_like ? 10 : 20;
        for (int r = 0; r < R; r++)
            for (int i = 0; i < 2; i++) { CK(cudaSetDevice(i)); CK(cudaGraphLaunch(ex[i], g[i].s)); }
        float worst = 0;
        for (int i = 0; i < 2; i++) {
            CK(cudaSetDevice(i));
            CK(cudaEventRecord(z[i], g[i].s));
        }
        for (int i = 0; i < 2; i++) {
            CK(cudaSetDevice(i));
            CK(cudaEventSynchronize(z[i]));
            float ms;
            CK(cudaEventElapsedTime(&ms, a[i], z[i]));
            worst = std::max(worst, ms * 1000.f / (R * per));
            cudaEventDestroy(a[i]); cudaEventDestroy(z[i]);
        }
        if (rep > 0) t.push_back(worst);
    }
    for (int i = 0; i < 2; i++) { CK(cudaSetDevice(i)); CK(cudaGraphExecDestroy(ex[i])); }
    return med(t);
}

int main() {
    G g[2];
    const u32 bytes = 1024;
    for (int i = 0; i < 2; i++) {
        CK(cudaSetDevice(i));
        CK(cudaDeviceEnablePeerAccess(1 - i, 0));
        CK(cudaStreamCreateWithFlags(&g[i].s, cudaStreamNonBlocking));
        P& p = g[i].p;
        p.rank = i;
        p.bytes = bytes;
        u8* in;
        CK(cudaMalloc(&in, bytes));
        std::vector<u8> h(bytes);
        for (u32 k = 0; k < bytes; k++) h[k] = (u8)(k * 31 + i * 7 + 1);
        CK(cudaMemcpy(in, h.data(), bytes, cudaMemcpyHostToDevice));
        p.in = in;
        CK(cudaMalloc(&p.out, 2 * bytes));
        CK(cudaMalloc(&p.state, 256));
        CK(cudaMemset(p.state, 0, 256));
        CK(cudaMalloc(&p.lines_mine, 2 * 2 * 1024 * 16));
        CK(cudaMemset(p.lines_mine, 0, 2 * 2 * 1024 * 16));
        CK(cudaMalloc(&p.hello_mine, 64));
        CK(cudaMemset(p.hello_mine, 0, 64));
        CK(cudaMalloc(&p.err, 4));
        CK(cudaMemset(p.err, 0, 4));
    }
    for (int i = 0; i < 2; i++) {
        g[i].p.lines_peer = g[1 - i].p.lines_mine;
        g[i].p.hello_peer = g[1 - i].p.hello_mine;
    }
    struct V { const char* name; const void* fn; bool arg; };
    V vs[] = {
        {"empty kernel", (const void*)empty_k, false},
        {"ping-pong (one flag each way)", (const void*)pingpong, true},
        {"all-gather as the library (PF0 TM1 HE1 ES1)", (const void*)ag<false, true, true, true>, true},
        {"  + input before epoch (PF1 TM1 HE1 ES1)", (const void*)ag<true, true, true, true>, true},
        {"  PF1, no start timer (TM0 HE1 ES1)", (const void*)ag<true, false, true, true>, true},
        {"  PF1, no hello (TM1 HE0 ES1)", (const void*)ag<true, true, false, true>, true},
        {"  PF1, no end sync (TM1 HE1 ES0)", (const void*)ag<true, true, true, false>, true},
        {"  PF1, none of the three (TM0 HE0 ES0)", (const void*)ag<true, false, false, false>, true},
        {"  PF0, none of the three (TM0 HE0 ES0)", (const void*)ag<false, false, false, false>, true},
    };
    printf("2-rank all-gather, %u bytes per rank, 1 block x 256 threads, us per kernel in graphs of 20\n", bytes);
    printf("%-48s %10s %10s\n", "variant", "PDL", "no PDL");
    for (auto& v : vs) {
        float a = run(g, v.fn, v.arg, true);
        float b = run(g, v.fn, v.arg, false);
        printf("%-48s %10.2f %10.2f\n", v.name, a, b);
    }
    // Check: both outputs hold both inputs.
    int bad = 0;
    for (int i = 0; i < 2; i++) {
        CK(cudaSetDevice(i));
        CK(cudaDeviceSynchronize());
        std::vector<u8> o(2 * bytes);
        CK(cudaMemcpy(o.data(), g[i].p.out, 2 * bytes, cudaMemcpyDeviceToHost));
        for (u32 r = 0; r < 2; r++)
            for (u32 k = 0; k < bytes; k++) bad += o[r * bytes + k] != (u8)(k * 31 + r * 7 + 1);
        int e;
        CK(cudaMemcpy(&e, g[i].p.err, 4, cudaMemcpyDeviceToHost));
        bad += e;
    }
    for (int i = 0; i < 2; i++) g[i].big.p = g[i].p;
    printf("\nparameters and graph length (PDL, us per kernel)\n");
    printf("%-48s %10.2f\n", "library-like (PF0), 72-byte params, graphs of 20", run(g, (const void*)ag<false, true, true, true>, true, true));
    printf("%-48s %10.2f\n", "library-like (PF0), 72-byte params, graphs of 10", run(g, (const void*)ag<false, true, true, true>, true, true, 10));
    printf("%-48s %10.2f\n", "library-like (PF0), 1.1 KB params, graphs of 20", run(g, (const void*)ag_big<false>, true, true, 20, true));
    printf("%-48s %10.2f\n", "library-like (PF0), 1.1 KB params, graphs of 10", run(g, (const void*)ag_big<false>, true, true, 10, true));
    printf("%-48s %10.2f\n", "PF1, 1.1 KB params, graphs of 10", run(g, (const void*)ag_big<true>, true, true, 10, true));
    printf("%-48s %10.2f\n", "empty kernel, graphs of 10", run(g, (const void*)empty_k, false, true, 10));
    printf("\ntimed as the bench times (no delay, 10 launches of a graph of 10, median of 2)\n");
    printf("%-48s %10.2f\n", "library-like (PF0)", run(g, (const void*)ag<false, true, true, true>, true, true, 10, false, true));
    printf("%-48s %10.2f\n", "PF1", run(g, (const void*)ag<true, true, true, true>, true, true, 10, false, true));
    printf("%-48s %10.2f\n", "empty kernel", run(g, (const void*)empty_k, false, true, 10, false, true));
    printf("wrong bytes + timeouts: %d\n", bad);
    return 0;
}
