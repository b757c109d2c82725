#!/bin/sh
# conv1d_dump.sh: the conv1d class against torch (issue 26). torch's
# causal depthwise conv as mamba_ssm runs it, F.conv1d(x^T, w [C, 1, K],
# b, groups=C, padding=K-1)[..., :L], differentiated by autograd in
# float64; its gradients dumped in the class's layout (x [B, L, C],
# weight [C, 1, K] as torch holds it, and [C, K]) pass as the candidate,
# which checks the class's index convention against torch's. A planted
# off-by-one causal shift (the conv read one step late: outputs [1 .. L]
# of the padded conv, not [0 .. L-1]) fails, in its gradients and in its
# outputs/y (the forward check); a dump without a bias passes.
. "$(dirname "$0")/lib.inc"
$PY - "$T/d.h5" <<'P' || exit 1
import json, sys
import h5py
import numpy as np
import torch
import torch.nn.functional as F
torch.manual_seed(26)
def bf(t):  # values exactly representable in bf16, as float32
    return t.to(torch.bfloat16).to(torch.float32)
B, L, C, K = 2, 33, 12, 4
def grads(x, w, b, shift):
    x = x.double().requires_grad_(); w = w.double().requires_grad_()
    b = b.double().requires_grad_() if b is not None else None
    y = F.conv1d(x.transpose(1, 2), w, b, padding=K - 1, groups=C)[..., shift:shift + L].transpose(1, 2)
    dy = torch.randn(B, L, C, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    y.backward(dy)
    return dy, x.grad, w.grad, (b.grad if b is not None else None), y.detach()
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    for path, shift, bias, wshape in (("conv.ok", 0, True, (C, 1, K)), ("conv.ok_ck", 0, True, (C, K)),
                                      ("conv.nobias", 0, False, (C, 1, K)), ("conv.shift", 1, True, (C, 1, K))):
        x = bf(torch.randn(B, L, C)); w = bf(torch.randn(C, 1, K) / 2); b = bf(0.1 * torch.randn(C)) if bias else None
        dy, dx, dw, db, y = grads(x, w, b, shift)
        g = f.create_group(path)
        g.attrs["class"] = "conv1d"
        g["inputs/x"] = x.numpy()
        g["params/weight"] = w.reshape(wshape).numpy()
        if bias:
            g["params/bias"] = b.numpy()
        g["outputs/y"] = y.float().numpy()
        g["grad_out/dy"] = dy.float().numpy()
        g["grads/dy/d_x"] = dx.float().numpy()
        g["grads/dy/d_weight"] = dw.reshape(wshape).float().numpy()
        if bias:
            g["grads/dy/d_bias"] = db.float().numpy()
P
R='"reasoning": "torch float64 autograd rounded to float32 against the float64 reference"'
TOL="{\"d_x\":{\"rel_l2\":1e-6,$R},\"d_weight\":{\"rel_l2\":1e-6,$R},\"d_bias\":{\"rel_l2\":1e-6,$R}}"
group_cases d.h5 conv "$TOL" ok ok_ck nobias shift
expect_exit 0 "torch's conv1d gradients pass (weight [C, 1, K])" "$QATCHECK" vjp --case "$T/ok.json" --quiet
expect_exit 0 "torch's conv1d gradients pass (weight [C, K])" "$QATCHECK" vjp --case "$T/ok_ck.json" --quiet
expect_exit 0 "torch's conv1d gradients pass without a bias" "$QATCHECK" vjp --case "$T/nobias.json" --quiet
sed 's/"candidate": "dump"/"candidate": "builtin"/' "$T/ok.json" >"$T/builtin.json"
expect_exit 0 "the builtin candidate passes on the torch dump" "$QATCHECK" vjp --case "$T/builtin.json" --quiet
expect_exit 1 "a conv read one step late (off-by-one causal shift) fails" "$QATCHECK" vjp --case "$T/shift.json" --json "$T/s.r.json"
$PY - "$T/s.r.json" <<'P' && ok "the shift fails on d_x and d_weight" || bad "the shift does not fail d_x and d_weight"
import json, sys
r = json.load(open(sys.argv[1]))
failed = {c["tensor"] for c in r["checks"] if c["verdict"] == "fail"}
assert {"d_x", "d_weight"} <= failed, failed
P
$PY - "$T/s.r.json" <<'P' && ok "the shift fails the forward check y too" || bad "the shifted conv's outputs/y passed"
import json, sys
r = json.load(open(sys.argv[1]))
assert [c["verdict"] for c in r["checks"] if c["tensor"] == "y" and c.get("kind") == "forward"] == ["fail"]
P
"$QATCHECK" vjp --case "$T/ok.json" --json "$T/ok.r.json" >/dev/null 2>&1
$PY - "$T/ok.r.json" <<'P' && ok "torch's conv1d output passes the forward check" || bad "torch's conv1d outputs/y fails or is not checked"
import json, sys
r = json.load(open(sys.argv[1]))
assert [c["verdict"] for c in r["checks"] if c["tensor"] == "y" and c.get("kind") == "forward"] == ["pass"]
P
finish
