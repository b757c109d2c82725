#!/usr/bin/env python3
"""make_attention_dump.py: write a small qatcheck dump of attention modules
with a sliding window, a logit softcap and GQA, whose candidate gradients
are torch autograd's through an eager attention in float32 (the way a
trainer without a fused kernel computes them), plus planted defects. Used
by the end-to-end test tests/e2e/attention_dump.sh.

    make_attention_dump.py OUT.h5 [--seed S]

The eager attention (Gemma 2 order): s = (q k^T) * scale, s = m tanh(s / m)
(softcap m), then the causal and sliding-window mask (Hugging Face's
`kv_idx > q_idx - sliding_window`: key j visible to query i when
i - W < j <= i), softmax, P v. Shape B 2, Hq 4, Hkv 2, S 19, D 8; q, k, v
and dY bf16 values; saved out and the natural LSE from the same forward in
float64.

Modules (class attention, contract {"causal": true, "window": 5,
"softcap": 2.0}):
  /model.layers.0.self_attn.sdpa       correct                -> passes
  /defect.attention_window_wide        mask i - j <= W (one key more, the
                                       key at i - W attended)   -> fails
  /defect.attention_window_narrow      mask i - j < W - 1 (the key at
                                       i - W + 1 masked)        -> fails
  /defect.attention_softcap_no_grad    the cap's value in the forward, its
                                       derivative 1 in the backward (a
                                       detached tanh)  -> fails on d_q, d_k

Multi-head latent attention's core (DeepSeek-V3: q.k over more dims than
v; here D 12, Dv 8), contract {"causal": true} (softmax_scale 1/sqrt(D)):
  /model.layers.1.self_attn.mla        correct                -> passes
  /defect.attention_mla_scale_dv       forward and backward at 1/sqrt(Dv),
                                       v's head_dim       -> fails everywhere
"""
import argparse
import json
import sys

import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("h5py", "numpy", "torch")
import h5py
import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bf16  # noqa: E402

F = np.float32
W, CAP = 5, 2.0


def eager(q, k, v, scale, window, cap, cap_grad=True):
    """Eager GQA attention; returns O and the natural LSE (torch tensors)."""
    grp = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(grp, dim=1), v.repeat_interleave(grp, dim=1)
    s = (q @ kr.transpose(-1, -2)) * scale
    if cap > 0:
        c = cap * torch.tanh(s / cap)
        s = c if cap_grad else s + (c - s).detach()
    S = q.shape[2]
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    keep = (j <= i) & (j > i - window)
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1) @ vr, lse


def module(f, path, q, k, v, dy, window, cap_grad=True, cap=CAP, contract=None, scale=None):
    """One module group: saved out/lse from the float64 forward with this
    trainer's mask and scale (1/sqrt(q's head_dim) by default), grads from
    float32 autograd."""
    sc = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    t64 = [torch.tensor(x, dtype=torch.float64) for x in (q, k, v)]
    o64, lse64 = eager(*t64, sc, window, cap)
    t32 = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    o32, _ = eager(*t32, sc, window, cap, cap_grad)
    o32.backward(torch.tensor(dy))
    g = f.create_group(path)
    g.attrs["class"] = "attention"
    g.attrs["contract"] = json.dumps(contract or {"causal": True, "window": W, "softcap": CAP})
    for name, x in (("q", q), ("k", k), ("v", v)):
        g.require_group("inputs").create_dataset(name, data=x)
    g.require_group("saved").create_dataset("out", data=o64.numpy().astype(F))
    g.require_group("saved").create_dataset("lse", data=lse64.numpy().astype(F))
    bf16.write(g.require_group("grad_out"), "dy", dy)
    gr = g.require_group("grads").require_group("dy")
    for name, t in (("d_q", t32[0]), ("d_k", t32[1]), ("d_v", t32[2])):
        gr.create_dataset(name, data=t.grad.numpy().astype(F))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    r = np.random.default_rng(a.seed)
    nrm = lambda *s: bf16.round_(r.standard_normal(s).astype(F))  # noqa: E731
    q, k, v, dy = nrm(2, 4, 19, 8), bf16.round_(1.5 * nrm(2, 2, 19, 8)), nrm(2, 2, 19, 8), nrm(2, 4, 19, 8)
    with h5py.File(a.out, "w") as f:
        f.attrs["qatcheck_dump"] = 1
        module(f, "/model.layers.0.self_attn.sdpa", q, k, v, dy, W)
        module(f, "/defect.attention_window_wide", q, k, v, dy, W + 1)
        module(f, "/defect.attention_window_narrow", q, k, v, dy, W - 1)
        module(f, "/defect.attention_softcap_no_grad", q, k, v, dy, W, cap_grad=False)
        # MLA: D 12, Dv 8, GQA 4/2, no window (W >= S), no softcap
        q, k = nrm(2, 4, 19, 12), bf16.round_(1.5 * nrm(2, 2, 19, 12))
        v, dy = nrm(2, 2, 19, 8), nrm(2, 4, 19, 8)
        causal = {"causal": True}
        module(f, "/model.layers.1.self_attn.mla", q, k, v, dy, 19, cap=0, contract=causal)
        module(f, "/defect.attention_mla_scale_dv", q, k, v, dy, 19, cap=0, contract=causal, scale=1 / np.sqrt(8))


if __name__ == "__main__":
    main()
