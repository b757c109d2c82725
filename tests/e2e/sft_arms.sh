#!/bin/sh
# sft_arms.sh: layer 3 needs the method's three arms (under_test,
# gradient_reference, native_baseline) and every controlled variable
# recorded (docs/layer3.md, "Verdicts"). On logs that agree exactly:
#   - three arms, configs recording every controlled variable (null where
#     it does not apply): pass, exit 0;
#   - a two-arm case (no native_baseline): its pair is inconclusive, exit 1,
#     the reason names the missing arm, the JSON lists it in missing_arms;
#   - configs that record none of the controlled variables (only loss is
#     checked): inconclusive, exit 1, naming the arms;
#   - one arm missing two of them: inconclusive, naming the arm and both
#     keys; an arm's missing key is not also called a difference;
#   - a real deviation stays "deviates" even in a two-arm case.
# Every report names the qatcheck source commit (JSON, Markdown, JUnit).
. "$(dirname "$0")/lib.inc"
json_is() { $PY -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1" 2>/dev/null || bad "$1: not ($2)"; }
$PY - "$T" <<'P' || { bad "writing the logs"; finish; }
import json, math, os, sys
d = sys.argv[1]
loss = {s: 2.0 * math.exp(-s / 17) + 0.3 for s in range(1, 41)}
open(os.path.join(d, "m.jsonl"), "w").write("".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in loss.items()))
open(os.path.join(d, "off.jsonl"), "w").write("".join(json.dumps({"step": s, "loss": v * 1.5}) + "\n" for s, v in loss.items()))
full = {"init_weights": "sha256:0", "optimizer_state": "fresh", "data": "synthetic", "data_order": 1, "labels_mask": "all",
        "packing": False, "loss_normalization": "mean", "global_batch": 8, "grad_accumulation": 1, "lr": 1e-4,
        "lr_schedule": "constant", "clipping": None, "precision": "bf16", "loss_scaling": None, "seed": 1, "recompute": "none"}
json.dump(full, open(os.path.join(d, "full.json"), "w"))
json.dump({"run_name": "x", "notes": "records no controlled variable"}, open(os.path.join(d, "none.json"), "w"))
part = dict(full)
del part["lr"], part["seed"]
json.dump(part, open(os.path.join(d, "part.json"), "w"))
P
# mk FILE CFG_UT CFG_OTHERS NB(0/1) [LOG_UT]
mk() {
  nb=""
  [ "$4" = 1 ] && nb=", \"native_baseline\": {\"log\": \"m.jsonl\", \"config\": \"$3\"}"
  cat >"$T/$1.case" <<J
{"arms": {"under_test": {"log": "${5:-m.jsonl}", "config": "$2"}, "gradient_reference": {"log": "m.jsonl", "config": "$3"}$nb},
 "window": [1, 40],
 "pairs": {"under_test~gradient_reference": {"loss": {"pointwise_rel": 1e-6, "reasoning": "the same loss logged twice"}}}}
J
}
mk three.json full.json full.json 1
expect_exit 0 "three arms, every controlled variable recorded: pass" "$QATCHECK" sft --case "$T/three.json.case" --json "$T/three.r.json" \
  --markdown "$T/three.md" --junit "$T/three.xml"
json_is "$T/three.r.json" "r['conclusion'] == 'pass' and r['missing_arms'] == [] and r['pairs'][0]['reasons'] == []"
json_is "$T/three.r.json" "len(r['source_commit']) > 0 and r['source_commit'] != ''"
grep -q "^- qatcheck [0-9.]*, source commit \`[^\`]*\`" "$T/three.md" && ok "the Markdown names the source commit" || bad "markdown: $(head -8 "$T/three.md")"
grep -q '<property name="qatcheck.source_commit" value="[^"]' "$T/three.xml" && ok "the JUnit names the source commit" || bad "junit: $(head -4 "$T/three.xml")"

mk two.json full.json full.json 0
expect_exit 1 "a two-arm case (no native_baseline) is inconclusive" "$QATCHECK" sft --case "$T/two.json.case" --json "$T/two.r.json"
json_is "$T/two.r.json" "r['conclusion'] == 'inconclusive' and r['pairs'][0]['verdict'] == 'inconclusive' and r['missing_arms'] == ['native_baseline']"
json_is "$T/two.r.json" "'no native_baseline arm' in r['pairs'][0]['reasons'][0] and all(m['verdict'] == 'pass' for m in r['pairs'][0]['metrics'])"
grep -q "no native_baseline arm" "$T/out" && ok "the console says which arm is missing" || bad "console: $(cat "$T/out")"

mk none.json none.json none.json 1
expect_exit 1 "arms whose configs record no controlled variable, checking only loss: inconclusive" "$QATCHECK" sft --case "$T/none.json.case" --json "$T/none.r.json"
json_is "$T/none.r.json" "r['pairs'][0]['verdict'] == 'inconclusive' and \"arm 'under_test' records none of the controlled variables\" in r['pairs'][0]['reasons'][0] and \"arm 'gradient_reference' records none\" in r['pairs'][0]['reasons'][0]"

mk part.json part.json full.json 1
expect_exit 1 "an arm missing lr and seed: inconclusive" "$QATCHECK" sft --case "$T/part.json.case" --json "$T/part.r.json"
json_is "$T/part.r.json" "r['pairs'][0]['verdict'] == 'inconclusive' and \"arm 'under_test' records no value of controlled variable(s) lr, seed\" in r['pairs'][0]['reasons'][0] and 'differs' not in r['pairs'][0]['reasons'][0] and r['pairs'][0]['undeclared_differences'] == []"

mk dev.json full.json full.json 0 off.jsonl
expect_exit 1 "a real deviation in a two-arm case still deviates" "$QATCHECK" sft --case "$T/dev.json.case" --json "$T/dev.r.json"
json_is "$T/dev.r.json" "r['pairs'][0]['verdict'] == 'deviates' and r['pairs'][0]['localization'] == 'forward'"
finish
