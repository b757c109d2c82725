"""qatdump_inputs.py: the dumps scripts/qatdump.py writes for the calls users
make (run by qatdump_inputs.sh):
  kw.h5     modules called with keyword arguments (nn.Linear(input=x), a
            custom linear(x=h)): inputs/x and grads/dy/d_x are recorded
  batch.h5  the custom linear on a [2, 24, 64] batch: dY is [2, 24, 64]
  nc.h5     a module with a list of tensors and a float among its
            arguments: both named in the group's `not_captured` attribute
            and raised as warnings
  fp8.h5    an FP8 (fp8_block128) linear whose Function saves its deployed
            bytes as torch.uint8 (torch < 2.1 has no float8 dtypes): the
            contract's weight_format gives saved/weight_q its dtype
  fp8d.h5   the same with the element types declared by qatcheck_dtypes
            and no contract

usage: qatdump_inputs.py TMPDIR"""
import json
import os
import sys
import warnings

import h5py
import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "scripts"))
sys.path.insert(0, os.path.join(here, "..", "..", "scripts", "conformance"))
sys.path.insert(0, here)
import qatdump  # noqa: E402
import quant_oracle  # noqa: E402
from qatdump_torch import FnLinear  # noqa: E402

tmp = sys.argv[1]
failures = []


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what))
    if not cond:
        failures.append(what)


class KwModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.proj = FnLinear(64, 64)
        self.head = torch.nn.Linear(64, 8)

    def forward(self, x):
        h = torch.relu(self.up(input=x)).to(torch.bfloat16)
        return self.head(torch.relu(self.proj(x=h)).float())


torch.manual_seed(0)
model = KwModel()
with qatdump.attach(model, tmp + "/kw.h5", modules=r"^(up|proj)$"):
    torch.nn.functional.mse_loss(model(torch.randn(48, 32)), torch.randn(48, 8)).backward()
with h5py.File(tmp + "/kw.h5", "r") as f:
    for g in ("up", "proj"):
        check("inputs/x" in f[g] and "grads/dy/d_x" in f[g], "keyword call of '%s': inputs/x and grads/dy/d_x recorded" % g)
        check(json.loads(f[g].attrs["not_captured"]) == [], "'%s': nothing left uncaptured" % g)

# a batch: leading dimensions [2, 24] are tokens
class BatchFn(torch.autograd.Function):
    """The custom linear on [..., K]: leading dimensions flattened in the backward."""
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return (x.float() @ w.float().t() + b.float()).to(torch.bfloat16)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        d2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
        dx = (d2.float() @ w.float()).to(torch.bfloat16).reshape(x.shape)
        dw = (d2.float().t() @ x2.float()).to(torch.bfloat16)
        return dx, dw, d2.float().sum(0).to(torch.bfloat16)


class BatchLinear(FnLinear):
    def forward(self, x):
        return BatchFn.apply(x, self.weight, self.bias)


model = KwModel()
model.proj = BatchLinear(64, 64)
with qatdump.attach(model, tmp + "/batch.h5", modules=r"^proj$"):
    torch.nn.functional.mse_loss(model(torch.randn(2, 24, 32)), torch.randn(2, 24, 8)).backward()
with h5py.File(tmp + "/batch.h5", "r") as f:
    check(f["proj/grad_out/dy"].shape == (2, 24, 64), "batch dY is [2, 24, 64]: %s" % (f["proj/grad_out/dy"].shape,))


# what cannot be captured is recorded and warned about
class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x, extras, scale=1.0):
        return self.lin(x) * scale + sum(extras)


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mixed = Mixed()
        self.mixed.qatcheck_class = "linear"

    def forward(self, x):
        return self.mixed(x, [torch.ones(16)], scale=2.0)


with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    o = Outer()
    with qatdump.attach(o, tmp + "/nc.h5", modules=r"^mixed$"):
        o(torch.randn(4, 16)).sum().backward()
msgs = [str(x.message) for x in w if "qatdump" in str(x.message)]
with h5py.File(tmp + "/nc.h5", "r") as f:
    nc = json.loads(f["mixed"].attrs["not_captured"])
check(any("'extras'" in s and "list holding tensors" in s for s in nc), "a list of tensors is named: %s" % nc)
check(any("'scale' = 2.0" in s for s in nc), "a float argument is named: %s" % nc)
check(len(msgs) == len(nc) == 2, "each is warned about: %s" % msgs)

# FP8 deployed bytes saved as torch.uint8 (torch < 2.1 has no float8 dtypes)
class Fp8Fn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, wq, ws):
        # the deployed bytes only: a saved tensor the class does not model
        # (the input x again) would make vjp refuse the group
        ctx.save_for_backward(wq, ws)
        ctx.x = x
        return (x.float() @ w.float().t()).to(torch.bfloat16)

    @staticmethod
    def backward(ctx, dy):
        x = ctx.x
        return None, (dy.float().t() @ x.float()).to(torch.bfloat16), None, None


class Fp8Linear(torch.nn.Module):
    qatcheck_class = "linear"
    qatcheck_saved = ["weight_q", "weight_scale"]

    def __init__(self, k, n, contract=True):
        super().__init__()
        w = (torch.randn(n, k) / k ** 0.5).to(torch.bfloat16)
        self.weight = torch.nn.Parameter(w)
        q, s, _ = quant_oracle.quantize("fp8_block128", "vllm", w.float().numpy())
        self.wq = torch.from_numpy(np.ascontiguousarray(q, np.uint8))
        self.ws = torch.from_numpy(np.ascontiguousarray(s, np.float32))
        if contract:
            self.qatcheck_contract = {"weight_format": "fp8_block128", "dx_weight": "dequant"}
        else:
            self.qatcheck_dtypes = {"weight_q": "float8_e4m3fn"}

    def forward(self, x):
        return Fp8Fn.apply(x, self.weight, self.wq, self.ws)


for name, contract in (("fp8", True), ("fp8d", False)):
    lin = Fp8Linear(160, 130, contract)
    with qatdump.attach(lin, tmp + "/%s.h5" % name):
        lin(torch.randn(5, 160).to(torch.bfloat16)).float().sum().backward()
    with h5py.File(tmp + "/%s.h5" % name, "r") as f:
        d = f["root/saved/weight_q"]
        check(d.dtype == np.uint8 and d.attrs.get("dtype") == "float8_e4m3fn",
              "%s: uint8 weight_q written with dtype float8_e4m3fn (%s)" % (name, dict(d.attrs)))
        nc = json.loads(f["root"].attrs["not_captured"])
        # the Function returns no d_x (None): no grads/dy/d_x, said in not_captured (torch 2 calls the
        # input's hook with None, torch 1.13 not at all: the same dump from both)
        check(len(nc) == 1 and "input 'x' received no gradient" in nc[0] and "d_x" not in f["root/grads/dy"],
              "%s: only the None d_x left uncaptured, named: %s" % (name, nc))

sys.exit(1 if failures else 0)
