// add_one computing something else (+2): a replacement whose simulated result must mismatch.
extern "C" __global__ void add_one(float *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 2.0f;
}
