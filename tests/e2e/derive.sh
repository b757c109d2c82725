#!/bin/sh
# derive.sh: tolerances derived by qatcheck ({"derive": true}) from each
# class's error model, the shapes and the dtypes it loads. Every case in
# cases/ passes with derived tolerances (on its smaller shapes here; the
# full cases in docs/tolerances.md), the reasoning of each check is the
# derivation; a zero reference (attention d_q at one token) is judged by
# the derived max_abs with the relative bounds skipped, where a declared
# rel_l2 fails it; bad derive options exit 2 with one line and only their
# error report.
# The planted defects under derived tolerances: tests/e2e/diagnose.sh.
. "$(dirname "$0")/lib.inc"
$PY - "$T" <<'P' || exit 1
import glob, json, os, sys
T = sys.argv[1]
for f in sorted(glob.glob("cases/*.json")):
    c = json.load(open(f))
    c["tolerances"] = {t: {"derive": True} for t in c["tolerances"]}
    if "generate" in c["data"]:
        sh = [s for s in c["data"]["generate"]["shapes"] if eval("*".join(map(str, s))) <= 3e5]
        c["data"]["generate"]["shapes"] = sh or c["data"]["generate"]["shapes"][:1]
    else:
        c["data"]["dump"] = os.path.abspath(os.path.join("cases", c["data"]["dump"]))
    json.dump(c, open(os.path.join(T, "derived_" + os.path.basename(f)), "w"))
P
n=0
for f in "$T"/derived_*.json; do
  "$QATCHECK" vjp --case "$f" --json "$f.r" >"$T/out" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then bad "$(basename "$f"): derived tolerances: exit $rc"; grep -v " pass " "$T/out" | head -5; fi
  n=$((n + 1))
done
ok "$n cases of cases/ ran with derived tolerances"
$PY - "$T" <<'P' || bad "a derived tolerance's reasoning is not its derivation"
import glob, json, sys
for f in glob.glob(sys.argv[1] + "/derived_*.json.r"):
    for c in json.load(open(f))["checks"]:
        if c["tensor"] == "quantizer": continue
        t = c["tolerance"]
        assert t["reasoning"].startswith("derived: "), (f, t["reasoning"][:80])
        assert "rel_l2" in t or "max_abs" in t, (f, t)
print("every derived check carries its derivation")
P
# a zero reference: one key, so the exact d_q is 0; the trainer's float32
# flash backward leaves cancellation residue there
$PY - "$T/z.h5" <<'P' || exit 1
import json, sys
import h5py
import numpy as np
sys.path.insert(0, "scripts")
import bf16
from make_class_dump import attention_fwd, attention_vjp
rng = np.random.default_rng(4)
F = np.float32
q, k, v = (bf16.round_(rng.standard_normal(s).astype(F)) for s in ((1, 2, 1, 16), (1, 2, 1, 16), (1, 2, 1, 16)))
o64, lse64 = attention_fwd(q, k, v, 0.25, True)
o, lse = o64.astype(F), lse64.astype(F)
dy = bf16.round_(rng.standard_normal((1, 2, 1, 16)).astype(F))
g = attention_vjp(q, k, v, o, lse, dy, 0.25, True)
g["d_q"] = g["d_q"] + F(1e-7) * rng.standard_normal(g["d_q"].shape).astype(F)  # residue of size ~u |dS| |k|
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    m = f.create_group("attn")
    m.attrs["class"] = "attention"
    m.attrs["contract"] = json.dumps({"causal": True, "softmax_scale": 0.25})
    for n, t in (("q", q), ("k", k), ("v", v)):
        bf16.write(m.require_group("inputs"), n, t)
    m["saved/out"] = o
    m["saved/lse"] = lse
    bf16.write(m.require_group("grad_out"), "dy", dy)
    for n, t in g.items():
        m["grads/dy/" + n] = t
P
cat >"$T/z.json" <<J
{"data": {"dump": "z.h5"}, "candidate": "dump", "tolerances": {"d_q": {"derive": true}, "d_k": {"derive": true}, "d_v": {"derive": true}}}
J
expect_exit 0 "a zero reference passes on the derived max_abs" "$QATCHECK" vjp --case "$T/z.json" --json "$T/z.r.json"
$PY -c "
import json
c = [c for c in json.load(open('$T/z.r.json'))['checks'] if c['tensor'] == 'd_q'][0]
t = c['tolerance']
assert c['metrics']['max_abs'] > 0 and t['max_abs'] > c['metrics']['max_abs'] and 'rel_l2' not in t, c
assert 'exactly zero' in t['reasoning'] and 'skipped' in t['reasoning'], t['reasoning']
" && ok "the derivation states why the relative bounds are skipped" || bad "zero reference: no derived max_abs"
sed 's/"d_q": {"derive": true}/"d_q": {"rel_l2": 1e-5, "reasoning": "r"}/' "$T/z.json" >"$T/zr.json"
expect_exit 1 "the same zero reference fails a declared rel_l2" "$QATCHECK" vjp --case "$T/zr.json"
# bad derive options: one line, exit 2, only the error report
while read -r member needle; do
  echo "{\"data\": {\"dump\": \"z.h5\"}, \"candidate\": \"dump\", \"tolerances\": {\"d_q\": $member, \"d_k\": {\"derive\": true}, \"d_v\": {\"derive\": true}}}" >"$T/b.json"
  rm -f "$T/b.r.json"
  expect_exit 2 "refused: $member" "$QATCHECK" vjp --case "$T/b.json" --json "$T/b.r.json"
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep 'qatcheck: error:' "$T/err" | grep -q "$needle" \
    || bad "$member: expected one error line naming $needle: $(cat "$T/err")"
  error_or_none "$T/b.r.json" || bad "$member: a refused run wrote a report other than its error report"
done <<EOF
{"derive":true,"rel_l2":1e-3} 'rel_l2'
{"derive":true,"margin":0.5} 'margin'
{"derive":true,"rounded_operands":3} 'rounded_operands'
{"derive":true,"format":"fp9"} fp9
{"derive":true,"dtype":"int8"} 'dtype'
{"derive":true,"bias_z":-2} 'bias_z'
{"margin":2,"rel_l2":1e-3,"reasoning":"r"} 'margin'
{"derive":true,"margin":1e12} the tolerance of 'd_q' cannot be derived: tol: the derived rel_l2
EOF
finish
