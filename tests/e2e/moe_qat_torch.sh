#!/bin/sh
# moe_qat_torch.sh: expert QAT dumped by scripts/qatdump.py from a torch
# step (tests/e2e/moe_qat_torch.py, torch 1.13: the experts' fp8 bytes are
# uint8 tensors, their element type taken from the contract's
# expert_weight_format). The module whose Function follows the contract
# passes, its bytes (quantizer/w1, quantizer/w2) and saved FC1 output
# included; the one whose backward takes expert 2's master weights fails
# on d_x and d_w1, diagnosed as expert 2.
. "$(dirname "$0")/lib.inc"
have_py "$PY" torch h5py ml_dtypes || { echo "skip: no torch/h5py/ml_dtypes"; exit 77; }
"$PY" tests/e2e/moe_qat_torch.py "$T/t.h5" >"$T/py.log" 2>&1 || { cat "$T/py.log"; bad "the torch step"; finish; }
TOL='{"d_x":{"derive":true},"d_w1":{"derive":true},"d_w2":{"derive":true},"d_topk_weights":{"derive":true}}'
for m in ok:0 dx_master:1; do
  name=${m%%:*}; want=${m#*:}
  cat >"$T/$name.json" <<J
{"data": {"dump": "t.h5", "modules": "^/$name\$"}, "candidate": "dump", "tolerances": $TOL}
J
  expect_exit "$want" "qatdump's fp8 experts /$name" "$QATCHECK" vjp --case "$T/$name.json" --json "$T/$name.r.json"
done
"$PY" - "$T/ok.r.json" "$T/dx_master.r.json" <<'P' && ok "the bytes and fc1_out pass; dx_master fails on d_x, d_w1 as expert 2" || bad "not the expected checks"
import json, sys
ok = {c["tensor"]: c for c in json.load(open(sys.argv[1]))["checks"]}
dm = {c["tensor"]: c for c in json.load(open(sys.argv[2]))["checks"]}
assert {"quantizer/w1", "quantizer/w2", "saved/fc1_out", "y"} <= set(ok) and all(c["verdict"] == "pass" for c in ok.values()), ok.keys()
assert {t for t, c in dm.items() if c["verdict"] != "pass"} == {"d_x", "d_w1"}
assert "expert 2 " in dm["d_x"]["diagnosis"]["summary"], dm["d_x"]["diagnosis"]
P
finish
