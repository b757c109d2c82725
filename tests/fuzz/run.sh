#!/bin/sh
# tests/fuzz/run.sh [HARNESS...]: replay each harness's regression inputs,
# then fuzz it for FUZZ_SECONDS (default 60) from its seed corpus
# (docs/robustness.md, "Fuzzing"). `make fuzz` builds the harnesses and runs
# this; tests/e2e/fuzz.sh runs it in the test suite.
#
# A harness is one file, tests/fuzz/NAME.c (LLVMFuzzerTestOneInput), built
# as build-fuzz/fuzz_NAME. Two comment lines in it are read here:
#   fuzz-seeds: PATH...     files or folders that seed its corpus
#   fuzz-options: FLAG...   extra libFuzzer flags (-max_len, -timeout, -dict)
# Its regression inputs, tests/fuzz/regress/NAME/*, must run clean.
# The working corpus grows in build-fuzz/corpus/NAME; a crash lands in
# build-fuzz/artifacts/NAME/ and fails the run (fix it, then add the input
# to tests/fuzz/regress/NAME/). Prints one line per harness: runs, execs/s,
# coverage (cov = edges, ft = features), corpus size. Exit 1 on a finding.
# FUZZ_JOBS harnesses fuzz at once (default: the CPU count), so CI's pass
# of 60 s a harness takes about 60 s x harnesses / jobs.
set -u
cd "$(dirname "$0")/../.." || exit 2
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
OUT=${FUZZ_OUT:-build-fuzz}
names=${*:-$(for f in tests/fuzz/*.c; do basename "$f" .c; done)}
status=0
# fuzz_one NAME: replay, then fuzz one harness; its lines on stdout, status 1 on a finding
fuzz_one() {
  n=$1
  st=0
  bin=$OUT/fuzz_$n
  src=tests/fuzz/$n.c
  [ -x "$bin" ] || { echo "fuzz $n: $bin is not built (make fuzz-bin)"; st=1; return $st; }
  seeds=$(sed -n 's/.*fuzz-seeds:\(.*\)/\1/p' "$src" | head -1 | sed 's#\*/ *$##')
  opts=$(sed -n 's/.*fuzz-options:\(.*\)/\1/p' "$src" | head -1 | sed 's#\*/ *$##')
  reg=tests/fuzz/regress/$n
  if [ -d "$reg" ] && [ -n "$(ls -A "$reg" 2>/dev/null)" ]; then
    # shellcheck disable=SC2086
    if ! "$bin" $opts -runs=1 "$reg"/* >"$OUT/regress_$n.log" 2>&1; then
      echo "fuzz $n: FAIL: a regression input crashes again (log: $OUT/regress_$n.log)"
      tail -20 "$OUT/regress_$n.log" | sed 's/^/    /'
      st=1
      return $st
    fi
    echo "fuzz $n: $(ls "$reg" | wc -l) regression input(s) replayed clean"
  fi
  [ "$FUZZ_SECONDS" -gt 0 ] 2>/dev/null || return $st
  corpus=$OUT/corpus/$n
  art=$OUT/artifacts/$n
  mkdir -p "$corpus" "$art"
  for s in $seeds; do # globs in the seed line expand here
    for f in $s; do
      if [ -d "$f" ]; then cp "$f"/* "$corpus"/ 2>/dev/null; elif [ -f "$f" ]; then cp "$f" "$corpus"/; fi
    done
  done
  log=$OUT/fuzz_$n.log
  # shellcheck disable=SC2086
  "$bin" $opts -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -artifact_prefix="$art/" "$corpus" >"$log" 2>&1
  rc=$?
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(printf '%s' "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
  ft=$(printf '%s' "$last" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
  corp=$(printf '%s' "$last" | sed -n 's/.*corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p')
  if [ $rc -ne 0 ]; then
    echo "fuzz $n: FAIL after ${execs:-?} runs: $(grep -m1 -E 'ERROR|SUMMARY|deadly|timeout' "$log")"
    ls "$art" | sed 's/^/    artifact: /'
    tail -30 "$log" | sed 's/^/    /'
    st=1
  else
    echo "fuzz $n: pass: ${execs:-?} runs in ${FUZZ_SECONDS} s (${rate:-?}/s), cov ${cov:-?} edges, ft ${ft:-?} features, corpus ${corp:-?}"
  fi
  return $st
}

jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
running=0
for n in $names; do
  ( fuzz_one "$n" >"$OUT/result_$n.txt" 2>&1; echo $? >"$OUT/result_$n.rc" ) &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait; running=0; fi
done
wait
for n in $names; do
  cat "$OUT/result_$n.txt"
  [ "$(cat "$OUT/result_$n.rc" 2>/dev/null)" = 0 ] || status=1
  rm -f "$OUT/result_$n.txt" "$OUT/result_$n.rc"
done
exit $status
