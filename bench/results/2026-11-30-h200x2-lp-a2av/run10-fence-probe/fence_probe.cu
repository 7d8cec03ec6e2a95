// Does a system-scope release by one warp wait for stores that other warps of its CTA issue
// AFTER the barrier that precedes the release? Remote memory is stood in for by mapped host
// memory (writes cross PCIe, so they drain slowly and the difference shows).
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

__device__ __forceinline__ uint64_t gtime() { uint64_t t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }

__global__ void probe(uint4* dst, size_t a_vec, size_t b_vec, unsigned long long* out, int mode, unsigned* flag) {
    uint4* A = dst + (size_t)blockIdx.x * (a_vec + b_vec);
    uint4* B = A + a_vec;
    uint4 v = make_uint4(blockIdx.x, threadIdx.x, 1, 2);
    for (size_t i = threadIdx.x; i < a_vec; i += blockDim.x) A[i] = v;
    __syncthreads();
    unsigned warp = threadIdx.x >> 5;
    if (warp == 0) {
        if (threadIdx.x == 0) {
            uint64_t t0 = gtime();
            if (mode == 0) __threadfence_system();
            else asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(flag + blockIdx.x), "r"(1u) : "memory");
            if (mode == 0) atomicExch(flag + blockIdx.x, 1u);
            uint64_t t1 = gtime();
            out[blockIdx.x] = t1 - t0;
        }
    } else {
        // The other warps: more stores after the barrier.
        for (size_t i = threadIdx.x - 32; i < b_vec; i += blockDim.x - 32) B[i] = v;
    }
}

int main() {
    int grid = 132, threads = 512;
    size_t a_bytes = 64 << 10;
    size_t max_b = 1 << 20;
    size_t total = (size_t)grid * (a_bytes + max_b);
    void* h; cudaHostAlloc(&h, total + (1 << 20), cudaHostAllocMapped);
    void* d; cudaHostGetDevicePointer(&d, h, 0);
    unsigned long long* out; cudaMalloc(&out, grid * 8);
    unsigned* flag; cudaMalloc(&flag, grid * 4);
    std::vector<unsigned long long> t(grid);
    for (int mode = 0; mode < 2; mode++) {
        for (size_t b_bytes : {(size_t)0, (size_t)(64 << 10), (size_t)(256 << 10), max_b}) {
            std::vector<double> med;
            for (int rep = 0; rep < 5; rep++) {
                cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
                cudaEventRecord(e0);
                probe<<<grid, threads>>>((uint4*)d, a_bytes / 16, b_bytes / 16, out, mode, flag);
                cudaEventRecord(e1);
                cudaEventSynchronize(e1);
                float ms; cudaEventElapsedTime(&ms, e0, e1);
                cudaMemcpy(t.data(), out, grid * 8, cudaMemcpyDeviceToHost);
                std::sort(t.begin(), t.end());
                if (rep > 0) med.push_back(t[grid / 2] / 1000.0);
                if (rep == 4) printf("%s A=%zu KiB per CTA, B after the barrier=%zu KiB per CTA: release took median %.1f us (min %.1f, max %.1f); kernel %.1f us\n",
                                     mode == 0 ? "threadfence_system" : "st.release.sys", a_bytes >> 10, b_bytes >> 10,
                                     t[grid / 2] / 1000.0, t[0] / 1000.0, t[grid - 1] / 1000.0, ms * 1000);
            }
        }
    }
    cudaError_t err = cudaGetLastError();
    printf("status: %s\n", cudaGetErrorString(err));
    return 0;
}
