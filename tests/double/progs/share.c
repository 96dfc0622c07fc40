/* share.c -- two processes share device memory through a POSIX-fd shareable handle, as
 * NCCL's cuMem transport does. The owner (rank 0) creates a VMM allocation that can be
 * exported, fills it, exports it and sends the fd to a forked peer over a UNIX socket
 * (SCM_RIGHTS). The peer (rank 1, exec'd) imports it, maps it, runs add_one over it, reads
 * it back and tells the owner; the owner reads the peer's result from its own mapping.
 *   share              owner: prints OWNER CHECKSUM
 *   share peer FD      peer (the socket is FD): prints PEER CHECKSUM
 * SHARE_PEER_DIE=1: the peer exits (status 3) right after importing, without answering. */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common.h"
#include "fdpass.h"

enum { N = 1024, SIZE = 2 << 20 };

static void setup(CUcontext *ctx) {
    CUdevice dev;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(ctx, dev));
    CK(cuCtxSetCurrent(*ctx));
}

static CUdeviceptr map_handle(CUmemGenericAllocationHandle h) { return map_handle_size(h, SIZE); }

static double sum(const float *h) {
    double s = 0;
    for (int i = 0; i < N; i++) s += h[i];
    return s;
}

static int peer(int sock) {
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUmemGenericAllocationHandle h;
    static float out[N];
    const char *nap = getenv("SHARE_PEER_SLEEP_MS");     /* tests of paced group replay */
    if (nap) usleep(1000u * (unsigned)atoi(nap));
    setup(&ctx);
    int fd = recv_fd(sock);
    CK(cuMemImportFromShareableHandle(&h, (void *)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    if (getenv("SHARE_PEER_DIE")) _exit(3);
    CUdeviceptr p = map_handle(h);
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&f, mod, "add_one"));
    int n = N;
    void *args[] = {&p, &n};
    LAUNCH(cuLaunchKernel(f, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL));
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH(out, p, sizeof out));
    printf("PEER CHECKSUM %.1f\n", sum(out));
    fflush(stdout);
    if (write(sock, "D", 1) != 1) return 1;
    CK(cuMemUnmap(p, SIZE));
    CK(cuMemRelease(h));
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "peer") == 0) return peer(atoi(argv[2]));
    CUcontext ctx;
    CUmemGenericAllocationHandle h;
    static float in[N], out[N];
    int sv[2];
    setup(&ctx);
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CK(cuMemCreate(&h, SIZE, &prop, 0));
    CUdeviceptr p = map_handle(h);
    for (int i = 0; i < N; i++) in[i] = (float)i;
    CK(cuMemcpyHtoD(p, in, sizeof in));
    int fd;
    CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) { perror("socketpair"); return 1; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        char arg[16];
        snprintf(arg, sizeof arg, "%d", sv[1]);
        execl(argv[0], argv[0], "peer", arg, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    send_fd(sv[0], fd);
    close(fd);                               /* as NCCL's proxy does, right after sending */
    char done = 0;
    int got = (int)read(sv[0], &done, 1);
    int st = 0;
    waitpid(pid, &st, 0);
    if (got != 1 || !WIFEXITED(st) || WEXITSTATUS(st)) { fprintf(stderr, "peer failed\n"); return 4; }
    CK(cuMemcpyDtoH(out, p, sizeof out));    /* the peer's add_one, seen from here */
    printf("OWNER CHECKSUM %.1f\n", sum(out));
    CK(cuMemUnmap(p, SIZE));
    CK(cuMemRelease(h));
    return 0;
}
