#!/bin/sh
# mpi.sh: `mpirun -np 4 qatcheck vjp|contract` on the CPU (src/dist/,
# docs/distributed.md): the modules split among 4 ranks, the results merged
# on rank 0, whose JSON reports equal a single process's apart from timing
# fields (vjp with planted defects: the same checks fail; contract: rows,
# classes, outliers); a bad module on rank 2: every rank exits 2, the one
# error line names rank 2 and the module, nothing hangs, only the error
# report is written; a rank stopped (SIGSTOP) in a job of 3: every rank ends
# within seconds of its --rank-timeout, one line naming it, only the error
# report, exit 2 (unless mpirun's own shutdown hangs: docs/distributed.md);
# a rank stopped as it enters MPI_Init (a PMPI shim built with mpicc):
# --rank-timeout, QATCHECK_RANK_TIMEOUT and --timeout each end the job with
# one line, the older report replaced by the error report; a rank
# timeout under the minimum (--rank-timeout 0.01, QATCHECK_RANK_TIMEOUT=0.01)
# is refused with one line instead of ending a healthy job; a verb that
# does not distribute refuses several ranks.
# Skipped (77) without mpirun or without MPI in this qatcheck.
. "$(dirname "$0")/lib.inc"
command -v mpirun >/dev/null 2>&1 || { echo "skip: no mpirun"; exit 77; }
MPIRUN="mpirun --oversubscribe -np 4"
[ "$(id -u)" = 0 ] && MPIRUN="mpirun --allow-run-as-root --oversubscribe -np 4"
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" # Open MPI's own allocations at MPI_Init
TO="timeout 300"
# without MPI in this build, mpirun of qatcheck is refused: nothing to test
$TO $MPIRUN "$QATCHECK" vjp --help >/dev/null 2>"$T/probe" || { grep -q "built without MPI" "$T/probe" && { echo "skip: built without MPI"; exit 77; }; }
ROOT=$(pwd)
"$PY" scripts/make_class_dump.py "$T/d.h5" || exit 1
cat >"$T/c.json" <<'J'
{"data": {"dump": "d.h5", "modules": "^/(model\\.layers\\.0\\.(input_layernorm|mlp\\.act|mlp\\.router)|model\\.lm_head\\.logprob|defect\\.(rmsnorm_no_mean|swiglu_clamp_pass|logprob_count|router_ids))$"},
 "candidate": "dump",
 "tolerances": {"d_x": {"rel_l2": 2e-5, "reasoning": "fp32 statistics"}, "d_weight": {"rel_l2": 2e-5, "reasoning": "fp32 sums"},
   "d_gate": {"rel_l2": 1e-6, "reasoning": "elementwise fp32"}, "d_up": {"rel_l2": 1e-6, "reasoning": "elementwise fp32"},
   "d_logits": {"rel_l2": 5e-5, "reasoning": "fp32 log-sum-exp"}}}
J
mkdir "$T/one" "$T/four"
same() { # same KIND: one/r.json and four/r.json equal apart from timing fields
  "$PY" - "$T/one/r.json" "$T/four/r.json" <<'P'
import json, sys
def strip(o):
    if isinstance(o, dict):
        return {k: strip(v) for k, v in o.items() if k not in ("seconds", "timing_s")}
    if isinstance(o, list):
        return [strip(v) for v in o]
    return o
a, b = (strip(json.load(open(p))) for p in sys.argv[1:3])
if a != b:
    for k in a:
        if a.get(k) != b.get(k): print("differs:", k)
    sys.exit(1)
print("same report:", len(a.get("checks", a.get("rows", []))), "entries")
P
}
# ---- vjp: 8 modules over 4 ranks, 4 planted defects fail as in one process
(cd "$T/one" && "$QATCHECK" vjp --case "$T/c.json" --json r.json -q); rc1=$?
(cd "$T/four" && $TO $MPIRUN "$QATCHECK" vjp --case "$T/c.json" --json r.json -q >"$T/out" 2>"$T/err"); rc4=$?
[ $rc1 -eq 1 ] && [ $rc4 -eq 1 ] && ok "vjp: one process and 4 ranks both exit 1 (planted defects)" || bad "vjp: exits $rc1 (one) and $rc4 (4 ranks), expected 1 and 1: $(tail -3 "$T/err")"
same && ok "vjp: the 4 ranks' JSON report equals one process's (timing fields aside)" || bad "vjp: reports differ"
"$PY" - "$T/four/r.json" <<'P' || bad "vjp: 4 ranks: the failed checks are not the 4 planted defects"
import json, sys
r = json.load(open(sys.argv[1]))
failed = sorted((c["module"], c["tensor"]) for c in r["checks"] if c["verdict"] == "fail")
assert failed == [("/defect.logprob_count", "d_logits"), ("/defect.rmsnorm_no_mean", "d_x"),
                  ("/defect.router_ids", "d_logits"), ("/defect.swiglu_clamp_pass", "d_up")], failed
P
# ---- vjp, generated instances (3 shapes: rank 3 has none)
rm -f "$T/one/r.json" "$T/four/r.json"
(cd "$T/one" && "$QATCHECK" vjp --case "$ROOT/cases/swiglu.json" --json r.json -q); rc1=$?
(cd "$T/four" && $TO $MPIRUN "$QATCHECK" vjp --case "$ROOT/cases/swiglu.json" --json r.json -q >"$T/out" 2>"$T/err"); rc4=$?
[ $rc1 -eq 0 ] && [ $rc4 -eq 0 ] && same && ok "vjp: generated instances over 4 ranks (one idle): the same report" || bad "vjp generated: exits $rc1 and $rc4, or reports differ"
# ---- contract: the committed checkpoint over 4 ranks
rm -f "$T/one/r.json" "$T/four/r.json"
CK="$ROOT/cases/data/contract_ckpt.h5"
(cd "$T/one" && "$QATCHECK" contract --master-vs-dequant --dump "$CK" --weight-format fp8_block128,nvfp4 --json r.json -q); rc1=$?
(cd "$T/four" && $TO $MPIRUN "$QATCHECK" contract --master-vs-dequant --dump "$CK" --weight-format fp8_block128,nvfp4 --json r.json -q >"$T/out" 2>"$T/err"); rc4=$?
[ $rc1 -eq $rc4 ] && ok "contract: one process and 4 ranks exit alike ($rc1)" || bad "contract: exits $rc1 (one) and $rc4 (4 ranks): $(tail -3 "$T/err")"
same && ok "contract: the 4 ranks' JSON report equals one process's (timing fields aside)" || bad "contract: reports differ"
grep -q '"ranks":[[:space:]]*4' "$T/four/r.json" && ok "contract: the report's timing names 4 ranks" || bad "contract: no \"ranks\": 4 in timing_s"
# ---- a bad module on rank 2 (units go round robin: the third module group)
"$PY" - "$T/bad.h5" <<'P' || exit 1
import sys
import h5py
import numpy as np
rng = np.random.default_rng(5)
def bf(a):
    a = np.asarray(a, np.float32).copy()
    a.view(np.uint32)[...] &= 0xFFFF0000
    return a
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    for i in range(6):
        g = f.create_group(f"model.layers.{i}.norm")
        g.attrs["class"] = "rmsnorm"
        g["inputs/x"] = bf(rng.standard_normal((8, 16)))
        g["params/weight"] = bf(1 + 0.1 * rng.standard_normal(16))
        if i != 2:
            g["grad_out/dy"] = bf(rng.standard_normal((8, 16)))
P
cat >"$T/bad.json" <<'J'
{"data": {"dump": "bad.h5"}, "candidate": "builtin", "contract": {"eps": 1e-6},
 "tolerances": {"d_x": {"rel_l2": 2e-2, "reasoning": "bf16"}, "d_weight": {"rel_l2": 2e-2, "reasoning": "bf16"}}}
J
bad_rank_run "$T/bad.json" "model.layers.2.norm.*grad_out"
# ---- a stopped rank (SIGSTOP) ends the job within its --rank-timeout
# rank 1 logs its pid and execs qatcheck; once its heartbeat thread runs
# and every rank has started MPI it is stopped
# reap PID: the stopped rank ended, if PID is still that rank (a qatcheck);
# once the job is over its pid may belong to another process (pid_max wraps
# on a busy machine), which must never be signalled
reap() {
  [ -n "$1" ] && grep -qs qatcheck /proc/"$1"/cmdline || return 0
  kill -CONT "$1" 2>/dev/null; kill -KILL "$1" 2>/dev/null
}
# ranks_ended: every rank in $T/pids has ended (its pid gone, no longer a
# qatcheck, or a zombie its parent has not reaped)
ranks_ended() {
  for q in $(awk '{ print $2 }' "$T/pids" 2>/dev/null); do
    grep -qs qatcheck /proc/"$q"/cmdline || continue
    [ "$(awk '/^State:/ { print $2 }' /proc/"$q"/status 2>/dev/null)" = Z ] || return 1
  done
}
stall_run() { # stall_run DESC ENV ARG...: the job of 3 ranks under env ENV (VAR=VALUE), rank 1 stopped
  desc=$1; envv=$2; shift 2
  rm -f "$T/four/r.json" "$T/pids"
  ( cd "$T/four" && env "$envv" QC_PIDS="$T/pids" $TO ${MPIRUN%-np 4} -np 3 sh -c 'echo "$OMPI_COMM_WORLD_RANK $$" >>"$QC_PIDS"; exec "$0" "$@"' \
      "$QATCHECK" vjp --case "$ROOT/cases/swiglu.json" --json r.json "$@" >"$T/out" 2>"$T/err"; echo $? >"$T/rc" ) &
  job=$!
  p=
  for i in $(seq 400); do
    p=$(awk '$1 == 1 { print $2 }' "$T/pids" 2>/dev/null)
    [ -n "$p" ] && grep -qs qc-heartbeat /proc/"$p"/task/*/comm && break
    p=; sleep 0.05
  done
  [ -n "$p" ] || { bad "$desc: rank 1's heartbeat never started"; wait $job; return; }
  # the heartbeat starts before MPI_Init; a rank stopped inside MPI startup
  # is init_stall_run's case: this one is stopped in the run proper, once
  # every rank has started MPI (the node's segment file, in the job's PMIx
  # folder, is unlinked then)
  dir=$(tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | sed -n 's/^PMIX_SERVER_TMPDIR=//p')
  for i in $(seq 400); do
    [ -n "$dir" ] && ls "$dir"/qatcheck-beat-* >/dev/null 2>&1 || break
    sleep 0.05
  done
  mp=$(awk '{ print $4 }' /proc/"$p"/stat 2>/dev/null) # mpirun: rank 1's parent
  kill -STOP "$p"
  s=$(date +%s)
  # every rank ends (gone, or a zombie mpirun has not reaped yet) ...
  i=0; while ! ranks_ended && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
  took=$(($(date +%s) - s))
  [ "$took" -le 15 ] && ranks_ended && ok "$desc: every rank ends ${took} s after the stop" || bad "$desc: the ranks still ran ${took} s after the stop"
  # ... then mpirun. Open MPI 4.1's can hang in its own shutdown once every
  # rank has ended (main thread in PMIx_server_finalize, the PMIx progress
  # thread waiting on a lock: seen about once in 50 such jobs on a loaded
  # machine; docs/distributed.md): its exit status is then never given, so
  # it is ended here and only what the ranks did is checked (it may crash
  # there instead, its backtrace naming PMIx_server_finalize)
  i=0; while kill -0 $job 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  if kill -0 $job 2>/dev/null && ranks_ended && grep -qs mpirun /proc/"$mp"/cmdline; then
    echo "note $desc: mpirun's own shutdown hung after every rank had ended (Open MPI's PMIx server): ended, its exit status not checked"
    kill -KILL "$mp"; wait $job
  else
    wait $job
    rc=$(cat "$T/rc")
    if [ "$rc" = 2 ]; then ok "$desc: exit 2"
    elif [ "$rc" -gt 128 ] && grep -q 'PMIx_server_finalize' "$T/err"; then # the same shutdown, crashing instead
      echo "note $desc: mpirun crashed in its own shutdown (PMIx_server_finalize) after every rank had ended: exit $rc not checked"
    else bad "$desc: exit $rc: $(cat "$T/err")"; fi
  fi
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && ok "$desc: one error line" || bad "$desc: $(grep -c 'qatcheck: error:' "$T/err") error lines: $(cat "$T/err")"
  grep 'qatcheck: error:' "$T/err" | grep -q "rank 1 (pid $p) made no progress for --rank-timeout 3 s" && ok "$desc: the line names rank 1" || bad "$desc: $(cat "$T/err")"
  [ -e "$T/four/r.json" ] && error_or_none "$T/four/r.json" && ok "$desc: the error report only" || bad "$desc: no error report at r.json, or another report"
  reap "$p"
  sleep 0.2
  st=$(grep -qs qatcheck /proc/"$p"/cmdline && awk '/^State:/ { print $2 }' /proc/"$p"/status 2>/dev/null)
  [ -z "$st" ] || [ "$st" = Z ] && ok "$desc: nothing left running" || bad "$desc: rank 1 ($p) still runs"
}
stall_run "rank 1 stopped, --rank-timeout 3" QATCHECK_RANK_TIMEOUT=600 --rank-timeout 3
stall_run "rank 1 stopped, QATCHECK_RANK_TIMEOUT=3" QATCHECK_RANK_TIMEOUT=3
expect_exit 2 "--rank-timeout -1 is refused" "$QATCHECK" vjp --case "$ROOT/cases/swiglu.json" --rank-timeout -1
grep -q "qatcheck: error: option '--rank-timeout' is '-1': expected a number from 0 to 1e9" "$T/err" && ok "--rank-timeout -1: the line says what is expected" || bad "--rank-timeout -1: $(cat "$T/err")"
# ---- a rank stopped inside MPI startup: the watch and --timeout run before MPI_Init
# a PMPI shim (the MPI profiling interface) stops the rank named by
# QC_STOP_RANK as it enters MPI_Init_thread; the other ranks wait for it in theirs
if command -v mpicc >/dev/null 2>&1; then
  cat >"$T/stop.c" <<'C'
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
  const char *r = getenv("OMPI_COMM_WORLD_RANK"), *s = getenv("QC_STOP_RANK");
  if (r && s && strcmp(r, s) == 0) raise(SIGSTOP);
  return PMPI_Init_thread(argc, argv, required, provided);
}
C
  mpicc -shared -fPIC -o "$T/stop.so" "$T/stop.c" || bad "mpicc: the PMPI shim does not build"
fi
# under `make asan` the sanitizer's runtime must come first among the preloads
asan_rt=$(ldd "$QATCHECK" 2>/dev/null | awk '/libasan/ { print $3 }')
SHIM="${asan_rt:+$asan_rt:}$T/stop.so"
init_stall_run() { # init_stall_run DESC NEEDLE ENV ARG...: 3 ranks, rank 1 stopped entering MPI_Init, under env ENV
  desc=$1; needle=$2; envv=$3; shift 3
  cp "$T/one/r.json" "$T/four/r.json" # an older report at the path: it must not stay
  rm -f "$T/pids"
  s=$(date +%s)
  ( cd "$T/four" && env "$envv" QC_STOP_RANK=1 QC_SHIM="$SHIM" QC_PIDS="$T/pids" timeout 60 ${MPIRUN%-np 4} -np 3 \
      sh -c 'echo "$OMPI_COMM_WORLD_RANK $$" >>"$QC_PIDS"; LD_PRELOAD="$QC_SHIM" exec "$0" "$@"' \
      "$QATCHECK" vjp --case "$ROOT/cases/swiglu.json" --json r.json "$@" >"$T/out" 2>"$T/err"; echo $? >"$T/rc" )
  took=$(($(date +%s) - s))
  p=$(awk '$1 == 1 { print $2 }' "$T/pids" 2>/dev/null)
  [ "$(cat "$T/rc")" = 2 ] && ok "$desc: exit 2 (${took} s)" || bad "$desc: exit $(cat "$T/rc") after ${took} s (124: the job hung): $(head -3 "$T/err")"
  [ "$took" -le 30 ] && ok "$desc: the job ends ${took} s after its start" || bad "$desc: the job took ${took} s"
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && ok "$desc: one error line" || bad "$desc: $(grep -c 'qatcheck: error:' "$T/err") error lines: $(cat "$T/err")"
  grep 'qatcheck: error:' "$T/err" | grep -q "$needle" && ok "$desc: the line says why" || bad "$desc: no '$needle' in: $(cat "$T/err")"
  [ -e "$T/four/r.json" ] && error_or_none "$T/four/r.json" && ok "$desc: the older report replaced by the error report" || bad "$desc: r.json is not the error report: $(head -c 300 "$T/four/r.json")"
  reap "$p"
}
if [ -f "$T/stop.so" ]; then
  (cd "$T/one" && "$QATCHECK" vjp --case "$ROOT/cases/swiglu.json" --json r.json -q) || bad "swiglu: no passing report to start from"
  init_stall_run "rank 1 stopped in MPI_Init, --rank-timeout 3" "rank 1 (pid [0-9]*) made no progress for --rank-timeout 3 s" \
    QATCHECK_RANK_TIMEOUT=600 --rank-timeout 3
  init_stall_run "rank 1 stopped in MPI_Init, QATCHECK_RANK_TIMEOUT=3" "rank 1 (pid [0-9]*) made no progress for --rank-timeout 3 s" \
    QATCHECK_RANK_TIMEOUT=3
  init_stall_run "rank 1 stopped in MPI_Init, --timeout 5 (no rank timeout)" "the run did not finish within --timeout 5 s" \
    QATCHECK_RANK_TIMEOUT=600 --rank-timeout 0 --timeout 5
else
  echo "skip: no mpicc for the PMPI shim: a rank stopped inside MPI startup"
fi
# ---- a rank timeout shorter than the heartbeat allows is refused, never run
expect_exit 2 "--rank-timeout 0.01 is refused (one process)" "$QATCHECK" vjp --case "$ROOT/cases/swiglu.json" --rank-timeout 0.01
grep -q "qatcheck: error: option '--rank-timeout' is '0.01': below the minimum of 1 s" "$T/err" && ok "--rank-timeout 0.01: the line names the minimum" || bad "--rank-timeout 0.01: $(cat "$T/err")"
expect_exit 0 "--rank-timeout 1 (the minimum) is taken" "$QATCHECK" vjp --case "$ROOT/cases/swiglu.json" --rank-timeout 1 -q
(cd "$T/four" && $TO ${MPIRUN%-np 4} -np 3 "$QATCHECK" vjp --case "$ROOT/cases/swiglu.json" --rank-timeout 0.01 >"$T/out" 2>"$T/err"); rc=$?
[ $rc -eq 2 ] && [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep 'qatcheck: error:' "$T/err" | grep -q -- "option '--rank-timeout' is '0.01': below the minimum of 1 s" &&
  ok "--rank-timeout 0.01 under 3 ranks: refused with one line naming the minimum, no rank taken for stopped" || bad "--rank-timeout 0.01 under 3 ranks: exit $rc: $(cat "$T/err")"
(cd "$T/four" && QATCHECK_RANK_TIMEOUT=0.01 $TO ${MPIRUN%-np 4} -np 3 "$QATCHECK" vjp --case "$ROOT/cases/swiglu.json" >"$T/out" 2>"$T/err"); rc=$?
[ $rc -eq 2 ] && [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep 'qatcheck: error:' "$T/err" | grep -q "QATCHECK_RANK_TIMEOUT is '0.01': below the minimum of 1 s" &&
  ok "QATCHECK_RANK_TIMEOUT=0.01 under 3 ranks: refused with one line naming the minimum" || bad "QATCHECK_RANK_TIMEOUT=0.01 under 3 ranks: exit $rc: $(cat "$T/err")"
# ---- a verb that runs as one process refuses several
expect_exit 2 "tol under 4 ranks is refused" $TO $MPIRUN "$QATCHECK" tol --help-not-an-option
grep -q "runs as one process" "$T/err" && ok "tol: the refusal says it runs as one process" || bad "tol: $(cat "$T/err")"
finish
