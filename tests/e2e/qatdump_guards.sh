#!/bin/sh
# qatdump_guards.sh: qatdump.py refuses dumps that would mislead (a module
# called twice, a tied weight, an FSDP-managed non-DTensor parameter, no
# backward), keeps the forward's master and dY dtype, marks frozen
# parameters; vjp then checks d_x and d_bias of a frozen-weight linear and
# does not expect d_weight. Skips (77) without torch.
. "$(dirname "$0")/lib.inc"
. "$(dirname "$0")/qatdump.inc"
tmp=$T
"$PY" "$HERE/qatdump_guards.py" "$tmp" || exit 1

"$PY" "$HERE/qatdump_torch.py" "$tmp/dump.h5" frozen || { echo "FAIL: dumping the frozen model"; exit 1; }
tol_case "$tmp/dump.h5" proj >"$tmp/case.json" || { echo "FAIL: qatcheck tol"; exit 1; }
"$QATCHECK" vjp --case "$tmp/case.json" --json "$tmp/r.json" >"$tmp/out.txt" 2>&1
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: vjp on the frozen-weight dump exit $rc"; cat "$tmp/out.txt"; exit 1; }
"$PY" -c "
import json, sys
r = json.load(open(sys.argv[1]))
t = sorted(c['tensor'] for c in r['checks'] if c.get('kind') != 'forward')  # y: the forward check
sys.exit(0 if t == ['d_bias', 'd_x'] else 'FAIL: frozen: checked %s, expected d_bias and d_x' % t)" "$tmp/r.json" || exit 1
echo "PASS: guards refuse, frozen weight not expected"
