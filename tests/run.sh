#!/bin/sh
# tests/run.sh: the README's test command runs this (via `make test`).
# Unit tests (Criterion), then every end-to-end script tests/e2e/*.sh, then
# the GPU test binary (its tests report skipped without a device).
# Ends with one line "tests: N passed, N failed, N skipped"; exit 1 on any failure.
set -u
cd "$(dirname "$0")/.." || exit 2
QATCHECK=${QATCHECK:-./qatcheck}
TEST_UNIT=${TEST_UNIT:-build/test_unit}
TEST_GPU=${TEST_GPU:-build/test_gpu}
export QATCHECK
PY=${PYTHON:-/usr/bin/python3}
export PY
pass=0; fail=0; skip=0
failed=""

echo "== unit tests ($TEST_UNIT)"
if "$TEST_UNIT" --jobs 2 2>&1 | tee /tmp/qc_unit.$$; then :; fi
line=$(grep -E '^\[====\] Synthesis' /tmp/qc_unit.$$ | tail -1)
up=$(printf '%s' "$line" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
uf=$(printf '%s' "$line" | sed -n 's/.*Failing: \([0-9]*\).*/\1/p')
uc=$(printf '%s' "$line" | sed -n 's/.*Crashing: \([0-9]*\).*/\1/p')
if [ -z "$up" ]; then fail=$((fail+1)); failed="$failed unit(no-synthesis)"; else
  pass=$((pass+up)); fail=$((fail+uf+uc)); [ $((uf+uc)) -eq 0 ] || failed="$failed unit"; fi
rm -f /tmp/qc_unit.$$

echo "== end-to-end tests"
for t in tests/e2e/*.sh; do
  [ -e "$t" ] || continue
  n=$(basename "$t" .sh)
  out=$(sh "$t" 2>&1); rc=$?
  if [ $rc -eq 0 ]; then echo "PASS $n"; pass=$((pass+1));
  elif [ $rc -eq 77 ]; then echo "SKIP $n"; skip=$((skip+1));
  else echo "FAIL $n"; printf '%s\n' "$out" | sed 's/^/    /' | tail -40; fail=$((fail+1)); failed="$failed $n"; fi
done

if [ -x "$TEST_GPU" ] && [ "${QC_SKIP_GPU_TESTS:-0}" != 1 ]; then
  echo "== gpu tests ($TEST_GPU)"
  "$TEST_GPU" --verbose 2>&1 | tee /tmp/qc_gpu.$$
  line=$(grep -E '^\[====\] Synthesis' /tmp/qc_gpu.$$ | tail -1)
  gp=$(printf '%s' "$line" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
  gf=$(printf '%s' "$line" | sed -n 's/.*Failing: \([0-9]*\).*/\1/p')
  gc=$(printf '%s' "$line" | sed -n 's/.*Crashing: \([0-9]*\).*/\1/p')
  gs=$(grep -cE '^\[SKIP\]' /tmp/qc_gpu.$$)
  if [ -n "$gp" ]; then pass=$((pass+gp)); skip=$((skip+gs)); fail=$((fail+gf+gc)); else fail=$((fail+1)); failed="$failed gpu(no-synthesis)"; fi
  rm -f /tmp/qc_gpu.$$
fi

[ -z "$failed" ] || echo "failed:$failed"
echo "tests: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
