// nvcc-flags: -rdc=true -lcudadevrt
// Runtime features that CUDA's own samples use and the other workloads do not: managed memory,
// mapped host memory, host callbacks, cooperative grid sync, thread-block clusters, large dynamic
// shared memory, __constant__/__device__ symbols, stream-ordered pools, graphs with host, memset
// and conditional nodes, dynamic parallelism, batched copies, stream priorities and events,
// device printf. Each part prints one deterministic line; `samples PART...` runs only those.
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace cg = cooperative_groups;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::printf("error %s at %s:%d %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, #x); std::exit(1); } } while (0)

static double sum(const float *p, int n) { double s = 0; for (int i = 0; i < n; i++) s += p[i]; return s; }

__global__ void scale(float *x, int n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a + 1.0f;
}

// managed memory, prefetched and advised
static void managed() {
    const int n = 1 << 20;
    float *m;
    CK(cudaMallocManaged(&m, n * sizeof(float)));
    for (int i = 0; i < n; i++) m[i] = (float)(i % 7);
    int dev = 0;
    CK(cudaGetDevice(&dev));
    cudaMemLocation loc = {cudaMemLocationTypeDevice, dev};
    CK(cudaMemAdvise(m, n * sizeof(float), cudaMemAdviseSetPreferredLocation, loc));
    CK(cudaMemPrefetchAsync(m, n * sizeof(float), loc, 0, 0));
    scale<<<(n + 255) / 256, 256>>>(m, n, 2.0f);
    CK(cudaDeviceSynchronize());
    std::printf("managed %.0f\n", sum(m, n));
    CK(cudaFree(m));
}

// mapped (zero-copy) host memory: a kernel writes host memory through its device pointer
static void mapped() {
    const int n = 4096;
    float *h, *d;
    CK(cudaHostAlloc(&h, n * sizeof(float), cudaHostAllocMapped));
    for (int i = 0; i < n; i++) h[i] = (float)i;
    CK(cudaHostGetDevicePointer(&d, h, 0));
    scale<<<n / 256, 256>>>(d, n, 0.5f);
    CK(cudaDeviceSynchronize());
    std::vector<float> reg(n, 3.0f);
    float *dr;
    CK(cudaHostRegister(reg.data(), n * sizeof(float), cudaHostRegisterMapped));
    CK(cudaHostGetDevicePointer(&dr, reg.data(), 0));
    scale<<<n / 256, 256>>>(dr, n, 2.0f);
    CK(cudaDeviceSynchronize());
    std::printf("mapped %.1f %.1f\n", sum(h, n), sum(reg.data(), n));
    CK(cudaHostUnregister(reg.data()));
    CK(cudaFreeHost(h));
}

// host functions and stream callbacks between kernels
static int calls = 0;
static void CUDART_CB host_fn(void *p) { calls += *(int *)p; }
static void CUDART_CB stream_cb(cudaStream_t, cudaError_t st, void *p) { if (st == cudaSuccess) calls += 10 * *(int *)p; }
static void hostfunc() {
    const int n = 1 << 16;
    float *d;
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    CK(cudaMalloc(&d, n * sizeof(float)));
    CK(cudaMemsetAsync(d, 0, n * sizeof(float), s));
    static int one = 1, two = 2;
    scale<<<n / 256, 256, 0, s>>>(d, n, 1.0f);
    CK(cudaLaunchHostFunc(s, host_fn, &one));
    scale<<<n / 256, 256, 0, s>>>(d, n, 3.0f);
    CK(cudaStreamAddCallback(s, stream_cb, &two, 0));
    std::vector<float> h(n);
    CK(cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    std::printf("hostfunc calls=%d %.0f\n", calls, sum(h.data(), n));
    CK(cudaFree(d));
    CK(cudaStreamDestroy(s));
}

// cooperative launch: a grid-wide sync between two phases of a reduction
__global__ void coop_reduce(const float *x, float *partial, float *out, int n) {
    cg::grid_group g = cg::this_grid();
    float s = 0;
    for (int i = g.thread_rank(); i < n; i += g.size()) s += x[i];
    for (int o = 16; o; o >>= 1) s += __shfl_down_sync(0xffffffff, s, o);
    __shared__ float w[32];
    if (threadIdx.x % 32 == 0) w[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) { float b = 0; for (int i = 0; i < blockDim.x / 32; i++) b += w[i]; partial[blockIdx.x] = b; }
    g.sync();
    if (g.thread_rank() == 0) { float t = 0; for (int i = 0; i < gridDim.x; i++) t += partial[i]; *out = t; }
}
static void coop() {
    const int n = 1 << 20;
    int dev = 0, sms = 0, per = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, coop_reduce, 256, 0));
    int blocks = sms * (per < 2 ? per : 2);
    std::vector<float> h(n, 1.0f);
    float *x, *partial, *out;
    CK(cudaMalloc(&x, n * sizeof(float)));
    CK(cudaMalloc(&partial, blocks * sizeof(float)));
    CK(cudaMalloc(&out, sizeof(float)));
    CK(cudaMemcpy(x, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    int nn = n;
    void *args[] = {&x, &partial, &out, &nn};
    CK(cudaLaunchCooperativeKernel((void *)coop_reduce, blocks, 256, args, 0, 0));
    float r = 0;
    CK(cudaMemcpy(&r, out, sizeof r, cudaMemcpyDeviceToHost));
    std::printf("coop %.0f\n", r);
    CK(cudaFree(x)); CK(cudaFree(partial)); CK(cudaFree(out));
}

// thread-block clusters: each block reads its partner's shared memory (distributed shared memory)
__global__ void __cluster_dims__(2, 1, 1) cluster_swap(int *out) {
    __shared__ int v;
    cg::cluster_group c = cg::this_cluster();
    if (threadIdx.x == 0) v = blockIdx.x * 100;
    c.sync();
    int *peer = c.map_shared_rank(&v, c.block_rank() ^ 1);
    if (threadIdx.x == 0) out[blockIdx.x] = *peer;
    c.sync();
}
__global__ void cluster_plain(int *out) {
    cg::cluster_group c = cg::this_cluster();
    if (threadIdx.x == 0) out[blockIdx.x] += (int)c.num_blocks();
}
static void cluster() {
    int *d;
    const int blocks = 8;
    CK(cudaMalloc(&d, blocks * sizeof(int)));
    cluster_swap<<<blocks, 32>>>(d);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(32);
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 4; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, cluster_plain, d));
    int h[blocks];
    CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    long t = 0;
    for (int i = 0; i < blocks; i++) t += h[i] * (i + 1);
    std::printf("cluster %ld\n", t);
    CK(cudaFree(d));
}

// more than 48 KB of dynamic shared memory: needs the function attribute set before the launch
__global__ void big_smem(float *out, int words) {
    extern __shared__ float s[];
    for (int i = threadIdx.x; i < words; i += blockDim.x) s[i] = (float)(i % 13);
    __syncthreads();
    float t = 0;
    for (int i = threadIdx.x; i < words; i += blockDim.x) t += s[words - 1 - i];
    atomicAdd(out, t);
}
static void bigsmem() {
    const int bytes = 160 * 1024, words = bytes / 4;
    CK(cudaFuncSetAttribute(big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    float *d;
    CK(cudaMalloc(&d, sizeof(float)));
    CK(cudaMemset(d, 0, sizeof(float)));
    big_smem<<<4, 256, bytes>>>(d, words);
    float r = 0;
    CK(cudaMemcpy(&r, d, sizeof r, cudaMemcpyDeviceToHost));
    std::printf("bigsmem %.0f\n", r);
    CK(cudaFree(d));
}

// __constant__ and __device__ symbols written and read by name
__constant__ float coef[16];
__device__ int counter;
__global__ void use_symbols(float *out) {
    atomicAdd(&counter, 1);
    out[threadIdx.x] = coef[threadIdx.x % 16] * 2.0f;
}
static void symbols() {
    float c[16];
    for (int i = 0; i < 16; i++) c[i] = (float)(i * i);
    CK(cudaMemcpyToSymbol(coef, c, sizeof c));
    int zero = 0;
    CK(cudaMemcpyToSymbol(counter, &zero, sizeof zero));
    float *d;
    CK(cudaMalloc(&d, 64 * sizeof(float)));
    use_symbols<<<3, 64>>>(d);
    int cnt = 0;
    CK(cudaMemcpyFromSymbol(&cnt, counter, sizeof cnt));
    float h[64];
    CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    void *addr = nullptr;
    CK(cudaGetSymbolAddress(&addr, coef));
    std::printf("symbols %d %.0f %s\n", cnt, sum(h, 64), addr ? "addr" : "none");
    CK(cudaFree(d));
}

// stream-ordered allocation from the default pool and from an explicit pool
static void mempool() {
    int dev = 0;
    CK(cudaGetDevice(&dev));
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t pool;
    CK(cudaMemPoolCreate(&pool, &props));
    unsigned long long keep = 64ull << 20;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int n = 1 << 18;
    double total = 0;
    std::vector<float> h(n);
    for (int it = 0; it < 4; it++) {
        float *a, *b;
        CK(cudaMallocAsync(&a, n * sizeof(float), s));
        CK(cudaMallocFromPoolAsync(&b, n * sizeof(float), pool, s));
        CK(cudaMemsetAsync(a, 0, n * sizeof(float), s));
        scale<<<n / 256, 256, 0, s>>>(a, n, 1.0f);
        CK(cudaMemcpyAsync(b, a, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
        scale<<<n / 256, 256, 0, s>>>(b, n, (float)(it + 1));
        CK(cudaMemcpyAsync(h.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost, s));
        CK(cudaFreeAsync(a, s));
        CK(cudaFreeAsync(b, s));
        CK(cudaStreamSynchronize(s));
        total += sum(h.data(), n);
    }
    std::printf("mempool %.0f\n", total);
    CK(cudaStreamDestroy(s));
    CK(cudaMemPoolDestroy(pool));
}

// a captured graph with memset, kernel, host and copy nodes, launched several times and updated
static int graph_host_calls = 0;
static void CUDART_CB graph_host(void *) { graph_host_calls++; }
static void graphs() {
    const int n = 1 << 16;
    float *d;
    CK(cudaMalloc(&d, n * sizeof(float)));
    std::vector<float> h(n);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaMemsetAsync(d, 0, n * sizeof(float), s));
    scale<<<n / 256, 256, 0, s>>>(d, n, 1.0f);
    CK(cudaLaunchHostFunc(s, graph_host, nullptr));
    scale<<<n / 256, 256, 0, s>>>(d, n, 2.0f);
    CK(cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    double t = 0;
    for (int i = 0; i < 3; i++) { CK(cudaGraphLaunch(ge, s)); CK(cudaStreamSynchronize(s)); t += sum(h.data(), n); }
    // change the second kernel's factor in the instantiated graph
    size_t count = 0;
    CK(cudaGraphGetNodes(g, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    CK(cudaGraphGetNodes(g, nodes.data(), &count));
    int kernels = 0;
    for (auto nd : nodes) {
        cudaGraphNodeType ty;
        CK(cudaGraphNodeGetType(nd, &ty));
        if (ty != cudaGraphNodeTypeKernel || ++kernels != 2) continue;
        cudaKernelNodeParams kp;
        CK(cudaGraphKernelNodeGetParams(nd, &kp));
        float a = 5.0f;
        int nn = n;
        void *args[] = {&d, &nn, &a};
        kp.kernelParams = args;
        CK(cudaGraphExecKernelNodeSetParams(ge, nd, &kp));
    }
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    t += sum(h.data(), n);
    std::vector<float> back(n);         // read again outside the graph, as a program checks its result
    CK(cudaMemcpy(back.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    std::printf("graphs host=%d %.0f %.0f\n", graph_host_calls, t, sum(back.data(), n));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(s));
    CK(cudaFree(d));
}

// a conditional WHILE node: its body runs until a kernel clears the condition
__global__ void cond_init(cudaGraphConditionalHandle h, int *left) { *left = 5; cudaGraphSetConditional(h, 1); }
__global__ void cond_body(cudaGraphConditionalHandle h, int *left, float *acc) {
    *acc += 1.5f;
    if (--*left == 0) cudaGraphSetConditional(h, 0);
}
static void conditional() {
    int *left;
    float *acc;
    CK(cudaMalloc(&left, sizeof(int)));
    CK(cudaMalloc(&acc, sizeof(float)));
    CK(cudaMemset(acc, 0, sizeof(float)));
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    CK(cudaGraphConditionalHandleCreate(&h, g, 0, 0));
    cudaGraphNode_t init;
    cudaKernelNodeParams ip = {};
    void *iargs[] = {&h, &left};
    ip.func = (void *)cond_init; ip.gridDim = dim3(1); ip.blockDim = dim3(1); ip.kernelParams = iargs;
    CK(cudaGraphAddKernelNode(&init, g, nullptr, 0, &ip));
    cudaGraphNodeParams cp = {};
    cp.type = cudaGraphNodeTypeConditional;
    cp.conditional.handle = h;
    cp.conditional.type = cudaGraphCondTypeWhile;
    cp.conditional.size = 1;
    cudaGraphNode_t wnode;
    CK(cudaGraphAddNode(&wnode, g, &init, nullptr, 1, &cp));
    cudaGraph_t body = cp.conditional.phGraph_out[0];
    cudaGraphNode_t bnode;
    cudaKernelNodeParams bp = {};
    void *bargs[] = {&h, &left, &acc};
    bp.func = (void *)cond_body; bp.gridDim = dim3(1); bp.blockDim = dim3(1); bp.kernelParams = bargs;
    CK(cudaGraphAddKernelNode(&bnode, body, nullptr, 0, &bp));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, 0));
    CK(cudaGraphLaunch(ge, 0));
    float r = 0;
    CK(cudaMemcpy(&r, acc, sizeof r, cudaMemcpyDeviceToHost));
    std::printf("conditional %.1f\n", r);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaFree(left)); CK(cudaFree(acc));
}

// dynamic parallelism: a parent kernel launches its children from the device
__global__ void child(float *x, int base) { x[base + threadIdx.x] += 1.0f; }
__global__ void parent(float *x) {
    if (threadIdx.x == 0) child<<<1, 64>>>(x, blockIdx.x * 64);
}
static void cdp() {
    float *d;
    CK(cudaMalloc(&d, 16 * 64 * sizeof(float)));
    CK(cudaMemset(d, 0, 16 * 64 * sizeof(float)));
    parent<<<16, 32>>>(d);
    parent<<<16, 32>>>(d);
    float h[16 * 64];
    CK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    std::printf("cdp %.0f\n", sum(h, 16 * 64));
    CK(cudaFree(d));
}

// batched copies: host to device and device to device in one call
static void batch() {
    const int n = 4096, k = 3;
    std::vector<float> h(k * n);
    for (int i = 0; i < k * n; i++) h[i] = (float)(i % 11);
    float *d, *e;
    CK(cudaMalloc(&d, k * n * sizeof(float)));
    CK(cudaMalloc(&e, k * n * sizeof(float)));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    void *dsts[k]; const void *srcs[k]; size_t sizes[k];
    for (int i = 0; i < k; i++) { dsts[i] = d + i * n; srcs[i] = h.data() + i * n; sizes[i] = n * sizeof(float); }
    cudaMemcpyAttributes at = {};
    at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t idx = 0;
    CK(cudaMemcpyBatchAsync(dsts, srcs, sizes, k, &at, &idx, 1, s));
    for (int i = 0; i < k; i++) { dsts[i] = e + (k - 1 - i) * n; srcs[i] = d + i * n; }
    CK(cudaMemcpyBatchAsync(dsts, srcs, sizes, k, &at, &idx, 1, s));
    scale<<<k * n / 256, 256, 0, s>>>(e, k * n, 2.0f);
    std::vector<float> r(k * n);
    CK(cudaMemcpyAsync(r.data(), e, k * n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    std::printf("batch %.0f %.0f\n", sum(r.data(), n), sum(r.data(), k * n));
    CK(cudaStreamDestroy(s));
    CK(cudaFree(d)); CK(cudaFree(e));
}

// streams of two priorities ordered by events, with timing events
static void events() {
    int lo = 0, hi = 0;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t a, b;
    CK(cudaStreamCreateWithPriority(&a, cudaStreamNonBlocking, lo));
    CK(cudaStreamCreateWithPriority(&b, cudaStreamNonBlocking, hi));
    cudaEvent_t t0, t1, ready;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    CK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    const int n = 1 << 20;
    float *d;
    CK(cudaMalloc(&d, n * sizeof(float)));
    CK(cudaMemsetAsync(d, 0, n * sizeof(float), a));
    CK(cudaEventRecord(t0, a));
    for (int i = 0; i < 4; i++) scale<<<n / 256, 256, 0, a>>>(d, n, 1.0f);
    CK(cudaEventRecord(ready, a));
    CK(cudaStreamWaitEvent(b, ready, 0));
    scale<<<n / 256, 256, 0, b>>>(d, n, 2.0f);
    CK(cudaEventRecord(t1, b));
    CK(cudaEventSynchronize(t1));
    float ms = -1;
    CK(cudaEventElapsedTime(&ms, t0, t1));
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    std::printf("events %.0f timed=%d\n", sum(h.data(), n), ms >= 0 ? 1 : 0);
    CK(cudaEventDestroy(t0)); CK(cudaEventDestroy(t1)); CK(cudaEventDestroy(ready));
    CK(cudaStreamDestroy(a)); CK(cudaStreamDestroy(b));
    CK(cudaFree(d));
}

// printf from the device
__global__ void say(int v) { if (threadIdx.x == 0) printf("device says %d\n", v + blockIdx.x); }
static void devprintf() {
    say<<<2, 32>>>(40);
    CK(cudaDeviceSynchronize());
    std::printf("printf done\n");
}

struct Part { const char *name; void (*fn)(); };
static const Part parts[] = {
    {"managed", managed}, {"mapped", mapped}, {"hostfunc", hostfunc}, {"coop", coop}, {"cluster", cluster},
    {"bigsmem", bigsmem}, {"symbols", symbols}, {"mempool", mempool}, {"graphs", graphs},
    {"conditional", conditional}, {"cdp", cdp}, {"batch", batch}, {"events", events}, {"printf", devprintf},
};

int main(int argc, char **argv) {
    int ran = 0;
    for (const Part &p : parts) {
        bool want = argc < 2;
        for (int i = 1; i < argc; i++) want = want || std::strcmp(argv[i], p.name) == 0;
        if (!want) continue;
        p.fn();
        std::fflush(stdout);
        ran++;
    }
    if (!ran) { std::fprintf(stderr, "no such part\n"); return 2; }
    return 0;
}
