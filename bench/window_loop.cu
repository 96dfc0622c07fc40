// A long-running training-loop shape for capture windows and the flight recorder
// (bench/demo_window_gpu.sh, bench/bench_flight_gpu.py).
//   window_loop STEPS WS_MIB [FAIL_AFTER_S] [TOUCH_PERMILLE] [STEP_SLEEP_US]
// Allocates a working set of WS_MIB (1 GiB pieces) filled by a kernel, then runs STEPS steps
// (STEPS 0: until FAIL_AFTER_S): each step, inside an NVTX range "step", updates
// TOUCH_PERMILLE/1000 of the working set (default 10), runs a saxpy on a small buffer and reads
// 4 KiB back. cudaProfilerStart/Stop bracket steps 5..7. After FAIL_AFTER_S seconds (when
// given) it launches `bad_kernel`, which writes through an illegal address, and reports the
// error of the next synchronization (exit 1). STEP_SLEEP_US: host time between steps (a
// data loader's share of a training step). Prints "STEP_US p50 <us>" (the steady-state
// step time, steps 10 on), "SUM <checksum>" and "STEPS <n>".
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <thread>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            printf("CUDA error %s (%s) at %s:%d\n", cudaGetErrorName(e_), cudaGetErrorString(e_), \
                   __FILE__, __LINE__);                                                          \
            fflush(stdout);                                                                      \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

__global__ void fill(unsigned *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = seed * 2654435761u + (unsigned)(i >> 10);
}

__global__ void touch(unsigned *p, size_t begin, size_t n) {
    for (size_t i = begin + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < begin + n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] += 1u;
}

__global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void bad_kernel(int *p) { p[threadIdx.x * 1024] = 42; }

int main(int argc, char **argv) {
    long steps = argc > 1 ? atol(argv[1]) : 100;
    size_t ws_mib = argc > 2 ? strtoull(argv[2], nullptr, 10) : 1024;
    double fail_after = argc > 3 ? atof(argv[3]) : -1.0;
    int permille = argc > 4 ? atoi(argv[4]) : 10;
    long sleep_us = argc > 5 ? atol(argv[5]) : 0;
    const size_t piece = 1ull << 30;
    size_t total = ws_mib << 20;
    std::vector<unsigned *> pieces;
    std::vector<size_t> sizes;
    for (size_t off = 0; off < total; off += piece) {
        size_t n = std::min(piece, total - off);
        unsigned *p;
        CK(cudaMalloc(&p, n));
        fill<<<1024, 256>>>(p, n / 4, (unsigned)pieces.size() + 1);
        pieces.push_back(p);
        sizes.push_back(n);
    }
    const int N = 1 << 20;
    float *x, *y;
    CK(cudaMalloc(&x, N * 4));
    CK(cudaMalloc(&y, N * 4));
    std::vector<float> h(N, 1.0f);
    CK(cudaMemcpy(x, h.data(), N * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(y, h.data(), N * 4, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
    std::vector<double> times;
    double sum = 0;
    float out[1024];
    auto t_start = std::chrono::steady_clock::now();
    long s = 0;
    for (;; s++) {
        double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        if (fail_after >= 0 && el >= fail_after) {
            printf("launching bad_kernel after %.1f s at %.3f\n", el,
                   std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
            fflush(stdout);
            bad_kernel<<<1, 32>>>((int *)0x10);
            CK(cudaDeviceSynchronize());
            printf("bad_kernel did not fail\n");
            return 3;
        }
        if (steps > 0 && s >= steps) break;
        if (steps <= 0 && fail_after < 0) break;
        if (s == 5) cudaProfilerStart();
        auto t0 = std::chrono::steady_clock::now();
        nvtxRangePushA("step");
        size_t k = s % pieces.size();
        size_t words = sizes[k] / 4, n = words * permille / 1000;
        size_t begin = (size_t)(s * 7919) % (words - n + 1);
        touch<<<1024, 256>>>(pieces[k], begin, n);
        saxpy<<<(N + 255) / 256, 256>>>(0.5f, x, y, N);
        CK(cudaMemcpy(out, y + (s % 1000) * 1024, sizeof out, cudaMemcpyDeviceToHost));
        nvtxRangePop();
        times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        if (s == 7) cudaProfilerStop();
        if (sleep_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
        for (int i = 0; i < 1024; i += 97) sum += out[i];
    }
    CK(cudaDeviceSynchronize());
    if (times.size() > 10) {
        std::vector<double> t(times.begin() + 10, times.end());
        std::sort(t.begin(), t.end());
        printf("STEP_US p50 %.1f\n", t[t.size() / 2]);
    }
    printf("SUM %.1f\nSTEPS %ld\n", sum, s);
    return 0;
}
