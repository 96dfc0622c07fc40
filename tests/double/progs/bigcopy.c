/* bigcopy.c -- large host payloads: a 21 MiB buffer (5 whole 4 MiB chunks and a 1 MiB
 * tail) copied to the device twice unchanged, then again with one byte of its third chunk
 * changed, then read back. Writes the two versions it uploaded to argv[1]/v1.bin and
 * argv[1]/v2.bin so a test can compare them with what the snapshot holds. */
#include <stdint.h>
#include <string.h>
#include "common.h"

static void save(const char *dir, const char *name, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) { perror(path); exit(2); }
    fclose(f);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    const size_t n = (21u << 20);
    uint64_t *h = malloc(n), *back = malloc(n), x = 88172645463325252ull;
    for (size_t i = 0; i < n / 8; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; h[i] = x; }
    CUdevice dev; CUcontext ctx; CUdeviceptr d;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuMemAlloc(&d, n));
    CK(cuMemcpyHtoD(d, h, n));
    CK(cuMemcpyHtoD(d, h, n));
    save(dir, "v1.bin", h, n);
    ((unsigned char *)h)[(9u << 20) + 5] ^= 0xFF;
    CK(cuMemcpyHtoD(d, h, n));
    save(dir, "v2.bin", h, n);
    CK(cuMemcpyDtoH(back, d, n));
    printf("MATCH %d\n", memcmp(back, h, n) == 0);
    CK(cuMemFree(d));
    CK(cuCtxDestroy(ctx));
    free(h); free(back);
    return 0;
}
