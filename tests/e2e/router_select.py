"""router_select.py OUT.h5: router dumps whose saved/topk_ids are, or are
not, the selection their contract defines (tests/e2e/router_select.sh).

A DeepSeek-V3-style noaux_tc router (torch, float32): scores = sigmoid(logits),
selection keys = scores + e_score_correction_bias, 64 experts in 8 groups of
8, each group scored by the sum of its top-2 keys, the best 4 groups kept,
the top 8 keys of their experts selected; weights = the unbiased scores of
the selected experts, normalized, times 2.5. Every group's gradient is the
autograd backward of those weights with its own saved ids, so only the ids
can be wrong. Groups (T = 64 tokens):
  /noaux.correct   the selection as defined (token 0 has a near-tie: its
                   8th and 9th keys within one float32 ulp of the logits)
  /noaux.nobias    selected without the correction bias (weights unbiased)
  /noaux.nobias_pb the same, its bias dumped as params/bias
  /noaux.nogroup   top-8 of the keys over all 64 experts: topk_group ignored
  /noaux.neartie   /noaux.correct with token 0's near-tied pair swapped
  /plain.twin      no bias, no groups: token 0's 8th and 9th experts have
                   the same logit (an exact tie); the higher index saved
  /plain.softmax   softmax scores, top-6, as defined
  /plain.sqrtsp    sqrt(softplus) scores, top-6, as defined
  /plain.top1      sigmoid, top-1, normalized: the weight is 1 whatever the
                   logit, so the true d_logits cancels to ~eps/s^2 and the
                   candidate's is float32 rounding of that cancellation
  /plain.top1_bad  the same, the candidate's d_logits the unnormalized
                   weights' (the normalization left out of the backward)
  /plain.wide      sigmoid, top-8 of 64, normalized, logits N(0, 5^2): the
                   selected scores near 1, where float32's 1 - s rounds
Prints how many tokens each wrong selection routes differently.
"""
import json
import sys

import h5py
import numpy as np
import torch

T, E, K, NG, TG, SCALE = 64, 64, 8, 8, 4, 2.5


def noaux_select(logits, bias, use_bias=True, use_groups=True):
    s = logits.sigmoid()
    key = s + bias if use_bias else s
    if use_groups:
        gs = key.view(-1, NG, E // NG).topk(2, dim=-1)[0].sum(-1)
        gidx = gs.topk(TG, dim=-1)[1]
        keep = torch.zeros_like(gs).scatter_(1, gidx, 1).bool()
        key = key.masked_fill(~keep.repeat_interleave(E // NG, dim=1), float("-inf"))
    return key.topk(K, dim=-1)[1]


def weights(logits, ids, score="sigmoid", normalize=True, scale=SCALE):
    if score == "sigmoid":
        s = logits.sigmoid()
    elif score == "softmax":
        s = logits.softmax(-1)
    else:
        s = torch.nn.functional.softplus(logits).sqrt()
    w = s.gather(1, ids)
    if normalize:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w * scale


def group(f, path, contract, x, ids, bias=None, score="sigmoid", normalize=True, scale=SCALE, seed=0,
          bias_name="e_score_correction_bias", grad_normalize=None):
    g = f.create_group(path)
    g.attrs["class"] = "router"
    g.attrs["contract"] = json.dumps(contract)
    xl = torch.tensor(x, requires_grad=True)
    y = weights(xl, torch.tensor(ids), score, normalize, scale)
    dy = torch.tensor(np.random.default_rng(seed).standard_normal(y.shape).astype(np.float32))
    if grad_normalize is None or grad_normalize == normalize:
        y.backward(dy)
    else:  # a planted backward: y as normalize says, d_logits as grad_normalize
        weights(xl, torch.tensor(ids), score, grad_normalize, scale).backward(dy)
    g.create_dataset("inputs/logits", data=x)
    if bias is not None:
        g.create_dataset("params/" + bias_name, data=bias).attrs["frozen"] = "1"
    g.create_dataset("saved/topk_ids", data=ids.astype(np.int64))
    g.create_dataset("outputs/y", data=y.detach().numpy())
    g.create_dataset("grad_out/dy", data=dy.numpy())
    g.create_dataset("grads/dy/d_logits", data=xl.grad.numpy())


def differ(a, b):
    return int(sum(set(r) != set(q) for r, q in zip(a.tolist(), b.tolist())))


def main():
    r = np.random.default_rng(7)
    x = r.standard_normal((T, E)).astype(np.float32)
    bias = (0.1 * r.standard_normal(E)).astype(np.float32)
    xt, bt = torch.tensor(x), torch.tensor(bias)
    # token 0: raise its best unselected expert of a kept group (a's group)
    # until its key is within one ulp below the 8th key (expert a)
    ids = noaux_select(xt, bt)
    key = (xt.sigmoid() + bt)[0]
    a = int(min(ids[0].tolist(), key=lambda e: key[e]))
    cand = [e for e in range(E) if e // (E // NG) == a // (E // NG) and e not in ids[0].tolist()]
    b = max(cand, key=lambda e: key[e])
    target = float(key[a]) - float(bias[b])
    xb = np.float32(np.log(target / (1 - target)))
    while float(torch.tensor(xb).sigmoid() + bt[b]) >= float(key[a]):
        xb = np.nextafter(xb, np.float32(-np.inf))
    x[0, b] = xb
    xt = torch.tensor(x)
    ids = noaux_select(xt, bt).numpy()
    assert a in ids[0] and b not in ids[0], (a, b, ids[0])
    gap = float(((xt.sigmoid() + bt)[0, a] - (xt.sigmoid() + bt)[0, b]).double())
    near = ids.copy()
    near[0][near[0] == a] = b
    nob = noaux_select(xt, bt, use_bias=False).numpy()
    nog = noaux_select(xt, bt, use_groups=False).numpy()
    ctr = {"score": "sigmoid", "normalize": "yes", "route_scale": SCALE, "n_group": NG, "topk_group": TG}
    with h5py.File(sys.argv[1], "w") as f:
        f.attrs["qatcheck_dump"] = 1
        group(f, "/noaux.correct", ctr, x, ids, bias)
        group(f, "/noaux.nobias", ctr, x, nob, bias)
        group(f, "/noaux.nobias_pb", ctr, x, nob, bias, bias_name="bias")
        group(f, "/noaux.nogroup", ctr, x, nog, bias)
        group(f, "/noaux.neartie", ctr, x, near, bias)
        # plain routers: no bias, no groups
        xp = r.standard_normal((T, E)).astype(np.float32)
        xp[0] = -2.0
        xp[0, :7] = 3.0
        xp[0, 20] = xp[0, 40] = 1.0  # exact twins at the 8th place
        tw = torch.tensor(xp).topk(K, dim=-1)[1].numpy()
        tw[0] = [0, 1, 2, 3, 4, 5, 6, 40]
        group(f, "/plain.twin", {"score": "sigmoid", "normalize": "yes"}, xp, tw, scale=1.0)
        for name, score in (("softmax", "softmax"), ("sqrtsp", "sqrt_softplus")):
            xs = (2 * r.standard_normal((T, E))).astype(np.float32)
            i6 = torch.tensor(xs).topk(6, dim=-1)[1].numpy()
            group(f, "/plain." + name, {"score": score}, xs, i6, score=score, normalize=False, scale=1.0)
        x1 = r.standard_normal((T, E)).astype(np.float32)
        i1 = torch.tensor(x1).topk(1, dim=-1)[1].numpy()
        c1 = {"score": "sigmoid", "normalize": "yes", "route_scale": SCALE}
        group(f, "/plain.top1", c1, x1, i1)
        group(f, "/plain.top1_bad", c1, x1, i1, grad_normalize=False)
        xw = (5 * r.standard_normal((T, E))).astype(np.float32)
        group(f, "/plain.wide", c1, xw, torch.tensor(xw).topk(K, dim=-1)[1].numpy())
    print("nobias: %d of %d tokens differ; nogroup: %d; near-tie gap %.3g (token 0, experts %d and %d)"
          % (differ(nob, ids), T, differ(nog, ids), gap, a, b))


if __name__ == "__main__":
    main()
