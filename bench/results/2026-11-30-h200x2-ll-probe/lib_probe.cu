// The library's own LL kernels (crates/ferrocomm/kernels, compiled into this program by nvcc for
// bf16) launched in one process on two GPUs through peer access, timed like ll_probe.cu: is the
// gap between ll_probe's all-gather (~1.9 us) and the bench's 2.5 us in the kernels or around
// them (processes, IPC, the bench)?
//
//   nvcc -O2 -arch=sm_90 -o lib_probe lib_probe.cu && ./lib_probe
#define FC_T_BF16 1
#include "../../../crates/ferrocomm/kernels/all_reduce.cu"
#include "../../../crates/ferrocomm/kernels/collectives.cu"
#include <cstdio>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)



// From ll_probe's all-gather on Args (S5) towards the library's new fc_all_gather_ll, one thing
// at a time. S5: one unit per thread (if u < units), u32 indices, the peer 1 - rank.
// T1: S5 with the library's grid-stride loops (u64) for send, own copy and receive.
// T2: S5 with the loops over peers (k = 1 .. world-1), one unit per thread.
// T3: S5 with the library's receive (ll_recv: spin_ok with the hello peek) and ll_end.
template <int V>
__global__ void __launch_bounds__(512) ag_t(Args a, CArgs c) {
    pdl_wait();
    pdl_launch_dependents();
    u64 bytes = c.n * c.es;
    u64 nunit = (bytes + 7) / 8;
    const u8* in = (const u8*)a.input;
    u8* out = (u8*)a.output;
    u64 first = ll_first();
    uint2 x = first < nunit ? *(const uint2*)(in + first * 8) : make_uint2(0, 0);
    Ll l = ll_begin(a, c);
    u32 peer = 1 - a.rank;
    if (V == 1) {
        u64 to = a.push[peer];
        for (u64 u = first; u < nunit; u += l.stride)
            ll_send_at(a, l, to, u, u == first ? x : *(const uint2*)(in + u * 8));
        for (u64 u = first; u < nunit; u += l.stride)
            *(uint2*)(out + a.rank * bytes + u * 8) = u == first ? x : *(const uint2*)(in + u * 8);
        for (u64 u = first; u < nunit; u += l.stride) {
            const uint4* p = (const uint4*)(l.mine + l.par + peer * l.row + u * 16);
            uint4 v = ld_v4(p);
            u32 spins = 0;
            while (v.y != l.e || v.w != l.e) {
                if (++spins == SPIN_CHECK) {
                    spins = 0;
                    if (globaltimer() - l.t0 > a.timeout_ns) { report_timeout(a, peer, 31); break; }
                }
                v = ld_v4(p);
            }
            *(uint2*)(out + peer * bytes + u * 8) = make_uint2(v.x, v.z);
        }
    } else if (first < nunit) {
        u64 u = first;
        if (V == 2) {
            for (u32 k = 1; k < a.world; k++) ll_send_at(a, l, a.push[ll_peer(a, k)], u, x);
        } else {
            ll_send_at(a, l, a.push[peer], u, x);
        }
        *(uint2*)(out + a.rank * bytes + u * 8) = x;
        for (u32 k = 1; k < a.world; k++) {
            u32 s = V == 2 ? ll_peer(a, k) : peer;
            uint4 v;
            if (V == 3) {
                uint2 r;
                if (ll_recv(a, c, l, s, u, &r)) *(uint2*)(out + s * bytes + u * 8) = r;
            } else {
                const uint4* p = (const uint4*)(l.mine + l.par + s * l.row + u * 16);
                v = ld_v4(p);
                u32 spins = 0;
                while (v.y != l.e || v.w != l.e) {
                    if (++spins == SPIN_CHECK) {
                        spins = 0;
                        if (globaltimer() - l.t0 > a.timeout_ns) { report_timeout(a, s, 31); break; }
                    }
                    v = ld_v4(p);
                }
                *(uint2*)(out + s * bytes + u * 8) = make_uint2(v.x, v.z);
            }
            if (V != 2) break;
        }
    }
    if (V == 3) {
        ll_end(a, c, l);
    } else {
        u32 p;
        if (hello_thread(a, ll_hello_base(), &p)) {
            const u64* w = hello_word(a, a.rank, l.e, p);
            u64 v;
            while ((u32)((v = *(volatile const u64*)w) >> 32) != l.e) {}
            if ((u32)v != c.sig) report_error(a, ERR_MISMATCH, p, (u32)v);
        }
        __syncthreads();
        if (threadIdx.x == 0) ((u32*)(a.state + FC_BLOCK_EPOCH_OFF))[blockIdx.x] = l.e;
    }
}

// Layout of one rank's allocation here: flags at 0 (64 KiB), state at 64 KiB (hello words at
// +4096, payload-barrier words at +8192), LL lines at 1 MiB.
static const u64 STATE = 64 << 10, ALLOC = 4 << 20;
static u64 PUSH = 1 << 20, PUSH_CAP = 64 << 10;

__global__ void delay_kernel(u64 ns) {
    u64 t0 = globaltimer();
    while (globaltimer() - t0 < ns) {}
}

struct R {
    cudaStream_t s;
    u8* base;
    u8 *in, *out;
    u32* err;
    Args a;
    CArgs c;
};

static float med(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

static float run(R* g, const void* fn, bool two, bool bench_like, int per) {
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
            cfg.numAttrs = 1;
            void* args[2] = {&g[i].a, &g[i].c};
            CK(cudaLaunchKernelExC(&cfg, fn, args));
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
        const int RR = bench_like ? 10 : 20;
        for (int r = 0; r < RR; r++)
            for (int i = 0; i < 2; i++) { CK(cudaSetDevice(i)); CK(cudaGraphLaunch(ex[i], g[i].s)); }
        for (int i = 0; i < 2; i++) { CK(cudaSetDevice(i)); CK(cudaEventRecord(z[i], g[i].s)); }
        float worst = 0;
        for (int i = 0; i < 2; i++) {
            CK(cudaSetDevice(i));
            CK(cudaEventSynchronize(z[i]));
            float ms;
            CK(cudaEventElapsedTime(&ms, a[i], z[i]));
            worst = std::max(worst, ms * 1000.f / (RR * per));
            cudaEventDestroy(a[i]); cudaEventDestroy(z[i]);
        }
        if (rep > 0) t.push_back(worst);
    }
    for (int i = 0; i < 2; i++) { CK(cudaSetDevice(i)); CK(cudaGraphExecDestroy(ex[i])); }
    return med(t);
}

int main() {
    R g[2];
    const u64 n = 512;  // bf16 elements per part: 1 KiB
    for (int i = 0; i < 2; i++) {
        CK(cudaSetDevice(i));
        CK(cudaDeviceEnablePeerAccess(1 - i, 0));
        CK(cudaStreamCreateWithFlags(&g[i].s, cudaStreamNonBlocking));
        CK(cudaMalloc(&g[i].base, ALLOC));
        CK(cudaMemset(g[i].base, 0, ALLOC));
        CK(cudaMalloc(&g[i].in, 1 << 16));
        CK(cudaMalloc(&g[i].out, 1 << 16));
        CK(cudaMalloc(&g[i].err, 64));
        CK(cudaMemset(g[i].err, 0, 64));
        std::vector<u16> h(1 << 15);
        for (size_t k = 0; k < h.size(); k++) h[k] = 0x3f80 + (u16)((k * 7 + i) % 64);  // bf16 ~1.x
        CK(cudaMemcpy(g[i].in, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    }
    struct L { u64 push, cap; } layouts[] = {{1 << 20, 64 << 10}};
    for (auto lay : layouts) {
    PUSH = lay.push;
    PUSH_CAP = lay.cap;
    for (int i = 0; i < 2; i++) {
        Args& a = g[i].a;
        memset(&a, 0, sizeof a);
        for (int r = 0; r < 2; r++) {
            a.staging[r] = (u64)g[r].base + (2 << 20);
            a.push[r] = (u64)g[r].base + PUSH;
            a.flags[r] = (u64)g[r].base;
        }
        a.state = (u64)g[i].base + STATE;
        a.error = (u64)g[i].err;
        a.input = (u64)g[i].in;
        a.output = (u64)g[i].out;
        a.count = n;
        a.staging_bytes = 1 << 19;
        a.push_cap = PUSH_CAP;
        a.timeout_ns = 5000000000ull;
        a.int_div = 1;
        a.pre = 1.0f;
        a.post_div = 1.0f;
        a.rank = i;
        a.world = 2;
        a.hello_off = STATE + 4096;
        a.sig = 0x1234;
        CArgs& c = g[i].c;
        memset(&c, 0, sizeof c);
        c.n = n;
        c.es = 2;
        c.slot_bytes = n * 2;
        c.bar_off = STATE + 8192;
        c.sig = 0x5678;
        c.count_bytes = 8;
        c.rounds = 1;
    }
    struct V { const char* name; const void* fn; };
    V vs[] = {
        {"fc_all_gather_ll", (const void*)fc_all_gather_ll},
        {"  T1 S5 + grid-stride loops", (const void*)ag_t<1>},
        {"  T2 S5 + loops over peers", (const void*)ag_t<2>},
        {"  T3 S5 + ll_recv and ll_end", (const void*)ag_t<3>},
        {"  T0 S5 (on the new helpers)", (const void*)ag_t<0>},
        {"fc_all_gather_ll again", (const void*)fc_all_gather_ll},
        {"fc_all_to_all_ll", (const void*)fc_all_to_all_ll},
        {"fc_broadcast_ll", (const void*)fc_broadcast_ll},
        {"fc_reduce_scatter_ll_sum", (const void*)fc_reduce_scatter_ll_sum},
        {"fc_reduce_ll_sum", (const void*)fc_reduce_ll_sum},
    };
    printf("\nlibrary kernels, 2 GPUs in one process, 1 KiB parts (bf16), 1 block x 256 threads; LL lines at +%llu KiB, push_cap %llu KiB\n", PUSH >> 10, PUSH_CAP >> 10);
    printf("%-28s %14s %14s\n", "kernel", "graphs of 20", "as the bench");
    for (auto& v : vs) {
        float a = run(g, v.fn, true, false, 20);
        float b = run(g, v.fn, true, true, 10);
        printf("%-28s %14.2f %14.2f\n", v.name, a, b);
    }
    }
    int bad = 0;
    for (int i = 0; i < 2; i++) {
        CK(cudaSetDevice(i));
        CK(cudaDeviceSynchronize());
        u32 e[4];
        CK(cudaMemcpy(e, g[i].err, 16, cudaMemcpyDeviceToHost));
        printf("rank %d error record: %u %u %u %u\n", i, e[0], e[1], e[2], e[3]);
        bad += e[0] != 0;
    }
    printf("errors: %d\n", bad);
    return 0;
}
