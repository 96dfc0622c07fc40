/* graphnodes.c -- a CUDA graph built node by node (as XLA's command buffers build theirs), not
 * by stream capture: memset nodes (cuGraphAddMemsetNode, cuGraphAddNode), kernel nodes
 * (cuGraphAddKernelNode with kernelParams, cuGraphAddNode with the `extra` buffer form), empty
 * nodes, dependencies given at creation and by cuGraphAddDependencies.  The executable graph is
 * launched 3 times, one kernel node of it is changed (cuGraphExecKernelNodeSetParams) and it is
 * launched again; then a kernel node of the graph itself is changed
 * (cuGraphKernelNodeSetParams) and a second instantiation is launched.  Results are copied back
 * after each stage and checked.
 *
 * Graph: m0 memset a = 1.0f -> k1 add_one(a) ; m2 memset c = 7 (bytes) ; e3 empty after k1, m2
 *        -> k4 fill(b, 5) -> k5 add_one(a) (edge added later) -> e6 empty
 * One launch: a = 3, b = 5, c = 7. */
#include <string.h>
#include "common.h"

enum { N = 256, M = 64 };

static int check_f(const float *h, int n, float lo_val, int split, float hi_val, const char *what) {
    for (int i = 0; i < n; i++) {
        float want = i < split ? lo_val : hi_val;
        if (h[i] != want) {
            printf("BAD %s[%d] = %f, expected %f\n", what, i, h[i], want);
            return 0;
        }
    }
    return 1;
}

static int check_u(const unsigned *h, int n, unsigned v, const char *what) {
    for (int i = 0; i < n; i++)
        if (h[i] != v) {
            printf("BAD %s[%d] = %u, expected %u\n", what, i, h[i], v);
            return 0;
        }
    return 1;
}

static CUDA_KERNEL_NODE_PARAMS kparams(CUfunction f, unsigned grid, void **args, void **extra) {
    CUDA_KERNEL_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.func = f;
    p.gridDimX = grid; p.gridDimY = 1; p.gridDimZ = 1;
    p.blockDimX = 128; p.blockDimY = 1; p.blockDimZ = 1;
    p.kernelParams = args;
    p.extra = extra;
    return p;
}

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f_add, f_fill;
    CUdeviceptr a, b, c;
    CUstream s;
    CUgraph g;
    CUgraphExec ge, ge2;
    CUgraphNode m0, k1, m2, e3, k4, k5, e6;
    float ha[N];
    unsigned hb[N];
    unsigned char hc[M];
    int n = N, half = N / 2, ok = 1;
    long graph_launches = 0;

    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&f_add, mod, "add_one"));
    CK(cuModuleGetFunction(&f_fill, mod, "fill"));
    CK(cuMemAlloc(&a, N * sizeof(float)));
    CK(cuMemAlloc(&b, N * sizeof(unsigned)));
    CK(cuMemAlloc(&c, M));
    CK(cuStreamCreate(&s, 0));
    CK(cuGraphCreate(&g, 0));

    /* m0: a = 1.0f, 32-bit memset node */
    float one = 1.0f;
    CUDA_MEMSET_NODE_PARAMS ms;
    memset(&ms, 0, sizeof ms);
    ms.dst = a;
    memcpy(&ms.value, &one, 4);
    ms.elementSize = 4;
    ms.width = N;
    ms.height = 1;
    CK(cuGraphAddMemsetNode(&m0, g, NULL, 0, &ms, ctx));

    /* k1: add_one(a, N) after m0, kernelParams form */
    void *args_add[] = {&a, &n};
    CUDA_KERNEL_NODE_PARAMS kp1 = kparams(f_add, 2, args_add, NULL);
    CK(cuGraphAddKernelNode(&k1, g, &m0, 1, &kp1));

    /* m2: c = 7 (8-bit), through cuGraphAddNode */
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEMSET;
    np.memset.dst = c;
    np.memset.value = 7;
    np.memset.elementSize = 1;
    np.memset.width = M;
    np.memset.height = 1;
    CK(cuGraphAddNode(&m2, g, NULL, NULL, 0, &np));

    /* e3: empty, after k1 and m2 */
    CUgraphNode d3[] = {k1, m2};
    CK(cuGraphAddEmptyNode(&e3, g, d3, 2));

    /* k4: fill(b, 5, N) after e3, cuGraphAddNode with the `extra` buffer form */
    struct { CUdeviceptr p; unsigned v; int n; } fill_args = {b, 5, N};
    size_t fill_size = sizeof fill_args;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &fill_args, CU_LAUNCH_PARAM_BUFFER_SIZE, &fill_size,
                     CU_LAUNCH_PARAM_END};
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_KERNEL;
    np.kernel = kparams(f_fill, 2, NULL, extra);
    CK(cuGraphAddNode(&k4, g, &e3, NULL, 1, &np));

    /* k5: add_one(a, N), no dependency at creation; k4 -> k5 added after */
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_KERNEL;
    np.kernel = kparams(f_add, 2, args_add, NULL);
    CK(cuGraphAddNode(&k5, g, NULL, NULL, 0, &np));
    CK(cuGraphAddDependencies(g, &k4, &k5, NULL, 1));

    /* e6: empty, through cuGraphAddNode, after k5 */
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_EMPTY;
    CK(cuGraphAddNode(&e6, g, &k5, NULL, 1, &np));

    CK(cuGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; i++) {
        CK(cuGraphLaunch(ge, s));
        graph_launches++;
    }
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(ha, a, sizeof ha));
    CK(cuMemcpyDtoH(hb, b, sizeof hb));
    CK(cuMemcpyDtoH(hc, c, sizeof hc));
    ok &= check_f(ha, N, 3.0f, N, 3.0f, "a") && check_u(hb, N, 5, "b");
    for (int i = 0; i < M; i++) ok &= hc[i] == 7;

    /* the executable graph's k4 now fills 9: b = 9 */
    unsigned nine = 9;
    void *args_fill9[] = {&b, &nine, &n};
    CUDA_KERNEL_NODE_PARAMS kp4 = kparams(f_fill, 2, args_fill9, NULL);
    CK(cuGraphExecKernelNodeSetParams(ge, k4, &kp4));
    CK(cuGraphLaunch(ge, s));
    graph_launches++;
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(ha, a, sizeof ha));
    CK(cuMemcpyDtoH(hb, b, sizeof hb));
    ok &= check_f(ha, N, 3.0f, N, 3.0f, "a") && check_u(hb, N, 9, "b");

    /* the graph's k5 now adds one to the first half only; a second instantiation keeps k4's fill 5 */
    void *args_half[] = {&a, &half};
    CUDA_KERNEL_NODE_PARAMS kp5 = kparams(f_add, 2, args_half, NULL);
    CK(cuGraphKernelNodeSetParams(k5, &kp5));
    CK(cuGraphInstantiate(&ge2, g, 0));
    CK(cuGraphLaunch(ge2, s));
    graph_launches++;
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(ha, a, sizeof ha));
    CK(cuMemcpyDtoH(hb, b, sizeof hb));
    ok &= check_f(ha, N, 3.0f, N / 2, 2.0f, "a") && check_u(hb, N, 5, "b");

    CK(cuGraphExecDestroy(ge2));
    CK(cuGraphExecDestroy(ge));
    CK(cuGraphDestroy(g));
    CK(cuStreamDestroy(s));
    CK(cuMemFree(a));
    CK(cuMemFree(b));
    CK(cuMemFree(c));
    CK(cuModuleUnload(mod));
    CK(cuCtxDestroy(ctx));
    (void)e6;
    printf("GRAPHNODES %s\n", ok ? "OK" : "BAD");
    printf("GRAPH_LAUNCHES %ld\n", graph_launches);
    printf("LAUNCHES %ld\n", g_launches);
    return ok ? 0 : 2;
}
