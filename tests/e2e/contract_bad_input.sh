#!/bin/sh
# contract_bad_input.sh: `qatcheck contract` refuses input it cannot judge
# with exit 2, one clear "qatcheck: error:" line naming the problem, and no
# report: missing file, not a dump, no linear groups, a 3-D weight without an
# expert layout, unknown formats, a dY of the wrong width, bad options. Also
# the good cases beside them pass (and in natural layer order).
set -u
. "$(dirname "$0")/lib.inc"
fail() { echo "FAIL: $*"; exit 1; }

"$PY" - "$T" <<'PYEOF' || fail "cannot build the test dumps"
import sys, h5py, numpy as np
t = sys.argv[1]
def lin(f, path, w, dy=None):
    f.require_group(path).attrs["class"] = "linear"
    f[path + "/params/weight"] = np.asarray(w, np.float32)
    if dy is not None:
        f[path + "/grad_out/dy"] = np.asarray(dy, np.float32)
def dump(name):
    f = h5py.File(t + "/" + name, "w"); f.attrs["qatcheck_dump"] = np.int64(1); return f
with dump("ok.h5") as f:
    lin(f, "/model.layers.0.q_proj", np.ones((4, 8)), np.ones((3, 4)))
with dump("nolinear.h5") as f:
    f.require_group("/model.layers.0.norm").attrs["class"] = "rmsnorm"
    f["/model.layers.0.norm/params/weight"] = np.ones(8, np.float32)
with dump("fused3d.h5") as f:
    lin(f, "/model.layers.0.mlp.fused_proj", np.ones((2, 4, 8)))
with dump("width.h5") as f:
    lin(f, "/model.layers.0.q_proj", np.ones((4, 8)), np.ones((3, 5)))
with dump("experts_e.h5") as f:
    lin(f, "/model.layers.0.mlp.experts.down_proj", np.ones((2, 4, 8)), np.ones((3, 6, 4)))
with dump("noweight.h5") as f:
    f.require_group("/model.layers.0.q_proj").attrs["class"] = "linear"
    f["/model.layers.0.q_proj/params/bias"] = np.ones(4, np.float32)
with dump("weight1d.h5") as f:
    lin(f, "/model.layers.0.q_proj", np.ones(8))
with dump("order.h5") as f:
    for l in (10, 2, 1, 0, 11):
        lin(f, "/model.layers.%d.q_proj" % l, np.ones((4, 8)), np.ones((3, 4)))
with dump("nan.h5") as f:
    lin(f, "/model.layers.0.q_proj", np.ones((4, 8)), np.ones((3, 4)))
    w = np.ones((4, 8)); w[2, 5] = np.nan
    lin(f, "/model.layers.1.q_proj", w, np.ones((3, 4)))
    lin(f, "/model.layers.2.q_proj", np.ones((4, 8)), np.ones((3, 4)))
with dump("nan_expert_dy.h5") as f:  # a NaN in expert 1's dY of a per-expert [E, M, N] dY
    dy = np.ones((2, 3, 4)); dy[1, 2, 3] = np.nan
    lin(f, "/model.layers.0.mlp.experts.down_proj", np.ones((2, 4, 8)), dy)
with dump("nan_x.h5") as f:
    lin(f, "/model.layers.0.q_proj", np.ones((4, 8)), np.ones((3, 4)))
    x = np.ones((3, 8)); x[1, 6] = -np.inf
    f["/model.layers.0.q_proj/inputs/x"] = x.astype(np.float32)
with dump("big64.h5") as f:  # finite in float64, beyond float32: the quantizers cannot take it
    f.require_group("/model.layers.0.q_proj").attrs["class"] = "linear"
    w = np.ones((4, 8)); w[3, 5] = 1e39
    f["/model.layers.0.q_proj/params/weight"] = w
with dump("virtual.h5") as f:  # a virtual dataset (its data could live in any file)
    f["/src/w"] = np.ones((4, 8), np.float32)
    f.require_group("/model.layers.0.q_proj").attrs["class"] = "linear"
    lay = h5py.VirtualLayout(shape=(4, 8), dtype=np.float32)
    lay[:] = h5py.VirtualSource(t + "/virtual.h5", "/src/w", shape=(4, 8))
    f.create_virtual_dataset("/model.layers.0.q_proj/params/weight", lay)
with dump("external.h5") as f:  # external raw storage in another file
    f.require_group("/model.layers.0.q_proj").attrs["class"] = "linear"
    open(t + "/external.bin", "wb").write(np.ones((4, 8), np.float32).tobytes())
    f.create_dataset("/model.layers.0.q_proj/params/weight", shape=(4, 8), dtype=np.float32,
                     external=[(t + "/external.bin", 0, 128)])
with dump("multidy.h5") as f:  # several grad_out datasets of other token counts and an odd width
    f.require_group("/model.layers.0.q_proj").attrs["class"] = "linear"
    rng = np.random.default_rng(3)
    f["/model.layers.0.q_proj/params/weight"] = rng.standard_normal((5, 97)).astype(np.float32)
    for k, m in enumerate((7, 5, 3)):
        f["/model.layers.0.q_proj/grad_out/dy%d" % k] = rng.standard_normal((m, 5)).astype(np.float32)
with h5py.File(t + "/notadump.h5", "w") as f:
    lin(f, "/model.layers.0.q_proj", np.ones((4, 8)))
PYEOF

# expect2 WHAT PATTERN ARGS...: exit 2, the error line matches PATTERN, only the error report
expect2() {
  what=$1; pat=$2; shift 2
  rm -f "$T/r.json"
  "$QATCHECK" contract "$@" --json "$T/r.json" >"$T/out" 2>"$T/err"
  rc=$?
  [ $rc -eq 2 ] || { cat "$T/out" "$T/err"; fail "$what: exit $rc, expected 2"; }
  grep -q "^qatcheck: error: .*$pat" "$T/err" || { cat "$T/err"; fail "$what: error line does not say '$pat'"; }
  error_or_none "$T/r.json" || fail "$what: a report other than the error report was written"
  [ "$(grep -c '^qatcheck: error:' "$T/err")" -eq 1 ] || fail "$what: not exactly one error line"
}
M="--master-vs-dequant"
N="--weight-format none"
expect2 "missing file" "cannot read" $M $N --dump "$T/missing.h5"
expect2 "not a dump" "qatcheck_dump" $M $N --dump "$T/notadump.h5"
expect2 "no linear groups" "no linear module group" $M $N --dump "$T/nolinear.h5"
expect2 "regex matches nothing" "no linear module group matches --modules" $M $N --dump "$T/ok.h5" --modules 'lm_head'
expect2 "3-D weight without experts" "3-D but the module path has no 'experts' component" $M $N --dump "$T/fused3d.h5"
expect2 "1-D weight" "expected a linear weight \[N, K\]" $M $N --dump "$T/weight1d.h5"
expect2 "no params/weight" "has no dataset 'params/weight'" $M $N --dump "$T/noweight.h5"
expect2 "dY wrong width" "grad_out/dy' is \[3, 5\]: expected width 4" $M $N --dump "$T/width.h5"
# leading dimensions are tokens: an expert group's [3, 6, 4] dY (3 is not E = 2) is 18 tokens shared by the experts
"$QATCHECK" contract $M $N --dump "$T/experts_e.h5" --json "$T/r.json" >"$T/out" 2>"$T/err" || { cat "$T/err"; fail "expert dY [3, 6, 4] of E = 2 is refused"; }
"$PY" -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["rows"][0]["shape"] != [18, 8])' "$T/r.json" || fail "expert dY [3, 6, 4]: expected d_x rows of 18 tokens"
expect2 "non-finite weight" "q_proj/params/weight: non-finite value nan at \[2, 5\]" $M $N --dump "$T/nan.h5"
QATCHECK_AHEAD=2 expect2 "non-finite weight, prepared ahead" "/model.layers.1.q_proj/params/weight: non-finite value nan at \[2, 5\]" $M $N --dump "$T/nan.h5"
QATCHECK_AHEAD=2 expect2 "non-finite expert dY, read ahead" "/model.layers.0.mlp.experts.down_proj/grad_out/dy (expert 1): non-finite value nan at \[2, 3\]" $M $N --dump "$T/nan_expert_dy.h5"
expect2 "non-finite X" "/model.layers.0.q_proj/inputs/x: non-finite value -inf at \[1, 6\]" $M $N --activation-format fp8_token --dump "$T/nan_x.h5"
expect2 "float64 weight beyond float32" "params/weight: value 1e+39 at \[3, 5\] overflows float32" $M --weight-format nvfp4 --dump "$T/big64.h5"
expect2 "virtual dataset" "is a virtual dataset or has external storage" $M $N --dump "$T/virtual.h5"
expect2 "external storage" "is a virtual dataset or has external storage" $M $N --dump "$T/external.h5"
expect2 "seed beyond 2^53" "option '--seed' is '9007199254740993': expected a whole number from 0 to 9007199254740992" $M $N --dump "$T/ok.h5" --seed 9007199254740993
"$QATCHECK" contract $M --dump "$T/multidy.h5" --weight-format nvfp4,fp8_block128 --json "$T/md.json" --quiet || fail "three dY datasets: exit $?"
"$PY" scripts/contract_check.py "$T/multidy.h5" "$T/md.json" --require nvfp4,fp8_block128 >"$T/chk" || { cat "$T/chk"; fail "three dY datasets of 7, 5, 3 tokens: rows disagree with the checker"; }
expect2 "unknown weight format" "unknown format 'fp9'" $M --weight-format none,fp9 --dump "$T/ok.h5"
expect2 "activation format as weight format" "unknown format 'fp8_token'" $M --weight-format fp8_token --dump "$T/ok.h5"
expect2 "unknown activation format" "unknown format 'nvfp4'" $M $N --activation-format nvfp4 --dump "$T/ok.h5"
expect2 "format named twice" "named twice" $M --weight-format none,none --dump "$T/ok.h5"
expect2 "no comparison" "expected --master-vs-dequant" $N --dump "$T/ok.h5"
expect2 "no dump" "expected --dump" $M $N
expect2 "bad cosine-min" "option '--cosine-min' is 'abc': expected a number from -1 to 1" $M $N --dump "$T/ok.h5" --cosine-min abc
expect2 "bad norm-ratio" "norm-ratio '1.1,0.9'" $M $N --dump "$T/ok.h5" --norm-ratio 1.1,0.9
expect2 "bad tokens" "option '--tokens' is '0': expected a whole number from 1 to 16777216" $M $N --dump "$T/ok.h5" --tokens 0
expect2 "unknown option" "unknown option '--frobnicate'" $M $N --dump "$T/ok.h5" --frobnicate
expect2 "absent device" "cuda:99" $M $N --dump "$T/ok.h5" --device cuda:99

# and the good dump passes (the bad cases above fail for their own reason)
"$QATCHECK" contract $M $N --dump "$T/ok.h5" --quiet --json "$T/r.json" || fail "ok.h5: exit $?, expected 0"
"$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["verdict"]=="pass" and len(r["rows"])==1 and r["rows"][0]["metrics"]["rel_l2"]==0' "$T/r.json" || fail "ok.h5 report"
# rows come in natural layer order (2 before 10), whatever HDF5's name order
"$QATCHECK" contract $M $N --dump "$T/order.h5" --quiet --json "$T/r.json" || fail "order.h5: exit $?"
"$PY" -c 'import json,sys; m=[r["layer"] for r in json.load(open(sys.argv[1]))["rows"]]; assert m==[0,1,2,10,11], m' "$T/r.json" || fail "row order"
echo ok
