#!/bin/sh
# moe_qat.sh: expert QAT at layer 1 (class moe, contract keys
# expert_weight_format, expert_act_format, dx_weight). A trainer's routed
# experts under fp8_block128 (fp8_group128 activations) and under nvfp4,
# dumped by scripts/make_moe_qat_dump.py with deployed bytes per expert made
# by the independent oracle and the saved FC1 output, pass: every expert's
# bytes reproduced (quantizer/w1, quantizer/w2), saved/fc1_out and outputs/y
# the forward's, the gradients the contract's. Planted expert defects fail
# on their expert and tensor: a stale scale (quantizer/w1, expert 4), one
# expert's d_x from its master weights (d_x, diagnosed as expert 2), every
# expert's (d_x, dx_convention), a nonzero gradient for the empty expert
# (d_w1, expert 3; in a bf16 module too, which the class passed before),
# saved/fc1_out from the master weights (saved/fc1_out alone). Deployed
# bytes the contract cannot read and a misshapen fc1_out are refused (exit
# 2, one error line). Expert parallel (2 ranks, global expert ids): the
# bytes checked on the whole name expert 4, the empty expert's zeros are
# checked on rank 1's piece. `classes --json` lists moe's quantization
# contract.
. "$(dirname "$0")/lib.inc"
$PY scripts/make_moe_qat_dump.py "$T/d.h5" --ep-dir "$T/ep" || { bad "make_moe_qat_dump.py"; finish; }
TOL='{"d_x":{"derive":true},"d_w1":{"derive":true},"d_w2":{"derive":true},"d_topk_weights":{"derive":true}}'

# run GROUP EXIT: vjp on dump group /GROUP (candidate: the dump's gradients)
run() {
  cat >"$T/c.json" <<J
{"data": {"dump": "d.h5", "modules": "^/$(echo "$1" | sed 's/\./\\\\./g')\$"}, "candidate": "dump", "tolerances": $TOL}
J
  expect_exit "$2" "moe $1 exits $2" "$QATCHECK" vjp --case "$T/c.json" --json "$T/$1.r.json"
}
# verdicts GROUP PYEXPR: PYEXPR holds over the report's checks (c: tensor -> check)
verdicts() {
  $PY - "$T/$1.r.json" "$2" <<'P' && ok "$1: $2" || bad "$1: not $2"
import json, sys
c = {k["tensor"]: k for k in json.load(open(sys.argv[1]))["checks"]}
failed = {t for t, k in c.items() if k["verdict"] != "pass"}
ok = eval(sys.argv[2])
if not ok:
    print({t: (k["verdict"], k.get("why", "")[:200], str(k.get("diagnosis", ""))[:200]) for t, k in c.items()})
sys.exit(0 if ok else 1)
P
}

for g in moe.fp8 moe.nvfp4; do
  run $g 0
  verdicts $g '{"quantizer/w1", "quantizer/w2", "saved/fc1_out", "y", "d_x", "d_w1", "d_w2", "d_topk_weights"} <= set(c) and not failed'
done
# a report is judged again when read back: the per-expert bytes checks pass and fail on their word
expect_exit 0 "report re-judges moe.fp8's report" "$QATCHECK" report --allow-incomplete "$T/moe.fp8.r.json"
run defect.stale_scale 1
expect_exit 1 "report re-judges defect.stale_scale's report" "$QATCHECK" report --allow-incomplete "$T/defect.stale_scale.r.json"
verdicts defect.stale_scale '"quantizer/w1" in failed and c["quantizer/w1"]["why"].startswith("expert 4:") and "quantizer/w2" not in failed'
run defect.dx_master 1
verdicts defect.dx_master 'failed == {"d_x", "d_w1"} and "dx_master_expert" in str(c["d_x"]) and "expert 2 " in c["d_x"]["diagnosis"]["summary"]'
run defect.dx_master_all 1
verdicts defect.dx_master_all 'failed == {"d_x", "d_w1"} and "dx_weight = dequant for every expert" in c["d_x"]["diagnosis"]["summary"]'
for g in defect.empty_grad defect.empty_grad_bf16; do
  run $g 1
  verdicts $g 'failed == {"d_w1"} and c["d_w1"]["why"].startswith("expert 3 has no token")'
done
run defect.fc1_master 1
verdicts defect.fc1_master 'failed == {"saved/fc1_out"}'

# expert parallel over 2 ranks (data-parallel tokens; rank 1 holds experts 3..5 by their global ids):
# the bytes are checked on the assembled whole and named by global expert id, the empty
# expert's exact zeros on the rank whose piece holds it
ep() {
  cat >"$T/e.json" <<J
{"data": {"dump": "ep/step.rank*.h5", "modules": "^/$1\$"}, "candidate": "dump", "tolerances": $TOL}
J
  expect_exit "$2" "expert-parallel moe $1 exits $2" "$QATCHECK" vjp --case "$T/e.json" --json "$T/$1.r.json"
}
ep ep 0
verdicts ep '{"quantizer/w1", "quantizer/w2", "d_w1@rank0", "d_w1@rank1", "d_x@rank1"} <= set(c) and not failed'
ep ep_stale 1
verdicts ep_stale 'c["quantizer/w1"]["why"].startswith("expert 4:") and "1 of 6 experts differ (4)" in c["quantizer/w1"]["why"] and "quantizer/w2" not in failed and "d_w1@rank0" not in failed'
ep ep_empty 1
verdicts ep_empty 'failed == {"d_w1@rank1"} and c["d_w1@rank1"]["why"].startswith("expert 3 has no token")'

# bad input: bytes without a format, scales without their bytes, fc1_out misshapen, a payload not one per expert,
# a NaN in expert 4's master (its bytes' check runs on a worker thread: its message must reach the one error line)
$PY - "$T/d.h5" <<'P' || exit 1
import json, sys
import h5py
with h5py.File(sys.argv[1], "a") as f:
    for name in ("no_format", "scale_alone", "fc1_shape", "q_experts", "nan_master"):
        f.copy("moe.fp8", "bad." + name)
    g = f["bad.no_format"]; c = json.loads(g.attrs["contract"]); c["expert_weight_format"] = "none"; g.attrs["contract"] = json.dumps(c)
    del f["bad.scale_alone/saved/w2_q"]
    h = f["bad.fc1_shape/saved/fc1_out"][...]; del f["bad.fc1_shape/saved/fc1_out"]; f["bad.fc1_shape/saved/fc1_out"] = h[:, :1]
    q = f["bad.q_experts/saved/w1_q"]; a = q[...]; dt = q.attrs["dtype"]; del f["bad.q_experts/saved/w1_q"]
    f["bad.q_experts/saved/w1_q"] = a[:-1]; f["bad.q_experts/saved/w1_q"].attrs["dtype"] = dt
    w = f["bad.nan_master/params/w1"]; a = w[...]; a[4, 1, 2] = 0x7fc0 if a.dtype.kind == "u" else float("nan"); w[...] = a  # bf16 bits or a float  # expert 4's bytes are checked on a worker thread
P
expect_refused_groups moe d.h5 "$TOL" <<EOF2
no_format saved/w1_q
scale_alone saved/w2_scale_inv
fc1_shape saved/fc1_out
q_experts saved/w1_q
nan_master expert 4 of w1
EOF2

# the builtin production (grouped GEMMs on the dequantized experts, bf16 operands) against the
# reference on generated experts, every format pair judged by derived tolerances; dx_weight master too
for fmts in fp8_block128:fp8_group128:dequant nvfp4:none:dequant mxfp8:fp8_token:master; do
  wf=${fmts%%:*}; rest=${fmts#*:}; af=${rest%%:*}; dxw=${rest#*:}
  cat >"$T/gen.json" <<J
{"module": "moe", "contract": {"activation": "swiglu", "limit": 7, "expert_weight_format": "$wf", "expert_act_format": "$af", "dx_weight": "$dxw"},
 "data": {"generate": {"shapes": [[48, 256, 128, 9, 4]], "seed": 1}}, "candidate": "builtin", "dy": ["random", "sparse"], "tolerances": $TOL}
J
  expect_exit 0 "builtin moe with $wf experts, $af activations, dx_weight $dxw" "$QATCHECK" vjp --case "$T/gen.json" --quiet
done
# finite differences do not validate a straight-through estimator: refused under expert formats
expect_exit 2 "fd refuses quantized experts" "$QATCHECK" fd --module moe --set expert_weight_format=fp8_block128
grep -q "straight-through" "$T/err" && ok "fd says why" || bad "fd: $(cat "$T/err")"

"$QATCHECK" classes --json >"$T/classes.json" || bad "classes --json"
$PY - "$T/classes.json" <<'P' && ok "classes --json: moe's quantization contract" || bad "classes --json: moe lacks its quantization keys"
import json, sys
moe = [c for c in json.load(open(sys.argv[1]))["classes"] if c["name"] == "moe"][0]
keys = {k["key"]: k for k in moe["keys"]}
need = {"expert_weight_format": "fp8_block128", "expert_act_format": "fp8_group128", "dx_weight": "master", "profile": "vllm"}
sys.exit(0 if all(k in keys and v in keys[k]["values"] for k, v in need.items()) and "fc1_out" in moe["saved"] and "w1_q" in moe["saved"] else 1)
P
finish
