"""judge_planted.py OUT.h5 [--seed S]: dumps written with torch (CPU) for
judge_planted.sh (seed 0) and scripts/bias-table.py (the correct modules,
/ok.*, under several seeds: the bias test's null).

Correct modules (/ok.*) computed as trainers compute them, and planted
0.1% systematic errors (/bad.<grad>.*: that gradient times 1.001 before
its output rounding), in bf16 and float32:
  linear        bf16 and float32 trainers; an autocast backward (float32
                tensors, X, W and dY cast to bf16 inside); a d_bias that
                is exactly zero in exact arithmetic (columns of dY that
                cancel, as k_proj's under softmax); a stale fp8 block scale
  rmsnorm, layernorm   torch's float32 kernels; a layernorm with 6 of 48
                rows constant to one ulp
  attention     float32 eager attention (bf16-valued q, k, v); keys that
                are all equal (d_q zero in exact arithmetic) and keys with a
                large common part (a k_proj bias: d_q ill-conditioned)
  swiglu, gelu  float32 eager, with gates and inputs where the derivative
                cancels (silu' near -1.28, gelu' near -0.75 and below)
  conv1d        a depthwise causal conv1d (F.conv1d); a float32 d_bias of
                columns of dY that sum to zero
  moe           routed experts (swiglu) and a shared expert, float32 loops
                in torch's order; and with the legal roundings of a
                grouped-GEMM backward (a, w dY, d_h and the shared expert's
                a, g dY, d_h to bf16), also with bf16 expert outputs y
  logprob       torch's log_softmax and gather, half the positions with a
                nearly certain token (1 - p_id cancels in float32); and every
                position nearly certain (float32, correct only)
  ssd           the chunked SSD scan (float32 cumsums of dt A, exp of their
                differences, as mamba_ssm's minimal chunked form) with long
                chunks of large dt A, where d_A cancels
"""
import json
import sys

import h5py
import ml_dtypes
import numpy as np
import torch

F = np.float32
SEED = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 0
torch.manual_seed(SEED)
rng = np.random.default_rng(7 + 1000 * SEED)


def bf(a):
    return torch.as_tensor(np.asarray(a, F)).to(torch.bfloat16).float().numpy()


def put(g, name, a, as_bf16):
    if np.issubdtype(np.asarray(a).dtype, np.integer):  # ids as they are
        g.create_dataset(name, data=np.asarray(a))
        return
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
            if role == "saved" and in_bf16 and np.asarray(v).dtype.kind == "f":
                v = bf(v)  # rounded to nearest, as a kernel stores it (put truncates: vjp judges saved/ against the forward)
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


def rb(v):
    """v rounded to bf16 in the forward, the gradient passed through."""
    return v + (v.to(torch.bfloat16).float() - v).detach()


def rb_grad(v):
    """v as is; its gradient rounded to bf16 (an operand of the backward GEMMs)."""
    if v.requires_grad:
        v.register_hook(lambda g: g.to(torch.bfloat16).float())
    return v


def moe_grads(x, tw, ids, w1, w2, dy, sw1, sw2, sg, ops=False, ybf=False):
    """Routed swiglu experts plus a gated shared expert, float32 eager; ops:
    a, w dY and d_h (the shared a, g dY, d_h) rounded to bf16, as a grouped
    bf16-GEMM backward; ybf: the expert outputs y held in bf16."""
    X, TW, W1, W2, S1, S2, SG = t(x), t(tw), t(w1), t(w2), t(sw1), t(sw2), t(sg)
    F_ = w2.shape[2]
    out = torch.zeros_like(X)
    for j in range(ids.shape[1]):
        for e in range(w1.shape[0]):
            sel = np.nonzero(ids[:, j] == e)[0]
            if len(sel) == 0:
                continue
            h = X[sel] @ W1[e].T
            if ops:
                h = rb_grad(h)
            a = torch.nn.functional.silu(h[:, :F_]) * h[:, F_:]
            ye = (rb(a) if ops else a) @ W2[e].T
            if ybf:
                ye = rb(ye)
            if ops:
                ye = rb_grad(ye)
            out = out.index_add(0, torch.as_tensor(sel), TW[sel, j:j + 1] * ye)
    hs = X @ S1.T
    if ops:
        hs = rb_grad(hs)
    Fs = sw2.shape[1]
    a_s = torch.nn.functional.silu(hs[:, :Fs]) * hs[:, Fs:]
    ys = (rb(a_s) if ops else a_s) @ S2.T
    if ops:
        ys = rb_grad(ys)
    out = out + torch.sigmoid(X @ SG)[:, None] * ys
    out.backward(torch.as_tensor(dy))
    return {"d_x": X.grad.numpy(), "d_topk_weights": TW.grad.numpy(), "d_w1": W1.grad.numpy(), "d_w2": W2.grad.numpy(),
            "d_shared_w1": S1.grad.numpy(), "d_shared_w2": S2.grad.numpy(), "d_shared_gate": SG.grad.numpy()}


def segsum(a):
    """[..., Q] -> [..., Q, Q]: cs_i - cs_j below the diagonal (float32 cumsums), -inf above."""
    cs = torch.cumsum(a, -1)
    d = cs[..., :, None] - cs[..., None, :]
    return d.masked_fill(~torch.tril(torch.ones(a.shape[-1], a.shape[-1], dtype=torch.bool)), float("-inf"))


def ssd_grads(x, dt, A, Bm, Cm, dy, Q):
    """Mamba-2's chunked SSD (mamba_ssm's minimal discrete form) in float32:
    X = x dt, A dt per step, G = 1 group; chunks of Q steps."""
    X0, DT, AA, BB, CC = t(x), t(dt), t(A), t(Bm), t(Cm)
    b, L, H, P = x.shape
    N, c = Bm.shape[-1], L // Q
    X = (X0 * DT[..., None]).reshape(b, c, Q, H, P)
    Ad = (DT * AA).reshape(b, c, Q, H).permute(0, 3, 1, 2)            # b h c l
    Bc = BB.reshape(b, c, Q, N)
    Cc = CC.reshape(b, c, Q, N)
    A_cs = torch.cumsum(Ad, -1)
    Lm = torch.exp(segsum(Ad))                                          # b h c l s
    y_diag = torch.einsum("bcln,bcsn,bhcls,bcshp->bclhp", Cc, Bc, Lm, X)
    decay = torch.exp(A_cs[..., -1:] - A_cs)
    states = torch.einsum("bcln,bhcl,bclhp->bchpn", Bc, decay, X)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], 1)
    dchunk = torch.exp(segsum(torch.nn.functional.pad(A_cs[..., -1], (1, 0))))
    states = torch.einsum("bhzc,bchpn->bzhpn", dchunk, states)[:, :-1]
    y_off = torch.einsum("bcln,bchpn,bhcl->bclhp", Cc, states, torch.exp(A_cs))
    y = (y_diag + y_off).reshape(b, L, H, P)
    y.backward(torch.as_tensor(dy))
    return {"d_x": X0.grad.numpy(), "d_dt": DT.grad.numpy(), "d_A": AA.grad.numpy(), "d_Bm": BB.grad.numpy(),
            "d_Cm": CC.grad.numpy()}


def classes(f):
    """swiglu, gelu, conv1d, moe and ssd: correct and planted, bf16 and float32 outputs."""
    T, Fd = 64, 256
    # gates and inputs spread over the derivative's cancellation (silu' = 0 near -1.28, gelu' near -0.75)
    gate = bf(np.concatenate([rng.uniform(-1.4, -1.15, (T // 4, Fd)), 2 * rng.standard_normal((3 * T // 4, Fd))]))
    up, dyg = bf(rng.standard_normal((T, Fd))), bf(rng.standard_normal((T, Fd)))
    xg = bf(np.concatenate([rng.uniform(-0.9, -0.6, (T // 4, Fd)), rng.uniform(-6, -3, (T // 8, Fd)),
                            2 * rng.standard_normal((5 * T // 8, Fd))]))
    B_, L_, C_, K_ = 4, 64, 96, 4
    xc, wc, bc, dyc = bf(rng.standard_normal((B_, L_, C_))), bf(rng.standard_normal((C_, K_)) / 2), bf(rng.standard_normal(C_)), \
        bf(rng.standard_normal((B_, L_, C_)))
    Tm, Hm, Fm, Em, km = 128, 64, 32, 6, 2
    xm, dym = bf(rng.standard_normal((Tm, Hm))), bf(rng.standard_normal((Tm, Hm)))
    ids = np.stack([rng.permutation(Em)[:km] for _ in range(Tm)]).astype(np.int32)
    tw = bf(rng.random((Tm, km)))
    w1, w2 = bf(rng.standard_normal((Em, 2 * Fm, Hm)) / np.sqrt(Hm)), bf(rng.standard_normal((Em, Hm, Fm)) / np.sqrt(Fm))
    sw1, sw2, sg = bf(rng.standard_normal((2 * Fm, Hm)) / np.sqrt(Hm)), bf(rng.standard_normal((Hm, Fm)) / np.sqrt(Fm)), \
        bf(rng.standard_normal(Hm) / np.sqrt(Hm))
    # ssd: chunks of 64 steps of dt A ~ -0.6 (cumsums to ~ -40 within a chunk)
    Bs, Ls, Hs, Ps, Ns, Qs = 2, 128, 2, 8, 16, 64
    xs, Bms, Cms, dys = bf(rng.standard_normal((Bs, Ls, Hs, Ps))), bf(rng.standard_normal((Bs, Ls, Ns))), \
        bf(rng.standard_normal((Bs, Ls, Ns))), bf(rng.standard_normal((Bs, Ls, Hs, Ps)))
    dts = rng.uniform(0.3, 0.9, (Bs, Ls, Hs)).astype(F)
    As = np.array([-1.0, -0.7], F)
    for ob, tag in ((True, "bf16"), (False, "f32")):
        G_, U_ = t(gate), t(up)
        (torch.nn.functional.silu(G_) * U_).backward(torch.as_tensor(dyg))
        variants(f, "swiglu_" + tag, "swiglu", {}, {"gate": gate, "up": up}, {}, dyg,
                 {"d_gate": G_.grad.numpy(), "d_up": U_.grad.numpy()}, ob)
        X_ = t(xg)
        torch.nn.functional.gelu(X_).backward(torch.as_tensor(dyg))
        variants(f, "gelu_" + tag, "gelu", {"approximate": "none"}, {"x": xg}, {}, dyg, {"d_x": X_.grad.numpy()}, ob)
        X_, W_, B0 = t(xc), t(wc), t(bc)
        y = torch.nn.functional.conv1d(X_.permute(0, 2, 1), W_[:, None, :], B0, padding=K_ - 1, groups=C_)[..., :L_]
        y.permute(0, 2, 1).backward(torch.as_tensor(dyc))
        variants(f, "conv1d_" + tag, "conv1d", {}, {"x": xc}, {"weight": wc, "bias": bc}, dyc,
                 {"d_x": X_.grad.numpy(), "d_weight": W_.grad.numpy(), "d_bias": B0.grad.numpy()}, ob)
        mc, mi, mp = {"activation": "swiglu", "shared_experts": 1, "shared_gate": True}, {"x": xm, "topk_weights": tw}, \
            {"w1": w1, "w2": w2, "shared_w1": sw1, "shared_w2": sw2, "shared_gate": sg}
        variants(f, "moe_" + tag, "moe", mc, mi, mp, dym, moe_grads(xm, tw, ids, w1, w2, dym, sw1, sw2, sg), ob,
                 saved={"topk_ids": ids})
        variants(f, "moe_ops_" + tag, "moe", mc, mi, mp, dym, moe_grads(xm, tw, ids, w1, w2, dym, sw1, sw2, sg, ops=True), ob,
                 saved={"topk_ids": ids})
        module(f, "/ok.moe_ops_ybf_" + tag, "moe", mc, mi, mp, dym,
               moe_grads(xm, tw, ids, w1, w2, dym, sw1, sw2, sg, ops=True, ybf=True), ob, saved={"topk_ids": ids})
        variants(f, "ssd_" + tag, "ssd", {"chunk_size": Qs}, {"x": xs, "dt": dts, "A": As, "Bm": Bms, "Cm": Cms}, {}, dys,
                 ssd_grads(xs, dts, As, Bms, Cms, dys, Qs), ob, in_bf16=False)
    # logprob: half the positions nearly certain (target logit +20: 1 - p_id ~ 1e-6)
    Sl, Vl, Tl = 64, 512, 0.7
    zl = bf(rng.standard_normal((1, Sl, Vl)) * 2)
    idl = rng.integers(0, Vl, (1, Sl)).astype(np.int32)
    zl[0, ::2][np.arange(Sl // 2), idl[0, ::2]] = bf(zl[0, ::2][np.arange(Sl // 2), idl[0, ::2]] + 20)
    dyl = bf(rng.standard_normal((1, Sl)))
    for ob, tag in ((True, "bf16"), (False, "f32")):
        Z = t(zl)
        lp = torch.log_softmax(Z / Tl, -1).gather(-1, torch.as_tensor(idl, dtype=torch.int64)[..., None])[..., 0]
        lp.backward(torch.as_tensor(dyl))
        variants(f, "logprob_" + tag, "logprob", {"temperature": Tl}, {"logits": zl}, {}, dyl, {"d_logits": Z.grad.numpy()}, ob,
                 saved={"token_ids": idl})
    # every position nearly certain: d_logits is float32 residue of 1 - p_id
    # (0.1% is below what float32 resolves there: correct only)
    zc = zl.copy()
    zc[0, 1::2][np.arange(Sl // 2), idl[0, 1::2]] = bf(zc[0, 1::2][np.arange(Sl // 2), idl[0, 1::2]] + 20)
    Z = t(zc)
    lp = torch.log_softmax(Z / Tl, -1).gather(-1, torch.as_tensor(idl, dtype=torch.int64)[..., None])[..., 0]
    lp.backward(torch.as_tensor(dyl))
    module(f, "/ok.logprob_certain_f32", "logprob", {"temperature": Tl}, {"logits": zc}, {}, dyl, {"d_logits": Z.grad.numpy()},
           False, saved={"token_ids": idl})
    # a float32 conv1d d_bias of columns of dY that sum to zero (cancellation)
    dz = rng.standard_normal((B_, L_, C_)) * 1e-3
    dz = (dz - dz.mean((0, 1), keepdims=True)).astype(F)
    X_, W_, B0 = t(xc), t(wc), t(bc)
    y = torch.nn.functional.conv1d(X_.permute(0, 2, 1), W_[:, None, :], B0, padding=K_ - 1, groups=C_)[..., :L_]
    y.permute(0, 2, 1).backward(torch.as_tensor(dz))
    module(f, "/ok.conv1d_zero_bias", "conv1d", {}, {"x": xc}, {"weight": wc, "bias": bc}, dz,
           {"d_x": X_.grad.numpy(), "d_weight": W_.grad.numpy(), "d_bias": B0.grad.numpy()}, False, in_bf16=False)


def attention_keys(f):
    """float32 attention whose keys are all equal (d_q = 0 in exact arithmetic)
    or share a large common part (d_q ill-conditioned, as under a k_proj bias)."""
    B_, H, S, Dh = 1, 2, 48, 32
    sc = Dh ** -0.5
    qa, va, dya = (bf(rng.standard_normal((B_, H, S, Dh))) for _ in range(3))
    kb = bf(rng.standard_normal((B_, H, 1, Dh)) * 4)
    for tag, ka in (("equal_keys", np.broadcast_to(kb, (B_, H, S, Dh)).copy()),
                    ("key_bias", bf(kb + 0.05 * rng.standard_normal((B_, H, S, Dh))))):
        s64 = sc * qa.astype(np.float64) @ ka.astype(np.float64).swapaxes(-1, -2)
        s64 = np.where(np.tril(np.ones((S, S), bool)), s64, -np.inf)
        mx = s64.max(-1, keepdims=True)
        lse = (mx[..., 0] + np.log(np.exp(s64 - mx).sum(-1))).astype(F)
        o = (np.exp(s64 - lse[..., None]) @ va.astype(np.float64)).astype(F)
        Q, Kt, V = t(qa), t(ka), t(va)
        sco = ((Q @ Kt.transpose(-1, -2)) * sc).masked_fill(~torch.tril(torch.ones(S, S, dtype=torch.bool)), float("-inf"))
        (torch.softmax(sco, -1) @ V).backward(torch.as_tensor(dya))
        module(f, "/ok.attention_" + tag, "attention", {"causal": True, "softmax_scale": sc}, {"q": qa, "k": ka, "v": va}, {}, dya,
               {"d_q": Q.grad.numpy(), "d_k": Kt.grad.numpy(), "d_v": V.grad.numpy()}, False, in_bf16=False,
               saved={"out": o, "lse": lse})


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
        attention_keys(f)
        classes(f)


if __name__ == "__main__":
    main()
