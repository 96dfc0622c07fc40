/* launch_forms.c -- every launch form: kernelParams, the `extra` buffer form,
 * cuLaunchKernelEx with a cluster attribute, CUkernel handles from
 * cuLibraryGetKernel cast to CUfunction, cuKernelGetFunction, a cooperative launch
 * and a captured stream replayed as a graph (twice). */
#include <string.h>
#include "common.h"

int main(void) {
    enum { N = 512 };
    float hp[N], hy[N];
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUlibrary lib;
    CUfunction f_fill, f_add, f_saxpy;
    CUkernel k_add, k_saxpy;
    CUdeviceptr p, y;
    CUstream s;
    int n = N;
    long graph_launches = 0;

    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuMemAlloc(&p, N * sizeof(float)));
    CK(cuMemAlloc(&y, N * sizeof(float)));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&f_fill, mod, "fill"));
    CK(cuModuleGetFunction(&f_add, mod, "add_one"));

    /* 1. kernelParams: fill p with 7.0f bits, y with 1.0f bits */
    unsigned v7, v1;
    float f7 = 7.0f, f1 = 1.0f;
    memcpy(&v7, &f7, 4);
    memcpy(&v1, &f1, 4);
    void *a_fill_p[] = {&p, &v7, &n};
    void *a_fill_y[] = {&y, &v1, &n};
    LAUNCH(cuLaunchKernel(f_fill, 2, 1, 1, 256, 1, 1, 0, NULL, a_fill_p, NULL));
    LAUNCH(cuLaunchKernel(f_fill, 2, 1, 1, 256, 1, 1, 0, NULL, a_fill_y, NULL));

    /* 2. extra buffer form: add_one(p, n) -> 8 */
    struct { CUdeviceptr p; int n; int pad; } pk = {p, N, 0};
    size_t pk_size = sizeof pk;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &pk, CU_LAUNCH_PARAM_BUFFER_SIZE, &pk_size, CU_LAUNCH_PARAM_END};
    LAUNCH(cuLaunchKernel(f_add, 2, 1, 1, 256, 1, 1, 0, NULL, NULL, extra));

    /* 3. cuLaunchKernelEx with a cluster dimension attribute -> 9 */
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = 2;
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = 4; cfg.gridDimY = 1; cfg.gridDimZ = 1;
    cfg.blockDimX = 128; cfg.blockDimY = 1; cfg.blockDimZ = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    void *a_add[] = {&p, &n};
    LAUNCH(cuLaunchKernelEx(&cfg, f_add, a_add, NULL));

    /* 4. library kernels: CUkernel cast to CUfunction -> 10; cuKernelGetFunction saxpy */
    CK(cuLibraryLoadData(&lib, MODULE_TEXT, NULL, NULL, 0, NULL, NULL, 0));
    CK(cuLibraryGetKernel(&k_add, lib, "add_one"));
    CK(cuLibraryGetKernel(&k_saxpy, lib, "saxpy"));
    LAUNCH(cuLaunchKernel((CUfunction)k_add, 2, 1, 1, 256, 1, 1, 0, NULL, a_add, NULL));
    for (size_t i = 0;; i++) {
        size_t off, size;
        if (cuKernelGetParamInfo(k_saxpy, i, &off, &size) != CUDA_SUCCESS) break;
        printf("PARAM %zu %zu %zu\n", i, off, size);
    }

    /* 5. cooperative launch -> 11 */
    LAUNCH(cuLaunchCooperativeKernel(f_add, 2, 1, 1, 256, 1, 1, 0, NULL, a_add));

    /* 6. captured stream, replayed twice as a graph -> 13 */
    CUgraph g;
    CUgraphExec ge;
    CK(cuStreamCreate(&s, 0));
    CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    LAUNCH(cuLaunchKernel(f_add, 2, 1, 1, 256, 1, 1, 0, s, a_add, NULL));
    CK(cuStreamEndCapture(s, &g));
    CK(cuGraphInstantiate(&ge, g, 0));
    CK(cuGraphLaunch(ge, s)); graph_launches++;
    CK(cuGraphLaunch(ge, s)); graph_launches++;
    CK(cuStreamSynchronize(s));

    /* 7. saxpy via cuKernelGetFunction: y = 2*p + y = 27 */
    CK(cuKernelGetFunction(&f_saxpy, k_saxpy));
    CK(cuMemcpyDtoH(hp, p, sizeof hp));     /* work between the lookup and its first launch */
    float a = 2.0f;
    void *a_saxpy[] = {&a, &p, &y, &n};
    LAUNCH(cuLaunchKernel(f_saxpy, 2, 1, 1, 256, 1, 1, 0, NULL, a_saxpy, NULL));

    CK(cuMemcpyDtoH(hp, p, sizeof hp));
    CK(cuMemcpyDtoH(hy, y, sizeof hy));
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= hp[i] == 13.0f && hy[i] == 27.0f;
    printf("P %.1f Y %.1f\n", hp[0], hy[N - 1]);
    CK(cuGraphExecDestroy(ge));
    CK(cuGraphDestroy(g));
    CK(cuStreamDestroy(s));
    CK(cuLibraryUnload(lib));
    CK(cuModuleUnload(mod));
    CK(cuMemFree(p));
    CK(cuMemFree(y));
    CK(cuCtxDestroy(ctx));
    printf("FORMS %s\n", ok ? "OK" : "BAD");
    printf("GRAPH_LAUNCHES %ld\n", graph_launches);
    printf("LAUNCHES %ld\n", g_launches);
    return ok ? 0 : 2;
}
