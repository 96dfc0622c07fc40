#!/usr/bin/env bash
# GPU checks of group capture and replay (several processes, several GPUs), on a 2-GPU machine:
#   1. a 2-rank PyTorch DDP program (NCCL all-reduce, 5 steps, torchrun) captured: one snapshot
#      per rank and a group manifest with the shareable-handle links; the program's output is
#      unchanged; replayed as a group: exit 0, 0 fell back, D2H verified on both ranks;
#   2. legacy CUDA IPC between 2 processes (nvcc; captured with --placement off), group replay;
#   3. one process, 2 GPUs, peer access (cudaMemcpyPeer, a kernel reading the peer), replayed on
#      2 GPUs (and with the GPUs swapped);
#   4. NCCL kernels' per-rank times, --profile timeline (paced and fast) against native
#      (torch.profiler): each kernel split into the wait for the last peer and the collective
#      after it (+-10%); the captured run's own profile beside them;
#   5. a missing rank, fewer GPUs than recorded (--devices 0), a killed peer replayer: a clear
#      error and exit 2, in bounded time.
# Prints PASS/FAIL lines; writes $OUT/demo_multigpu.log, multigpu_manifest.json,
# multigpu_replay.json, multigpu_timeline.json, multigpu_trace.json.gz (every rank in one trace).
# Run from the project root (carry .whl: cffi, pycparser, zstandard):
#   bash bench/demo_multigpu_gpu.sh
# Env: PARTS (which of 1-5, default 12345; 5 needs 1), STEPS (DDP steps, default 5), PROF_STEPS (steps of the timing run, default 30), NPROC (ranks, default 2; 4 on a 4-GPU machine).
set -uo pipefail
ROOT=$(pwd)
OUT=${OUT:-/tmp/cudasnap-out}; mkdir -p "$OUT"
W=/tmp/cudasnap-multigpu; rm -rf "$W"; mkdir -p "$W"
STEPS=${STEPS:-5}
PROF_STEPS=${PROF_STEPS:-30}
NPROC=${NPROC:-2}
PARTS=${PARTS:-12345}
INSTALL_LOG=$W/install.log . "$ROOT/bench/gpu_env.sh"
exec > >(tee "$OUT/demo_multigpu.log") 2>&1
. "$ROOT/bench/demo_lib.sh"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
[ "$NGPU" -ge "$NPROC" ] || { echo "FAIL: needs $NPROC GPUs, this machine has $NGPU"; exit 2; }
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
cd "$W"

cp "$ROOT/tests/gpu/workloads/ddp_train.py" ddp.py     # DDP_PROFILE=PREFIX: torch.profiler traces

cat > ipc.cu <<'EOF'
// Legacy CUDA IPC: the owner fills 64 MiB, hands its cudaIpcMemHandle to a child process
// (exec'd, its own GPU when there are two), which adds 1 through the opened mapping; the owner
// reads the child's result.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <unistd.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)
__global__ void fill(float *p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = (float)(i % 1000); }
__global__ void add1(float *p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1.0f; }
static double sum(float *d, int n) {
    float *h = (float *)malloc(n * sizeof(float)); CK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    double s = 0; for (int i = 0; i < n; i++) s += h[i]; free(h); return s;
}
int main(int argc, char **argv) {
    const int n = 16 << 20;
    int ndev = 0; CK(cudaGetDeviceCount(&ndev));
    if (argc > 1) {                                    // child: argv[1] = the handle in hex
        cudaIpcMemHandle_t h;
        for (int i = 0; i < (int)sizeof h; i++) sscanf(argv[1] + 2 * i, "%2hhx", (unsigned char *)&h + i);
        CK(cudaSetDevice(ndev > 1 ? 1 : 0));
        float *p; CK(cudaIpcOpenMemHandle((void **)&p, h, cudaIpcMemLazyEnablePeerAccess));
        add1<<<(n + 255) / 256, 256>>>(p, n); CK(cudaDeviceSynchronize());
        printf("CHILD SUM %.1f\n", sum(p, n));
        CK(cudaIpcCloseMemHandle(p));
        return 0;
    }
    CK(cudaSetDevice(0));
    float *p; CK(cudaMalloc(&p, n * sizeof(float)));
    fill<<<(n + 255) / 256, 256>>>(p, n); CK(cudaDeviceSynchronize());
    cudaIpcMemHandle_t h; CK(cudaIpcGetMemHandle(&h, p));
    char hex[2 * sizeof h + 1];
    for (int i = 0; i < (int)sizeof h; i++) sprintf(hex + 2 * i, "%02x", ((unsigned char *)&h)[i]);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) { execl(argv[0], argv[0], hex, (char *)0); _exit(127); }
    int st = 0; waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) { fprintf(stderr, "child failed\n"); return 1; }
    printf("OWNER SUM %.1f\n", sum(p, n));
    CK(cudaFree(p));
    return 0;
}
EOF

cat > peer.cu <<'EOF'
// One process, two GPUs: device 1 reads device 0's buffer through peer access, then
// cudaMemcpyPeer brings device 1's result back to device 0.
#include <cstdio>
#include <cstdlib>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)
__global__ void fill(float *p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = (float)(i % 977); }
__global__ void twice(const float *peer, float *out, int n, int *count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) { out[i] = 2.0f * peer[i]; if (i % 1024 == 0) atomicAdd(count, 1); } }
int main() {
    const int n = 8 << 20; size_t bytes = n * sizeof(float);
    int ok = 0; CK(cudaDeviceCanAccessPeer(&ok, 1, 0));
    if (!ok) { fprintf(stderr, "no peer access between GPU 1 and 0\n"); return 3; }
    float *a, *b, *c; int *small0, *count;     // small ones on each GPU: capture packs them per GPU
    CK(cudaSetDevice(0)); CK(cudaMalloc(&a, bytes)); CK(cudaMalloc(&c, bytes)); CK(cudaMalloc(&small0, 256));
    fill<<<(n + 255) / 256, 256>>>(a, n); CK(cudaMemset(small0, 0, 256)); CK(cudaDeviceSynchronize());
    CK(cudaSetDevice(1)); CK(cudaDeviceEnablePeerAccess(0, 0)); CK(cudaMalloc(&b, bytes)); CK(cudaMalloc(&count, 256));
    CK(cudaMemset(count, 0, 256));
    twice<<<(n + 255) / 256, 256>>>(a, b, n, count); CK(cudaDeviceSynchronize());
    int cnt = 0; CK(cudaMemcpy(&cnt, count, sizeof cnt, cudaMemcpyDeviceToHost));
    printf("PEER COUNT %d\n", cnt);
    CK(cudaMemcpyPeer(c, 0, b, 1, bytes));
    CK(cudaSetDevice(0));
    float *h = (float *)malloc(bytes); CK(cudaMemcpy(h, c, bytes, cudaMemcpyDeviceToHost));
    double s = 0; for (int i = 0; i < n; i++) s += h[i];
    printf("PEER SUM %.1f\n", s);
    return 0;
}
EOF

RUN=(python3 -m torch.distributed.run --standalone --nproc-per-node "$NPROC")

if [[ $PARTS == *1* ]]; then
step "1. DDP, $NPROC ranks, $STEPS steps: native, captured, replayed as a group"
timeout 120 "${RUN[@]}" ddp.py "$STEPS" > native.txt 2> native.err; check $? "native DDP run"
timeout 180 cudasnap capture -f -o job.cusnap -- "${RUN[@]}" ddp.py "$STEPS" > captured.txt 2> capture.err
rc=$?; tail -8 capture.err; check $rc "DDP capture (exit 0)"
sort native.txt > a.txt; sort captured.txt > b.txt
if ! diff a.txt b.txt > /dev/null; then
    diff a.txt b.txt | head -6
    timeout 120 "${RUN[@]}" ddp.py "$STEPS" 2> /dev/null | sort > a2.txt
    diff -q a.txt a2.txt > /dev/null && same=identical || same=different
    echo "(a second native run: $same to the first)"
fi
diff a.txt b.txt > /dev/null; check $? "capture does not change the program's output ($(wc -l < a.txt) rank lines)"
MAN=job.cusnap; [ -f job.group.json ] && MAN=job.group.json
cp "$MAN" "$OUT/multigpu_manifest.json"
python3 - "$MAN" "$NPROC" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); n = int(sys.argv[2])
ranks = [r for r in m["ranks"] if r.get("devices")]
links = m["links"]
print("ranks:", [(r["rank"], r["pid"], r["devices"], r.get("rank_env")) for r in m["ranks"]])
print("links:", len(links), "by", sorted({l.get("matched_by") for l in links}), "unmatched:", len(m["unmatched"]))
for u in m["unmatched"][:3]:
    print("  unmatched:", u)
ok = len(ranks) == n and len({r["devices"][0] for r in ranks}) == n and links and not m["unmatched"]
print(f"{'PASS' if ok else 'FAIL'}: manifest: {n} ranks on {n} GPUs, {len(links)} shareable-handle links, none unmatched")
sys.exit(0 if ok else 1)
EOF
[ $? = 0 ] || FAIL=1
timeout 180 cudasnap replay "$MAN" --json > "$OUT/multigpu_replay.json"
rc=$?
python3 - "$OUT/multigpu_replay.json" "$rc" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except ValueError:
    print("FAIL: group replay printed no JSON (exit %s)" % sys.argv[2]); sys.exit(1)
for r in d["ranks"]:
    b = r["replay"]
    print(f"rank {r['rank']} GPU {r['device']}: exit {r['exit_code']}, {b.get('launches')} launches, {b.get('placed')} placed, "
          f"{b.get('fell_back')} fell back, {b.get('d2h_verified')} D2H verified; errors {r['errors'][:2]}")
work = [r for r in d["ranks"] if r["replay"].get("launches")]
ok = d["exit_code"] == 0 and all(r["replay"].get("fell_back") == 0 and r["replay"].get("d2h_verified", 0) > 0 for r in work) and len(work) >= 2
print(f"{'PASS' if ok else 'FAIL'}: DDP group replay: exit {d['exit_code']}, 0 fell back, D2H verified on every rank ({d['elapsed_s']:.1f} s)")
sys.exit(0 if ok else 1)
EOF
[ $? = 0 ] || FAIL=1

fi
if [[ $PARTS == *2* ]]; then
step "2. legacy CUDA IPC between 2 processes (captured with --placement off)"
nvcc -O2 -arch=sm_90 -o ipc ipc.cu || { echo "FAIL: nvcc ipc.cu"; FAIL=1; }
./ipc > ipc_native.txt; check $? "native IPC program: $(tr '\n' ' ' < ipc_native.txt)"
timeout 120 cudasnap capture -f -o ipcreg.cusnap -- ./ipc > ipc_region.txt 2>&1
echo "(with the default --placement region: exit $?, $(grep -c SUM ipc_region.txt) sums printed: legacy IPC needs cuMemAlloc memory)"
timeout 120 cudasnap capture -f --placement off -o ipc.cusnap -- ./ipc > ipc_cap.txt 2> ipc_cap.err
check $? "IPC capture --placement off"
diff <(sort ipc_native.txt) <(sort ipc_cap.txt) > /dev/null; check $? "IPC capture does not change the output"
IMAN=ipc.group.json
python3 -c "import json; m=json.load(open('$IMAN')); print('links', [(l['kind'], l['from']['pid'], l['to']['pid']) for l in m['links']], 'unmatched', m['unmatched'])"
timeout 180 cudasnap replay "$IMAN"; check $? "IPC group replay (exit 0, both processes verified)"
# the owner's allocation kept from its recorded address: it falls back to cuMemAlloc and is
# shared through a real cudaIpcMemHandle (the path a taken address leads to)
BLOCK=$(python3 - "$IMAN" <<'PY'
import json, os, sys
from cudasnap.formats import SnapshotReader
m = json.load(open(sys.argv[1]))
for r in m["ranks"]:
    p = r["snapshot"] if os.path.isabs(r["snapshot"]) else os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), r["snapshot"])
    with SnapshotReader(p) as rd:
        calls = list(rd.records("c"))
    if any(c["f"].startswith("cuIpcGetMemHandle") for c in calls):
        a = next(c for c in calls if c["f"].startswith("cuMemAlloc") and c.get("r") == 0)["a"]
        print(f"{a['dptr']:#x}:{a['bytesize']}")
PY
)
echo "blocking the owner's recorded allocation $BLOCK"
timeout 180 env CUDASNAP_REPLAY_TEST_BLOCK="$BLOCK" cudasnap replay "$IMAN" --json > ipc_fallback.json 2> ipc_fallback.err; rc=$?
python3 - ipc_fallback.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["ranks"]:
    b = r["replay"]
    print(f"  rank {r['rank']}: exit {r['exit_code']}, {b.get('placed')} placed, {b.get('fell_back')} fell back, "
          f"{b.get('d2h_verified')} D2H verified; errors {r['errors'][:2]}; notes {(b.get('notes') or [])[:3]}")
sys.exit(0 if d["exit_code"] == 0 and d["ranks"][0]["replay"].get("fell_back") else 1)
PY
check $? "IPC group replay with the owner's allocation fallen back (real IPC handle; exit 0)"

fi
if [[ $PARTS == *3* ]]; then
step "3. one process, 2 GPUs, peer access"
nvcc -O2 -arch=sm_90 -o peer peer.cu || { echo "FAIL: nvcc peer.cu"; FAIL=1; }
./peer; check $? "native peer program"
timeout 120 cudasnap capture -f -o peer.cusnap -- ./peer; check $? "peer capture"
cudasnap info peer.cusnap | grep -iE "gpu|device" | head -4
timeout 180 cudasnap replay peer.cusnap > peer_replay.txt 2>&1; rc=$?; tail -6 peer_replay.txt
[ $rc = 0 ] && grep -q "recorded 0 on GPU 0, recorded 1 on GPU 1" peer_replay.txt
check $? "peer replay on 2 GPUs (exit 0, D2H verified, peer access enabled for real)"
timeout 180 cudasnap replay peer.cusnap --devices 1,0 > /dev/null 2>&1; check $? "peer replay with the GPUs swapped (--devices 1,0)"

fi
if [[ $PARTS == *4* ]]; then
step "4. NCCL kernel times per rank: --profile timeline against native (torch.profiler), $PROF_STEPS steps"
# An NCCL kernel's time includes waiting for its peers, so it depends on when each rank's host
# launched it: --pace recorded replays every rank's calls at their recorded offsets from one
# group start. Compared with a native run and with the captured run's own profile.
timeout 180 env DDP_PROFILE="$W/native_prof" "${RUN[@]}" ddp.py "$PROF_STEPS" > /dev/null 2>&1; check $? "native profiled run"
timeout 300 env DDP_PROFILE="$W/captured_prof" cudasnap capture -f -o prof.cusnap -- "${RUN[@]}" ddp.py "$PROF_STEPS" > /dev/null 2> prof_capture.err
check $? "capture of the profiled run"
PMAN=prof.cusnap; [ -f prof.group.json ] && PMAN=prof.group.json
timeout 300 cudasnap replay "$PMAN" --profile timeline --pace recorded --out "$W/paced_prof.json" \
    --trace "$OUT/multigpu_trace.json.gz" > timeline.txt 2>&1
check $? "group replay --profile timeline --pace recorded"
tail -4 timeline.txt
timeout 300 cudasnap replay "$PMAN" --profile timeline --out "$W/fast_prof.json" > timeline_fast.txt 2>&1
check $? "group replay --profile timeline (--pace fast)"
python3 - "$W" "$NPROC" "$OUT/multigpu_timeline.json" <<'EOF'
# Per rank, medians of the NCCL kernels, split (cudasnap.replay.collectives) into the wait for
# the last peer and the collective after it arrived; the check is on the latter (the wait
# follows each run's host timing: it differs between native runs too).
import json, sys
from cudasnap.replay.collectives import compare_ranks, split_waits
w, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def torch_rows(prefix, r):
    d = json.load(open(f"{w}/{prefix}.rank{r}.json"))
    base = int(d.get("baseTimeNanoseconds") or 0)       # Kineto: ts (us) after this
    return [(e["name"], base + int(e["ts"] * 1000), base + int((e["ts"] + e["dur"]) * 1000))
            for e in d["traceEvents"] if e.get("cat") == "kernel"]

def replay_rows(prefix, r):
    return [(x.get("demangled") or x.get("name") or "", x.get("start_ns"), x.get("end_ns"))
            for x in json.load(open(f"{w}/{prefix}.rank{r}.json"))["launches"]]

runs = {}
for name, fn, prefix in (("native", torch_rows, "native_prof"), ("captured run", torch_rows, "captured_prof"),
                         ("replay paced", replay_rows, "paced_prof"), ("replay fast", replay_rows, "fast_prof")):
    try:
        runs[name] = split_waits({r: fn(prefix, r) for r in range(n)})
    except (OSError, ValueError, KeyError) as e:
        print(f"  {name}: no timings ({type(e).__name__}: {e})")
ok = "native" in runs and "replay paced" in runs
# the time after the last arrival depends on which rank came last (ring distance), and a separate
# native run has its own arrival order: compare per last-arriving rank, else per ring distance
# from it (compare_ranks)
per = {name: compare_ranks(c, runs["native"]) for name, c in runs.items() if name != "native" and "native" in runs}
per_rec = {name: compare_ranks(c, runs["captured run"]) for name, c in runs.items()
           if name.startswith("replay") and "captured run" in runs}
for r in range(n):
    cells, good = [], ok
    for name, c in runs.items():
        v = c["ranks"].get(r) or {}
        if not v.get("n"):
            cells.append(f"{name}: none"); good = False; continue
        txt = f"{name} {v['collective_us']:.1f} us (kernel {v['kernel_us']:.1f}, waiting {v['wait_us']:.1f}; {v['n']})"
        cmp = per.get(name, {}).get(r)
        if cmp is not None:
            v["vs_native_by_last"] = cmp
            txt += (f"; vs native, per {cmp['by']}: " + ", ".join(f"{cmp['by'].split()[0]} {k}: {b:.1f}->{x:.1f} ({d:+.1f}%)"
                                                          for _kern, k, b, x, d in cmp["cells"])
                    if cmp["cells"] else "; nothing comparable with native")
            if name.startswith("replay") and (cmp["worst_pct"] is None or cmp["worst_pct"] > 10):
                good = False
        rc = per_rec.get(name, {}).get(r)
        if rc is not None:
            v["vs_recorded_run_by_last"] = rc
            txt += f"; vs the recorded run: worst {rc['worst_pct']:.1f}%" if rc["worst_pct"] is not None else ""
        cells.append(txt)
    ok &= good
    print(f"{'PASS' if good else 'FAIL'}: rank {r}: NCCL collective after the last rank arrived, median: " + "; ".join(cells))
for name, c in runs.items():
    meds = sorted(v["collective_us"] for v in c["ranks"].values() if v.get("collective_us"))
    if meds:
        print(f"  job: {name}: collective after the last arrival, median over ranks {meds[len(meds) // 2]:.1f} us;"
              f" last arrival to last end {c.get('span_us') or 0:.1f} us")
json.dump(runs, open(out, "w"), indent=1, default=str)
sys.exit(0 if ok else 1)
EOF
[ $? = 0 ] || FAIL=1

fi
if [[ $PARTS == *5* ]]; then
step "5. failures: missing rank, fewer GPUs, a killed peer"
R1=$(python3 -c "import json; m=json.load(open('$MAN')); print([r for r in m['ranks'] if r.get('devices')][-1]['snapshot'])")
mv "$R1" "$R1.away"
timeout 60 cudasnap replay "$MAN" > miss.txt 2>&1; rc=$?; cat miss.txt | tail -2
[ $rc = 2 ] && grep -q "is missing" miss.txt; check $? "missing rank snapshot: clear error, exit 2 (got $rc)"
mv "$R1.away" "$R1"
timeout 60 cudasnap replay "$MAN" --devices 0 > few.txt 2>&1; rc=$?; tail -2 few.txt
[ $rc = 2 ] && grep -q "GPU" few.txt; check $? "--devices 0 for a $NPROC-GPU job: clear error, exit 2 (got $rc)"
KILL=$(python3 - "$MAN" <<'EOF'
import json, sys
from cudasnap.formats import SnapshotReader
m = json.load(open(sys.argv[1]))
r = [r for r in m["ranks"] if r.get("devices")][-1]
import os
path = r["snapshot"] if os.path.isabs(r["snapshot"]) else os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), r["snapshot"])
seqs = [c["s"] for c in SnapshotReader(path).records("c") if c["f"].startswith("cuLaunch")]
print(f"{r['rank']}:{seqs[len(seqs) // 2]}")
EOF
)
echo "killing rank ${KILL%%:*} before call #${KILL##*:}"
start=$(date +%s)
timeout 150 env CUDASNAP_GROUP_TEST_KILL=$KILL cudasnap replay "$MAN" > killed.txt 2>&1; rc=$?
took=$(( $(date +%s) - start )); tail -5 killed.txt
[ $rc = 2 ] && grep -q "killed by signal 9" killed.txt; check $? "killed peer replayer: clear error, exit 2 in ${took} s (got $rc)"

fi
echo
[ $FAIL = 0 ] && echo "ALL PASS" || echo "SOME FAILED"
exit $FAIL
