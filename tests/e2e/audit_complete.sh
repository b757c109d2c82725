#!/bin/sh
# audit_complete.sh: `qatcheck report` says whether the audit is whole
# (docs/audit.md, "A whole audit"). The method runs 1 -> 2 -> 3: layer 1
# (vjp) with the one-step update (step), layer 3 (sft) comparing under_test
# with gradient_reference and native_baseline, and layer 2 (contract)
# whenever an audited module quantizes, each of its formats measured.
#   - a layer-1-only audit of passing reports: INCOMPLETE, exit 1, each
#     missing layer named with why; --allow-incomplete: exit 0, still
#     INCOMPLETE;
#   - an nvfp4 linear with vjp, step and sft but no contract: layer 2
#     missing; with dX from the master weight the reason says so;
#   - a contract report of fp8_block128 only: nvfp4 is measured by none;
#   - with the nvfp4 contract report: complete, pass, exit 0;
#   - an unquantized linear (dx_weight master on a bf16 weight): layer 2
#     not required, pass without it;
#   - a two-arm sft report: layer 3 has no under_test~native_baseline pair.
# Every form of the audit names the qatcheck source commit.
. "$(dirname "$0")/lib.inc"
json_is() { $PY -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1" 2>/dev/null || bad "$1: not ($2)"; }
# small linears: nvfp4 (dequant dX), nvfp4 with dX from the master weight, bf16
$PY - "$T" <<'P' || { bad "writing the cases and logs"; finish; }
import json, math, os, sys
d = sys.argv[1]
c = json.load(open("cases/linear_nvfp4.json"))
c["data"]["generate"]["shapes"] = [[33, 256, 96]]
c["name"] = "nvfp4_small"
json.dump(c, open(os.path.join(d, "q.json"), "w"))
c["contract"]["dx_weight"] = "master"
c["name"] = "nvfp4_master"
json.dump(c, open(os.path.join(d, "qm.json"), "w"))
loss = {s: 2.0 * math.exp(-s / 17) + 0.3 for s in range(1, 41)}
open(os.path.join(d, "m.jsonl"), "w").write("".join(json.dumps({"step": s, "loss": v}) + "\n" for s, v in loss.items()))
json.dump({"init_weights": "sha256:0", "optimizer_state": "fresh", "data": "synthetic", "data_order": 1, "labels_mask": "all",
           "packing": False, "loss_normalization": "mean", "global_batch": 8, "grad_accumulation": 1, "lr": 1e-4,
           "lr_schedule": "constant", "clipping": None, "precision": "bf16", "loss_scaling": None, "seed": 1, "recompute": "none"},
          open(os.path.join(d, "cfg.json"), "w"))
chk = {"loss": {"pointwise_rel": 1e-6, "reasoning": "the same loss logged twice"}}
arm = {"log": "m.jsonl", "config": "cfg.json"}
json.dump({"arms": {"under_test": arm, "gradient_reference": arm, "native_baseline": arm}, "window": [1, 40],
           "pairs": {"under_test~gradient_reference": chk, "under_test~native_baseline": chk}}, open(os.path.join(d, "sft3.json"), "w"))
json.dump({"arms": {"under_test": arm, "gradient_reference": arm}, "window": [1, 40],
           "pairs": {"under_test~gradient_reference": chk}}, open(os.path.join(d, "sft2.json"), "w"))
# a passing step report: the hand-written fixture without its failed check
r = json.load(open("tests/data/reports/step.json"))
r["checks"] = [k for k in r["checks"] if k["verdict"] == "pass"]
r["verdict"] = "pass"
r["totals"] = dict(r["totals"], checks=len(r["checks"]), passed=len(r["checks"]), failed=0)
json.dump(r, open(os.path.join(d, "st.json"), "w"))
P
"$QATCHECK" vjp --case "$T/q.json" --json "$T/v_q.json" --quiet || bad "vjp nvfp4"
"$QATCHECK" vjp --case "$T/qm.json" --json "$T/v_qm.json" --quiet || bad "vjp nvfp4, dX from the master weight"
"$QATCHECK" vjp --case cases/linear_bf16.json --json "$T/v_bf.json" --quiet || bad "vjp bf16"
"$QATCHECK" sft --case "$T/sft3.json" --json "$T/s3.json" --quiet || bad "sft, three arms"
"$QATCHECK" sft --case "$T/sft2.json" --json "$T/s2.json" --quiet; [ $? -eq 1 ] || bad "sft, two arms: inconclusive"
"$QATCHECK" contract --master-vs-dequant --dump cases/data/contract_ckpt.h5 --weight-format nvfp4 --json "$T/c.json" --quiet || bad "contract nvfp4"
"$QATCHECK" contract --master-vs-dequant --dump cases/data/contract_ckpt.h5 --weight-format fp8_block128 --json "$T/c8.json" --quiet || bad "contract fp8"
missing() { json_is "$1" "[m['layer'] for m in r['missing']] == $2"; }

expect_exit 1 "layer 1 only: incomplete, exit 1" "$QATCHECK" report "$T/v_q.json" --json "$T/a1.json" --markdown "$T/a1.md" --html "$T/a1.html" --junit "$T/a1.xml"
grep -q "^report: INCOMPLETE: 1 report(s); layer 1 (vjp): .* (pass); layer 2 (contract): missing; layer 3 (sft): missing; one-step (step): missing; incomplete: 3 requirement" "$T/out" \
  && ok "the console says incomplete and which layers are missing" || bad "console: $(cat "$T/out")"
json_is "$T/a1.json" "r['audit'] == 'INCOMPLETE' and r['verdict'] == 'fail' and r['complete'] is False and r['layers']['contract']['verdict'] == 'missing' and r['layers']['sft']['verdict'] == 'missing'"
missing "$T/a1.json" '["one-step", "layer 2", "layer 3"]'
json_is "$T/a1.json" "'quantizes (weight_format nvfp4' in r['missing'][1]['why'] and 'three arms' in r['missing'][2]['why']"
$PY - "$T/a1.md" "$T/a1.html" "$T/a1.xml" "$T/a1.json" <<'P' && ok "every form of the audit says incomplete and names the source commit" || bad "audit forms"
import json, sys, xml.etree.ElementTree as ET
md, html = open(sys.argv[1]).read(), open(sys.argv[2]).read()
commit = json.load(open(sys.argv[4]))["source_commit"]
assert commit and md.startswith("# qatcheck audit: INCOMPLETE"), md[:80]
assert "**Completeness: ****incomplete**" in md and "- **layer 3**: no sft report" in md, md[:2000]
assert ("source commit `%s`" % commit) in md and ("source commit <code>%s</code>" % commit) in html
x = ET.parse(sys.argv[3]).getroot()
props = {p.get("name"): p.get("value") for p in x.iter("property")}
assert props.get("qatcheck.source_commit") == commit, props
fails = [c.get("name") for c in x.iter("testcase") if c.find("failure") is not None]
assert fails == ["one-step", "layer 2", "layer 3"], fails
P
expect_exit 0 "--allow-incomplete accepts it (exit 0)" "$QATCHECK" report "$T/v_q.json" --allow-incomplete --json "$T/a1b.json"
grep -q "^report: INCOMPLETE: .*(accepted by --allow-incomplete)" "$T/out" && ok "and still says incomplete" || bad "console: $(cat "$T/out")"
json_is "$T/a1b.json" "r['audit'] == 'INCOMPLETE' and r['verdict'] == 'pass' and r['complete'] is False and r['allow_incomplete'] is True"

expect_exit 1 "nvfp4 without a contract report: layer 2 missing" "$QATCHECK" report "$T/v_q.json" "$T/st.json" "$T/s3.json" --json "$T/a2.json"
missing "$T/a2.json" '["layer 2"]'
expect_exit 1 "dX from the master weight without a contract report" "$QATCHECK" report "$T/v_qm.json" "$T/st.json" "$T/s3.json" --json "$T/a3.json"
json_is "$T/a3.json" "len(r['missing']) == 1 and 'takes dX from the master weight' in r['missing'][0]['why'] and 'mandatory' in r['missing'][0]['why']"
expect_exit 1 "a contract report of another format: nvfp4 measured by none" "$QATCHECK" report "$T/v_q.json" "$T/st.json" "$T/s3.json" "$T/c8.json" --json "$T/a4.json"
json_is "$T/a4.json" "len(r['missing']) == 1 and r['missing'][0]['why'].startswith('weight format nvfp4 ') and r['layers']['contract']['verdict'] == 'incomplete'"
expect_exit 0 "every layer: complete, pass" "$QATCHECK" report "$T/v_q.json" "$T/st.json" "$T/s3.json" "$T/c.json" --json "$T/a5.json" --markdown "$T/a5.md"
json_is "$T/a5.json" "r['audit'] == 'pass' and r['complete'] is True and r['missing'] == [] and r['layer2_required'] is True"
grep -q "^\*\*Completeness: \*\*complete: " "$T/a5.md" && ok "the document says complete" || bad "a5.md: $(grep -i complete "$T/a5.md" | head -3)"
expect_exit 0 "an unquantized linear: layer 2 not required" "$QATCHECK" report "$T/v_bf.json" "$T/st.json" "$T/s3.json" --json "$T/a6.json"
json_is "$T/a6.json" "r['complete'] is True and r['layer2_required'] is False and r['layers']['contract']['verdict'] == 'not required'"
expect_exit 1 "a two-arm sft report" "$QATCHECK" report "$T/v_bf.json" "$T/st.json" "$T/s2.json" --json "$T/a7.json"
json_is "$T/a7.json" "r['audit'] == 'FAIL' and [m['layer'] for m in r['missing']] == ['layer 3'] and 'no under_test~native_baseline pair' in r['missing'][0]['why']"
finish
