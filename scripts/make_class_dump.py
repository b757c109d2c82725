#!/usr/bin/env python3
"""make_class_dump.py: write a small qatcheck dump with one module of each of
the classes rmsnorm, swiglu, logprob and router, whose candidate gradients
were computed the way a trainer computes them (numpy float32 closed forms
from bf16 inputs), plus one module per planted defect. Used by the
end-to-end test tests/e2e/class_dump.sh.

    make_class_dump.py OUT.h5 [--seed S]

Modules (class, contract):
  /model.layers.0.input_layernorm  rmsnorm  {"eps": 1e-6}
  /model.layers.0.mlp.act          swiglu   {"limit": 7}
  /model.lm_head.logprob           logprob  {"temperature": 0.7, "normalization": "mean_tokens"}
  /model.layers.0.mlp.router       router   {"score": "sigmoid", "normalize": "yes"}
  /model.layers.0.self_attn.sdpa   attention {"causal": true} (GQA 8/2, S 33, D 20)
Defects (group /defect.<name>, same class and contract as above):
  rmsnorm_no_mean     rmsnorm d_x without the mean term           -> d_x
  swiglu_clamp_pass   swiglu d_up with the clamp derivative 1     -> d_up
  logprob_count       logprob mean over all positions, not counted -> d_logits
  router_ids          router gradient at re-selected experts      -> d_logits
Attention, checked apart by tests/e2e/class_dump.sh (a wrong saved LSE
spoils every gradient, not one):
  /defect.attention_lse_log2  saved lse in log2 under lse_base "e", the
                      trainer's gradients computed from it -> d_q, d_k, d_v
  /bad.attention_no_lse       no saved/lse: the run cannot be judged (exit 2)
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


def rmsnorm_vjp(x, w, dy, eps, no_mean=False):
    rstd = F(1) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True, dtype=F) + F(eps))
    xh = x * rstd
    g = dy * w
    dx = rstd * g if no_mean else rstd * (g - xh * np.mean(g * xh, axis=-1, keepdims=True, dtype=F))
    return {"d_x": dx.astype(F), "d_weight": np.sum(dy * xh, axis=0, dtype=F)}


def swiglu_vjp(gate, up, dy, L, clamp_pass=False):
    gc = np.minimum(gate, F(L))
    uc = np.clip(up, F(-L), F(L))
    s = F(1) / (F(1) + np.exp(-gc))
    dg = np.where(gate <= L, dy * uc * s * (F(1) + gc * (F(1) - s)), F(0))
    du = dy * gc * s if clamp_pass else np.where(np.abs(up) <= L, dy * gc * s, F(0))
    return {"d_gate": dg.astype(F), "d_up": du.astype(F)}


def logprob_vjp(z, ids, mask, dy, T, all_positions=False):
    zt = z / F(T)
    p = np.exp(zt - zt.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True, dtype=F)
    n = mask.size if all_positions else max(int((mask != 0).sum()), 1)
    c = (dy * (mask != 0) / F(n) / F(T)).astype(F)
    d = -c[..., None] * p
    b, s = np.nonzero(mask)
    d[b, s, ids[b, s]] += c[b, s]
    return {"d_logits": d.astype(F)}


def router_vjp(x, ids, dy):
    s = F(1) / (F(1) + np.exp(-x))
    sel = np.take_along_axis(s, ids, 1)
    D = sel.sum(1, keepdims=True, dtype=F) + F(1e-20)
    ds_sel = dy / D - (dy * sel).sum(1, keepdims=True, dtype=F) / (D * D)
    ds = np.zeros_like(x)
    np.put_along_axis(ds, ids, ds_sel, 1)
    return {"d_logits": (ds * s * (F(1) - s)).astype(F)}


def attention_fwd(q, k, v, scale, causal):
    """float64 forward: O [B, Hq, S, D] and the natural LSE [B, Hq, S]."""
    grp = q.shape[1] // k.shape[1]
    kr, vr = (np.repeat(t.astype(np.float64), grp, axis=1) for t in (k, v))
    s = scale * q.astype(np.float64) @ kr.swapaxes(-1, -2)
    S = q.shape[2]
    if causal:
        s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    mx = s.max(-1, keepdims=True)
    lse = mx[..., 0] + np.log(np.exp(s - mx).sum(-1))
    return np.exp(s - lse[..., None]) @ vr, lse


def attention_vjp(q, k, v, o, lse, dy, scale, causal):
    """flash-attention backward in float32 from the saved O and (natural) LSE."""
    B, Hq, S, D = q.shape
    Hkv = k.shape[1]
    grp = Hq // Hkv
    kr, vr = np.repeat(k, grp, axis=1), np.repeat(v, grp, axis=1)
    s = (q @ kr.swapaxes(-1, -2)) * F(scale)
    p = np.exp(s - lse[..., None].astype(F))
    if causal:
        p = np.where(np.tril(np.ones((S, S), bool)), p, F(0))
    dv = p.swapaxes(-1, -2) @ dy
    dp = dy @ vr.swapaxes(-1, -2)
    delta = (dy * o).sum(-1, keepdims=True, dtype=F)
    ds = p * (dp - delta)
    dq = F(scale) * (ds @ kr)
    dk = F(scale) * (ds.swapaxes(-1, -2) @ q)
    red = lambda t: t.reshape(B, Hkv, grp, S, D).sum(2, dtype=F)  # noqa: E731
    return {"d_q": dq.astype(F), "d_k": red(dk), "d_v": red(dv)}


def group(f, path, cls, contract, inputs, params, saved, dys, grads, bf=True):
    """One module group; float32 inputs/params are stored as bf16 when bf."""
    g = f.create_group(path)
    g.attrs["class"] = cls
    g.attrs["contract"] = json.dumps(contract)
    for role, d in (("inputs", inputs), ("params", params), ("saved", saved)):
        for k, v in d.items():
            if v.dtype == F and bf:
                bf16.write(g.require_group(role), k, v)
            else:
                g.require_group(role).create_dataset(k, data=v)
    for name, dy in dys.items():
        bf16.write(g.require_group("grad_out"), name, dy)
        for k, v in grads(dy).items():
            g.require_group("grads").require_group(name).create_dataset(k, data=v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    r = np.random.default_rng(a.seed)
    nrm = lambda *s: bf16.round_(r.standard_normal(s).astype(F))  # noqa: E731
    with h5py.File(a.out, "w") as f:
        f.attrs["qatcheck_dump"] = 1
        # rmsnorm [T=37, D=200]
        x, w = nrm(37, 200), bf16.round_(1 + 0.1 * r.standard_normal(200).astype(F))
        dys = {"dy": nrm(37, 200)}
        for path, bad in (("/model.layers.0.input_layernorm", False), ("/defect.rmsnorm_no_mean", True)):
            group(f, path, "rmsnorm", {"eps": 1e-6}, {"x": x}, {"weight": w}, {}, dys,
                  lambda dy, bad=bad: rmsnorm_vjp(x, w, dy, 1e-6, bad))
        # swiglu [T=37, F=96], values around the limit 7
        gate, up = bf16.round_(3 * nrm(37, 96)), bf16.round_(3 * nrm(37, 96))
        dys = {"dy": nrm(37, 96)}
        for path, bad in (("/model.layers.0.mlp.act", False), ("/defect.swiglu_clamp_pass", True)):
            group(f, path, "swiglu", {"limit": 7}, {"gate": gate, "up": up}, {}, {}, dys,
                  lambda dy, bad=bad: swiglu_vjp(gate, up, dy, 7, bad))
        # logprob [B=3, S=16, V=50]: prompt and padding masked
        z = bf16.round_(2 * nrm(3, 16, 50))
        ids = r.integers(0, 50, (3, 16)).astype(np.int64)
        mask = np.ones((3, 16), np.uint8)
        mask[:, :2] = 0
        mask[1, 12:] = 0
        mask[2, 9:] = 0
        ids[mask == 0] = -100
        dys = {"dy": nrm(3, 16)}
        ctr = {"temperature": 0.7, "normalization": "mean_tokens"}
        for path, bad in (("/model.lm_head.logprob", False), ("/defect.logprob_count", True)):
            group(f, path, "logprob", ctr, {"logits": z}, {}, {"token_ids": ids, "loss_mask": mask}, dys,
                  lambda dy, bad=bad: logprob_vjp(z, ids, mask, dy, 0.7, bad))
        # router [T=29, E=16, k=4]: ids from sigmoid score + bias, frozen
        xl = r.standard_normal((29, 16)).astype(F)
        bias = (0.3 * r.standard_normal(16)).astype(F)
        key = 1 / (1 + np.exp(-xl.astype(np.float64))) + bias
        tk = np.argsort(-key, axis=1, kind="stable")[:, :4].astype(np.int64)
        tk_nobias = np.argsort(-xl, axis=1, kind="stable")[:, :4].astype(np.int64)
        dys = {"dy": nrm(29, 4)}
        ctr = {"score": "sigmoid", "normalize": "yes"}
        for path, use in (("/model.layers.0.mlp.router", tk), ("/defect.router_ids", tk_nobias)):
            group(f, path, "router", ctr, {"logits": xl}, {"bias": bias}, {"topk_ids": tk}, dys,
                  lambda dy, use=use: router_vjp(xl, use, dy), bf=False)
        # attention [B=2, Hq=8, Hkv=2, S=33, D=20], causal: q, k, v bf16 values, out/lse float32
        q, k, v = nrm(2, 8, 33, 20), nrm(2, 2, 33, 20), nrm(2, 2, 33, 20)
        sc = 1 / np.sqrt(20)
        o64, lse64 = attention_fwd(q, k, v, sc, True)
        o, lse = o64.astype(F), lse64.astype(F)
        lse2 = (lse64 / np.log(2)).astype(F)
        dys = {"dy": nrm(2, 8, 33, 20)}
        for path, ls in (("/model.layers.0.self_attn.sdpa", lse), ("/defect.attention_lse_log2", lse2)):
            group(f, path, "attention", {"causal": True}, {"q": q, "k": k, "v": v}, {}, {"out": o, "lse": ls}, dys,
                  lambda dy, ls=ls: attention_vjp(q, k, v, o, ls, dy.astype(F), sc, True), bf=False)
        group(f, "/bad.attention_no_lse", "attention", {"causal": True}, {"q": q, "k": k, "v": v}, {}, {"out": o}, dys,
              lambda dy: attention_vjp(q, k, v, o, lse, dy.astype(F), sc, True), bf=False)


if __name__ == "__main__":
    main()
