// nvcc program for simulator replay: four streams, each copying its own chunk in, running two
// dependent kernels and copying it out, ordered across streams by an event.
#include <cstdio>
#include <vector>

__global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i] + y[i];
}
__global__ void square(float *y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = y[i] * y[i]; }

int main() {
    const int ns = 4, n = 1 << 14;
    cudaStream_t st[ns]; cudaEvent_t ready; cudaEventCreate(&ready);
    float *hx, *hy; cudaMallocHost(&hx, ns * n * sizeof(float)); cudaMallocHost(&hy, ns * n * sizeof(float));
    for (int i = 0; i < ns * n; i++) { hx[i] = (float)(i % 17); hy[i] = (float)(i % 5); }
    float *x, *y; cudaMalloc(&x, ns * n * sizeof(float)); cudaMalloc(&y, ns * n * sizeof(float));
    for (int s = 0; s < ns; s++) cudaStreamCreateWithFlags(&st[s], cudaStreamNonBlocking);
    for (int s = 0; s < ns; s++) {
        cudaMemcpyAsync(x + s * n, hx + s * n, n * sizeof(float), cudaMemcpyHostToDevice, st[s]);
        cudaMemcpyAsync(y + s * n, hy + s * n, n * sizeof(float), cudaMemcpyHostToDevice, st[s]);
        saxpy<<<(n + 255) / 256, 256, 0, st[s]>>>(2.0f + s, x + s * n, y + s * n, n);
        if (s == 0) cudaEventRecord(ready, st[0]);
        else cudaStreamWaitEvent(st[s], ready, 0);
        square<<<(n + 255) / 256, 256, 0, st[s]>>>(y + s * n, n);
        cudaMemcpyAsync(hy + s * n, y + s * n, n * sizeof(float), cudaMemcpyDeviceToHost, st[s]);
    }
    for (int s = 0; s < ns; s++) cudaStreamSynchronize(st[s]);
    double sum = 0; for (int i = 0; i < ns * n; i++) sum += hy[i];
    printf("streams sum %.1f\nLAUNCHES %d\n", sum, 2 * ns);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
