// Build: nvcc -ptx -arch=compute_75 --expt-relaxed-constexpr sim_torch_mul.cu -o mul.ptx; then
// cudasnap replay sim_torch.x.cusnap --sim gpgpu-sim --replace KERNEL=mul.ptx (KERNEL: the name below, mangled).
// A PTX build of PyTorch's x * scalar kernel (vectorized_elementwise_kernel<4, AUnaryFunctor<float,
// float, float, MulFunctor<float>>, std::array<char*, 2>>) with its mangled name and parameter
// layout: out[i] = a * in[i] for i < N, in a grid-stride loop.
#include <array>
namespace at { namespace native {
namespace binary_internal {
template <typename T> struct MulFunctor { __device__ T operator()(T a, T b) const { return a * b; } };
}
template <typename arg1_t, typename arg2_t, typename return_t, typename func_t> struct AUnaryFunctor {
    func_t f;
    arg1_t a;
    __device__ return_t operator()(arg2_t b) const { return f(a, b); }
};
template <int vec_size, typename func_t, typename array_t>
__global__ void vectorized_elementwise_kernel(int N, func_t f, array_t data) {
    float *out = (float *)data[0];
    const float *in = (const float *)data[1];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) out[i] = f(in[i]);
}
template __global__ void vectorized_elementwise_kernel<4, AUnaryFunctor<float, float, float, binary_internal::MulFunctor<float>>,
                                                       std::array<char *, 2>>(
    int, AUnaryFunctor<float, float, float, binary_internal::MulFunctor<float>>, std::array<char *, 2>);
}}
