/* The shared-memory ring between the preloaded shim (producers: every thread of the
 * captured process) and the recorder (one consumer in `cudasnap capture`).
 * capture/ring.py mirrors this layout; change both together (bump CS_RING_VERSION).
 *
 * The file is $CUDASNAP_SESSION/ring-<pid>.shm: a 4096-byte header, then `capacity`
 * bytes of data (a power of two). Positions are monotonic byte counts; offset = pos &
 * (capacity-1). A record never wraps: a PAD record fills the end when needed.
 * Producers reserve with a CAS on `head`, write, then publish by storing the record's
 * state word CS_STATE(pos, CS_PUBLISHED) (a launch first stores CS_STATE(pos,
 * CS_INFLIGHT), then the published word once the call returned). The word carries bits of
 * the record's position and its kind, so bytes left in the slot by an earlier lap (an old
 * payload word that happens to read 1, an old header behind a pad) never pass for a record.
 * The consumer reads at `tail`, waits for the state word its position expects, consumes,
 * zeroes the header word and advances `tail`. Nothing is lost when the program dies: the
 * mapping outlives it. `seq` counts the call sequence numbers handed out and `dropped` /
 * `dropped_bytes` the records that could not be reserved, so the recorder can tell what a
 * snapshot misses.
 */
#ifndef CUDASNAP_RING_H
#define CUDASNAP_RING_H
#include <stdint.h>

#define CS_RING_MAGIC "CSRING1"
#define CS_RING_VERSION 7
#define CS_RING_HDR 4096

typedef struct {
    char magic[8];               /* 0   CS_RING_MAGIC */
    uint32_t version;            /* 8 */
    uint32_t hdr_size;           /* 12  CS_RING_HDR */
    uint64_t capacity;           /* 16  data bytes, power of two */
    uint64_t pid;                /* 24 */
    uint64_t ppid;               /* 32 */
    uint64_t head;               /* 40  producers' reserve position (atomic) */
    uint64_t tail;               /* 48  consumer position (written by the recorder) */
    uint64_t seq;                /* 56  global call sequence counter (atomic) */
    uint64_t dropped;            /* 64  records dropped: ring full and recorder gone */
    uint64_t recorder_beat_ns;   /* 72  CLOCK_MONOTONIC of the recorder's last drain */
    uint32_t state;              /* 80  1 running, 2 exited through exit() */
    int32_t exit_code;           /* 84 */
    uint64_t start_ns;           /* 88 */
    uint64_t blob_serial;        /* 96  blob serial counter (atomic) */
    uint32_t fn_count;           /* 104 functions in the API table the shim was built with */
    uint32_t clock;              /* 108 record timestamps: 0 CLOCK_MONOTONIC ns, 1 TSC ticks */
    char api_digest[72];         /* 112 digest of the API description */
    uint64_t clock_tsc0;         /* 184 TSC ...                                            */
    uint64_t clock_ns0;          /* 192 ... and CLOCK_MONOTONIC ns read together at the start */
    uint64_t dropped_bytes;      /* 200 bytes of the dropped records (atomic) */
    uint32_t win_req;            /* 208 window requests (recorder bumps: open/close, or checkpoint) */
    uint32_t recorder_pid;       /* 212 the recorder's process (written with each beat) */
} cs_ring_hdr;

/* Record header, 8-byte aligned; fields follow. */
typedef struct {
    uint32_t len;      /* total bytes including this header, multiple of 8 */
    uint32_t state;    /* CS_STATE(pos, kind), below; anything else: being written */
    uint16_t type;     /* CS_REC_* */
    uint16_t nfields;
    uint32_t fn;       /* API table id (calls), or 0; BLOB_*: 1 for a window state's chunks */
    uint64_t seq;      /* call sequence number (PRE/POST), blob serial (BLOB_*) */
    uint64_t tid;
    uint64_t t_ns;     /* timestamp (ns, or TSC ticks: header `clock`) */
    int32_t result;    /* POST: CUresult */
    uint32_t aux;      /* POST: 1 = outputs valid */
} cs_rec_hdr;          /* 48 bytes */

/* Field header, 8-byte aligned; `len` payload bytes follow, padded to 8. */
typedef struct {
    uint16_t idx;      /* parameter index, or CS_F_* for named extras */
    uint16_t tag;      /* CS_T_* */
    uint32_t len;
} cs_field_hdr;

enum {
    CS_REC_PAD = 1, CS_REC_PRE = 2, CS_REC_POST = 3, CS_REC_FN = 4, CS_REC_PROC = 5,
    CS_REC_NOTE = 6, CS_REC_BLOB_PIECE = 7, CS_REC_BLOB_END = 8, CS_REC_EXIT = 9,
    CS_REC_REGION = 10,   /* placement zone reserved: base (F_HANDLE), size (F_CODE) */
    CS_REC_CALL = 11,     /* a pure query, recorded once after it returned (pre+post in one) */
    CS_REC_REPEAT = 12,   /* identical repeats of this thread's recorded queries, counted */
    CS_REC_CTX = 13,      /* a context at first sight: handle (F_HANDLE), device (F_CODE),
                             primary (F_KIND: 0 no, 1 yes, 2 not known yet) */
    CS_REC_NVTX = 14,     /* an NVTX event (shim_nvtx.c): op in `fn` (1 push, 2 pop, 3 start, 4 end,
                             5 mark, 6 domain), range id / push level / domain id in `seq`,
                             message (F_NAME), domain id (F_HANDLE; absent: the default domain) */
    CS_REC_WINDOW = 15,   /* a capture window event (shim_window.c): op in `fn` (1 open, 2 close,
                             3 state written, 4 checkpoint), window number in `seq`, reason
                             (F_MSG), state bytes (F_CODE), live ranges (F_KIND), launches so far (F_HANDLE) */
};

/* Record state word of the record at ring position `pos` (a monotonic byte count): the kind
 * in the low 2 bits, 30 bits folded from the position above them. CS_PUBLISHED: complete;
 * CS_INFLIGHT: a launch's CALL record, complete but its call not returned yet (read as a
 * PRE if the program dies); CS_PADDING: a PAD to the end of the ring, of which only `len`
 * and `state` are written (whatever else the slot holds is left from an earlier lap). */
#define CS_PUBLISHED 1u
#define CS_INFLIGHT 2u
#define CS_PADDING 3u
#define CS_STATE(pos, kind) ((uint32_t)((((pos) >> 3) ^ ((pos) >> 33)) << 2) | (kind))

enum {
    CS_T_VAL = 1,     /* 8-byte little-endian integer */
    CS_T_BYTES = 2,   /* raw bytes (structs, arrays, packed params) */
    CS_T_STR = 3,     /* string bytes, no NUL */
    CS_T_BLOB = 4,    /* 16 bytes: u64 blob serial, u64 size (data came as BLOB_PIECEs) */
    CS_T_F64 = 5,     /* 8-byte double */
    CS_T_VALS = 6,    /* every argument's value, 8 bytes each in parameter order (idx CS_F_VALS);
                         float arguments as the bits of a double */
};

/* Named extras use field indices from 0x100 up. */
enum {
    CS_F_VALS = 0xFFFF,       /* the CS_T_VALS field of a PRE record */
    CS_F_PARAMS = 0x100,      /* packed kernel parameter bytes */
    CS_F_ATTRS = 0x101,       /* launch attributes array (cuLaunchKernelEx) */
    CS_F_IMAGE = 0x102,       /* module image blob */
    CS_F_WRAPPED = 0x104,     /* cuGetProcAddress: API id handed back, or -1 passthrough */
    CS_F_HOSTSRC = 0x105,     /* memcpy2D/3D host source region blob */
    CS_F_HOSTDST = 0x106,     /* memcpy2D/3D host destination region blob */
    CS_F_NAME = 0x110, CS_F_HANDLE = 0x111, CS_F_KIND = 0x112, CS_F_MODULE = 0x113,
    CS_F_LAYOUT = 0x114, CS_F_MSG = 0x115, CS_F_INFO = 0x116, CS_F_CODE = 0x117,
    CS_F_DIGEST = 0x118,      /* XXH3-128 chunk digest(s): BLOB_PIECE one, BLOB_END one per chunk;
                                 a chunk sent in parts: only the last part has it, and every part
                                 its offset in the chunk (F_CODE) */
    CS_F_REPEATS = 0x119,     /* REPEAT: {u32 api id, u32 count, u64 seq of the recorded call} each */
    CS_F_T1 = 0x11A,          /* CALL of a launch: timestamp when the call returned */
    CS_F_LINK = 0x11B,        /* an exported/imported POSIX fd: 8 int64 (shim_share.c) */
    CS_F_HOSTMEM = 0x11C,     /* launch: managed memory its arguments reach, {u64 base, serial, size} each
                                 (shim_hostmem.c) */
    CS_F_HOSTCHECK = 0x11D,   /* cuMemFree of managed memory: its final bytes (blob) */
    CS_F_BATCHSRC = 0x11E,    /* cuMemcpyBatchAsync: host sources, {u64 index, serial, size} each */
    CS_F_BATCHDST = 0x11F,    /* cuMemcpyBatchAsync: host destinations after the copy, the same */
};

#endif
