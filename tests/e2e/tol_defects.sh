#!/bin/sh
# tol_defects.sh: tolerances derived by `qatcheck tol` (not typed) pass the
# correct dumped linear and catch every defect make_linear_dump.py plants,
# each on its own tensor, including the d_weight scaled by only 1.002 (its
# rel-L2 is inside the bf16 rounding budget; the noise multiple catches it).
. "$(dirname "$0")/lib.inc"
$PY scripts/make_linear_dump.py "$T/d.h5" --defects all || exit 1
# the dump's linear: M=48 tokens, N=64 out-features
tols=$(for tk in d_x:64 d_weight:48 d_bias:48; do
  "$QATCHECK" tol --out-dtype bfloat16 --acc-dtype float32 --k "${tk#*:}" --tensor "${tk%%:*}" | sed '1d;$d'
  [ "$tk" = d_bias:48 ] || printf ','
done)
printf '{"module": "linear", "data": {"dump": "d.h5"}, "candidate": "dump", "tolerances": {%s}}\n' "$tols" >"$T/case.json"
expect_exit 1 "derived tolerances fail the planted defects" "$QATCHECK" vjp --case "$T/case.json" --json "$T/r.json"
$PY - "$T/r.json" <<'P' || bad "derived tolerances do not name each defect's tensor (or fail the correct module)"
import json, sys
r = json.load(open(sys.argv[1]))
fails = {}
for c in r["checks"]:
    if c["verdict"] == "fail":
        fails.setdefault(c["module"], set()).add(c["tensor"])
want = {"/defect.wrong_weight": {"d_x"}, "/defect.transposed_dw": {"d_weight"}, "/defect.shifted_rows": {"d_x"},
        "/defect.scaled_dw": {"d_weight"}, "/defect.nan": {"d_x"}, "/defect.missing_bias": {"d_bias"}}
assert fails == want, fails
sd = [c for c in r["checks"] if c["module"] == "/defect.scaled_dw" and c["tensor"] == "d_weight"]
assert all(c["why"].startswith("noise_multiple") for c in sd), [c["why"] for c in sd]
print("derived tolerances: correct module passes; each defect fails on its tensor")
P
finish
