/* jobwin.c -- a two-rank training loop that reads its peer's memory, as an NCCL job does
 * through the cuMem transport. Rank 0 forks and execs rank 1; each rank creates a VMM
 * buffer that can be exported, fills it, exports it and sends the fd to the other over a
 * UNIX socket (SCM_RIGHTS), imports the other's and maps it. Then, per step:
 *   add_one(own); barrier; saxpy(0.5, peer, acc) (acc += 0.5 * the peer's buffer); D2H of acc;
 *   barrier
 * so each step reads what the peer wrote that step (the barriers order it), 2 launches a
 * step per rank. At the end each rank prints "RANK r CHECKSUM s".
 *   jobwin [STEPS]               rank 0 (STEPS default 6)
 *   jobwin peer FD STEPS         rank 1 (the socket is FD)
 * With LOCAL_RANK set (a launcher's numbering), rank 1 gets LOCAL_RANK=1. JOBWIN_COLL=1: each
 * step also launches a kernel named as an NCCL collective (add_one on acc): rank 0 first in
 * the step, rank 1 after its add_one, so at a launch number the ranks differ in collectives.
 * JOBWIN_EXIT=1: each rank ends with _exit(0) right after printing (no teardown, as
 * torchrun's workers often end). JOBWIN_STEP_MS=M: each step ends with an M ms sleep (time
 * for flight-recorder checkpoints between steps). JOBWIN_LIB=library: after step 0 each rank
 * loads a library and from then on launches its add_one kernel (a CUkernel, as the runtime
 * launches it) on acc each step, as a runtime loads a library when a kernel of it is first
 * needed; JOBWIN_LIB=module: a module (as XLA loads each new executable's). */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common.h"
#include "fdpass.h"

enum { N = 1024, SIZE = 2 << 20 };

static CUdeviceptr map_handle(CUmemGenericAllocationHandle h) { return map_handle_size(h, SIZE); }

static void barrier(int sock) {
    char b = 'B';
    if (write(sock, &b, 1) != 1 || read(sock, &b, 1) != 1) { perror("barrier"); exit(1); }
}

static int run(int rank, int sock, long steps) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction add_one, saxpy;
    CUmemGenericAllocationHandle own_h, peer_h;
    static float h[N], out[N];
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&add_one, mod, "add_one"));
    CK(cuModuleGetFunction(&saxpy, mod, "saxpy"));
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CK(cuMemCreate(&own_h, SIZE, &prop, 0));
    CUdeviceptr own = map_handle(own_h), acc;
    CK(cuMemAlloc(&acc, sizeof h));
    for (int i = 0; i < N; i++) h[i] = (float)(i * (rank + 1));
    CK(cuMemcpyHtoD(own, h, sizeof h));
    memset(h, 0, sizeof h);
    CK(cuMemcpyHtoD(acc, h, sizeof h));
    int fd;
    CK(cuMemExportToShareableHandle(&fd, own_h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    int pfd;
    if (rank == 0) { send_fd(sock, fd); pfd = recv_fd(sock); }
    else { pfd = recv_fd(sock); send_fd(sock, fd); }
    close(fd);
    CK(cuMemImportFromShareableHandle(&peer_h, (void *)(long)pfd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(pfd);
    CUdeviceptr peer = map_handle(peer_h);
    barrier(sock);
    int n = N;
    float half = 0.5f;
    const char *nap = getenv("JOBWIN_STEP_MS");
    CUfunction coll = NULL;
    if (getenv("JOBWIN_COLL")) {
        CUmodule cm;
        CK(cuModuleLoadData(&cm, "CUDADOUBLE\nkernel ncclDevKernel_AllReduce_Sum_f32_RING_LL\n"));
        CK(cuModuleGetFunction(&coll, cm, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
    }
    CUfunction late = NULL;
    const char *late_kind = getenv("JOBWIN_LIB");
    for (long s = 0; s < steps; s++) {
        void *a1[] = {&own, &n};
        void *ac[] = {&acc, &n};
        if (s == 1 && late_kind && strcmp(late_kind, "module") == 0) {
            CUmodule lm;
            CK(cuModuleLoadData(&lm, "CUDADOUBLE\nkernel add_one\n"));
            CK(cuModuleGetFunction(&late, lm, "add_one"));
        } else if (s == 1 && late_kind) {
            CUlibrary lib;
            CUkernel lk;
            CK(cuLibraryLoadData(&lib, "CUDADOUBLE\nkernel add_one\n", NULL, NULL, 0, NULL, NULL, 0));
            CK(cuLibraryGetKernel(&lk, lib, "add_one"));
            late = (CUfunction)lk;
        }
        if (late) LAUNCH(cuLaunchKernel(late, 1, 1, 1, N, 1, 1, 0, NULL, ac, NULL));
        if (coll && rank == 0) LAUNCH(cuLaunchKernel(coll, 1, 1, 1, N, 1, 1, 0, NULL, ac, NULL));
        LAUNCH(cuLaunchKernel(add_one, 1, 1, 1, N, 1, 1, 0, NULL, a1, NULL));
        if (coll && rank == 1) LAUNCH(cuLaunchKernel(coll, 1, 1, 1, N, 1, 1, 0, NULL, ac, NULL));
        CK(cuCtxSynchronize());
        barrier(sock);
        void *a2[] = {&half, &peer, &acc, &n};
        LAUNCH(cuLaunchKernel(saxpy, 1, 1, 1, N, 1, 1, 0, NULL, a2, NULL));
        CK(cuCtxSynchronize());
        CK(cuMemcpyDtoH(out, acc, sizeof out));
        barrier(sock);
        if (nap) usleep(1000u * (unsigned)atoi(nap));
    }
    double sum = 0;
    for (int i = 0; i < N; i++) sum += out[i];
    printf("RANK %d CHECKSUM %.1f\n", rank, sum);
    fflush(stdout);
    if (getenv("JOBWIN_EXIT")) _exit(0);
    barrier(sock);
    CK(cuMemUnmap(peer, SIZE));
    CK(cuMemRelease(peer_h));
    CK(cuMemUnmap(own, SIZE));
    CK(cuMemRelease(own_h));
    CK(cuMemFree(acc));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 3 && strcmp(argv[1], "peer") == 0) return run(1, atoi(argv[2]), atol(argv[3]));
    long steps = argc > 1 ? atol(argv[1]) : 6;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) { perror("socketpair"); return 1; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        char a[16], b[24];
        snprintf(a, sizeof a, "%d", sv[1]);
        snprintf(b, sizeof b, "%ld", steps);
        if (getenv("LOCAL_RANK")) setenv("LOCAL_RANK", "1", 1);   /* as a launcher numbers its workers */
        execl(argv[0], argv[0], "peer", a, b, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    int rc = run(0, sv[0], steps);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) { fprintf(stderr, "peer failed\n"); return 4; }
    return rc;
}
