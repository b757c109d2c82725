#!/bin/sh
# tol_class.sh: tolerances per class in a mixed-class case (a member named
# after a class holds its own tensors' tolerances and wins over the plain
# tensor member for that class's modules); an unknown class or a gradient
# the class does not have is refused at case load (exit 2, naming it); and
# --profile applies to the classes that take one, leaving a norm beside a
# linear alone (said under --verbose).
. "$(dirname "$0")/lib.inc"
$PY scripts/make_class_dump.py "$T/c.h5" >/dev/null || exit 1
$PY - "$T/c.h5" <<'P' || exit 1
import sys, h5py
with h5py.File("cases/data/linear_small.h5", "r") as s, h5py.File(sys.argv[1], "a") as d:
    s.copy("/model.layers.0.mlp.down_proj", d, "/model.layers.0.mlp.down_proj")
P
R='"modules": "^/model\\\\.layers\\\\.0\\\\.(input_layernorm|mlp\\\\.act)$"'
mkcase() { echo "{\"data\": {\"dump\": \"c.h5\", $R}, \"candidate\": \"dump\", \"tolerances\": $1}" >"$T/$2.json"; }
SW='"d_gate": {"rel_l2": 1e-6, "reasoning": "elementwise fp32"}, "d_up": {"rel_l2": 1e-6, "reasoning": "elementwise fp32"}'
# rmsnorm's own d_x (loose enough) wins over a default d_x no float32 norm meets
mkcase "{\"rmsnorm\": {\"d_x\": {\"rel_l2\": 2e-5, \"reasoning\": \"fp32 statistics\"}, \"d_weight\": {\"rel_l2\": 2e-5, \"reasoning\": \"fp32 sums\"}}, \"d_x\": {\"rel_l2\": 1e-12, \"reasoning\": \"too tight\"}, $SW}" own
expect_exit 0 "the class's own d_x judges rmsnorm" "$QATCHECK" vjp --case "$T/own.json" --json "$T/own.r.json"
$PY - "$T/own.r.json" <<'P' || bad "the rmsnorm check does not carry its class's tolerance"
import json, sys
c = [c for c in json.load(open(sys.argv[1]))["checks"] if c["tensor"] == "d_x"]
assert c and all(x["tolerance"]["rel_l2"] == 2e-5 for x in c), [x["tolerance"] for x in c]
P
# and the reverse: a tight class member fails rmsnorm's d_x, the default being loose
mkcase "{\"rmsnorm\": {\"d_x\": {\"max_abs\": 1e-12, \"reasoning\": \"too tight\"}}, \"d_x\": {\"rel_l2\": 2e-5, \"reasoning\": \"fp32\"}, \"d_weight\": {\"rel_l2\": 2e-5, \"reasoning\": \"fp32 sums\"}, $SW}" tight
expect_exit 1 "a tight class member fails the class's d_x" "$QATCHECK" vjp --case "$T/tight.json" --json "$T/tight.r.json"
$PY -c "
import json, sys
f = {(c['module'], c['tensor']) for c in json.load(open(sys.argv[1]))['checks'] if c['verdict'] == 'fail'}
assert f == {('/model.layers.0.input_layernorm', 'd_x')}, f
" "$T/tight.r.json" || bad "tight: not exactly rmsnorm's d_x failed"

one_line() { [ "$(grep -c '^qatcheck: error:' "$T/err")" -eq 1 ] || bad "$1: not one error line"; grep -q "$2" "$T/err" || bad "$1: $(cat "$T/err")"; }
mkcase "{\"rmsnrom\": {\"d_x\": {\"rel_l2\": 2e-5, \"reasoning\": \"x\"}}, $SW}" typo
expect_exit 2 "an unknown class is refused" "$QATCHECK" vjp --case "$T/typo.json" --json "$T/x.json"
one_line "unknown class" "tolerances.rmsnrom: 'rmsnrom' is not a class"
mkcase "{\"rmsnorm\": {\"d_q\": {\"rel_l2\": 2e-5, \"reasoning\": \"x\"}}, $SW}" nograd
expect_exit 2 "a gradient the class lacks is refused" "$QATCHECK" vjp --case "$T/nograd.json" --json "$T/x.json"
one_line "no such gradient" "tolerances.rmsnorm: class 'rmsnorm' has no gradient 'd_q'"
error_or_none "$T/x.json" || bad "a refused case wrote a report other than its error report"

# --profile on a linear with an rmsnorm beside it: applied to the linear only
cat >"$T/mix.json" <<J
{"data": {"dump": "c.h5", "modules": "^/model\\\\.layers\\\\.0\\\\.(input_layernorm|mlp\\\\.down_proj)$"}, "candidate": "dump",
 "tolerances": {"d_x": {"derive": true}, "d_weight": {"derive": true}, "d_bias": {"derive": true}}}
J
expect_exit 0 "--profile exact on a mixed case" "$QATCHECK" vjp --case "$T/mix.json" --profile exact --verbose --json "$T/mix.r.json"
grep -q "input_layernorm: --profile 'exact' not applied: class 'rmsnorm' has no quantizer profile" "$T/err" ||
  bad "--verbose does not say the rmsnorm was left alone: $(grep -i profile "$T/err" | head -3)"
$PY -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert {x['module'] for x in r['checks']} == {'/model.layers.0.input_layernorm', '/model.layers.0.mlp.down_proj'}
assert all(x['verdict'] == 'pass' for x in r['checks'])
" "$T/mix.r.json" || bad "the mixed case under --profile exact: $(head -c 300 "$T/mix.r.json")"
finish
