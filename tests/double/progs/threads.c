/* threads.c -- 4 threads share the primary context; each allocates, copies and
 * launches incr K times (argv[1], default 50) on its own stream, then checks. The threads
 * wait for each other once they hold their stream and allocation, so the four live at once
 * (their handles and addresses are distinct) and their launches interleave. */
#include <pthread.h>
#include "common.h"

enum { NT = 4, N = 256 };
static CUcontext g_ctx;
static CUfunction g_incr;
static int g_iters;
static long g_counts[NT];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t g_held;

static void *worker(void *arg) {
    long t = (long)arg;
    int h[N];
    CUdeviceptr d;
    CUstream s;
    CK(cuCtxSetCurrent(g_ctx));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuMemAlloc(&d, sizeof h));
    pthread_barrier_wait(&g_held);
    for (int i = 0; i < N; i++) h[i] = (int)t * 1000;
    CK(cuMemcpyHtoDAsync(d, h, sizeof h, s));
    int n = N;
    void *args[] = {&d, &n};
    for (int k = 0; k < g_iters; k++) {
        CK(cuLaunchKernel(g_incr, 1, 1, 1, N, 1, 1, 0, s, args, NULL));
        g_counts[t]++;
    }
    CK(cuMemcpyDtoHAsync(h, d, sizeof h, s));
    CK(cuStreamSynchronize(s));
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= h[i] == (int)t * 1000 + g_iters;
    CK(cuMemFree(d));
    CK(cuStreamDestroy(s));
    pthread_mutex_lock(&g_mu);
    printf("THREAD %ld COUNT %ld %s\n", t, g_counts[t], ok ? "OK" : "BAD");
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

int main(int argc, char **argv) {
    g_iters = argc > 1 ? atoi(argv[1]) : 50;
    CUdevice dev;
    CUmodule mod;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&g_ctx, dev));
    CK(cuCtxSetCurrent(g_ctx));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&g_incr, mod, "incr"));
    pthread_t th[NT];
    pthread_barrier_init(&g_held, NULL, NT);
    for (long t = 0; t < NT; t++) pthread_create(&th[t], NULL, worker, (void *)t);
    for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
    long total = 0;
    for (int t = 0; t < NT; t++) total += g_counts[t];
    CK(cuModuleUnload(mod));
    CK(cuDevicePrimaryCtxRelease(dev));
    printf("LAUNCHES %ld\n", total);
    return 0;
}
