/* sigwait.c -- does CUDA work, prints "READY", then waits for signals (at most 60 s):
 * prints "GOT <signo>" for each SIGINT, SIGHUP, SIGUSR1, SIGUSR2 or SIGTERM delivered; on
 * SIGTERM it makes one more launch, prints "LAUNCHES <n>" and exits 0.  Used to test that
 * `cudasnap capture` forwards signals to the program (and sends each only once). */
#include <signal.h>
#include <string.h>
#include <time.h>
#include "common.h"

static volatile sig_atomic_t counts[65];

static void on_signal(int s) { counts[s]++; }

int main(void) {
    enum { N = 64 };
    float h[N] = {0};
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUdeviceptr d;
    int sigs[] = {SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGTERM};
    for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuMemAlloc(&d, sizeof h));
    CK(cuMemcpyHtoD(d, h, sizeof h));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&f, mod, "add_one"));
    int n = N;
    void *args[] = {&d, &n};
    LAUNCH(cuLaunchKernel(f, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL));
    CK(cuCtxSynchronize());
    printf("READY\n");
    fflush(stdout);
    int seen[65] = {0};
    for (int tick = 0; tick < 6000; tick++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
            int s = sigs[i];
            while (seen[s] < counts[s]) {
                seen[s]++;
                printf("GOT %d\n", s);
                fflush(stdout);
            }
        }
        if (seen[SIGTERM]) {
            LAUNCH(cuLaunchKernel(f, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL));
            CK(cuMemcpyDtoH(h, d, sizeof h));
            printf("LAUNCHES %ld\n", g_launches);
            return 0;
        }
    }
    return 3;
}
