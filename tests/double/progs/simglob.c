/* simglob.c -- loads a PTX module (argv[1]) whose kernel glob_axpb reads a __device__ float
 * (g_scale, its initializer 2.0 in the image) and a __constant__ float[4] (c_bias, set here
 * through its address), launches it, sets g_scale through its address and launches again, and
 * reads back the data and c_bias. With "sass" it also looks up a global of a module that has no
 * PTX (a double image): a global a simulator cannot provide; with a second PTX file it runs its
 * fast_sin (approximate math) on the data and reads it back. */
#include <string.h>
#include "common.h"

enum { N = 1024, T = 128 };

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: simglob FILE.ptx [sass|SIN.ptx]\n"); return 2; }
    FILE *fp = fopen(argv[1], "rb");
    if (!fp) { perror(argv[1]); return 2; }
    static char ptx[1 << 16];
    size_t len = fread(ptx, 1, sizeof ptx - 1, fp);
    fclose(fp);
    ptx[len] = 0;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, ptx));
    CK(cuModuleGetFunction(&f, mod, "glob_axpb"));
    CUdeviceptr g_scale, c_bias, dx;
    size_t ns, nb;
    CK(cuModuleGetGlobal(&c_bias, &nb, mod, "c_bias"));
    CK(cuModuleGetGlobal(&g_scale, &ns, mod, "g_scale"));
    if (nb != 16 || ns != 4) { fprintf(stderr, "global sizes %zu %zu\n", nb, ns); return 1; }
    const float bias[4] = {0.5f, -1.25f, 3.0f, 0.125f};
    CK(cuMemcpyHtoD(c_bias, bias, sizeof bias));
    static float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)(i % 37) * 0.3f;
    CK(cuMemAlloc(&dx, sizeof x));
    CK(cuMemcpyHtoD(dx, x, sizeof x));
    int n = N;
    void *pa[] = {&dx, &n};
    LAUNCH(cuLaunchKernel(f, N / T, 1, 1, T, 1, 1, 0, NULL, pa, NULL));
    CK(cuMemcpyDtoH(x, dx, sizeof x));
    const float three = 3.0f;
    CK(cuMemcpyHtoD(g_scale, &three, sizeof three));
    LAUNCH(cuLaunchKernel(f, N / T, 1, 1, T, 1, 1, 0, NULL, pa, NULL));
    static float y[N];
    float back[4];
    CK(cuMemcpyDtoH(y, dx, sizeof y));
    CK(cuMemcpyDtoH(back, c_bias, sizeof back));
    if (argc > 2 && strcmp(argv[2], "sass") == 0) {
        static const char image[] = "CUDADOUBLE\nkernel add_one\nglobal g_table 64\n";
        CUmodule other;
        CUdeviceptr t;
        size_t tn;
        CK(cuModuleLoadData(&other, image));
        CK(cuModuleGetGlobal(&t, &tn, other, "g_table"));
        CK(cuMemsetD8(t, 7, tn));
    }
    if (argc > 2 && strstr(argv[2], ".ptx")) {
        static char text[1 << 16];
        FILE *sf = fopen(argv[2], "rb");
        if (!sf) { perror(argv[2]); return 2; }
        text[fread(text, 1, sizeof text - 1, sf)] = 0;
        fclose(sf);
        CUmodule sm;
        CUfunction fs;
        CK(cuModuleLoadData(&sm, text));
        CK(cuModuleGetFunction(&fs, sm, "fast_sin"));
        LAUNCH(cuLaunchKernel(fs, N / T, 1, 1, T, 1, 1, 0, NULL, pa, NULL));
        CK(cuMemcpyDtoH(y, dx, sizeof y));
    }
    printf("SIMGLOB %.4f %.4f %.3f\nLAUNCHES %ld\n", x[5], y[5], back[1], g_launches);
    return 0;
}
