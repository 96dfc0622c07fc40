/* Cross-process links: which exported POSIX fd a process imported, and whose export it was.
 *
 * An fd passed to another process (SCM_RIGHTS, pidfd_getfd) refers to the same open file in
 * both; fd numbers and the driver's inode say nothing about which export it came from. So an
 * exporting process keeps a duplicate of each fd it exported (the last CS_SHARE_KEEP, far
 * above the program's own fd numbers) and appends "pid export-number dup" to the capture
 * session's `links` file; an importing process compares its fd with those duplicates with
 * kcmp(KCMP_FILE). The post record of both calls carries a CS_F_LINK field:
 *   {kind (1 export, 2 import), fd, st_dev, st_ino, pid, export number (own / the peer's),
 *    peer pid (import; 0 unknown), errno of the last failed kcmp (0 none)}.
 * Nothing here changes what the program sees: the duplicates are closed-on-exec and live in
 * fd numbers >= CS_SHARE_FD_MIN; a duplicate keeps its export's memory referenced until it
 * is dropped (at most CS_SHARE_KEEP of them). Included by shim_core.c. */
#include <sys/stat.h>
#include <sys/syscall.h>
#include <fcntl.h>

#define CS_SHARE_KEEP 64
#define CS_SHARE_FD_MIN 900
#define CS_HANDLE_POSIX_FD 1
#define CS_KCMP_FILE 0

static pthread_mutex_t cs_share_lock = PTHREAD_MUTEX_INITIALIZER;
static int cs_share_dups[CS_SHARE_KEEP];
static unsigned cs_share_ndups;
static int64_t cs_share_exports;

static void cs_share_path(char *buf, size_t cap) {
    const char *dir = getenv("CUDASNAP_SESSION");
    snprintf(buf, cap, "%s/links", dir ? dir : "/nonexistent");
}

static void cs_share_export(int fd) {
    pthread_mutex_lock(&cs_share_lock);
    int64_t no = ++cs_share_exports;
    int dup = fcntl(fd, F_DUPFD_CLOEXEC, CS_SHARE_FD_MIN);
    if (dup >= 0) {
        unsigned k = cs_share_ndups++ % CS_SHARE_KEEP;
        if (cs_share_ndups > CS_SHARE_KEEP) close(cs_share_dups[k]);   /* the oldest goes */
        cs_share_dups[k] = dup;
        char path[4096], line[96];
        cs_share_path(path, sizeof path);
        int n = snprintf(line, sizeof line, "%d %lld %d\n", (int)getpid(), (long long)no, dup);
        int lf = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (lf >= 0) {
            if (write(lf, line, (size_t)n) != n) { /* the link is simply not known */ }
            close(lf);
        }
    }
    pthread_mutex_unlock(&cs_share_lock);
    cs_link[5] = no;
}

/* The exporting process and its export number for an imported fd (the newest line that
 * matches: a duplicate's number may have been reused after it was dropped). */
static void cs_share_import(int fd) {
    char path[4096];
    cs_share_path(path, sizeof path);
    FILE *f = fopen(path, "re");
    if (!f) return;
    int me = (int)getpid(), pid, dup, err = 0;
    long long no;
    while (fscanf(f, "%d %lld %d", &pid, &no, &dup) == 3) {
        if (pid == me) continue;
        long r = syscall(SYS_kcmp, (pid_t)me, (pid_t)pid, CS_KCMP_FILE, (unsigned long)fd, (unsigned long)dup);
        if (r == 0) { cs_link[6] = pid; cs_link[5] = no; err = 0; }
        else if (r < 0 && !cs_link[6]) err = errno;
    }
    fclose(f);
    cs_link[7] = err;
}

static void cs_share_after(const cs_fn *fn, const U *a, CUresult res) {
    cs_link_ok = 0;
    if (res != 0 || fn->h0 < 0 || fn->h1 < 0) return;
    if ((a[fn->params[fn->h0].ai] & 0xffffffffu) != CS_HANDLE_POSIX_FD) return;
    U v = a[fn->params[fn->h1].ai];
    int fd = fn->h2 ? (v ? *(const int *)v : -1) : (int)(int64_t)v;
    if (fd < 0) return;
    memset(cs_link, 0, sizeof cs_link);
    struct stat st;
    if (fstat(fd, &st) == 0) { cs_link[2] = (int64_t)st.st_dev; cs_link[3] = (int64_t)st.st_ino; }
    cs_link[0] = fn->h2 ? 1 : 2;
    cs_link[1] = fd;
    cs_link[4] = getpid();
    if (fn->h2) cs_share_export(fd);
    else cs_share_import(fd);
    cs_link_ok = 1;
}
