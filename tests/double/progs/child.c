/* child.c -- does CUDA work, then fork+execs itself as a child that also does CUDA
 * work ("child"), and a child that never touches CUDA ("plain"); waits for both.
 *   child            parent mode
 *   child child      CUDA child (2 launches)
 *   child plain      no CUDA at all */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common.h"

static double work(int launches) {
    enum { N = 64 };
    float h[N] = {0};
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUdeviceptr d;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuMemAlloc(&d, sizeof h));
    CK(cuMemcpyHtoD(d, h, sizeof h));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&f, mod, "add_one"));
    int n = N;
    void *args[] = {&d, &n};
    for (int i = 0; i < launches; i++) LAUNCH(cuLaunchKernel(f, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL));
    CK(cuMemcpyDtoH(h, d, sizeof h));
    CK(cuMemFree(d));
    double s = 0;
    for (int i = 0; i < N; i++) s += h[i];
    return s;
}

static int spawn(const char *self, const char *mode) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, mode, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "plain") == 0) {
        printf("PLAIN pid %d\n", (int)getpid());
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "child") == 0) {
        double s = work(2);
        printf("CHILD CHECKSUM %.1f\n", s);
        printf("CHILD LAUNCHES %ld\n", g_launches);
        return 0;
    }
    double s = work(3);
    printf("PARENT CHECKSUM %.1f\n", s);
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) return 1;
    self[k] = 0;
    int a = spawn(self, "child");
    int b = spawn(self, "plain");
    printf("CHILD_STATUS %d %d\n", a, b);
    printf("LAUNCHES %ld\n", g_launches);
    return a || b;
}
