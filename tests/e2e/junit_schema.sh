#!/bin/sh
# junit_schema.sh: the JUnit XML of every verb (passing, failing, the error
# report of a run that exits 2, the baseline suite, the audit's) is valid
# in the common JUnit schema and names each testcase once: checked by
# tests/e2e/junit_check.py (a structural check of the schema plus counts,
# times and unique classname/name pairs) and, where xmllint is installed,
# against tests/e2e/junit.xsd. The checker itself must reject a duplicated
# testcase, a wrong count and a missing time.
. "$(dirname "$0")/lib.inc"
D="$(dirname "$0")"
$PY scripts/make_linear_dump.py "$T/d.h5" --defects all >/dev/null || { bad "make_linear_dump.py"; finish; }
printf '{"module": "linear", "data": {"dump": "d.h5"}, "candidate": "dump", %s}\n' "$LIN_TOL" >"$T/defects.json"
# generated instances: the same shape twice makes two instances of one name (the JUnit must still be unique)
cat >"$T/twice.json" <<J
{"module": "rmsnorm", "data": {"generate": {"shapes": [[16, 64], [16, 64]], "seed": 1}},
 "tolerances": {"d_x": {"rel_l2": 4e-3, "reasoning": "r"}, "d_weight": {"rel_l2": 4e-3, "reasoning": "r"}}}
J
have_quant=0
$PY -c "import ml_dtypes" 2>/dev/null && have_quant=1
[ $have_quant = 1 ] && { $PY scripts/make_quant_dump.py "$T/q.h5" fp8_block128 --plant payload >/dev/null || bad "make_quant_dump.py"; }
run() { # NAME ARGS...: the verb's JUnit into $T/x/NAME.xml (any verdict)
  n=$1; shift
  "$QATCHECK" "$@" --junit "$T/x/$n.xml" --json "$T/x/$n.json" --quiet >/dev/null 2>&1
  [ -s "$T/x/$n.xml" ] || bad "$n: no JUnit written"
}
mkdir "$T/x"
run vjp_pass vjp --case cases/linear_dump.json
run vjp_fail vjp --case "$T/defects.json"
run vjp_twice vjp --case "$T/twice.json"
run contract contract --master-vs-dequant --dump cases/data/contract_ckpt.h5 --weight-format nvfp4,fp8_block128 --cosine-min 0.999
run tol tol --out-dtype bfloat16 --k 64 --scale 4
run fd fd --module rmsnorm --values special
[ $have_quant = 1 ] && run quant quant --dump "$T/q.h5" --module /lin
[ $have_quant = 1 ] && run quant_identify quant --dump "$T/q.h5" --module /lin --identify
run error vjp --case "$T/none.json"
run baseline vjp --case "$T/defects.json" --baseline "$T/x/vjp_fail.json" --fail-on regression
run report report "$T/x/vjp_pass.json" "$T/x/vjp_fail.json" "$T/x/contract.json" "$T/x/error.json" tests/data/reports/sft.json
# what the names must be
$PY - "$T/x" <<'P' || bad "JUnit names"
import sys, xml.etree.ElementTree as ET
d = sys.argv[1]
v = ET.parse(d + "/vjp_fail.xml").getroot()
names = {(c.get("classname"), c.get("name")) for c in v.iter("testcase")}
assert ("/defect.scaled_dw", "dy/d_weight") in names, sorted(names)[:5]
assert all(c.get("classname") not in ("linear", "") for c in v.iter("testcase")), "the classname is the module path"
t = ET.parse(d + "/vjp_twice.xml").getroot()
tn = [c.get("name") for c in t.iter("testcase") if c.get("classname") == "rmsnorm[16x64]"]
assert "random/d_x" in tn and "random/d_x [2]" in tn, tn
e = ET.parse(d + "/error.xml").getroot()
assert e.get("errors") == "1" and e.find(".//error") is not None, e.attrib
b = ET.parse(d + "/baseline.xml").getroot()
assert any(s.get("name") == "baseline" for s in b.iter("testsuite")), "the baseline suite under --fail-on regression"
print("names: module path + dY/tensor, repeats numbered, the error testcase, the baseline suite")
P
for f in "$T"/x/*.xml; do
  $PY "$D/junit_check.py" "$f" >"$T/out" 2>&1 && ok "$(cat "$T/out" | sed 's|.*/x/||')" || bad "$(cat "$T/out")"
done
if command -v xmllint >/dev/null 2>&1; then
  for f in "$T"/x/*.xml; do
    xmllint --noout --schema "$D/junit.xsd" "$f" 2>"$T/err" && ok "xmllint: $(basename "$f") validates against junit.xsd" \
      || bad "xmllint: $(basename "$f"): $(head -3 "$T/err")"
  done
else
  echo "xmllint not installed: the XSD check is skipped (the structural check ran)"
fi
# the checker fails on what it must reject
sed 's|name="dy/d_bias"|name="dy/d_x"|' "$T/x/vjp_pass.xml" >"$T/dup.xml"
$PY "$D/junit_check.py" "$T/dup.xml" >"$T/out" 2>&1 && bad "a duplicated testcase passed the check" || ok "the check rejects a duplicated testcase"
sed '0,/tests="6"/s//tests="7"/' "$T/x/vjp_pass.xml" >"$T/count.xml"
$PY "$D/junit_check.py" "$T/count.xml" >"$T/out" 2>&1 && bad "a wrong count passed the check" || ok "the check rejects a wrong count"
sed 's| time="[0-9.]*">|>|' "$T/x/vjp_pass.xml" >"$T/time.xml"
$PY "$D/junit_check.py" "$T/time.xml" >"$T/out" 2>&1 && bad "a testcase without time passed the check" || ok "the check rejects a testcase without a time"
finish
