#!/bin/sh
# tests/run.sh [--fast] [-j N] [NAME...]: the test runner (`make test` runs it
# with no argument: the whole suite, what CI runs; `make check` runs it with
# --fast: the contributor loop).
#
#   no NAME    the unit tests (Criterion), every end-to-end script
#              tests/e2e/*.sh but fuzz (it builds the library again with
#              clang and fuzzes: .ci/run runs it before the suite, `make
#              fuzz` or `tests/run.sh fuzz` by hand), then the GPU test
#              binary (its tests report skipped without a device)
#   --fast     the unit tests and the end-to-end scripts listed in
#              tests/fast.list (docs/contributing.md: what belongs there)
#   NAME...    only these: an e2e script's name (class_cases), 'unit' or 'gpu'
#   -j N       run N end-to-end scripts at once (default: QC_JOBS, else the
#              CPU count + 1: most scripts wait on the processes they start)
#
# The scripts are independent (each works in its own mktemp -d), so they run
# in parallel, the slowest known first (tests/slow.list), each with
# OPENBLAS_NUM_THREADS=1 unless it is set (with -j 1, BLAS keeps its own). Each prints one
# line when it ends, "PASS name (12.3 s)"; a failure prints its last 40
# lines. The run ends with the five slowest scripts, then one line
# "tests: N passed, N failed, N skipped"; exit 1 on any failure, 2 on a bad
# argument.
set -u
cd "$(dirname "$0")/.." || exit 2
QATCHECK=${QATCHECK:-./qatcheck}
TEST_UNIT=${TEST_UNIT:-build/test_unit}
TEST_GPU=${TEST_GPU:-build/test_gpu}
PY=${PYTHON:-/usr/bin/python3}
export QATCHECK PY

# --one NAME DIR: run one e2e script (the parallel workers call this)
if [ "${1:-}" = --one ]; then
  n=$2; d=$3
  s=$(date +%s.%N)
  # Several scripts share the CPUs: OpenBLAS's own threads would only
  # oversubscribe them (and spin while they wait), so each script's BLAS
  # runs one thread unless the caller chose (the benchmarks, which measure
  # the default, run outside this runner).
  [ "${QC_PAR_RUN:-1}" -gt 1 ] && [ -z "${OPENBLAS_NUM_THREADS:-}" ] && export OPENBLAS_NUM_THREADS=1
  sh "tests/e2e/$n.sh" >"$d/$n.log" 2>&1
  rc=$?
  t=$(awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "$rc $t" >"$d/$n.res"
  case $rc in
    0) echo "PASS $n ($t s)" ;;
    77) echo "SKIP $n ($t s)" ;;
    *) echo "FAIL $n ($t s, exit $rc)"
       # the script's own failed checks first (a long log's tail may hold none
       # of them: mpi's ends in mpirun's abort notice), then its last lines
       grep -A3 '^FAIL' "$d/$n.log" | head -40 | sed 's/^/    /'
       echo "    (the log's last lines:)"
       tail -20 "$d/$n.log" | sed 's/^/    /' ;;
  esac
  exit 0
fi

fast=0
jobs=${QC_JOBS:-$(( $(nproc 2>/dev/null || echo 2) + 1 ))}
names=""
while [ $# -gt 0 ]; do
  case $1 in
    --fast) fast=1 ;;
    -j) [ $# -ge 2 ] || { echo "tests/run.sh: -j needs a number" >&2; exit 2; }; jobs=$2; shift ;;
    -j*) jobs=${1#-j} ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "tests/run.sh: unknown option '$1'" >&2; exit 2 ;;
    *) names="$names $1" ;;
  esac
  shift
done
case $jobs in ''|*[!0-9]*|0) echo "tests/run.sh: -j takes a whole number of at least 1, not '$jobs'" >&2; exit 2 ;; esac

run_unit=1; run_gpu=1; e2e=""
if [ -n "$names" ]; then
  run_unit=0; run_gpu=0
  for n in $names; do
    case $n in
      unit) run_unit=1 ;;
      gpu) run_gpu=1 ;;
      *) n=${n%.sh}; n=${n#tests/e2e/}
         [ -f "tests/e2e/$n.sh" ] || { echo "tests/run.sh: no test '$n' (tests/e2e/$n.sh)" >&2; exit 2; }
         e2e="$e2e $n" ;;
    esac
  done
elif [ $fast -eq 1 ]; then
  run_gpu=0
  e2e=$(grep -v '^#' tests/fast.list)
else
  e2e=$(for t in tests/e2e/*.sh; do basename "$t" .sh; done | grep -vx fuzz)
fi

pass=0; fail=0; skip=0
failed=""
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
start=$(date +%s.%N)

# the unit binary runs beside the e2e scripts; its result is read after them
if [ $run_unit -eq 1 ]; then
  ( s=$(date +%s.%N); "$TEST_UNIT" --jobs 2 >"$W/unit.log" 2>&1
    awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }' >"$W/unit.time" ) &
  unit_pid=$!
fi

if [ -n "$e2e" ]; then
  echo "== end-to-end tests ($(echo $e2e | wc -w) scripts, $jobs at once)"
  # the slowest known first, so that the long ones overlap the short ones
  order=$( (grep -v '^#' tests/slow.list; echo $e2e | tr ' ' '\n') | awk -v want=" $(echo $e2e) " 'index(want, " " $0 " ") && !seen[$0]++')
  printf '%s\n' $order | QC_PAR_RUN=$jobs xargs -P "$jobs" -I{} sh "$0" --one {} "$W"
  for n in $order; do
    [ -f "$W/$n.res" ] && read -r rc t <"$W/$n.res" && echo "$t $n"
  done | sort -rn | head -5 | awk 'BEGIN { printf "slowest:" } { printf " %s (%s s)", $2, $1 } END { print "" }'
  for n in $order; do
    [ -f "$W/$n.res" ] || continue
    read -r rc t <"$W/$n.res"
    case $rc in 0) pass=$((pass+1)) ;; 77) skip=$((skip+1)) ;; *) fail=$((fail+1)); failed="$failed $n" ;; esac
  done
  for n in $order; do [ -f "$W/$n.res" ] || { fail=$((fail+1)); failed="$failed $n"; }; done
fi

if [ $run_unit -eq 1 ]; then
  wait $unit_pid
  echo "== unit tests ($TEST_UNIT)"
  t=$(cat "$W/unit.time" 2>/dev/null)
  line=$(grep -E '^\[====\] Synthesis' "$W/unit.log" | tail -1)
  up=$(printf '%s' "$line" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
  uf=$(printf '%s' "$line" | sed -n 's/.*Failing: \([0-9]*\).*/\1/p')
  uc=$(printf '%s' "$line" | sed -n 's/.*Crashing: \([0-9]*\).*/\1/p')
  if [ -z "$up" ]; then
    cat "$W/unit.log"; fail=$((fail+1)); failed="$failed unit(no-synthesis)"
  else
    pass=$((pass+up)); fail=$((fail+uf+uc))
    # our own words, not Criterion's line: the suite's one closing line is
    # the "tests: N passed, N failed, N skipped" below (CI reads it)
    if [ $((uf+uc)) -eq 0 ]; then echo "unit: $up of $up ok ($t s)"; else cat "$W/unit.log"; failed="$failed unit"; fi
  fi
fi

if [ $run_gpu -eq 1 ] && [ -x "$TEST_GPU" ] && [ "${QC_SKIP_GPU_TESTS:-0}" != 1 ]; then
  echo "== gpu tests ($TEST_GPU)"
  "$TEST_GPU" --verbose >"$W/gpu.log" 2>&1
  line=$(grep -E '^\[====\] Synthesis' "$W/gpu.log" | tail -1)
  gp=$(printf '%s' "$line" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
  gf=$(printf '%s' "$line" | sed -n 's/.*Failing: \([0-9]*\).*/\1/p')
  gc=$(printf '%s' "$line" | sed -n 's/.*Crashing: \([0-9]*\).*/\1/p')
  gs=$(grep -cE '^\[SKIP\]' "$W/gpu.log")
  if [ -n "$gp" ]; then
    pass=$((pass+gp)); skip=$((skip+gs)); fail=$((fail+gf+gc))
    if [ $((gf+gc)) -gt 0 ]; then cat "$W/gpu.log"; failed="$failed gpu"
    elif [ "$gp" -eq 0 ] && [ "$gs" -gt 0 ]; then echo "gpu: $gs skipped (no CUDA device)"
    else echo "gpu: $gp ok, $gs skipped"; fi
  else
    cat "$W/gpu.log"; fail=$((fail+1)); failed="$failed gpu(no-synthesis)"
  fi
fi

total=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
[ -z "$failed" ] || echo "failed:$failed"
echo "time: ${total} s"
echo "tests: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
