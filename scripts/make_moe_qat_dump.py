#!/usr/bin/python3
"""make_moe_qat_dump.py: a dump of routed-expert (class moe) modules under
expert QAT (FP8 forward / BF16 backward): each expert's w1[e], w2[e]
quantized on its own with deployed bytes made by the independent oracle
(scripts/conformance/quant_oracle.py), the rows of x and act(h) quantized
per token, the saved FC1 output, and the trainer's gradients (candidate:
dump) computed here in float64 from the contract, plus one module per
planted expert defect. Used by tests/e2e/moe_qat.sh.

    make_moe_qat_dump.py OUT.h5 [--seed S] [--ep-dir DIR]

Modules (T 24 tokens, H 256, F 128, E 6 experts, top-2, swiglu; expert 3
empty, tokens 1, 5, 9, ... routed twice to one expert):
  /moe.fp8        fp8_block128 experts (saved/w1_q, w1_scale_inv, w2_q,
                  w2_scale_inv), fp8_group128 activations, saved/fc1_out
  /moe.nvfp4      nvfp4 experts (w*_q, w*_scale e4m3 bytes, w*_global_scale
                  [E]), bf16 activations
Defects (as /moe.fp8 unless said):
  /defect.stale_scale   expert 4's w1 bytes and scales quantized from a
                        stale master (1.25 x); its forward and backward used them
  /defect.dx_master     expert 2's backward (d_a, d_x) through its master
                        weights where the contract says dequantized
  /defect.dx_master_all every expert's backward through its master weights
  /defect.empty_grad    a nonzero d_w1 for expert 3, which no token selects
  /defect.empty_grad_bf16  the same in a bf16 module (no expert formats)
  /defect.fc1_master    saved/fc1_out from the master weights, not the
                        dequantized ones (the gradients are correct)
With --ep-dir DIR, the fp8 module expert-parallel over 2 ranks with
data-parallel tokens (DIR/step.rank0.h5, step.rank1.h5; rank 1 holds
experts 3..5 by their global ids): /ep correct, /ep_stale with expert 4's
stale w1 bytes (and the gradients they gave), /ep_empty with a nonzero
d_w1 for the empty expert 3 (rank 1's first).
"""
import argparse
import json
import os
import sys

import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("h5py", "numpy", "ml_dtypes")
import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "conformance"))
import bf16  # noqa: E402
import quant_oracle as O  # noqa: E402

F32 = np.float32
T, H, F, E, K = 24, 256, 128, 6, 2
EMPTY = 3
DT = {"fp8": "float8_e4m3fn", "fp4": "float4_e2m1fn_x2", "e8m0": "float8_e8m0fnu"}


def sig(z):
    return 1.0 / (1.0 + np.exp(-z))


def fq(fmt, x):
    """dequant(quant(x)) by the oracle under vllm, in float64 (x narrowed to float32 first)."""
    return O.fake_quant(fmt, "vllm", np.asarray(x, F32)).astype(np.float64)


def moe(x, w1q, w2q, w1b, w2b, ids, wt, dy, afmt, master_e=None):
    """Forward and backward from the contract, float64: the forward through
    w1q, w2q (the dequantized weights) on the quantized rows of x and a; the
    backward's d_a, d_x through w1b, w2b (w1q, w2q, or the masters for the
    experts in master_e); d_w1, d_w2 from x and a unquantized."""
    xq = fq(afmt, x) if afmt != "none" else x.astype(np.float64)
    X = x.astype(np.float64)
    G = dy.astype(np.float64)
    y = np.zeros((T, H))
    fc1 = np.zeros((T, K, 2 * F))
    d = {"d_x": np.zeros((T, H)), "d_w1": np.zeros((E, 2 * F, H)), "d_w2": np.zeros((E, H, F)), "d_topk_weights": np.zeros((T, K))}
    for t in range(T):
        for j in range(K):
            e = ids[t, j]
            W1b, W2b = (w1b, w2b) if master_e is None or e not in master_e else (master_e[e][0], master_e[e][1])
            h = w1q[e] @ xq[t]
            fc1[t, j] = h
            g_, u = h[:F], h[F:]
            s = sig(g_)
            a = g_ * s * u
            aq = fq(afmt, a[None, :])[0] if afmt != "none" else a
            ye = w2q[e] @ aq
            y[t] += wt[t, j] * ye
            d["d_topk_weights"][t, j] = G[t] @ ye
            gg = wt[t, j] * G[t]
            d["d_w2"][e] += np.outer(gg, a)
            da = W2b[e].T @ gg
            dh = np.concatenate([da * u * s * (1 + g_ * (1 - s)), da * g_ * s])
            d["d_w1"][e] += np.outer(dh, X[t])
            d["d_x"][t] += W1b[e].T @ dh
    return y, fc1, d


def quant_experts(fmt, w):
    """Each expert's bytes and dequantized values by the oracle (vllm)."""
    parts = [O.quantize(fmt, "vllm", np.asarray(w[e], F32)) for e in range(E)]
    deq = np.stack([fq(fmt, w[e]) for e in range(E)])
    q = np.stack([p[0] for p in parts])
    s = np.stack([np.asarray(p[1]) for p in parts])
    g = np.stack([p[2][0] for p in parts]).astype(F32) if parts[0][2] is not None else None
    return q, s, g, deq


def write_module(f, path, contract, x, w1, w2, ids, wt, dy, y, fc1, grads, bytes_):
    g = f.create_group(path)
    g.attrs["class"] = "moe"
    g.attrs["contract"] = json.dumps(contract)
    bf16.write(g.require_group("inputs"), "x", x)
    g["inputs"].create_dataset("topk_weights", data=wt)
    bf16.write(g.require_group("params"), "w1", w1)
    bf16.write(g["params"], "w2", w2)
    s = g.require_group("saved")
    s.create_dataset("topk_ids", data=ids)
    if fc1 is not None:
        s.create_dataset("fc1_out", data=fc1.astype(F32))
    fp4 = contract.get("expert_weight_format") in ("nvfp4", "mxfp4")
    for name, (q, sc, gs) in bytes_.items():
        ds = s.create_dataset(name + "_q", data=q.astype(np.uint8))
        ds.attrs["dtype"] = DT["fp4"] if fp4 else DT["fp8"]
        if np.asarray(sc).dtype == np.uint8:
            ds = s.create_dataset(name + "_scale", data=sc)
            ds.attrs["dtype"] = DT["fp8"] if contract.get("expert_weight_format") == "nvfp4" else DT["e8m0"]
        else:
            s.create_dataset(name + "_scale_inv", data=np.asarray(sc, F32))
        if gs is not None:
            s.create_dataset(name + "_global_scale", data=gs)
    g.require_group("outputs").create_dataset("y", data=y.astype(F32))
    bf16.write(g.require_group("grad_out"), "dy", dy)
    gg = g.require_group("grads/dy")
    for n, v in grads.items():
        gg.create_dataset(n, data=np.asarray(v, F32))


def write_ep(folder, W, mods):
    """One file per rank, DIR/step.rank<r>.h5 (docs/interfaces.md "Sharded
    dumps"): each module expert-parallel over W ranks with data-parallel
    tokens, rank r holding tokens [r T/W, (r+1) T/W) (topk_ids with global
    expert ids) and experts [r E/W, (r+1) E/W) of w1, w2 and their bytes;
    its gradients: d_x, d_topk_weights of its tokens (the combine's
    reduce-scatter done), d_w1, d_w2 of its experts over every token."""
    os.makedirs(folder, exist_ok=True)
    tt, ee = T // W, E // W
    for r in range(W):
        with h5py.File(os.path.join(folder, "step.rank%d.h5" % r), "w") as f:
            f.attrs["qatcheck_dump"] = 1
            f.attrs["rank"] = r
            f.attrs["world_size"] = W
            for path, m in mods.items():
                g = f.create_group(path)
                g.attrs["class"] = "moe"
                g.attrs["parallel"] = "expert"
                g.attrs["contract"] = json.dumps(m["contract"])
                tok, exp = slice(r * tt, (r + 1) * tt), slice(r * ee, (r + 1) * ee)

                def put(grp, name, a, dt=None, bf=False):
                    if bf:
                        bf16.write(grp, name, a)
                        ds = grp[name]
                    else:
                        ds = grp.create_dataset(name, data=a)
                    if dt:
                        ds.attrs["dtype"] = dt
                    ds.attrs["shard_dim"] = 0
                put(g.require_group("inputs"), "x", m["x"][tok], bf=True)
                put(g["inputs"], "topk_weights", m["wt"][tok])
                put(g.require_group("params"), "w1", m["w1"][exp], bf=True)
                put(g["params"], "w2", m["w2"][exp], bf=True)
                sv = g.require_group("saved")
                put(sv, "topk_ids", m["ids"][tok])
                for name in ("w1", "w2"):
                    q, sc = m[name + "_bytes"]
                    put(sv, name + "_q", q[exp].astype(np.uint8), DT["fp8"])
                    put(sv, name + "_scale_inv", np.asarray(sc[exp], F32))
                put(g.require_group("outputs"), "y", m["y"][tok].astype(F32))
                put(g.require_group("grad_out"), "dy", m["dy"][tok], bf=True)
                gg = g.require_group("grads/dy")
                gg.create_dataset("d_x", data=m["grads"]["d_x"][tok].astype(F32))
                gg.create_dataset("d_topk_weights", data=m["grads"]["d_topk_weights"][tok].astype(F32))
                gg.create_dataset("d_w1", data=m["grads"]["d_w1"][exp].astype(F32))
                gg.create_dataset("d_w2", data=m["grads"]["d_w2"][exp].astype(F32))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ep-dir", help="also an expert-parallel sharded dump of the fp8 modules over 2 ranks in this folder")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    x = bf16.round_(rng.standard_normal((T, H)).astype(F32))
    w1 = bf16.round_((2.0 * rng.standard_normal((E, 2 * F, H)) / np.sqrt(H)).astype(F32))
    w2 = bf16.round_((rng.standard_normal((E, H, F)) / np.sqrt(F)).astype(F32))
    ids = rng.integers(0, E - 1, (T, K)).astype(np.int64)
    ids[ids >= EMPTY] += 1  # expert 3 empty
    for t in range(T):
        if ids[t, 0] == ids[t, 1]:
            ids[t, 1] = (ids[t, 0] + 1) % E if (ids[t, 0] + 1) % E != EMPTY else (ids[t, 0] + 2) % E
    ids[1::4, 1] = ids[1::4, 0]  # repeated routing
    wt = rng.random((T, K)).astype(F32)
    dy = bf16.round_(rng.standard_normal((T, H)).astype(F32))
    with h5py.File(a.out, "w") as f:
        f.attrs["qatcheck_dump"] = 1
        for wf, af, path in (("fp8_block128", "fp8_group128", "moe.fp8"), ("nvfp4", "none", "moe.nvfp4")):
            q1, s1, g1, d1 = quant_experts(wf, w1)
            q2, s2, g2, d2 = quant_experts(wf, w2)
            c = {"activation": "swiglu", "expert_weight_format": wf, "expert_act_format": af, "profile": "vllm"}
            y, fc1, grads = moe(x, d1, d2, d1, d2, ids, wt, dy, af)
            write_module(f, path, c, x, w1, w2, ids, wt, dy, y, fc1, grads, {"w1": (q1, s1, g1), "w2": (q2, s2, g2)})
            if wf != "fp8_block128":
                continue
            byts = {"w1": (q1, s1, g1), "w2": (q2, s2, g2)}
            # stale scale: expert 4's w1 bytes from an older master; the trainer used them
            old = w1.copy()
            old[4] = bf16.round_(1.25 * w1[4])
            qo, so, _, do = quant_experts(wf, old)
            q1s, s1s, d1s = q1.copy(), s1.copy(), d1.copy()
            q1s[4], s1s[4], d1s[4] = qo[4], so[4], do[4]
            y_, fc_, gr_ = moe(x, d1s, d2, d1s, d2, ids, wt, dy, af)
            write_module(f, "defect.stale_scale", c, x, w1, w2, ids, wt, dy, y_, fc_, gr_, {"w1": (q1s, s1s, None), "w2": (q2, s2, None)})
            # expert 2's backward through its master weights
            _, _, gr_ = moe(x, d1, d2, d1, d2, ids, wt, dy, af, master_e={2: (w1.astype(np.float64), w2.astype(np.float64))})
            write_module(f, "defect.dx_master", c, x, w1, w2, ids, wt, dy, y, fc1, gr_, byts)
            # every expert's backward through its master weights
            allm = {e: (w1.astype(np.float64), w2.astype(np.float64)) for e in range(E)}
            _, _, gr_ = moe(x, d1, d2, d1, d2, ids, wt, dy, af, master_e=allm)
            write_module(f, "defect.dx_master_all", c, x, w1, w2, ids, wt, dy, y, fc1, gr_, byts)
            # a nonzero gradient for the empty expert: tiny, well inside any rel_l2 bound
            gr_ = {n: v.copy() for n, v in grads.items()}
            gr_["d_w1"][EMPTY] = 1e-7 * rng.standard_normal((2 * F, H))
            write_module(f, "defect.empty_grad", c, x, w1, w2, ids, wt, dy, y, fc1, gr_, byts)
            # the same without quantization (a bf16 moe, as the class took it before expert formats)
            W1, W2 = w1.astype(np.float64), w2.astype(np.float64)
            yb, _, grb = moe(x, W1, W2, W1, W2, ids, wt, dy, "none")
            grb["d_w1"][EMPTY] = 1e-7 * rng.standard_normal((2 * F, H))
            write_module(f, "defect.empty_grad_bf16", {"activation": "swiglu"}, x, w1, w2, ids, wt, dy, yb, None, grb, {})
            # the saved FC1 output from the master weights (the forward's own is dequantized)
            _, fcm, _ = moe(x, w1.astype(np.float64), w2.astype(np.float64), d1, d2, ids, wt, dy, af)
            write_module(f, "defect.fc1_master", c, x, w1, w2, ids, wt, dy, y, fcm, grads, byts)
            if a.ep_dir:
                base = dict(contract=c, x=x, wt=wt, w1=w1, w2=w2, ids=ids, dy=dy, y=y, grads=grads, w1_bytes=(q1, s1), w2_bytes=(q2, s2))
                stale = dict(base, w1_bytes=(q1s, s1s), y=y_, grads=moe(x, d1s, d2, d1s, d2, ids, wt, dy, af)[2])
                empty = dict(base, grads={n: v.copy() for n, v in grads.items()})
                empty["grads"]["d_w1"][EMPTY] = 1e-7 * rng.standard_normal((2 * F, H))
                write_ep(a.ep_dir, 2, {"ep": base, "ep_stale": stale, "ep_empty": empty})


if __name__ == "__main__":
    main()
