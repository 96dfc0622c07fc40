"""The translation table: which Emitter method (export/emit.py and its parts) translates the
calls of each API, by base name.  A call with no entry here is translated by its class when it
has one: a plain execute call (class plain_args: values and handles) through the description
(Emitter.e_generic); pure queries and host-only calls are left out; anything else stops the
export with its name."""
from __future__ import annotations

from typing import Dict

# base name -> emitter method name.  Anything not here and not a pure query is refused.
TABLE: Dict[str, str] = {}


def _t(method: str, *names: str) -> None:
    for n in names:
        TABLE[n] = method


_t("e_init", "cuInit")
_t("e_retain", "cuDevicePrimaryCtxRetain")
_t("e_release", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset")
_t("e_primary_flags", "cuDevicePrimaryCtxSetFlags")
_t("e_ctx_create", "cuCtxCreate")
_t("e_ctx_destroy", "cuCtxDestroy")
_t("e_ctx_set", "cuCtxSetCurrent")
_t("e_ctx_push", "cuCtxPushCurrent")
_t("e_ctx_pop", "cuCtxPopCurrent")
_t("e_ctx_sync", "cuCtxSynchronize")
_t("e_none", "cuCtxSetCacheConfig", "cuCtxSetSharedMemConfig", "cuCtxResetPersistingL2Cache", "cuCtxSetFlags",
   "cuFuncSetSharedMemConfig", "cuKernelSetCacheConfig", "cuFuncSetBlockShape", "cuFuncSetSharedSize",
   "cuLinkCreate", "cuLinkAddData", "cuLinkAddFile", "cuLinkComplete", "cuLinkDestroy", "cuFuncLoad",
   "cuStreamSetAttribute", "cuStreamCopyAttributes", "cuThreadExchangeStreamCaptureMode",
   "cuProfilerStart", "cuProfilerStop", "cuProfilerInitialize",
   "cuMemAdvise", "cuMemPrefetchAsync", "cuMemRangeGetAttribute", "cuStreamAttachMemAsync",
   "cuMemPoolCreate", "cuDeviceGetDefaultMemPool", "cuDeviceGetMemPool", "cuMemGetDefaultMemPool",
   "cuMemGetMemPool", "cuMemPoolDestroy", "cuMemPoolTrimTo", "cuMemPoolSetAttribute", "cuMemPoolSetAccess",
   "cuDeviceSetMemPool", "cuMemSetMemPool", "cuEventElapsedTime", "cuCtxAttach", "cuCtxDetach",
   # host-side lifetimes of the recorded process's objects, graph memory pool trimming: no effect on results
   "cuGraphRetainUserObject", "cuGraphReleaseUserObject", "cuUserObjectCreate", "cuUserObjectRetain",
   "cuUserObjectRelease", "cuDeviceGraphMemTrim", "cuDeviceSetGraphMemAttribute")
_t("e_host_func", "cuLaunchHostFunc", "cuStreamAddCallback")
_t("e_host_pin", "cuMemHostAlloc", "cuMemAllocHost", "cuMemHostRegister")
_t("e_host_unpin", "cuMemFreeHost", "cuMemHostUnregister")
_t("e_alloc", "cuMemAlloc", "cuMemAllocManaged", "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemAllocPitch")
_t("e_free", "cuMemFree")
_t("e_free_async", "cuMemFreeAsync")
_t("e_reserve", "cuMemAddressReserve")
_t("e_address_free", "cuMemAddressFree")
_t("e_mem_create", "cuMemCreate")
_t("e_mem_release", "cuMemRelease")
_t("e_mem_map", "cuMemMap")
_t("e_mem_unmap", "cuMemUnmap")
_t("e_mem_access", "cuMemSetAccess")
_t("e_h2d", "cuMemcpyHtoD", "cuMemcpyHtoDAsync")
_t("e_d2h", "cuMemcpyDtoH", "cuMemcpyDtoHAsync")
_t("e_d2d", "cuMemcpyDtoD", "cuMemcpyDtoDAsync", "cuMemcpy", "cuMemcpyAsync")
_t("e_copy2d", "cuMemcpy2D", "cuMemcpy2DAsync", "cuMemcpy2DUnaligned")
_t("e_memset", "cuMemsetD8", "cuMemsetD16", "cuMemsetD32", "cuMemsetD8Async", "cuMemsetD16Async",
   "cuMemsetD32Async", "cuMemsetD2D8", "cuMemsetD2D16", "cuMemsetD2D32", "cuMemsetD2D8Async",
   "cuMemsetD2D16Async", "cuMemsetD2D32Async")
_t("e_module_load", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuModuleLoad")
_t("e_library_load", "cuLibraryLoadData", "cuLibraryLoadFromFile")
_t("e_module_unload", "cuModuleUnload")
_t("e_library_unload", "cuLibraryUnload")
_t("e_get_function", "cuModuleGetFunction")
_t("e_get_kernel", "cuLibraryGetKernel")
_t("e_kernel_function", "cuKernelGetFunction")
_t("e_library_module", "cuLibraryGetModule")
_t("e_global", "cuModuleGetGlobal", "cuLibraryGetGlobal")
_t("e_func_attr", "cuFuncSetAttribute", "cuFuncSetCacheConfig")
_t("e_kernel_attr", "cuKernelSetAttribute")
_t("e_launch", "cuLaunchKernel")
_t("e_launch_ex", "cuLaunchKernelEx")
_t("e_launch_coop", "cuLaunchCooperativeKernel")
_t("e_begin_capture", "cuStreamBeginCapture")
_t("e_begin_capture_to_graph", "cuStreamBeginCaptureToGraph")
_t("e_end_capture", "cuStreamEndCapture")
_t("e_instantiate", "cuGraphInstantiate", "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams")
_t("e_graph_add_kernel", "cuGraphAddKernelNode")
_t("e_graph_add_node", "cuGraphAddNode")
_t("e_graph_add_memset", "cuGraphAddMemsetNode")
_t("e_graph_add_memcpy", "cuGraphAddMemcpyNode")
_t("e_graph_add_empty", "cuGraphAddEmptyNode", "cuGraphAddHostNode")
_t("e_graph_add_event", "cuGraphAddEventRecordNode", "cuGraphAddEventWaitNode")
_t("e_graph_add_child", "cuGraphAddChildGraphNode")
_t("e_graph_deps", "cuGraphAddDependencies", "cuGraphRemoveDependencies")
_t("e_node_list", "cuGraphGetNodes", "cuGraphGetRootNodes", "cuGraphNodeGetDependencies",
   "cuGraphNodeGetDependentNodes")
_t("e_kernel_node_set", "cuGraphKernelNodeSetParams", "cuGraphExecKernelNodeSetParams")
_t("e_memset_node_set", "cuGraphMemsetNodeSetParams", "cuGraphExecMemsetNodeSetParams")
_t("e_memcpy_node_set", "cuGraphMemcpyNodeSetParams", "cuGraphExecMemcpyNodeSetParams")
_t("e_node_set", "cuGraphNodeSetParams", "cuGraphExecNodeSetParams")
_t("e_exec_update", "cuGraphExecUpdate")
_t("e_knode_attr", "cuGraphKernelNodeSetAttribute")
_t("e_stream_sync", "cuStreamSynchronize")
_t("e_event_record", "cuEventRecord", "cuEventRecordWithFlags")
_t("e_stream_wait", "cuStreamWaitEvent")
