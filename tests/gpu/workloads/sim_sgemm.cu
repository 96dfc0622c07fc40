// nvcc program for simulator replay, float: a shared-memory tiled SGEMM (C = A B, fused
// multiply-adds) and a row normalization (a shared-memory sum of squares, sqrt, divide), each
// result read back. Built with PTX beside SASS.
#include <cstdio>
#include <vector>

#define TILE 16

__global__ void sgemm(const float *A, const float *B, float *C, int n) {
    __shared__ float As[TILE][TILE], Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < n; t += TILE) {
        As[threadIdx.y][threadIdx.x] = A[row * n + t + threadIdx.x];
        Bs[threadIdx.y][threadIdx.x] = B[(t + threadIdx.y) * n + col];
        __syncthreads();
        for (int k = 0; k < TILE; k++) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    C[row * n + col] = acc;
}

// one block of 256 threads per row: y = x / sqrt(mean(x^2) + eps)
__global__ void rownorm(const float *x, float *y, int n) {
    __shared__ float part[256];
    const float *r = x + (size_t)blockIdx.x * n;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += r[i] * r[i];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    float inv = 1.0f / sqrtf(part[0] / n + 1e-5f);
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[(size_t)blockIdx.x * n + i] = r[i] * inv;
}

int main() {
    const int n = 128;
    std::vector<float> a(n * n), b(n * n), c(n * n), y(n * n);
    for (int i = 0; i < n * n; i++) { a[i] = 0.01f * (float)((i * 7) % 113) - 0.3f; b[i] = 0.02f * (float)((i * 13) % 61) + 0.11f; }
    float *da, *db, *dc, *dy;
    cudaMalloc(&da, n * n * 4); cudaMalloc(&db, n * n * 4); cudaMalloc(&dc, n * n * 4); cudaMalloc(&dy, n * n * 4);
    cudaMemcpy(da, a.data(), n * n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b.data(), n * n * 4, cudaMemcpyHostToDevice);
    sgemm<<<dim3(n / TILE, n / TILE), dim3(TILE, TILE)>>>(da, db, dc, n);
    cudaMemcpy(c.data(), dc, n * n * 4, cudaMemcpyDeviceToHost);
    rownorm<<<n, 256>>>(dc, dy, n);
    cudaMemcpy(y.data(), dy, n * n * 4, cudaMemcpyDeviceToHost);
    double s1 = 0, s2 = 0; for (int i = 0; i < n * n; i++) { s1 += c[i]; s2 += y[i]; }
    printf("sgemm sum %.4f rownorm sum %.4f\nLAUNCHES 2\n", s1, s2);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
