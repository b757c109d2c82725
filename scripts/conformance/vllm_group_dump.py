#!/usr/bin/python3
"""vllm_group_dump.py: a dump whose deployed bytes are what vLLM's
per-token-group FP8 quantizers make with UE8M0 scales, transcribed here
from vLLM's own source (not from qatcheck, not from quant_oracle.py), for
tests/e2e/quant_vllm_group.sh.

    vllm_group_dump.py OUT.h5 cuda|triton [--e8m0] [--zero-only]

cuda: vLLM's CUDA kernels, csrc/quantization/w8a8/fp8/per_token_group_quant.cu
  (per_token_group_quant_8bit_register_kernel, the path of bf16 input with
  group 128): the group's amax starts at eps = 1e-10, y = amax / 448 (a
  correctly rounded float32 division), y = fmaxf(y, 1e-10), the exponent
  bumped when the mantissa is non-zero (a power of two at least 2^-33),
  elements fminf(fmaxf(x * (1 / y), -448), 448) cast to e4m3.
triton: vLLM's Triton kernel, vllm/model_executor/layers/quantization/utils/
  fp8_utils.py (_per_token_group_quant_fp8): amax = max(amax, eps), y =
  exp2(ceil(log2(amax / 448))), no floor on the scale (2^-42 at least);
  the inputs here hold no value where Triton's log2 and the bit rule part.
Versions read: vLLM commit 0f5257e245116449bfbe78a87c22aeef632eba8f (the .cu)
and 007d50058a06dec0f82472d63c819244d460c40d (fp8_utils.py); docs/conformance.md.

Module /lin: master weight W [4, 512] (bf16) holding the edge cases of the
scale rule: an all-zero group, a group of amax 1e-9 (below 448e-10), a
group whose amax is a bf16 subnormal, a group at the format's maximum 448,
a group whose amax / 448 is an exact power of two (2^-7 * 448: a tie of
the ceiling), the rest N(0, 1). saved/weight_q, saved/weight_scale (float32
scales, or with --e8m0 the UE8M0 bytes). --zero-only keeps the all-zero
group and none of the other groups below the floors."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import qcpython  # noqa: E402

qcpython.need("h5py", "numpy", "ml_dtypes")
import h5py  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import bf16  # noqa: E402

F32 = np.float32


def ceil_pow2_bits(y):
    """The register kernel's bit rule: exponent + (mantissa != 0), mantissa cleared."""
    u = np.asarray(y, F32).view(np.uint32)
    e = (u >> 23) & 0xFF
    e = e + ((u & 0x7FFFFF) != 0)
    return (e.astype(np.uint32) << 23).view(F32)


def scales(groups, path):
    amax = np.maximum(np.abs(groups).max(-1), F32(1e-10)).astype(F32)
    y = (amax / F32(448)).astype(F32)
    if path == "cuda":
        y = np.maximum(y, F32(1e-10)).astype(F32)
    return ceil_pow2_bits(y)  # for triton: ceil(log2(.)) equals the bit rule on these inputs


def main():
    out, path = sys.argv[1], sys.argv[2]
    e8m0 = "--e8m0" in sys.argv[3:]
    rng = np.random.default_rng(39)
    w = bf16.round_(rng.standard_normal((4, 512)).astype(F32))
    w[0, 0:128] = 0                                   # all-zero group
    w[1, 128:256] = bf16.round_(w[1, 128:256] * F32(1e-9) / np.abs(w[1, 128:256]).max())  # amax ~1e-9
    w[2, 256:384] = 0
    w[2, 256:260] = np.array([0x0001, 0x8003, 0x0002, 0x0000], np.uint16).astype(np.uint32).__lshift__(16).view(F32)
    w[3, 0:128] = bf16.round_(w[3, 0:128] * F32(448) / np.abs(w[3, 0:128]).max())  # amax 448 exactly
    w[3, 384] = F32(448 * 2.0 ** -7)                  # amax / 448 = 2^-7 exactly
    w[3, 385:512] = bf16.round_(w[3, 385:512] * F32(3.0 / 448 * 0.5) / np.abs(w[3, 385:512]).max())
    if "--zero-only" in sys.argv[3:]:
        w[1:3] = bf16.round_(rng.standard_normal((2, 512)).astype(F32))
    g = w.reshape(4, 4, 128)
    s = scales(g, path)
    q = np.clip(g * (F32(1) / s)[..., None], F32(-448), F32(448)).astype(F32)
    payload = q.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).reshape(4, 512)
    with h5py.File(out, "w") as f:
        f.attrs["qatcheck_dump"] = 1
        grp = f.create_group("lin")
        grp.attrs["class"] = "linear"
        grp.attrs["contract"] = json.dumps({"weight_format": "fp8_group128_ue8m0", "profile": "auto"})
        bf16.write(grp.require_group("params"), "weight", w)
        sv = grp.require_group("saved")
        ds = sv.create_dataset("weight_q", data=payload)
        ds.attrs["dtype"] = "float8_e4m3fn"
        if e8m0:
            ds = sv.create_dataset("weight_scale", data=((s.view(np.uint32) >> 23) & 0xFF).astype(np.uint8))
            ds.attrs["dtype"] = "float8_e8m0fnu"
        else:
            sv.create_dataset("weight_scale", data=s.astype(F32))


if __name__ == "__main__":
    main()
