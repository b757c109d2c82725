#!/bin/sh
# unjudged.sh: data a dump holds that used to pass without being judged
# (issue 42 section 3), each planted by the generator below into a copy of
# a committed or torch-made dump:
# - a group that looks like a module group (inputs/, grad_out/, grads/) but
#   has no 'class' attribute, its d_x doubled, beside a module group, read
#   with modules ".*": reported "not judged", the run fails (it was left
#   out: exit 0); selected alone by the regex: refused naming it (exit 2);
# - outputs/y stored as int32: refused naming the dataset and the float
#   dtype expected (it was skipped without a word, even under --verbose);
# - attention's saved O with a NaN, saved LSE with an Inf, a stale O and a
#   shifted LSE, with the dump's own (correct) gradients as the candidate:
#   each fails its saved/ check (they passed: the reference never reads
#   them); the clean module's saved O and LSE pass against the forward
#   recomputed from q, k, v. The attention part skips without torch.
. "$(dirname "$0")/lib.inc"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TOL=$(sed -n '/"tolerances"/,$p' "$ROOT/cases/linear_dump.json" | sed '$d')

# 1. a group without 'class' beside a module group
cp "$ROOT/cases/data/linear_small.h5" "$T/w.h5"
$PY - "$T/w.h5" <<'P' || bad "could not plant the group without a class"
import sys, h5py
f = h5py.File(sys.argv[1], "a")
f.copy("/model.layers.0.mlp.down_proj", "/model.layers.1.mlp.down_proj")
del f["/model.layers.1.mlp.down_proj"].attrs["class"]
d = f["/model.layers.1.mlp.down_proj/grads/dy/d_x"]
d[...] = d[...] * 2 if d.dtype.kind == "f" else d[...]
P
printf '{"module": "linear", "data": {"dump": "w.h5", "modules": ".*"}, "candidate": "dump",\n%s}\n' "$TOL" >"$T/w.json"
expect_exit 1 "a module-like group without 'class' under modules .* fails the run" "$QATCHECK" vjp --case "$T/w.json" --json "$T/w.r.json"
$PY - "$T/w.r.json" <<'P' && ok "the JSON lists it not judged, the module group's checks judged" || bad "the JSON report of the classless group"
import json, sys
r = json.load(open(sys.argv[1]))
nj = [c for c in r["checks"] if c["module"] == "/model.layers.1.mlp.down_proj"]
assert r["verdict"] == "fail" and len(nj) == 1, (r["verdict"], nj)
assert nj[0]["verdict"] == "fail" and nj[0]["why"].startswith("not judged: ") and "'class'" in nj[0]["why"], nj[0]
assert all(c["verdict"] == "pass" for c in r["checks"] if c["module"] == "/model.layers.0.mlp.down_proj")
P
grep -Eq '^/model\.layers\.1\.mlp\.down_proj +- +module .*FAIL +not judged' "$T/out" \
  && ok "the text table lists it not judged" || bad "text: $(grep 'layers.1' "$T/out")"
sed 's/"modules": ".\*"/"modules": "layers\\\\.1\\\\."/' "$T/w.json" >"$T/w1.json"
expect_exit 2 "a regex that selects only the group without 'class' is refused" "$QATCHECK" vjp --case "$T/w1.json"
[ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep -q "group '/model.layers.1.mlp.down_proj'.* no attribute 'class'" "$T/err" \
  && ok "one error line naming the group and the missing 'class'" || bad "the refusal: $(cat "$T/err")"

# 2. outputs/y stored as int32
cp "$ROOT/cases/data/linear_small.h5" "$T/y.h5"
$PY - "$T/y.h5" <<'P' || bad "could not plant an int32 outputs/y"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "a")
g = f["/model.layers.0.mlp.down_proj"]
m = g["inputs/x"].shape[0]
n = g["params/weight"].shape[0]
g.create_dataset("outputs/y", data=np.arange(m * n, dtype=np.int32).reshape(m, n))
P
printf '{"module": "linear", "data": {"dump": "y.h5", "modules": "^/model\\\\."}, "candidate": "dump",\n%s}\n' "$TOL" >"$T/y.json"
expect_exit 2 "an int32 outputs/y is refused" "$QATCHECK" vjp --case "$T/y.json" --verbose
[ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep -q "'outputs/y' has dtype int32: expected a float dtype" "$T/err" \
  && ok "one error line naming outputs/y, its dtype and the float dtype expected" || bad "the refusal: $(grep error "$T/err")"

# 3. attention's saved O and LSE
if ! have_py "$PY" torch h5py; then
  echo "skip: torch missing for $PY: the saved-tensor reproductions"
  finish
fi
$PY "$ROOT/scripts/make_attention_dump.py" "$T/a.h5" >/dev/null || bad "make_attention_dump.py"
$PY - "$T/a.h5" <<'P' || bad "could not plant the saved tensors"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "a")
src = "/model.layers.0.self_attn.sdpa"
def plant(name, ds, fn):
    f.copy(src, name)
    d = f[name + "/saved/" + ds]
    a = d[...]
    fn(a)
    d[...] = a
plant("/p.nan_out", "out", lambda a: a.__setitem__((0, 1, 3, 2), np.nan))
plant("/p.inf_lse", "lse", lambda a: a.__setitem__((1, 0, 4), np.inf))
plant("/p.stale_out", "out", lambda a: a.__setitem__(Ellipsis, a[:, :, ::-1, :].copy()))  # another step's rows
plant("/p.shifted_lse", "lse", lambda a: a.__setitem__(Ellipsis, a + 0.05))
P
ATOL='{"d_q":{"rel_l2":1e-5,"reasoning":"fp32 eager autograd"},"d_k":{"rel_l2":1e-5,"reasoning":"fp32 eager autograd"},"d_v":{"rel_l2":1e-5,"reasoning":"fp32 eager autograd"}}'
printf '{"module": "attention", "data": {"dump": "a.h5", "modules": "^/(model\\\\.layers\\\\.0\\\\.self_attn\\\\.sdpa|p\\\\..*)$"}, "candidate": "dump", "tolerances": %s}\n' "$ATOL" >"$T/a.json"
expect_exit 1 "attention: a NaN O, an Inf LSE, a stale O, a shifted LSE fail with the dump's gradients" "$QATCHECK" vjp --case "$T/a.json" --json "$T/a.r.json"
$PY - "$T/a.r.json" <<'P' && ok "each planted saved tensor fails its own check; the clean module's pass" || bad "attention saved checks: the report"
import json, sys
r = json.load(open(sys.argv[1]))
failed = {(c["module"], c["tensor"]) for c in r["checks"] if c["verdict"] != "pass"}
want = {("/p.nan_out", "saved/out"), ("/p.inf_lse", "saved/lse"), ("/p.stale_out", "saved/out"), ("/p.shifted_lse", "saved/lse")}
assert failed == want, sorted(failed ^ want)
ok = {c["tensor"] for c in r["checks"] if c["module"] == "/model.layers.0.self_attn.sdpa" and c["verdict"] == "pass"}
assert ok == {"d_q", "d_k", "d_v", "saved/out", "saved/lse"}, ok
why = {c["module"]: c["why"] for c in r["checks"] if c["verdict"] != "pass"}
assert "1 non-finite value(s), the first at [0, 1, 3, 2]" in why["/p.nan_out"], why["/p.nan_out"]
assert "1 non-finite value(s), the first at [1, 0, 4]" in why["/p.inf_lse"], why["/p.inf_lse"]
k = [c for c in r["checks"] if c["module"] == "/model.layers.0.self_attn.sdpa" and c["tensor"] == "saved/lse"][0]
assert k["kind"] == "forward" and "metrics" in k and "tolerance" in k, k
P
finish
