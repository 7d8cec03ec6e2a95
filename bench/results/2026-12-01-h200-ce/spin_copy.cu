// Does an async device-to-device copy on another stream complete while a kernel of the same
// context spins on every SM waiting for the copy's result? (Blocks of 1024 threads, two per SM,
// leave no thread slot free: a copy that runs as a kernel has to wait for the spin's limit.)
#include <cuda_runtime.h>
#include <cstdio>
#include <chrono>
__global__ void spin(volatile unsigned* flag, unsigned want, unsigned long long limit, unsigned* seen) {
    if (threadIdx.x == 0) {
        unsigned long long n = 0;
        while (*flag != want && ++n < limit) {}
        if (*flag == want) atomicAdd(seen, 1);
    }
    __syncthreads();
}
int main() {
    unsigned *flag, *src, *seen; char *a, *b;
    cudaMalloc(&flag, 4); cudaMalloc(&src, 4); cudaMalloc(&seen, 4); cudaMalloc(&a, 16 << 20); cudaMalloc(&b, 16 << 20);
    cudaStream_t s1, s2; cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking); cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    int threads_list[] = {512, 1024};
    for (int threads : threads_list) for (int blocks : {1, 132, 264}) for (int big : {0, 1}) {
        unsigned v = 7; cudaMemset(flag, 0, 4); cudaMemset(seen, 0, 4); cudaMemcpy(src, &v, 4, cudaMemcpyHostToDevice);
        cudaDeviceSynchronize();
        auto t0 = std::chrono::steady_clock::now();
        spin<<<blocks, threads, 0, s1>>>(flag, 7, 200000000ull, seen);
        if (big) cudaMemcpyAsync(b, a, 16 << 20, cudaMemcpyDeviceToDevice, s2);
        cudaMemcpyAsync(flag, src, 4, cudaMemcpyDeviceToDevice, s2);
        cudaDeviceSynchronize();
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        unsigned got = 0; cudaMemcpy(&got, seen, 4, cudaMemcpyDeviceToHost);
        printf("spin %3d blocks x %4d threads, 16 MB copy first %d: %u of %d blocks saw the copied flag, %.2f ms (%s)\n", blocks, threads, big, got, blocks, ms, cudaGetErrorString(cudaGetLastError()));
    }
}
