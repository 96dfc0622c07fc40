/* queries.c -- the query pattern of a framework's launch path: per iteration, three
 * cuCtxGetDevice, one cuDevicePrimaryCtxGetState and a launch; every 50th iteration
 * cuMemGetInfo (its answer changes as memory is allocated). The three cuCtxGetDevice write
 * to three places, as from different call sites. Two threads do it, the second
 * with its own allocation. Prints how many of each call it made. */
#include <pthread.h>
#include "common.h"

static CUcontext ctx;
static CUfunction f;
static int iters;
static long n_getdev[2], n_state[2], n_info[2];

static void *work(void *arg) {
    int t = (int)(long)arg;
    CK(cuCtxSetCurrent(ctx));
    CUdeviceptr d;
    CK(cuMemAlloc(&d, 4096));
    int n = 1024;
    void *args[] = {&d, &n};
    for (int i = 0; i < iters; i++) {
        CUdevice dev, devs[3]; unsigned flags; int active;   /* three call sites: three out pointers */
        for (int k = 0; k < 3; k++) { CK(cuCtxGetDevice(&devs[k])); n_getdev[t]++; }
        dev = devs[2];
        CK(cuDevicePrimaryCtxGetState(dev, &flags, &active)); n_state[t]++;
        if (i % 50 == 0) {
            size_t fr, tot; CUdeviceptr tmp;
            CK(cuMemAlloc(&tmp, 1 << 16));
            CK(cuMemGetInfo(&fr, &tot)); n_info[t]++;
        }
        CK(cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
    }
    return NULL;
}

int main(int argc, char **argv) {
    iters = argc > 1 ? atoi(argv[1]) : 500;
    CUdevice dev; CUmodule mod;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&f, mod, "add_one"));
    pthread_t th;
    pthread_create(&th, NULL, work, (void *)1L);
    work((void *)0L);
    pthread_join(th, NULL);
    CK(cuCtxSynchronize());
    printf("CALLS cuCtxGetDevice %ld cuDevicePrimaryCtxGetState %ld cuMemGetInfo %ld\n",
           n_getdev[0] + n_getdev[1], n_state[0] + n_state[1], n_info[0] + n_info[1]);
    return 0;
}
