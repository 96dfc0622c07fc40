/* A window's end state (formats/SCHEMA.md, "endstate"), included by shim_window.c: every live
 * range's chunk hashes when a window closes, by cs_hash_chunks (hash_kernel.cu) on the GPU where
 * its module loaded, else the same sum on the host from a D2H copy (a driver without the module,
 * the test double). Replay hashes the same ranges the same way and compares (replay/endstate.py):
 * a window whose calls hold no device-to-host copy still proves it reproduced the device memory.
 * One record per range. Runs at a window's close only, never on a call's path. */
static U cs_mix_host(U a, U b, U i) {
    U h = (a ^ (i * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
    h ^= (b + i) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    return h * 0xD6E8FEB86659FD93ull;
}

/* Add the words of src (nbytes, a multiple of 16) starting at byte offset `off` of the range. */
static void cs_hash_host(const unsigned char *src, U nbytes, U off, U *h) {
    for (U p = 0; p < nbytes; p += 16) {
        U w = (off + p) / 16, a, b;
        memcpy(&a, src + p, 8); memcpy(&b, src + p + 8, 8);
        h[w / (CS_CHUNK / 16)] += cs_mix_host(a, b, w % (CS_CHUNK / 16));
    }
}

static void cs_win_emit_endstate(const char *why, const cs_wrange *w, const U *h, U nch, const unsigned char *tail,
                                 unsigned ntail) {
    uint32_t n = (uint32_t)strnlen(why, 1024);
    cs_rec r;
    if (cs_reserve(&r, (uint32_t)sizeof(cs_rec_hdr) + cs_flen(n) + 3 * cs_flen(8) + cs_flen((uint32_t)(nch * 8))
                   + cs_flen(16), CS_REC_WINDOW)) return;
    r.h->fn = CS_WOP_ENDSTATE; r.h->seq = cs_win_serial; r.h->t_ns = cs_now();
    cs_put(&r, CS_F_MSG, CS_T_STR, why, n);
    cs_put_val(&r, CS_F_CODE, w->ptr);
    cs_put_val(&r, CS_F_KIND, w->size);
    cs_put_val(&r, CS_F_HANDLE, __atomic_load_n(&cs_win_launches, __ATOMIC_RELAXED));
    if (h) {                                 /* no hashes: the range could not be read */
        if (nch) cs_put(&r, CS_F_INFO, CS_T_BYTES, h, (uint32_t)(nch * 8));
        cs_put(&r, CS_F_LAYOUT, CS_T_BYTES, tail, ntail);
    }
    cs_publish(&r);
}

static void cs_endstate_range(const char *why, cs_wrange *w, cs_fn3 d2h) {
    U n16 = w->size & ~(U)15, nch = (n16 + CS_CHUNK - 1) / CS_CHUNK;
    unsigned char tail[16];
    unsigned ntail = (unsigned)(w->size - n16);
    U *h = calloc(nch ? nch : 1, 8);
    int ok = h != NULL;
    if (ok && nch && !(cs_hash_mode == 1 && w->ptr % 16 == 0 && cs_hash_gpu(w->ptr, n16, nch, h) == 0)) {
        memset(h, 0, nch * 8);
        void *buf = cs_wstage ? cs_wstage : malloc(CS_WSTAGE);
        for (U off = 0; ok && buf && off < n16; off += CS_WSTAGE) {
            U len = n16 - off < CS_WSTAGE ? n16 - off : CS_WSTAGE;
            ok = d2h((U)buf, w->ptr + off, len) == 0;
            if (ok) cs_hash_host(buf, len, off, h);
        }
        if (!buf) ok = 0;
        if (buf && buf != cs_wstage) free(buf);
    }
    if (ok && ntail) ok = d2h((U)tail, w->ptr + n16, ntail) == 0;
    cs_win_emit_endstate(why, w, ok ? h : NULL, nch, tail, ntail);
    free(h);
}

static void cs_win_endstate(const char *why) {
    cs_fn0 csync = cs_win_id_sync >= 0 ? (cs_fn0)cs_resolve(cs_win_id_sync) : NULL;
    cs_fn3 d2h = cs_win_id_d2h >= 0 ? (cs_fn3)cs_resolve(cs_win_id_d2h) : NULL;
    cs_fn1 push = cs_win_id_push >= 0 ? (cs_fn1)cs_resolve(cs_win_id_push) : NULL;
    cs_fn1 pop = cs_win_id_pop >= 0 ? (cs_fn1)cs_resolve(cs_win_id_pop) : NULL;
    if (!csync || !d2h || __atomic_load_n(&cs_win_capturing, __ATOMIC_RELAXED) > 0) return;
    uint64_t me = cs_thread();
    __atomic_store_n(&cs_win_dumper, me, __ATOMIC_SEQ_CST);
    cs_win_quiesce();
    cs_depth++;
    cs_patient = 1;
    pthread_mutex_lock(&cs_wr_lock);
    U cur = cs_win_curctx(), dummy = 0, synced = 0;
    if (cs_hash_mode == -2) cs_hash_init();
    for (int i = 0; i < cs_nwr; i++) {
        cs_wrange *w = &cs_wr[i];
        int pushed = w->ctx && w->ctx != cur && push && pop && push(w->ctx) == 0;
        if (w->ctx != synced || !synced) { csync(); synced = w->ctx; }
        cs_endstate_range(why, w, d2h);
        if (pushed) pop((U)&dummy);
    }
    pthread_mutex_unlock(&cs_wr_lock);
    cs_patient = 0;
    cs_depth--;
    __atomic_store_n(&cs_win_dumper, 0, __ATOMIC_SEQ_CST);
}
