/* NVTX ranges, recorded without changing the program.
 *
 * NVTX v3 (the nvtx3 headers compiled into libraries, libnvToolsExt, torch.cuda.nvtx, the
 * `nvtx` Python package) loads the library named by NVTX_INJECTION64_PATH at its first call
 * and calls its InitializeInjectionNvtx2 with a function that hands out export tables. The
 * CALLBACKS table (id 1) gives, per module, an array of pointers to the NVTX instance's own
 * function pointer slots; an injection fills the slots it implements. `cudasnap capture`
 * names this library (the preloaded shim itself) as the injection. Each header-only NVTX
 * instance initializes on its own, so InitializeInjectionNvtx2 may be called several times.
 *
 * Every event becomes a CS_REC_NVTX record: op in `fn`, the range id / nesting level / domain
 * id in `seq`, the message (UTF-8) in F_NAME, the domain id in F_HANDLE (absent: the default
 * domain). A domain's name comes once, in its DOMAIN record. Events before the process's first
 * driver call (its ring opens then: a process that never calls the driver gets no snapshot)
 * wait in a small buffer and are written when the ring opens.
 * Included by shim_core.c. */

enum { CS_NVTX_PUSH = 1, CS_NVTX_POP = 2, CS_NVTX_START = 3, CS_NVTX_END = 4, CS_NVTX_MARK = 5,
       CS_NVTX_DOMAIN = 6 };

/* NVTX ids (nvtxDetail/nvtxTypes.h of NVTX v3) */
enum { CS_NVTX_ETID_CALLBACKS = 1, CS_NVTX_MODULE_CORE = 1, CS_NVTX_MODULE_CORE2 = 5 };
enum { /* core module slots */
    CS_NVTX_MarkEx = 1, CS_NVTX_MarkA = 2, CS_NVTX_MarkW = 3, CS_NVTX_RangeStartEx = 4,
    CS_NVTX_RangeStartA = 5, CS_NVTX_RangeStartW = 6, CS_NVTX_RangeEnd = 7, CS_NVTX_RangePushEx = 8,
    CS_NVTX_RangePushA = 9, CS_NVTX_RangePushW = 10, CS_NVTX_RangePop = 11 };
enum { /* core2 (domain) module slots */
    CS_NVTX_DomainMarkEx = 1, CS_NVTX_DomainRangeStartEx = 2, CS_NVTX_DomainRangeEnd = 3,
    CS_NVTX_DomainRangePushEx = 4, CS_NVTX_DomainRangePop = 5, CS_NVTX_DomainRegisterStringA = 10,
    CS_NVTX_DomainRegisterStringW = 11, CS_NVTX_DomainCreateA = 12, CS_NVTX_DomainCreateW = 13,
    CS_NVTX_DomainDestroy = 14, CS_NVTX_Initialize = 15 };
/* event attributes (nvtxEventAttributes_v2): message type at 32, message at 40 */
enum { CS_NVTX_MSG_ASCII = 1, CS_NVTX_MSG_UNICODE = 2, CS_NVTX_MSG_REGISTERED = 3 };
#define CS_NVTX_ATTR_MSG_END 48

typedef void (*cs_nvtx_fp)(void);
typedef struct {
    size_t struct_size;
    int (*get_module_table)(int module, cs_nvtx_fp ***out_table, unsigned int *out_size);
} cs_nvtx_callbacks;
typedef const void *(*cs_nvtx_get_table)(uint32_t id);

#define CS_NVTX_NAME_MAX 2048
#define CS_NVTX_MAGIC_DOMAIN 0x4e56444fu   /* our handles carry a magic word: anything else */
#define CS_NVTX_MAGIC_STRING 0x4e565354u   /* handed to us reads as no name */
typedef struct { uint32_t magic; uint32_t id; char name[]; } cs_nvtx_domain;
typedef struct { uint32_t magic; uint32_t len; char text[]; } cs_nvtx_string;

static int cs_nvtx_on;                     /* injected, in a capture session */
static uint32_t cs_nvtx_next_domain = 1;   /* 0 is the default domain */
static uint64_t cs_nvtx_next_range = 1;
#define CS_NVTX_DEPTHS 32
CS_TLS int cs_nvtx_depth[CS_NVTX_DEPTHS];  /* push nesting per domain id (ids past the end: 0) */

/* --- events before the ring opens ------------------------------------------------------ */
typedef struct { uint16_t op; uint32_t domain; uint64_t id, tid, t; char *name; uint32_t len; } cs_nvtx_ev;
#define CS_NVTX_PENDING 1024
static cs_nvtx_ev cs_nvtx_pend[CS_NVTX_PENDING];
static int cs_nvtx_npend;
static uint64_t cs_nvtx_pend_lost;
static pthread_mutex_t cs_nvtx_lock = PTHREAD_MUTEX_INITIALIZER;

static void cs_nvtx_write(uint16_t op, uint32_t domain, uint64_t id, uint64_t tid, uint64_t t,
                          const char *name, uint32_t len) {
    cs_rec r;
    uint32_t n = (uint32_t)sizeof(cs_rec_hdr) + (name ? cs_flen(len) : 0) + (domain ? cs_flen(8) : 0);
    if (cs_reserve(&r, n, CS_REC_NVTX)) return;
    r.h->fn = op; r.h->seq = id; r.h->tid = tid; r.h->t_ns = t;
    if (name) cs_put(&r, CS_F_NAME, CS_T_STR, name, len);
    if (domain) cs_put_val(&r, CS_F_HANDLE, domain);
    cs_publish(&r);
}

/* Write what waited for the ring (the ring is open). */
static void cs_nvtx_flush(void) {
    pthread_mutex_lock(&cs_nvtx_lock);
    for (int i = 0; i < cs_nvtx_npend; i++) {
        cs_nvtx_ev *e = &cs_nvtx_pend[i];
        cs_nvtx_write(e->op, e->domain, e->id, e->tid, e->t, e->name, e->len);
        free(e->name);
        e->name = NULL;
    }
    __atomic_store_n(&cs_nvtx_npend, 0, __ATOMIC_RELEASE);
    uint64_t lost = cs_nvtx_pend_lost;
    cs_nvtx_pend_lost = 0;
    pthread_mutex_unlock(&cs_nvtx_lock);
    if (lost) {
        char msg[200];
        snprintf(msg, sizeof msg, "%llu NVTX event(s) made before the first CUDA driver call were not kept "
                 "(only the first %d are)", (unsigned long long)lost, CS_NVTX_PENDING);
        cs_note(msg);
    }
}

/* shim_core.c: the ring just opened (cs_start, under its lock) */
static void cs_nvtx_ring_opened(void) {
    if (__atomic_load_n(&cs_nvtx_npend, __ATOMIC_ACQUIRE) || cs_nvtx_pend_lost) cs_nvtx_flush();
}

/* a forked child starts with nothing waiting: what is there belongs to the parent */
static void cs_nvtx_atfork_child(void) {
    pthread_mutex_init(&cs_nvtx_lock, NULL);
    cs_nvtx_npend = 0;
    cs_nvtx_pend_lost = 0;
    memset(cs_nvtx_depth, 0, sizeof cs_nvtx_depth);
}

static void cs_nvtx_event(uint16_t op, uint32_t domain, uint64_t id, const char *name) {
    uint64_t t = cs_now();
    uint32_t len = name ? (uint32_t)strnlen(name, CS_NVTX_NAME_MAX) : 0;
    cs_win_nvtx(op, id, name);            /* windows by NVTX range (shim_window.c) */
    int st = __atomic_load_n(&cs_state, __ATOMIC_ACQUIRE);
    if (st == 1) {
        if (__atomic_load_n(&cs_nvtx_npend, __ATOMIC_ACQUIRE)) cs_nvtx_flush();   /* keep each thread's order */
        cs_nvtx_write(op, domain, id, cs_thread(), t, name, len);
        return;
    }
    if (st == -1) return;                  /* not recorded (no ring could be made) */
    pthread_mutex_lock(&cs_nvtx_lock);
    if (__atomic_load_n(&cs_state, __ATOMIC_ACQUIRE) == 1) {
        pthread_mutex_unlock(&cs_nvtx_lock);
        cs_nvtx_flush();
        cs_nvtx_write(op, domain, id, cs_thread(), t, name, len);
        return;
    }
    if (cs_nvtx_npend < CS_NVTX_PENDING) {
        cs_nvtx_ev *e = &cs_nvtx_pend[cs_nvtx_npend];
        e->op = op; e->domain = domain; e->id = id; e->tid = cs_thread(); e->t = t; e->len = len;
        e->name = NULL;
        if (name && (e->name = malloc(len ? len : 1)) != NULL) memcpy(e->name, name, len);
        __atomic_store_n(&cs_nvtx_npend, cs_nvtx_npend + 1, __ATOMIC_RELEASE);
    } else {
        cs_nvtx_pend_lost++;
    }
    pthread_mutex_unlock(&cs_nvtx_lock);
}

/* --- messages ---------------------------------------------------------------------------- */
/* wchar_t (UTF-32 on Linux) to UTF-8, NUL-terminated, cut at whole characters */
static const char *cs_nvtx_utf8(const wchar_t *w, char *out, size_t cap) {
    size_t n = 0;
    if (!w) return NULL;
    for (; *w && n + 5 < cap; w++) {
        uint32_t c = (uint32_t)*w;
        if (c > 0x10FFFF || (c >= 0xD800 && c < 0xE000)) c = 0xFFFD;
        if (c < 0x80) out[n++] = (char)c;
        else if (c < 0x800) { out[n++] = (char)(0xC0 | c >> 6); out[n++] = (char)(0x80 | (c & 0x3F)); }
        else if (c < 0x10000) {
            out[n++] = (char)(0xE0 | c >> 12); out[n++] = (char)(0x80 | ((c >> 6) & 0x3F));
            out[n++] = (char)(0x80 | (c & 0x3F));
        } else {
            out[n++] = (char)(0xF0 | c >> 18); out[n++] = (char)(0x80 | ((c >> 12) & 0x3F));
            out[n++] = (char)(0x80 | ((c >> 6) & 0x3F)); out[n++] = (char)(0x80 | (c & 0x3F));
        }
    }
    out[n] = 0;
    return out;
}

static const char *cs_nvtx_registered(const void *h) {
    const cs_nvtx_string *s = h;
    return s && s->magic == CS_NVTX_MAGIC_STRING ? s->text : NULL;
}

/* The message of an event attributes structure (NULL: none); `buf` holds a converted one. */
static const char *cs_nvtx_message(const void *attr, char *buf, size_t cap) {
    const unsigned char *a = attr;
    if (!a) return NULL;
    uint16_t size;
    memcpy(&size, a + 2, 2);
    if (size < CS_NVTX_ATTR_MSG_END) return NULL;
    int32_t type;
    const void *msg;
    memcpy(&type, a + 32, 4);
    memcpy(&msg, a + 40, sizeof msg);
    switch (type) {
    case CS_NVTX_MSG_ASCII: return msg;
    case CS_NVTX_MSG_UNICODE: return cs_nvtx_utf8(msg, buf, cap);
    case CS_NVTX_MSG_REGISTERED: return cs_nvtx_registered(msg);
    default: return NULL;
    }
}

static uint32_t cs_nvtx_domain_id(const void *h) {
    const cs_nvtx_domain *d = h;
    return d && d->magic == CS_NVTX_MAGIC_DOMAIN ? d->id : 0;
}

static int cs_nvtx_push(uint32_t domain, const char *name) {
    int level = domain < CS_NVTX_DEPTHS ? cs_nvtx_depth[domain]++ : 0;
    cs_nvtx_event(CS_NVTX_PUSH, domain, (uint64_t)level, name);
    return level;
}

static int cs_nvtx_pop(uint32_t domain) {
    int level = 0;
    if (domain < CS_NVTX_DEPTHS) {
        if (cs_nvtx_depth[domain] <= 0) return -1;     /* nothing pushed: NVTX's error value */
        level = --cs_nvtx_depth[domain];
    }
    cs_nvtx_event(CS_NVTX_POP, domain, (uint64_t)level, NULL);
    return level;
}

static uint64_t cs_nvtx_start(uint32_t domain, const char *name) {
    uint64_t id = __atomic_fetch_add(&cs_nvtx_next_range, 1, __ATOMIC_RELAXED);
    cs_nvtx_event(CS_NVTX_START, domain, id, name);
    return id;
}

/* --- the callbacks ------------------------------------------------------------------------ */
static void cs_nvtx_MarkEx(const void *attr) {
    char b[CS_NVTX_NAME_MAX]; cs_nvtx_event(CS_NVTX_MARK, 0, 0, cs_nvtx_message(attr, b, sizeof b));
}
static void cs_nvtx_MarkA(const char *m) { cs_nvtx_event(CS_NVTX_MARK, 0, 0, m); }
static void cs_nvtx_MarkW(const wchar_t *m) {
    char b[CS_NVTX_NAME_MAX]; cs_nvtx_event(CS_NVTX_MARK, 0, 0, cs_nvtx_utf8(m, b, sizeof b));
}
static uint64_t cs_nvtx_RangeStartEx(const void *attr) {
    char b[CS_NVTX_NAME_MAX]; return cs_nvtx_start(0, cs_nvtx_message(attr, b, sizeof b));
}
static uint64_t cs_nvtx_RangeStartA(const char *m) { return cs_nvtx_start(0, m); }
static uint64_t cs_nvtx_RangeStartW(const wchar_t *m) {
    char b[CS_NVTX_NAME_MAX]; return cs_nvtx_start(0, cs_nvtx_utf8(m, b, sizeof b));
}
static void cs_nvtx_RangeEnd(uint64_t id) { cs_nvtx_event(CS_NVTX_END, 0, id, NULL); }
static int cs_nvtx_RangePushEx(const void *attr) {
    char b[CS_NVTX_NAME_MAX]; return cs_nvtx_push(0, cs_nvtx_message(attr, b, sizeof b));
}
static int cs_nvtx_RangePushA(const char *m) { return cs_nvtx_push(0, m); }
static int cs_nvtx_RangePushW(const wchar_t *m) {
    char b[CS_NVTX_NAME_MAX]; return cs_nvtx_push(0, cs_nvtx_utf8(m, b, sizeof b));
}
static int cs_nvtx_RangePop(void) { return cs_nvtx_pop(0); }

static void cs_nvtx_DomainMarkEx(const void *d, const void *attr) {
    char b[CS_NVTX_NAME_MAX];
    cs_nvtx_event(CS_NVTX_MARK, cs_nvtx_domain_id(d), 0, cs_nvtx_message(attr, b, sizeof b));
}
static uint64_t cs_nvtx_DomainRangeStartEx(const void *d, const void *attr) {
    char b[CS_NVTX_NAME_MAX]; return cs_nvtx_start(cs_nvtx_domain_id(d), cs_nvtx_message(attr, b, sizeof b));
}
static void cs_nvtx_DomainRangeEnd(const void *d, uint64_t id) {
    cs_nvtx_event(CS_NVTX_END, cs_nvtx_domain_id(d), id, NULL);
}
static int cs_nvtx_DomainRangePushEx(const void *d, const void *attr) {
    char b[CS_NVTX_NAME_MAX]; return cs_nvtx_push(cs_nvtx_domain_id(d), cs_nvtx_message(attr, b, sizeof b));
}
static int cs_nvtx_DomainRangePop(const void *d) { return cs_nvtx_pop(cs_nvtx_domain_id(d)); }

static const void *cs_nvtx_new_string(const char *s) {
    size_t n = s ? strnlen(s, CS_NVTX_NAME_MAX - 1) : 0;
    cs_nvtx_string *h = malloc(sizeof *h + n + 1);     /* lives as long as the process */
    if (!h) return NULL;
    h->magic = CS_NVTX_MAGIC_STRING; h->len = (uint32_t)n;
    if (n) memcpy(h->text, s, n);
    h->text[n] = 0;
    return h;
}
static const void *cs_nvtx_DomainRegisterStringA(const void *d, const char *s) { return cs_nvtx_new_string(s); }
static const void *cs_nvtx_DomainRegisterStringW(const void *d, const wchar_t *s) {
    char b[CS_NVTX_NAME_MAX]; return cs_nvtx_new_string(cs_nvtx_utf8(s, b, sizeof b));
}

static const void *cs_nvtx_new_domain(const char *name) {
    size_t n = name ? strnlen(name, CS_NVTX_NAME_MAX - 1) : 0;
    cs_nvtx_domain *d = malloc(sizeof *d + n + 1);     /* never freed: a handle may outlive its destroy */
    if (!d) return NULL;
    d->magic = CS_NVTX_MAGIC_DOMAIN;
    d->id = __atomic_fetch_add(&cs_nvtx_next_domain, 1, __ATOMIC_RELAXED);
    if (n) memcpy(d->name, name, n);
    d->name[n] = 0;
    cs_nvtx_event(CS_NVTX_DOMAIN, 0, d->id, d->name);
    return d;
}
static const void *cs_nvtx_DomainCreateA(const char *name) { return cs_nvtx_new_domain(name); }
static const void *cs_nvtx_DomainCreateW(const wchar_t *name) {
    char b[CS_NVTX_NAME_MAX]; return cs_nvtx_new_domain(cs_nvtx_utf8(name, b, sizeof b));
}
static void cs_nvtx_DomainDestroy(const void *d) { (void)d; }
static void cs_nvtx_Initialize(const void *reserved) { (void)reserved; }

/* --- injection entry point ----------------------------------------------------------------- */
static void cs_nvtx_fill(const cs_nvtx_callbacks *cb, int module, const int *slots, cs_nvtx_fp const *fns, int n) {
    cs_nvtx_fp **table = NULL;
    unsigned int size = 0;
    if (!cb->get_module_table(module, &table, &size) || !table) return;
    for (int i = 0; i < n; i++)
        if ((unsigned int)slots[i] < size && table[slots[i]]) *table[slots[i]] = fns[i];
}

#define CS_FP(f) ((cs_nvtx_fp)(void *)(f))
__attribute__((visibility("default"))) int InitializeInjectionNvtx2(cs_nvtx_get_table get) {
    const char *session = getenv("CUDASNAP_SESSION");
    if (!get || !session || !*session) return 0;     /* not capturing: NVTX stays a no-op */
    const cs_nvtx_callbacks *cb = get(CS_NVTX_ETID_CALLBACKS);
    if (!cb || cb->struct_size < sizeof *cb || !cb->get_module_table) return 0;
    static const int core[] = {CS_NVTX_MarkEx, CS_NVTX_MarkA, CS_NVTX_MarkW, CS_NVTX_RangeStartEx,
                               CS_NVTX_RangeStartA, CS_NVTX_RangeStartW, CS_NVTX_RangeEnd, CS_NVTX_RangePushEx,
                               CS_NVTX_RangePushA, CS_NVTX_RangePushW, CS_NVTX_RangePop};
    const cs_nvtx_fp core_fns[] = {CS_FP(cs_nvtx_MarkEx), CS_FP(cs_nvtx_MarkA), CS_FP(cs_nvtx_MarkW),
                                   CS_FP(cs_nvtx_RangeStartEx), CS_FP(cs_nvtx_RangeStartA),
                                   CS_FP(cs_nvtx_RangeStartW), CS_FP(cs_nvtx_RangeEnd),
                                   CS_FP(cs_nvtx_RangePushEx), CS_FP(cs_nvtx_RangePushA),
                                   CS_FP(cs_nvtx_RangePushW), CS_FP(cs_nvtx_RangePop)};
    static const int core2[] = {CS_NVTX_DomainMarkEx, CS_NVTX_DomainRangeStartEx, CS_NVTX_DomainRangeEnd,
                                CS_NVTX_DomainRangePushEx, CS_NVTX_DomainRangePop, CS_NVTX_DomainRegisterStringA,
                                CS_NVTX_DomainRegisterStringW, CS_NVTX_DomainCreateA, CS_NVTX_DomainCreateW,
                                CS_NVTX_DomainDestroy, CS_NVTX_Initialize};
    const cs_nvtx_fp core2_fns[] = {CS_FP(cs_nvtx_DomainMarkEx), CS_FP(cs_nvtx_DomainRangeStartEx),
                                    CS_FP(cs_nvtx_DomainRangeEnd), CS_FP(cs_nvtx_DomainRangePushEx),
                                    CS_FP(cs_nvtx_DomainRangePop), CS_FP(cs_nvtx_DomainRegisterStringA),
                                    CS_FP(cs_nvtx_DomainRegisterStringW), CS_FP(cs_nvtx_DomainCreateA),
                                    CS_FP(cs_nvtx_DomainCreateW), CS_FP(cs_nvtx_DomainDestroy),
                                    CS_FP(cs_nvtx_Initialize)};
    if (!__atomic_load_n(&cs_nvtx_on, __ATOMIC_ACQUIRE)) {
        /* timestamps of events that wait for the ring must be in the clock its records use */
        pthread_mutex_lock(&cs_init_lock);
        if (!cs_ring) cs_clock_tsc = cs_tsc_usable();
        pthread_mutex_unlock(&cs_init_lock);
        __atomic_store_n(&cs_nvtx_on, 1, __ATOMIC_RELEASE);
    }
    cs_nvtx_fill(cb, CS_NVTX_MODULE_CORE, core, core_fns, (int)(sizeof core / sizeof core[0]));
    cs_nvtx_fill(cb, CS_NVTX_MODULE_CORE2, core2, core2_fns, (int)(sizeof core2 / sizeof core2[0]));
    return 1;
}
