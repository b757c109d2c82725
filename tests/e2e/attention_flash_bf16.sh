#!/bin/sh
# attention_flash_bf16.sh: a flash-attention backward (FlashAttention-2/3,
# cuDNN) computes Delta = rowsum(dO * O) from O as the forward returned it,
# in bf16 (scripts/make_flash_dump.py: a float32 flash backward in numpy).
# Under derived tolerances it passes: saved/out stored in bf16 makes the
# contract's saved_out_dtype auto read bfloat16 (as scripts/qatdump.py
# records it), and so does the key over a float32-stored saved/out of bf16
# values; an O saved in float32
# passes as before. An LSE rounded to bf16 (P = exp(s - bf16(LSE))) fails on
# d_q, d_k and d_v, and the bf16 O under an explicit saved_out_dtype
# float32 fails on d_q and d_k (d_v = P^T dO does not read Delta), the
# builtin flash backward's too (it reads the O the dump holds). Skips (77) without numpy
# or h5py.
. "$(dirname "$0")/lib.inc"
"$PY" -c "import numpy, h5py" 2>/dev/null || { echo "skip: numpy or h5py missing for $PY"; exit 77; }
$PY scripts/make_flash_dump.py "$T/d.h5" || exit 1
DER='{"d_q": {"derive": true}, "d_k": {"derive": true}, "d_v": {"derive": true}}'
for cand in dump builtin; do
  cat >"$T/$cand.json" <<J
{"module": "attention", "data": {"dump": "d.h5"}, "candidate": "$cand", "tolerances": $DER}
J
  expect_exit 1 "attention flash ($cand): the planted defects fail" "$QATCHECK" vjp --case "$T/$cand.json" --json "$T/$cand.r.json"
  $PY - "$T/$cand.r.json" "$cand" <<'P' || bad "attention flash ($cand): the report does not fail exactly the planted defects"
import json, sys
r = json.load(open(sys.argv[1]))
failed = {(c["module"], c["tensor"]) for c in r["checks"] if c["verdict"] == "fail"}
want = {("/defect.lse_bf16", t) for t in ("d_q", "d_k", "d_v")}
want |= {("/defect.o_bf16_declared_f32", t) for t in ("d_q", "d_k")}
assert failed == want, sorted(failed ^ want)
for m in ("/flash.o_bf16", "/flash.o_f32", "/flash.o_bf16_stored_f32"):
    good = [c for c in r["checks"] if c["module"] == m]
    assert len(good) == 5 and all(c["verdict"] == "pass" for c in good), [(c["tensor"], c["verdict"]) for c in good]
    assert all(c["metrics"]["noise_multiple"] < 0.5 for c in good if c["tensor"].startswith("d_")), m
print("the bf16 O in Delta passes; an LSE in bf16 and a bf16 O against a float32 contract fail")
P
done
# the bf16-O module alone: exit 0 (before saved_out_dtype it failed on d_q and d_k)
sed 's|"dump": "d.h5"|"dump": "d.h5", "modules": "^/flash\\\\.o_bf16$"|' "$T/dump.json" >"$T/one.json"
expect_exit 0 "attention flash: Delta from the bf16 O passes under derived tolerances" "$QATCHECK" vjp --case "$T/one.json" --quiet
finish
