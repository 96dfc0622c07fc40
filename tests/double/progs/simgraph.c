/* simgraph.c -- loads a PTX module (argv[1], as simprog) and captures fill, add_one and an async
 * copy between buffers into a graph on a stream, launches the graph twice, then reads both
 * buffers back: a graph a simulator must run as its work in order. */
#include <string.h>
#include "common.h"

enum { N = 2048, T = 256 };

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: simgraph FILE.ptx\n"); return 2; }
    FILE *fp = fopen(argv[1], "rb");
    if (!fp) { perror(argv[1]); return 2; }
    static char ptx[1 << 16];
    size_t len = fread(ptx, 1, sizeof ptx - 1, fp);
    fclose(fp);
    ptx[len] = 0;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f_fill, f_add;
    CUstream s;
    CUgraph g;
    CUgraphExec ge;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, ptx));
    CK(cuModuleGetFunction(&f_fill, mod, "fill"));
    CK(cuModuleGetFunction(&f_add, mod, "add_one"));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    static float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)(i % 31);
    CUdeviceptr du, dx, dy;
    CK(cuMemAlloc(&du, N * 4));
    CK(cuMemAlloc(&dx, N * 4));
    CK(cuMemAlloc(&dy, N * 4));
    CK(cuMemcpyHtoD(dx, x, sizeof x));
    int n = N;
    unsigned v = 0xBEEF;
    void *pf[] = {&du, &v, &n};
    void *pa[] = {&dx, &n};
    CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    LAUNCH(cuLaunchKernel(f_fill, N / T, 1, 1, T, 1, 1, 0, s, pf, NULL));
    LAUNCH(cuLaunchKernel(f_add, N / T, 1, 1, T, 1, 1, 0, s, pa, NULL));
    CK(cuMemcpyDtoDAsync(dy, dx, N * 4, s));
    CK(cuStreamEndCapture(s, &g));
    CK(cuGraphInstantiate(&ge, g, 0));
    CK(cuGraphLaunch(ge, s));
    CK(cuGraphLaunch(ge, s));
    CK(cuStreamSynchronize(s));
    static unsigned u[N];
    static float y[N];
    CK(cuMemcpyDtoH(u, du, sizeof u));
    CK(cuMemcpyDtoH(y, dy, sizeof y));
    CK(cuGraphExecDestroy(ge));
    CK(cuGraphDestroy(g));
    double sum = 0;
    for (int i = 0; i < N; i++) sum += y[i];
    printf("SIMGRAPH %u %.0f\nLAUNCHES %ld\n", u[7], sum, g_launches);
    return 0;
}
