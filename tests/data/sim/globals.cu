// A kernel reading module globals, for the simulator tests (semantics of the test double's
// glob_axpb, tests/double/double_launch.c). globals.ptx is its PTX, written by hand in the form
// nvcc -ptx -arch=compute_75 emits.
__device__ float g_scale = 2.0f;
__constant__ float c_bias[4];
extern "C" __global__ void glob_axpb(float *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = fmaf(p[i], g_scale, c_bias[i & 3]);
}
