#!/bin/sh
# attention_dump.sh: attention with a sliding window, a logit softcap and GQA
# from a torch-made dump (scripts/make_attention_dump.py: an eager attention
# in float32 with Hugging Face's window mask, autograd's gradients). The
# correct module passes (the dump's gradients and the builtin flash
# backward); a window off by one either way (the key at i - W attended, or
# the key at i - W + 1 masked) fails on d_q, d_k and d_v and the diagnosis
# names the off-by-one; a softcap whose tanh derivative is lost fails on d_q
# and d_k only (d_v = P^T dO does not see it), diagnosed as such. DeepSeek's
# MLA core (v's head_dim other than q and k's) passes, with the builtin
# backward too, and run at 1/sqrt(v's head_dim) against the contract's
# 1/sqrt(D) it fails on d_q, d_k and d_v. The saved O and LSE of each are
# judged against the forward recomputed from q, k, v: a window off by one
# and the MLA scale fail there too (the dump saved that forward's). Skips
# (77) without torch.
. "$(dirname "$0")/lib.inc"
have_py "$PY" torch h5py || { echo "skip: torch or h5py missing for $PY"; exit 77; }
$PY scripts/make_attention_dump.py "$T/d.h5" || exit 1
ATOL='{"d_q":{"rel_l2":1e-5,"reasoning":"fp32 eager autograd"},"d_k":{"rel_l2":1e-5,"reasoning":"fp32 eager autograd"},"d_v":{"rel_l2":1e-5,"reasoning":"fp32 eager autograd"}}'
cat >"$T/ok.json" <<J
{"module": "attention", "data": {"dump": "d.h5", "modules": "^/model\\\\.layers\\\\.0\\\\.self_attn\\\\.sdpa\$"}, "candidate": "builtin", "tolerances": $ATOL}
J
expect_exit 0 "attention window+softcap: the builtin flash backward passes on the torch dump" "$QATCHECK" vjp --case "$T/ok.json" --quiet
sed 's/layers\\\\.0\\\\.self_attn\\\\.sdpa/layers\\\\.1\\\\.self_attn\\\\.mla/' "$T/ok.json" >"$T/mla.json"
grep -q 'mla' "$T/mla.json" || bad "the MLA case was not written"
expect_exit 0 "attention MLA (D 12, Dv 8): the builtin flash backward passes on the torch dump" "$QATCHECK" vjp --case "$T/mla.json" --quiet
cat >"$T/all.json" <<J
{"module": "attention", "data": {"dump": "d.h5"}, "candidate": "dump", "tolerances": $ATOL}
J
expect_exit 1 "attention window+softcap: the dump with planted defects fails" "$QATCHECK" vjp --case "$T/all.json" --json "$T/all.r.json"
$PY - "$T/all.r.json" <<'P' || bad "attention window+softcap: the report does not fail exactly the planted defects"
import json, sys
r = json.load(open(sys.argv[1]))
failed = {(c["module"], c["tensor"]) for c in r["checks"] if c["verdict"] == "fail"}
# the saved O and LSE of a module whose forward ran another mask or scale than its contract's are not
# the contract's forward either: they fail too (the softcap defect is in the backward only)
saved = ("d_q", "d_k", "d_v", "saved/out", "saved/lse")
want = {("/defect.attention_window_wide", t) for t in saved}
want |= {("/defect.attention_window_narrow", t) for t in saved}
want |= {("/defect.attention_softcap_no_grad", t) for t in ("d_q", "d_k")}
want |= {("/defect.attention_mla_scale_dv", t) for t in saved}
assert failed == want, sorted(failed ^ want)
for m in ("/model.layers.0.self_attn.sdpa", "/model.layers.1.self_attn.mla"):
    good = [c for c in r["checks"] if c["module"] == m]
    assert len(good) == 5 and all(c["verdict"] == "pass" for c in good), good
mla = {c["tensor"]: c["shape"] for c in r["checks"] if c["module"] == "/model.layers.1.self_attn.mla"}
assert mla == {"d_q": [2, 4, 19, 12], "d_k": [2, 2, 19, 12], "d_v": [2, 2, 19, 8], "saved/out": [2, 4, 19, 8],
               "saved/lse": [2, 4, 19]}, mla
for c in r["checks"]:
    if not c["tensor"].startswith("d_"):
        continue
    m = c["module"].rsplit("_", 1)[-1]
    if c["verdict"] == "fail" and m in ("wide", "narrow"):
        s = c["diagnosis"]["summary"]
        assert s.startswith("consistent with") and ("i - W attended" if m == "wide" else "i - W + 1 masked") in s, (c["module"], s)
    if c["verdict"] == "fail" and m == "grad":
        s = c["diagnosis"]["summary"]
        assert s.startswith("consistent with") and "1 - tanh^2 lost" in s, (c["module"], s)
print("the window off by one fails on d_q, d_k, d_v, the lost tanh derivative on d_q, d_k; each is diagnosed")
P
finish
