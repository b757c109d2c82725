#!/usr/bin/python3
"""make_quant_dump.py: a dump of linear modules with deployed bytes made by
the independent oracle (scripts/conformance/quant_oracle.py), for the quant
verb and vjp's quantizer check.

    make_quant_dump.py OUT.h5 FORMAT [--profile P] [--plant none|payload|negzero|scale|scale_shape|global]
                                     [--m M --k K --n N] [--seed S] [--cand-weight dequant|master]

Module /lin: master weight (bf16), x, bias, grad_out/dy, grads/dy/ computed
from the contract (dx from dequant(quant(W)), bf16 trainer GEMMs), saved/
weight_q, weight_scale (+ weight_global_scale for nvfp4) with the planted
defect, if any."""
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

DTYPE = {"payload_fp4": "float4_e2m1fn_x2", "payload": "float8_e4m3fn", "e8m0": "float8_e8m0fnu", "e4m3": "float8_e4m3fn"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("format")
    ap.add_argument("--profile", default="vllm")
    ap.add_argument("--plant", default="none")
    ap.add_argument("--m", type=int, default=5)
    ap.add_argument("--k", type=int, default=160)
    ap.add_argument("--n", type=int, default=130)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cand-weight", choices=["dequant", "master"], default="dequant",
                    help="weight the candidate's d_x used (master: a defect under the dequant contract)")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    fmt = a.format
    w = bf16.round_(rng.standard_normal((a.n, a.k)).astype(np.float32) / np.sqrt(a.k))
    w[0, :8] = bf16.round_(np.float32(-1e-7))  # tiny negatives: e4m3 negative zero
    x = bf16.round_(rng.standard_normal((a.m, a.k)).astype(np.float32))
    b = bf16.round_(0.1 * rng.standard_normal(a.n).astype(np.float32))
    dy = bf16.round_(rng.standard_normal((a.m, a.n)).astype(np.float32))
    payload, scale, g = O.quantize(fmt, a.profile, w)
    fp4 = fmt in ("nvfp4", "mxfp4")
    # the candidate: bf16 GEMMs on the decoded weight
    codes = payload if not fp4 else np.stack([payload & 0xF, payload >> 4], -1).reshape(a.n, -1)[:, :a.k]
    vals = O.dec_e2m1(codes) if fp4 else O.dec_e4m3(codes)
    br, bc = O.BLOCK[fmt]
    br, bc = br or a.n, bc or a.k
    if fmt == "nvfp4":
        deq = O.dec_e4m3(scale) * g[0] if a.profile == "modelopt" else (O.dec_e4m3(scale) / g[0]).astype(np.float32)
    elif fmt in ("mxfp8", "mxfp4"):
        deq = O.e8m0_dec(scale)
    else:
        deq = np.asarray(scale, np.float32).reshape(-1 if fmt != "fp8_tensor" else 1, 1 if fmt == "fp8_tensor" else scale.shape[-1])
    wd = (vals * np.repeat(np.repeat(np.asarray(deq, np.float32).reshape(-(-a.n // br), -(-a.k // bc)), br, 0), bc, 1)[:a.n, :a.k]).astype(np.float32)
    wd = bf16.round_(wd) if a.cand_weight == "dequant" else w
    dx = bf16.round_(np.matmul(dy, wd, dtype=np.float32))
    dw = bf16.round_(np.matmul(dy.T, x, dtype=np.float32))
    db = bf16.round_(dy.sum(0, dtype=np.float32))

    payload = payload.copy()
    scale = np.array(scale).copy()
    if a.plant == "payload":
        payload[1, 3] ^= 0x01
    elif a.plant == "negzero":
        assert not fp4 and payload[0, 0] == 0x80, payload[0, :4]
        payload[0, 0] = 0x00  # +0 where the serving cast keeps -0
    elif a.plant == "scale":
        flat = scale.reshape(-1)
        if flat.dtype == np.uint8:
            flat[0] ^= 1
        else:
            flat[0] = np.nextafter(flat[0], np.float32(np.inf), dtype=np.float32)
    elif a.plant == "scale_shape":
        scale = scale.reshape(-1)[:-1] if scale.size > 1 else np.concatenate([scale.reshape(-1), scale.reshape(-1)])
    elif a.plant == "global":
        g = np.nextafter(g, np.float32(0), dtype=np.float32)

    with h5py.File(a.out, "w") as f:
        f.attrs["qatcheck_dump"] = 1
        grp = f.create_group("lin")
        grp.attrs["class"] = "linear"
        grp.attrs["contract"] = json.dumps({"weight_format": fmt, "profile": a.profile, "dx_weight": "dequant"})
        bf16.write(grp.require_group("inputs"), "x", x)
        bf16.write(grp.require_group("params"), "weight", w)
        bf16.write(grp["params"], "bias", b)
        bf16.write(grp.require_group("grad_out"), "dy", dy)
        gg = grp.require_group("grads/dy")
        bf16.write(gg, "d_x", dx)
        bf16.write(gg, "d_weight", dw)
        bf16.write(gg, "d_bias", db)
        s = grp.require_group("saved")
        ds = s.create_dataset("weight_q", data=payload.astype(np.uint8))
        ds.attrs["dtype"] = DTYPE["payload_fp4"] if fp4 else DTYPE["payload"]
        if np.asarray(scale).dtype == np.uint8:
            ds = s.create_dataset("weight_scale", data=scale)
            ds.attrs["dtype"] = DTYPE["e4m3"] if fmt == "nvfp4" else DTYPE["e8m0"]
        else:
            s.create_dataset("weight_scale", data=np.asarray(scale, np.float32))
        if g is not None:
            s.create_dataset("weight_global_scale", data=np.asarray(g, np.float32))


if __name__ == "__main__":
    main()
