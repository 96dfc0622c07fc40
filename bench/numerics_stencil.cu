// A C++ template stencil in float whose -O3 build contracts multiply-adds into FMAs: the program
// of the numerics demonstration (bench/numerics_gpu.sh). Its -G rebuild does not contract, so its
// results differ in the last bits while it runs several times slower.
//   numerics_stencil [SWEEPS]
#include <cstdio>
#include <cstdlib>
#include <vector>

template <typename T, int R>
__global__ void stencil(const T *in, T *out, int nx, int ny, T center, T side) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= nx || y >= ny) return;
    int i = y * nx + x;
    if (x < R || y < R || x >= nx - R || y >= ny - R) { out[i] = in[i]; return; }
    T acc = center * in[i];
#pragma unroll
    for (int r = 1; r <= R; r++) {
        T w = side / (T)r;
        acc += w * in[i - r] + w * in[i + r] + w * in[i - r * nx] + w * in[i + r * nx];
    }
    out[i] = acc;
}

int main(int argc, char **argv) {
    const int nx = 512, ny = 512, n = nx * ny, sweeps = argc > 1 ? atoi(argv[1]) : 20;
    std::vector<float> h(n);
    for (int i = 0; i < n; i++) h[i] = 0.37f + (float)((i * 37) % 101) * 0.013f;
    float *a, *b;
    cudaMalloc(&a, n * sizeof(float)); cudaMalloc(&b, n * sizeof(float));
    cudaMemcpy(a, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    dim3 block(16, 16), grid((nx + 15) / 16, (ny + 15) / 16);
    for (int s = 0; s < sweeps; s++) {
        stencil<float, 2><<<grid, block>>>(a, b, nx, ny, 0.4f, 0.1f);
        float *t = a; a = b; b = t;
    }
    cudaMemcpy(h.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost);
    double sum = 0; for (float v : h) sum += v;
    printf("stencil sum %.6f\nLAUNCHES %d\n", sum, sweeps);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
