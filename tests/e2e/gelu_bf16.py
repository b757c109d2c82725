"""gelu_bf16.py OUT: bf16 GELU dumps of [4096, 1024] (4M elements) from
torch's own F.gelu(approximate="tanh") and F.gelu (erf), written by
scripts/qatdump.py: tanh.h5, erf.h5, and tanh_planted.h5 with d_x times
1.003 (in float32, before its bf16 rounding). Whatever the installed
torch computes (Debian's 1.13 rounds every op of the tanh form to bf16 on
the CPU; torch 2 computes both forms in float32), a correct GELU must
pass."""
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0] + "/scripts")
import qatdump  # noqa: E402
from qatdump_hf import ScaleGrad  # noqa: E402 (the planted d_x scale: d_gate's in qatdump_hf)

BF = torch.bfloat16


class Gelu(torch.nn.Module):
    qatcheck_class = "gelu"

    def __init__(self, approx, f):
        super().__init__()
        self.approx, self.f = approx, f
        self.qatcheck_contract = {"approximate": approx}

    def forward(self, x):
        if self.f != 1.0:
            x = ScaleGrad.apply(x, self.f)
        return F.gelu(x, approximate=self.approx)


out = sys.argv[1]
for name, approx, f in (("tanh", "tanh", 1.0), ("erf", "none", 1.0), ("tanh_planted", "tanh", 1.003)):
    torch.manual_seed(5)
    m = torch.nn.Sequential()
    m.add_module("act", Gelu(approx, f))
    x = (torch.randn(4096, 1024) * 2).to(BF).requires_grad_()
    dy = torch.randn(4096, 1024).to(BF)
    with qatdump.attach(m, "%s/%s.h5" % (out, name), modules=r"^act$"):
        m.act(x).backward(dy)
