#!/bin/sh
# check-independence.sh: src/reference/ is written from the math. It may use
# the shared types (model/module.h, contract.h, sink.h), the numerics (the contract says what the forward used)
# and the backend's float64 GEMM; never production modules, kernels, or the
# candidate's GEMM path; and src/modules/ does not borrow the reference.
# Exit 1 naming each offending line, 0 clean. Usage:
# check-independence.sh [ROOT] (default: this repository). One awk pass.
set -u
cd "${1:-"$(dirname "$0")/.."}" || exit 2
# shellcheck disable=SC2046
awk '
function flush() {   # a file with hits in the calls: say so once, after its lines
  if (hit) print "independence: " hit " " hitwhy
  hit = ""
}
FNR == 1 { flush(); ref = (FILENAME ~ /^src\/reference\//) }
ref && /#include *"/ {
  inc = $0; sub(/.*#include *"/, "", inc); sub(/".*/, "", inc)
  if (inc !~ /^(core\/.*\.h|model\/module\.h|model\/contract\.h|model\/sink\.h|backend\/backend\.h|numerics\/.*\.h|reference\/ref_.*\.h)$/) {
    print "independence: " FILENAME " includes \"" inc "\": the reference may not use production code"; bad = 1
  }
}
ref && /gemm_bf16|->production|qc_mod_|kernels\/|cublasLt/ {   # the candidate path or a production VJP
  print FILENAME ":" FNR ":" $0; hit = FILENAME; hitwhy = "uses the candidate path (above)"; bad = 1
}
!ref && /#include *"reference\/|qc_ref_/ {
  print FILENAME ":" FNR ":" $0; hit = FILENAME; hitwhy = "uses the reference (above)"; bad = 1
}
END {
  flush()
  if (bad) { print "independence check failed"; exit 1 }
}' $(ls src/reference/*.c src/reference/*.h src/modules/*.c 2>/dev/null)
