#!/usr/bin/env python3
"""make_torch_data.py: dumps and a checkpoint made by eager PyTorch on a GPU,
with h5py, as a QAT trainer would write them (no qatcheck code involved), for
tests/data/torch/ and the e2e test tests/e2e/quant_torch.sh:

  torch_fp8_block128.h5, torch_fp8_block128_ue8m0.h5
      linear modules (bf16 master weight, bias, x, dY), the deployed bytes
      quantized by eager PyTorch (per_block_cast_to_fp8's formula; the
      two-stage ue8m0 requantization), and the gradients of the QAT backward
      (d_x from the dequantized weight rounded to bf16, cuBLAS bf16 GEMMs).
      The module contract names the format, not the profile: qatcheck must
      find it (`quant --identify`, `vjp` with profile auto).
  torch_ckpt.h5 + torch_ckpt_expected.json
      linear modules with bf16 master weights and grad_out/dy, and torch's
      own float64 numbers for `contract --master-vs-dequant --profile torch`:
      per module and weight format, cosine, norm ratio and rel-L2 of
      dY dequant(quant(W)) against dY W.

    make_torch_data.py OUTDIR [--seed S]"""
import argparse
import json
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import producers as P  # noqa: E402


def devname():
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def bits(t):
    """A bf16 tensor's bits as uint16 numpy."""
    return t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


def put_bf16(g, name, t, compress=False):
    kw = dict(compression="gzip", compression_opts=9, shuffle=True) if compress else {}
    ds = g.create_dataset(name, data=bits(t.to(torch.bfloat16)), **kw)
    ds.attrs["dtype"] = "bfloat16"


def deq_weight(fmt, w):
    """The dequantized weight (float32) and the deployed bytes, eager PyTorch."""
    q, s, _ = P.EAGER[fmt](w)
    qt = torch.from_numpy(q).to(w.device)
    st = torch.from_numpy(np.ascontiguousarray(s)).to(w.device)
    vals = P.e4m3_float(qt)
    full = st.repeat_interleave(128, 0).repeat_interleave(128, 1)[:w.shape[0], :w.shape[1]]
    return vals * full, q, s


def weights(gen, n, k, dev):
    w = torch.randn(n, k, device=dev, generator=gen) / k ** 0.5
    w[:, ::61] = torch.sign(w[:, ::61]) * 1.75 * torch.exp2(torch.round(torch.log2(w[:, ::61].abs() + 1e-30)))
    w[0, :8] = -1e-7  # tiny negatives: e4m3 negative zero
    return w.to(torch.bfloat16)


def plant_near_ties(w):
    """float32 weights [N, K]: each 128x128 block gets an amax whose scale s
    has Inductor's 1/s (rcp.approx) differ from eager's (rcp.rn), then
    elements x with e4m3(x * rcp.rn(s)) != e4m3(x * rcp.approx(s)): the
    bytes then tell an eager producer from a compiled one (bf16 masters
    almost never do). Returns (weights, elements planted)."""
    n, k = w.shape
    wn = w.cpu().numpy().astype(np.float32).copy()
    inv = torch.compile(lambda t: 1.0 / t)
    mids = np.array([62.0, 100.0, 136.0, 184.0, 232.0, 272.0, 336.0, 400.0], np.float32)  # e4m3 midpoints
    planted = 0
    for r0 in range(0, n, 128):
        for c0 in range(0, k, 128):
            blk = wn[r0:r0 + 128, c0:c0 + 128]
            i, j = np.unravel_index(np.argmax(np.abs(blk)), blk.shape)
            a0 = np.float32(max(abs(blk[i, j]), 1e-3))
            cand = (a0 * (1 + np.arange(64, dtype=np.float32) * np.float32(2.0 ** -20))).astype(np.float32)
            s = torch.from_numpy(cand).to(w.device) / 448.0  # eager: * RN(1/448), as the producers
            r, ra = (1.0 / s).cpu().numpy(), inv(s).cpu().numpy()
            pick = np.flatnonzero(r != ra)
            if not pick.size:
                continue
            blk[i, j] = np.copysign(cand[pick[0]], blk[i, j] if blk[i, j] else 1.0)
            rr, rra = np.float32(r[pick[0]]), np.float32(ra[pick[0]])
            slot = 0
            for m in mids:
                xb = int(np.array([m / np.float64(rr)], np.float32).view(np.uint32)[0])
                for dlt in range(-6, 7):
                    x = np.array([xb + dlt], np.uint32).view(np.float32)[0]
                    a, b = torch.tensor([x * rr, x * rra], dtype=torch.float32).to(P.F8).view(torch.uint8).tolist()
                    pi, pj = 1 + slot, 2 + slot
                    if a != b and pi < blk.shape[0] and pj < blk.shape[1] and (pi, pj) != (i, j):
                        blk[pi, pj] = x
                        slot += 1
                        planted += 1
                        break
    return torch.from_numpy(wn).to(w.device), planted


def dumps(out, seed, dev):
    gen = torch.Generator(device=dev).manual_seed(seed)
    shapes = {"/model.layers.0.self_attn.q_proj": (256, 256), "/model.layers.0.mlp.down_proj": (200, 300),
              "/model.layers.0.mlp.up_proj": (256, 384)}
    m = 32
    for fmt in ("fp8_block128", "fp8_block128_ue8m0"):
        with h5py.File(os.path.join(out, "torch_%s.h5" % fmt), "w") as f:
            f.attrs["qatcheck_dump"] = 1
            f.attrs["producer"] = "torch %s on %s (scripts/calibrate/make_torch_data.py)" % (torch.__version__,
                                                                                              devname())
            for path, (n, k) in shapes.items():
                w = weights(gen, n, k, dev)
                if path.endswith("up_proj"):  # float32 masters with near-ties planted
                    w, planted = plant_near_ties(w.float())
                    f.attrs["near_ties_" + path.rsplit(".", 1)[-1]] = planted
                b = (0.1 * torch.randn(n, device=dev, generator=gen)).to(torch.bfloat16)
                x = torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16)
                dy = torch.randn(m, n, device=dev, generator=gen).to(torch.bfloat16)
                wd, q, s = deq_weight(fmt, w)
                wd16 = wd.to(torch.bfloat16)
                dx = dy @ wd16  # the QAT backward: d_x from the dequantized weight, bf16 GEMM
                dw = dy.t() @ x
                db = dy.float().sum(0).to(torch.bfloat16)
                g = f.create_group(path)
                g.attrs["class"] = "linear"
                g.attrs["contract"] = json.dumps({"weight_format": fmt, "dx_weight": "dequant"})
                put_bf16(g.require_group("inputs"), "x", x, True)
                if w.dtype == torch.float32:
                    g.require_group("params").create_dataset("weight", data=w.cpu().numpy(), compression="gzip",
                                                             compression_opts=9)
                else:
                    put_bf16(g.require_group("params"), "weight", w, True)
                put_bf16(g["params"], "bias", b, True)
                put_bf16(g.require_group("grad_out"), "dy", dy, True)
                gg = g.require_group("grads/dy")
                put_bf16(gg, "d_x", dx, True)
                put_bf16(gg, "d_weight", dw, True)
                put_bf16(gg, "d_bias", db, True)
                sv = g.require_group("saved")
                ds = sv.create_dataset("weight_q", data=np.asarray(q, np.uint8), compression="gzip", compression_opts=9)
                ds.attrs["dtype"] = "float8_e4m3fn"
                sv.create_dataset("weight_scale", data=np.asarray(s, np.float32))


def deq_any(fmt, w):
    """dequant(quant(w)) in float32 by eager PyTorch, for any weight format."""
    rows, cols = w.shape
    q, s, g = P.EAGER[fmt](w)
    qt = torch.from_numpy(np.ascontiguousarray(q)).to(w.device)
    st = torch.from_numpy(np.ascontiguousarray(s)).to(w.device)
    if fmt in ("fp8_block128", "fp8_block128_ue8m0"):
        return P.e4m3_float(qt) * st.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    if fmt == "nvfp4":
        lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], device=w.device)
        vals = lut[qt.long()]
        d = P.e4m3_float(st) / torch.tensor(np.float32(g), device=w.device)
        return vals * d.repeat_interleave(16, 1)[:, :cols]
    if fmt == "mxfp8":
        d = torch.exp2(st.float() - 127)
        return P.e4m3_float(qt) * d.repeat_interleave(32, 1)[:, :cols]
    raise ValueError(fmt)


def metrics(g, r):
    g, r = g.double().flatten(), r.double().flatten()
    ng, nr = g.norm(), r.norm()
    return {"cosine": float((g @ r) / (ng * nr)), "norm_ratio": float(ng / nr), "rel_l2": float((g - r).norm() / nr)}


def checkpoint(out, seed, dev):
    gen = torch.Generator(device=dev).manual_seed(seed + 1)
    mods = {"/model.layers.0.self_attn.q_proj": (256, 384), "/model.layers.0.self_attn.o_proj": (384, 256),
            "/model.layers.1.mlp.up_proj": (384, 256), "/model.layers.1.mlp.down_proj": (256, 300)}
    fmts = ["nvfp4", "fp8_block128", "fp8_block128_ue8m0", "mxfp8"]
    exp = {"producer": "torch %s on %s" % (torch.__version__, devname()), "profile": "torch",
           "rows": []}
    with h5py.File(os.path.join(out, "torch_ckpt.h5"), "w") as f:
        f.attrs["qatcheck_dump"] = 1
        for path, (n, k) in mods.items():
            w = weights(gen, n, k, dev)
            dy = torch.randn(32, n, device=dev, generator=gen).to(torch.bfloat16)
            g = f.create_group(path)
            g.attrs["class"] = "linear"
            put_bf16(g.require_group("params"), "weight", w, True)
            put_bf16(g.require_group("grad_out"), "dy", dy, True)
            ref = dy.double() @ w.double()
            for fmt in fmts:
                cand = dy.double() @ deq_any(fmt, w).double()
                exp["rows"].append(dict(module=path, weight_format=fmt, dy="dy", **metrics(cand, ref)))
    with open(os.path.join(out, "torch_ckpt_expected.json"), "w") as f:
        json.dump(exp, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=12)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a plumbing test only
    dumps(a.out, a.seed, dev)
    checkpoint(a.out, a.seed, dev)
    print("torch data written to", a.out)


if __name__ == "__main__":
    main()
