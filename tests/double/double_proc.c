/*
 * double_proc.c -- cuGetProcAddress(_v2) of the cudasnap CUDA driver TEST DOUBLE.
 *
 * One row per (base name, ABI version): the CUDA version that introduced that
 * ABI, its default entry and, for stream-ordered calls, its per-thread-default-
 * stream (_ptds/_ptsz) entry.  The rows are generated (build.py: double_proc_table.h)
 * from the API description, for every function this double defines.  A lookup picks the newest row whose version is
 * <= the requested cudaVersion, then the _ptds/_ptsz entry when flags has
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2).  Like the real driver,
 * only base names ("cuMemAlloc", not "cuMemAlloc_v2") are found.
 */
#include "double_internal.h"
#include "double_by_class.h"   /* generated: functions the double implements by class */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { const char *name; int ver; void *fn, *fn_ptds; } pa_t;
#define E(name, ver, fn) {name, ver, (void *)fn, NULL}
#define S(name, ver, fn, fnp) {name, ver, (void *)fn, (void *)fnp}

static const pa_t table[] = {
#include "double_proc_table.h"
};

void *procaddr_lookup(const char *symbol, int cudaVersion, unsigned long long flags, int *status) {
    const pa_t *best = NULL;
    int seen = 0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].name, symbol) != 0) continue;
        seen = 1;
        if (table[i].ver <= cudaVersion && (!best || table[i].ver > best->ver)) best = &table[i];
    }
    if (!best) {
        *status = seen ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return NULL;
    }
    *status = CU_GET_PROC_ADDRESS_SUCCESS;
    if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->fn_ptds) return best->fn_ptds;
    return best->fn;
}

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *symbolStatus) {
    if (!symbol || !pfn || flags > 3) return CUDA_ERROR_INVALID_VALUE;
    int st;
    void *f = procaddr_lookup(symbol, cudaVersion, flags, &st);
    *pfn = f;
    static int trace = -1; /* CUDA_DOUBLE_TRACE_PROCADDR=1: log every lookup to stderr */
    if (trace < 0) trace = getenv("CUDA_DOUBLE_TRACE_PROCADDR") != NULL;
    if (trace) fprintf(stderr, "cuGetProcAddress %s %d %llu -> %s\n", symbol, cudaVersion, (unsigned long long)flags, f ? "found" : "NOT_FOUND");
    if (symbolStatus) *symbolStatus = (CUdriverProcAddressQueryResult)st;
    return f ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

API CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId) {
    if (ppExportTable) *ppExportTable = NULL;
    (void)pExportTableId;
    return CUDA_ERROR_NOT_SUPPORTED;
}
