/* capnodes.c -- a graph made by stream capture whose nodes the program asks for afterwards
 * (cuGraphGetNodes, cuGraphGetRootNodes, cuGraphNodeGetType, as CUDA's samples and graph
 * updaters do) to change one kernel node of the executable graph: capture memset a = 0, a host
 * function, add_one(a), fill(b, 5); launch; the fill node becomes fill(b, 9); launch again; a
 * stream callback after it. Prints "CAPNODES OK" when a = 1 and b = 9 after both launches and the
 * graph has its 4 nodes, and how many times host functions ran. */
#include <string.h>
#include "common.h"

enum { N = 256 };

static int host_calls;
static void host_fn(void *user) { host_calls += *(int *)user; }
static void stream_cb(CUstream s, CUresult st, void *user) { (void)s; if (st == CUDA_SUCCESS) host_calls += *(int *)user; }

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f_add, f_fill;
    CUdeviceptr a, b;
    CUstream s;
    CUgraph g;
    CUgraphExec ge;
    int n = N;
    unsigned five = 5, nine = 9;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&f_add, mod, "add_one"));
    CK(cuModuleGetFunction(&f_fill, mod, "fill"));
    CK(cuMemAlloc(&a, N * sizeof(float)));
    CK(cuMemAlloc(&b, N * sizeof(unsigned)));
    CK(cuStreamCreate(&s, 0));
    CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(cuMemsetD32Async(a, 0, N, s));
    static int one = 1;
    CK(cuLaunchHostFunc(s, host_fn, &one));
    void *args_add[] = {&a, &n};
    CK(cuLaunchKernel(f_add, 2, 1, 1, 128, 1, 1, 0, s, args_add, NULL));
    void *args_fill[] = {&b, &five, &n};
    CK(cuLaunchKernel(f_fill, 2, 1, 1, 128, 1, 1, 0, s, args_fill, NULL));
    CK(cuStreamEndCapture(s, &g));
    CK(cuGraphInstantiate(&ge, g, 0));
    CK(cuGraphLaunch(ge, s));

    size_t count = 0, roots = 0;
    CK(cuGraphGetNodes(g, NULL, &count));
    CK(cuGraphGetRootNodes(g, NULL, &roots));
    CUgraphNode nodes[8], root[8];
    if (count > 8 || roots > 8 || roots == 0) { printf("CAPNODES BAD count %zu roots %zu\n", count, roots); return 2; }
    CK(cuGraphGetNodes(g, nodes, &count));
    CK(cuGraphGetRootNodes(g, root, &roots));
    int kernels = 0, changed = 0;
    for (size_t i = 0; i < count; i++) {
        CUgraphNodeType t;
        CK(cuGraphNodeGetType(nodes[i], &t));
        if (t != CU_GRAPH_NODE_TYPE_KERNEL || ++kernels != 2) continue;
        CUDA_KERNEL_NODE_PARAMS kp;
        memset(&kp, 0, sizeof kp);
        void *args9[] = {&b, &nine, &n};
        kp.func = f_fill;
        kp.gridDimX = 2; kp.gridDimY = 1; kp.gridDimZ = 1;
        kp.blockDimX = 128; kp.blockDimY = 1; kp.blockDimZ = 1;
        kp.kernelParams = args9;
        CK(cuGraphExecKernelNodeSetParams(ge, nodes[i], &kp));
        changed = 1;
    }
    CK(cuGraphLaunch(ge, s));
    CK(cuStreamAddCallback(s, stream_cb, &one, 0));
    CK(cuStreamSynchronize(s));
    float ha[N];
    unsigned hb[N];
    CK(cuMemcpyDtoH(ha, a, sizeof ha));
    CK(cuMemcpyDtoH(hb, b, sizeof hb));
    int ok = changed && count == 4;
    for (int i = 0; i < N; i++) ok &= ha[i] == 1.0f && hb[i] == 9;
    CK(cuGraphExecDestroy(ge));
    CK(cuGraphDestroy(g));
    printf("HOST_CALLS %d\n", host_calls);
    printf("CAPNODES %s\n", ok ? "OK" : "BAD");
    return ok ? 0 : 2;
}
