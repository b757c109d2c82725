#!/bin/sh
# check-independence.sh: src/reference/ is written from the math. It may use
# the shared types, the numerics (the contract says what the forward used)
# and the backend's float64 GEMM; never production modules, kernels, or the
# candidate's GEMM path. Exit 1 naming the offending line. Usage:
# check-independence.sh [ROOT] (default: this repository).
set -u
cd "${1:-"$(dirname "$0")/.."}" || exit 2
bad=0
for f in src/reference/*.c src/reference/*.h; do
  [ -e "$f" ] || continue
  # includes: only system headers and the allowed project headers
  grep -n '#include *"' "$f" | while IFS= read -r line; do
    inc=$(printf '%s' "$line" | sed 's/.*#include *"\([^"]*\)".*/\1/')
    case "$inc" in
      core/*.h|model/module.h|model/contract.h|backend/backend.h|numerics/*.h|reference/ref_*.h) ;;
      *) echo "independence: $f includes \"$inc\": the reference may not use production code"; echo x >> /tmp/qc_indep.$$ ;;
    esac
  done
  # calls into the candidate path or production VJPs
  if grep -nE 'gemm_bf16|->production|qc_mod_|kernels/|cublasLt' "$f"; then
    echo "independence: $f uses the candidate path (above)"; bad=1
  fi
done
if [ -e /tmp/qc_indep.$$ ]; then rm -f /tmp/qc_indep.$$; bad=1; fi
# production modules must not borrow the reference either
for f in src/modules/*.c; do
  [ -e "$f" ] || continue
  if grep -nE '#include *"reference/|qc_ref_' "$f"; then
    echo "independence: $f uses the reference (above)"; bad=1
  fi
done
[ $bad -eq 0 ] || { echo "independence check failed"; exit 1; }
exit 0
