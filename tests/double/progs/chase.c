/* chase.c -- allocates buffers of different sizes (64 B .. 8 MiB, plus one VMM mapping),
 * writes a marker into each, stores their device pointers in a device-memory table
 * (H2D) and launches `chase`, which reads out[i] = *(u64*)table[i] through the stored
 * pointers.  Prints every pointer and value: proves where replay placed allocations.
 * argv[1] = "novmm" skips the VMM buffer. */
#include <string.h>
#include "common.h"

int main(int argc, char **argv) {
    int use_vmm = !(argc > 1 && strcmp(argv[1], "novmm") == 0);
    static const size_t sizes[] = {64, 256, 4096, 65536, 1 << 20, 3 << 20, 8 << 20};
    enum { NS = sizeof sizes / sizeof sizes[0], MAXB = NS + 1 };
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUdeviceptr bufs[MAXB], table, out, scratch;
    unsigned long long ptrs[MAXB], vals[MAXB], marks[MAXB];
    int nb = 0;

    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuMemAlloc(&scratch, 12345)); /* churn: a hole in the layout */
    for (int i = 0; i < NS; i++) {
        CK(cuMemAlloc(&bufs[nb], sizes[i]));
        nb++;
        if (i == 2) CK(cuMemFree(scratch));
    }
    size_t vmm_size = 0;
    CUmemGenericAllocationHandle mh = 0;
    if (use_vmm) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        CK(cuMemGetAllocationGranularity(&vmm_size, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
        CK(cuMemAddressReserve(&bufs[nb], vmm_size, 0, 0, 0));
        CK(cuMemCreate(&mh, vmm_size, &prop, 0));
        CK(cuMemMap(bufs[nb], vmm_size, 0, mh, 0));
        CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CK(cuMemSetAccess(bufs[nb], vmm_size, &acc, 1));
        nb++;
    }
    for (int i = 0; i < nb; i++) {
        marks[i] = 0xC0DE000000000000ULL | ((unsigned long long)i << 32) | (unsigned long long)(i * 7919);
        ptrs[i] = bufs[i];
        CK(cuMemcpyHtoD(bufs[i], &marks[i], sizeof marks[i]));
    }
    CK(cuMemAlloc(&table, sizeof ptrs));
    CK(cuMemAlloc(&out, sizeof vals));
    CK(cuMemcpyHtoD(table, ptrs, nb * sizeof ptrs[0]));
    CK(cuMemsetD8(out, 0, sizeof vals));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&f, mod, "chase"));
    int n = nb;
    void *args[] = {&table, &out, &n};
    LAUNCH(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    CK(cuMemcpyDtoH(vals, out, nb * sizeof vals[0]));
    int ok = 1;
    for (int i = 0; i < nb; i++) {
        printf("BUF %d size %zu ptr 0x%llx val 0x%llx\n", i, i < NS ? sizes[i] : vmm_size, ptrs[i], vals[i]);
        ok &= vals[i] == marks[i];
    }
    if (use_vmm) {
        CK(cuMemUnmap(bufs[NS], vmm_size));
        CK(cuMemRelease(mh));
        CK(cuMemAddressFree(bufs[NS], vmm_size));
    }
    for (int i = 0; i < NS; i++) CK(cuMemFree(bufs[i]));
    CK(cuMemFree(table));
    CK(cuMemFree(out));
    CK(cuModuleUnload(mod));
    CK(cuDevicePrimaryCtxRelease(dev));
    printf("CHASE %s\n", ok ? "OK" : "BAD");
    printf("LAUNCHES %ld\n", g_launches);
    return ok ? 0 : 2;
}
