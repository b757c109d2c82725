#!/bin/sh
# fsdp_real.sh: the fsdp_flat layout against real FSDP1 bytes. A two-layer
# MLP under torch.distributed.fsdp (use_orig_params=False, gloo, 4 CPU
# processes; tests/e2e/fsdp_real.py) writes each rank's FlatParameter piece
# and its reduce-scattered gradient as FSDP left them: vjp passes with
# grad_reduce mean (FSDP averages), and the same bytes declared
# grad_reduce sum fail on every rank's d_weight, named as the mean they
# are. The same step dumped by scripts/qatdump.py (its FSDP1 path) gives
# FSDP's pieces byte for byte and passes (a weight and bias sharing one
# FlatParameter cut per tensor); a doubled gradient on rank 1
# fails on that rank alone; likewise under FSDP2 (fully_shard: DTensor
# pieces along dimension 0, uneven). Skips (77) where torch cannot run FSDP1 on the CPU (Debian's torch
# 1.13 under Python 3.11); the GPU machine's torch runs it
# (scripts/gpu-verify.sh fsdp_real).
. "$(dirname "$0")/lib.inc"
"$PY" tests/e2e/fsdp_real.py "$T/d" >"$T/py.log" 2>&1; rc=$?
[ $rc -eq 77 ] && { tail -1 "$T/py.log"; exit 77; }
[ $rc -eq 0 ] || { tail -20 "$T/py.log"; echo "FAIL: the FSDP1 step"; exit 1; }
tail -1 "$T/py.log"
TOL='"tolerances": {"d_x": {"rel_l2": 1e-5, "reasoning": "fp32"}, "d_weight": {"rel_l2": 1e-5, "reasoning": "fp32"},
  "d_bias": {"rel_l2": 1e-5, "reasoning": "fp32"}}'
# only_fails DIR CHECK DESC: the dump in DIR fails on CHECK alone, named twice the reference
only_fails() {
  echo "{\"data\": {\"dump\": \"$1/step.rank*.h5\"}, \"candidate\": \"dump\", $TOL}" >"$T/of.json"
  expect_exit 1 "$3: vjp" "$QATCHECK" vjp --case "$T/of.json" --json "$T/of.r.json"
  "$PY" - "$T/of.r.json" "$2" <<'P' && ok "$3: only $2 fails, named twice the reference" || bad "$3: wrong checks or diagnosis"
import json, sys
r = json.load(open(sys.argv[1]))
failed = [c for c in r["checks"] if c["verdict"] == "fail"]
assert [c["module"] + ":" + c["tensor"] for c in failed] == [sys.argv[2]], [c["module"] + ":" + c["tensor"] for c in failed]
assert "twice" in failed[0].get("diagnosis", {}).get("summary", ""), failed[0].get("diagnosis")
P
}
echo "{\"data\": {\"dump\": \"d/step.rank*.h5\"}, \"candidate\": \"dump\", $TOL}" >"$T/ok.json"
expect_exit 0 "real FSDP1: vjp" "$QATCHECK" vjp --case "$T/ok.json" --json "$T/ok.r.json"
"$PY" - "$T/ok.r.json" <<'P' && ok "real FSDP1: 16 per-rank checks, every one pass" || bad "real FSDP1: not 16 passing checks"
import json, sys
r = json.load(open(sys.argv[1]))
names = sorted(c["module"] + ":" + c["tensor"] for c in r["checks"])
assert len(names) == 16 and all(c["verdict"] == "pass" for c in r["checks"]), names
P
mkdir "$T/s" && cp "$T"/d/step.rank*.h5 "$T/s/"
for f in "$T"/s/step.rank*.h5; do
  "$PY" -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r+'); [f[g].attrs.__setitem__('grad_reduce', 'sum') for g in ('fc1', 'fc2')]" "$f"
done
echo "{\"data\": {\"dump\": \"s/step.rank*.h5\"}, \"candidate\": \"dump\", $TOL}" >"$T/sum.json"
expect_exit 1 "real FSDP1 declared a sum: vjp" "$QATCHECK" vjp --case "$T/sum.json" --json "$T/sum.r.json"
"$PY" - "$T/sum.r.json" <<'P' && ok "real FSDP1 declared a sum: exactly the 8 d_weight checks fail, named 1/4 of the reference" || bad "real FSDP1 declared a sum: wrong checks or diagnosis"
import json, sys
r = json.load(open(sys.argv[1]))
failed = sorted(c["module"] + ":" + c["tensor"] for c in r["checks"] if c["verdict"] == "fail")
want = sorted("/%s:d_weight@rank%d" % (m, k) for m in ("fc1", "fc2") for k in range(4))
assert failed == want, failed
diag = [c.get("diagnosis", {}).get("summary", "") for c in r["checks"] if c["verdict"] == "fail"]
assert all("1/4" in d for d in diag), diag
P
# the helper's own dump of the same step: FSDP's pieces byte for byte, its
# layout and reduction read from FSDP, passing; the planted doubled gradient
# of rank 1 fails on /0's d_weight@rank1 alone, named twice the reference
"$PY" - "$T/d" "$T/d/q" <<'P' && ok "qatdump under FSDP1: FSDP's own pieces and gradients, fsdp_flat and mean read from FSDP" || bad "qatdump under FSDP1: the pieces or attributes differ from FSDP's"
import json, sys, h5py, numpy as np
for r in range(4):
    a, b = h5py.File("%s/step.rank%d.h5" % (sys.argv[1], r), "r"), h5py.File("%s/step.rank%d.h5" % (sys.argv[2], r), "r")
    for m, q in (("fc1", "0"), ("fc2", "2")):
        for ds in ("params/weight", "grads/dy/d_weight", "grads/dy/d_x", "inputs/x", "grad_out/dy"):
            assert np.array_equal(a[m][ds][()], b[q][ds][()]), (r, m, ds)
        assert b[q].attrs["parallel"] == "fsdp_flat" and b[q].attrs["grad_reduce"] == "mean", dict(b[q].attrs)
        assert json.loads(b[q]["params/weight"].attrs["shard_flat"]) == json.loads(a[m]["params/weight"].attrs["shard_flat"])
        assert b[q]["inputs/x"].attrs["shard_dim"] == 0 and b[q]["grad_out/dy"].attrs["shard_dim"] == 0
P
echo "{\"data\": {\"dump\": \"d/q/step.rank*.h5\"}, \"candidate\": \"dump\", $TOL}" >"$T/q.json"
expect_exit 0 "qatdump under FSDP1: vjp" "$QATCHECK" vjp --case "$T/q.json" --json "$T/q.r.json"
"$PY" - "$T/q.r.json" <<'P' && ok "qatdump under FSDP1: /4's weight and bias, one FlatParameter, cut per tensor and judged (rank 3's bias piece is padding: no check)" || bad "qatdump under FSDP1: /4 not judged per tensor"
import json, sys
r = json.load(open(sys.argv[1]))
names = sorted(c["module"] + ":" + c["tensor"] for c in r["checks"] if c["module"] == "/4")
want = sorted(["/4:d_x@rank%d" % k for k in range(4)] + ["/4:d_weight@rank%d" % k for k in range(4)] + ["/4:d_bias@rank%d" % k for k in range(3)])
assert names == want, names
P
only_fails d/p /0:d_weight@rank1 "qatdump under FSDP1, rank 1's gradient doubled"
# FSDP2 (fully_shard): Shard(0) DTensor pieces of uneven length, dumped by
# qatdump after the backward (the forward saw the unsharded copies)
if [ -f "$T/d/f2/step.rank0.h5" ]; then
  "$PY" - "$T/d/f2" <<'P' && ok "qatdump under FSDP2: parallel fsdp, grad_reduce mean, Shard(0) pieces of 3,3,3,2 and 2,2,2,1 rows" || bad "qatdump under FSDP2: attributes or pieces"
import sys, h5py
for r, (na, nb) in enumerate(((3, 2), (3, 2), (3, 2), (2, 1))):
    f = h5py.File("%s/step.rank%d.h5" % (sys.argv[1], r), "r")
    for g, n in (("0", na), ("2", nb)):
        assert f[g].attrs["parallel"] == "fsdp" and f[g].attrs["grad_reduce"] == "mean", dict(f[g].attrs)
        w = f[g]["params/weight"]
        assert w.shape[0] == n and w.attrs["shard_dim"] == 0 and f[g]["grads/dy/d_weight"].shape == w.shape, (r, g, w.shape)
    assert f["0/params/bias"].shape == (na,)
P
  echo "{\"data\": {\"dump\": \"d/f2/step.rank*.h5\"}, \"candidate\": \"dump\", $TOL}" >"$T/f2.json"
  expect_exit 0 "qatdump under FSDP2: vjp" "$QATCHECK" vjp --case "$T/f2.json" --json "$T/f2.r.json"
  only_fails d/f2p /0:d_weight@rank2 "qatdump under FSDP2, rank 2's gradient doubled"
else
  echo "skip: FSDP2 part (this torch has no fully_shard)"
fi
finish
