// CUDA arrays, texture and surface objects through the runtime: a float 2D array filled by
// cudaMemcpy2DToArray and sampled through a texture object; a surface a kernel writes, read
// back by cudaMemcpy2DFromArray. Prints "TEX t SURF s" (weighted sums).
#include <cstdio>
#include <cuda_runtime.h>

constexpr int W = 64, H = 16;

__global__ void fetch(cudaTextureObject_t t, float *out) {
    int x = threadIdx.x, y = blockIdx.x;
    out[y * W + x] = tex2D<float>(t, x + 0.5f, y + 0.5f) * 2.0f;
}

__global__ void fill(cudaSurfaceObject_t s) {
    int x = threadIdx.x, y = blockIdx.x;
    surf2Dwrite(float(x * 3 + y), s, x * sizeof(float), y);
}

static double weighted(const float *p) {
    double s = 0;
    for (int i = 0; i < W * H; i++) s += p[i] * (i % 7 + 1);
    return s;
}

int main() {
    static float h[W * H], got[W * H];
    for (int i = 0; i < W * H; i++) h[i] = 0.25f * i;
    cudaChannelFormatDesc fd = cudaCreateChannelDesc<float>();
    cudaArray_t a, b;
    if (cudaMallocArray(&a, &fd, W, H) || cudaMallocArray(&b, &fd, W, H, cudaArraySurfaceLoadStore)) return 2;
    cudaMemcpy2DToArray(a, 0, 0, h, W * sizeof(float), W * sizeof(float), H, cudaMemcpyHostToDevice);
    cudaResourceDesc rd = {};
    rd.resType = cudaResourceTypeArray;
    rd.res.array.array = a;
    cudaTextureDesc td = {};
    td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    cudaTextureObject_t t;
    cudaCreateTextureObject(&t, &rd, &td, nullptr);
    float *out;
    cudaMalloc(&out, sizeof got);
    fetch<<<H, W>>>(t, out);
    cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost);
    double tex = weighted(got);
    rd.res.array.array = b;
    cudaSurfaceObject_t s;
    cudaCreateSurfaceObject(&s, &rd);
    fill<<<H, W>>>(s);
    cudaMemcpy2DFromArray(got, W * sizeof(float), b, 0, 0, W * sizeof(float), H, cudaMemcpyDeviceToHost);
    std::printf("TEX %.1f SURF %.1f\n", tex, weighted(got));
    cudaDestroySurfaceObject(s);
    cudaDestroyTextureObject(t);
    cudaFreeArray(a);
    cudaFreeArray(b);
    cudaFree(out);
    return cudaGetLastError() == cudaSuccess ? 0 : 3;
}
