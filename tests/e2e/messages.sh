#!/bin/sh
# messages.sh: a first contact's traps (issue 13): each bad input exits 2
# with one line that names the thing and the fix. An unknown class lists the
# classes; a modules regex that matches nothing lists the groups there are;
# NaN in inputs/x names inputs/x; a tolerance for a gradient no class has is
# named; a reasoning over the limit names the limit; a tolerance set that
# cannot see a scale error or a sign flip is refused, and with
# --allow-weak-tolerances recorded as a warning in every report.
. "$(dirname "$0")/lib.inc"
cp cases/data/linear_small.h5 "$T/d.h5"
M=/model.layers.0.mlp.down_proj
# says DESC NEEDLE...: one error line holding every NEEDLE (message or hint)
says() {
  desc=$1; shift
  [ "$(grep -c '^qatcheck: error:' "$T/err")" -eq 1 ] || bad "$desc: expected one error line: $(cat "$T/err")"
  for n in "$@"; do grep -q -- "$n" "$T/err" || bad "$desc: does not say '$n': $(cat "$T/err")"; done
}
dumpcase() { # dumpcase NAME MODULE-MEMBER MODULES-REGEX TOLERANCES
  printf '{%s "data": {"dump": "d.h5", "modules": "%s"}, "candidate": "dump", "tolerances": %s}\n' "$2" "$3" "$4" >"$T/$1.json"
}
TOLS='{"d_x": {"rel_l2": 4e-3, "reasoning": "r"}, "d_weight": {"rel_l2": 4e-3, "reasoning": "r"}, "d_bias": {"rel_l2": 4e-3, "reasoning": "r"}}'

dumpcase linaer '"module": "linaer",' "" "$TOLS"
expect_exit 2 "module 'linaer'" "$QATCHECK" vjp --case "$T/linaer.json"
says "module 'linaer'" "class 'linaer' is not known" "known classes: linear, rmsnorm"
grep -q "narrow data.modules" "$T/err" && bad "still the misleading hint about data.modules" || ok "no hint about data.modules"

dumpcase nomatch '"module": "linear",' 'self_attn' "$TOLS"
expect_exit 2 "a modules regex that matches nothing" "$QATCHECK" vjp --case "$T/nomatch.json"
says "regex matching nothing" "no module group matches 'self_attn'" "$M (linear)"

$PY - "$T/d.h5" "$T/nan.h5" <<'P'
import sys, shutil, h5py
shutil.copy(sys.argv[1], sys.argv[2])
with h5py.File(sys.argv[2], "a") as f:
    d = f["/model.layers.0.mlp.down_proj/inputs/x"]; a = d[...]; a[2, 5] = 0x7fc0; d[...] = a   # a bf16 NaN
P
printf '{"module": "linear", "data": {"dump": "nan.h5"}, "candidate": "dump", "tolerances": %s}\n' "$TOLS" >"$T/nan.json"
expect_exit 2 "NaN in inputs/x" "$QATCHECK" vjp --case "$T/nan.json"
says "NaN in inputs/x" "dataset 'inputs/x'" "NaN" "[2, 5]"
grep -q "the reference 'd_weight'" "$T/err" && bad "still blames the reference" || ok "does not blame the reference"

dumpcase dX '"module": "linear",' "" '{"d_X": {"rel_l2": 4e-3, "reasoning": "r"}, "d_weight": {"rel_l2": 4e-3, "reasoning": "r"}}'
expect_exit 2 "a tolerance for d_X" "$QATCHECK" vjp --case "$T/dX.json"
says "tolerance d_X" "tolerances.d_X" "d_x d_weight d_bias"

long=$(printf 'r%.0s' $(seq 1100))
dumpcase long '"module": "linear",' "" "{\"d_x\": {\"rel_l2\": 4e-3, \"reasoning\": \"$long\"}}"
expect_exit 2 "a 1100-character reasoning" "$QATCHECK" vjp --case "$T/long.json"
says "long reasoning" "'reasoning' has 1100 characters" "at most 1023"

# weak tolerance sets: refused by name; allowed, a warning in every report
WEAK='{"d_x": {"cosine_min": 0.9999, "reasoning": "r"}, "d_weight": {"norm_ratio": [0.99, 1.01], "reasoning": "r"}, "d_bias": {"rel_l2": 4e-3, "reasoning": "r"}}'
dumpcase weak '"module": "linear",' "" "$WEAK"
rm -f "$T/w.json"
expect_exit 2 "cosine_min alone / norm_ratio alone" "$QATCHECK" vjp --case "$T/weak.json" --json "$T/w.json"
says "weak tolerances" "tolerances.d_x cannot see a scale error" "add rel_l2, norm_ratio" "--allow-weak-tolerances"
error_or_none "$T/w.json" && ok "only its error report for a refused case" || bad "a refused case wrote a report other than its error report"
expect_exit 0 "--allow-weak-tolerances runs it" "$QATCHECK" vjp --case "$T/weak.json" --allow-weak-tolerances \
  --json "$T/w.json" --junit "$T/w.xml" --markdown "$T/w.md"
[ "$(grep -c '^qatcheck: warning: .*tolerances.d_' "$T/err")" -eq 2 ] && ok "two warnings on stderr" || bad "warnings: $(cat "$T/err")"
$PY - "$T/w.json" <<'P' && ok "JSON report records the warnings" || bad "JSON report lacks the warnings"
import json, sys
w = json.load(open(sys.argv[1])).get("warnings", [])
sys.exit(0 if len(w) == 2 and "d_x cannot see a scale error" in w[0] and "d_weight cannot see a sign flip" in w[1] else 1)
P
grep -q 'warning: .*d_weight cannot see a sign flip' "$T/w.xml" && ok "JUnit records them" || bad "JUnit lacks the warnings"
grep -q '\*\*warning\*\*: .*d_x cannot see a scale error' "$T/w.md" && ok "Markdown records them" || bad "Markdown lacks the warnings"
finish
