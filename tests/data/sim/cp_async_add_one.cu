// add_one staged through shared memory with cp.async (sm_80): PTX the simulator cannot parse,
// to be refused by name before the run. nvcc -ptx -arch=compute_80 cp_async_add_one.cu
#include <cuda_pipeline.h>
extern "C" __global__ void add_one(float *p, int n) {
    __shared__ float s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) __pipeline_memcpy_async(&s[threadIdx.x], &p[i], sizeof(float));
    __pipeline_commit();
    __pipeline_wait_prior(0);
    if (i < n) p[i] = s[threadIdx.x] + 1.0f;
}
