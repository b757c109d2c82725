# lib.sh: helpers for the end-to-end tests (sourced).
QATCHECK=${QATCHECK:-./qatcheck}
PY=${PY:-/usr/bin/python3}
case "$QATCHECK" in /*) ;; *) QATCHECK="$(pwd)/$QATCHECK" ;; esac
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails+1)); }
# expect_exit CODE DESC CMD...: run CMD, compare its exit status
expect_exit() {
  want=$1; desc=$2; shift 2
  "$@" >"$T/out" 2>"$T/err"; got=$?
  if [ "$got" -eq "$want" ]; then ok "$desc (exit $got)"; else bad "$desc: exit $got, expected $want"; sed 's/^/      /' "$T/err" | head -5; fi
}
finish() { [ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }; exit 0; }
# a tolerances block for linear cases
LIN_TOL='"tolerances": {
  "d_x": {"rel_l2": 4e-3, "cosine_min": 0.99999, "norm_ratio": [0.999, 1.001], "noise_multiple": 1.25, "reasoning": "bf16 output rounding"},
  "d_weight": {"rel_l2": 4e-3, "cosine_min": 0.99999, "norm_ratio": [0.999, 1.001], "noise_multiple": 1.25, "reasoning": "bf16 output rounding"},
  "d_bias": {"rel_l2": 4e-3, "cosine_min": 0.99999, "norm_ratio": [0.995, 1.005], "noise_multiple": 1.25, "reasoning": "bf16 output rounding"}}'
