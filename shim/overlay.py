"""Hand-written overlay for shim/gen_api.py: what cuda.h cannot say.

Plain data, read by the generator only (not at runtime). Rules are tried in order; the
first match wins. Patterns are Python regexes matched (fullmatch) against the *base*
name (cuMemAlloc for cuMemAlloc_v2 / cuMemcpy for cuMemcpy_ptds) and, where noted, the
ABI name.
"""

# ---------------------------------------------------------------------------------------
# Handle names for opaque pointer typedefs (`typedef struct CUxxx_st *CUxxx`). Types not
# listed get a snake_case name derived from the typedef (CUgraphDeviceNode -> graph_device_node).
HANDLE_NAMES = {
    "CUcontext": "context",
    "CUmodule": "module",
    "CUfunction": "function",
    "CUlibrary": "library",
    "CUkernel": "kernel",
    "CUstream": "stream",
    "CUevent": "event",
    "CUarray": "array",
    "CUmipmappedArray": "mipmapped_array",
    "CUgraph": "graph",
    "CUgraphNode": "graph_node",
    "CUgraphExec": "graph_exec",
    "CUmemoryPool": "mempool",
    "CUlinkState": "link_state",
    "CUtexref": "texref",
    "CUsurfref": "surfref",
    "CUgraphicsResource": "graphics_resource",
    "CUexternalMemory": "external_memory",
    "CUexternalSemaphore": "external_semaphore",
    "CUuserObject": "user_object",
    "CUgreenCtx": "green_ctx",
    "CUdevResourceDesc": "dev_resource_desc",
    "CUmulticastObject": "multicast",
}

# Integer typedefs that carry identity (the replayer must translate them, not copy them).
INT_SEMANTICS = {
    "CUdeviceptr": "deviceptr", "CUdeviceptr_v2": "deviceptr", "CUdeviceptr_v1": "deviceptr",
    "CUdevice": "device", "CUdevice_v1": "device",
    "CUtexObject": "texobject", "CUtexObject_v1": "texobject",
    "CUsurfObject": "surfobject", "CUsurfObject_v1": "surfobject",
    "CUmemGenericAllocationHandle": "mem_handle", "CUmemGenericAllocationHandle_v1": "mem_handle",
}

# Types described even if no parameter reaches them (decoding needs them).
EXTRA_TYPES = ["CUresult", "CUdriverProcAddressQueryResult", "CUjit_option", "CUpointer_attribute"]

# Entry points the headers do not declare (a driver newer than the headers, a vendor extension):
# base name -> (CUDA version that introduced it, C prototype). The generator parses each with
# the headers' types, and every rule below applies to it as to a declared function; the
# description marks it "origin": "overlay". A function of a common class then needs nothing else.
EXTRA_FUNCTIONS = {}

# ABI names whose base the name-stripping rule gets wrong.
BASE_OVERRIDES = {}

# Version table additions the PFN typedefs cannot express. cuda.h maps cuGraphInstantiate
# to cuGraphInstantiateWithFlags since CUDA 12.0 (the old 5-argument form is legacy only),
# so cuGetProcAddress("cuGraphInstantiate", >=12000) hands out cuGraphInstantiateWithFlags.
VERSION_EXTRA = {
    "cuGraphInstantiate": [(12000, "cuGraphInstantiateWithFlags")],
}

# ---------------------------------------------------------------------------------------
# Families, by base name prefix. Order matters (specific before general).
FAMILY_RULES = [
    (r"cuGetExportTable|cuGetProcAddress|cuInit|cuDriverGetVersion|cuGetErrorString|cuGetErrorName", "misc"),
    (r"cuFlushGPUDirectRDMAWrites", "misc"),
    (r"cuThreadExchangeStreamCaptureMode", "stream"),
    (r"cuDeviceGetNvSciSyncAttributes", "interop"),
    # cudaProfiler.h
    (r"cuProfiler\w+", "profiler"),
    # cudaGL.h, cudaEGL.h, cudaVDPAU.h (cuGLCtxCreate / cuVDPAUCtxCreate / cuEventCreateFromEGLSync
    # included: they need a GL / VDPAU / EGL object of the captured process)
    (r"cuGL\w+|cuGraphicsGL\w+|cuWGL\w+|cuEGL\w+|cuGraphicsEGL\w+|cuGraphicsResourceGetMappedEglFrame"
     r"|cuEventCreateFromEGLSync|cuVDPAU\w+|cuGraphicsVDPAU\w+", "interop"),
    (r"cuIpc\w+", "ipc"),
    (r"cuCheckpoint\w+", "checkpoint"),
    (r"cuLogs\w+", "logs"),
    (r"cuCoredump\w+", "coredump"),
    (r"cuGreenCtx\w+|cuDevResource\w+|cuDevSmResource\w+|cuStreamGetGreenCtx|cuCtxFromGreenCtx"
     r"|cuDeviceGetDevResource|cuCtxGetDevResource|cuDevResourceGenerateDesc|cuDevSmResourceSplit\w*", "green"),
    (r"cuMulticast\w+", "multicast"),
    (r"cuTensorMap\w+", "tensormap"),
    (r"cuCtxEnablePeerAccess|cuCtxDisablePeerAccess|cuDeviceCanAccessPeer|cuDeviceGetP2PAttribute"
     r"|cuDeviceGetP2PAtomicCapabilities", "peer"),
    (r"cuDevicePrimaryCtx\w+", "context"),
    (r"cuDeviceGraphMemTrim|cuDeviceGetGraphMemAttribute|cuDeviceSetGraphMemAttribute", "graph"),
    (r"cuDeviceGetMemPool|cuDeviceSetMemPool|cuDeviceGetDefaultMemPool", "pool"),
    (r"cuDevice\w*", "device"),
    (r"cuCtx\w+", "context"),
    (r"cuModule\w+|cuLibrary\w+|cuKernel\w+|cuFunc\w+|cuLink\w+|cuParamSet\w*", "module"),
    (r"cuMemPool\w+|cuMemAllocAsync|cuMemAllocFromPoolAsync|cuMemFreeAsync|cuMemGetDefaultMemPool"
     r"|cuMemGetMemPool|cuMemSetMemPool", "pool"),
    (r"cuMemAddressReserve|cuMemAddressFree|cuMemCreate|cuMemRelease|cuMemMap|cuMemMapArrayAsync|cuMemUnmap"
     r"|cuMemSetAccess|cuMemGetAccess|cuMemExportToShareableHandle|cuMemImportFromShareableHandle"
     r"|cuMemGetAllocationGranularity|cuMemGetAllocationPropertiesFromHandle|cuMemRetainAllocationHandle", "vmm"),
    (r"cuMem\w+|cuPointer\w+|cuArray\w*|cuMipmappedArray\w+", "memory"),
    (r"cuLaunch\w*|cuOccupancy\w+", "launch"),
    (r"cuStream\w+", "stream"),
    (r"cuEvent\w+", "event"),
    (r"cuGraphics\w+", "interop"),
    (r"cuGraph\w+|cuUserObject\w+", "graph"),
    (r"cuImportExternal\w+|cuExternalMemory\w+|cuDestroyExternal\w+|cuSignalExternalSemaphoresAsync"
     r"|cuWaitExternalSemaphoresAsync", "interop"),
    (r"cuTexRef\w+|cuTexObject\w+", "texture"),
    (r"cuSurfRef\w+|cuSurfObject\w+", "surface"),
]

# Default status per family: replayable families vs recorded-only ones.
FAMILY_STATUS = {
    "context": "replay", "device": "replay", "module": "replay", "memory": "replay", "vmm": "replay",
    "pool": "replay", "launch": "replay", "stream": "replay", "event": "replay", "graph": "replay",
    "misc": "replay", "tensormap": "replay", "profiler": "replay",
    "peer": "record", "interop": "record", "texture": "record", "surface": "record", "green": "record",
    "multicast": "record", "coredump": "record", "logs": "record", "checkpoint": "record", "ipc": "refused",
}
FAMILY_RECORD_REASON = {
    "peer": "peer access depends on the multi-GPU topology of the capturing machine; recorded only",
    "interop": "graphics / external memory and semaphore interop needs objects outside CUDA; recorded only",
    "texture": "texture references and objects are recorded only",
    "surface": "surface references and objects are recorded only",
    "green": "green contexts / device resource partitions are recorded only",
    "multicast": "multicast objects span devices/processes; recorded only",
    "coredump": "coredump settings are debugging state; recorded only",
    "logs": "driver log callbacks and dumps are recorded only",
    "checkpoint": "process checkpoint/restore acts on other processes; recorded only",
}

# Per-function status exceptions: (pattern on base or ABI name, status, reason).
STATUS_RULES = [
    (r"cuGetExportTable", "refused", "private runtime tables: passed through untouched, not recordable"),
    # replayed with the other processes of the job (replay/group.py): handles pass between ranks
    # texture and surface objects over arrays and device memory (replay/handlers/texture.py)
    (r"cuTexObjectCreate|cuTexObjectDestroy|cuSurfObjectCreate|cuSurfObjectDestroy", "replay", None),
    (r"cuIpc\w+|cuMemExportToShareableHandle"
     r"|cuMemImportFromShareableHandle|cuCtxEnablePeerAccess|cuCtxDisablePeerAccess", "replay", None),
    (r"cuMemPoolExportToShareableHandle|cuMemPoolExportPointer"
     r"|cuMemGetHandleForAddressRange", "record",
     "exports an OS handle for another process; recorded only"),
    (r"cuMemPoolImportFromShareableHandle|cuMemPoolImportPointer", "refused",
     "imports a pool/pointer from another process; cannot be replayed"),
    # host callbacks: a function pointer of the captured process cannot be called on replay
    (r"cuLaunchHostFunc|cuStreamAddCallback|cuUserObjectCreate|cuGraphAddHostNode|cuGraphHostNode\w+"
     r"|cuGraphExecHostNodeSetParams|cuDeviceRegisterAsyncNotification|cuDeviceUnregisterAsyncNotification",
     "record", "host callback function pointers of the captured process cannot be replayed"),
    (r"cuLibraryGetUnifiedFunction", "record", "returns a host function pointer; recorded only"),
    (r"cuGraphAddExternalSemaphores\w+|cuGraphExternalSemaphores\w+|cuGraphExecExternalSemaphores\w+",
     "record", "external semaphore graph nodes need interop objects; recorded only"),
    (r"cuGraphAddBatchMemOpNode|cuGraphBatchMemOpNode\w+|cuGraphExecBatchMemOpNodeSetParams", "record",
     "stream memory operation nodes are recorded only"),
    (r"cuStreamBatchMemOp", "record", "batches of stream memory operations are recorded only"),
    # single waits and writes on device memory replay (handlers/stream.py); on host-mapped
    # memory, which a host thread may write, they stop the replay with that reason
    (r"cuStreamWaitValue\w+|cuStreamWriteValue\w+", "replay", None),
    (r"cuMemBatchDecompressAsync", "record", "hardware decompression batches are recorded only"),
    (r"cuParamSet\w+|cuFuncSetBlockShape|cuFuncSetSharedSize|cuLaunch|cuLaunchGrid|cuLaunchGridAsync", "record",
     "pre-CUDA-4 launch API (deprecated); recorded only"),
    (r"cuModuleGetTexRef|cuModuleGetSurfRef", "record", "texture/surface references are recorded only"),
]

# ---------------------------------------------------------------------------------------
# Replay classes ("replay_class" of each ABI name): what replay does with a recorded call.
#   query    a pure query (no effect on device state): skipped and counted
#   execute  replayed by its handler (replay/handlers/); one without a handler is "unsupported"
#   refuse   status "refused": cannot be replayed
#   record   status "record": recorded only
# Rules (pattern on base or ABI name, class) are tried in order, the first match wins; a name
# no rule matches takes its status's class (replay -> execute).
REPLAY_CLASS_RULES = [
    # getters whose result later calls use as a handle: replay maps it
    (r"cuGraphChildGraphNodeGetGraph", "execute"),
    # node lists a program asks for to change or inspect nodes (of captured graphs too): replay
    # asks the live graph and maps the recorded handles by position
    (r"cuGraphGetNodes|cuGraphGetRootNodes|cuGraphNodeGetDependencies\w*|cuGraphNodeGetDependentNodes\w*", "execute"),
    (r"cuDeviceGet(?!DefaultMemPool|MemPool)\w*|cuDeviceTotalMem\w*|cuDeviceComputeCapability|cuDeviceCanAccessPeer"
     r"|cuDriverGetVersion|cuCtxGet\w*|cuFuncGet\w*|cuKernelGet(?!Function)\w*|cuPointerGetAttributes?|cuGetErrorName"
     r"|cuGetErrorString|cuGetProcAddress\w*|cuGetExportTable|cuModuleGetLoadingMode|cuMemGetInfo\w*"
     r"|cuMemGetAddressRange\w*|cuStreamGet\w*|cuStreamIsCapturing\w*|cuStreamQuery\w*|cuEventQuery"
     # elapsed time between two events: a host-side reading that differs every run (a window
     # replay may not have recorded the first event: its record came before the window)
     r"|cuEventElapsedTime\w*"
     r"|cuDevicePrimaryCtxGetState|cuMemGetAllocation\w*|cuOccupancy\w*|cuMemPoolGetAttribute"
     r"|cuModuleGetFunctionCount|cuModuleEnumerateFunctions|cuLibraryGetKernelCount|cuLibraryEnumerateKernels"
     r"|cuFuncIsLoaded|cuMemGetAccess|cuGraphGetNodes|cuGraphGetRootNodes|cuGraphGetEdges\w*|cuGraphNodeGet\w*"
     r"|cuGraph\w+NodeGet\w*|cuGraphExecGetFlags|cuGraphDebugDotPrint|cuGetFlags"
     r"|cuMemHostGetFlags|cuMemRangeGetAttributes|cuMemPoolGetAccess|cuArrayGetDescriptor|cuArray3DGetDescriptor"
     r"|cuArrayGetMemoryRequirements|cuArrayGetSparseProperties|cuMipmappedArrayGetMemoryRequirements"
     r"|cuMipmappedArrayGetSparseProperties|cuMulticastGetGranularity"
     # TMA descriptors: the encoded 128-byte map reaches kernels inside the recorded parameter
     # bytes, and stays valid because every allocation is placed at its recorded address
     r"|cuTensorMapEncode\w*", "query"),
    # recorded-only calls replay keeps in order as no-ops (host callbacks cannot be called;
    # the pre-CUDA-4 launch shape setters have no effect without the legacy launch)
    (r"cuLaunchHostFunc|cuStreamAddCallback|cuGraphAddHostNode|cuUserObjectCreate|cuFuncSetBlockShape"
     r"|cuFuncSetSharedSize", "execute"),
]

# Host-only calls ("host_only" of each ABI name): no effect on the device. Every "query" is
# one; these are replayed (replay maps the address they return) but change nothing on the
# device, so a standalone export may leave them out. Pattern on base or ABI name.
HOST_ONLY_RX = r"cuMemHostGetDevicePointer"

# Calls that give back memory or a mapping that a launch may reach ("releases"): a replay
# phase that runs earlier work again later (graph mode in a job) holds them until it is done.
# Code unloads are not among them: the replay context keeps the unloaded module itself
# (ReplayContext.defer_unloads), since a held call would find its handle value reused by then.
RELEASES_RX = (r"cuMemFree|cuMemFreeAsync|cuMemFreeHost|cuMemHostUnregister|cuMemUnmap|cuMemRelease"
               r"|cuMemAddressFree|cuIpcCloseMemHandle|cuMemPoolDestroy|cuMemPoolTrimTo|cuArrayDestroy"
               r"|cuMipmappedArrayDestroy")

# Calls after which the host has seen the device's work ("host_sync", on the ABI name): the host
# may then write managed memory in place, so shim_hostmem.c records it again at its next launch.
HOST_SYNC_RX = r"cu\w*Synchronize\w*|cuMemcpy(?!\w*Async)\w*|cuMemset(?!\w*Async)\w*"

# Call classes ("classes" of each ABI name, a sorted list): what replay, export, profiling and
# the --calls selection treat alike, so that a new function of a class needs no code of its
# own. Rules (class, pattern on base or ABI name); a function takes every class it matches.
# Read through formats/vocab.py only.
#   sync        the host waits for the device: the replay's step boundaries and sync times
#   wait        orders or polls without waiting on the host (the --calls group `sync` with sync)
#   order       records or orders work between streams without doing any (extract keeps it)
#   alloc, free device or host memory made and given back (--calls groups)
#   may_batch   what a recorded graph of a profiled sequence may hold between its launches
#               (replay/profile/graphseq.py): anything else ends the sequence
#   destroys    ends the object its first handle argument names
#   loads_code  loads a module or library image;  names_global  looks up a module global
#   asks_by_name / names_function / refers_code  kernel lookups: by name; that hand out a
#               function or kernel; those and the lookup of a library's module
#   host_alloc, pins_host   page-locked host memory made (and, pins_host, registered)
#   begins_capture / ends_capture  start and end a stream capture;  waits_event  waits on an event
#   links_process / imports_peer  IPC and shareable handles: every such call; the imports
#   polls, records_event, moves_memory (copies, memsets, prefetches), h2d_copy, unified_copy,
#   device_alloc, vmm_map, physical_memory, sets_kernel_node, sets_node, makes_context,
#   ends_context, gets_ipc, opens_ipc: as named
# The generator adds what the parameter list says (gen_api.derived_classes): plain_args,
# creates.
CALL_CLASS_RULES = [
    ("sync", r"cuCtxSynchronize|cuStreamSynchronize|cuEventSynchronize"),
    ("wait", r"cuStreamWaitEvent|cuStreamQuery|cuEventQuery"),
    ("order", r"cuEventRecord|cuEventRecordWithFlags|cuStreamWaitEvent|cuStreamAddCallback|cuEventElapsedTime"
              r"|cuCtxRecordEvent|cuCtxWaitEvent"),
    ("alloc", r"cuMemAlloc\w*|cuMemCreate|cuMemHostAlloc"),
    ("free", r"cuMemFree|cuMemRelease|cuMemFreeHost|cuMemFreeAsync"),
    ("destroys", r"cu\w*Destroy\w*"),
    ("loads_code", r"cuModuleLoad\w*|cuLibraryLoad\w*"),
    ("asks_by_name", r"cuModuleGetFunction|cuLibraryGetKernel"),
    ("names_function", r"cuModuleGetFunction|cuLibraryGetKernel|cuKernelGetFunction"),
    ("refers_code", r"cuModuleGetFunction|cuLibraryGetKernel|cuKernelGetFunction|cuLibraryGetModule"),
    ("names_global", r"cuModuleGetGlobal|cuLibraryGetGlobal"),
    ("starts_profiler", r"cuProfilerStart"),
    ("stops_profiler", r"cuProfilerStop"),
    ("host_alloc", r"cuMemHostAlloc|cuMemAllocHost"),
    ("pins_host", r"cuMemHostAlloc|cuMemAllocHost|cuMemHostRegister"),
    ("begins_capture", r"cuStreamBeginCapture\w*"),
    ("ends_capture", r"cuStreamEndCapture\w*"),
    ("links_process", r"cuMemExportToShareableHandle|cuMemImportFromShareableHandle|cuIpc\w+"),
    ("imports_peer", r"cuMemImportFromShareableHandle|cuIpcOpenMemHandle|cuIpcOpenEventHandle"),
    ("waits_event", r"cuStreamWaitEvent|cuEventSynchronize"),
    ("polls", r"cuStreamQuery|cuEventQuery"),
    ("records_event", r"cuEventRecord|cuEventRecordWithFlags"),
    ("moves_memory", r"cuMemcpy\w*|cuMemset\w*|cuMemPrefetch\w*"),
    ("h2d_copy", r"cuMemcpyHtoD|cuMemcpyHtoDAsync"),
    ("d2h_copy", r"cuMemcpyDtoH|cuMemcpyDtoHAsync"),
    ("d2d_copy", r"cuMemcpyDtoD|cuMemcpyDtoDAsync"),
    ("instantiates", r"cuGraphInstantiate\w*"),
    ("unified_copy", r"cuMemcpy|cuMemcpyAsync"),
    ("device_alloc", r"cuMemAlloc|cuMemAllocPitch|cuMemAllocAsync|cuMemAllocFromPoolAsync"),
    ("vmm_map", r"cuMemCreate|cuMemMap|cuMemSetAccess|cuMemUnmap|cuMemRelease|cuMemAddressReserve|cuMemAddressFree"),
    ("physical_memory", r"cuMemCreate|cuMemRelease"),
    # the VMM steps one by one: map physical memory into a reserved range, unmap it, make it accessible
    ("maps_range", r"cuMemMap"),
    ("unmaps_range", r"cuMemUnmap"),
    ("sets_access", r"cuMemSetAccess"),
    # memory of another process: a shareable handle imported, a legacy IPC memory handle opened / closed
    ("imports_shareable", r"cuMemImportFromShareableHandle"),
    ("exports_shareable", r"cuMemExportToShareableHandle"),
    ("ipc_event", r"cuIpcGetEventHandle|cuIpcOpenEventHandle"),
    ("enables_peer", r"cuCtxEnablePeerAccess"),
    ("opens_ipc_memory", r"cuIpcOpenMemHandle"),
    ("closes_ipc_memory", r"cuIpcCloseMemHandle"),
    ("sets_kernel_node", r"cuGraphAddKernelNode|cuGraphKernelNodeSetParams|cuGraphExecKernelNodeSetParams"),
    ("sets_node", r"cuGraphAddNode|cuGraphNodeSetParams|cuGraphExecNodeSetParams"),
    ("adds_node", r"cuGraphAddNode"),
    ("adds_child_graph", r"cuGraphAddChildGraphNode"),
    ("updates_exec", r"cuGraphExecUpdate"),
    # a launch whose geometry and stream are in a CUlaunchConfig
    ("config_launch", r"cuLaunchKernelEx"),
    ("loads_library", r"cuLibraryLoad\w*"),
    ("encodes_tensor_map", r"cuTensorMapEncode\w*"),
    # the current context of a thread: set, pushed, popped
    ("sets_current", r"cuCtxSetCurrent"),
    ("pushes_context", r"cuCtxPushCurrent"),
    ("pops_context", r"cuCtxPopCurrent"),
    ("makes_context", r"cuDevicePrimaryCtxRetain|cuCtxCreate"),
    ("retains_primary", r"cuDevicePrimaryCtxRetain"),
    # a host callback of the legacy form (a status argument), beside cuLaunchHostFunc's
    ("stream_callback", r"cuStreamAddCallback"),
    ("ends_context", r"cuCtxDestroy|cuDevicePrimaryCtxRelease|cuDevicePrimaryCtxReset"),
    ("gets_ipc", r"cuIpcGetMemHandle|cuIpcGetEventHandle"),
    ("gets_ipc_memory", r"cuIpcGetMemHandle"),
    ("opens_ipc", r"cuIpcOpenMemHandle|cuIpcOpenEventHandle"),
    # the --calls groups beside the classes above (formats/callset.py GROUPS)
    ("copy_group", r"cuMemcpy\w*"),
    ("launch_group", r"cuLaunch\w*"),
    ("memset_group", r"cuMemset\w*"),
    ("event_group", r"cuEvent\w*"),
    ("stream_group", r"cuStream\w*"),
    ("module_group", r"cuModule\w*|cuLibrary\w*|cuLink\w*"),
    ("graph_group", r"cuGraph\w*|cuStreamBeginCapture\w*|cuStreamEndCapture\w*|cuStreamIsCapturing\w*"
                    r"|cuStreamGetCaptureInfo\w*|cuStreamUpdateCapture\w*"),
    # the simulator (replay/sim/): what its stand-in driver answers with success, changing
    # nothing its functional model computes; what its exported program already has (a context,
    # the merged PTX, its handles) or only touches host memory; what that program replays
    ("sim_noop", r"cuCtxSetCurrent|cuCtxPushCurrent|cuCtxSetLimit|cuCtxSetCacheConfig|cuCtxSetSharedMemConfig"
                 r"|cuCtxSetFlags|cuCtxResetPersistingL2Cache|cuDevicePrimaryCtxRelease|cuDevicePrimaryCtxSetFlags"
                 r"|cuDevicePrimaryCtxReset|cuFuncSetAttribute|cuFuncSetCacheConfig|cuFuncSetSharedMemConfig"
                 r"|cuKernelSetAttribute|cuKernelSetCacheConfig|cuProfilerStart|cuProfilerStop|cuProfilerInitialize"
                 r"|cuModuleUnload|cuLibraryUnload|cuStreamDestroy|cuStreamWaitEvent|cuEventDestroy|cuMemHostRegister"
                 r"|cuMemHostUnregister|cuStreamSetAttribute|cuCtxEnablePeerAccess|cuMemAdvise|cuMemPrefetchAsync"
                 r"|cuCtxDestroy|cuEventRecord|cuEventRecordWithFlags|cuEventSynchronize|cuStreamAttachMemAsync"
                 r"|cuStreamCopyAttributes|cuCtxWaitEvent|cuCtxRecordEvent|cuFuncLoad"),
    ("sim_setup", r"(cuInit|cuDevice|cuCtx|cuModule|cuLibrary|cuKernel|cuFunc|cuStreamCreate|cuStreamDestroy"
                  r"|cuStreamWaitEvent|cuStreamQuery|cuEvent|cuProfiler|cuDriverGetVersion|cuGetProcAddress"
                  r"|cuGetExportTable|cuMemHost|cuMemAllocHost|cuMemFreeHost|cuMemGetInfo|cuGetErrorString"
                  r"|cuGetErrorName|cuStreamGet|cuPointerGetAttribute|cuMemGetAddressRange)\w*"),
    ("sim_alloc", r"cuMemAlloc|cuMemAllocAsync|cuMemAllocFromPoolAsync|cuMemAllocManaged"),
    ("sim_free", r"cuMemFree|cuMemFreeAsync"),
    ("memset_1d", r"cuMemsetD(8|16|32)(Async)?"),
    ("launches_kernel", r"cuLaunchKernel|cuLaunchKernelEx"),
    # frees what device_alloc or host_alloc made, its pointer the first parameter (extract leaves
    # one out with its allocation)
    ("frees_alloc", r"cuMemFree|cuMemFreeAsync|cuMemFreeHost"),
    # makes or ends a stream or an event (extract leaves out one no kept call names)
    ("stream_event_life", r"cuStreamCreate|cuStreamCreateWithPriority|cuEventCreate|cuStreamDestroy|cuEventDestroy"),
    # a texture or surface object over memory its resource description names, handed out in the
    # first parameter (extract restores that memory for a kernel given the object)
    ("makes_view_object", r"cuTexObjectCreate|cuSurfObjectCreate"),
    # a cooperative launch (all its blocks resident at once): relaunched through its own entry point
    ("cooperative_launch", r"cuLaunchCooperativeKernel"),
    ("inits_driver", r"cuInit"),
    # the shim (shim/build_shim.py): calls its placement hook answers itself (shim_placement.c),
    # on the ABI names it serves; of those, the ones it only corrects after the real call (they
    # stay pure queries); memory a kernel reaches without a copy, which shim_hostmem.c tracks
    ("shim_placement", r"cuMemAlloc_v2|cuMemFree_v2|cuMemGetAddressRange_v2|cuMemAddressReserve|cuMemAddressFree"
                       r"|cuPointerGetAttributes?|cuIpcGetMemHandle|cuIpcOpenMemHandle(_v2)?|cuIpcCloseMemHandle"),
    ("shim_placement_after", r"cuPointerGetAttributes?"),
    ("host_visible", r"cuMemAllocManaged|cuMemHostAlloc|cuMemHostRegister"),
    ("managed_alloc", r"cuMemAllocManaged"),
    # work a selection (--calls, -k...) may leave out beside kernel launches: graph launches,
    # copies that read device memory back (to the host or the device), memsets
    ("selectable", r"cuGraphLaunch|cuMemcpy(?!HtoD|HtoA)\w*|cuMemset\w*"),
    # hints and host-side lifetimes (caches, scheduling attributes, user objects, graph memory
    # trimming, JIT link steps whose image the module load records): no effect on results;
    # replay counts each as a no-op, export leaves it out
    ("no_effect", r"cuCtxSetCacheConfig|cuCtxSetSharedMemConfig|cuCtxResetPersistingL2Cache|cuCtxSetFlags"
                  r"|cuFuncSetSharedMemConfig|cuKernelSetCacheConfig|cuFuncSetBlockShape|cuFuncSetSharedSize"
                  r"|cuLinkCreate|cuLinkAddData|cuLinkAddFile|cuLinkComplete|cuLinkDestroy|cuFuncLoad"
                  r"|cuStreamSetAttribute|cuStreamCopyAttributes|cuGraphRetainUserObject|cuGraphReleaseUserObject"
                  r"|cuUserObjectCreate|cuUserObjectRetain|cuUserObjectRelease|cuDeviceGraphMemTrim"
                  r"|cuDeviceSetGraphMemAttribute"),
    ("may_batch", r"cuLaunchKernel|cuLaunchKernelEx|cuEventRecord|cuEventRecordWithFlags|cuStreamWaitEvent"
                  r"|cuStreamSynchronize|cuEventSynchronize|cuCtxSynchronize|cuCtxSetCurrent|cuCtxPushCurrent"
                  r"|cuCtxPopCurrent|cuMemsetD(8|16|32)(Async)?|cuMemcpyDtoD(Async)?|cuMemcpy(Async)?|cuMemcpyDtoH"),
]

# Window classes ("window_class" of each ABI name): what a capture window's state keeper does
# with a successful call made outside the window (capture/window.py).
#   work           does work or only asks: never part of the state
#   destroy        ends what its handle arguments made (their state calls are dropped)
#   unmap          ends a mapping, not the reservation it is in
#   capture_begin / capture_end   a stream capture: everything between builds a graph (state)
#   state          creates, loads, sets or makes current: kept until what it made is destroyed
# Rules (pattern on base or ABI name, class), first match wins; anything else is state (a
# lookup such as cuDeviceGet is kept once: later calls use what it returned).
WINDOW_CLASS_RULES = [
    (r"cuStreamBeginCapture\w*", "capture_begin"),
    (r"cuStreamEndCapture\w*", "capture_end"),
    (r"cu(Launch|Memcpy|Memset|MemPrefetch|StreamSynchronize|CtxSynchronize|EventSynchronize|StreamWait"
     r"|EventRecord|StreamWriteValue|StreamBatchMemOp|StreamAddCallback|GraphLaunch|GraphUpload|Profiler"
     r"|EventElapsedTime|StreamQuery|EventQuery|GetProcAddress|GetExportTable|GetErrorName|GetErrorString"
     r"|DriverGetVersion|MemGetInfo|PointerGet|Occupancy|FuncGetAttribute|KernelGetAttribute|FuncGetName"
     r"|KernelGetName|FuncGetParamInfo|KernelGetParamInfo|FuncGetModule|CtxGet(?!.*Graph)|DeviceGet(?!$|_)"
     r"|DeviceTotalMem|DeviceComputeCapability|DeviceCanAccessPeer|DevicePrimaryCtxGetState|StreamGet"
     r"|StreamIsCapturing|ThreadExchangeStreamCaptureMode|MemGetAddressRange|MemGetAllocation|ModuleGetLoadingMode"
     r"|LibraryGetKernelCount|ModuleGetFunctionCount|FlushGPUDirect|CoredumpGet|LogsDump)\w*", "work"),
    (r"cuMemUnmap\w*", "unmap"),
    (r"cu\w*(Destroy|Free|Unload|Release|Unregister|Unmap)(?<!PrimaryCtxRelease)\w*", "destroy"),
]

# Pure queries that cannot block: the shim records each as ONE record after it returns
# (instead of a pre- and a post-record) when its parameters allow ("capture_query"). Runtimes
# issue several per launch (cuCtxGetDevice, cuDevicePrimaryCtxGetState, cuStreamIsCapturing...).
# Matched on the ABI name; every such call is a replay "query" too.
CAPTURE_QUERY_RX = (
    r"cu(CtxGet(Current|Device|Flags|ApiVersion|Id|Limit|CacheConfig|SharedMemConfig|StreamPriorityRange|ExecAffinity)"
    r"|DeviceGet(Attribute|Count|Name|Uuid|Luid|PCIBusId|ByPCIBusId|\b|$)|DeviceTotalMem|DevicePrimaryCtxGetState"
    r"|DriverGetVersion|FuncGetAttribute|KernelGetAttribute|PointerGetAttributes?|StreamIsCapturing|StreamGetCaptureInfo"
    r"|StreamGet(Priority|Flags|Ctx|Id|Device)|StreamQuery|EventQuery|GetErrorName|GetErrorString|MemGetInfo"
    r"|OccupancyMaxActiveBlocksPerMultiprocessor|OccupancyMaxPotentialBlockSize)\w*")

# Special capture handlers (the C wrapper does more than the generic parameter recording).
CAPTURE_RULES = [
    (r"cuModuleLoadData|cuModuleLoadDataEx|cuModuleLoadFatBinary|cuLibraryLoadData|cuLinkAddData",
     "module_image"),
    (r"cuModuleLoad|cuLibraryLoadFromFile|cuLinkAddFile", "module_file"),
    (r"cuLaunchKernel|cuLaunchCooperativeKernel|cuLaunchKernelEx", "launch"),
    (r"cuGetProcAddress", "getproc"),
    (r"cuGetExportTable", "export_table"),
    (r"cuMemcpy2D|cuMemcpy2DUnaligned|cuMemcpy2DAsync|cuMemcpy3D|cuMemcpy3DAsync|cuMemcpy3DPeer"
     r"|cuMemcpy3DPeerAsync", "memcpy_struct"),
    (r"cuMemHostAlloc|cuMemAllocHost|cuMemHostRegister|cuMemAllocManaged", "host_alloc"),
    (r"cuMemFreeHost|cuMemHostUnregister", "host_free"),
    (r"cuMemcpyDtoHAsync|cuMemcpyAtoHAsync", "async_d2h"),
    # unified-addressing copies: an end in host memory is recorded like an H2D source / D2H result
    (r"cuMemcpy|cuMemcpyAsync", "memcpy_unified"),
    # a batch of unified-addressing copies: the same for each host end
    (r"cuMemcpyBatchAsync", "memcpy_batch"),
    # function and kernel handle values may be handed out again for other kernels afterwards
    (r"cuModuleUnload|cuLibraryUnload|cuCtxDestroy|cuDevicePrimaryCtxRelease|cuDevicePrimaryCtxReset", "unload"),
    # an exported / imported POSIX fd: which file it is, and whose export (shim_share.c); legacy
    # IPC handles of placed memory are the placement hook's (shim_placement_ipc.c)
    (r"cuMemExportToShareableHandle|cuMemImportFromShareableHandle", "share"),
]

# ---------------------------------------------------------------------------------------
# Overrides: every hook of a function with semantics of its own, in one entry (the models:
# apitrace's side-effect flags, GFXReconstruct's replay_overrides.json). Keyed by base or ABI
# name (an ABI name's entry is merged over its base's); the generator copies each into the
# description ("overrides"), and every layer finds its hook there, through formats/vocab.py:
#   replay    "module.function" under replay/handlers/: the handler (else by class, or none)
#   errors    replay runs the call even when it failed when recorded
#   via       the driver entry point that handler calls, where it is another
#   family    the family replay counts it under, where not the handler's module
#   export    the Emitter method (export/emit.py and its parts) that writes it; "e_none": left out
#   capture   the shim's capture handler (as CAPTURE_RULES names them), where it has one
#   params    what capture records of its parameters, as PARAMS' entries say it
#   classes   call classes added to the function's (CALL_CLASS_RULES' names): what dump,
#             selection, the simulator and profiling do with it
OVERRIDES = {
    "cuInit": {"replay": "context.init", "errors": True, "export": "e_init", "capture": "init"},
    "cuDevicePrimaryCtxRetain": {"replay": "context.primary_retain", "export": "e_retain"},
    "cuDevicePrimaryCtxRelease": {"replay": "context.primary_release", "export": "e_release"},
    "cuDevicePrimaryCtxReset": {"replay": "context.primary_release", "export": "e_release"},
    "cuDevicePrimaryCtxSetFlags": {"replay": "context.primary_set_flags", "export": "e_primary_flags"},
    "cuCtxCreate": {"replay": "context.ctx_create", "export": "e_ctx_create"},
    "cuCtxDestroy": {"replay": "context.ctx_destroy", "export": "e_ctx_destroy"},
    "cuCtxSetCurrent": {"replay": "context.ctx_set_current", "errors": True, "export": "e_ctx_set"},
    "cuCtxPushCurrent": {"replay": "context.ctx_push", "export": "e_ctx_push"},
    "cuCtxPopCurrent": {"replay": "context.ctx_pop", "export": "e_ctx_pop"},
    "cuCtxSynchronize": {"replay": "context.ctx_sync", "errors": True, "export": "e_ctx_sync"},
    "cuCtxSetLimit": {"replay": "context.ctx_set_limit"},
    "cuCtxRecordEvent": {"replay": "context.ctx_event", "errors": True},
    "cuCtxWaitEvent": {"replay": "context.ctx_event", "errors": True},
    "cuCtxAttach": {"replay": "context.ctx_attach", "export": "e_none"},
    "cuCtxDetach": {"replay": "context.ctx_attach", "export": "e_none"},
    "cuStreamBeginCapture": {"replay": "graph.begin_capture", "errors": True, "export": "e_begin_capture"},
    "cuStreamBeginCaptureToGraph": {"replay": "graph.begin_capture_to_graph", "errors": True, "export": "e_begin_capture_to_graph"},
    "cuStreamEndCapture": {"replay": "graph.end_capture", "errors": True, "export": "e_end_capture"},
    "cuStreamUpdateCaptureDependencies": {"replay": "graph.update_capture_deps", "errors": True},
    "cuThreadExchangeStreamCaptureMode": {"replay": "graph.exchange_capture_mode", "family": "stream", "export": "e_none"},
    "cuGraphAddEmptyNode": {"replay": "graph.add_empty_node", "export": "e_graph_add_empty"},
    "cuGraphAddHostNode": {"replay": "graph.add_host_node", "export": "e_graph_add_empty"},
    "cuGraphAddChildGraphNode": {"replay": "graph.add_child_graph_node", "export": "e_graph_add_child"},
    "cuGraphAddEventRecordNode": {"replay": "graph.add_event_node", "export": "e_graph_add_event"},
    "cuGraphAddEventWaitNode": {"replay": "graph.add_event_node", "export": "e_graph_add_event"},
    "cuGraphAddKernelNode": {"replay": "graph.add_kernel_node", "export": "e_graph_add_kernel"},
    "cuGraphKernelNodeSetParams": {"replay": "graph.kernel_node_set_params", "export": "e_kernel_node_set"},
    "cuGraphExecKernelNodeSetParams": {"replay": "graph.kernel_node_set_params", "export": "e_kernel_node_set"},
    "cuGraphAddNode": {"replay": "graph.add_node", "export": "e_graph_add_node"},
    "cuGraphNodeSetParams": {"replay": "graph.node_set_params", "export": "e_node_set"},
    "cuGraphExecNodeSetParams": {"replay": "graph.node_set_params", "export": "e_node_set"},
    "cuGraphMemsetNodeSetParams": {"replay": "graph.memset_node_set_params", "export": "e_memset_node_set"},
    "cuGraphExecMemsetNodeSetParams": {"replay": "graph.memset_node_set_params", "export": "e_memset_node_set"},
    "cuGraphMemcpyNodeSetParams": {"replay": "graph.memcpy_node_set_params", "export": "e_memcpy_node_set"},
    "cuGraphExecMemcpyNodeSetParams": {"replay": "graph.memcpy_node_set_params", "export": "e_memcpy_node_set"},
    "cuGraphEventRecordNodeSetEvent": {"replay": "graph.event_node_set_event"},
    "cuGraphEventWaitNodeSetEvent": {"replay": "graph.event_node_set_event"},
    "cuGraphExecEventRecordNodeSetEvent": {"replay": "graph.event_node_set_event"},
    "cuGraphExecEventWaitNodeSetEvent": {"replay": "graph.event_node_set_event"},
    "cuGraphExecChildGraphNodeSetParams": {"replay": "graph.exec_child_set_params"},
    "cuGraphNodeSetEnabled": {"replay": "graph.node_set_enabled"},
    "cuGraphAddDependencies": {"replay": "graph.graph_dependencies", "export": "e_graph_deps"},
    "cuGraphRemoveDependencies": {"replay": "graph.graph_dependencies", "export": "e_graph_deps"},
    "cuGraphKernelNodeSetAttribute": {"replay": "graph.kernel_node_attributes", "export": "e_knode_attr"},
    "cuGraphKernelNodeCopyAttributes": {"replay": "graph.kernel_node_attributes"},
    "cuGraphConditionalHandleCreate": {"replay": "graph.conditional_handle_create"},
    "cuGraphInstantiate": {"replay": "graph.graph_instantiate", "errors": True, "export": "e_instantiate"},
    "cuGraphInstantiateWithFlags": {"replay": "graph.graph_instantiate", "errors": True, "export": "e_instantiate"},
    "cuGraphInstantiateWithParams": {"replay": "graph.graph_instantiate_params", "errors": True, "export": "e_instantiate"},
    "cuGraphLaunch": {"replay": "graph.graph_launch", "errors": True},
    "cuGraphUpload": {"replay": "graph.graph_launch", "errors": True},
    "cuGraphExecUpdate": {"replay": "graph.graph_exec_update", "errors": True, "export": "e_exec_update"},
    "cuMemExportToShareableHandle": {"replay": "ipc.mem_export"},
    "cuMemImportFromShareableHandle": {"replay": "ipc.mem_import"},
    "cuIpcGetMemHandle": {"replay": "ipc.ipc_get"},
    "cuIpcOpenMemHandle": {"replay": "ipc.ipc_open"},
    "cuIpcCloseMemHandle": {"replay": "ipc.ipc_close"},
    "cuIpcGetEventHandle": {"replay": "ipc.ipc_event_get"},
    "cuIpcOpenEventHandle": {"replay": "ipc.ipc_event_open"},
    "cuCtxEnablePeerAccess": {"replay": "ipc.enable_peer"},
    "cuCtxDisablePeerAccess": {"replay": "ipc.disable_peer"},
    "cuMemcpyPeer": {"replay": "ipc.memcpy_peer", "errors": True},
    "cuMemcpyPeerAsync": {"replay": "ipc.memcpy_peer", "errors": True},
    "cuLaunchKernel": {"replay": "launch.launch_kernel", "errors": True, "export": "e_launch"},
    "cuLaunchCooperativeKernel": {"replay": "launch.launch_cooperative", "errors": True, "export": "e_launch_coop"},
    "cuLaunchKernelEx": {"replay": "launch.launch_kernel_ex", "errors": True, "export": "e_launch_ex"},
    "cuLaunchHostFunc": {"replay": "launch.host_func", "export": "e_host_func"},
    "cuStreamAddCallback": {"replay": "launch.host_func", "export": "e_host_func"},
    "cuMemAlloc": {"replay": "memory.mem_alloc", "export": "e_alloc"},
    "cuMemAllocManaged": {"replay": "memory.mem_alloc", "export": "e_alloc"},
    "cuMemAllocPitch": {"replay": "memory.mem_alloc_pitch", "export": "e_alloc"},
    "cuMemAllocAsync": {"replay": "memory.mem_alloc_async", "export": "e_alloc"},
    "cuMemAllocFromPoolAsync": {"replay": "memory.mem_alloc_async", "export": "e_alloc"},
    "cuMemFree": {"replay": "memory.mem_free", "export": "e_free"},
    "cuMemFreeAsync": {"replay": "memory.mem_free_async", "export": "e_free_async"},
    "cuMemHostAlloc": {"replay": "memory.host_alloc", "export": "e_host_pin"},
    "cuMemAllocHost": {"replay": "memory.host_alloc", "export": "e_host_pin"},
    "cuMemHostGetDevicePointer": {"replay": "memory.host_dev_ptr"},
    "cuMemFreeHost": {"replay": "memory.host_free", "export": "e_host_unpin"},
    "cuMemHostRegister": {"replay": "memory.host_register", "export": "e_host_pin"},
    "cuMemHostUnregister": {"replay": "memory.host_unregister", "export": "e_host_unpin"},
    "cuMemAdvise": {"replay": "memory.host_ignored", "export": "e_none"},
    "cuMemPrefetchAsync": {"replay": "memory.host_ignored", "export": "e_none"},
    "cuMemRangeGetAttribute": {"replay": "memory.host_ignored", "export": "e_none"},
    "cuStreamAttachMemAsync": {"replay": "memory.host_ignored", "export": "e_none"},
    "cuMemAddressReserve": {"replay": "memory.vmm_reserve", "export": "e_reserve"},
    "cuMemAddressFree": {"replay": "memory.vmm_free", "export": "e_address_free"},
    "cuMemCreate": {"replay": "memory.vmm_create", "export": "e_mem_create"},
    "cuMemRelease": {"replay": "memory.vmm_release", "export": "e_mem_release"},
    "cuMemRetainAllocationHandle": {"replay": "memory.vmm_retain"},
    "cuMemMap": {"replay": "memory.vmm_map", "export": "e_mem_map"},
    "cuMemUnmap": {"replay": "memory.vmm_unmap", "export": "e_mem_unmap"},
    "cuMemSetAccess": {"replay": "memory.vmm_set_access", "export": "e_mem_access"},
    "cuMemPoolCreate": {"replay": "memory.pool_create", "export": "e_none"},
    "cuDeviceGetDefaultMemPool": {"replay": "memory.pool_create", "export": "e_none"},
    "cuDeviceGetMemPool": {"replay": "memory.pool_create", "export": "e_none"},
    "cuMemGetDefaultMemPool": {"replay": "memory.pool_get", "export": "e_none"},
    "cuMemGetMemPool": {"replay": "memory.pool_get", "export": "e_none"},
    "cuMemPoolDestroy": {"replay": "memory.pool_misc", "export": "e_none"},
    "cuMemPoolTrimTo": {"replay": "memory.pool_misc", "export": "e_none"},
    "cuMemPoolSetAttribute": {"replay": "memory.pool_misc", "export": "e_none"},
    "cuMemPoolSetAccess": {"replay": "memory.pool_misc", "export": "e_none"},
    "cuDeviceSetMemPool": {"replay": "memory.pool_misc", "export": "e_none"},
    "cuMemSetMemPool": {"replay": "memory.pool_misc", "export": "e_none"},
    "cuMemcpyHtoD": {"replay": "memory.memcpy_htod", "errors": True, "export": "e_h2d"},
    "cuMemcpyHtoDAsync": {"replay": "memory.memcpy_htod", "errors": True, "export": "e_h2d"},
    "cuMemcpyDtoH": {"replay": "memory.memcpy_dtoh", "errors": True, "export": "e_d2h"},
    "cuMemcpyDtoHAsync": {"replay": "memory.memcpy_dtoh", "errors": True, "export": "e_d2h"},
    "cuMemcpyBatchAsync": {"replay": "memory.memcpy_batch", "errors": True},
    "cuMemcpyDtoD": {"replay": "memory.memcpy_dtod", "errors": True, "export": "e_d2d"},
    "cuMemcpyDtoDAsync": {"replay": "memory.memcpy_dtod", "errors": True, "export": "e_d2d"},
    "cuMemcpy": {"replay": "memory.memcpy_dtod", "errors": True, "export": "e_d2d"},
    "cuMemcpyAsync": {"replay": "memory.memcpy_dtod", "errors": True, "export": "e_d2d"},
    "cuMemcpy2D": {"replay": "memory.memcpy_2d", "errors": True, "export": "e_copy2d"},
    "cuMemcpy2DAsync": {"replay": "memory.memcpy_2d", "errors": True, "export": "e_copy2d"},
    "cuMemcpy2DUnaligned": {"replay": "memory.memcpy_2d", "errors": True, "export": "e_copy2d"},
    "cuMemcpy3D": {"replay": "memory.memcpy_3d", "errors": True},
    "cuMemcpy3DAsync": {"replay": "memory.memcpy_3d", "errors": True},
    "cuMemsetD8": {"replay": "memory.memset", "errors": True, "export": "e_memset"},
    "cuMemsetD16": {"replay": "memory.memset", "errors": True, "export": "e_memset"},
    "cuMemsetD32": {"replay": "memory.memset", "errors": True, "export": "e_memset"},
    "cuMemsetD8Async": {"replay": "memory.memset", "errors": True, "export": "e_memset"},
    "cuMemsetD16Async": {"replay": "memory.memset", "errors": True, "export": "e_memset"},
    "cuMemsetD32Async": {"replay": "memory.memset", "errors": True, "export": "e_memset"},
    "cuMemsetD2D8": {"replay": "memory.memset", "errors": True, "export": "e_memset"},
    "cuMemsetD2D16": {"replay": "memory.memset", "errors": True, "export": "e_memset"},
    "cuMemsetD2D32": {"replay": "memory.memset", "errors": True, "export": "e_memset"},
    "cuMemsetD2D8Async": {"replay": "memory.memset", "errors": True, "export": "e_memset"},
    "cuMemsetD2D16Async": {"replay": "memory.memset", "errors": True, "export": "e_memset"},
    "cuMemsetD2D32Async": {"replay": "memory.memset", "errors": True, "export": "e_memset"},
    "cuModuleLoadData": {"replay": "module.module_load", "errors": True, "via": "cuModuleLoadData", "export": "e_module_load"},
    "cuModuleLoadDataEx": {"replay": "module.module_load", "errors": True, "via": "cuModuleLoadData", "export": "e_module_load"},
    "cuModuleLoadFatBinary": {"replay": "module.module_load", "errors": True, "via": "cuModuleLoadData", "export": "e_module_load"},
    "cuModuleLoad": {"replay": "module.module_load", "errors": True, "via": "cuModuleLoadData", "export": "e_module_load"},
    "cuLibraryLoadData": {"replay": "module.library_load", "errors": True, "via": "cuLibraryLoadData", "export": "e_library_load"},
    "cuLibraryLoadFromFile": {"replay": "module.library_load", "errors": True, "via": "cuLibraryLoadData", "export": "e_library_load"},
    "cuModuleUnload": {"replay": "module.module_unload", "export": "e_module_unload"},
    "cuLibraryUnload": {"replay": "module.library_unload", "export": "e_library_unload"},
    "cuModuleGetFunction": {"replay": "module.module_get_function", "errors": True, "export": "e_get_function"},
    "cuLibraryGetKernel": {"replay": "module.library_get_kernel", "errors": True, "export": "e_get_kernel"},
    "cuKernelGetFunction": {"replay": "module.kernel_get_function", "export": "e_kernel_function"},
    "cuLibraryGetModule": {"replay": "module.library_get_module", "export": "e_library_module"},
    "cuModuleGetGlobal": {"replay": "module.get_global", "export": "e_global"},
    "cuLibraryGetGlobal": {"replay": "module.get_global", "export": "e_global"},
    "cuLibraryGetManaged": {"replay": "module.get_global"},
    "cuFuncSetAttribute": {"replay": "module.func_set_attribute", "export": "e_func_attr"},
    "cuKernelSetAttribute": {"replay": "module.kernel_set_attribute", "export": "e_kernel_attr"},
    "cuFuncSetCacheConfig": {"replay": "module.func_set_cache_config", "export": "e_func_attr"},
    "cuProfilerInitialize": {"replay": "profiler.profiler_control", "export": "e_none"},
    "cuProfilerStart": {"replay": "profiler.profiler_control", "export": "e_none"},
    "cuProfilerStop": {"replay": "profiler.profiler_control", "export": "e_none"},
    "cuStreamWriteValue32": {"replay": "stream.stream_memop", "errors": True},
    "cuStreamWriteValue64": {"replay": "stream.stream_memop", "errors": True},
    "cuStreamWaitValue32": {"replay": "stream.stream_memop", "errors": True},
    "cuStreamWaitValue64": {"replay": "stream.stream_memop", "errors": True},
    "cuArrayCreate": {"replay": "texture.array_create", "errors": True},
    "cuArray3DCreate": {"replay": "texture.array_create", "errors": True},
    "cuTexObjectCreate": {"replay": "texture.tex_create", "errors": True},
    "cuSurfObjectCreate": {"replay": "texture.surf_create", "errors": True},
    "cuMemcpyHtoA": {"replay": "texture.memcpy_array_1d", "errors": True},
    "cuMemcpyHtoAAsync": {"replay": "texture.memcpy_array_1d", "errors": True},
    "cuMemcpyAtoH": {"replay": "texture.memcpy_array_1d", "errors": True},
    "cuMemcpyAtoHAsync": {"replay": "texture.memcpy_array_1d", "errors": True},
    "cuMemcpyDtoA": {"replay": "texture.memcpy_array_1d", "errors": True},
    "cuMemcpyAtoD": {"replay": "texture.memcpy_array_1d", "errors": True},
    "cuMemcpyAtoA": {"replay": "texture.memcpy_array_1d", "errors": True},
    "cuEventElapsedTime": {"export": "e_none"},
    "cuGraphAddMemsetNode": {"replay": "graph.add_memset_node", "export": "e_graph_add_memset"},
    "cuGraphAddMemcpyNode": {"replay": "graph.add_memcpy_node", "export": "e_graph_add_memcpy"},
    "cuGraphGetNodes": {"replay": "graph.node_list", "export": "e_node_list"},
    "cuGraphGetRootNodes": {"replay": "graph.node_list", "export": "e_node_list"},
    "cuGraphNodeGetDependencies": {"replay": "graph.node_list", "export": "e_node_list"},
    "cuGraphNodeGetDependentNodes": {"replay": "graph.node_list", "export": "e_node_list"},
    "cuStreamSynchronize": {"export": "e_stream_sync"},
    "cuEventRecord": {"export": "e_event_record"},
    "cuEventRecordWithFlags": {"export": "e_event_record"},
    "cuStreamWaitEvent": {"export": "e_stream_wait"},
}

# ---------------------------------------------------------------------------------------
# Parameter corrections: {pattern on base/ABI name: {param name: {kind, ...}}}.
# Keys: kind, len_param, count_param, elem_size, count_is_ptr, pointee.
_OUT_PTR = {"kind": "out", "pointee": "void *"}
_BLOB_IN = lambda n: {"kind": "blob_in", "len_param": n}  # noqa: E731
_BLOB_OUT = lambda n: {"kind": "blob_out", "len_param": n}  # noqa: E731
_JIT = {"options": {"kind": "array_in", "count_param": "numOptions", "pointee": "CUjit_option"},
        "optionValues": {"kind": "array_in", "count_param": "numOptions", "pointee": "void *"}}

PARAMS = {
    # --- copies: host pointers are blobs of the byte count
    r"cuMemcpyHtoD|cuMemcpyHtoDAsync|cuMemcpyHtoA|cuMemcpyHtoAAsync": {"srcHost": _BLOB_IN("ByteCount")},
    r"cuMemcpyDtoH|cuMemcpyAtoH": {"dstHost": _BLOB_OUT("ByteCount")},
    # async D2H: the data is only there after the stream syncs; capture "async_d2h" defers it
    r"cuMemcpyDtoHAsync|cuMemcpyAtoHAsync": {"dstHost": _BLOB_OUT("ByteCount")},
    # --- host allocations return host pointers
    r"cuMemAllocHost|cuMemHostAlloc": {"pp": _OUT_PTR},
    r"cuMemHostGetDevicePointer": {"p": {"kind": "val"}},
    r"cuMemHostGetFlags": {"p": {"kind": "val"}},
    r"cuGetProcAddress": {"pfn": _OUT_PTR, "funcPtr": _OUT_PTR},
    r"cuGetExportTable": {"ppExportTable": _OUT_PTR},
    r"cuLibraryGetUnifiedFunction": {"fptr": _OUT_PTR},
    # --- module / library images and JIT options
    r"cuModuleLoadData": {"image": {"kind": "val"}},
    r"cuModuleLoadDataEx": {"image": {"kind": "val"}, **_JIT},
    r"cuModuleLoadFatBinary": {"fatCubin": {"kind": "val"}},
    r"cuLinkCreate": _JIT,
    r"cuLinkAddData": {"data": _BLOB_IN("size"), **_JIT},
    r"cuLinkAddFile": _JIT,
    r"cuLinkComplete": {"cubinOut": _OUT_PTR, "sizeOut": {"kind": "out"}},
    r"cuLibraryLoadData|cuLibraryLoadFromFile": {
        "code": {"kind": "val"},
        "jitOptions": {"kind": "array_in", "count_param": "numJitOptions", "pointee": "CUjit_option"},
        "jitOptionsValues": {"kind": "array_in", "count_param": "numJitOptions", "pointee": "void *"},
        "libraryOptions": {"kind": "array_in", "count_param": "numLibraryOptions", "pointee": "CUlibraryOption"},
        "libraryOptionValues": {"kind": "array_in", "count_param": "numLibraryOptions", "pointee": "void *"},
    },
    # --- launches: kernelParams/extra are decoded by the "launch" capture handler
    r"cuLaunchKernel|cuLaunchCooperativeKernel|cuLaunchKernelEx": {
        "kernelParams": {"kind": "opaque"}, "extra": {"kind": "opaque"}},
    r"cuLaunchCooperativeKernelMultiDevice": {
        "launchParamsList": {"kind": "array_in", "count_param": "numDevices", "pointee": "CUDA_LAUNCH_PARAMS"}},
    # --- name / string buffers
    r"cuDeviceGetName": {"name": {"kind": "array_out", "count_param": "len", "elem_size": 1}},
    r"cuDeviceGetLuid": {"luid": {"kind": "out", "pointee": "char[8]", "pointee_size": 8}},  # 8-byte LUID
    r"cuDeviceGetPCIBusId": {"pciBusId": {"kind": "array_out", "count_param": "len", "elem_size": 1}},
    r"cuGraphDebugDotPrint": {"path": {"kind": "str"}},
    r"cuGraphInstantiate": {"logBuffer": {"kind": "array_out", "count_param": "bufferSize", "elem_size": 1}},
    r"cuLogsDumpToMemory": {"buffer": {"kind": "array_out", "count_param": "size", "elem_size": 1,
                                       "count_is_ptr": True}},
    # --- attribute getters writing a value whose size depends on the attribute
    r"cuPointerGetAttribute": {"data": {"kind": "opaque"}},
    r"cuPointerGetAttributes": {
        "attributes": {"kind": "array_in", "count_param": "numAttributes", "pointee": "CUpointer_attribute"},
        "data": {"kind": "array_in", "count_param": "numAttributes", "pointee": "void *"}},
    r"cuMemRangeGetAttribute": {"data": {"kind": "blob_out", "len_param": "dataSize"}},
    r"cuMemRangeGetAttributes": {
        "data": {"kind": "array_in", "count_param": "numAttributes", "pointee": "void *"},
        "dataSizes": {"kind": "array_in", "count_param": "numAttributes", "pointee": "size_t"},
        "attributes": {"kind": "array_in", "count_param": "numAttributes", "pointee": "CUmem_range_attribute"}},
    r"cuMemPoolGetAttribute|cuMemPoolSetAttribute|cuDeviceGetGraphMemAttribute|cuDeviceSetGraphMemAttribute"
    r"|cuCoredumpGetAttribute\w*|cuCoredumpSetAttribute\w*": {"value": {"kind": "opaque"}},
    r"cuMemGetHandleForAddressRange": {"handle": {"kind": "opaque"}},
    # a POSIX fd (an int) is written there; fabric handles (64 bytes) keep only their first 4
    r"cuMemExportToShareableHandle": {"shareableHandle": {"kind": "out", "pointee": "int", "pointee_size": 4}},
    r"cuMemImportFromShareableHandle|cuMemPoolImportFromShareableHandle": {"osHandle": {"kind": "val"}},
    r"cuStreamAddCallback|cuLaunchHostFunc|cuUserObjectCreate|cuDeviceRegisterAsyncNotification"
    r"|cuLogsRegisterCallback": {"userData": {"kind": "val"}, "ptr": {"kind": "val"}},
    # --- graph topology arrays (counts given in/out through pointers)
    r"cuGraphGetEdges": {
        "from": {"kind": "array_out", "count_param": "numEdges", "count_is_ptr": True},
        "to": {"kind": "array_out", "count_param": "numEdges", "count_is_ptr": True},
        "edgeData": {"kind": "array_out", "count_param": "numEdges", "count_is_ptr": True}},
    r"cuGraphNodeGetDependencies": {
        "edgeData": {"kind": "array_out", "count_param": "numDependencies", "count_is_ptr": True}},
    r"cuGraphNodeGetDependentNodes": {
        "edgeData": {"kind": "array_out", "count_param": "numDependentNodes", "count_is_ptr": True}},
    r"cuGraphAddDependencies|cuGraphRemoveDependencies": {
        "from": {"kind": "array_in", "count_param": "numDependencies"},
        "to": {"kind": "array_in", "count_param": "numDependencies"},
        "edgeData": {"kind": "array_in", "count_param": "numDependencies"}},
    r"cuGraphAdd\w+Node|cuGraphAddNode|cuStreamBeginCaptureToGraph|cuStreamUpdateCaptureDependencies"
    r"|cuGraphConditionalHandleCreate": {
        "dependencies": {"kind": "array_in", "count_param": "numDependencies"},
        "dependencyData": {"kind": "array_in", "count_param": "numDependencies"}},
    r"cuStreamGetCaptureInfo": {
        "dependencies_out": {"kind": "out"}, "edgeData_out": {"kind": "out"}},
    r"cuGraphExecUpdate": {"resultInfo": {"kind": "out_struct"}},
    # --- arrays with counts the name heuristic misses
    r"cuGraphicsMapResources|cuGraphicsUnmapResources": {
        "resources": {"kind": "array_in", "count_param": "count"}},
    r"cuSignalExternalSemaphoresAsync|cuWaitExternalSemaphoresAsync": {
        "extSemArray": {"kind": "array_in", "count_param": "numExtSems"},
        "paramsArray": {"kind": "array_in", "count_param": "numExtSems"}},
    r"cuStreamBatchMemOp": {"paramArray": {"kind": "array_in", "count_param": "count"}},
    r"cuMemMapArrayAsync": {"mapInfoList": {"kind": "array_in", "count_param": "count"}},
    r"cuMemSetAccess": {"desc": {"kind": "array_in", "count_param": "count"}},
    r"cuMemPoolSetAccess": {"map": {"kind": "array_in", "count_param": "count"}},
    r"cuMemcpyBatchAsync": {
        "dsts": {"kind": "array_in", "count_param": "count"},
        "srcs": {"kind": "array_in", "count_param": "count"},
        "sizes": {"kind": "array_in", "count_param": "count"},
        "attrs": {"kind": "array_in", "count_param": "numAttrs"},
        "attrsIdxs": {"kind": "array_in", "count_param": "numAttrs"},
        "failIdx": {"kind": "out"}},
    r"cuMemcpy3DBatchAsync": {"opList": {"kind": "array_in", "count_param": "numOps"}, "failIdx": {"kind": "out"}},
    r"cuMemPrefetchBatchAsync|cuMemDiscardBatchAsync|cuMemDiscardAndPrefetchBatchAsync": {
        "dptrs": {"kind": "array_in", "count_param": "count"},
        "sizes": {"kind": "array_in", "count_param": "count"},
        "prefetchLocs": {"kind": "array_in", "count_param": "numPrefetchLocs"},
        "prefetchLocIdxs": {"kind": "array_in", "count_param": "numPrefetchLocs"}},
    r"cuMemBatchDecompressAsync": {"paramsArray": {"kind": "array_in", "count_param": "count"},
                                   "errorIndex": {"kind": "out"}},
    r"cuCtxCreate": {"paramsArray": {"kind": "array_in", "count_param": "numParams"}},
    r"cuDevResourceGenerateDesc": {"resources": {"kind": "array_in", "count_param": "nbResources"}},
    r"cuDevSmResourceSplitByCount": {"result": {"kind": "array_out", "count_param": "nbGroups",
                                                "count_is_ptr": True},
                                     "remaining": {"kind": "out_struct"}},
    r"cuLibraryEnumerateKernels": {"kernels": {"kind": "array_out", "count_param": "numKernels"}},
    r"cuModuleEnumerateFunctions": {"functions": {"kind": "array_out", "count_param": "numFunctions"}},
    r"cuTensorMapEncodeTiled|cuTensorMapEncodeIm2col|cuTensorMapEncodeIm2colWide": {
        "globalAddress": {"kind": "val"},
        "globalDim": {"kind": "array_in", "count_param": "tensorRank"},
        "globalStrides": {"kind": "array_in", "count_param": "tensorRank"},
        "boxDim": {"kind": "array_in", "count_param": "tensorRank"},
        "elementStrides": {"kind": "array_in", "count_param": "tensorRank"},
        "pixelBoxLowerCorner": {"kind": "array_in", "count_param": "tensorRank"},
        "pixelBoxUpperCorner": {"kind": "array_in", "count_param": "tensorRank"}},
    r"cuTensorMapReplaceAddress": {"tensorMap": {"kind": "inout_struct"}, "globalAddress": {"kind": "val"}},
    r"cuOccupancyMaxPotentialBlockSize\w*": {"blockSizeToDynamicSMemSize": {"kind": "val"}},
    r"cuStreamGetAttribute|cuGraphKernelNodeGetAttribute": {"value_out": {"kind": "out_struct"}},
    r"cuCheckpointProcessLock|cuCheckpointProcessCheckpoint|cuCheckpointProcessRestore|cuCheckpointProcessUnlock": {
        "args": {"kind": "in_struct"}},
    r"cuParamSetv": {"ptr": _BLOB_IN("numbytes")},
    # --- non-const struct pointers that are inputs (cuda.h lacks the const)
    r"cuCtxCreate_v4": {"ctxCreateParams": {"kind": "in_struct"}},
    r"cuGraphNodeSetParams|cuGraphExecNodeSetParams": {"nodeParams": {"kind": "in_struct"}},
    r"cuMemGetDefaultMemPool|cuMemGetMemPool|cuMemSetMemPool|cuMemPoolGetAccess": {
        "location": {"kind": "in_struct"}},
    r"cuMemPoolImportPointer": {"shareData": {"kind": "in_struct"}},
    # --- structs the driver reads and writes back (e.g. the dptr of a mem-alloc node)
    r"cuGraphAddMemAllocNode|cuGraphAddNode": {"nodeParams": {"kind": "inout_struct"}},
    r"cuGraphInstantiateWithParams": {"instantiateParams": {"kind": "inout_struct"}},
    # --- fixed-size float vectors
    r"cuTexRefSetBorderColor": {"pBorderColor": {"kind": "in_struct", "pointee": "float[4]", "pointee_size": 16}},
    r"cuTexRefGetBorderColor": {"pBorderColor": {"kind": "out_struct", "pointee": "float[4]", "pointee_size": 16}},
    # --- variable-size attribute values
    r"cuCoredumpGetAttribute\w*": {"value": {"kind": "array_out", "count_param": "size", "count_is_ptr": True,
                                            "elem_size": 1, "pointee": "char"}},
    r"cuCoredumpSetAttribute\w*": {"value": {"kind": "array_in", "count_param": "size", "count_is_ptr": True,
                                            "elem_size": 1, "pointee": "char"}},
    # graph memory attributes are all cuuint64_t
    r"cuDeviceGetGraphMemAttribute": {"value": {"kind": "out", "pointee": "cuuint64_t", "pointee_size": 8}},
    r"cuDeviceSetGraphMemAttribute": {"value": {"kind": "in_struct", "pointee": "cuuint64_t", "pointee_size": 8}},
    r"cuMemPoolExportToShareableHandle": {"handle_out": {"kind": "opaque"}},
    r"cuDeviceGetHostAtomicCapabilities|cuDeviceGetP2PAtomicCapabilities": {
        "capabilities": {"kind": "array_out", "count_param": "count"},
        "operations": {"kind": "array_in", "count_param": "count"}},
    # --- GL / EGL / VDPAU interop (cudaGL.h, cudaEGL.h, cudaVDPAU.h)
    # the driver fills up to cudaDeviceCount devices, *pCudaDeviceCount says how many
    r"cuGLGetDevices": {"pCudaDevices": {"kind": "array_out", "count_param": "cudaDeviceCount"}},
    # VdpGetProcAddress *: the caller's VDPAU entry-point getter (a function pointer), an input
    r"cuVDPAUGetDevice|cuVDPAUCtxCreate": {"vdpGetProcAddress": {"kind": "val"}},
    # the connection handle is written by *Connect*, read through the pointer by the frame calls,
    # read (and possibly cleared) by *Disconnect*; the stream pointer's direction is not
    # documented: recorded before and after
    r"cuEGLStreamConsumerDisconnect|cuEGLStreamProducerDisconnect": {"conn": {"kind": "inout_struct"}},
    r"cuEGLStreamConsumerAcquireFrame|cuEGLStreamConsumerReleaseFrame|cuEGLStreamProducerPresentFrame"
    r"|cuEGLStreamProducerReturnFrame": {"conn": {"kind": "in_struct"}, "pStream": {"kind": "inout_struct"}},
}
