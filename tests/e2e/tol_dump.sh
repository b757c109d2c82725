#!/bin/sh
# tol_dump.sh: `qatcheck tol --dump F --module PATH` derives every gradient
# of the module as vjp's {"derive": true} does (the class's error model, the
# candidate's dtype as dumped) and prints the whole "tolerances" member: on
# the committed linear dump it equals the committed case's bounds (derived
# by hand with --k), and vjp passes with it; a batched dY [2, 24, N] gives
# d_weight K = 48; another class (rmsnorm) works the same; bad uses exit 2
# with one line and no report. Agreement with derive on every module:
# tests/e2e/tol_agree.sh.
. "$(dirname "$0")/lib.inc"
D=cases/data/linear_small.h5
P=/model.layers.0.mlp.down_proj
expect_exit 0 "tol --dump --module derives every gradient" "$QATCHECK" tol --dump $D --module $P --json "$T/t.json"
cp "$T/out" "$T/tols.json"
"$PY" - "$T/tols.json" cases/linear_dump.json "$T/case.json" "$(pwd)/$D" <<'PYEOF' || bad "the derived member differs from the committed case"
import json, sys
got = json.load(open(sys.argv[1]))["tolerances"]
case = json.load(open(sys.argv[2]))
assert sorted(got) == ["d_bias", "d_weight", "d_x"], sorted(got)
for t, b in case["tolerances"].items():
    for k in ("rel_l2", "cosine_min", "norm_ratio", "noise_multiple"):
        assert got[t][k] == b[k], (t, k, got[t][k], b[k])
    assert got[t]["reasoning"].startswith("derived: ") and "judged at bfloat16" in got[t]["reasoning"], got[t]["reasoning"]
case["tolerances"] = got
case["data"]["dump"] = sys.argv[4]
json.dump(case, open(sys.argv[3], "w"))
PYEOF
expect_exit 0 "vjp passes with the tolerances tol read from the dump" "$QATCHECK" vjp --case "$T/case.json"
"$PY" -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert r['module'] == '$P' and len(r['derivations']) == 3 and sorted(r['tolerances']) == ['d_bias', 'd_weight', 'd_x'], r
" "$T/t.json" || bad "tol --dump: JSON report"

# another class: rmsnorm's d_x and d_weight from its own model
"$PY" - "$T/n.h5" <<'PYEOF' || bad "cannot write the rmsnorm dump"
import sys, h5py, numpy as np
r = np.random.default_rng(1)
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = np.int64(1)
    g = f.create_group("norm"); g.attrs["class"] = "rmsnorm"; g.attrs["contract"] = '{"eps": 1e-6}'
    g["params/weight"] = r.standard_normal(32).astype(np.float32)
    g["inputs/x"] = r.standard_normal((8, 32)).astype(np.float32)
    g["grad_out/dy"] = r.standard_normal((8, 32)).astype(np.float32)
PYEOF
expect_exit 0 "tol --dump on an rmsnorm module" "$QATCHECK" tol --dump "$T/n.h5" --module /norm --margin 2
"$PY" -c "
import json, sys
t = json.load(open(sys.argv[1]))['tolerances']
assert sorted(t) == ['d_weight', 'd_x'], t
for g in t.values(): assert g['reasoning'].startswith('derived: ') and '--margin 2' in g['reasoning'], g
" "$T/out" || bad "rmsnorm: $(cat "$T/out")"

# a batch dump: dY [2, 24, 64] is 48 tokens
"$PY" - "$T/b.h5" <<'PYEOF' || bad "cannot write the batch dump"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = np.int64(1)
    g = f.create_group("proj"); g.attrs["class"] = "linear"
    g["params/weight"] = np.ones((64, 32), np.float32)
    g["inputs/x"] = np.ones((2, 24, 32), np.float32)
    g["grad_out/dy"] = np.ones((2, 24, 64), np.float32)
PYEOF
expect_exit 0 "tol --dump on a batched dump" "$QATCHECK" tol --dump "$T/b.h5" --module /proj
grep -q "over the M = 48 tokens" "$T/out" || bad "batch: d_weight K is not 48: $(cat "$T/out")"
grep -q '"reasoning":.*over the N = 64 output features.*judged at float32 (no candidate in the dump: the dtype of x' "$T/out" || bad "batch: d_x: $(cat "$T/out")"

one_line() { [ "$(grep -c '^qatcheck: error:' "$T/err")" -eq 1 ] || bad "$1: not one error line"; grep -q "$2" "$T/err" || bad "$1: $(cat "$T/err")"; }
expect_exit 2 "tol --dump without --module" "$QATCHECK" tol --dump $D --json "$T/x.json"
one_line "no --module" "needs --module"
expect_exit 2 "tol --dump on a path that is no module group" "$QATCHECK" tol --dump $D --module /nothere --json "$T/x.json"
one_line "no group" "is not a module group"
expect_exit 2 "tol --dump with --k" "$QATCHECK" tol --dump $D --module $P --k 3 --json "$T/x.json"
one_line "--k" "does not go with --dump"
expect_exit 2 "tol --dump with --lambda (derive has no such option)" "$QATCHECK" tol --dump $D --module $P --lambda 2 --json "$T/x.json"
one_line "--lambda" "option '--lambda' does not go with --dump"
error_or_none "$T/x.json" || bad "a refused tol wrote a report other than its error report"
finish
