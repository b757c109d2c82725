#!/bin/sh
# judge_planted.sh: the default judgement (tolerances {"derive": true},
# default bias_z) on dumps written with torch (tests/e2e/judge_planted.py):
# every planted 0.1% systematic error (one gradient x 1.001 before its
# output rounding; linear, rmsnorm, layernorm, attention, swiglu, gelu, logprob,
# conv1d, moe with a gated shared expert (also with a grouped-GEMM
# backward's legal bf16 roundings), the chunked ssd scan, in bf16
# and float32; a stale fp8 block scale) fails on its tensor, and no
# correct module fails: bf16 and float32 trainers, an autocast backward
# (X, W, dY cast to bf16 inside: judged against the reference variant it
# fits, named in the report), moe backwards with the legal roundings
# (judged against the round_ops variants), a linear and a conv1d d_bias that are zero
# in exact arithmetic, attention whose keys are all equal (d_q zero in
# exact arithmetic) or share a large common part (a k_proj bias), swiglu
# and gelu where their derivatives cancel, a logprob whose tokens are
# nearly certain at half the positions, an ssd d_A over chunks of
# large dt A, and a layernorm with rows constant to an ulp (each judged
# against the scale of its terms). One planted error is out of reach by
# construction: the bf16 ssd d_A has 2 elements (one per head), and 0.1%
# is a quarter of a bf16 ulp.
. "$(dirname "$0")/lib.inc"
# the autocast linear's bf16 GEMMs must sum in float32, as the class models:
# torch 2, or torch 1.13 on a CPU with AVX-512 (lib.inc's torch_f32acc)
torch_f32acc || { echo "skip: no torch here sums CPU bf16 GEMMs in float32 (torch 2 missing, torch 1.13 without AVX-512)"; exit 77; }
$PYF tests/e2e/judge_planted.py "$T/p.h5" || exit 1
# every gradient of every class (the class table's), derived
"$QATCHECK" classes --json >"$T/classes.json" || exit 1
$PY - "$T/classes.json" >"$T/c.json" <<'P' || exit 1
import json, sys
grads = sorted({g for c in json.load(open(sys.argv[1]))["classes"] for g in c["grads"]})
print(json.dumps({"data": {"dump": "p.h5"}, "candidate": "dump", "tolerances": {g: {"derive": True} for g in grads}}))
P
expect_exit 1 "planted 0.1% errors fail by default" "$QATCHECK" vjp --case "$T/c.json" --json "$T/r.json"
$PY - "$T/r.json" <<'P' || bad "a planted error passed or a correct gradient failed"
import json, sys
r = json.load(open(sys.argv[1]))
bad = []
for c in r["checks"]:
    mod, grad = c["module"], c["tensor"]
    planted = mod.startswith("/bad.") and mod.split(".")[1] == grad
    if mod == "/bad.d_A.ssd_bf16" and grad == "d_A":  # 2 elements: 0.1% is a quarter of a bf16 ulp
        assert c["shape"] == [2], c["shape"]
        continue
    if planted != (c["verdict"] == "fail"):
        bad.append((mod, grad, c["verdict"], c["why"][:120]))
assert not bad, bad
n = sum(1 for c in r["checks"] if c["module"].startswith("/bad.") and c["module"].split(".")[1] == c["tensor"])
print("%d planted errors fail on their tensor, %d correct checks pass" % (n, len(r["checks"]) - n))
ac = {c["tensor"]: c.get("reference_variant", "") for c in r["checks"] if c["module"] == "/ok.linear_autocast"}
assert "dY" in ac["d_x"] and "dY" in ac["d_weight"], ac
zb = [c for c in r["checks"] if c["module"] == "/ok.linear_zero_bias" and c["tensor"] == "d_bias"][0]
assert zb["metrics"]["rel_l2"] > 0.1 and zb["metrics"]["term_floor"] > 0, zb["metrics"]
print("autocast judged against", ac, "; the zero d_bias at rel_l2 %.3g passes" % zb["metrics"]["rel_l2"])
def check(mod, grad):
    return [c for c in r["checks"] if c["module"] == mod and c["tensor"] == grad][0]["metrics"]
# judged against the terms' scale: far beyond the relative bound, inside it plus te
for mod, grad, lo in (("/ok.conv1d_zero_bias", "d_bias", 0.1), ("/ok.attention_equal_keys", "d_q", 1e3),
                      ("/ok.attention_key_bias", "d_q", 3e-6), ("/ok.logprob_certain_f32", "d_logits", 1e-3)):
    mm = check(mod, grad)
    assert mm["rel_l2"] > lo and mm["term_floor"] > 0, (mod, grad, mm)
    print("%s %s at rel_l2 %.3g passes (term_floor %.3g)" % (mod, grad, mm["rel_l2"], mm["term_floor"]))
P
# a case may tighten: bias_allowance 0 and bias_z 3 on a correct module still pass
cat >"$T/t.json" <<J
{"data": {"dump": "p.h5", "modules": "^/ok\\\\.linear_bf16\$"}, "candidate": "dump", "tolerances": {
 "d_x": {"derive": true, "bias_z": 4, "bias_allowance": 0}, "d_weight": {"derive": true, "bias_allowance": 0},
 "d_bias": {"derive": true, "bias_allowance": 0}}}
J
expect_exit 0 "a correct module under bias_allowance 0" "$QATCHECK" vjp --case "$T/t.json" --json "$T/t.r.json"
grep -q '"bias_allowance":[[:space:]]*0' "$T/t.r.json" || bad "the declared bias_allowance is not in the report"
finish
