/* texture.c -- CUDA arrays, 2D copies, texture and surface objects: a float array filled from
 * the host by a 2D copy and read by a kernel through a texture object; a texture over linear
 * device memory; a surface a kernel fills, read back by a 2D copy from the array. Prints
 * "TEX a LIN b SURF c" (checksums). */
#include <string.h>
#include "common.h"

enum { W = 64 };

static CUtexObject tex_of(const CUDA_RESOURCE_DESC *r) {
    CUDA_TEXTURE_DESC td;
    memset(&td, 0, sizeof td);
    CUtexObject t = 0;
    if (cuTexObjectCreate(&t, r, &td, NULL) != CUDA_SUCCESS) { fprintf(stderr, "cuTexObjectCreate failed\n"); exit(1); }
    return t;
}

static double sum_of(const float *p) {
    double s = 0;
    for (int i = 0; i < W; i++) s += p[i] * (i + 1);
    return s;
}

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fetch, fill;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, "CUDADOUBLE\nkernel tex_fetch\nkernel surf_fill\n"));
    CK(cuModuleGetFunction(&fetch, mod, "tex_fetch"));
    CK(cuModuleGetFunction(&fill, mod, "surf_fill"));
    float h[W], got[W];
    for (int i = 0; i < W; i++) h[i] = 0.5f * (float)i;
    CUDA_ARRAY_DESCRIPTOR ad = {W, 1, CU_AD_FORMAT_FLOAT, 1};
    CUarray arr, sarr;
    CK(cuArrayCreate(&arr, &ad));
    CK(cuArrayCreate(&sarr, &ad));
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_HOST; c.srcHost = h; c.srcPitch = sizeof h;
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY; c.dstArray = arr;
    c.WidthInBytes = sizeof h; c.Height = 1;
    CK(cuMemcpy2D(&c));
    CUDA_RESOURCE_DESC r;
    memset(&r, 0, sizeof r);
    r.resType = CU_RESOURCE_TYPE_ARRAY; r.res.array.hArray = arr;
    CUtexObject t = tex_of(&r);
    CUdeviceptr out, lin;
    CK(cuMemAlloc(&out, sizeof got));
    CK(cuMemAlloc(&lin, sizeof h));
    int n = W;
    void *a1[] = {&t, &out, &n};
    LAUNCH(cuLaunchKernel(fetch, 1, 1, 1, W, 1, 1, 0, NULL, a1, NULL));
    CK(cuMemcpyDtoH(got, out, sizeof got));
    double tex = sum_of(got);
    /* a texture over linear device memory */
    for (int i = 0; i < W; i++) h[i] = (float)(3 * i);
    CK(cuMemcpyHtoD(lin, h, sizeof h));
    memset(&r, 0, sizeof r);
    r.resType = CU_RESOURCE_TYPE_LINEAR; r.res.linear.devPtr = lin; r.res.linear.format = CU_AD_FORMAT_FLOAT;
    r.res.linear.numChannels = 1; r.res.linear.sizeInBytes = sizeof h;
    CUtexObject tl = tex_of(&r);
    void *a2[] = {&tl, &out, &n};
    LAUNCH(cuLaunchKernel(fetch, 1, 1, 1, W, 1, 1, 0, NULL, a2, NULL));
    CK(cuMemcpyDtoH(got, out, sizeof got));
    double linsum = sum_of(got);
    /* a surface a kernel fills, read back from its array */
    memset(&r, 0, sizeof r);
    r.resType = CU_RESOURCE_TYPE_ARRAY; r.res.array.hArray = sarr;
    CUsurfObject s = 0;
    CK(cuSurfObjectCreate(&s, &r));
    float v = 2.0f;
    void *a3[] = {&s, &v, &n};
    LAUNCH(cuLaunchKernel(fill, 1, 1, 1, W, 1, 1, 0, NULL, a3, NULL));
    memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY; c.srcArray = sarr;
    c.dstMemoryType = CU_MEMORYTYPE_HOST; c.dstHost = got; c.dstPitch = sizeof got;
    c.WidthInBytes = sizeof got; c.Height = 1;
    CK(cuMemcpy2D(&c));
    double surf = sum_of(got);
    /* a 3D copy: 2 slices of 4 rows of 8 floats from a pitched host buffer to device memory,
     * and back into another host layout */
    static float src3[2][6][10], dst3[2][4][8];
    for (int k = 0; k < 2; k++)
        for (int y = 0; y < 6; y++)
            for (int x = 0; x < 10; x++) src3[k][y][x] = (float)(100 * k + 10 * y + x);
    CUDA_MEMCPY3D c3;
    memset(&c3, 0, sizeof c3);
    c3.srcMemoryType = CU_MEMORYTYPE_HOST; c3.srcHost = src3; c3.srcPitch = 10 * sizeof(float); c3.srcHeight = 6;
    c3.srcXInBytes = sizeof(float); c3.srcY = 1;
    c3.dstMemoryType = CU_MEMORYTYPE_DEVICE; c3.dstDevice = lin; c3.dstPitch = 8 * sizeof(float); c3.dstHeight = 4;
    c3.WidthInBytes = 8 * sizeof(float); c3.Height = 4; c3.Depth = 2;
    CK(cuMemcpy3D(&c3));
    memset(&c3, 0, sizeof c3);
    c3.srcMemoryType = CU_MEMORYTYPE_DEVICE; c3.srcDevice = lin; c3.srcPitch = 8 * sizeof(float); c3.srcHeight = 4;
    c3.dstMemoryType = CU_MEMORYTYPE_HOST; c3.dstHost = dst3; c3.dstPitch = 8 * sizeof(float); c3.dstHeight = 4;
    c3.WidthInBytes = 8 * sizeof(float); c3.Height = 4; c3.Depth = 2;
    CK(cuMemcpy3D(&c3));
    double s3 = 0;
    for (int k = 0; k < 2; k++)
        for (int y = 0; y < 4; y++)
            for (int x = 0; x < 8; x++) s3 += dst3[k][y][x] * (x + 1);
    /* 1D copies: host -> array, array -> array, array -> device -> array, array -> host */
    float one[16], back[16];
    for (int i = 0; i < 16; i++) one[i] = (float)(7 * i + 1);
    CK(cuMemcpyHtoA(arr, 8 * sizeof(float), one, sizeof one));
    CK(cuMemcpyAtoA(sarr, 0, arr, 8 * sizeof(float), sizeof one));
    CK(cuMemcpyAtoD(out, sarr, 0, sizeof one));
    CK(cuMemcpyDtoA(arr, 32 * sizeof(float), out, sizeof one));
    CK(cuMemcpyAtoH(back, arr, 32 * sizeof(float), sizeof back));
    double s1 = 0;
    for (int i = 0; i < 16; i++) s1 += back[i] * (i + 1);
    printf("TEX %.1f LIN %.1f SURF %.1f C3D %.1f A1D %.1f\n", tex, linsum, surf, s3, s1);
    CK(cuSurfObjectDestroy(s));
    CK(cuTexObjectDestroy(tl));
    CK(cuTexObjectDestroy(t));
    CK(cuArrayDestroy(sarr));
    CK(cuArrayDestroy(arr));
    CK(cuMemFree(out));
    CK(cuMemFree(lin));
    return 0;
}
