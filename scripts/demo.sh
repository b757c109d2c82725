#!/bin/sh
# demo.sh: what `make demo` runs after installing and building: a real
# layer-1 audit on generated inputs, a dump with planted defects that the
# audit must catch, layer 2 on the committed checkpoint, layer 3 on a real
# proxy SFT (healthy, and with a planted late bug), and the audit document
# of them all (reports/audit.html, reports/audit.md). Exits 0 when each
# behaves as it should.
set -u
cd "$(dirname "$0")/.." || exit 2
Q=./qatcheck
mkdir -p reports
CASE=${QC_DEMO_CASE:-cases/linear_bf16.json}
[ -f cases/linear_nvfp4.json ] && CASE=${QC_DEMO_CASE:-cases/linear_nvfp4.json}
echo "== 1. qatcheck vjp --case $CASE   (builtin production VJP vs float64 reference)"
$Q vjp --case "$CASE" --json reports/demo.json --junit reports/demo.xml --markdown reports/demo.md
rc=$?
echo "   exit $rc; reports in reports/demo.{json,xml,md}"
[ $rc -eq 0 ] || { echo "demo: the builtin candidate should pass"; exit 1; }

echo
echo "== 2. a dump with six planted defects (scripts/make_linear_dump.py), each failure diagnosed"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
/usr/bin/python3 scripts/make_linear_dump.py "$T/defects.h5" --defects all --m 96 || exit 2
sed 's|"data/linear_small.h5", "modules": "^/model\\\\."|"'"$T"'/defects.h5"|' cases/linear_dump.json >"$T/case.json"
$Q vjp --case "$T/case.json" --json reports/demo_defects.json --junit reports/demo_defects.xml >"$T/out"
rc=$?
awk 'NR == 1 || /FAIL/ || /^vjp:/ || (/^\/defect/ && / dy [a-z_]*: /)' "$T/out"
echo "   exit $rc (1 = a defect found)"
[ "$rc" -eq 1 ] || { echo "demo: the planted defects should fail"; exit 1; }

echo
echo "== 3. layer 2: qatcheck contract --master-vs-dequant on cases/data/contract_ckpt.h5"
$Q contract --master-vs-dequant --dump cases/data/contract_ckpt.h5 --weight-format nvfp4,fp8_block128 \
  --json reports/demo_contract.json --junit reports/demo_contract.xml --markdown reports/demo_contract.md >"$T/out"
rc=$?
grep -E '^(tensor|d_x) ' "$T/out" | head -8
grep -E '^(outliers|verdict)' "$T/out"
echo "   exit $rc"
[ "$rc" -eq 0 ] || { echo "demo: the contract sweep should run"; exit 1; }

echo
echo "== 4. layer 3: a proxy SFT in three arms (scripts/proxy_sft.py), then qatcheck sft and step"
L3="$T/proxy"
/usr/bin/python3 scripts/proxy_sft.py --out "$L3" --formats jsonl,csv,tb --step-dump "$L3/step.h5" || exit 2
cp cases/proxy/sft.json cases/proxy/step.json "$L3/"
mkdir -p reports/sft
$Q sft --case "$L3/sft.json" --json reports/sft.json --markdown reports/sft/sft.md
rc=$?
echo "   exit $rc; reports in reports/sft.json, reports/sft/sft.md (with its plots)"
[ $rc -eq 0 ] || { echo "demo: the healthy proxy SFT should pass"; exit 1; }
$Q step --case "$L3/step.json" --json reports/step.json >"$T/out"
rc=$?
grep -v ' pass *$' "$T/out"
echo "   exit $rc"
[ $rc -eq 0 ] || { echo "demo: the healthy one-step update should pass"; exit 1; }
echo "-- the same, with the quantized weights' refresh stopping after 20 steps (under_test only)"
/usr/bin/python3 scripts/proxy_sft.py --out "$T/stale" --arms under_test --plant refresh-stops=20 --formats jsonl >/dev/null || exit 2
ln -s "$L3/gradient_reference" "$L3/native_baseline" "$T/stale/" && cp cases/proxy/sft.json "$T/stale/"
$Q sft --case "$T/stale/sft.json" >"$T/out"
rc=$?
grep -E '^pair|->' "$T/out"
echo "   exit $rc (1 = a pair deviates)"
[ $rc -eq 1 ] || { echo "demo: the stale quantized weights should deviate"; exit 1; }


echo
echo "== 5. the audit: qatcheck report (layers 1, 2 and 3 together)"
$Q report reports/demo.json reports/demo_defects.json reports/demo_contract.json reports/sft.json reports/step.json \
  --html reports/audit.html --markdown reports/audit.md --json reports/audit.json
rc=$?
echo "   exit $rc (1: the planted defects of step 2 are in it, as they should be)"
[ "$rc" -eq 1 ] && [ -s reports/audit.html ] && [ -s reports/audit.md ] || { echo "demo: the audit should be written and fail"; exit 1; }
# whole: every layer the method requires is in it (docs/audit.md, "A whole audit")
grep -q '"complete":[[:space:]]*true' reports/audit.json && grep -q '^\*\*Completeness: \*\*complete' reports/audit.md \
  || { echo "demo: the audit should be complete (layers 1, 2 and 3): $(grep -A3 Completeness reports/audit.md)"; exit 1; }
echo "   complete: layer 1 with the one-step update, layer 2 and layer 3's three arms are all in it"
echo
echo "demo: ok; open reports/audit.html"
