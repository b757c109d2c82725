#!/bin/sh
# diagnose_users.sh: the backward mistakes users make, each planted in a
# torch-built dump (scripts/make_diag_dump.py --set users), are named by
# the best-fitting hypothesis: d_x from a weight quantized under another
# profile, or per tensor where the contract has 128 x 128 blocks, or with
# a stale per-tensor scale (an earlier step's amax); d_bias
# summed over the features (a square dY, and a rectangular one whose
# d_bias has one value per token); d_weight from X rounded to e4m3; an
# attention mask shifted by one. No diagnosis offers a constant factor
# beside a better hypothesis, nor ranks, all-reduces or data-parallel
# scaling (the dump is one process's); a correct module passes.
. "$(dirname "$0")/lib.inc"
$PY scripts/make_diag_dump.py "$T/u.h5" --set users || exit 1
TOL='{"d_x": {"derive": true}, "d_weight": {"derive": true}, "d_bias": {"derive": true}, "d_q": {"derive": true}, "d_k": {"derive": true}, "d_v": {"derive": true}}'
echo "{\"data\": {\"dump\": \"u.h5\", \"modules\": \"^/(defect\\\\\\\\.(dx_|bias_|dw_|attention_)|ok\\\\\\\\.fwd\\\\\\\\.(none|fp8_block128|attention)$)\"}, \"candidate\": \"dump\", \"tolerances\": $TOL}" >"$T/c.json"
expect_exit 1 "the planted mistakes fail" "$QATCHECK" vjp --case "$T/c.json" --json "$T/r.json"
cp "$T/out" "$T/c.out"
$PY - "$T" <<'P' || bad "a diagnosis does not name the user's mistake"
import json, sys
T = sys.argv[1]
r = json.load(open(T + "/r.json"))
out = open(T + "/c.out").read()
want = {("/defect.dx_profile", "d_x"): ("profile", "profile 'exact' rather than the declared 'vllm'"),
        ("/defect.dx_per_tensor", "d_x"): ("weight_format", "'fp8_tensor' (one per-tensor scale) rather than the declared 'fp8_block128'"),
        ("/defect.dx_stale", "d_x"): ("stale_scale", "stale per-tensor scale: 0.9"),
        ("/defect.bias_axis", "d_bias"): ("axis", "reduced over the wrong axis"),
        ("/defect.bias_axis_rect", "d_bias"): (None, "one value per token (64, dY's rows)"),
        ("/defect.dw_x_fp8", "d_weight"): ("input_precision", "float8_e4m3fn"),
        ("/defect.attention_shift", "d_q"): ("causal_shift_plus1", "shifted by +1"),
        ("/defect.attention_shift", "d_k"): ("causal_shift_plus1", "shifted by +1"),
        ("/defect.attention_shift", "d_v"): ("causal_shift_plus1", "shifted by +1")}
bad = 0
failed = {}
for c in r["checks"]:
    if c["verdict"] == "pass":
        continue
    if c["module"].startswith("/ok."):
        print("FAIL %s %s: a correct module failed: %s" % (c["module"], c["tensor"], c["why"])); bad += 1
    failed[(c["module"], c["tensor"])] = c
for key, (name, word) in want.items():
    c = failed.get(key)
    if not c:
        print("FAIL %s %s did not fail" % key); bad += 1; continue
    d = c.get("diagnosis", {})
    s = d.get("summary", "")
    first = [h["name"] for h in d.get("hypotheses", []) if h["consistent"]]
    if (name and (not first or first[0] != name)) or word not in s:
        print("FAIL %s %s: expected %s (%r), got %s: %s" % (key[0], key[1], name, word, first, s[:300])); bad += 1
    if "constant factor" in s:
        print("FAIL %s %s: a constant factor offered beside %s" % (key[0], key[1], name)); bad += 1
    if not any(l.startswith("%s dy %s: " % key) and word.split()[0] in l for l in out.splitlines()):
        print("FAIL %s %s: stdout does not print the diagnosis" % key); bad += 1
for c in failed.values():
    s = c.get("diagnosis", {}).get("summary", "").lower()
    for w in ("rank", "all-reduce", "data-parallel", "world size", "expert-dp"):
        if w in s:
            print("FAIL %s %s: a single-process dump's diagnosis names %r" % (c["module"], c["tensor"], w)); bad += 1
print("ok   %d user mistakes named, the best fit first, no factor beside them, no data-parallel cause" % len(want))
sys.exit(1 if bad else 0)
P
finish
