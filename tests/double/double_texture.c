/* double_texture.c -- CUDA arrays, 2D copies, texture and surface objects of the cudasnap CUDA
 * driver TEST DOUBLE. An array is host memory (rows of Width elements); a texture or surface
 * object is a small integer naming an entry of a table, as the driver's handles are; kernels
 * read and write through texture_bytes (tex_fetch, surf_fill in double_launch.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "double_internal.h"

struct array_obj { int type; size_t w, h, d, elem; unsigned char *data; };

static size_t format_bytes(unsigned f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

static CUresult array_new(CUarray *out, size_t w, size_t h, size_t d, unsigned fmt, unsigned ch) {
    CUresult r = need_ctx();
    if (r) return r;
    size_t e = format_bytes(fmt) * ch;
    if (!out || !w || !e || (ch != 1 && ch != 2 && ch != 4)) return CUDA_ERROR_INVALID_VALUE;
    struct array_obj *a = obj_new(OBJ_ARRAY, sizeof *a);
    a->w = w; a->h = h ? h : 1; a->d = d ? d : 1; a->elem = e;
    a->data = calloc(a->w * a->h * a->d, e);
    if (!a->data) { obj_free(a); return CUDA_ERROR_OUT_OF_MEMORY; }
    *out = (CUarray)a;
    return CUDA_SUCCESS;
}

API CUresult cuArrayCreate_v2(CUarray *p, const CUDA_ARRAY_DESCRIPTOR *d) {
    return d ? array_new(p, d->Width, d->Height, 1, d->Format, d->NumChannels) : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuArray3DCreate_v2(CUarray *p, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    return d ? array_new(p, d->Width, d->Height, d->Depth, d->Format, d->NumChannels) : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuArrayDestroy(CUarray a) {
    CUresult r = need_init();
    if (r) return r;
    if (!obj_check(a, OBJ_ARRAY)) return CUDA_ERROR_INVALID_HANDLE;
    free(((struct array_obj *)a)->data);
    obj_free(a);
    return CUDA_SUCCESS;
}

/* Row y of one side of a 2D copy, or NULL when it falls outside its memory. */
static unsigned char *row_of(unsigned mt, const void *host, CUdeviceptr dev, CUarray arr, size_t pitch, size_t x,
                             size_t y, size_t width) {
    switch (mt) {
    case CU_MEMORYTYPE_HOST:
        return (unsigned char *)host + y * pitch + x;
    case CU_MEMORYTYPE_DEVICE: case CU_MEMORYTYPE_UNIFIED: {
        unsigned long long p = dev + y * pitch + x;
        return dev_range_ok(p, width) ? (unsigned char *)(uintptr_t)p : NULL;
    }
    case CU_MEMORYTYPE_ARRAY: {
        struct array_obj *a = (struct array_obj *)arr;
        size_t rb = a->w * a->elem;
        if (!obj_check(a, OBJ_ARRAY) || y >= a->h * a->d || x + width > rb) return NULL;
        return a->data + y * rb + x;
    }
    default:
        return NULL;
    }
}

static CUresult copy2d(const CUDA_MEMCPY2D *c) {
    CUresult r = need_ctx();
    if (r) return r;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    for (size_t y = 0; y < c->Height; y++) {
        unsigned char *s = row_of(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray, c->srcPitch, c->srcXInBytes,
                                  c->srcY + y, c->WidthInBytes);
        unsigned char *d = row_of(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->dstPitch, c->dstXInBytes,
                                  c->dstY + y, c->WidthInBytes);
        if (!s || !d) return CUDA_ERROR_INVALID_VALUE;
        memmove(d, s, c->WidthInBytes);
    }
    return CUDA_SUCCESS;
}

API CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *c) { return copy2d(c); }
API CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *c) { return copy2d(c); }
API CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *c, CUstream s) {
    CUresult r = stream_validate(s);
    return r ? r : copy2d(c);
}

/* 3D copies: slices of rows; a side's row r of slice k is row k * (its slice height) + r, an
 * array's slices being its Height rows each */
static CUresult copy3d(const CUDA_MEMCPY3D *c) {
    CUresult r = need_ctx();
    if (r) return r;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    for (size_t z = 0; z < c->Depth; z++)
        for (size_t y = 0; y < c->Height; y++) {
            size_t sh = c->srcMemoryType == CU_MEMORYTYPE_ARRAY ? ((struct array_obj *)c->srcArray)->h
                                                                : (c->srcHeight ? c->srcHeight : c->Height);
            size_t dh = c->dstMemoryType == CU_MEMORYTYPE_ARRAY ? ((struct array_obj *)c->dstArray)->h
                                                                : (c->dstHeight ? c->dstHeight : c->Height);
            if ((c->srcMemoryType == CU_MEMORYTYPE_ARRAY && !obj_check(c->srcArray, OBJ_ARRAY)) ||
                (c->dstMemoryType == CU_MEMORYTYPE_ARRAY && !obj_check(c->dstArray, OBJ_ARRAY)))
                return CUDA_ERROR_INVALID_HANDLE;
            unsigned char *s = row_of(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray, c->srcPitch,
                                      c->srcXInBytes, (c->srcZ + z) * sh + c->srcY + y, c->WidthInBytes);
            unsigned char *d = row_of(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->dstPitch,
                                      c->dstXInBytes, (c->dstZ + z) * dh + c->dstY + y, c->WidthInBytes);
            if (!s || !d) return CUDA_ERROR_INVALID_VALUE;
            memmove(d, s, c->WidthInBytes);
        }
    return CUDA_SUCCESS;
}

API CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *c) { return copy3d(c); }
API CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *c, CUstream s) {
    CUresult r = stream_validate(s);
    return r ? r : copy3d(c);
}

/* 1D copies: an array as bytes from an offset */
static unsigned char *array_at(CUarray arr, size_t off, size_t n) {
    struct array_obj *a = (struct array_obj *)arr;
    if (!obj_check(a, OBJ_ARRAY) || off + n > a->w * a->h * a->d * a->elem) return NULL;
    return a->data + off;
}

static CUresult copy1d(unsigned char *d, const unsigned char *s, size_t n) {
    CUresult r = need_ctx();
    if (r) return r;
    if (!d || !s) return CUDA_ERROR_INVALID_VALUE;
    memmove(d, s, n);
    return CUDA_SUCCESS;
}

static unsigned char *dev_at(CUdeviceptr p, size_t n) { return dev_range_ok(p, n) ? (unsigned char *)(uintptr_t)p : NULL; }

API CUresult cuMemcpyHtoA_v2(CUarray dst, size_t off, const void *src, size_t n) {
    return copy1d(array_at(dst, off, n), src, n);
}
API CUresult cuMemcpyHtoAAsync_v2(CUarray dst, size_t off, const void *src, size_t n, CUstream s) {
    CUresult r = stream_validate(s);
    return r ? r : cuMemcpyHtoA_v2(dst, off, src, n);
}
API CUresult cuMemcpyAtoH_v2(void *dst, CUarray src, size_t off, size_t n) { return copy1d(dst, array_at(src, off, n), n); }
API CUresult cuMemcpyAtoHAsync_v2(void *dst, CUarray src, size_t off, size_t n, CUstream s) {
    CUresult r = stream_validate(s);
    return r ? r : cuMemcpyAtoH_v2(dst, src, off, n);
}
API CUresult cuMemcpyDtoA_v2(CUarray dst, size_t off, CUdeviceptr src, size_t n) {
    return copy1d(array_at(dst, off, n), dev_at(src, n), n);
}
API CUresult cuMemcpyAtoD_v2(CUdeviceptr dst, CUarray src, size_t off, size_t n) {
    return copy1d(dev_at(dst, n), array_at(src, off, n), n);
}
API CUresult cuMemcpyAtoA_v2(CUarray dst, size_t doff, CUarray src, size_t soff, size_t n) {
    return copy1d(array_at(dst, doff, n), array_at(src, soff, n), n);
}

/* texture and surface objects: entries 1..MAXOBJ (0 is no object); an object's value is its
 * entry plus DOUBLE_TEX_BASE (default 0: a driver that hands values out in another order) */
enum { MAXOBJ = 256 };
static unsigned long long obj_base(void) {
    const char *e = getenv("DOUBLE_TEX_BASE");
    return e ? strtoull(e, NULL, 0) : 0;
}
static struct { int used, surface; struct array_obj *arr; CUdeviceptr ptr; size_t n; } objs[MAXOBJ + 1];

static CUresult object_new(unsigned long long *out, const CUDA_RESOURCE_DESC *r, int surface) {
    CUresult e = need_ctx();
    if (e) return e;
    if (!out || !r) return CUDA_ERROR_INVALID_VALUE;
    struct array_obj *arr = NULL;
    CUdeviceptr ptr = 0;
    size_t n = 0;
    if (r->resType == CU_RESOURCE_TYPE_ARRAY) {
        arr = (struct array_obj *)r->res.array.hArray;
        if (!obj_check(arr, OBJ_ARRAY)) return CUDA_ERROR_INVALID_HANDLE;
        n = arr->w * arr->h * arr->d * arr->elem;
    } else if (!surface && r->resType == CU_RESOURCE_TYPE_LINEAR) {
        ptr = r->res.linear.devPtr;
        n = r->res.linear.sizeInBytes;
        if (!dev_range_ok(ptr, n)) return CUDA_ERROR_INVALID_VALUE;
    } else {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    LOCK();
    for (unsigned long long i = 1; i <= MAXOBJ; i++)
        if (!objs[i].used) {
            objs[i].used = 1; objs[i].surface = surface; objs[i].arr = arr; objs[i].ptr = ptr; objs[i].n = n;
            UNLOCK();
            *out = i + obj_base();
            return CUDA_SUCCESS;
        }
    UNLOCK();
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult object_free(unsigned long long o, int surface) {
    CUresult e = need_init();
    if (e) return e;
    o -= obj_base();
    LOCK();
    int ok = o >= 1 && o <= MAXOBJ && objs[o].used && objs[o].surface == surface;
    if (ok) objs[o].used = 0;
    UNLOCK();
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

unsigned char *texture_bytes(unsigned long long o, int surface, size_t *n) {
    o -= obj_base();
    if (o < 1 || o > MAXOBJ || !objs[o].used || objs[o].surface != surface) return NULL;
    *n = objs[o].n;
    return objs[o].arr ? objs[o].arr->data : (unsigned char *)(uintptr_t)objs[o].ptr;
}

API CUresult cuTexObjectCreate(CUtexObject *t, const CUDA_RESOURCE_DESC *r, const CUDA_TEXTURE_DESC *td,
                               const CUDA_RESOURCE_VIEW_DESC *v) {
    (void)v;
    return td ? object_new(t, r, 0) : CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuTexObjectDestroy(CUtexObject t) { return object_free(t, 0); }
API CUresult cuSurfObjectCreate(CUsurfObject *s, const CUDA_RESOURCE_DESC *r) { return object_new(s, r, 1); }
API CUresult cuSurfObjectDestroy(CUsurfObject s) { return object_free(s, 1); }
