"""qatdump_guards.py: scripts/qatdump.py refuses the seed's false
differences and records what it must (run by qatdump_guards.sh).

usage: qatdump_guards.py TMPDIR"""
import os
import sys

import h5py
import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "scripts"))
sys.path.insert(0, here)
import qatdump  # noqa: E402
from qatdump_torch import FnLinear, Model  # noqa: E402

tmp = sys.argv[1]
failures = []


def expect_refusal(what, words, fn):
    try:
        fn()
    except qatdump.QatDumpError as e:
        msg = str(e)
        if all(w in msg for w in words):
            print("ok: %s refused: %s" % (what, msg))
            return
        failures.append("%s: message %r lacks %s" % (what, msg, words))
        return
    failures.append("%s: not refused" % what)


def step(model, x, path, **kw):
    with qatdump.attach(model, path, **kw):
        model(x).float().pow(2).sum().backward()


torch.manual_seed(0)
x = torch.randn(8, 32)

# a module called twice: its parameter gradient sums over the calls
class Twice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        return self.lin(self.lin(x))

expect_refusal("module called twice", ["'lin'", "2 times"], lambda: step(Twice(), x, tmp + "/a.h5"))

# a tied weight: its gradient sums over both users
class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(32, 32)
        self.b = torch.nn.Linear(32, 32)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))

expect_refusal("tied weight", ["'a'", "shared with", "b.weight"], lambda: step(Tied(), x, tmp + "/b.h5", modules="^a$"))

# FSDP-managed plain parameters: maybe the unsharded compute copy
class FSDPWrapped(torch.nn.Module):  # the class name fully_shard gives a wrapped module
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        return self.lin(x)

expect_refusal("FSDP unsharded copy", ["'lin'", "FSDP", "sharded master"], lambda: qatdump.attach(FSDPWrapped()))

# a DTensor-like (FSDP2-sharded) parameter: its master is gathered from the
# shards, its gradient is refused (reduce-scattered across ranks)
class FakeDTensor(torch.nn.Parameter):
    placements = ("Shard(0)",)

    def to_local(self):
        return self.detach()

    def full_tensor(self):
        return self.master  # the gathered shards of the master

sharded = torch.nn.Sequential(torch.nn.Linear(32, 4))
master = sharded[0].weight.detach().clone()
sharded[0].weight = FakeDTensor(master.bfloat16().float())  # what the forward computes with
sharded[0].weight.master = master
expect_refusal("DTensor gradient", ["'0'", "DTensor", "reduce-scattered"], lambda: step(sharded, x, tmp + "/s.h5"))
sharded[0].weight.requires_grad_(False)
step(sharded, x, tmp + "/s.h5")
with h5py.File(tmp + "/s.h5", "r") as f:
    w = torch.from_numpy(f["0/params/weight"][()])
    if not torch.equal(w, master) or f["0/params/weight"].attrs.get("frozen") != "1":
        failures.append("frozen DTensor master not dumped from its gathered shards")

# no backward before write
def no_backward():
    m = torch.nn.Sequential(torch.nn.Linear(32, 4))
    with qatdump.attach(m, tmp + "/c.h5"):
        m(x)
expect_refusal("no backward", ["'0'", "no gradient"], no_backward)

expect_refusal("nothing selected", ["no module matched"], lambda: qatdump.attach(Model(), modules="nope"))

# the dump holds the state of the forward even if the optimizer ran before write()
m = Model()
opt = torch.optim.SGD(m.parameters(), lr=1.0)
w0 = m.proj.weight.detach().clone()
d = qatdump.attach(m, tmp + "/d.h5", modules="^proj$")
m(x).pow(2).sum().backward()
opt.step()
d.write()
d.detach()
with h5py.File(tmp + "/d.h5", "r") as f:
    g = f["proj"]
    wd = torch.from_numpy(g["params/weight"][()].astype("int16")).view(torch.bfloat16)
    if not torch.equal(wd, w0):
        failures.append("params/weight is not the forward's master after opt.step()")
    if g["grad_out/dy"].attrs.get("dtype") != "bfloat16":
        failures.append("dY was not kept at the precision the backward received (bfloat16)")
    if g.attrs["class"] != "linear" or "dx_weight" not in g.attrs.get("contract", ""):
        failures.append("class/contract attributes missing")
    if f.attrs["qatcheck_dump"] != 1:
        failures.append("root attribute qatcheck_dump != 1")
# hooks are gone after detach: a second step adds nothing
before = len(d.records["proj"].grad_out["dy"])
m(x).pow(2).sum().backward()
if len(d.records["proj"].grad_out["dy"]) != before:
    failures.append("hooks still fire after detach()")

# a frozen parameter: recorded as frozen, no gradient written
m = Model()
m.proj.weight.requires_grad_(False)
step(m, x, tmp + "/e.h5", modules="^proj$")
with h5py.File(tmp + "/e.h5", "r") as f:
    g = f["proj"]
    if g["params/weight"].attrs.get("frozen") != "1":
        failures.append("frozen weight not marked frozen")
    if "d_weight" in g["grads/dy"] or "d_bias" not in g["grads/dy"]:
        failures.append("frozen weight: grads hold %s" % sorted(g["grads/dy"]))

# sharded declarations (rank 0 of 4 without torch.distributed): an fsdp_flat
# piece of the wrong length, an unknown grad_reduce, a shard value that is
# neither a dimension nor ("fsdp_flat", shape)
class Flat(torch.nn.Module):
    qatcheck_class = "linear"
    qatcheck_parallel = "fsdp_flat"

    def __init__(self, n, shape, reduce="mean"):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n))
        self.qatcheck_shard = {"params/weight": ("fsdp_flat", shape)}
        self.qatcheck_grad_reduce = reduce
        self.shape = shape

    def forward(self, x):
        n = self.shape[0] * self.shape[1]
        return torch.nn.functional.linear(x, self.weight[:n].view(self.shape) if self.weight.numel() >= n
                                          else self.weight.sum() * torch.ones(self.shape))


def flat_step(m):
    with qatdump.attach(torch.nn.ModuleDict({"f": m}), tmp + "/flat.rank{rank}.h5", rank=0, world_size=4):
        m(torch.randn(2, 8)).sum().backward()


expect_refusal("fsdp_flat piece of the wrong length", ["'f'", "params/weight", "[31]", "1-D of 32 elements"],
               lambda: flat_step(Flat(31, (16, 8))))
expect_refusal("unknown grad_reduce", ["'f'", "qatcheck_grad_reduce 'avg'", "sum or mean"],
               lambda: flat_step(Flat(32, (16, 8), "avg")))
bad = Flat(32, (16, 8))
bad.qatcheck_shard = {"params/weight": "flat"}
expect_refusal("a shard value neither a dimension nor fsdp_flat", ["'f'", "qatcheck_shard['params/weight'] = 'flat'"],
               lambda: flat_step(bad))
if os.path.exists(tmp + "/flat.rank0.h5"):
    failures.append("a refused sharded dump left its half-written file")
flat_step(Flat(32, (16, 8)))
with h5py.File(tmp + "/flat.rank0.h5", "r") as f:
    if f["f/params/weight"].attrs.get("shard_flat") != "[16, 8]" or f["f"].attrs.get("grad_reduce") != "mean":
        failures.append("fsdp_flat: shard_flat / grad_reduce not written: %s %s" % (dict(f["f/params/weight"].attrs),
                                                                                    dict(f["f"].attrs)))
    if f["f/inputs/x"].attrs.get("shard_dim") != 0:
        failures.append("fsdp_flat: the linear's default (x along 0) not filled in")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
