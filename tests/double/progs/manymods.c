/* manymods.c -- a program of many modules and large buffers, for the size of an extract:
 * 6 modules (cuModuleLoadData) and 2 libraries (cuLibraryLoadData), each image padded with
 * 48 KiB of comment lines of its own, module 3 a fatbin of such images for sm_75, sm_80, sm_90
 * and sm_100 (the double loads its sm_90 entry), as libraries ship their kernels; 4 buffers of 1 MiB of pseudo-random floats that kernels
 * of every module work on; a VMM mapping add_one works on; a device table of pointers into two 4 KiB buffers that `chase`
 * reads through; then one small launch, add_one on a 4 KiB buffer (module 3) on a stream of its
 * own (the uploads ran on another, with an event), whose result
 * is read back with the rest. Prints MANYMODS OK when every value is as computed. */
#include <string.h>
#include "common.h"

enum { NM = 8, PAD = 48 << 10, NB = 4, BN = (1 << 20) / 4, SN = 1024 };

static unsigned long long rng = 0x9E3779B97F4A7C15ULL;
static unsigned next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (unsigned)(rng >> 16);
}

static char *image(int m) {
    char *img = malloc(PAD + 256), *p = img;
    p += sprintf(p, "CUDADOUBLE\nkernel add_one\nkernel saxpy\nkernel fill\nkernel chase\n");
    while (p - img < PAD) {
        *p++ = '#';
        for (int i = 0; i < 100; i++) *p++ = "0123456789abcdef"[next_u32() & 15];
        *p++ = '\n';
    }
    sprintf(p, "# module %d\n", m);
    return img;
}

/* a fatbin: header (magic, version, header size, entries' size), entries of a 64-byte header
 * (kind 2 = SASS, header size, payload size, arch @28) and a payload padded to 8 bytes */
static char *fatbin(int m, size_t *size) {
    static const unsigned archs[] = {75, 80, 90, 100};
    enum { NA = sizeof archs / sizeof archs[0] };
    unsigned char *fb = calloc(1, 16 + NA * (64 + PAD + 264)), *e = fb + 16;
    for (int i = 0; i < NA; i++) {
        char *img = image(m);
        unsigned long long n = (strlen(img) + 1 + 7) / 8 * 8;
        memset(e, 0, 64);
        *(unsigned short *)e = 2;
        *(unsigned *)(e + 4) = 64;
        *(unsigned long long *)(e + 8) = n;
        *(unsigned *)(e + 28) = archs[i];
        memcpy(e + 64, img, strlen(img) + 1);
        free(img);
        e += 64 + n;
    }
    *(unsigned *)fb = 0xBA55ED50u;
    *(unsigned short *)(fb + 4) = 1;
    *(unsigned short *)(fb + 6) = 16;
    *(unsigned long long *)(fb + 8) = (unsigned long long)(e - fb - 16);
    *size = (size_t)(e - fb);
    return (char *)fb;
}

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUfunction add_one[NM], saxpy[NM], fill[NM], chase[NM];
    CUdeviceptr big[NB], small, table, out, leaf[2];
    static float host[NB][BN], want[NB][BN], got[NB][BN];
    float hs[SN], gs[SN];

    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    for (int m = 0; m < NM; m++) {
        size_t fsize;
        char *img = m == 3 ? fatbin(m, &fsize) : image(m);
        if (m < 6) {
            CUmodule mod;
            CK(cuModuleLoadData(&mod, img));
            CK(cuModuleGetFunction(&add_one[m], mod, "add_one"));
            CK(cuModuleGetFunction(&saxpy[m], mod, "saxpy"));
            CK(cuModuleGetFunction(&fill[m], mod, "fill"));
            CK(cuModuleGetFunction(&chase[m], mod, "chase"));
        } else {
            CUlibrary lib;
            CUkernel k;
            CK(cuLibraryLoadData(&lib, img, NULL, NULL, 0, NULL, NULL, 0));
            CK(cuLibraryGetKernel(&k, lib, "add_one"));
            add_one[m] = (CUfunction)k;
            CK(cuLibraryGetKernel(&k, lib, "saxpy"));
            saxpy[m] = (CUfunction)k;
            CK(cuLibraryGetKernel(&k, lib, "fill"));
            fill[m] = (CUfunction)k;
            CK(cuLibraryGetKernel(&k, lib, "chase"));
            chase[m] = (CUfunction)k;
        }
        free(img);
    }
    CUstream up, work;                   /* uploads on one stream (with an event), the small launch on another */
    CUevent uploaded;
    CK(cuStreamCreate(&up, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&work, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&uploaded, 0));
    for (int b = 0; b < NB; b++) {
        CK(cuMemAlloc(&big[b], sizeof host[b]));
        for (int i = 0; i < BN; i++) host[b][i] = (float)(next_u32() % 100000) / 64.0f;
        CK(cuMemcpyHtoDAsync(big[b], host[b], sizeof host[b], up));
    }
    CK(cuEventRecord(uploaded, up));
    CK(cuEventSynchronize(uploaded));
    memcpy(want, host, sizeof want);
    int n = BN;
    for (int m = 0; m < NM; m++) {      /* every module's kernels on the large buffers */
        int x = m % NB, y = (m + 1) % NB;
        float a = 0.5f;
        void *sa[] = {&a, &big[x], &big[y], &n};
        LAUNCH(cuLaunchKernel(saxpy[m], BN / 256, 1, 1, 256, 1, 1, 0, NULL, sa, NULL));
        for (int i = 0; i < BN; i++) want[y][i] = 0.5f * want[x][i] + want[y][i];
        void *ad[] = {&big[x], &n};
        LAUNCH(cuLaunchKernel(add_one[m], BN / 256, 1, 1, 256, 1, 1, 0, NULL, ad, NULL));
        for (int i = 0; i < BN; i++) want[x][i] += 1.0f;
    }
    /* a VMM mapping (reserve, create, map, set access) that add_one of module 1 works on */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t vsize = 0;
    CUdeviceptr va;
    CUmemGenericAllocationHandle vh;
    CK(cuMemGetAllocationGranularity(&vsize, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    CK(cuMemAddressReserve(&va, vsize, 0, 0, 0));
    CK(cuMemCreate(&vh, vsize, &prop, 0));
    CK(cuMemMap(va, vsize, 0, vh, 0));
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CK(cuMemSetAccess(va, vsize, &acc, 1));
    CK(cuMemcpyHtoD(va, host[0], 65536));
    int vn = 65536 / 4;
    void *vp[] = {&va, &vn};
    LAUNCH(cuLaunchKernel(add_one[1], vn / 256, 1, 1, 256, 1, 1, 0, NULL, vp, NULL));
    float vback[4];
    CK(cuMemcpyDtoH(vback, va, sizeof vback));
    /* a pointer table: chase reads out[i] = *table[i], through pointers stored in device memory */
    unsigned long long marks[2] = {0xC0DE0001ULL, 0xC0DE0002ULL}, ptrs[2], vals[2];
    for (int i = 0; i < 2; i++) {
        CK(cuMemAlloc(&leaf[i], 4096));
        CK(cuMemcpyHtoD(leaf[i], &marks[i], sizeof marks[i]));
        ptrs[i] = leaf[i];
    }
    CK(cuMemAlloc(&table, sizeof ptrs));
    CK(cuMemAlloc(&out, sizeof vals));
    CK(cuMemcpyHtoD(table, ptrs, sizeof ptrs));
    int two = 2;
    void *ch[] = {&table, &out, &two};
    LAUNCH(cuLaunchKernel(chase[5], 1, 1, 1, 32, 1, 1, 0, NULL, ch, NULL));
    /* the small launch */
    CK(cuMemAlloc(&small, sizeof hs));
    for (int i = 0; i < SN; i++) hs[i] = (float)i;
    CK(cuMemcpyHtoD(small, hs, sizeof hs));
    int sn = SN;
    void *sm[] = {&small, &sn};
    LAUNCH(cuLaunchKernel(add_one[3], SN / 256, 1, 1, 256, 1, 1, 0, work, sm, NULL));
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH(gs, small, sizeof gs));
    CK(cuMemcpyDtoH(vals, out, sizeof vals));
    int ok = vals[0] == marks[0] && vals[1] == marks[1] && vback[0] == host[0][0] + 1.0f;
    for (int i = 0; i < SN; i++) ok &= gs[i] == (float)i + 1.0f;
    for (int b = 0; b < NB; b++) {
        CK(cuMemcpyDtoH(got[b], big[b], sizeof got[b]));
        ok &= memcmp(got[b], want[b], sizeof got[b]) == 0;
    }
    for (int b = 0; b < NB; b++) CK(cuMemFree(big[b]));
    CK(cuDevicePrimaryCtxRelease(dev));
    printf("MANYMODS %s\n", ok ? "OK" : "BAD");
    printf("LAUNCHES %ld\n", g_launches);
    return ok ? 0 : 2;
}
