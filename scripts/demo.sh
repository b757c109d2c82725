#!/bin/sh
# demo.sh: what `make demo` runs after installing and building: a real
# layer-1 audit on generated inputs, then a dump with planted defects that
# the audit must catch. Exits 0 when both behave as they should.
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
$Q vjp --case "$T/case.json" --json reports/demo_defects.json >"$T/out"
rc=$?
awk 'NR == 1 || /FAIL/ || /^vjp:/ || (/^\/defect/ && / dy [a-z_]*: /)' "$T/out"
echo "   exit $rc (1 = a defect found)"
[ "$rc" -eq 1 ] || { echo "demo: the planted defects should fail"; exit 1; }
echo
echo "demo: ok"
