/* Independent launch counter for the GPU suite: a CUPTI injection library
 * (CUDA_INJECTION64_PATH). It counts driver-API kernel launch calls as CUPTI sees them
 * inside libcuda, independently of cudasnap's interception, and writes the count to
 * $CUPTI_COUNT_FILE at exit. Built on the GPU machine by tests/gpu/run_gpu_suite.sh. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned long long launches;

static void CUPTIAPI on_api(void *ud, CUpti_CallbackDomain dom, CUpti_CallbackId cbid, const void *data) {
    const CUpti_CallbackData *cb = (const CUpti_CallbackData *)data;
    if (dom != CUPTI_CB_DOMAIN_DRIVER_API || cb->callbackSite != CUPTI_API_ENTER) return;
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunch:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchGrid:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchGridAsync:
        __atomic_fetch_add(&launches, 1, __ATOMIC_RELAXED);
    default: break;
    }
}

static void report(void) {
    const char *f = getenv("CUPTI_COUNT_FILE");
    FILE *o = f ? fopen(f, "w") : stderr;
    if (!o) return;
    fprintf(o, "%llu\n", launches);
    if (f) fclose(o);
}

int InitializeInjection(void) {
    CUpti_SubscriberHandle sub;
    if (cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_api, NULL) != CUPTI_SUCCESS) return 0;
    cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API);
    atexit(report);
    return 1;
}
