"""attention_saved.py: dumps of an attention autograd Function that saves
q, k, v beside O and the LSE, as most do, written by scripts/qatdump.py
(run by attention_saved.sh).

  d.h5      one model, four attention modules on the same q, k, v (B 1,
            H 2, S 24, D 16, causal, float32), each a flash-style
            backward from what its Function saved:
              attn_exact   saves (q, k, v, out, lse), qatcheck_saved
                           ["q_saved", "k_saved", "v_saved", "out", "lse"]
              attn_stale   the same, but the k it saves (and its backward
                           reads) is another step's, k + 0.05 N(0, 1); its
                           forward ran on the step's k
              attn_none    qatcheck_saved [None, None, None, "out", "lse"]
              attn_bf16o   saves (q, k, v, out, lse) with O returned and
                           saved in bf16 (the dumper records the contract's
                           saved_out_dtype bfloat16), qatcheck_saved
                           ["q", "k", "v", "out", "lse"]
  unk.h5    attn_exact with qatcheck_saved naming the saved v "scores",
            a name qatcheck does not know: refused
  bf16.h5   d.h5 with attn_exact's saved/k_saved rewritten as k rounded to
            bf16 (a bf16 copy: recognised); bf16bad.h5 the same copy one
            bf16 step off at one element (a mismatched copy)

usage: attention_saved.py TMPDIR"""
import json
import os
import shutil
import sys

import h5py
import numpy as np
import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "scripts"))
import bf16  # noqa: E402
import qatdump  # noqa: E402

tmp = sys.argv[1]
B, H, S, D = 1, 2, 24, 16


class FlashFn(torch.autograd.Function):
    """Causal attention whose backward is flash-attention's, in float32,
    from what the forward saved: P = exp(c q k^T - LSE), Delta =
    rowsum(dO * O), dS = P (dP - Delta)."""

    @staticmethod
    def forward(ctx, q, k, v, stale, out_bf16):
        c = D ** -0.5
        kk = k + stale if stale is not None else k  # what it saves: another step's k when stale
        s = (q @ k.transpose(-1, -2)) * c
        mask = torch.ones(S, S, dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        o = torch.softmax(s, dim=-1) @ v
        if out_bf16:
            o = o.to(torch.bfloat16)
        ctx.save_for_backward(q, kk, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        c = D ** -0.5
        do = do.float()
        mask = torch.ones(S, S, dtype=torch.bool).tril()
        p = torch.exp((q @ k.transpose(-1, -2)) * c - lse[..., None]).masked_fill(~mask, 0.0)
        dp = do @ v.transpose(-1, -2)
        delta = (do * o.float()).sum(-1, keepdim=True)
        ds = p * (dp - delta)
        return (ds @ k) * c, (ds.transpose(-1, -2) @ q) * c, p.transpose(-1, -2) @ do, None, None


class Attn(torch.nn.Module):
    qatcheck_class = "attention"
    qatcheck_inputs = ["q", "k", "v"]
    qatcheck_contract = {"causal": True}

    def __init__(self, saved, stale=None, out_bf16=False):
        super().__init__()
        self.qatcheck_saved = saved
        self.stale, self.out_bf16 = stale, out_bf16

    def forward(self, q, k, v):
        return FlashFn.apply(q, k, v, self.stale, self.out_bf16)


NAMES = ["q_saved", "k_saved", "v_saved", "out", "lse"]


class Model(torch.nn.Module):
    def __init__(self, unknown=False):
        super().__init__()
        self.proj = torch.nn.Linear(32, 3 * H * D)
        g = torch.Generator().manual_seed(1)
        self.attn_exact = Attn(["q_saved", "k_saved", "scores", "out", "lse"] if unknown else NAMES)
        if not unknown:
            self.attn_stale = Attn(NAMES, stale=0.05 * torch.randn(B, H, S, D, generator=g))
            self.attn_none = Attn([None, None, None, "out", "lse"])
            self.attn_bf16o = Attn(["q", "k", "v", "out", "lse"], out_bf16=True)

    def forward(self, x):
        q, k, v = self.proj(x).view(B, S, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
        return sum(m(q, k, v).float().sum() * (i + 1) for i, m in enumerate(
            x for x in (getattr(self, n, None) for n in ("attn_exact", "attn_stale", "attn_none", "attn_bf16o")) if x))


def dump(path, unknown=False):
    torch.manual_seed(0)
    model = Model(unknown)
    with qatdump.attach(model, path, modules=r"^attn_"):
        model(torch.randn(B, S, 32)).backward()


dump(tmp + "/d.h5")
dump(tmp + "/unk.h5", unknown=True)
with h5py.File(tmp + "/d.h5", "r") as f:
    ok = all(n in f["attn_exact/saved"] for n in ("q_saved", "k_saved", "v_saved", "out", "lse"))
    ok &= sorted(f["attn_none/saved"]) == ["lse", "out"]
    ok &= json.loads(f["attn_bf16o"].attrs["contract"]).get("saved_out_dtype") == "bfloat16"
    ok &= f["attn_bf16o/saved/out"].attrs.get("dtype") == "bfloat16"
    ok &= json.loads(f["attn_exact"].attrs["contract"]).get("saved_out_dtype") == "float32"
    if not ok:
        sys.exit("the dump does not hold what attention_saved.py expects")
shutil.copy(tmp + "/d.h5", tmp + "/bf16.h5")
with h5py.File(tmp + "/bf16.h5", "r+") as f:
    k = f["attn_exact/saved/k_saved"][()]
    del f["attn_exact/saved/k_saved"]
    bf16.write(f["attn_exact/saved"], "k_saved", k)
shutil.copy(tmp + "/bf16.h5", tmp + "/bf16bad.h5")
with h5py.File(tmp + "/bf16bad.h5", "r+") as f:
    b = f["attn_exact/saved/k_saved"][()]
    b.flat[37] += 1  # one bf16 step: the other side of the input's value or further
    f["attn_exact/saved/k_saved"][...] = b
print("dumps written")
