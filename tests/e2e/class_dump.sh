#!/bin/sh
# class_dump.sh: the classes beyond linear work from a dump (spec schema):
# a trainer's float32 gradients (scripts/make_class_dump.py) pass, and each
# planted defect fails on its own tensor while its correct sibling passes.
. "$(dirname "$0")/lib.inc"
$PY scripts/make_class_dump.py "$T/d.h5" || exit 1
# class  good-module  defect-group  failing-tensor  tolerances
while read -r cls good defect tensor tol; do
  cat >"$T/$cls.json" <<J
{"module": "$cls", "data": {"dump": "d.h5", "modules": "^($good|/defect\\\\.$defect)\$"}, "candidate": "dump", "tolerances": $tol}
J
  expect_exit 1 "$cls: dump with defect $defect fails" "$QATCHECK" vjp --case "$T/$cls.json" --json "$T/$cls.r.json"
  $PY - "$T/$cls.r.json" "/defect.$defect" "$tensor" "$good" <<'P' || bad "$cls: report does not fail exactly /defect.$defect on $tensor"
import json, sys
r = json.load(open(sys.argv[1]))
failed = {(c["module"], c["tensor"]) for c in r["checks"] if c["verdict"] == "fail"}
good = [c for c in r["checks"] if c["module"] == sys.argv[4]]
assert failed == {(sys.argv[2], sys.argv[3])}, failed
assert good and all(c["verdict"] == "pass" for c in good), good
print("defect", sys.argv[2], "fails on", sys.argv[3], "only; the correct module passes")
P
done <<EOF2
rmsnorm /model.layers.0.input_layernorm rmsnorm_no_mean d_x {"d_x":{"rel_l2":2e-5,"reasoning":"fp32 statistics"},"d_weight":{"rel_l2":2e-5,"reasoning":"fp32 sums"}}
swiglu /model.layers.0.mlp.act swiglu_clamp_pass d_up {"d_gate":{"rel_l2":1e-6,"reasoning":"elementwise fp32"},"d_up":{"rel_l2":1e-6,"reasoning":"elementwise fp32"}}
logprob /model.lm_head.logprob logprob_count d_logits {"d_logits":{"rel_l2":5e-5,"reasoning":"fp32 log-sum-exp"}}
router /model.layers.0.mlp.router router_ids d_logits {"d_logits":{"rel_l2":2e-6,"reasoning":"fp32 scores"}}
EOF2
finish
