// Can a kernel hand chunks to a copy stream without ending (the design a copy-engine
// low-precision path would need: the encoder marks chunk k done, the copy stream sends it)?
// The copy stream waits with cuStreamWaitValue32 on a word in local device memory that the
// kernel sets (a constant 1, so graph replays need no host-known epoch), resets it with
// cuStreamWriteValue32 and copies the chunk. One GPU: a kernel of B blocks "encodes" (writes)
// 8 chunks in turn, each block taking its share of every chunk, the last block of a chunk
// setting its word; we time the chunks' copies behind it, eager and in a CUDA graph replayed
// twice (the words must be back at 0 for the second replay), and check the copied bytes.
//   nvcc -O2 -arch=sm_90 -o memop_gate memop_gate.cu -lcuda && ./memop_gate
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CU(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s_; cuGetErrorString(r_, &s_); \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_); exit(1); } } while (0)

typedef unsigned long long u64;
const int CHUNKS = 8;

// Writes value `v` into every word of each chunk in turn; the last block through a chunk sets
// ready[k] = 1 (after a system fence, so the copy engine reads the chunk's bytes).
__global__ void produce(unsigned* buf, u64 words_per_chunk, unsigned v, unsigned* ready, unsigned* arrived) {
    for (int k = 0; k < CHUNKS; k++) {
        unsigned* c = buf + k * words_per_chunk;
        for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < words_per_chunk; i += (u64)gridDim.x * blockDim.x)
            c[i] = v + (unsigned)i;
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence_system();
            if (atomicAdd(arrived + k, 1) + 1 == gridDim.x) {
                arrived[k] = 0;
                *(volatile unsigned*)(ready + k) = 1;
            }
        }
    }
}

int main() {
    const u64 bytes = 64ull << 20, per = bytes / CHUNKS;
    unsigned *src, *dst, *ready, *arrived;
    CK(cudaMalloc(&src, bytes)); CK(cudaMalloc(&dst, bytes));
    CK(cudaMalloc(&ready, 4 * CHUNKS)); CK(cudaMalloc(&arrived, 4 * CHUNKS));
    CK(cudaMemset(ready, 0, 4 * CHUNKS)); CK(cudaMemset(arrived, 0, 4 * CHUNKS));
    cudaStream_t ms, cs; cudaEvent_t fork, join;
    CK(cudaStreamCreateWithFlags(&ms, cudaStreamNonBlocking)); CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming)); CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    int sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    int memops = 0; cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 0);
    printf("stream memory operations: %d\n", memops);
    auto enqueue = [&](unsigned v) {
        CK(cudaEventRecord(fork, ms)); CK(cudaStreamWaitEvent(cs, fork, 0));
        produce<<<sms, 256, 0, ms>>>(src, per / 4, v, ready, arrived);
        for (int k = 0; k < CHUNKS; k++) {
            CU(cuStreamWaitValue32((CUstream)cs, (CUdeviceptr)(ready + k), 1, CU_STREAM_WAIT_VALUE_EQ));
            CU(cuStreamWriteValue32((CUstream)cs, (CUdeviceptr)(ready + k), 0, CU_STREAM_WRITE_VALUE_DEFAULT));
            CK(cudaMemcpyAsync((char*)dst + k * per, (char*)src + k * per, per, cudaMemcpyDeviceToDevice, cs));
        }
        CK(cudaEventRecord(join, cs)); CK(cudaStreamWaitEvent(ms, join, 0));
    };
    auto check = [&](unsigned v) {
        std::vector<unsigned> h(bytes / 4);
        CK(cudaMemcpy(h.data(), dst, bytes, cudaMemcpyDeviceToHost));
        u64 bad = 0;
        for (u64 i = 0; i < h.size(); i++) bad += h[i] != v + (unsigned)(i % (per / 4));
        return bad;
    };
    for (int mode = 0; mode < 2; mode++) {
        cudaGraphExec_t exec = nullptr;
        if (mode == 1) {
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(ms, cudaStreamCaptureModeThreadLocal));
            enqueue(1000);
            CK(cudaStreamEndCapture(ms, &g));
            CK(cudaGraphInstantiate(&exec, g, 0));
        }
        for (int rep = 0; rep < 3; rep++) {
            unsigned v = mode == 1 ? 1000 : 7 * rep + 1;
            CK(cudaMemset(dst, 0xff, bytes)); CK(cudaDeviceSynchronize());
            auto t0 = std::chrono::steady_clock::now();
            if (mode == 1) CK(cudaGraphLaunch(exec, ms)); else enqueue(v);
            CK(cudaStreamSynchronize(ms));
            double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
            printf("%s rep %d: 64 MB in 8 chunks behind the kernel, %.1f us, %llu wrong words\n",
                   mode ? "graph" : "eager", rep, us, check(v));
        }
    }
    return 0;
}
