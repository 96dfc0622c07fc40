/* reload.c -- handle values handed out again, as JIT autotuners cause by loading and unloading
 * modules by the thousand: each round loads a one-kernel module, launches its kernel and
 * unloads it; the double's allocator gives the next module's kernel the same handle value,
 * alternating between saxpy (4 parameters) and add_one (2). Then a function obtained through a
 * private path (double_private_get_function) is configured and launched, and the primary
 * context, reached through another (double_private_primary_ctx), is made current and used. */
#include <string.h>
#include "common.h"

CUresult double_private_get_function(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult double_private_primary_ctx(CUcontext *pctx, CUdevice dev);

int main(void) {
    enum { N = 256, ROUNDS = 8 };
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr x, y, c;
    float hx[N], hy[N];
    int hc[N], n = N, reused = 0;
    CUfunction prev = NULL;

    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuMemAlloc(&x, sizeof hx));
    CK(cuMemAlloc(&y, sizeof hy));
    CK(cuMemAlloc(&c, sizeof hc));
    for (int i = 0; i < N; i++) { hx[i] = (float)i; hy[i] = 1.0f; hc[i] = i; }
    CK(cuMemcpyHtoD(x, hx, sizeof hx));
    CK(cuMemcpyHtoD(y, hy, sizeof hy));
    CK(cuMemcpyHtoD(c, hc, sizeof hc));
    for (int round = 0; round < ROUNDS; round++) {
        CUmodule mod;
        CUfunction f;
        int saxpy = round % 2 == 0;
        CK(cuModuleLoadData(&mod, saxpy ? "CUDADOUBLE\nkernel saxpy\n" : "CUDADOUBLE\nkernel add_one\n"));
        CK(cuModuleGetFunction(&f, mod, saxpy ? "saxpy" : "add_one"));
        reused += f == prev;
        prev = f;
        float a = 0.5f;
        void *args_saxpy[] = {&a, &x, &y, &n};
        void *args_add[] = {&y, &n};
        LAUNCH(cuLaunchKernel(f, 1, 1, 1, N, 1, 1, 0, NULL, saxpy ? args_saxpy : args_add, NULL));
        CK(cuMemcpyDtoH(hy, y, sizeof hy));
        CK(cuModuleUnload(mod));
    }
    CUmodule mod;
    CUfunction hidden;
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(double_private_get_function(&hidden, mod, "incr"));
    CK(cuFuncSetAttribute(hidden, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024));
    void *args_incr[] = {&c, &n};
    LAUNCH(cuLaunchKernel(hidden, 1, 1, 1, N, 1, 1, 0, NULL, args_incr, NULL));
    CK(cuMemcpyDtoH(hc, c, sizeof hc));
    CUcontext primary;
    CUdeviceptr z;
    unsigned hz[N];
    CUcontext retained;
    CK(double_private_primary_ctx(&primary, dev));   /* as the CUDA runtime does: current first, */
    CK(cuCtxSetCurrent(primary));
    CK(cuDevicePrimaryCtxRetain(&retained, dev));    /* then retained */
    if (retained != primary) { fprintf(stderr, "primary context mismatch\n"); return 1; }
    CK(cuMemAlloc(&z, sizeof hz));
    CK(cuMemsetD32(z, 7u, N));
    CK(cuMemcpyDtoH(hz, z, sizeof hz));
    double sum = hz[N - 1];
    for (int i = 0; i < N; i++) sum += hy[i] + hc[i];
    printf("REUSED %d\nSUM %.3f\nLAUNCHES %ld\n", reused, sum, g_launches);
    return 0;
}
