#!/usr/bin/env python3
"""make_flash_dump.py: write a qatcheck dump of attention modules whose
candidate gradients come from a flash-attention-style backward in float32
(numpy), from the O and LSE its forward saved. Used by the end-to-end test
tests/e2e/attention_flash_bf16.sh.

    make_flash_dump.py OUT.h5 [--seed S] [--shape B,Hq,Hkv,S,D]

The forward: s = c q k^T (c = 1/sqrt(D)), causal mask, LSE = logsumexp(s)
(float64, saved as float32, as flash-attention saves softmax_lse), O = P v
accumulated in float32. The backward, in float32, is FlashAttention-2/3's:
P = exp(c q k^T - LSE), dP = dO v^T, Delta = rowsum(dO * O) from the O the
forward saved, dS = P (dP - Delta), dQ = c dS K, dK = c dS^T Q, dV = P^T dO
(d_k, d_v summed over the query heads of a kv group). q, k, v and dY hold
bf16 values (stored as bf16).

Modules (class attention, contract {"causal": true, "saved_out_dtype":
"auto"}, the dtype saved/out is stored in, as scripts/qatdump.py records
it, unless said otherwise):
  /flash.o_bf16       O rounded to bf16 as the forward returned it (the
                      kernel's output dtype), saved in bf16, Delta from it
                                                                -> passes
  /flash.o_f32        O saved in float32, Delta from it         -> passes
  /flash.o_bf16_stored_f32
                      as o_bf16, saved/out stored in float32 (its bf16
                      values), contract saved_out_dtype bfloat16 -> passes
  /defect.lse_bf16    as o_bf16, but the LSE rounded to bf16 and saved so:
                      P = exp(s - bf16(LSE))                    -> fails
  /defect.o_bf16_declared_f32
                      as o_bf16, contract saved_out_dtype float32: the
                      contract says Delta reads a float32 O     -> fails
"""
import argparse
import json
import sys

import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("h5py", "numpy")
import h5py
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bf16  # noqa: E402

F = np.float32


def forward(q, k, v, c):
    """Causal GQA attention: O in float32 (float32 P and products), the
    natural LSE in float64."""
    B, Hq, S, D = q.shape
    grp = Hq // k.shape[1]
    kr, vr = np.repeat(k, grp, axis=1), np.repeat(v, grp, axis=1)
    s = c * np.einsum("bhid,bhjd->bhij", q.astype(np.float64), kr.astype(np.float64))
    mask = np.tril(np.ones((S, S), dtype=bool))
    s = np.where(mask, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    lse = (mx + np.log(np.exp(s - mx).sum(-1, keepdims=True)))[..., 0]
    p = np.exp(s - lse[..., None]).astype(F)
    o = np.matmul(p, vr.astype(F)).astype(F)
    return o, lse


def flash_bwd(q, k, v, o, lse, dy, c):
    """FlashAttention-2/3's backward in float32 from the saved O and LSE."""
    B, Hq, S, D = q.shape
    Hkv = k.shape[1]
    grp = Hq // Hkv
    kr, vr = np.repeat(k, grp, axis=1).astype(F), np.repeat(v, grp, axis=1).astype(F)
    s = np.matmul(q.astype(F), np.swapaxes(kr, -1, -2)).astype(F)
    mask = np.tril(np.ones((S, S), dtype=bool))
    p = np.where(mask, np.exp((F(c) * s - lse.astype(F)[..., None]).astype(F)), F(0)).astype(F)
    dp = np.matmul(dy.astype(F), np.swapaxes(vr, -1, -2)).astype(F)
    delta = (dy.astype(F) * o.astype(F)).sum(-1, dtype=F)  # Delta = rowsum(dO * O), float32 products and sum
    ds = (p * (dp - delta[..., None])).astype(F)
    dq = (F(c) * np.matmul(ds, kr)).astype(F)
    dk = (F(c) * np.matmul(np.swapaxes(ds, -1, -2), q.astype(F))).astype(F)
    dv = np.matmul(np.swapaxes(p, -1, -2), dy.astype(F)).astype(F)
    dk = dk.reshape(B, Hkv, grp, S, D).sum(2, dtype=F)
    dv = dv.reshape(B, Hkv, grp, S, -1).sum(2, dtype=F)
    return dq, dk, dv


def module(f, path, q, k, v, dy, o_bf16=True, lse_bf16=False, store_f32=False, contract=None):
    c = 1 / np.sqrt(q.shape[-1])
    o, lse = forward(q, k, v, c)
    if o_bf16:
        o = bf16.round_(o)
    lse = bf16.round_(lse.astype(F)) if lse_bf16 else lse.astype(F)
    dq, dk, dv = flash_bwd(q, k, v, o, lse, dy, c)
    g = f.create_group(path)
    g.attrs["class"] = "attention"
    g.attrs["contract"] = json.dumps(dict({"causal": True}, **(contract or {})))
    for name, x in (("q", q), ("k", k), ("v", v)):
        bf16.write(g.require_group("inputs"), name, x)
    sv = g.require_group("saved")
    (bf16.write(sv, "out", o) if o_bf16 and not store_f32 else sv.create_dataset("out", data=o))
    (bf16.write(sv, "lse", lse) if lse_bf16 else sv.create_dataset("lse", data=lse))
    bf16.write(g.require_group("grad_out"), "dy", dy)
    gr = g.require_group("grads").require_group("dy")
    for name, t in (("d_q", dq), ("d_k", dk), ("d_v", dv)):
        gr.create_dataset(name, data=t)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", default="1,4,2,128,64")
    a = ap.parse_args()
    B, Hq, Hkv, S, D = (int(x) for x in a.shape.split(","))
    r = np.random.default_rng(a.seed)
    nrm = lambda *s: bf16.round_(r.standard_normal(s).astype(F))  # noqa: E731
    q, k, v, dy = nrm(B, Hq, S, D), nrm(B, Hkv, S, D), nrm(B, Hkv, S, D), nrm(B, Hq, S, D)
    with h5py.File(a.out, "w") as f:
        f.attrs["qatcheck_dump"] = 1
        module(f, "/flash.o_bf16", q, k, v, dy, contract={"saved_out_dtype": "auto"})
        module(f, "/flash.o_f32", q, k, v, dy, o_bf16=False, contract={"saved_out_dtype": "auto"})
        module(f, "/flash.o_bf16_stored_f32", q, k, v, dy, store_f32=True, contract={"saved_out_dtype": "bfloat16"})
        module(f, "/defect.lse_bf16", q, k, v, dy, lse_bf16=True, contract={"saved_out_dtype": "auto"})
        module(f, "/defect.o_bf16_declared_f32", q, k, v, dy, contract={"saved_out_dtype": "float32"})


if __name__ == "__main__":
    main()
