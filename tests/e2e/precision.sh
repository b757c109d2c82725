#!/bin/sh
# precision.sh: storage type is not precision. A bf16 backward whose
# gradients a trainer stored in float32 datasets (what many dump) is judged
# at bfloat16 precision: the noise floor, noise multiple and bias test of
# bf16, so the bounds `qatcheck tol` derives for a bf16 gradient pass it
# (before: noise_multiple 6e4 > 1.01), and the report says why; the planted
# 0.2% scale still fails; declaring "dtype": "float32" judges it at float32
# instead (and fails it); a float32 gradient that is not bf16-valued stays
# judged at float32.
. "$(dirname "$0")/lib.inc"
$PY scripts/make_linear_dump.py "$T/d.h5" --defects scaled_dw || exit 1
$PY - "$T/d.h5" <<'P' || exit 1
import sys
import h5py
import numpy as np
sys.path.insert(0, "scripts")
import bf16
with h5py.File(sys.argv[1], "r+") as f:
    for mod in ("model.layers.0.mlp.down_proj", "defect.scaled_dw"):
        for dy in ("dy", "dy_sparse"):
            g = f[mod]["grads"][dy]
            for name in list(g):
                v = bf16.from_bits(g[name][()])
                del g[name]
                g[name] = v.astype(np.float32)          # bf16 values in a float32 dataset
    # a float32 gradient that is not bf16-valued: d_x recomputed in float32 without the bf16 cast
    src = f["model.layers.0.mlp.down_proj"]
    f.copy(src, "f32.down_proj")
    x = bf16.from_bits(src["inputs/x"][()]); w = bf16.from_bits(src["params/weight"][()])
    for dy in ("dy", "dy_sparse"):
        d = bf16.from_bits(src["grad_out"][dy][()])
        g = f["f32.down_proj"]["grads"][dy]
        del g["d_x"]
        g["d_x"] = np.matmul(d, w, dtype=np.float32)
P
tol_member() { "$QATCHECK" tol --out-dtype "$1" --acc-dtype float32 --k "$2" --tensor "$3" | sed '1d;$d'; }
{ printf '{"module": "linear", "data": {"dump": "d.h5", "modules": "%s"}, "candidate": "dump", "tolerances": {' '^/(model|defect)'
  tol_member bfloat16 64 d_x; printf ','; tol_member bfloat16 48 d_weight; printf ','; tol_member bfloat16 48 d_bias
  printf '}}\n'; } >"$T/c.json" || { bad "qatcheck tol"; finish; }
expect_exit 1 "bf16 values in float32: only the planted scale fails" "$QATCHECK" vjp --case "$T/c.json" --json "$T/r.json"
$PY - "$T/r.json" <<'P' || bad "bf16-valued float32 gradients are not judged at bf16"
import json, sys
r = json.load(open(sys.argv[1]))
failed = {(c["module"], c["tensor"]) for c in r["checks"] if c["verdict"] == "fail"}
assert failed == {("/defect.scaled_dw", "d_weight")}, failed
for c in r["checks"]:
    assert c["candidate_dtype"] == "float32" and c["judged_dtype"] == "bfloat16", c
    assert "bfloat16" in c["precision"] and "float32" in c["precision"], c.get("precision")
    if c["module"].startswith("/model"):
        assert c["metrics"]["noise_multiple"] <= 1.01, c["metrics"]
print("judged at bfloat16 (the report says so); the correct module passes at noise multiple <= 1.01")
P
# the case's dtype overrides: judged at float32, the bf16 rounding is a huge multiple
sed 's/"d_x":[[:space:]]*{/"d_x": {"dtype": "float32", /' "$T/c.json" >"$T/c32.json"
expect_exit 1 "declared dtype float32 judges at float32" "$QATCHECK" vjp --case "$T/c32.json" --json "$T/r32.json"
$PY -c "
import json, sys
r = json.load(open('$T/r32.json'))
c = [c for c in r['checks'] if c['module'] == '/model.layers.0.mlp.down_proj' and c['tensor'] == 'd_x'][0]
assert c['judged_dtype'] == 'float32' and c['verdict'] == 'fail' and c['metrics']['noise_multiple'] > 1e3, c
assert 'declares' in c['precision'], c
" && ok "the declared dtype is reported and used" || bad "declared dtype float32 not used"
# a float32 gradient with float32 values stays judged at float32
cat >"$T/f.json" <<J
{"module": "linear", "data": {"dump": "d.h5", "modules": "^/f32"}, "candidate": "dump", "dy": ["dy"],
 "tolerances": {"d_x": {"derive": true}, "d_weight": {"derive": true}, "d_bias": {"derive": true}}}
J
expect_exit 0 "float32 values: judged at float32, derived bounds pass" "$QATCHECK" vjp --case "$T/f.json" --json "$T/rf.json"
$PY -c "
import json
r = json.load(open('$T/rf.json'))
c = [c for c in r['checks'] if c['tensor'] == 'd_x'][0]
assert c['judged_dtype'] == 'float32' and 'precision' not in c, c
" && ok "float32-valued d_x judged at float32" || bad "float32-valued d_x not judged at float32"
finish
