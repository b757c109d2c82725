"""qatdump_torch.py: the model of tests/e2e/qatdump_torch.sh. A small CPU
model whose middle linear is a custom autograd.Function (inference forward,
own backward, as production wires it: bf16 operands, fp32 accumulation,
bf16 out); one training step is dumped with scripts/qatdump.py.

usage: qatdump_torch.py OUT.h5 [ok|missing_scale|transposed|frozen]
(frozen: the Function linear's weight does not require grad)"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import torch  # noqa: E402

import qatdump  # noqa: E402

DEFECT = sys.argv[2] if len(sys.argv) > 2 else "ok"


def mm(a, b):
    """bf16 x bf16 product accumulated in float32, stored bf16 (a GPU GEMM)."""
    return (a.float() @ b.float()).to(torch.bfloat16)


class LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return (x.float() @ w.float().t() + b.float()).to(torch.bfloat16)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        if DEFECT == "transposed":      # dY W^T instead of dY W: same shape on a square weight
            dx = mm(dy, w.t())
        elif DEFECT == "missing_scale":  # the weight is kept pre-scaled by 2; the 1/2 is forgotten
            dx = mm(dy, w * 2)
        else:
            dx = mm(dy, w)
        dw = mm(dy.t(), x)
        db = dy.float().sum(0).to(torch.bfloat16)
        return dx, dw, db


class FnLinear(torch.nn.Module):
    qatcheck_class = "linear"
    qatcheck_contract = {"weight_format": "none", "activation_format": "none", "dx_weight": "master"}

    def __init__(self, k, n):
        super().__init__()
        self.weight = torch.nn.Parameter((torch.randn(n, k) / k ** 0.5).to(torch.bfloat16))
        self.bias = torch.nn.Parameter((torch.randn(n) * 0.1).to(torch.bfloat16))

    def forward(self, x):
        return LinearFn.apply(x, self.weight, self.bias)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.proj = FnLinear(64, 64)     # square weight: a transposed product keeps its shape
        self.head = torch.nn.Linear(64, 8)

    def forward(self, x):
        h = torch.relu(self.up(x)).to(torch.bfloat16)
        return self.head(torch.relu(self.proj(h)).float())


def main():
    torch.manual_seed(0)
    model = Model()
    if DEFECT == "frozen":
        model.proj.weight.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, target = torch.randn(48, 32), torch.randn(48, 8)
    with qatdump.attach(model, sys.argv[1], modules=r"^proj$"):
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
    opt.step()  # after the dump: the dump holds the pre-step state


if __name__ == "__main__":
    main()
