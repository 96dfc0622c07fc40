// Multi-threaded nvcc program (static cudart): several host threads start together, each with
// two streams of its own, and each loops over: allocate, upload (pinned), launch built-in
// kernels (a different template instance per thread, so lazy module loading happens from
// several threads at once), launch a kernel of a PTX library the thread loads at run time
// (cudaLibraryLoadData, JIT by the driver, with a module global set through
// cudaLibraryGetGlobal), download on the second stream after an event, free. Every value is
// integer arithmetic, so the checksums printed at the end are the same on every run.
//   mt_launch [threads=6] [iterations=8]
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

static const char kPtx[] = R"PTX(
.version 8.0
.target sm_80
.address_size 64

.visible .global .align 4 .u32 lib_bias;

.visible .entry lib_mix(
	.param .u64 lib_mix_param_0,
	.param .u64 lib_mix_param_1,
	.param .u32 lib_mix_param_2,
	.param .u32 lib_mix_param_3
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<13>;
	.reg .b64 	%rd<8>;

	ld.param.u64 	%rd1, [lib_mix_param_0];
	ld.param.u64 	%rd2, [lib_mix_param_1];
	ld.param.u32 	%r2, [lib_mix_param_2];
	ld.param.u32 	%r3, [lib_mix_param_3];
	mov.u32 	%r4, %ctaid.x;
	mov.u32 	%r5, %ntid.x;
	mov.u32 	%r6, %tid.x;
	mad.lo.s32 	%r1, %r4, %r5, %r6;
	setp.ge.s32 	%p1, %r1, %r3;
	@%p1 bra 	$L__BB0_2;

	cvta.to.global.u64 	%rd3, %rd2;
	mul.wide.s32 	%rd4, %r1, 4;
	add.s64 	%rd5, %rd3, %rd4;
	mul.lo.s32 	%r7, %r2, -1640531527;
	ld.global.u32 	%r8, [%rd5];
	xor.b32  	%r9, %r8, %r7;
	ld.global.u32 	%r10, [lib_bias];
	add.s32 	%r11, %r10, %r1;
	add.s32 	%r12, %r11, %r9;
	cvta.to.global.u64 	%rd6, %rd1;
	add.s64 	%rd7, %rd6, %rd4;
	st.global.u32 	[%rd7], %r12;

$L__BB0_2:
	ret;
}
)PTX";

// What lib_mix computes, for the host-side check.
static uint32_t lib_mix_ref(uint32_t x, uint32_t k, uint32_t bias, uint32_t i) {
    return (x ^ (k * 2654435769u)) + bias + i;
}

template <int V>
__global__ void mix(uint32_t *y, const uint32_t *x, uint32_t k, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        uint32_t v = x[i] * 2654435761u + k * (V + 1);
        v ^= v >> 15;
        y[i] = v + V;
    }
}

__global__ void add_into(uint32_t *acc, const uint32_t *z, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += z[i];
}

template <int V>
static uint32_t mix_ref(uint32_t x, uint32_t k) {
    uint32_t v = x * 2654435761u + k * (V + 1);
    v ^= v >> 15;
    return v + V;
}

struct Result {
    uint64_t checksum = 0, acc_checksum = 0;
    int launches = 0, bad = 0;
    const char *error = nullptr;
    int error_line = 0;
};

static std::atomic<int> ready{0};

#define CK(x)                                                                   \
    do {                                                                        \
        cudaError_t e_ = (x);                                                   \
        if (e_ != cudaSuccess) {                                                \
            r.error = cudaGetErrorString(e_);                                   \
            r.error_line = __LINE__;                                            \
            return;                                                             \
        }                                                                       \
    } while (0)

static const int kMaxN = (4096 << 3) + 64 * 128;

static void launch_mix(int v, uint32_t *y, const uint32_t *x, uint32_t k, int n, cudaStream_t s) {
    dim3 g((n + 255) / 256), b(256);
    switch (v) {
    case 0: mix<0><<<g, b, 0, s>>>(y, x, k, n); break;
    case 1: mix<1><<<g, b, 0, s>>>(y, x, k, n); break;
    case 2: mix<2><<<g, b, 0, s>>>(y, x, k, n); break;
    default: mix<3><<<g, b, 0, s>>>(y, x, k, n); break;
    }
}

static uint32_t mix_host(int v, uint32_t x, uint32_t k) {
    switch (v) {
    case 0: return mix_ref<0>(x, k);
    case 1: return mix_ref<1>(x, k);
    case 2: return mix_ref<2>(x, k);
    default: return mix_ref<3>(x, k);
    }
}

static void worker(int t, int nthreads, int iters, Result &r) {
    // start together: context creation and first launches overlap between threads
    ready.fetch_add(1);
    while (ready.load() < nthreads) std::this_thread::yield();
    CK(cudaSetDevice(0));
    cudaStream_t s, s2;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t ev;
    CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaLibrary_t lib;
    CK(cudaLibraryLoadData(&lib, kPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
    cudaKernel_t lk;
    CK(cudaLibraryGetKernel(&lk, lib, "lib_mix"));
    void *bias_ptr = nullptr;
    size_t bias_size = 0;
    CK(cudaLibraryGetGlobal(&bias_ptr, &bias_size, lib, "lib_bias"));
    const uint32_t bias = 1000u * (uint32_t)(t + 1);
    CK(cudaMemcpyAsync(bias_ptr, &bias, sizeof bias, cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));

    uint32_t *hin, *hout;
    CK(cudaMallocHost(&hin, kMaxN * sizeof(uint32_t)));
    CK(cudaMallocHost(&hout, kMaxN * sizeof(uint32_t)));
    std::vector<uint32_t> acc_ref(kMaxN, 0);
    uint32_t *dacc;
    CK(cudaMalloc(&dacc, kMaxN * sizeof(uint32_t)));
    CK(cudaMemsetAsync(dacc, 0, kMaxN * sizeof(uint32_t), s));
    const int v = t % 4;
    for (int it = 0; it < iters; it++) {
        const int n = (4096 << (it % 4)) + t * 128;
        const uint32_t k = (uint32_t)(it * 977 + t * 31 + 1);
        for (int i = 0; i < n; i++) hin[i] = (uint32_t)i * 7u + (uint32_t)t * 131u + (uint32_t)it;
        uint32_t *dx, *dy, *dz;
        CK(cudaMalloc(&dx, n * sizeof(uint32_t)));
        CK(cudaMalloc(&dy, n * sizeof(uint32_t)));
        CK(cudaMalloc(&dz, n * sizeof(uint32_t)));
        CK(cudaMemcpyAsync(dx, hin, n * sizeof(uint32_t), cudaMemcpyHostToDevice, s));
        launch_mix(v, dy, dx, k, n, s);
        CK(cudaGetLastError());
        r.launches++;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((n + 127) / 128);
        cfg.blockDim = dim3(128);
        cfg.stream = s;
        void *args[] = {&dz, &dy, (void *)&k, (void *)&n};
        CK(cudaLaunchKernelExC(&cfg, (const void *)lk, args));
        r.launches++;
        add_into<<<(n + 255) / 256, 256, 0, s>>>(dacc, dz, n);
        CK(cudaGetLastError());
        r.launches++;
        CK(cudaEventRecord(ev, s));
        CK(cudaStreamWaitEvent(s2, ev, 0));
        CK(cudaMemcpyAsync(hout, dz, n * sizeof(uint32_t), cudaMemcpyDeviceToHost, s2));
        CK(cudaStreamSynchronize(s2));
        for (int i = 0; i < n; i++) {
            uint32_t want = lib_mix_ref(mix_host(v, hin[i], k), k, bias, (uint32_t)i);
            if (hout[i] != want) r.bad++;
            acc_ref[i] += want;
            r.checksum = r.checksum * 1099511628211ull + hout[i];
        }
        CK(cudaFree(dx));
        CK(cudaFree(dy));
        CK(cudaFree(dz));
    }
    CK(cudaMemcpyAsync(hout, dacc, kMaxN * sizeof(uint32_t), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < kMaxN; i++) {
        if (hout[i] != acc_ref[i]) r.bad++;
        r.acc_checksum = r.acc_checksum * 1099511628211ull + hout[i];
    }
    CK(cudaFree(dacc));
    CK(cudaFreeHost(hin));
    CK(cudaFreeHost(hout));
    CK(cudaLibraryUnload(lib));
    CK(cudaEventDestroy(ev));
    CK(cudaStreamDestroy(s));
    CK(cudaStreamDestroy(s2));
}

int main(int argc, char **argv) {
    const int nthreads = argc > 1 ? atoi(argv[1]) : 6;
    const int iters = argc > 2 ? atoi(argv[2]) : 8;
    if (nthreads < 1 || nthreads > 64 || iters < 1) {
        fprintf(stderr, "usage: mt_launch [threads 1..64] [iterations >= 1]\n");
        return 2;
    }
    std::vector<Result> res(nthreads);
    std::vector<std::thread> th;
    for (int t = 0; t < nthreads; t++) th.emplace_back(worker, t, nthreads, iters, std::ref(res[t]));
    for (auto &x : th) x.join();
    int launches = 0, bad = 0, failed = 0;
    for (int t = 0; t < nthreads; t++) {
        const Result &r = res[t];
        if (r.error) {
            failed++;
            fprintf(stderr, "thread %d: CUDA error at line %d: %s\n", t, r.error_line, r.error);
        }
        printf("thread %d launches %d bad %d checksum %016llx acc %016llx\n", t, r.launches, r.bad,
               (unsigned long long)r.checksum, (unsigned long long)r.acc_checksum);
        launches += r.launches;
        bad += r.bad;
    }
    cudaError_t e = cudaDeviceSynchronize();
    printf("LAUNCHES %d\n", launches);
    printf("BAD %d\n", bad);
    return (failed || bad || e != cudaSuccess) ? 1 : 0;
}
