#!/bin/sh
# fuzz.sh: the libFuzzer harnesses of tests/fuzz/ (docs/robustness.md):
# built with clang (ASan + UBSan), every regression input replayed, each
# harness fuzzed for FUZZ_SECONDS (default 5: a smoke run; CI fuzzes each
# harness for 60 s before the suite, .ci/run).
# Skipped (77) where clang or its libFuzzer runtime is missing.
. "$(dirname "$0")/lib.inc"
command -v "${FUZZ_CC:-clang}" >/dev/null 2>&1 || { echo "skip: no clang"; exit 77; }
printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$T/t.c"
"${FUZZ_CC:-clang}" -fsanitize=fuzzer,address,undefined "$T/t.c" -o "$T/t" >/dev/null 2>&1 || { echo "skip: clang has no libFuzzer"; exit 77; }
if make -s fuzz-bin >"$T/build.log" 2>&1; then ok "harnesses built"; else bad "make fuzz-bin failed"; tail -20 "$T/build.log"; finish; fi
export QATCHECK_HDF5_DEADLINE=2
if FUZZ_SECONDS=${FUZZ_SECONDS:-5} sh tests/fuzz/run.sh >"$T/fuzz.log" 2>&1; then
  sed 's/^/ok   /' "$T/fuzz.log"
else
  cat "$T/fuzz.log"
  bad "a fuzz harness found a crash, a hang or a leak (artifacts in build-fuzz/artifacts/)"
fi
finish
