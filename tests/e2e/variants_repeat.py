"""variants_repeat.py OUT.h5 [N [M,K,N]]: N fp8-quantized linear modules
(weight_format fp8_tensor, master weights on the fp8 grid of a power-of-two scale, so the
contract's dequantized weight is the master) whose backward ran as autocast
runs it: dY and X cast to bf16 before the GEMMs, float32 gradients. d_x =
bf16(dY) W fits the bf16_dy variant, d_weight = bf16(dY)^T bf16(X) the
bf16_dy+bf16_inputs one, d_bias = the column sums of bf16(dY) bf16_dy."""
import sys

import h5py
import ml_dtypes
import numpy as np

sys.path.insert(0, "scripts")
import bf16  # noqa: E402

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1
M, K, N = (int(v) for v in (sys.argv[3].split(",") if len(sys.argv) > 3 else (64, 96, 48)))
rng = np.random.default_rng(11)
with h5py.File(out, "w") as f:
    f.attrs["qatcheck_dump"] = np.int64(1)
    for i in range(n):
        x = rng.standard_normal((M, K)).astype(np.float32)
        dy = rng.standard_normal((M, N)).astype(np.float32)
        s = 2.0 ** -8  # amax / 448: a power of two, so W / s is exact and on the e4m3 grid
        q = np.clip(rng.standard_normal((N, K)) * 100, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
        q[0, 0] = 448.0
        w = (q * s).astype(np.float32)
        b = rng.standard_normal(N).astype(np.float32)
        dyb, xb = bf16.round_(dy).astype(np.float64), bf16.round_(x).astype(np.float64)
        g = f.create_group("lin%d" % i)
        g.attrs["class"] = "linear"
        g.attrs["contract"] = ('{"weight_format": "fp8_tensor", "activation_format": "fp8_token", "ste": {"clipped": 100}}'
                               if i == 1 else '{"weight_format": "fp8_tensor"}')
        g["inputs/x"], g["params/weight"], g["params/bias"], g["grad_out/dy"] = x, w, b, dy
        g["grads/dy/d_x"] = (dyb @ w.astype(np.float64) * (1.01 if i == 2 else 1.0)).astype(np.float32)
        g["grads/dy/d_weight"] = (dyb.T @ xb).astype(np.float32)
        g["grads/dy/d_bias"] = dyb.sum(0).astype(np.float32)
