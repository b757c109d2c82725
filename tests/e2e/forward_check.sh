#!/bin/sh
# forward_check.sh: where a dump holds a module's output (outputs/y), vjp
# judges it first against the forward the contract defines, as its own
# check (tensor y, dY "forward", kind forward). scripts/make_diag_dump.py
# --set users: torch forwards on the dequantized operands of every weight
# format (and fp8_token X, float32 X), an RMSNorm, a SwiGLU and a causal
# attention pass; a 0.1% scale of y, another profile, a per-tensor or
# per-block scale instead of the contract's, a stale per-tensor scale, X
# rounded to bf16 before its quantizer fail on y alone (their gradients
# follow the contract), as do a causal mask shifted by one and Gemma's
# zero-centred RMSNorm weight under zero_centered false, each diagnosed by
# name; the text, JSON, Markdown and HTML reports show the forward row; an
# outputs/y of the wrong shape exits 2 with one error line; one the class's
# float64 forward cannot model is reported not judged and fails the run.
. "$(dirname "$0")/lib.inc"
$PY scripts/make_diag_dump.py "$T/u.h5" --set users || exit 1
TOL='{"d_x": {"derive": true}, "d_weight": {"derive": true}, "d_bias": {"derive": true}, "d_q": {"derive": true}, "d_k": {"derive": true}, "d_v": {"derive": true}, "d_gate": {"derive": true}, "d_up": {"derive": true}}'
echo "{\"data\": {\"dump\": \"u.h5\", \"modules\": \"^/ok\\\\\\\\.fwd\\\\\\\\.\"}, \"candidate\": \"dump\", \"tolerances\": $TOL}" >"$T/ok.json"
expect_exit 0 "correct forwards and gradients pass" "$QATCHECK" vjp --case "$T/ok.json" --json "$T/ok.r.json" --markdown "$T/ok.md"
cp "$T/out" "$T/ok.out"
echo "{\"data\": {\"dump\": \"u.h5\", \"modules\": \"^/defect\\\\\\\\.(fwd_|attention_shift|rmsnorm_zero)\"}, \"candidate\": \"dump\", \"tolerances\": $TOL}" >"$T/d.json"
expect_exit 1 "planted forward mistakes fail" "$QATCHECK" vjp --case "$T/d.json" --json "$T/d.r.json"
cp "$T/out" "$T/d.out"
$PY - "$T" <<'P' || bad "a forward check is missing, fails where it must not, or misnames its cause"
import json, sys
T = sys.argv[1]
bad = 0
ok = json.load(open(T + "/ok.r.json"))
mods = {}
for c in ok["checks"]:
    mods.setdefault(c["module"], []).append(c)
want_ok = ["/ok.fwd." + f for f in ("none", "fp8_tensor", "fp8_channel", "fp8_block128", "fp8_block128_ue8m0", "nvfp4", "mxfp8",
                                    "mxfp4", "fp8_token_act", "x_f32", "rmsnorm", "swiglu", "attention")]
for m in want_ok:
    cs = mods.get(m)
    if not cs or cs[0]["tensor"] != "y" or cs[0].get("kind") != "forward" or cs[0]["dy"] != "forward":
        print("FAIL %s: its first check is not the forward check y" % m); bad += 1
    elif cs[0]["verdict"] != "pass":
        print("FAIL %s: a correct forward failed: %s" % (m, cs[0]["why"])); bad += 1
print("ok   %d correct forwards pass, each checked first" % len(want_ok))
want = {"/defect.fwd_scaled": ("factor", "k = 1.001"),
        "/defect.fwd_profile": ("profile", "profile 'ocp' rather than the declared 'vllm'"),
        "/defect.fwd_per_tensor": ("weight_format", "'fp8_tensor' (one per-tensor scale) rather than the declared 'fp8_block128'"),
        "/defect.fwd_per_block": ("weight_format", "'fp8_block128' (a scale per 128 x 128 block) rather than the declared 'fp8_channel'"),
        "/defect.fwd_stale": ("stale_scale", "stale per-tensor weight scale: 0.97"),
        "/defect.fwd_x_bf16": ("rounded_input", "rounded to bfloat16 before quantization"),
        "/defect.attention_shift": ("causal_shift_plus1", "shifted by +1"),
        "/defect.rmsnorm_zero_centered": ("zero_centered", "zero_centered 'true' rather than the declared 'false'")}
r = json.load(open(T + "/d.r.json"))
out = open(T + "/d.out").read()
for m, (name, word) in want.items():
    cs = [c for c in r["checks"] if c["module"] == m]
    y = [c for c in cs if c["tensor"] == "y"]
    if not y or y[0]["verdict"] != "fail":
        print("FAIL %s: outputs/y did not fail" % m); bad += 1; continue
    if m.startswith("/defect.fwd_") and any(c["verdict"] != "pass" for c in cs if c["tensor"] != "y"):
        print("FAIL %s: a gradient failed though it follows the contract" % m); bad += 1
    d = y[0].get("diagnosis", {})
    first = [h["name"] for h in d.get("hypotheses", []) if h["consistent"]]
    s = d.get("summary", "")
    if not first or first[0] != name or word not in s:
        print("FAIL %s: expected %s (%r), got %s: %s" % (m, name, word, first, s[:300])); bad += 1
    elif name != "factor" and "constant factor" in s:
        print("FAIL %s: a constant factor offered beside the better %s" % (m, name)); bad += 1
    elif not any(l.startswith(m + " forward y: consistent with:") for l in out.splitlines()):
        print("FAIL %s: stdout does not print the forward's diagnosis" % m); bad += 1
print("ok   %d planted forward mistakes named" % len(want))
sys.exit(1 if bad else 0)
P
grep -Eq "^/ok\.fwd\.nvfp4 +forward +y +" "$T/ok.out" && ok "the text table has the forward row" || bad "no forward row in the text table"
grep -q "| y |" "$T/ok.md" && ok "the Markdown report has the forward row" || bad "no forward row in the Markdown report"
expect_exit 0 "the audit of a report with forward checks" "$QATCHECK" report "$T/ok.r.json" --allow-incomplete --html "$T/a.html" --markdown "$T/a.md"
grep -q ">y<" "$T/a.html" && ok "the HTML audit shows y" || bad "the HTML audit does not show the forward check y"
# outputs/y that is not the forward's shape cannot be judged
$PY - "$T/u.h5" <<'P' || bad "could not plant a wrong-shaped outputs/y"
import sys, h5py
f = h5py.File(sys.argv[1], "a")
f.copy("/ok.fwd.none", "/bad.fwd_shape")
y = f["/bad.fwd_shape/outputs/y"][...]
del f["/bad.fwd_shape/outputs/y"]
f["/bad.fwd_shape/outputs"].create_dataset("y", data=y[:, :100]).attrs["dtype"] = "bfloat16"
P
echo "{\"data\": {\"dump\": \"u.h5\", \"modules\": \"^/bad\\\\\\\\.fwd_shape$\"}, \"candidate\": \"dump\", \"tolerances\": $TOL}" >"$T/b.json"
expect_exit 2 "outputs/y of the wrong shape is refused" "$QATCHECK" vjp --case "$T/b.json"
[ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep -q "outputs/y is \[64, 100\]" "$T/err" \
  && ok "one error line naming outputs/y" || bad "the refusal: $(cat "$T/err")"
# a class judged by its float64 forward whose outputs/y that forward cannot
# model: the forward check is reported not judged, with the reason, and fails
# the run as a missing gradient does (it used to be dropped, said only under -v)
$PY - "$T/u.h5" <<'P' || bad "could not plant an outputs/y the rmsnorm forward cannot model"
import sys, h5py
f = h5py.File(sys.argv[1], "a")
f.copy("/ok.fwd.rmsnorm", "/bad.rmsnorm_shape")
y = f["/bad.rmsnorm_shape/outputs/y"]
a, dt = y[...], dict(y.attrs)
del f["/bad.rmsnorm_shape/outputs/y"]
n = f["/bad.rmsnorm_shape/outputs"].create_dataset("y", data=a[..., :-1])
for k, v in dt.items():
    n.attrs[k] = v
P
echo "{\"data\": {\"dump\": \"u.h5\", \"modules\": \"^/bad\\\\\\\\.rmsnorm_shape$\"}, \"candidate\": \"dump\", \"tolerances\": $TOL}" >"$T/nj.json"
expect_exit 1 "an outputs/y that cannot be modelled fails the run" "$QATCHECK" vjp --case "$T/nj.json" --json "$T/nj.r.json"
grep -Eq "^/bad\.rmsnorm_shape +forward +y .*FAIL +not judged: outputs/y is \[" "$T/out" \
  && ok "the text table says y is not judged, and why" || bad "text: $(grep ' y ' "$T/out")"
$PY - "$T/nj.r.json" <<'P' && ok "the JSON report says y is not judged, and why" || bad "the JSON report's forward check"
import json, sys
r = json.load(open(sys.argv[1]))
y = [c for c in r["checks"] if c["tensor"] == "y"]
assert r["verdict"] == "fail" and len(y) == 1, r["verdict"]
y = y[0]
assert y["verdict"] == "fail" and y["why"].startswith("not judged: outputs/y is [") and "cannot be modelled" in y["why"], y["why"]
assert y.get("kind") == "forward" and "metrics" not in y, y
assert all(c["verdict"] == "pass" for c in r["checks"] if c["tensor"] != "y"), [c["why"] for c in r["checks"]]
P
finish
