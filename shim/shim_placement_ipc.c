/* Legacy CUDA IPC over placed memory. Placement makes cuMemAlloc memory VMM, and the driver's
 * cuIpcGetMemHandle refuses VMM memory, so for a placed allocation the shim answers it: it
 * exports the allocation's physical memory as a POSIX fd (placement creates it shareable),
 * keeps that fd, and hands out a handle naming (pid, fd, offset, size). cuIpcOpenMemHandle of
 * such a handle in another captured process gets the fd from the exporter (SCM_RIGHTS over
 * an abstract UNIX socket one thread of the exporter serves; /proc/PID/fd/FD where that is
 * not reachable), imports it and maps it inside that process's zone; cuIpcCloseMemHandle
 * unmaps it. The program sees legacy IPC work as without capture (PyTorch sends CUDA tensors
 * between processes this way). Any other handle goes to the driver. Included by shim_core.c
 * after shim_placement.c and shim_share.c. */
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>

#define CS_IPC_MAGIC "CSIPC01"
typedef struct { char magic[8]; int32_t pid, fd; U chunk, offset, size; int32_t dev, pad; } cs_ipc_handle;
typedef struct { U handle; int fd; } cs_ipc_export;          /* a chunk exported, its kept fd */
typedef struct { U ptr, base, size, handle; } cs_ipc_import;  /* a chunk mapped from another process */
static cs_ipc_export *cs_ipc_exp; static int cs_ipc_nexp, cs_ipc_capexp;
static cs_ipc_import *cs_ipc_imp; static int cs_ipc_nimp, cs_ipc_capimp;

static int cs_grow(void **arr, int *cap, int n, size_t elem) {
    if (n < *cap) return 0;
    int c = *cap ? *cap * 2 : 16;
    void *g = realloc(*arr, (size_t)c * elem);
    if (!g) return -1;
    *arr = g; *cap = c;
    return 0;
}

/* ---- the exporter's fd server: one thread per exporting process, started at its first export */
static int cs_ipc_srv = -1;
static pid_t cs_ipc_srv_pid;

static socklen_t cs_ipc_addr(struct sockaddr_un *sa, int pid) {
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "cudasnap-ipc-%d", pid);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static int cs_ipc_exported(int fd) {
    pthread_mutex_lock(&cs_pl_lock);
    int ok = 0;
    for (int i = 0; i < cs_ipc_nexp; i++) ok |= cs_ipc_exp[i].fd == fd;
    pthread_mutex_unlock(&cs_pl_lock);
    return ok;
}

/* Each connection asks for one fd by number; only fds this process exported are sent. */
static void *cs_ipc_serve(void *arg) {
    int srv = (int)(intptr_t)arg;
    for (;;) {
        int c = accept4(srv, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) { if (errno == EINTR || errno == ECONNABORTED) continue; return NULL; }
        int32_t want = -1;
        if (read(c, &want, sizeof want) == (ssize_t)sizeof want && cs_ipc_exported(want)) {
            char byte = 1, ctl[CMSG_SPACE(sizeof(int))];
            struct iovec io = {&byte, 1};
            struct msghdr m = {0};
            memset(ctl, 0, sizeof ctl);
            m.msg_iov = &io; m.msg_iovlen = 1; m.msg_control = ctl; m.msg_controllen = sizeof ctl;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
            cm->cmsg_level = SOL_SOCKET; cm->cmsg_type = SCM_RIGHTS; cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &want, sizeof want);
            if (sendmsg(c, &m, MSG_NOSIGNAL) < 0) { /* the importer falls back to /proc */ }
        }
        close(c);
    }
}

static void cs_ipc_serve_start(void) {      /* cs_pl_lock held */
    if (cs_ipc_srv >= 0 && cs_ipc_srv_pid == getpid()) return;
    if (cs_ipc_srv >= 0) close(cs_ipc_srv);   /* a forked child: the parent's socket is not its own */
    cs_ipc_srv = -1;
    struct sockaddr_un sa;
    socklen_t len = cs_ipc_addr(&sa, (int)getpid());
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return;
    if (bind(s, (struct sockaddr *)&sa, len) != 0 || listen(s, 16) != 0) { close(s); return; }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);       /* helpers inherit: signals stay the program's */
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 64u << 10);
    int ok = pthread_create(&t, &at, cs_ipc_serve, (void *)(intptr_t)s) == 0;
    pthread_attr_destroy(&at);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!ok) { close(s); return; }
    pthread_setname_np(t, "cudasnap-ipc");
    cs_ipc_srv = s;
    cs_ipc_srv_pid = getpid();
}

/* The exporter's fd: over its socket, else through /proc. -1 when neither reaches it. */
static int cs_ipc_fetch(int pid, int fd) {
    struct sockaddr_un sa;
    socklen_t len = cs_ipc_addr(&sa, pid);
    int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c >= 0 && connect(c, (struct sockaddr *)&sa, len) == 0) {
        int32_t want = fd;
        char byte = 0, ctl[CMSG_SPACE(sizeof(int))];
        struct iovec io = {&byte, 1};
        struct msghdr m = {0};
        m.msg_iov = &io; m.msg_iovlen = 1; m.msg_control = ctl; m.msg_controllen = sizeof ctl;
        if (write(c, &want, sizeof want) == (ssize_t)sizeof want && recvmsg(c, &m, MSG_CMSG_CLOEXEC) > 0) {
            struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
            if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
                int got;
                memcpy(&got, CMSG_DATA(cm), sizeof got);
                close(c);
                return got;
            }
        }
    }
    if (c >= 0) close(c);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    int got = open(path, O_RDWR | O_CLOEXEC);
    return got >= 0 ? got : open(path, O_RDONLY | O_CLOEXEC);
}

/* The chunk was unmapped (cs_unmap_at): its kept export fd goes, so its memory can be freed. */
static void cs_ipc_forget(U handle) {
    for (int i = 0; i < cs_ipc_nexp; i++)
        if (cs_ipc_exp[i].handle == handle) {
            close(cs_ipc_exp[i].fd);
            cs_ipc_exp[i] = cs_ipc_exp[--cs_ipc_nexp];
            return;
        }
}

/* cuIpcGetMemHandle(pHandle, dptr) of a placed allocation (cs_pl_lock held): 1 when answered. */
static int cs_ipc_get(U *a, CUresult *res) {
    int i = cs_find_alloc(a[1], 0);
    if (i < 0 && cs_zone && a[1] >= cs_zone && a[1] < cs_zone_end)
        cs_note("cuIpcGetMemHandle of a pointer inside placed memory that starts no allocation: left to "
                "the driver, which refuses VMM memory (capture this program with --placement off)");
    if (i < 0 || !a[0]) return 0;
    cs_alloc al = cs_allocs[i];
    U handle = al.slab < 0 ? al.handle : cs_slabs[al.slab].handle;
    U base = al.slab < 0 ? al.ptr : cs_slabs[al.slab].base;
    U chunk = al.slab < 0 ? al.rsize : cs_slabs[al.slab].size;
    int dev = al.slab < 0 ? cs_cur_device() : cs_slabs[al.slab].dev;
    int fd = -1;
    for (int k = 0; k < cs_ipc_nexp; k++)
        if (cs_ipc_exp[k].handle == handle) fd = cs_ipc_exp[k].fd;
    if (fd < 0) {
        cs_fn4 exp = CALLREAL(CS_ID_cuMemExportToShareableHandle, cs_fn4);
        int raw = -1;
        CUresult r = exp ? exp((U)&raw, handle, CS_HANDLE_POSIX_FD, 0) : 801;
        if (r || raw < 0 || cs_grow((void **)&cs_ipc_exp, &cs_ipc_capexp, cs_ipc_nexp, sizeof *cs_ipc_exp)) {
            if (raw >= 0) close(raw);
            cs_note("cuIpcGetMemHandle of memory capture placed: its export as a file descriptor failed; "
                    "the driver's answer stands (capture this program with --placement off)");
            return 0;
        }
        fd = fcntl(raw, F_DUPFD_CLOEXEC, CS_SHARE_FD_MIN);   /* out of the program's fd numbers */
        close(raw);
        if (fd < 0) return 0;
        cs_ipc_exp[cs_ipc_nexp++] = (cs_ipc_export){handle, fd};
    }
    cs_ipc_serve_start();
    cs_ipc_handle h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CS_IPC_MAGIC, sizeof CS_IPC_MAGIC);
    h.pid = (int32_t)getpid(); h.fd = fd; h.chunk = chunk; h.offset = al.ptr - base; h.size = al.size; h.dev = dev;
    memset((void *)a[0], 0, 64);
    memcpy((void *)a[0], &h, sizeof h);
    *res = 0;
    return 1;
}

/* cuIpcOpenMemHandle(pdptr, handle, flags) of a shim handle: 1 when answered. */
static int cs_ipc_open(const cs_fn *fn, U *a, CUresult *res) {
    cs_ipc_handle h;
    memcpy(&h, (const void *)&a[fn->params[1].ai], sizeof h);
    if (memcmp(h.magic, CS_IPC_MAGIC, sizeof CS_IPC_MAGIC) != 0 || !a[0]) return 0;
    *res = 1;                                                 /* CUDA_ERROR_INVALID_VALUE */
    if (h.pid == (int32_t)getpid()) { *res = 201; return 1; }  /* CUDA_ERROR_INVALID_CONTEXT: its own, as the driver */
    int fd = cs_ipc_fetch((int)h.pid, (int)h.fd);
    if (fd < 0) { *res = 400; return 1; }                    /* CUDA_ERROR_INVALID_HANDLE: exporter gone */
    cs_fn3 imp = CALLREAL(CS_ID_cuMemImportFromShareableHandle, cs_fn3);
    U mh = 0;
    CUresult r = imp ? imp((U)&mh, (U)(intptr_t)fd, CS_HANDLE_POSIX_FD) : 801;
    close(fd);
    if (r) { *res = r; return 1; }
    int dev = cs_cur_device();
    pthread_mutex_lock(&cs_pl_lock);
    U at = 0;
    r = cs_ensure_zone(dev);
    if (!r) r = cs_zone_take(h.chunk, cs_pl_gran, &at);
    if (!r) r = cs_grow((void **)&cs_ipc_imp, &cs_ipc_capimp, cs_ipc_nimp, sizeof *cs_ipc_imp) ? 2 : 0;
    if (!r && (r = cs_map_handle(at, h.chunk, dev, mh)))
        cs_push_hole(at, h.chunk);
    if (r) {
        ((CUresult(*)(U))CALLREAL(CS_ID_cuMemRelease, cs_fn2))(mh);
        pthread_mutex_unlock(&cs_pl_lock);
        *res = r;
        return 1;
    }
    cs_ipc_imp[cs_ipc_nimp++] = (cs_ipc_import){at + h.offset, at, h.chunk, mh};
    pthread_mutex_unlock(&cs_pl_lock);
    *(U *)a[0] = at + h.offset;
    *res = 0;
    return 1;
}

/* cuIpcCloseMemHandle(dptr) of memory cs_ipc_open mapped (cs_pl_lock held): 1 when answered. */
static int cs_ipc_close(U *a, CUresult *res) {
    for (int i = 0; i < cs_ipc_nimp; i++)
        if (cs_ipc_imp[i].ptr == a[0]) {
            cs_ipc_import m = cs_ipc_imp[i];
            cs_ipc_imp[i] = cs_ipc_imp[--cs_ipc_nimp];
            cs_unmap_at(m.base, m.size, m.handle);
            *res = 0;
            return 1;
        }
    return 0;
}
