#!/bin/sh
# class_cases.sh: every shipped case of the classes beyond linear passes with
# the builtin candidate (exit 0), and its report says pass.
. "$(dirname "$0")/lib.inc"
n=0
for f in cases/rmsnorm.json cases/layernorm.json cases/rope*.json cases/swiglu*.json cases/relu2.json \
         cases/gelu.json cases/logprob*.json cases/router*.json cases/attention*.json cases/moe*.json \
         cases/ssd*.json cases/conv1d.json; do
  n=$((n+1))
  expect_exit 0 "$f passes" "$QATCHECK" vjp --case "$f" --quiet --json "$T/r.json"
  "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["verdict"] == "pass" and r["checks"] else 1)' "$T/r.json" \
    || bad "$f: report verdict is not pass"
done
[ "$n" -ge 20 ] || bad "expected at least 20 class cases, found $n"
# bad input: a contract the class refuses exits 2 and writes no passing report
# (tolerances for the class's own gradients: a name it lacks is refused first)
tols() {
  case "$1" in
    logprob|router) g="d_logits" ;; swiglu) g="d_gate d_up" ;; attention) g="d_q d_k d_v" ;;
    moe) g="d_x d_w1 d_w2 d_topk_weights" ;; ssd) g="d_x d_dt d_A d_Bm d_Cm d_initial_state" ;;
    conv1d) g="d_x d_weight d_bias" ;; *) g="d_x" ;;
  esac
  sep=""
  for t in $g; do printf '%s"%s": {"rel_l2": 1e-4, "reasoning": "r"}' "$sep" "$t"; sep=", "; done
}
while read -r cls shape contract needle; do
  cat >"$T/bad.json" <<J
{"module": "$cls", "contract": $contract, "data": {"generate": {"shapes": [$shape], "seed": 0}},
 "tolerances": {$(tols "$cls")}}
J
  rm -f "$T/bad.r.json"
  expect_exit 2 "$cls with $contract is refused" "$QATCHECK" vjp --case "$T/bad.json" --json "$T/bad.r.json"
  grep -q "$needle" "$T/err" || bad "$cls: the message does not name '$needle': $(cat "$T/err")"
  error_or_none "$T/bad.r.json" || bad "$cls: a refused run wrote a report other than its error report"
done <<EOF2
rope [4,2,8] {"rotary_dim":5} rotary_dim
logprob [2,6,10] {"vocab_shards":3} vocab_shards
router [4,8,3] {"score":"relu"} score
swiglu [4,6] {"limit":-1} limit
attention [1,4,2,5,8] {"lse_base":"10"} lse_base
attention [1,4,2,5,8] {"lse_base":2} lse_base
attention [1,4,2,5,8] {"causal":"yes"} causal
attention [1,4,2,5,8] {"softmax_scale":-1} softmax_scale
attention [1,4,3,5,8] {} Hkv
attention [1,4,2,5] {} B,
moe [4,8,4,3,2] {"activation":"gelu"} activation
moe [4,8,4,3,2] {"activation":"relu2","limit":7} limit
ssd [2,10,3,4,5] {"chunk_size":0} chunk_size
ssd [2,10,3,4,5] {"chunk_size":2.5} chunk_size
ssd [2,10,3,4,5] {"initial_state":"yes"} initial_state
ssd [2,10,3,4,5] {"chunk":64} chunk
ssd [2,10,3,4,5] {"D_skip":true} D_skip
ssd [2,10,3,4] {} state size
conv1d [2,10,4,3] {"kernel":4} kernel
conv1d [2,10,4] {} kernel width
EOF2
finish
