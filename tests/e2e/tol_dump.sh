#!/bin/sh
# tol_dump.sh: `qatcheck tol --dump F --module PATH` reads K and the dtypes
# from the dump and prints the whole "tolerances" member of the module: on
# the committed linear dump it equals the committed case's bounds (derived
# by hand with --k), and vjp passes with it; a batched dY [2, 24, N] gives
# d_weight K = 48; bad uses exit 2 with one line and no report.
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
    assert "from the dump: K = " in got[t]["reasoning"], got[t]["reasoning"]
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
grep -q "K = M = 48 tokens" "$T/out" || bad "batch: d_weight K is not 48: $(cat "$T/out")"
grep -q '"reasoning":.*--out-dtype float32 --operand-dtype float32 --acc-dtype float32 --k 64 --tensor d_x' "$T/out" || bad "batch: d_x: $(cat "$T/out")"

one_line() { [ "$(grep -c '^qatcheck: error:' "$T/err")" -eq 1 ] || bad "$1: not one error line"; grep -q "$2" "$T/err" || bad "$1: $(cat "$T/err")"; }
expect_exit 2 "tol --dump without --module" "$QATCHECK" tol --dump $D --json "$T/x.json"
one_line "no --module" "needs --module"
expect_exit 2 "tol --dump on a path that is no module group" "$QATCHECK" tol --dump $D --module /nothere --json "$T/x.json"
one_line "no group" "is not a module group"
expect_exit 2 "tol --dump with --k" "$QATCHECK" tol --dump $D --module $P --k 3 --json "$T/x.json"
one_line "--k" "does not go with --dump"
expect_exit 2 "tol --dump on a class without dump rules" "$QATCHECK" tol --dump cases/data/contract_ckpt.h5 \
  --module /model.layers.0.input_layernorm --json "$T/x.json"
one_line "rmsnorm" "class 'rmsnorm' does not read its reduction lengths from a dump yet"
error_or_none "$T/x.json" || bad "a refused tol wrote a report other than its error report"
finish
