#!/usr/bin/env python3
"""make_diag_dump.py: write a qatcheck dump with one planted defect per
diagnosis hypothesis (docs/tolerances.md, "Diagnosis"), each in its own
module group, beside correct modules, so that tests/e2e/diagnose.sh can check
that every failed check's diagnosis names its planted cause and that nothing
is diagnosed where nothing failed. Candidates are computed as a BF16 trainer
computes them (bf16 operands, float32 accumulation, bf16 outputs) for the
linear groups; the attention group is a float32 flash backward.

    make_diag_dump.py OUT.h5 [--seed S]

Groups (linear [M=96, K=64, N=64] unless stated; the hypothesis expected):
  /ok.linear                        correct                          -
  /ok.mlp.experts.0.down_proj       correct                          -
  /defect.doubled                   d_weight x 2                     factor (2)
  /defect.halved                    d_x x 0.5                        factor (1/2)
  /defect.mlp.experts.1.down_proj   d_weight x 1/8 (expert path)     factor (1/8, expert-DP)
  /defect.sign                      d_x negated                      sign
  /defect.transposed_dw             d_weight transposed              transpose
  /defect.shifted_rows              d_x rows shifted by 2            rows
  /defect.permuted_rows             d_x rows permuted                rows
  /defect.dx_master                 fp8_channel contract, d_x from the master weight   dx_convention
  /defect.weight_t                  d_x = dY W^T                     weight_transposed
  /defect.stale_weight              d_x from a weight with 5% noise  other_weight
  /defect.dy_fp8                    d_x, d_weight from an e4m3-rounded dY (per-tensor scale)  dy_precision
  /defect.frozen_zero               params/weight frozen, d_weight present and zero   zero
  /defect.cut_dx                    d_x zero                          zero
  /defect.nan                       one NaN in d_x                    nonfinite
  /defect.attention_head            attention [B=1, Hq=4, Hkv=2, S=24, D=16]: d_q of head 2 zero   slice
  /ok.attention                     the same, correct                 -

With --set users, the mistakes users make in a quantized forward and
backward instead (tests/e2e/forward_check.sh, diagnose_users.sh), linear
[M=64, K=256, N=192] with outputs/y computed by torch (float32 GEMM on
the dequantized operands, bf16 output) and the quantizers of
scripts/conformance/quant_oracle.py:
  /ok.fwd.<format>                  correct, every weight format (and fp8_token X)  -
  /defect.fwd_scaled                outputs/y x 1.001                 factor
  /defect.fwd_profile               mxfp8 'vllm' declared, 'ocp' used in the forward   profile
  /defect.fwd_per_tensor            fp8_block128 declared, fp8_tensor used            weight_format
  /defect.fwd_per_block             fp8_channel declared, fp8_block128 used           weight_format
  /defect.fwd_stale                 fp8_tensor, the scale of a weight 3% smaller      stale_scale
  /defect.fwd_x_bf16                fp8_token X (float32) rounded to bf16 first        rounded_input
  /defect.dx_profile                mxfp4 'vllm', d_x from W quantized by 'exact'      profile
  /defect.dx_per_tensor             fp8_block128, d_x from an fp8_tensor W             weight_format
  /defect.dx_stale                  fp8_tensor, d_x from W quantized with a 3% smaller weight's scale   stale_scale
  /defect.bias_axis                 [64, 64] dY: d_bias summed over the features       axis
  /defect.bias_axis_rect            [64, 192] dY: the same, 64 values for 192 features  (shape: wrong axis)
  /defect.dw_x_fp8                  d_weight from X rounded to e4m3 (float32 X)        input_precision
  /ok.fwd.rmsnorm, /ok.fwd.swiglu   torch autograd forward and backward (outputs/y bf16)  -
  /ok.fwd.attention                 causal attention [1, 4/2, 24, 16], torch autograd     -
  /defect.rmsnorm_zero_centered     x rstd (1 + w) under zero_centered false            zero_centered
  /defect.attention_shift           its causal mask shifted by +1 (tril(diagonal=1)), forward and backward
                                                                      causal_shift_plus1
"""
import argparse
import json
import sys

import h5py
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bf16  # noqa: E402
from make_class_dump import attention_fwd, attention_vjp  # noqa: E402

F = np.float32


def e4m3(a):
    """float32 -> nearest float8_e4m3fn value (RNE, saturating at 448), as float32."""
    import ml_dtypes
    return np.clip(a, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(F)


def linear_grads(x, w, dy):
    return (bf16.round_(np.matmul(dy, w, dtype=F)), bf16.round_(np.matmul(dy.T, x, dtype=F)),
            bf16.round_(dy.sum(axis=0, dtype=F)))


def linear(f, path, x, w, b, dy, defect=None, rng=None, contract=None):
    g = f.create_group(path)
    g.attrs["class"] = "linear"
    g.attrs["contract"] = json.dumps(contract or {"weight_format": "none", "dx_weight": "master"})
    bf16.write(g.require_group("inputs"), "x", x)
    wd = bf16.write(g.require_group("params"), "weight", w)
    bf16.write(g["params"], "bias", b)
    bf16.write(g.require_group("grad_out"), "dy", dy)
    dx, dw, db = linear_grads(x, w, dy)
    acc_dx, acc_dw = np.matmul(dy, w, dtype=F), np.matmul(dy.T, x, dtype=F)
    if defect == "doubled":
        dw = bf16.round_(acc_dw * F(2))
    elif defect == "halved":
        dx = bf16.round_(acc_dx * F(0.5))
    elif defect == "eighth":
        dw = bf16.round_(acc_dw / F(8))
    elif defect == "sign":
        dx = -dx
    elif defect == "transposed_dw":
        dw = dw.T.copy()
    elif defect == "shifted_rows":
        dx = np.concatenate([np.zeros((2, dx.shape[1]), F), dx[:-2]])
    elif defect == "permuted_rows":
        p = np.arange(dx.shape[0])
        for i in range(0, 24, 2):
            p[[i, 40 + i]] = p[[40 + i, i]]
        dx = dx[p]
    elif defect == "weight_t":
        dx = bf16.round_(np.matmul(dy, w.T, dtype=F))
    elif defect == "stale_weight":
        ws = bf16.round_(w * (1 + 0.05 * rng.standard_normal(w.shape).astype(F)))
        dx = bf16.round_(np.matmul(dy, ws, dtype=F))
    elif defect == "dy_fp8":
        s = F(np.abs(dy).max() / 448)
        dq = e4m3(dy / s) * s
        dx, dw, _ = linear_grads(x, w, dq)
    elif defect == "frozen_zero":
        wd.attrs["frozen"] = "1"
        dw = np.zeros_like(dw)
    elif defect == "cut_dx":
        dx = np.zeros_like(dx)
    elif defect == "nan":
        dx = dx.copy()
        dx[50, 7] = np.nan
    gg = g.require_group("grads").require_group("dy")
    bf16.write(gg, "d_x", dx)
    bf16.write(gg, "d_weight", dw)
    bf16.write(gg, "d_bias", db)


def attention(f, path, rng, defect=None):
    nrm = lambda *s: bf16.round_(rng.standard_normal(s).astype(F))  # noqa: E731
    q, k, v = nrm(1, 4, 24, 16), nrm(1, 2, 24, 16), nrm(1, 2, 24, 16)
    sc = 1 / np.sqrt(16)
    o64, lse64 = attention_fwd(q, k, v, sc, True)
    o, lse = o64.astype(F), lse64.astype(F)
    dy = nrm(1, 4, 24, 16)
    gr = attention_vjp(q, k, v, o, lse, dy, sc, True)
    if defect == "head":
        gr["d_q"][:, 2] = 0
    g = f.create_group(path)
    g.attrs["class"] = "attention"
    g.attrs["contract"] = json.dumps({"causal": True})
    for name, t in (("q", q), ("k", k), ("v", v)):
        bf16.write(g.require_group("inputs"), name, t)
    g.require_group("saved").create_dataset("out", data=o)
    g["saved"].create_dataset("lse", data=lse)
    bf16.write(g.require_group("grad_out"), "dy", dy)
    for name, t in gr.items():
        g.require_group("grads").require_group("dy").create_dataset(name, data=t)


def user_linear(f, path, x, w, b, dy, contract, fwd=None, defect=None, x_f32=False):
    """A linear group whose outputs/y is torch's forward on the dequantized
    operands (fwd: the contract's formats, or those the planted mistake
    used) and whose gradients are a bf16 trainer's under the contract."""
    import torch
    sys.path.insert(0, __file__.rsplit("/", 1)[0] + "/conformance")
    import quant_oracle as qo
    fwd = dict(contract, **(fwd or {}))
    prof = fwd.get("profile", "vllm")

    def fq(fmt, a, p):
        return np.asarray(qo.fake_quant(fmt, p, np.asarray(a, F)), F)
    xin = bf16.round_(x) if defect == "x_bf16" else x
    if "stale" in fwd:  # the weight quantized per tensor with an earlier weight's amax
        s = F(np.abs(fwd["stale"]).max() / 448)
        import ml_dtypes
        wq = np.clip(w / s, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(F) * s
    else:
        wq = fq(fwd.get("weight_format", "none"), w, prof)
    xq = fq(fwd.get("activation_format", "none"), xin, prof)
    y = (torch.from_numpy(xq) @ torch.from_numpy(wq).T + torch.from_numpy(b)).numpy()
    if defect == "scaled":
        y = y * F(1.001)
    g = f.create_group(path)
    g.attrs["class"] = "linear"
    g.attrs["contract"] = json.dumps(contract)
    if x_f32:
        g.require_group("inputs").create_dataset("x", data=x)
    else:
        bf16.write(g.require_group("inputs"), "x", x)
    bf16.write(g.require_group("params"), "weight", w)
    bf16.write(g["params"], "bias", b)
    bf16.write(g.require_group("outputs"), "y", y)
    bf16.write(g.require_group("grad_out"), "dy", dy)
    cq = fq(contract.get("weight_format", "none"), w, contract.get("profile", "vllm"))
    if defect == "dx_profile":
        cq = fq(contract["weight_format"], w, "exact")
    elif defect == "dx_per_tensor":
        cq = fq("fp8_tensor", w, "vllm")
    elif defect == "dx_stale":
        import ml_dtypes
        s = F(np.abs(w * F(0.97)).max() / 448)
        cq = np.clip(w / s, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(F) * s
    t = torch.from_numpy
    xo = e4m3(x / F(np.abs(x).max() / 448)) * F(np.abs(x).max() / 448) if defect == "dw_x_fp8" else x
    dx = bf16.round_((t(dy) @ t(cq)).numpy())
    dw = bf16.round_((t(dy).T @ t(xo)).numpy())
    db = bf16.round_(t(dy).sum(1 if defect == "bias_axis" else 0).numpy())
    gg = g.require_group("grads").require_group("dy")
    bf16.write(gg, "d_x", dx)
    bf16.write(gg, "d_weight", dw)
    bf16.write(gg, "d_bias", db)


def torch_group(f, path, cls, contract, inputs, params, fn, saved=None, bf=True):
    """A group whose outputs/y and gradients are torch autograd's (float32)
    of fn(*inputs, *params); bf: inputs and params stored as bf16."""
    import torch
    ts = {k: torch.tensor(v, requires_grad=True) for k, v in list(inputs.items()) + list(params.items())}
    y = fn(**ts)
    dy = bf16.round_(np.random.default_rng(7).standard_normal(tuple(y.shape)).astype(F))
    y.backward(torch.from_numpy(dy))
    g = f.create_group(path)
    g.attrs["class"] = cls
    g.attrs["contract"] = json.dumps(contract)
    for role, d in (("inputs", inputs), ("params", params)):
        for k, v in d.items():
            (bf16.write if bf else lambda gr, n, a: gr.create_dataset(n, data=a))(g.require_group(role), k, v)
    for k, v in (saved or {}).items():
        g.require_group("saved").create_dataset(k, data=v(ts).astype(F))
    bf16.write(g.require_group("outputs"), "y", y.detach().numpy())
    bf16.write(g.require_group("grad_out"), "dy", dy)
    for k, t in ts.items():
        g.require_group("grads").require_group("dy").create_dataset("d_" + k, data=t.grad.numpy().astype(F))


def attention_torch(shift):
    """causal attention of q [1, 4, S, D], k, v [1, 2, S, D] (GQA), its mask's
    diagonal moved by shift: fn for torch_group, and its saved out and lse."""
    import torch

    def scores(q, k):
        s = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) / 4.0
        S = q.shape[2]
        keep = torch.ones(S, S, dtype=torch.bool).tril(shift)
        return s.masked_fill(~keep, float("-inf"))

    def fn(q, k, v):
        return torch.softmax(scores(q, k), -1) @ v.repeat_interleave(2, 1)
    saved = {"out": lambda ts: fn(ts["q"], ts["k"], ts["v"]).detach().numpy(),
             "lse": lambda ts: torch.logsumexp(scores(ts["q"], ts["k"]), -1).detach().numpy()}
    return fn, saved


def users(f, rng):
    """The groups of --set users (see the docstring)."""
    m, k, n = 64, 256, 192
    x = bf16.round_(rng.standard_normal((m, k)).astype(F))
    w = bf16.round_((rng.standard_normal((n, k)) / np.sqrt(k)).astype(F))
    b = bf16.round_(0.1 * rng.standard_normal(n).astype(F))
    dy = bf16.round_(rng.standard_normal((m, n)).astype(F))
    for fmt in ("none", "fp8_tensor", "fp8_channel", "fp8_block128", "fp8_block128_ue8m0", "nvfp4", "mxfp8", "mxfp4"):
        user_linear(f, "/ok.fwd." + fmt, x, w, b, dy, {"weight_format": fmt})
    user_linear(f, "/ok.fwd.fp8_token_act", x, w, b, dy, {"weight_format": "fp8_block128", "activation_format": "fp8_token"})
    user_linear(f, "/defect.fwd_scaled", x, w, b, dy, {"weight_format": "fp8_block128"}, defect="scaled")
    user_linear(f, "/defect.fwd_profile", x, w, b, dy, {"weight_format": "mxfp8", "profile": "vllm"}, {"profile": "ocp"})
    user_linear(f, "/defect.fwd_per_tensor", x, w, b, dy, {"weight_format": "fp8_block128"}, {"weight_format": "fp8_tensor"})
    user_linear(f, "/defect.fwd_per_block", x, w, b, dy, {"weight_format": "fp8_channel"}, {"weight_format": "fp8_block128"})
    user_linear(f, "/defect.fwd_stale", x, w, b, dy, {"weight_format": "fp8_tensor"}, {"stale": w * F(0.97)})
    x32 = rng.standard_normal((m, k)).astype(F)
    user_linear(f, "/ok.fwd.x_f32", x32, w, b, dy, {"weight_format": "fp8_block128", "activation_format": "fp8_token"},
                x_f32=True)
    user_linear(f, "/defect.fwd_x_bf16", x32, w, b, dy, {"weight_format": "fp8_block128", "activation_format": "fp8_token"},
                defect="x_bf16", x_f32=True)
    user_linear(f, "/defect.dx_profile", x, w, b, dy, {"weight_format": "mxfp4", "profile": "vllm"}, defect="dx_profile")
    user_linear(f, "/defect.dx_per_tensor", x, w, b, dy, {"weight_format": "fp8_block128"}, defect="dx_per_tensor")
    user_linear(f, "/defect.dx_stale", x, w, b, dy, {"weight_format": "fp8_tensor"}, defect="dx_stale")
    sq = bf16.round_(rng.standard_normal((m, m)).astype(F))
    wsq = bf16.round_((rng.standard_normal((m, k)) / np.sqrt(k)).astype(F))
    user_linear(f, "/defect.bias_axis", x, wsq, b[:m].copy(), sq, {"weight_format": "none"}, defect="bias_axis")
    user_linear(f, "/defect.bias_axis_rect", x, w, b, dy, {"weight_format": "none"}, defect="bias_axis")
    user_linear(f, "/defect.dw_x_fp8", x32, w, b, dy, {"weight_format": "none"}, defect="dw_x_fp8", x_f32=True)
    import torch
    nrm = lambda *sh: bf16.round_(rng.standard_normal(sh).astype(F))  # noqa: E731
    xr, wr = nrm(37, 200), bf16.round_(1 + 0.1 * rng.standard_normal(200).astype(F))
    torch_group(f, "/ok.fwd.rmsnorm", "rmsnorm", {"eps": 1e-6}, {"x": xr}, {"weight": wr},
                lambda x, weight: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * weight)
    torch_group(f, "/defect.rmsnorm_zero_centered", "rmsnorm", {"eps": 1e-6}, {"x": xr}, {"weight": wr},
                lambda x, weight: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * (1 + weight))
    torch_group(f, "/ok.fwd.swiglu", "swiglu", {}, {"gate": nrm(37, 96), "up": nrm(37, 96)}, {},
                lambda gate, up: torch.nn.functional.silu(gate) * up)
    qkv = {"q": nrm(1, 4, 24, 16), "k": nrm(1, 2, 24, 16), "v": nrm(1, 2, 24, 16)}
    for path, shift in (("/ok.fwd.attention", 0), ("/defect.attention_shift", 1)):
        fn, saved = attention_torch(shift)
        torch_group(f, path, "attention", {"causal": True}, qkv, {}, fn, saved)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", choices=("hypotheses", "users"), default="hypotheses")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    if a.set == "users":
        with h5py.File(a.out, "w") as f:
            f.attrs["qatcheck_dump"] = 1
            users(f, rng)
        return
    m, k, n = 96, 64, 64
    x = bf16.round_(rng.standard_normal((m, k)).astype(F))
    w = bf16.round_((rng.standard_normal((n, k)) / np.sqrt(k)).astype(F))
    b = bf16.round_(0.1 * rng.standard_normal(n).astype(F))
    dy = bf16.round_(rng.standard_normal((m, n)).astype(F))
    with h5py.File(a.out, "w") as f:
        f.attrs["qatcheck_dump"] = 1
        linear(f, "/ok.linear", x, w, b, dy)
        linear(f, "/ok.mlp.experts.0.down_proj", x, w, b, dy)
        for name, d in (("doubled", "doubled"), ("halved", "halved"), ("mlp.experts.1.down_proj", "eighth"), ("sign", "sign"),
                        ("transposed_dw", "transposed_dw"), ("shifted_rows", "shifted_rows"),
                        ("permuted_rows", "permuted_rows"), ("weight_t", "weight_t"), ("stale_weight", "stale_weight"),
                        ("dy_fp8", "dy_fp8"), ("frozen_zero", "frozen_zero"), ("cut_dx", "cut_dx"), ("nan", "nan")):
            linear(f, "/defect." + name, x, w, b, dy, d, rng)
        linear(f, "/defect.dx_master", x, w, b, dy, None, rng, {"weight_format": "fp8_channel", "dx_weight": "dequant"})
        attention(f, "/ok.attention", np.random.default_rng(a.seed + 1))
        attention(f, "/defect.attention_head", np.random.default_rng(a.seed + 1), "head")


if __name__ == "__main__":
    main()
