// Approximate math for the simulator tests (the test double's fast_sin, tests/double/double_launch.c).
// fast_sin.ptx is its PTX, written by hand in the form nvcc -ptx -arch=compute_75 emits.
extern "C" __global__ void fast_sin(float *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = __sinf(p[i]);
}
