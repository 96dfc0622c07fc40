/* xlaprog.c -- as a JAX/XLA program compiles and runs a module: writes each module's PTX into
 * the directory XLA_FLAGS' --xla_dump_to names (the last one, as XLA takes it), loads the cubin
 * compiled from it (cuModuleLoadData) and runs fill, add_one and saxpy, reading every result back.
 *   xlaprog CUBIN [NAME=FILE | after:NAME=FILE]...
 * NAME=FILE: FILE copied to DIR/NAME before the load (XLA dumps a module's PTX before ptxas
 * compiles it); after:NAME=FILE: after the load (a later compilation). Prints XLA_FLAGS. */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "common.h"

enum { N = 4096, T = 256, NB = 16 };

static char dump_dir[4096];

static void find_dump_dir(const char *flags) {
    const char *key = "--xla_dump_to=", *p = flags;
    while (p && (p = strstr(p, key))) {
        p += strlen(key);
        size_t n = strcspn(p, " \t\n");
        if (n >= sizeof dump_dir) n = sizeof dump_dir - 1;
        memcpy(dump_dir, p, n);
        dump_dir[n] = 0;
    }
}

static void dump(const char *spec) {
    char name[512];
    const char *eq = strchr(spec, '=');
    if (!eq || (size_t)(eq - spec) >= sizeof name) { fprintf(stderr, "bad NAME=FILE: %s\n", spec); exit(2); }
    memcpy(name, spec, eq - spec);
    name[eq - spec] = 0;
    if (!dump_dir[0]) return;                     /* no dump asked for: XLA writes nothing */
    mkdir(dump_dir, 0777);
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dump_dir, name);
    FILE *in = fopen(eq + 1, "rb"), *out = fopen(path, "wb");
    if (!in || !out) { perror(in ? path : eq + 1); exit(2); }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    fclose(in);
    fclose(out);
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: xlaprog CUBIN [NAME=FILE | after:NAME=FILE]...\n"); return 2; }
    const char *flags = getenv("XLA_FLAGS");
    printf("XLA_FLAGS=%s\n", flags ? flags : "");
    find_dump_dir(flags);
    for (int i = 2; i < argc; i++)
        if (strncmp(argv[i], "after:", 6) != 0) dump(argv[i]);
    FILE *fp = fopen(argv[1], "rb");
    if (!fp) { perror(argv[1]); return 2; }
    static char image[1 << 16];
    size_t len = fread(image, 1, sizeof image, fp);
    fclose(fp);
    if (len == 0) { fprintf(stderr, "%s: empty\n", argv[1]); return 2; }

    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f_fill, f_add, f_saxpy;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, image));
    usleep(30000);                      /* past the file system's coarse clock tick */
    for (int i = 2; i < argc; i++)
        if (strncmp(argv[i], "after:", 6) == 0) dump(argv[i] + 6);
    CK(cuModuleGetFunction(&f_fill, mod, "fill"));
    CK(cuModuleGetFunction(&f_add, mod, "add_one"));
    CK(cuModuleGetFunction(&f_saxpy, mod, "saxpy"));

    static float x[N], y[N];
    static unsigned ru[N];
    for (int i = 0; i < N; i++) { x[i] = (float)(i % 97); y[i] = (float)(i % 13); }
    CUdeviceptr dx, dy, du;
    CK(cuMemAlloc(&dx, sizeof x));
    CK(cuMemAlloc(&dy, sizeof y));
    CK(cuMemAlloc(&du, sizeof ru));
    CK(cuMemcpyHtoD(dx, x, sizeof x));
    CK(cuMemcpyHtoD(dy, y, sizeof y));
    int n = N;
    unsigned v = 0xC0FFEE;
    float a = 3.0f;
    void *pf[] = {&du, &v, &n};
    LAUNCH(cuLaunchKernel(f_fill, NB, 1, 1, T, 1, 1, 0, NULL, pf, NULL));
    void *pa[] = {&dx, &n};
    LAUNCH(cuLaunchKernel(f_add, NB, 1, 1, T, 1, 1, 0, NULL, pa, NULL));
    void *ps[] = {&a, &dx, &dy, &n};
    LAUNCH(cuLaunchKernel(f_saxpy, NB, 1, 1, T, 1, 1, 0, NULL, ps, NULL));
    CK(cuMemcpyDtoH(ru, du, sizeof ru));
    CK(cuMemcpyDtoH(x, dx, sizeof x));
    CK(cuMemcpyDtoH(y, dy, sizeof y));
    int ok = ru[5] == v && x[5] == 6.0f && y[5] == 3.0f * 6.0f + 5.0f;
    CK(cuModuleUnload(mod));
    printf("XLAPROG %s\n", ok ? "OK" : "BAD");
    return ok ? 0 : 2;
}
