#!/bin/sh
# reference_auto.sh: `vjp --reference auto|float64|fast|fast:S` on the CPU
# (docs/gpu.md, "The fast reference"): auto is the default and accepted by
# name, and every check of every report names the GEMM its reference came
# from: on the CPU (no tensor cores) float64, under each of them; the
# JSON's per-check "reference_gemm", the text table's and the Markdown's
# "reference" column, the JUnit output's reference=; the audit document
# (qatcheck report) counts each gradient's reference GEMMs in its metrics
# table (a GPU run's JSON, edited here, shows the fast ones). A bad kind
# exits 2 naming the kinds. (The GPU side: tests/gpu/test_gpu_ozaki.c.)
. "$(dirname "$0")/lib.inc"
cat >"$T/c.json" <<EOF2
{"name": "refauto", "module": "linear",
 "contract": {"weight_format": "fp8_block128", "dx_weight": "dequant"},
 "data": {"generate": {"shapes": [[16, 256, 128, 1], [64, 128, 256, 0]], "seed": 5}},
 "candidate": "builtin", "dy": ["random"],
 $LIN_TOL}
EOF2
for ref in default auto float64 fast fast:3; do
  opt=; [ $ref = default ] || opt="--reference $ref"
  # shellcheck disable=SC2086
  expect_exit 0 "--reference $ref" "$QATCHECK" vjp --case "$T/c.json" $opt --json "$T/r.json" --markdown "$T/r.md" --junit "$T/r.xml"
  "$PY" - "$T/r.json" <<'P' && ok "$ref: every check's JSON says reference_gemm float64" || bad "$ref: the JSON's reference_gemm"
import json, sys
checks = json.load(open(sys.argv[1]))["checks"]
assert len(checks) >= 5, len(checks)
for c in checks:
    assert c.get("reference_gemm") == {"method": "float64"}, (c["module"], c["tensor"], c.get("reference_gemm"))
P
  n=$(grep -cE '^linear.* (d_x|d_weight|d_bias) .* float64 +[a-z_+]+ +pass' "$T/out")
  [ "$n" -ge 5 ] && ok "$ref: the text table's reference column says float64 ($n rows)" || bad "$ref: text table: $(head -3 "$T/out")"
  grep -q '| reference | variant |' "$T/r.md" && [ "$(grep -cE '\| float64 \| [a-z_+]+ \| pass \|' "$T/r.md")" -ge 5 ] \
    && ok "$ref: the Markdown's reference column" || bad "$ref: Markdown: $(grep -m2 '^| ' "$T/r.md")"
  grep -q 'reference=float64' "$T/r.xml" && ! grep -q 'reference=ozaki' "$T/r.xml" && ok "$ref: JUnit reference=float64" \
    || bad "$ref: JUnit"
done
# the audit document (qatcheck report): each gradient's reference GEMMs, counted, in its metrics table;
# a report written on a GPU (edited here: one d_x check's fast reference kept, one d_weight's fallen back)
expect_exit 0 "report of the CPU run" "$QATCHECK" report "$T/r.json" --markdown "$T/a.md" --html "$T/a.html" --allow-incomplete
grep -q '| reference GEMM |' "$T/a.md" && grep -Eq '^\| `d_x` \|.*\| float64 \([0-9]+\) \|$' "$T/a.md" \
  && grep -q '<th[^>]*>reference GEMM</th>' "$T/a.html" && ok "the audit's metrics table: reference GEMM float64 (N)" \
  || bad "audit document: $(grep -m2 'reference GEMM\|^| `d_x`' "$T/a.md")"
"$PY" - "$T/r.json" "$T/g.json" <<'P'
import json, sys
r = json.load(open(sys.argv[1]))
dx = [c for c in r["checks"] if c["tensor"] == "d_x"]
dw = [c for c in r["checks"] if c["tensor"] == "d_weight"]
dx[0]["reference_gemm"] = {"method": "ozaki_int8", "slices": 4, "self_check": {"max_error": 1e-10, "normwise_error": 2e-10, "gate": 1e-6}}
dw[0]["reference_gemm"] = {"method": "float64_fallback", "slices": 3, "self_check": {"max_error": 1e-3, "normwise_error": 2e-4, "gate": 1e-6}}
json.dump(r, open(sys.argv[2], "w"))
P
expect_exit 0 "report of a GPU run's JSON" "$QATCHECK" report "$T/g.json" --markdown "$T/g.md" --allow-incomplete
grep -Eq '^\| `d_x` \|.*\| ozaki\\?_int8:4 \(1\); float64 \([0-9]+\) \|$' "$T/g.md" \
  && grep -Eq '^\| `d_weight` \|.*\| float64 \(ozaki\\?_int8:3 fell back\) \(1\); float64 \([0-9]+\) \|$' "$T/g.md" \
  && ok "the fast reference kept and fallen back, counted per gradient" || bad "GPU run: $(grep -m2 '^| `d_' "$T/g.md")"
expect_exit 2 "--reference int8" "$QATCHECK" vjp --case "$T/c.json" --reference int8
[ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "expected auto, float64, fast or fast:S" "$T/err" && ok "one line naming the kinds" \
  || bad "--reference int8: $(cat "$T/err")"
"$QATCHECK" vjp --help >"$T/help" 2>&1
grep -q "auto (default)" "$T/help" && ok "--help: auto is the default" || bad "--help does not name auto as the default"
finish
