#!/bin/sh
# qatdump_torch.sh: from a torch model to an audited dump. A small CPU model
# whose linear backward is a custom autograd.Function is dumped with
# scripts/qatdump.py; the case's tolerances come from `qatcheck tol`; vjp on
# the dump passes (exit 0); a planted defect in the Function's backward (a
# missing scale, a transposed product on the square weight) fails (exit 1)
# naming d_x. Skips (77) without torch.
. "$(dirname "$0")/lib.inc"
. "$(dirname "$0")/qatdump.inc"
tmp=$T
tol_case "$tmp/dump.h5" proj >"$tmp/case.json" || { echo "FAIL: qatcheck tol"; exit 1; }

fail=0
for defect in ok missing_scale transposed; do
  rm -f "$tmp/dump.h5"
  "$PY" "$HERE/qatdump_torch.py" "$tmp/dump.h5" "$defect" || { echo "FAIL: dumping ($defect)"; fail=1; continue; }
  "$QATCHECK" vjp --case "$tmp/case.json" --json "$tmp/report.json" >"$tmp/out.txt" 2>&1
  rc=$?
  want=0; [ "$defect" = ok ] || want=1
  if [ $rc -ne $want ]; then
    echo "FAIL: $defect: vjp exit $rc, expected $want"; cat "$tmp/out.txt"; fail=1; continue
  fi
  # the report names the failing tensor, and only it, and says what the bug is
  "$PY" - "$tmp/report.json" "$defect" <<'PYEOF' || { cat "$tmp/out.txt"; fail=1; }
import json, sys
r = json.load(open(sys.argv[1]))
failed = sorted(c["tensor"] for c in r["checks"] if c["verdict"] != "pass")
want = [] if sys.argv[2] == "ok" else ["d_x"]
checked = sorted(c["tensor"] for c in r["checks"])
# the torch forward's outputs/y is judged too (kind forward), and passes
if failed != want or checked != ["d_bias", "d_weight", "d_x", "y"] or \
        [c.get("kind") for c in r["checks"] if c["tensor"] == "y"] != ["forward"]:
    print("FAIL: %s: failed %s (expected %s), checked %s" % (sys.argv[2], failed, want, checked))
    sys.exit(1)
# the failure's diagnosis names the planted cause; nothing is diagnosed in a passing run
cause = {"ok": None, "missing_scale": "factor", "transposed": "weight_transposed"}[sys.argv[2]]
for c in r["checks"]:
    d = c.get("diagnosis")
    first = [h["name"] for h in d["hypotheses"] if h["consistent"]][:1] if d else []
    if (c["verdict"] == "pass") != (d is None) or (c["verdict"] != "pass" and first != [cause]):
        print("FAIL: %s: %s diagnosis %s (expected %s)" % (sys.argv[2], c["tensor"], d, cause))
        sys.exit(1)
for c in r["checks"]:
    m = c["metrics"]
    print("%s %s rel_l2=%.3g noise_multiple=%s %s" % (sys.argv[2], c["tensor"], m["rel_l2"], m.get("noise_multiple"), c["verdict"]))
PYEOF
  if [ "$defect" != ok ] && ! grep -q "d_x" "$tmp/out.txt"; then
    echo "FAIL: $defect: vjp's output does not name d_x"; cat "$tmp/out.txt"; fail=1
  fi
done
[ $fail -eq 0 ] && echo "PASS: the dump passes and both planted defects fail on d_x"
exit $fail
