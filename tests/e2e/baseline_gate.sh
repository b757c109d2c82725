#!/bin/sh
# baseline_gate.sh: the regression gate (--baseline, --fail-on regression;
# the rule in docs/ci.md). An unchanged rerun matches every check and
# passes. A planted regression is flagged on its check: d_weight scaled by
# 1.002 inside the backward still passes its rel_l2 bound (2.6e-3 < 4e-3),
# (its bias test, which would fail it, is turned off with bias_z 0), but
# its noise multiple rises from 1.0 to about 1.5: listed, exit 0 without
# --fail-on, exit 1 with it, in the JSON, the Markdown and the JUnit. A
# vanished check, a new failure, a layer-2 row whose rel_l2 rose and a row
# that became an outlier are regressions too; `report --baseline` gates the
# same way. A baseline of another verb, an error report as a baseline, a
# verb without checks, a bad --fail-on or factor exit 2 with one line.
. "$(dirname "$0")/lib.inc"
$PY scripts/make_linear_dump.py "$T/good.h5" --defects none >/dev/null || { bad "make_linear_dump.py"; finish; }
# the planted regression: the good dump with d_weight of dY 'dy' computed 1.002 too large
$PY - "$T/good.h5" "$T/reg.h5" "$T/nan.h5" <<'P' || bad "plant the regression"
import shutil, sys
sys.path.insert(0, "scripts")
import h5py, numpy as np, bf16
good, reg, nan = sys.argv[1:4]
shutil.copy(good, reg)
shutil.copy(good, nan)
with h5py.File(reg, "a") as f:
    g = f["model.layers.0.mlp.down_proj"]
    x, dy = bf16.from_bits(g["inputs/x"][()]), bf16.from_bits(g["grad_out/dy"][()])
    del g["grads/dy/d_weight"]
    bf16.write(g["grads/dy"], "d_weight", bf16.round_(np.matmul(dy.T, x, dtype=np.float32) * np.float32(1.002)))
with h5py.File(nan, "a") as f:
    d = f["model.layers.0.mlp.down_proj/grads/dy_sparse/d_x"]
    v = d[()]
    v[0, 0] = 0x7FC0
    d[...] = v
P
TOL='"tolerances": {
  "d_x": {"rel_l2": 4e-3, "norm_ratio": [0.995, 1.005], "reasoning": "bf16 output rounding"},
  "d_weight": {"rel_l2": 4e-3, "norm_ratio": [0.995, 1.005], "bias_z": 0, "reasoning": "bf16 output rounding; no bias test (the gate is shown on a regression inside the bounds)"},
  "d_bias": {"rel_l2": 4e-3, "norm_ratio": [0.995, 1.005], "reasoning": "bf16 output rounding"}}'
for n in good reg nan; do
  printf '{"name": "gate", "module": "linear", "data": {"dump": "%s.h5"}, "candidate": "dump", %s}\n' $n "$TOL" >"$T/$n.json"
done
printf '{"name": "gate", "module": "linear", "data": {"dump": "good.h5"}, "candidate": "dump", "dy": ["dy"], %s}\n' "$TOL" >"$T/fewer.json"

expect_exit 0 "the baseline run" "$QATCHECK" vjp --case "$T/good.json" --json "$T/base.json" --quiet
expect_exit 0 "an unchanged rerun passes the gate" "$QATCHECK" vjp --case "$T/good.json" --baseline "$T/base.json" \
  --fail-on regression --json "$T/same.json" --junit "$T/same.xml" --quiet
$PY - "$T/same.json" <<'P' && ok "unchanged: 6 matched, no regression" || bad "the unchanged rerun's comparison"
import json, sys
b = json.load(open(sys.argv[1]))["baseline"]
assert b["matched"] == 6 and b["new"] == 0 and b["vanished"] == 0 and b["regressions"] == [], b
P
expect_exit 0 "the planted regression passes its tolerances (no --fail-on)" "$QATCHECK" vjp --case "$T/reg.json" \
  --baseline "$T/base.json" --json "$T/reg.out.json" --markdown "$T/reg.md"
grep -q "REGRESSION module=/model.layers.0.mlp.down_proj dy=dy tensor=d_weight: noise_multiple 1" "$T/out" \
  && ok "the console names the regressed check" || bad "console: $(grep -i regress "$T/out")"
expect_exit 1 "--fail-on regression turns it into exit 1" "$QATCHECK" vjp --case "$T/reg.json" --baseline "$T/base.json" \
  --fail-on regression --json "$T/reg.out.json" --junit "$T/reg.xml" --quiet
$PY - "$T/reg.out.json" "$T/reg.xml" "$T/reg.md" <<'P' && ok "the regression in the JSON, the JUnit and the Markdown" || bad "the regression's reports"
import json, sys, xml.etree.ElementTree as ET
r = json.load(open(sys.argv[1]))
assert r["verdict"] == "pass", "its checks still pass"
rs = r["baseline"]["regressions"]
assert len(rs) == 1 and rs[0]["check"] == "module=/model.layers.0.mlp.down_proj dy=dy tensor=d_weight", rs
assert rs[0]["kind"] == "rise" and "noise_multiple" in rs[0]["what"], rs
now = [c for c in r["checks"] if c["dy"] == "dy" and c["tensor"] == "d_weight"][0]["metrics"]["noise_multiple"]
assert 1.3 < now < 1.8, now
x = ET.parse(sys.argv[2]).getroot()
f = [c for c in x.iter("testcase") if c.find("failure") is not None]
assert len(f) == 1 and f[0].get("classname") == "baseline" and "tensor=d_weight" in f[0].get("name"), [c.attrib for c in f]
assert "## Regressions against the baseline: 1" in open(sys.argv[3]).read()
P
expect_exit 1 "a vanished check is a regression" "$QATCHECK" vjp --case "$T/fewer.json" --baseline "$T/base.json" \
  --fail-on regression --json "$T/few.json" --quiet
grep -q '"vanished":[[:space:]]*3' "$T/few.json" && ok "three vanished checks" || bad "vanished: $(grep -A3 '"baseline"' "$T/few.json")"
expect_exit 1 "a new failure" "$QATCHECK" vjp --case "$T/nan.json" --baseline "$T/base.json" --json "$T/nan.out.json" --quiet
grep -q '"kind":[[:space:]]*"new failure"' "$T/nan.out.json" && ok "listed as a new failure" || bad "new failure not listed"

# layer 2: unchanged passes; a row better in the baseline, and a row that was no outlier, regress
CK=cases/data/contract_ckpt.h5
expect_exit 0 "contract baseline run" "$QATCHECK" contract --master-vs-dequant --dump $CK --weight-format nvfp4 --json "$T/cb.json" --quiet
expect_exit 0 "contract unchanged passes the gate" "$QATCHECK" contract --master-vs-dequant --dump $CK --weight-format nvfp4 \
  --baseline "$T/cb.json" --fail-on regression --quiet
$PY - "$T/cb.json" "$T/cb_old.json" <<'P' || bad "the doctored contract baseline"
import json, sys
r = json.load(open(sys.argv[1]))
rows = r["rows"]
i = next(k for k, x in enumerate(rows) if x["module"] == "/model.layers.1.mlp.up_proj")
rows[i]["metrics"]["rel_l2"] /= 2          # it was twice as good before
j = next(k for k, x in enumerate(rows) if x["outlier"])
rows[j]["outlier"] = False                   # and this one was no outlier
json.dump(r, open(sys.argv[2], "w"))
P
expect_exit 1 "contract: a risen rel_l2 and a new outlier" "$QATCHECK" contract --master-vs-dequant --dump $CK --weight-format nvfp4 \
  --baseline "$T/cb_old.json" --fail-on regression --json "$T/cr.json" --quiet
$PY - "$T/cr.json" <<'P' && ok "contract regressions named by row" || bad "contract regressions"
import json, sys
rs = json.load(open(sys.argv[1]))["baseline"]["regressions"]
kinds = sorted(r["kind"] for r in rs)
assert kinds == ["flag", "rise"], rs
assert any("module=/model.layers.1.mlp.up_proj" in r["check"] and "rel_l2" in r["what"] for r in rs), rs
P

# the audit gates the same way
expect_exit 0 "report: unchanged against its baseline" "$QATCHECK" report "$T/same.json" --baseline "$T/base.json" --fail-on regression --allow-incomplete --quiet
expect_exit 1 "report: the planted regression with --fail-on" "$QATCHECK" report "$T/reg.out.json" "$T/cr.json" \
  --baseline "$T/base.json" --baseline "$T/cb_old.json" --fail-on regression --markdown "$T/audit.md"
grep -q "tensor=d_weight" "$T/audit.md" && grep -q "## Regressions against the baselines" "$T/audit.md" \
  && ok "the audit lists the regressions" || bad "the audit's regressions"

# refused in one line
one() { desc=$1; shift; expect_exit 2 "$desc" "$@"; [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] || bad "$desc: $(cat "$T/err")"; }
one "a contract report as a vjp baseline" "$QATCHECK" vjp --case "$T/good.json" --baseline "$T/cb.json"
"$QATCHECK" vjp --case "$T/none.json" --json "$T/err.json" >/dev/null 2>&1
one "an error report as a baseline" "$QATCHECK" vjp --case "$T/good.json" --baseline "$T/err.json"
one "tol has no checks to compare" "$QATCHECK" tol --out-dtype bfloat16 --k 64 --baseline "$T/base.json"
one "--fail-on something else" "$QATCHECK" vjp --case "$T/good.json" --baseline "$T/base.json" --fail-on failure
one "--regression-factor below 1" "$QATCHECK" vjp --case "$T/good.json" --baseline "$T/base.json" --regression-factor 0.5
one "a baseline without its input in report" "$QATCHECK" report "$T/same.json" --baseline "$T/cb.json"
finish
