#!/bin/sh
# scale_grads.sh: classes fake_quant and act_quant (issue #40 item 1) on
# dumps written by torch 1.13's autograd: the learnable fake quantizer
# torch._fake_quantize_learnable_per_tensor_affine (LSQ's d_scale, d_x
# zeroed where round(x / s) leaves [-128, 127]), gelu then that quantizer
# with the scale amax(gelu(x)) / 127 flowing through autograd. The correct
# dumps pass, d_x and d_scale judged with derived tolerances; each planted
# defect fails on its tensor: the trainable scale's gradient dropped
# (d_scale), the saturated elements passing dY (d_x), the amax scale
# detached where the contract says it flows (d_x), the fusion order
# quantize-then-activate where the contract says activate-then-quantize
# (d_x). Each fails on the old code too (no such classes: exit 2).
. "$(dirname "$0")/lib.inc"
$PY - "$T/d.h5" <<'P' || { bad "torch could not write the dumps"; finish; }
import json, sys
import h5py
import torch
torch.manual_seed(40)
F = torch.nn.functional
def fq(u, s):
    return torch._fake_quantize_learnable_per_tensor_affine(u, s, torch.zeros(1), -128, 127, 1.0)
def group(f, name, x, fwd, contract, scale=None, defect=None):
    x = x.clone().requires_grad_(True)
    s = None if scale is None else torch.tensor([scale], requires_grad=True)
    y = fwd(x, s)
    dy = torch.randn_like(y)
    y.backward(dy)
    g = f.create_group(name)
    g.attrs["class"] = contract.pop("class")
    g.attrs["contract"] = json.dumps(contract)
    g["inputs/x"] = x.detach().numpy()
    g["outputs/y"] = y.detach().numpy()
    g["grad_out/dy"] = dy.numpy()
    dx = x.grad.clone()
    if defect == "sat_pass":
        dx = dy.clone()
    g["grads/dy/d_x"] = dx.numpy()
    if s is not None:
        g["params/scale"] = s.detach().numpy()
        g["grads/dy/d_scale"] = (torch.zeros(1) if defect == "dscale_zero" else s.grad).numpy()
# bf16-representable inputs, a few saturating at s = 2.5 / 127
x = (torch.randn(64, 256)).bfloat16().float()
xa = (2 * torch.randn(64, 256)).bfloat16().float()
amax = lambda u: u.abs().amax().reshape(1) / 127
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    fqc = {"class": "fake_quant", "format": "int8", "scale_grad": "trainable", "clip": "round_first"}
    group(f, "q.lsq", x, lambda x, s: fq(x, s), dict(fqc), scale=2.5 / 127)
    group(f, "q.dscale_zero", x, lambda x, s: fq(x, s), dict(fqc), scale=2.5 / 127, defect="dscale_zero")
    group(f, "q.sat_pass", x, lambda x, s: fq(x, s), dict(fqc), scale=2.5 / 127, defect="sat_pass")
    aqc = {"class": "act_quant", "act": "gelu", "order": "act_quant", "format": "int8", "scale_grad": "flow"}
    group(f, "q.flow", xa, lambda x, s: fq(F.gelu(x), amax(F.gelu(x))), dict(aqc))
    group(f, "q.detached", xa, lambda x, s: fq(F.gelu(x), amax(F.gelu(x)).detach()), dict(aqc))
    group(f, "q.order", xa, lambda x, s: F.gelu(fq(x, amax(x))), dict(aqc))
    group(f, "q.order_ok", xa, lambda x, s: F.gelu(fq(x, amax(x))), dict(aqc, order="quant_act"))
P
R='"reasoning": "derived from the class error model"'
TOL="{\"d_x\":{\"derive\":true,$R},\"d_scale\":{\"derive\":true,$R}}"
group_cases d.h5 q "$TOL" lsq dscale_zero sat_pass flow detached order order_ok
for g in lsq flow order_ok; do
  expect_exit 0 "torch's $g passes" "$QATCHECK" vjp --case "$T/$g.json" --json "$T/$g.r.json"
done
fails_on() {
  expect_exit 1 "$3 fails" "$QATCHECK" vjp --case "$T/$1.json" --json "$T/$1.r.json"
  $PY - "$T/$1.r.json" "$2" <<'P' && ok "$3: fails on $2" || bad "$3: does not fail on $2"
import json, sys
r = json.load(open(sys.argv[1]))
failed = {c["tensor"] for c in r["checks"] if c["verdict"] == "fail"}
assert sys.argv[2] in failed, failed
P
}
fails_on dscale_zero d_scale "the trainable scale's gradient dropped (zero)"
fails_on sat_pass d_x "dY passed through the saturated elements where the contract zeroes them"
fails_on detached d_x "the amax scale detached where the contract says it flows"
fails_on order d_x "quantize-then-activate where the contract says activate-then-quantize"
$PY - "$T/lsq.r.json" <<'P' && ok "d_scale was judged" || bad "d_scale was not judged"
import json, sys
r = json.load(open(sys.argv[1]))
assert any(c["tensor"] == "d_scale" and c["verdict"] == "pass" for c in r["checks"]), r["checks"]
P
finish
