#!/bin/sh
# Planted defects in a dumped linear backward must fail, each on its own
# tensor, while the correct module beside them passes.
. "$(dirname "$0")/lib.inc"
$PY scripts/make_linear_dump.py "$T/d.h5" --defects all || exit 1
cat >"$T/case.json" <<J
{"module": "linear", "data": {"dump": "d.h5"}, "candidate": "dump", $LIN_TOL}
J
expect_exit 1 "dump with planted defects fails" "$QATCHECK" vjp --case "$T/case.json" --json "$T/r.json" --junit "$T/r.xml"
$PY - "$T/r.json" <<'P' || bad "report does not name each defect's tensor"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verdict"] == "fail", r["verdict"]
fails = {}
for c in r["checks"]:
    if c["verdict"] == "fail":
        fails.setdefault(c["module"], set()).add((c["dy"], c["tensor"], c["why"].split(" ")[0]))
want = {
  "/defect.wrong_weight": {"d_x"},
  "/defect.transposed_dw": {"d_weight"},
  "/defect.shifted_rows": {"d_x"},
  "/defect.scaled_dw": {"d_weight"},
  "/defect.nan": {"d_x"},
  "/defect.missing_bias": {"d_bias"},
}
assert "/model.layers.0.mlp.down_proj" not in fails, fails
for mod, tensors in want.items():
    got = {t for (_, t, _) in fails.get(mod, set())}
    assert got == tensors, (mod, got, tensors)
# shifted rows are caught under the sparse dY too, NaN says non-finite, missing says missing
assert ("dy_sparse", "d_x") in {(d, t) for (d, t, _) in fails["/defect.shifted_rows"]}
assert any(w == "missing" for (_, _, w) in fails["/defect.missing_bias"])
assert any("non-finite" in c["why"] for c in r["checks"] if c["module"] == "/defect.nan" and c["verdict"] == "fail")
print("report names every defect on its tensor")
P
grep -q '<failure' "$T/r.xml" && ok "junit lists failures" || bad "junit has no failure"
# the correct module alone passes
cat >"$T/good.json" <<J
{"module": "linear", "data": {"dump": "d.h5", "modules": "^/model"}, "candidate": "dump", $LIN_TOL}
J
expect_exit 0 "correct dumped module passes" "$QATCHECK" vjp --case "$T/good.json" --json "$T/g.json"
$PY -c "import json,sys; r=json.load(open('$T/g.json')); assert r['verdict']=='pass' and len(r['checks'])==6 and r['qatcheck_report']==1" \
  && ok "pass report has 6 checks" || bad "pass report"
# the committed case passes too
expect_exit 0 "cases/linear_dump.json passes" "$QATCHECK" vjp --case cases/linear_dump.json
finish
