// Launch-bound C loop: REPS x N empty-kernel launches through the runtime (which reaches
// the driver through cuGetProcAddress, like every nvcc program). Prints us per launch.
#include <chrono>
#include <cstdio>
#include <cstdlib>
__global__ void empty() {}
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100000, reps = argc > 2 ? atoi(argv[2]) : 5;
    empty<<<1, 1>>>(); cudaDeviceSynchronize();
    for (int r = 0; r < reps; r++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; i++) empty<<<1, 1>>>();
        cudaDeviceSynchronize();
        double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        printf("REP %d us_per_launch %.4f\n", r, us / n);
    }
    printf("LAUNCHES %d\n", n * reps + 1);
    return 0;
}
