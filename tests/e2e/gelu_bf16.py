"""gelu_bf16.py OUT: bf16 GELU dumps of [4096, 1024] (4M elements) from
torch's own F.gelu(approximate="tanh") and F.gelu (erf), written by
scripts/qatdump.py: tanh.h5, erf.h5, and tanh_planted.h5 with d_x times
1.003 (in float32, before its bf16 rounding). Whatever the installed
torch computes (Debian's 1.13 rounds every op of the tanh form to bf16 on
the CPU, and of the erf form where oneDNN is off: CPUs without AVX-512;
torch 2 computes both forms in float32), a correct GELU must pass.
erf_ops.h5: the erf form op by op in bf16 as torch 1.13 computes it
without oneDNN, written out here (ErfOps), so that the arithmetic is
judged on every CPU; erf_ops_planted.h5 the same with d_x times 1.003."""
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0] + "/scripts")
import qatdump  # noqa: E402
from qatdump_hf import ScaleGrad  # noqa: E402 (the planted d_x scale: d_gate's in qatdump_hf)

BF = torch.bfloat16


def _b(t):
    return t.to(BF).float()


class ErfOps(torch.autograd.Function):
    """torch 1.13's bf16 erf GELU without oneDNN: every op rounded to bf16,
    the constants sqrt(1/2) and 1/sqrt(2 pi) too."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        xf, a = x.float(), _b(torch.tensor(0.5 ** 0.5))
        return (_b(xf * 0.5) * _b(1 + _b(torch.erf(_b(xf * a))))).to(BF)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        xf = x.float()
        a, b = _b(torch.tensor(0.5 ** 0.5)), _b(torch.tensor((2 * 3.141592653589793) ** -0.5))
        c = _b(0.5 * _b(1 + _b(torch.erf(_b(xf * a)))))
        p = _b(b * _b(torch.exp(_b(_b(xf * xf) * -0.5))))
        return (dy.float() * _b(c + _b(xf * p))).to(BF)


class Gelu(torch.nn.Module):
    qatcheck_class = "gelu"

    def __init__(self, approx, f):
        super().__init__()
        self.approx, self.f = approx, f
        self.qatcheck_contract = {"approximate": "none" if approx == "ops" else approx}

    def forward(self, x):
        if self.f != 1.0:
            x = ScaleGrad.apply(x, self.f)
        if self.approx == "ops":
            return ErfOps.apply(x)
        return F.gelu(x, approximate=self.approx)


out = sys.argv[1]
for name, approx, f in (("tanh", "tanh", 1.0), ("erf", "none", 1.0), ("tanh_planted", "tanh", 1.003), ("erf_ops", "ops", 1.0),
                        ("erf_ops_planted", "ops", 1.003)):
    torch.manual_seed(5)
    m = torch.nn.Sequential()
    m.add_module("act", Gelu(approx, f))
    x = (torch.randn(4096, 1024) * 2).to(BF).requires_grad_()
    dy = torch.randn(4096, 1024).to(BF)
    with qatdump.attach(m, "%s/%s.h5" % (out, name), modules=r"^act$"):
        m.act(x).backward(dy)
