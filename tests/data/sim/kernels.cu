// Kernels of the simulator tests, with the semantics of the test double's host kernels of the
// same names (tests/double/double_launch.c). PTX: nvcc -ptx -arch=compute_75 kernels.cu
extern "C" __global__ void add_one(float *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1.0f;
}
extern "C" __global__ void fill(unsigned *p, unsigned v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}
extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
// reads through pointers stored in device memory
extern "C" __global__ void chase(const unsigned long long *table, unsigned long long *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = *(const unsigned long long *)table[i];
}
// shared memory and barriers: out[b] = sum of in[256 b .. 256 b + 255] (blocks of 256 threads)
extern "C" __global__ void tile_sum(const int *in, int *out, int n) {
    __shared__ int s[256];
    int t = threadIdx.x, i = blockIdx.x * 256 + t;
    s[t] = i < n ? in[i] : 0;
    __syncthreads();
    for (int k = 128; k > 0; k >>= 1) {
        if (t < k) s[t] += s[t + k];
        __syncthreads();
    }
    if (t == 0 && blockIdx.x * 256 < n) out[blockIdx.x] = s[0];
}
// atomics: bins[in[i] % nbins] += 1
extern "C" __global__ void histo(const unsigned *in, unsigned *bins, int n, int nbins) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&bins[in[i] % nbins], 1u);
}
