/*
 * double_proc.c -- cuGetProcAddress(_v2) of the cudasnap CUDA driver TEST DOUBLE.
 *
 * One row per (base name, ABI version): the CUDA version that introduced that
 * ABI, its default entry and, for stream-ordered calls, its per-thread-default-
 * stream (_ptds/_ptsz) entry.  A lookup picks the newest row whose version is
 * <= the requested cudaVersion, then the _ptds/_ptsz entry when flags has
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2).  Like the real driver,
 * only base names ("cuMemAlloc", not "cuMemAlloc_v2") are found.
 */
#include "double_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { const char *name; int ver; void *fn, *fn_ptds; } pa_t;
#define E(name, ver, fn) {name, ver, (void *)fn, NULL}
#define S(name, ver, fn, fnp) {name, ver, (void *)fn, (void *)fnp}

static const pa_t table[] = {
    E("cuGetErrorName", 6000, cuGetErrorName),
    E("cuGetErrorString", 6000, cuGetErrorString),
    E("cuInit", 2000, cuInit),
    E("cuDriverGetVersion", 2020, cuDriverGetVersion),
    E("cuDeviceGet", 2000, cuDeviceGet),
    E("cuDeviceGetCount", 2000, cuDeviceGetCount),
    E("cuDeviceGetName", 2000, cuDeviceGetName),
    E("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    E("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    E("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    E("cuDevicePrimaryCtxSetFlags", 11000, cuDevicePrimaryCtxSetFlags_v2),
    E("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    E("cuCtxCreate", 3020, cuCtxCreate_v2),
    E("cuCtxCreate", 11040, cuCtxCreate_v3),
    E("cuCtxCreate", 12050, cuCtxCreate_v4),
    E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    E("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    E("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    E("cuCtxSynchronize", 2000, cuCtxSynchronize),
    E("cuCtxSynchronize", 13000, cuCtxSynchronize_v2),
    E("cuCtxGetDevice", 2000, cuCtxGetDevice),
    E("cuCtxGetDevice", 13000, cuCtxGetDevice_v2),
    E("cuCtxGetApiVersion", 3020, cuCtxGetApiVersion),
    E("cuCtxGetFlags", 7000, cuCtxGetFlags),
    E("cuProfilerStart", 4000, cuProfilerStart),
    E("cuProfilerStop", 4000, cuProfilerStop),

    E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    E("cuMemAlloc", 3020, cuMemAlloc_v2),
    E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    E("cuMemFree", 3020, cuMemFree_v2),
    E("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    E("cuMemAllocHost", 3020, cuMemAllocHost_v2),
    E("cuMemHostAlloc", 2020, cuMemHostAlloc),
    E("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    E("cuMemFreeHost", 2000, cuMemFreeHost),
    E("cuMemHostRegister", 6050, cuMemHostRegister_v2),
    E("cuMemHostUnregister", 4000, cuMemHostUnregister),
    E("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    E("cuMemAllocManaged", 6000, cuMemAllocManaged),
    S("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
    S("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
    S("cuMemcpy", 4000, cuMemcpy, cuMemcpy_ptds),
    S("cuMemcpyAsync", 4000, cuMemcpyAsync, cuMemcpyAsync_ptsz),
    S("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds),
    S("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds),
    S("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds),
    S("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz),
    S("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz),
    S("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz),
    S("cuMemsetD8", 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds),
    S("cuMemsetD32", 3020, cuMemsetD32_v2, cuMemsetD32_v2_ptds),
    S("cuMemsetD8Async", 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz),
    S("cuMemsetD32Async", 3020, cuMemsetD32Async, cuMemsetD32Async_ptsz),

    E("cuMemAddressReserve", 10020, cuMemAddressReserve),
    E("cuMemAddressFree", 10020, cuMemAddressFree),
    E("cuMemCreate", 10020, cuMemCreate),
    E("cuMemRelease", 10020, cuMemRelease),
    E("cuMemMap", 10020, cuMemMap),
    E("cuMemUnmap", 10020, cuMemUnmap),
    E("cuMemSetAccess", 10020, cuMemSetAccess),
    E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    E("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
    E("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
    E("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    E("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    E("cuCtxEnablePeerAccess", 4000, cuCtxEnablePeerAccess),
    E("cuCtxDisablePeerAccess", 4000, cuCtxDisablePeerAccess),
    E("cuMemcpyPeer", 4000, cuMemcpyPeer),
    E("cuMemcpyPeerAsync", 4000, cuMemcpyPeerAsync),
    E("cuIpcOpenMemHandle", 4010, cuIpcOpenMemHandle),
    E("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
    E("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
    E("cuArrayCreate", 3020, cuArrayCreate_v2),
    E("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    E("cuArrayDestroy", 2000, cuArrayDestroy),
    S("cuMemcpy2D", 3020, cuMemcpy2D_v2, cuMemcpy2D_v2),
    S("cuMemcpy2DUnaligned", 3020, cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2),
    S("cuMemcpy2DAsync", 3020, cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2),
    S("cuMemcpy3D", 3020, cuMemcpy3D_v2, cuMemcpy3D_v2),
    S("cuMemcpyHtoA", 3020, cuMemcpyHtoA_v2, cuMemcpyHtoA_v2),
    S("cuMemcpyHtoAAsync", 3020, cuMemcpyHtoAAsync_v2, cuMemcpyHtoAAsync_v2),
    S("cuMemcpyAtoH", 3020, cuMemcpyAtoH_v2, cuMemcpyAtoH_v2),
    S("cuMemcpyAtoHAsync", 3020, cuMemcpyAtoHAsync_v2, cuMemcpyAtoHAsync_v2),
    S("cuMemcpyDtoA", 3020, cuMemcpyDtoA_v2, cuMemcpyDtoA_v2),
    S("cuMemcpyAtoD", 3020, cuMemcpyAtoD_v2, cuMemcpyAtoD_v2),
    S("cuMemcpyAtoA", 3020, cuMemcpyAtoA_v2, cuMemcpyAtoA_v2),
    S("cuMemcpy3DAsync", 3020, cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2),
    E("cuTexObjectCreate", 5000, cuTexObjectCreate),
    E("cuTexObjectDestroy", 5000, cuTexObjectDestroy),
    E("cuSurfObjectCreate", 5000, cuSurfObjectCreate),
    E("cuSurfObjectDestroy", 5000, cuSurfObjectDestroy),
    E("cuIpcGetEventHandle", 4010, cuIpcGetEventHandle),
    E("cuIpcOpenEventHandle", 4010, cuIpcOpenEventHandle),

    E("cuModuleLoad", 2000, cuModuleLoad),
    E("cuModuleLoadData", 2000, cuModuleLoadData),
    E("cuModuleLoadDataEx", 2010, cuModuleLoadDataEx),
    E("cuModuleUnload", 2000, cuModuleUnload),
    E("cuModuleGetFunction", 2000, cuModuleGetFunction),
    E("cuModuleGetGlobal", 3020, cuModuleGetGlobal_v2),
    E("cuLibraryLoadData", 12000, cuLibraryLoadData),
    E("cuLibraryLoadFromFile", 12000, cuLibraryLoadFromFile),
    E("cuLibraryUnload", 12000, cuLibraryUnload),
    E("cuLibraryGetKernel", 12000, cuLibraryGetKernel),
    E("cuLibraryGetModule", 12000, cuLibraryGetModule),
    E("cuKernelGetFunction", 12000, cuKernelGetFunction),
    E("cuKernelGetAttribute", 12000, cuKernelGetAttribute),
    E("cuKernelSetAttribute", 12000, cuKernelSetAttribute),
    E("cuKernelGetName", 12030, cuKernelGetName),
    E("cuKernelGetParamInfo", 12040, cuKernelGetParamInfo),
    E("cuFuncGetParamInfo", 12040, cuFuncGetParamInfo),
    E("cuFuncGetName", 12030, cuFuncGetName),
    E("cuFuncIsLoaded", 12040, cuFuncIsLoaded),
    E("cuFuncLoad", 12040, cuFuncLoad),
    E("cuFuncGetAttribute", 2020, cuFuncGetAttribute),
    E("cuFuncSetAttribute", 9000, cuFuncSetAttribute),
    E("cuFuncSetCacheConfig", 3000, cuFuncSetCacheConfig),
    E("cuFuncGetModule", 11000, cuFuncGetModule),

    S("cuLaunchKernel", 4000, cuLaunchKernel, cuLaunchKernel_ptsz),
    S("cuLaunchKernelEx", 11060, cuLaunchKernelEx, cuLaunchKernelEx_ptsz),
    S("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel, cuLaunchCooperativeKernel_ptsz),

    E("cuStreamCreate", 2000, cuStreamCreate),
    E("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
    E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    S("cuStreamSynchronize", 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz),
    S("cuStreamWriteValue32", 11070, cuStreamWriteValue32_v2, cuStreamWriteValue32_v2_ptsz),
    S("cuStreamWriteValue64", 11070, cuStreamWriteValue64_v2, cuStreamWriteValue64_v2_ptsz),
    S("cuStreamWaitValue32", 11070, cuStreamWaitValue32_v2, cuStreamWaitValue32_v2_ptsz),
    S("cuStreamWaitValue64", 11070, cuStreamWaitValue64_v2, cuStreamWaitValue64_v2_ptsz),
    S("cuStreamQuery", 2000, cuStreamQuery, cuStreamQuery_ptsz),
    S("cuStreamWaitEvent", 3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz),
    S("cuStreamBeginCapture", 10000, cuStreamBeginCapture, cuStreamBeginCapture_ptsz),
    S("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz),
    S("cuStreamEndCapture", 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz),
    S("cuStreamIsCapturing", 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz),
    E("cuEventCreate", 2000, cuEventCreate),
    S("cuEventRecord", 2000, cuEventRecord, cuEventRecord_ptsz),
    S("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz),
    E("cuEventQuery", 2000, cuEventQuery),
    E("cuEventSynchronize", 2000, cuEventSynchronize),
    E("cuEventElapsedTime", 2000, cuEventElapsedTime),
    E("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
    E("cuEventDestroy", 4000, cuEventDestroy_v2),
    E("cuGraphCreate", 10000, cuGraphCreate),
    E("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    E("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
    S("cuGraphLaunch", 10000, cuGraphLaunch, cuGraphLaunch_ptsz),
    E("cuGraphDestroy", 10000, cuGraphDestroy),
    E("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    E("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2),
    E("cuGraphAddNode", 12030, cuGraphAddNode_v2),
    E("cuGraphAddMemsetNode", 10000, cuGraphAddMemsetNode),
    E("cuGraphAddEmptyNode", 10000, cuGraphAddEmptyNode),
    E("cuGraphAddDependencies", 12030, cuGraphAddDependencies_v2),
    E("cuGraphGetNodes", 10000, cuGraphGetNodes),
    E("cuMemcpyBatchAsync", 12080, cuMemcpyBatchAsync_v2),
    S("cuLaunchHostFunc", 10000, cuLaunchHostFunc, cuLaunchHostFunc_ptsz),
    E("cuStreamAddCallback", 5000, cuStreamAddCallback),
    E("cuGraphGetRootNodes", 10000, cuGraphGetRootNodes),
    E("cuGraphNodeGetType", 10000, cuGraphNodeGetType),
    E("cuGraphKernelNodeSetParams", 12000, cuGraphKernelNodeSetParams_v2),
    E("cuGraphExecKernelNodeSetParams", 12000, cuGraphExecKernelNodeSetParams_v2),

    E("cuGetProcAddress", 11030, cuGetProcAddress),
    E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    E("cuGetExportTable", 3000, cuGetExportTable),
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
