#!/bin/sh
# demo.sh: what `make demo` runs after installing and building: a real
# layer-1 audit on generated inputs, a dump with planted defects that the
# audit must catch, layer 2 on the committed checkpoint, and the audit
# document of the three (reports/audit.html, reports/audit.md). Exits 0 when
# each behaves as it should.
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
echo "== 2. a dump with six planted defects (scripts/make_linear_dump.py)"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
/usr/bin/python3 scripts/make_linear_dump.py "$T/defects.h5" --defects all || exit 2
sed 's|"data/linear_small.h5", "modules": "^/model\\\\."|"'"$T"'/defects.h5"|' cases/linear_dump.json >"$T/case.json"
$Q vjp --case "$T/case.json" --json reports/demo_defects.json --junit reports/demo_defects.xml >"$T/out"
rc=$?
awk 'NR == 1 || /FAIL/ || /^vjp:/' "$T/out"
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
echo "== 4. the audit: qatcheck report (layer 1 and layer 2 together)"
$Q report reports/demo.json reports/demo_defects.json reports/demo_contract.json \
  --html reports/audit.html --markdown reports/audit.md --json reports/audit.json
rc=$?
echo "   exit $rc (1: the planted defects of step 2 are in it, as they should be)"
[ "$rc" -eq 1 ] && [ -s reports/audit.html ] && [ -s reports/audit.md ] || { echo "demo: the audit should be written and fail"; exit 1; }
echo
echo "demo: ok; open reports/audit.html"
