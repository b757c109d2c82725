#!/bin/sh
# bias_default.sh: the bias test is on by default. A d_weight scaled by
# 1.002 before its bf16 cast (scripts/make_linear_dump.py scaled_dw) passes
# hand-written bounds that do not declare a noise multiple (rel_l2 inside
# the bf16 rounding budget, a loose norm ratio), and fails on its bias_z
# alone, for a prefill-sized and a one-token (decode) dump; the correct
# module beside it passes; "bias_z": 0 turns the test off; every check
# reports bias_z.
. "$(dirname "$0")/lib.inc"
HAND='{"rel_l2": 4e-3, "cosine_min": 0.9999, "norm_ratio": [0.99, 1.01], "reasoning": "bf16 output rounding"}'
for m in 48 1; do
  $PY scripts/make_linear_dump.py "$T/d$m.h5" --defects scaled_dw --m $m || exit 1
  cat >"$T/c$m.json" <<J
{"module": "linear", "data": {"dump": "d$m.h5"}, "candidate": "dump", "tolerances": {"d_x": $HAND, "d_weight": $HAND, "d_bias": $HAND}}
J
  expect_exit 1 "M=$m: a 0.2% d_weight scale fails by default" "$QATCHECK" vjp --case "$T/c$m.json" --json "$T/r$m.json"
  $PY - "$T/r$m.json" <<'P' || bad "M=$m: the scaled d_weight does not fail on bias_z alone"
import json, sys
r = json.load(open(sys.argv[1]))
failed = {(c["module"], c["tensor"]) for c in r["checks"] if c["verdict"] == "fail"}
assert failed == {("/defect.scaled_dw", "d_weight")}, failed
for c in r["checks"]:
    assert "bias_z" in c["metrics"], c
    if c["verdict"] == "fail":
        assert c["why"].startswith("bias_z "), c["why"]
        assert c["metrics"]["bias_z"] > 5 and 1.5e-3 < c["metrics"]["bias"]["e_par"] < 2.5e-3, c["metrics"]
        assert "k = 1.00" in c["diagnosis"]["summary"], c["diagnosis"]
print("only /defect.scaled_dw d_weight fails, on bias_z; its diagnosis is the factor")
P
done
# declared 0: the test is off and the same dump passes
sed 's/"d_weight": {/"d_weight": {"bias_z": 0, /' "$T/c48.json" >"$T/off.json"
expect_exit 0 "bias_z 0 turns the bias test off" "$QATCHECK" vjp --case "$T/off.json"
finish
