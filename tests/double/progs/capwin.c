/* capwin.c -- stream capture inside a training-loop shape: `capwin STEPS [once]` (once: the
 * graph is captured and instantiated at step 0 only, then destroyed, and its executable graph
 * launched every step, as PyTorch's CUDA-graph trees do). Each step launches
 * add_one eagerly on a buffer, captures (global mode) three incr launches on a stream into a
 * graph, instantiates and launches the graph, and reads both buffers back; prints "STEP i"
 * and "SUM s". Launches 4k (eager) and 4k+1..4k+3 (captured) belong to step k (once: 0-3 to
 * step 0, then one eager launch a step). A capture
 * window or checkpoint must do no synchronous work inside a capture: the double, like the
 * driver, fails such a call and invalidates the capture. */
#include "common.h"

int main(int argc, char **argv) {
    long steps = argc > 1 ? atol(argv[1]) : 4;
    int once = argc > 2 && argv[2][0] == 'o';
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    enum { N = 256 };
    static float h[N];
    static int hi[N];
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction add_one, incr;
    CUdeviceptr a, b;
    CUstream st;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&add_one, mod, "add_one"));
    CK(cuModuleGetFunction(&incr, mod, "incr"));
    CK(cuMemAlloc(&a, sizeof h));
    CK(cuMemAlloc(&b, sizeof hi));
    for (int i = 0; i < N; i++) { h[i] = (float)i; hi[i] = i; }
    CK(cuMemcpyHtoD(a, h, sizeof h));
    CK(cuMemcpyHtoD(b, hi, sizeof hi));
    CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    int n = N;
    double sum = 0;
    for (long s = 0; s < steps; s++) {
        void *aargs[] = {&a, &n};
        void *bargs[] = {&b, &n};
        LAUNCH(cuLaunchKernel(add_one, 1, 1, 1, N, 1, 1, 0, st, aargs, NULL));
        if (!once || s == 0) {
            CK(cuStreamBeginCapture_v2(st, CU_STREAM_CAPTURE_MODE_GLOBAL));
            for (int k = 0; k < 3; k++) LAUNCH(cuLaunchKernel(incr, 1, 1, 1, N, 1, 1, 0, st, bargs, NULL));
            CK(cuStreamEndCapture(st, &g));
            CK(cuGraphInstantiateWithFlags(&x, g, 0));
            if (once) { CK(cuGraphDestroy(g)); g = NULL; }      /* the executable graph outlives it */
        }
        CK(cuGraphLaunch(x, st));
        CK(cuStreamSynchronize(st));
        CK(cuMemcpyDtoH(h, a, sizeof h));
        CK(cuMemcpyDtoH(hi, b, sizeof hi));
        for (int i = 0; i < N; i++) sum += h[i] + hi[i];
        if (!once) {
            CK(cuGraphExecDestroy(x));
            CK(cuGraphDestroy(g));
        }
        printf("STEP %ld\n", s);
    }
    if (once) CK(cuGraphExecDestroy(x));
    printf("SUM %.1f\n", sum);
    return 0;
}
