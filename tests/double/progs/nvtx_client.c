/* nvtx_client.c -- an NVTX v3 client without the NVTX headers: like libnvToolsExt (or any
 * header-only NVTX instance) it loads the injection library named by NVTX_INJECTION64_PATH,
 * calls its InitializeInjectionNvtx2 with an export-table getter, then calls the function
 * pointers the injection filled in. Two such instances exist here, as in a process whose
 * libraries each compiled the NVTX headers in. Ranges: "setup" (made before the first driver
 * call), "step" x ITERS each holding a "mylib" domain range "registered step" around an
 * add_one launch, a start/end range, a mark, a wide-character range; cuProfilerStart/Stop
 * around the launches. Prints LAUNCHES n. */
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <wchar.h>
#include "common.h"

typedef void (*fp_t)(void);
typedef struct {
    uint16_t version, size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type, reserved0;
    uint64_t payload;
    int32_t message_type;
    const void *message;
} attrs_t;  /* nvtxEventAttributes_v2 */
typedef struct {
    size_t struct_size;
    int (*get_module_table)(int module, fp_t ***out_table, unsigned int *out_size);
} callbacks_t;

/* one NVTX instance: its function pointer slots (core module 1, core2 module 5) */
typedef struct {
    fp_t core[16], core2[16];
    fp_t *core_tab[17], *core2_tab[17];
    callbacks_t cb;
} instance_t;

static instance_t inst[2];
static int cur;

static int get_module_table(int module, fp_t ***out_table, unsigned int *out_size) {
    instance_t *I = &inst[cur];
    if (module != 1 && module != 5) return 0;
    *out_table = module == 1 ? I->core_tab : I->core2_tab;
    *out_size = 16;
    return 1;
}

static const void *get_export_table(uint32_t id) { return id == 1 ? &inst[cur].cb : NULL; }

static int inject(int which) {
    instance_t *I = &inst[which];
    for (int i = 0; i < 16; i++) { I->core_tab[i] = &I->core[i]; I->core2_tab[i] = &I->core2[i]; }
    I->core_tab[0] = I->core2_tab[0] = NULL;      /* slot 0: invalid id */
    I->cb.struct_size = sizeof I->cb;
    I->cb.get_module_table = get_module_table;
    const char *path = getenv("NVTX_INJECTION64_PATH");
    if (!path) return 0;
    void *h = dlopen(path, RTLD_LAZY);
    if (!h) { fprintf(stderr, "dlopen %s: %s\n", path, dlerror()); return 0; }
    int (*init)(const void *(*)(uint32_t)) = (int (*)(const void *(*)(uint32_t)))dlsym(h, "InitializeInjectionNvtx2");
    if (!init) return 0;
    cur = which;
    return init(get_export_table);
}

typedef int (*push_a_t)(const char *);
typedef int (*push_w_t)(const wchar_t *);
typedef int (*pop_t)(void);
typedef uint64_t (*start_a_t)(const char *);
typedef void (*end_t)(uint64_t);
typedef void (*mark_a_t)(const char *);
typedef const void *(*domain_create_t)(const char *);
typedef const void *(*regstr_fn)(const void *, const char *);
typedef int (*dpush_t)(const void *, const attrs_t *);
typedef int (*dpop_t)(const void *);
#define CALL(I, tab, slot, T, ...) ((I)->tab[slot] ? ((T)(I)->tab[slot])(__VA_ARGS__) : 0)
#define CALLV(I, tab, slot, T, ...) do { if ((I)->tab[slot]) ((T)(I)->tab[slot])(__VA_ARGS__); } while (0)

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 3;
    enum { N = 256 };
    static float h[N];
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUdeviceptr d;
    instance_t *A = &inst[0], *B = &inst[1];

    int injected = inject(0);
    printf("INJECTED %d\n", injected);
    int lvl = CALL(A, core, 9, push_a_t, "setup");
    printf("SETUP LEVEL %d\n", lvl);
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuCtxCreate(&ctx, NULL, 0, dev));
    CK(cuMemAlloc(&d, sizeof h));
    CK(cuMemcpyHtoD(d, h, sizeof h));
    CK(cuModuleLoadData(&mod, MODULE_TEXT));
    CK(cuModuleGetFunction(&f, mod, "add_one"));
    CALL(A, core, 11, pop_t);

    const void *dom = CALL(A, core2, 12, domain_create_t, "mylib");
    const void *reg = CALL(A, core2, 10, regstr_fn, dom, "registered step");
    attrs_t at;
    memset(&at, 0, sizeof at);
    at.version = 3; at.size = sizeof at; at.message_type = 3; at.message = reg;
    int n = N;
    void *args[] = {&d, &n};
    CK(cuProfilerStart());
    for (int i = 0; i < iters; i++) {
        CALL(A, core, 9, push_a_t, "step");
        CALL(A, core2, 4, dpush_t, dom, &at);
        LAUNCH(cuLaunchKernel(f, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL));
        CALL(A, core2, 5, dpop_t, dom);
        CALL(A, core, 11, pop_t);
    }
    CK(cuProfilerStop());
    uint64_t id = CALL(A, core, 5, start_a_t, "async range");
    CALLV(A, core, 2, mark_a_t, "marker");
    CALL(A, core, 10, push_w_t, L"wide \u2603");
    CALL(A, core, 11, pop_t);
    CK(cuCtxSynchronize());
    CALLV(A, core, 7, end_t, id);

    inject(1);                                    /* a second NVTX instance in the process */
    CALL(B, core, 9, push_a_t, "second instance");
    CK(cuMemcpyDtoH(h, d, sizeof h));
    CALL(B, core, 11, pop_t);
    CK(cuMemFree(d));
    CK(cuModuleUnload(mod));
    CK(cuCtxDestroy(ctx));
    printf("CHECKSUM %.1f\n", (double)h[0]);
    printf("LAUNCHES %ld\n", g_launches);
    return 0;
}
