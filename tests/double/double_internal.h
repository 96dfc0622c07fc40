/* double_internal.h -- shared internals of the cudasnap CUDA driver TEST DOUBLE. */
#ifndef DOUBLE_INTERNAL_H
#define DOUBLE_INTERNAL_H
#define CUDA_DOUBLE_NO_API_MACROS
#include "cuda_double.h"
#include <pthread.h>
#include <time.h>

#define API __attribute__((visibility("default")))

extern pthread_mutex_t dbl_lock;
#define LOCK() pthread_mutex_lock(&dbl_lock)
#define UNLOCK() pthread_mutex_unlock(&dbl_lock)

/* Handle registry: every handle given out is a malloc'ed object whose first
 * field is its type tag; handles are validated by looking them up. */
enum { OBJ_CTX = 1, OBJ_STREAM, OBJ_EVENT, OBJ_MODULE, OBJ_FUNC, OBJ_LIBRARY, OBJ_KERNEL, OBJ_GRAPH, OBJ_GRAPHEXEC, OBJ_MEMHANDLE, OBJ_ARRAY };
void *obj_new(int type, size_t size);
int obj_check(const void *p, int type); /* 1 if p is a live object of that type */
void obj_free(void *p);

/* Library state checks (return CUDA_SUCCESS or the error). */
CUresult need_init(void);
CUresult need_ctx(void);

/* Device memory as cuMemAlloc/cuMemFree give it, for the library's own use (module globals). */
CUresult dbl_mem_alloc(CUdeviceptr *dptr, size_t size);
CUresult dbl_mem_free(CUdeviceptr dptr);

/* 1 if [p, p+n) lies inside one live device-accessible allocation/mapping. */
int dev_range_ok(unsigned long long p, size_t n);

/* Recorded stream work (graph capture). */
typedef struct op {
    int kind; /* 1 = launch, 2 = memcpy, 3 = memset8, 4 = memset32, OP_EVENT_RECORD (func = the event) */
    void *func;
    unsigned int grid[3], block[3];
    unsigned char *params;
    size_t params_len;
    unsigned long long dst, src;
    size_t n;
    unsigned int value;
} op_t;

enum { OP_EVENT_RECORD = 5 };

struct stream_obj;
/* Non-NULL graph if this stream is capturing; s may be NULL/legacy/per-thread. */
int stream_capture_append(CUstream s, const op_t *op); /* 1 if captured */
CUresult stream_validate(CUstream s);
CUresult op_run(const op_t *op);
/* the time an event records (CUDA_DOUBLE_CLOCK, double_launch.c) */
void dbl_clock_now(struct timespec *t);
CUresult launch_run(void *func, const unsigned int grid[3], const unsigned int block[3], const unsigned char *params,
                    size_t params_len);
void op_release(op_t *op);

/* Device work run so far (launches, copies, memsets): cuProfilerStart/Stop log it. */
extern unsigned long long dbl_ops;

/* The bytes a texture or surface object reads or writes, and how many (double_texture.c). */
unsigned char *texture_bytes(unsigned long long obj, int surface, size_t *n);

void *procaddr_lookup(const char *symbol, int cudaVersion, unsigned long long flags, int *status);

#endif
