#!/bin/sh
# class_dump.sh: the classes beyond linear work from a dump (spec schema):
# a trainer's float32 gradients (scripts/make_class_dump.py) pass, and each
# planted defect fails on its own tensor while its correct sibling passes;
# all eight groups in one run, read 0 to 3 ahead, give the same checks, and
# a NaN in the last group's dY is the same one error line however far ahead
# it is read.
. "$(dirname "$0")/lib.inc"
$PY scripts/make_class_dump.py "$T/d.h5" || exit 1
# class  good-module  defect-group  failing-tensor  tolerances; ALL and TOLS
# gather the groups and each class's tolerances for the run of all of them
ALL=""; TOLS=""
while read -r cls good defect tensor tol; do
  ALL="$ALL${ALL:+|}$good|/defect\\\\.$defect"
  TOLS="$TOLS${TOLS:+, }\"$cls\": $tol"
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
# the same eight groups in one run, read 0, 1, 2 and 3 ahead (vjp reads 1
# ahead on the CPU, 2 on a device): the same checks and verdicts, exit 1
cat >"$T/ahead.json" <<J
{"data": {"dump": "d.h5", "modules": "^($ALL)\$"}, "candidate": "dump", "tolerances": {$TOLS}}
J
for a in 0 1 2 3; do
  expect_exit 1 "eight groups read $a ahead: the four defects fail" env QATCHECK_AHEAD=$a "$QATCHECK" vjp --case "$T/ahead.json" --json "$T/ahead$a.r.json"
done
$PY - "$T"/ahead0.r.json "$T"/ahead1.r.json "$T"/ahead2.r.json "$T"/ahead3.r.json <<'P' || bad "the reports differ with the read-ahead"
import json, sys
rs = [json.load(open(p))["checks"] for p in sys.argv[1:]]
assert len({len(r) for r in rs}) == 1 and len(rs[0]) >= 8, [len(r) for r in rs]
assert all(r == rs[0] for r in rs[1:]), "checks differ"
mods = {c["module"] for c in rs[0]}
assert len(mods) == 8, mods
assert {c["module"] for c in rs[0] if c["verdict"] == "fail"} == {m for m in mods if m.startswith("/defect.")}
print("read 0 to 3 ahead:", len(rs[0]), "checks, identical; the four defects fail")
P
# a non-finite dY in the last group, read while earlier ones are audited:
# the same one line and only the error report, however far ahead it is read
cp "$T/d.h5" "$T/nan.h5"
$PY -c "
import h5py, sys  # dY in bfloat16 (uint16): 0x7FC0 is a NaN
with h5py.File(sys.argv[1], 'r+') as f:
    d = f['model.lm_head.logprob/grad_out/dy']; a = d[...]; a.flat[3] = 0x7FC0; d[...] = a" "$T/nan.h5" || bad "could not plant the NaN"
sed 's/"d\.h5"/"nan.h5"/' "$T/ahead.json" >"$T/nan.json"
for a in 0 1 2; do
  rm -f "$T/nan$a.r.json"
  expect_exit 2 "a non-finite dY read $a ahead" env QATCHECK_AHEAD=$a "$QATCHECK" vjp --case "$T/nan.json" --json "$T/nan$a.r.json"
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep -q "model.lm_head.logprob.*grad_out/dy.*non-finite" "$T/err" ||
    bad "read $a ahead: not one line naming the group's grad_out/dy: $(cat "$T/err")"
  error_or_none "$T/nan$a.r.json" || bad "read $a ahead: a report other than the error report"
done

# attention: an LSE saved in log2 under lse_base "e" spoils every gradient the
# saved LSE feeds: the trainer's own (dump) and the builtin flash backward
# (which reads the saved LSE) both fail on d_q, d_k and d_v; the correct
# sibling passes; the saved LSE itself fails against the LSE recomputed from
# q and k in the contract's base (saved/lse), the correct sibling's passes;
# a group without saved/lse cannot be judged (exit 2)
ATOL='{"d_q":{"rel_l2":1e-5,"reasoning":"fp32 flash backward"},"d_k":{"rel_l2":1e-5,"reasoning":"fp32 flash backward"},"d_v":{"rel_l2":1e-5,"reasoning":"fp32 flash backward"}}'
for cand in dump builtin; do
  cat >"$T/att.json" <<J
{"module": "attention", "data": {"dump": "d.h5", "modules": "^(/model\\\\.layers\\\\.0\\\\.self_attn\\\\.sdpa|/defect\\\\.attention_lse_log2)\$"}, "candidate": "$cand", "tolerances": $ATOL}
J
  expect_exit 1 "attention ($cand): dump with an LSE saved in log2 fails" "$QATCHECK" vjp --case "$T/att.json" --json "$T/att.r.json"
  $PY - "$T/att.r.json" <<'P' || bad "attention ($cand): report does not fail exactly /defect.attention_lse_log2 on d_q, d_k, d_v"
import json, sys
r = json.load(open(sys.argv[1]))
failed = {(c["module"], c["tensor"]) for c in r["checks"] if c["verdict"] == "fail"}
assert failed == {("/defect.attention_lse_log2", t) for t in ("d_q", "d_k", "d_v", "saved/lse")}, failed
good = [c for c in r["checks"] if c["module"] == "/model.layers.0.self_attn.sdpa"]
assert len(good) == 5 and all(c["verdict"] == "pass" for c in good), good
print("defect /defect.attention_lse_log2 fails on d_q, d_k, d_v; the correct module passes")
P
done
cat >"$T/att.json" <<J
{"module": "attention", "data": {"dump": "d.h5", "modules": "^/bad\\\\.attention_no_lse\$"}, "candidate": "builtin", "tolerances": $ATOL}
J
rm -f "$T/att.r.json"
expect_exit 2 "attention: a group without saved/lse is refused" "$QATCHECK" vjp --case "$T/att.json" --json "$T/att.r.json"
[ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep -q "saved/lse" "$T/err" || bad "attention: the message does not name saved/lse: $(cat "$T/err")"
error_or_none "$T/att.r.json" || bad "attention: a refused run wrote a report other than its error report"
finish
