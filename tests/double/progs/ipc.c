/* ipc.c -- legacy CUDA IPC between two processes. The owner allocates with cuMemAlloc, fills
 * it, gets a cuIpcMemHandle and passes it (hex) to a child it execs; the child opens it, runs
 * add_one over it, reads it back and closes it; then the owner reads the child's result.
 *   ipc              owner: prints OWNER CHECKSUM (exit 5 when cuIpcGetMemHandle fails)
 *   ipc HEX [EVHEX]  child: prints CHILD CHECKSUM
 * IPC_EVENT=1: the owner also records an interprocess event after its upload and hands its
 * handle over; the child opens it and makes its stream wait on it before its kernel, as
 * PyTorch does with a CUDA tensor sent to another process. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common.h"

enum { N = 1024 };

static void setup(void) {
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
}

static double sum(CUdeviceptr p) {
    static float h[N];
    CK(cuMemcpyDtoH(h, p, sizeof h));
    double s = 0;
    for (int i = 0; i < N; i++) s += h[i];
    return s;
}

int main(int argc, char **argv) {
    setup();
    if (argc > 1) {
        CUipcMemHandle h;
        for (int i = 0; i < (int)sizeof h; i++) sscanf(argv[1] + 2 * i, "%2hhx", (unsigned char *)&h + i);
        CUdeviceptr p;
        CUmodule mod;
        CUfunction f;
        CK(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
        CUevent ev = NULL;
        if (argc > 2) {
            CUipcEventHandle eh;
            for (int i = 0; i < (int)sizeof eh; i++) sscanf(argv[2] + 2 * i, "%2hhx", (unsigned char *)&eh + i);
            CK(cuIpcOpenEventHandle(&ev, eh));
            CK(cuStreamWaitEvent(NULL, ev, 0));
        }
        CK(cuModuleLoadData(&mod, MODULE_TEXT));
        CK(cuModuleGetFunction(&f, mod, "add_one"));
        int n = N;
        void *args[] = {&p, &n};
        LAUNCH(cuLaunchKernel(f, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL));
        printf("CHILD CHECKSUM %.1f\n", sum(p));
        CK(cuIpcCloseMemHandle(p));
        if (ev) CK(cuEventDestroy(ev));
        return 0;
    }
    static float in[N];
    for (int i = 0; i < N; i++) in[i] = (float)(2 * i);
    CUdeviceptr p;
    CK(cuMemAlloc(&p, 4 << 20));
    CK(cuMemcpyHtoD(p, in, sizeof in));
    CUipcMemHandle h;
    CUresult r = cuIpcGetMemHandle(&h, p);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuIpcGetMemHandle failed: CUresult %d\n", (int)r);
        return 5;
    }
    char hex[2 * sizeof h + 1], evhex[2 * sizeof(CUipcEventHandle) + 1] = "";
    for (int i = 0; i < (int)sizeof h; i++) sprintf(hex + 2 * i, "%02x", ((unsigned char *)&h)[i]);
    CUevent ev = NULL;
    if (getenv("IPC_EVENT")) {
        CUipcEventHandle eh;
        CK(cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
        CK(cuEventRecord(ev, NULL));
        CK(cuIpcGetEventHandle(&eh, ev));
        for (int i = 0; i < (int)sizeof eh; i++) sprintf(evhex + 2 * i, "%02x", ((unsigned char *)&eh)[i]);
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl(argv[0], argv[0], hex, ev ? evhex : NULL, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) { fprintf(stderr, "child failed\n"); return 4; }
    printf("OWNER CHECKSUM %.1f\n", sum(p));
    CK(cuMemFree(p));
    if (ev) CK(cuEventDestroy(ev));
    return 0;
}
