/* A job's windows: one cut across its ranks. Included by shim_window.c.
 *
 * A rank's state dump must be taken where every rank of the job is at the same point of its
 * collectives: a peer that ran on would already write its next collective's data into this
 * rank's NCCL buffers while it dumps, and the replayed windows would wait on each other.
 * So, in a job (LOCAL_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE / MPI_LOCALNRANKS > 1, with a
 * capture session), an open or a close is a two-step rendezvous through files in the session
 * directory:
 *   1. each rank, at its own open (close) point, writes how many collective kernels it has
 *      launched (cut.SERIAL.o.RANK) and waits for every rank's file;
 *   2. a rank behind the most advanced runs on until it has launched as many collectives
 *      (its peers, paused after theirs, leave none of its collectives waiting), then each rank
 *      takes its state and writes cut.SERIAL.d.RANK; no rank goes on before all have (so no
 *      peer writes into a rank's buffers while it reads them).
 * A rank missing after CUDASNAP_JOB_CUT_MS (30 s) is not waited for again: the window opens
 * where this rank is, with a note. A collective is a kernel whose name matches
 * CUDASNAP_COLLECTIVE_RX (formats/vocab.py's pattern, handed over by capture: one definition).
 * CUDASNAP_JOB_CUT=0 turns the rendezvous off. */
#include <fcntl.h>

static int cs_job_n = -1;                 /* ranks on this node; 0: not a job (or turned off) */
static int cs_job_rank;
static char cs_job_dir[512];
static uint64_t cs_job_coll;               /* collective launches issued (atomic) */
static int64_t cs_job_open_at = -1;        /* deferred open / close: at this many collectives */
static int64_t cs_job_close_at = -1;
static const char *cs_job_open_why, *cs_job_close_why;
static unsigned cs_job_cut_ms = 30000;
static int cs_job_gave_up;                 /* a rendezvous timed out: later ones are not tried */
static regex_t cs_job_rx;                  /* collective kernel names (CUDASNAP_COLLECTIVE_RX) */

static const char *cs_job_env(const char *a, const char *b, const char *c) {
    const char *v = getenv(a);
    if (!v || !*v) v = getenv(b);
    if (!v || !*v) v = getenv(c);
    return v && *v ? v : NULL;
}

static void cs_job_init(void) {
    cs_job_n = 0;
    const char *off = getenv("CUDASNAP_JOB_CUT");
    const char *n = cs_job_env("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS");
    const char *r = cs_job_env("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID");
    const char *s = getenv("CUDASNAP_SESSION"), *rx = getenv("CUDASNAP_COLLECTIVE_RX");
    if ((off && strcmp(off, "0") == 0) || !n || !r || !s || !rx || atoi(n) < 2 || atoi(r) < 0 || atoi(r) >= atoi(n))
        return;
    if (regcomp(&cs_job_rx, rx, REG_EXTENDED | REG_ICASE | REG_NOSUB) != 0) return;
    snprintf(cs_job_dir, sizeof cs_job_dir, "%s", s);
    cs_job_rank = atoi(r);
    cs_job_cut_ms = (unsigned)cs_env_u64("CUDASNAP_JOB_CUT_MS", 30000);
    cs_job_n = atoi(n);
}

static void cs_job_mark(U serial, char step, uint64_t coll) {
    char p[640], t[660], v[32];
    snprintf(p, sizeof p, "%s/cut.%llu.%c.%d", cs_job_dir, (unsigned long long)serial, step, cs_job_rank);
    snprintf(t, sizeof t, "%s.tmp", p);
    int n = snprintf(v, sizeof v, "%llu\n", (unsigned long long)coll);
    int fd = open(t, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t w = write(fd, v, (size_t)n);
    close(fd);
    if (w == n) rename(t, p); else unlink(t);
}

/* Wait for every rank's mark; 1 and the largest collective count, or 0 after the time limit. */
static int cs_job_wait(U serial, char step, uint64_t *most) {
    U t_end = cs_mono() + (U)cs_job_cut_ms * 1000000ull;
    for (;;) {
        int have = 0;
        uint64_t m = 0;
        for (int r = 0; r < cs_job_n; r++) {
            char p[640], v[32] = {0};
            snprintf(p, sizeof p, "%s/cut.%llu.%c.%d", cs_job_dir, (unsigned long long)serial, step, r);
            int fd = open(p, O_RDONLY | O_CLOEXEC);
            if (fd < 0) break;
            ssize_t k = read(fd, v, sizeof v - 1);
            close(fd);
            if (k <= 0) break;
            uint64_t c = strtoull(v, NULL, 10);
            if (c > m) m = c;
            have++;
        }
        if (have == cs_job_n) { if (most) *most = m; return 1; }
        if (cs_mono() > t_end) return 0;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static int cs_job_on(void) {
    return cs_job_n > 0 && !cs_job_gave_up && cs_win_mode != CS_W_FLIGHT;
}

static char cs_job_msg[240];               /* said once the window records (a closed one drops notes) */

static void cs_job_timeout(const char *what) {
    snprintf(cs_job_msg, sizeof cs_job_msg, "window: not every rank of the job reached the %s within %u ms: this "
             "rank's state is taken where it is (the job's windows may not replay together)", what, cs_job_cut_ms);
    cs_job_gave_up = 1;
}

static void cs_job_say(void) {
    if (cs_job_msg[0] && cs_win_open) {
        cs_note(cs_job_msg);
        cs_job_msg[0] = 0;
    }
}

/* Through a rendezvous this rank's other threads wait, as they do through a state dump
 * (cs_win_dumper): none launches a collective after the count this rank gave its peers. */
static void cs_job_hold(void) {
    if (cs_job_holding) return;
    __atomic_store_n(&cs_win_dumper, cs_thread(), __ATOMIC_SEQ_CST);
    cs_win_quiesce();
    cs_job_holding = 1;
}

static void cs_job_release(void) {
    cs_job_holding = 0;
    __atomic_store_n(&cs_win_dumper, 0, __ATOMIC_SEQ_CST);
}

/* The open or close, then the second rendezvous: no rank goes on before every state is taken. */
static void cs_job_take(int close_it, const char *why) {
    U serial = close_it ? cs_win_serial : cs_win_serial + 1;
    cs_job_hold();
    if (close_it) cs_win_close(why); else cs_win_start(CS_WOP_OPEN, why);
    if (!cs_job_gave_up) {
        cs_job_mark(serial, close_it ? 'e' : 'd', __atomic_load_n(&cs_job_coll, __ATOMIC_ACQUIRE));
        if (!cs_job_wait(serial, close_it ? 'e' : 'd', NULL)) cs_job_timeout(close_it ? "window's close" : "window's open");
    }
    cs_job_release();
    cs_job_say();
}

static void cs_job_cut(int close_it, const char *why) {
    if (!cs_job_on()) {
        if (close_it) cs_win_close(why); else cs_win_start(CS_WOP_OPEN, why);
        return;
    }
    if (close_it ? cs_job_close_at >= 0 : cs_job_open_at >= 0) return;      /* already waiting to */
    U serial = close_it ? cs_win_serial : cs_win_serial + 1;
    cs_job_hold();
    uint64_t mine = __atomic_load_n(&cs_job_coll, __ATOMIC_ACQUIRE), most = 0;
    cs_job_mark(serial, close_it ? 'c' : 'o', mine);
    if (!cs_job_wait(serial, close_it ? 'c' : 'o', &most)) {
        if (!close_it) cs_job_timeout("window's open");     /* said inside the window, where notes are kept */
        else { cs_job_timeout("window's close"); cs_job_say(); }
        if (close_it) cs_win_close(why); else cs_win_start(CS_WOP_OPEN, why);
        cs_job_release();
        cs_job_say();
        return;
    }
    if (mine < most) {                     /* behind: run on to the same collective first */
        if (close_it) { cs_job_close_at = (int64_t)most; cs_job_close_why = why; }
        else { cs_job_open_at = (int64_t)most; cs_job_open_why = why; }
        cs_job_release();
        return;
    }
    cs_job_take(close_it, why);
}

/* One cut at a time: two threads can reach the same open (the same launch number read by
 * both, two matches of a kernel window), and a second state dump beside the first would
 * release the program's threads while the first still copies. An open that finds another cut
 * under way is that cut; a close waits for it. An open asked while a window is open starts a
 * new window (nvtx ranges back to back), except where the trigger names one window only. */
static pthread_mutex_t cs_win_cut_lock = PTHREAD_MUTEX_INITIALIZER;
static void cs_win_open_cut_if(const char *why, int only_if_closed) {
    if (pthread_mutex_trylock(&cs_win_cut_lock)) return;
    if (!only_if_closed || !cs_win_open) cs_job_cut(0, why);
    pthread_mutex_unlock(&cs_win_cut_lock);
}
static void cs_win_open_cut(const char *why) { cs_win_open_cut_if(why, 0); }
static void cs_win_close_cut(const char *why) {
    pthread_mutex_lock(&cs_win_cut_lock);
    if (cs_win_open) cs_job_cut(1, why);
    pthread_mutex_unlock(&cs_win_cut_lock);
}

/* Before each call (outside a stream capture): a deferred open or close whose collective has
 * been launched is taken now. */
static void cs_job_due(void) {
    uint64_t c = __atomic_load_n(&cs_job_coll, __ATOMIC_ACQUIRE);
    int64_t at = __atomic_load_n(&cs_job_open_at, __ATOMIC_ACQUIRE);
    if (at >= 0 && c >= (uint64_t)at
        && __atomic_compare_exchange_n(&cs_job_open_at, &at, -1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        cs_job_take(0, cs_job_open_why);
    at = __atomic_load_n(&cs_job_close_at, __ATOMIC_ACQUIRE);
    if (at >= 0 && c >= (uint64_t)at
        && __atomic_compare_exchange_n(&cs_job_close_at, &at, -1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        cs_job_take(1, cs_job_close_why);
}

/* A launch about to be issued: count it when it is a collective (in a job, with a window). */
static void cs_job_count(const cs_fn *fn, const U *a) {
    if (cs_job_n <= 0 || cs_win_mode == CS_W_FLIGHT) return;
    U f = 0, kp = 0, ex = 0;
    if (cs_launch_args(fn, a, &f, &kp, &ex) && f && (cs_fn_flags(f) & CS_NF_COLLECTIVE))
        __atomic_fetch_add(&cs_job_coll, 1, __ATOMIC_ACQ_REL);
}
