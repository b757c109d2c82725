#!/bin/sh
# router_select.sh: saved/topk_ids judged against the selection the
# contract defines (docs/classes.md, router; tests/e2e/router_select.py
# writes the dumps with torch). A noaux_tc router (sigmoid + correction
# bias, 8 groups, 4 kept, top-8, route scale 2.5) whose ids are the
# contract's passes, with its near-tie (token 0's 8th and 9th keys within
# one float32 ulp) counted as ambiguous; its ids selected without the bias,
# or without the group limit, fail on saved/topk_ids alone (exit 1),
# naming how many tokens differ and the first; the near-tied pair swapped
# passes; an exact tie (two equal logits at the 8th place) saved the higher
# index passes under tie_break "any" (the default) and fails under
# "lowest_index"; softmax and sqrt_softplus routers pass. A normalized
# top-1 router (its weight 1 whatever the logit: d_logits cancels) passes
# on the terms' scale, where its relative tolerance once carried no digits
# (exit 2); with the normalization left out of its backward it fails on
# d_logits. A router whose selected scores sit near 1 (logits N(0, 25):
# float32's 1 - s rounds) passes. The bias is read
# under transformers' name (params/e_score_correction_bias) and as
# params/bias; scripts/qatdump.py dumps a router's bias buffer.
# `qatcheck classes --json` lists the check.
. "$(dirname "$0")/lib.inc"
$PY "$(dirname "$0")/router_select.py" "$T/d.h5" >"$T/gen" || { cat "$T/gen"; exit 1; }
cat "$T/gen"
# run GROUP [CONTRACT-OVERRIDE]: vjp on dump group /GROUP (candidate dump, derived tolerances) into $T/r.json
run() {
  ov=${2:+, \"contract\": $2}
  cat >"$T/c.json" <<J
{"data": {"dump": "d.h5", "modules": "^/$(echo "$1" | sed 's/[.]/[.]/')\$"}, "candidate": "dump", "tolerances": {"d_logits": {"derive": true}}$ov}
J
  rm -f "$T/r.json"
  "$QATCHECK" vjp --case "$T/c.json" --json "$T/r.json" >"$T/out" 2>"$T/err"
}
# verdicts GROUP WANT-TOPK [NEEDLE...]: the report has y, saved/topk_ids and d_logits;
# only topk_ids may fail, with WANT-TOPK; its why holds each NEEDLE
verdicts() {
  $PY - "$T/r.json" "$@" <<'P'
import json, sys
r = json.load(open(sys.argv[1]))
grp, want, needles = sys.argv[2], sys.argv[3], sys.argv[4:]
v = {c["tensor"]: c for c in r["checks"]}
assert set(v) == {"y", "saved/topk_ids", "d_logits"}, sorted(v)
k = v["saved/topk_ids"]
assert k["verdict"] == want and k.get("kind") == "selection", k
assert v["y"]["verdict"] == "pass" and v["d_logits"]["verdict"] == "pass", (v["y"], v["d_logits"])
for n in needles:
    assert n in k["why"], (n, k["why"])
print(grp, "saved/topk_ids", want + ":", k["why"])
P
}
for case in "noaux.correct pass 0 1 ambiguous" "noaux.neartie pass 0 1 ambiguous" \
            "noaux.nobias fail 1 61 of 64 tokens;the first: token 0 selects" \
            "noaux.nobias_pb fail 1 61 of 64 tokens" \
            "noaux.nogroup fail 1 57 of 64 tokens;in the best 4 of 8 groups" \
            "plain.twin pass 0 1 ambiguous;exact ties either way" \
            "plain.softmax pass 0 64 tokens as the contract selects" "plain.sqrtsp pass 0 64 tokens as the contract selects" \
            "plain.top1 pass 0 64 tokens as the contract selects" "plain.wide pass 0 64 tokens as the contract selects"; do
  set -- $case
  grp=$1 want=$2 code=$3; shift 3
  needles=$*
  run "$grp"; got=$?
  [ "$got" -eq "$code" ] && ok "$grp: exit $got" || { bad "$grp: exit $got, expected $code"; sed 's/^/      /' "$T/err" | head -3; }
  old_ifs=$IFS; IFS=';'; set -- $needles; IFS=$old_ifs
  verdicts "$grp" "$want" "$@" || bad "$grp: report"
done
run plain.top1_bad; got=$?
[ "$got" -eq 1 ] && ok "plain.top1_bad: exit 1" || { bad "plain.top1_bad: exit $got, expected 1"; sed 's/^/      /' "$T/err" | head -3; }
$PY -c "
import json, sys
v = {c['tensor']: c['verdict'] for c in json.load(open(sys.argv[1]))['checks']}
assert v == {'y': 'pass', 'saved/topk_ids': 'pass', 'd_logits': 'fail'}, v
" "$T/r.json" && ok "plain.top1_bad fails on d_logits alone" || bad "plain.top1_bad: report"
run plain.twin '{"tie_break": "lowest_index"}'; got=$?
[ "$got" -eq 1 ] && ok "plain.twin under tie_break lowest_index: exit 1" || bad "plain.twin lowest_index: exit $got, expected 1"
verdicts plain.twin fail "1 of 64 tokens" "token 0 selects [0, 1, 2, 3, 4, 5, 6, 40], the contract [0, 1, 2, 3, 4, 5, 6, 20]" \
  || bad "plain.twin lowest_index: report"
"$QATCHECK" report "$T/r.json" >/dev/null 2>"$T/err"; [ $? -le 1 ] && ! grep -q error: "$T/err" || bad "report re-judging refuses the selection check: $(cat "$T/err")"
# qatdump.py writes a router's bias buffer (transformers' e_score_correction_bias)
# as a frozen parameter: left out, the selection could not be judged (a correct
# noaux_tc router would fail on saved/topk_ids)
$PY "$(dirname "$0")/router_qatdump.py" "$T/q.h5" || bad "router_qatdump.py failed"
$PY -c "
import h5py, sys
b = h5py.File(sys.argv[1])['/root/params/e_score_correction_bias']
assert b.shape == (32,) and b.attrs['frozen'] == '1', dict(b.attrs)
" "$T/q.h5" && ok "qatdump.py dumps the router's bias buffer (frozen)" || bad "qatdump.py left the router's bias buffer out"
cat >"$T/q.json" <<J
{"data": {"dump": "q.h5", "modules": "^/root\$"}, "candidate": "dump", "tolerances": {"d_logits": {"derive": true}}}
J
expect_exit 0 "a qatdump'd noaux_tc router with its bias buffer passes" "$QATCHECK" vjp --case "$T/q.json" --json "$T/r.json"
verdicts root pass "40 tokens as the contract selects" "+ bias" || bad "qatdump'd router: report"
"$QATCHECK" classes --json | $PY -c "
import json, sys
c = {k['name']: k for k in json.load(sys.stdin)['classes']}
assert c['router']['selections'] == ['topk_ids'], c['router'].get('selections')
assert all(k['selections'] == [] for n, k in c.items() if n != 'router')
keys = {k['key']: k for k in c['router']['keys']}
assert keys['tie_break']['default'] == 'any' and keys['group_score']['default'] == 'auto', keys
" && ok "classes --json lists router's selection check" || bad "classes --json: no router selection check"
finish
