#!/bin/sh
# fsdp_real.sh: the fsdp_flat layout against real FSDP1 bytes. A two-layer
# MLP under torch.distributed.fsdp (use_orig_params=False, gloo, 4 CPU
# processes; tests/e2e/fsdp_real.py) writes each rank's FlatParameter piece
# and its reduce-scattered gradient as FSDP left them: vjp passes with
# grad_reduce mean (FSDP averages), and the same bytes declared
# grad_reduce sum fail on every rank's d_weight, named as the mean they
# are. Skips (77) where torch cannot run FSDP1 on the CPU (Debian's torch
# 1.13 under Python 3.11); the GPU machine's torch runs it
# (scripts/gpu-verify.sh fsdp_real).
. "$(dirname "$0")/lib.inc"
"$PY" tests/e2e/fsdp_real.py "$T/d" >"$T/py.log" 2>&1; rc=$?
[ $rc -eq 77 ] && { tail -1 "$T/py.log"; exit 77; }
[ $rc -eq 0 ] || { tail -20 "$T/py.log"; echo "FAIL: the FSDP1 step"; exit 1; }
tail -1 "$T/py.log"
TOL='"tolerances": {"d_x": {"rel_l2": 1e-5, "reasoning": "fp32"}, "d_weight": {"rel_l2": 1e-5, "reasoning": "fp32"}}'
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
finish
