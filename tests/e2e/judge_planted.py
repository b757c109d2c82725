"""judge_planted.py OUT.h5: dumps written with torch (CPU) for judge_planted.sh.

Correct modules (/ok.*) computed as trainers compute them, and planted
0.1% systematic errors (/bad.<grad>.*: that gradient times 1.001 before
its output rounding), in bf16 and float32:
  linear        bf16 and float32 trainers; an autocast backward (float32
                tensors, X, W and dY cast to bf16 inside); a d_bias that
                is exactly zero in exact arithmetic (columns of dY that
                cancel, as k_proj's under softmax); a stale fp8 block scale
  rmsnorm, layernorm   torch's float32 kernels; a layernorm with 6 of 48
                rows constant to one ulp
  attention     float32 eager attention (bf16-valued q, k, v)
"""
import json
import sys

import h5py
import ml_dtypes
import numpy as np
import torch

F = np.float32
torch.manual_seed(0)
rng = np.random.default_rng(7)


def bf(a):
    return torch.as_tensor(np.asarray(a, F)).to(torch.bfloat16).float().numpy()


def put(g, name, a, as_bf16):
    a = np.asarray(a, F)
    if as_bf16:
        bits = (a.view(np.uint32) >> 16).astype(np.uint16)
        ds = g.create_dataset(name, data=bits)
        ds.attrs["dtype"] = "bfloat16"
    else:
        g.create_dataset(name, data=a)


def module(f, path, cls, contract, inputs, params, dy, grads, out_bf16, in_bf16=True, saved=None):
    g = f.create_group(path)
    g.attrs["class"] = cls
    g.attrs["contract"] = json.dumps(contract)
    for role, d in (("inputs", inputs), ("params", params), ("saved", saved or {})):
        for k, v in d.items():
            put(g.require_group(role), k, v, in_bf16)
    put(g.require_group("grad_out"), "dy", dy, in_bf16)
    for k, v in grads.items():
        put(g.require_group("grads").require_group("dy"), k, bf(v) if out_bf16 else v, out_bf16)


def variants(f, name, cls, contract, inputs, params, dy, grads, out_bf16, **kw):
    """/ok.<name> and one /bad.<grad>.<name> per gradient (that one x 1.001)."""
    module(f, "/ok." + name, cls, contract, inputs, params, dy, grads, out_bf16, **kw)
    for k in grads:
        g2 = dict(grads)
        g2[k] = (np.asarray(grads[k], np.float64) * 1.001).astype(F)
        module(f, "/bad.%s.%s" % (k, name), cls, contract, inputs, params, dy, g2, out_bf16, **kw)


def t(a, grad=True):
    return torch.tensor(np.asarray(a, F), requires_grad=grad)


def linear_grads(x, w, b, dy, cast=None):
    X, W, B = t(x), t(w), t(b)
    if cast is None:
        y = X @ W.T + B
    else:  # autocast: operands cast to bf16 inside, float32 accumulate, float32 out of bf16 values
        y = (X.to(cast) @ W.to(cast).T).float() + B
        dy = t(bf(dy), False)
    y.backward(torch.as_tensor(np.asarray(dy, F)))
    return {"d_x": X.grad.numpy(), "d_weight": W.grad.numpy(), "d_bias": B.grad.numpy()}


def main():
    out = sys.argv[1]
    M, K, N = 96, 256, 192
    with h5py.File(out, "w") as f:
        f.attrs["qatcheck_dump"] = 1
        nc = {"weight_format": "none", "dx_weight": "master"}
        # linear, bf16 trainer: bf16 values, float32 GEMMs, bf16 out
        x, w, b, dy = bf(rng.standard_normal((M, K))), bf(rng.standard_normal((N, K)) / 16), bf(rng.standard_normal(N)), \
            bf(rng.standard_normal((M, N)))
        variants(f, "linear_bf16", "linear", nc, {"x": x}, {"weight": w, "bias": b}, dy, linear_grads(x, w, b, dy), True)
        # linear, float32 trainer
        x32, w32, dy32 = (rng.standard_normal(s).astype(F) for s in ((M, K), (N, K), (M, N)))
        b32 = rng.standard_normal(N).astype(F)
        variants(f, "linear_f32", "linear", nc, {"x": x32}, {"weight": w32 / 16, "bias": b32}, dy32,
                 linear_grads(x32, w32 / 16, b32, dy32), False, in_bf16=False)
        # autocast: float32 tensors, the backward casts X, W and dY to bf16
        module(f, "/ok.linear_autocast", "linear", nc, {"x": x32}, {"weight": w32 / 16, "bias": b32}, dy32,
               linear_grads(x32, w32 / 16, b32, dy32, torch.bfloat16), False, in_bf16=False)
        # a d_bias that is zero in exact arithmetic: every column of dY sums to 0
        # (as k_proj's under softmax); float32 candidate summed in its own order
        dz = rng.standard_normal((M, N)) * 1e-5
        dz = (dz - dz.mean(0, keepdims=True)).astype(F)
        module(f, "/ok.linear_zero_bias", "linear", nc, {"x": x32}, {"weight": w32 / 16, "bias": b32}, dz,
               linear_grads(x32, w32 / 16, b32, dz), False, in_bf16=False)
        # fp8_block128 weight exact in e4m3 x a float32 block scale (quant(W) = W):
        # a stale scale in block (0, 0) makes d_x 0.1% off there
        q = rng.standard_normal((256, 256)).astype(ml_dtypes.float8_e4m3fn).astype(F)
        q[0, 0] = q[0, 128] = q[128, 0] = q[128, 128] = 448.0
        s = np.array([[0.0625 * 1.5, 0.125], [0.0625 * 1.25, 0.03125 * 1.75]], F)
        W8 = (q * np.kron(s, np.ones((128, 128), F))).astype(F)
        x8, dy8, b8 = bf(rng.standard_normal((M, 256))), bf(rng.standard_normal((M, 256))), bf(rng.standard_normal(256))
        c8 = {"weight_format": "fp8_block128", "dx_weight": "dequant"}
        g8 = linear_grads(x8, W8, b8, dy8)
        module(f, "/ok.linear_fp8_block", "linear", c8, {"x": x8}, {"weight": W8, "bias": b8}, dy8, g8, True)
        Ws = W8.copy()
        Ws[:128, :128] *= F(1.004)
        g8s = dict(g8)
        g8s["d_x"] = linear_grads(x8, Ws, b8, dy8)["d_x"]
        module(f, "/bad.d_x.linear_fp8_stale_scale", "linear", c8, {"x": x8}, {"weight": W8, "bias": b8}, dy8, g8s, True)
        # rmsnorm and layernorm, float32 kernels; bf16 and float32 outputs
        T, D = 48, 256
        xn, wn, bn, dyn = bf(rng.standard_normal((T, D))), bf(1 + 0.1 * rng.standard_normal(D)), bf(0.1 * rng.standard_normal(D)), \
            bf(rng.standard_normal((T, D)))
        for ob, tag in ((True, "bf16"), (False, "f32")):
            X, Wt = t(xn), t(wn)
            y = X * torch.rsqrt((X * X).mean(-1, keepdim=True) + 1e-6) * Wt  # eager RMSNorm, float32
            y.backward(torch.as_tensor(dyn))
            variants(f, "rmsnorm_" + tag, "rmsnorm", {"eps": 1e-6}, {"x": xn}, {"weight": wn}, dyn,
                     {"d_x": X.grad.numpy(), "d_weight": Wt.grad.numpy()}, ob)
            xl = xn.copy()
            if not ob:  # 6 of 48 rows constant to one ulp
                for r in range(0, 48, 8):
                    xl[r] = bf(1.5 + np.where(rng.random(D) < 0.5, 0, 2 ** -7))
            X, Wt, Bt = t(xl), t(wn), t(bn)
            y = torch.nn.functional.layer_norm(X, (D,), Wt, Bt, 1e-5)
            y.backward(torch.as_tensor(dyn))
            variants(f, "layernorm_" + tag, "layernorm", {"eps": 1e-5}, {"x": xl}, {"weight": wn, "bias": bn}, dyn,
                     {"d_x": X.grad.numpy(), "d_weight": Wt.grad.numpy(), "d_bias": Bt.grad.numpy()}, ob)
        # attention: float32 eager, causal, bf16-valued q, k, v
        B_, H, S, Dh = 1, 4, 64, 32
        qa, ka, va, dya = (bf(rng.standard_normal((B_, H, S, Dh))) for _ in range(4))
        sc = Dh ** -0.5
        s64 = sc * qa.astype(np.float64) @ ka.astype(np.float64).swapaxes(-1, -2)
        s64 = np.where(np.tril(np.ones((S, S), bool)), s64, -np.inf)
        mx = s64.max(-1, keepdims=True)
        lse = (mx[..., 0] + np.log(np.exp(s64 - mx).sum(-1))).astype(F)
        o = (np.exp(s64 - lse[..., None]) @ va.astype(np.float64)).astype(F)
        for ob, tag in ((True, "bf16"), (False, "f32")):
            Q, Kt, V = t(qa), t(ka), t(va)
            sco = (Q @ Kt.transpose(-1, -2)) * sc  # eager attention, float32
            sco = sco.masked_fill(~torch.tril(torch.ones(S, S, dtype=torch.bool)), float("-inf"))
            y = torch.softmax(sco, -1) @ V
            y.backward(torch.as_tensor(dya))
            grads = {"d_q": Q.grad.numpy(), "d_k": Kt.grad.numpy(), "d_v": V.grad.numpy()}
            variants(f, "attention_" + tag, "attention", {"causal": True, "softmax_scale": sc}, {"q": qa, "k": ka, "v": va}, {}, dya,
                     grads, ob, saved={"out": o, "lse": lse})


if __name__ == "__main__":
    main()
