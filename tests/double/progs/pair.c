/* pair.c -- test program for the cudasnap CUDA driver TEST DOUBLE: two processes (the parent
 * forks and execs itself as rank 1), each runs STEPS launches of a kernel named like an NCCL
 * all-reduce over its own buffer, synchronizing after each, then reads its buffer back. Rank 1
 * starts PAIR_LATE_MS later (default 50), so rank 0's "collectives" are the ones that wait. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common.h"

#define N 256
#define STEPS 3
static const char MOD[] = "CUDADOUBLE\nkernel ncclDevKernel_AllReduce_Sum_f32_RING_LL\n";

static int rank_main(int rank) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUdeviceptr p;
    static float h[N];
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, MOD));
    CK(cuModuleGetFunction(&f, mod, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
    CK(cuMemAlloc(&p, sizeof h));
    CK(cuMemsetD32(p, 0, N));
    int n = N;
    void *args[] = {&p, &n};
    for (int i = 0; i < STEPS; i++) {
        LAUNCH(cuLaunchKernel(f, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL));
        CK(cuCtxSynchronize());
    }
    CK(cuMemcpyDtoH(h, p, sizeof h));
    double s = 0;
    for (int i = 0; i < N; i++) s += h[i];
    printf("RANK %d SUM %.1f\n", rank, s);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "rank1") == 0) {
        const char *late = getenv("PAIR_LATE_MS");
        usleep(1000u * (unsigned)(late ? atoi(late) : 50));
        return rank_main(1);
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl(argv[0], argv[0], "rank1", (char *)NULL);
        _exit(127);
    }
    int rc = rank_main(0);
    int st = 0;
    waitpid(pid, &st, 0);
    return rc || !WIFEXITED(st) || WEXITSTATUS(st);
}
