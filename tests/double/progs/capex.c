/* capex.c -- a stream capture whose kernels come through both launch calls: cuLaunchKernel
 * (stream argument) and cuLaunchKernelEx (stream inside the launch configuration). The graph
 * (add_one, then saxpy y = 2*p + y) is launched three times, each result read back. */
#include <string.h>
#include "common.h"

#define N 256

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f_add, f_saxpy;
    CUdeviceptr p, y;
    CUstream s;
    CUgraph g;
    CUgraphExec ge;
    float hp[N], hy[N];
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&f_add, mod, "add_one"));
    CK(cuModuleGetFunction(&f_saxpy, mod, "saxpy"));
    CK(cuMemAlloc(&p, N * sizeof(float)));
    CK(cuMemAlloc(&y, N * sizeof(float)));
    for (int i = 0; i < N; i++) hp[i] = (float)i, hy[i] = 1.0f;
    CK(cuMemcpyHtoD(p, hp, sizeof hp));
    CK(cuMemcpyHtoD(y, hy, sizeof hy));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    int n = N;
    float a = 2.0f;
    void *a_add[] = {&p, &n};
    void *a_saxpy[] = {&a, &p, &y, &n};
    CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    LAUNCH(cuLaunchKernel(f_add, 1, 1, 1, N, 1, 1, 0, s, a_add, NULL));
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = N; cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = s;
    LAUNCH(cuLaunchKernelEx(&cfg, f_saxpy, a_saxpy, NULL));
    CK(cuStreamEndCapture(s, &g));
    CK(cuGraphInstantiate(&ge, g, 0));
    for (int k = 0; k < 3; k++) {
        CK(cuGraphLaunch(ge, s));
        CK(cuStreamSynchronize(s));
        CK(cuMemcpyDtoH(hy, y, sizeof hy));
        printf("launch %d: y[1] = %.1f\n", k, hy[1]);
    }
    CK(cuGraphExecDestroy(ge));
    CK(cuGraphDestroy(g));
    return 0;
}
