"""swiglu_bf16.py OUT: two bf16 SwiGLU dumps of [4096, 1024] (4M elements)
written by scripts/qatdump.py, whose arithmetic is torch 2's (the CUDA and
CPU kernels compute each op in float32 and round once to bf16): silu(gate)
rounded (the saved activation), y = s * up rounded; d_s = dy * up rounded,
d_gate = d_s * silu'(gate) rounded, d_up = dy * s rounded. Debian's torch
1.13 rounds every step of silu instead, so the ops are written out here.
ok.h5 is that arithmetic; planted.h5 has d_gate times 1.003 (in float32,
before its rounding)."""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0] + "/scripts")
import qatdump  # noqa: E402

BF = torch.bfloat16


def sig(z):
    return 1.0 / (1.0 + torch.exp(-z))


class Torch2SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, f):
        z = gate.float()
        s = (z * sig(z)).to(BF)                       # silu in float32, rounded once
        ctx.save_for_backward(gate, up, s)
        ctx.f = f
        return (s.float() * up.float()).to(BF)

    @staticmethod
    def backward(ctx, dy):
        gate, up, s = ctx.saved_tensors
        ds = (dy.float() * up.float()).to(BF)         # MulBackward: d_s rounded
        z = gate.float()
        g = sig(z)
        dg = (ds.float() * (g * (1.0 + z * (1.0 - g))) * ctx.f).to(BF)  # silu_backward in float32
        du = (dy.float() * s.float()).to(BF)
        return dg, du, None


class SwiGLU(torch.nn.Module):
    qatcheck_class = "swiglu"
    qatcheck_inputs = ["gate", "up"]
    qatcheck_contract = {"limit": 0}

    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, gate, up):
        return Torch2SwiGLU.apply(gate, up, self.f)


out = sys.argv[1]
for name, f in (("ok", 1.0), ("planted", 1.003)):
    torch.manual_seed(3)
    m = torch.nn.Sequential()
    m.add_module("mlp", SwiGLU(f))
    gate = (torch.randn(4096, 1024) * 2).to(BF).requires_grad_()
    up = torch.randn(4096, 1024).to(BF).requires_grad_()
    dy = torch.randn(4096, 1024).to(BF)
    with qatdump.attach(m, "%s/%s.h5" % (out, name), modules=r"^mlp$"):
        m.mlp(gate, up).backward(dy)
