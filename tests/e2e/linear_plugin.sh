#!/bin/sh
# A candidate from a plugin (include/qatcheck_plugin.h): the correct one
# passes, planted defects fail naming the tensor, a plugin error exits 2.
. "$(dirname "$0")/lib.inc"
SO="$(pwd)/build/plugins/linear_plugin.so"
[ -f "$SO" ] || { echo "missing $SO (make all)"; exit 1; }
mk() { cat >"$T/$1.json" <<J
{"module": "linear", "data": {"generate": {"shapes": [[33, 64, 48], [5, 40, 24]], "seed": 3}},
 "candidate": {"plugin": "$SO", "symbol": "$2"}, "dy": ["random", "sparse"], $LIN_TOL}
J
}
mk good linear_vjp; mk scaled linear_vjp_dw_scaled; mk nobias linear_vjp_no_bias; mk err linear_vjp_fails; mk nosym no_such_symbol
expect_exit 0 "plugin: correct VJP passes" "$QATCHECK" vjp --case "$T/good.json"
expect_exit 1 "plugin: dW x1.002 fails" "$QATCHECK" vjp --case "$T/scaled.json" --json "$T/s.json"
$PY -c "
import json; r=json.load(open('$T/s.json'))
f={c['tensor'] for c in r['checks'] if c['verdict']=='fail'}
assert f=={'d_weight'}, f
for c in r['checks']:
    if c['verdict'] == 'fail':
        assert c['diagnosis']['summary'].startswith('consistent with: a constant factor k = 1.00'), (c['module'], c['dy'], c['diagnosis']['summary'])
" && ok "dW x1.002 fails on d_weight only, each diagnosed as the factor" || bad "scaled report"
expect_exit 1 "plugin: missing d_bias fails" "$QATCHECK" vjp --case "$T/nobias.json" --json "$T/n.json"
grep -q '"why":[[:space:]]*"missing"' "$T/n.json" && ok "missing is reported" || bad "missing not reported"
grep -q '"summary":[[:space:]]*"the candidate has no d_bias' "$T/n.json" && ok "missing is diagnosed" || bad "missing not diagnosed"
expect_exit 2 "plugin error cannot be judged" "$QATCHECK" vjp --case "$T/err.json" --json "$T/e.json"
error_or_none "$T/e.json" && ok "only the error report on exit 2" || bad "a report other than the error report was written on exit 2"
grep -q "the plugin could not run" "$T/err" && ok "plugin message passed on" || bad "plugin message lost"
expect_exit 2 "plugin: unknown symbol" "$QATCHECK" vjp --case "$T/nosym.json"
grep -q "symbol 'no_such_symbol' not found" "$T/err" && ok "names the symbol" || bad "symbol not named"
finish
