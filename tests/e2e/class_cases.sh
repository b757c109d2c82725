#!/bin/sh
# class_cases.sh: every class of the class table (`qatcheck classes --json`)
# has a shipped case (cases/*.json whose "module" is the class), and every
# shipped case of the classes beyond linear (whose large shapes run in
# linear_defects, quant_cases and gpu_vjp) passes with the builtin
# candidate (exit 0), its report saying pass. A class added to the table
# gets this without editing this file.
. "$(dirname "$0")/lib.inc"
"$QATCHECK" classes --json >"$T/classes.json" || { bad "qatcheck classes --json"; finish; }
# "CLASS CASE" per shipped case; "CLASS -" for a class without one
$PY - "$T/classes.json" cases/*.json >"$T/cases.txt" <<'P' || { bad "cannot list the cases"; finish; }
import json, sys
names = [c["name"] for c in json.load(open(sys.argv[1]))["classes"]]
by = {}
for f in sys.argv[2:]:
    by.setdefault(json.load(open(f)).get("module"), []).append(f)
for n in names:
    for f in by.get(n) or ["-"]:
        print(n, f)
P
n=0
while read -r cls f; do
  [ "$f" = - ] && { bad "class $cls has no shipped case (cases/*.json with \"module\": \"$cls\")"; continue; }
  [ "$cls" = linear ] && continue
  n=$((n+1))
  expect_exit 0 "$f passes" "$QATCHECK" vjp --case "$f" --quiet --json "$T/r.json"
  "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["verdict"] == "pass" and r["checks"] else 1)' "$T/r.json" \
    || bad "$f: report verdict is not pass"
done <"$T/cases.txt"
[ "$n" -ge 20 ] || bad "expected at least 20 class cases, found $n"
# bad input: a contract the class refuses exits 2 and writes no passing report
# (tolerances for the class's own gradients, as the class table lists them:
# a name it lacks is refused first)
tols() {
  "$PY" - "$T/classes.json" "$1" <<'P'
import json, sys
c = [c for c in json.load(open(sys.argv[1]))["classes"] if c["name"] == sys.argv[2]][0]
print(", ".join('"%s": {"rel_l2": 1e-4, "reasoning": "r"}' % g for g in c["grads"]))
P
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
