#!/bin/sh
# kv_quant_dump.sh: the kv_quant class (issue #39 item 4) on dumps written
# by a numpy producer of vLLM's DeepSeek V4 KV-cache rule (docs/
# conformance.md, "KV cache"): x [T, 512] bf16, channels 0..447 fp8 e4m3
# in blocks of 64 with a UE8M0 scale each from max(amax, 1e-4) * RN(1/448),
# channels 448..511 bf16; y the decoded values; d_x = dY (identity STE).
# Rows at scale 0 (an all-zero head), 1e-6 (under the floor), 1 and 30;
# an indexer group ([T, 128], one block) and a per-tensor-scale group
# (vLLM's k_scale, float scale, saturating elements). The correct dumps
# pass, y bit for bit; each planted defect fails: d_x through the
# quantizer's derivative (zero), the floor missing (an all-zero head decodes
# to NaN), y returned as the cache bytes (the fp8 payload without its
# scale), the scale not rounded to a power of two, another per-tensor scale,
# the channel split one channel off. Each fails on the old code too
# (no class kv_quant: exit 2).
. "$(dirname "$0")/lib.inc"
$PY - "$T/d.h5" <<'P' || exit 1
import sys
import h5py
import numpy as np
import ml_dtypes
rng = np.random.default_rng(39)
F8 = ml_dtypes.float8_e4m3fn
R448 = np.float32(1.0) / np.float32(448.0)  # RN(1/448), as Triton's x / 448.0
def bf16(a):
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)
def quant(x, n, block, floor, tensor_scale=None, pow2=True, defect=""):
    """vLLM quantize_and_insert_k_kernel / the indexer writer, then the gather's decode."""
    x = bf16(x)
    y = x.copy()
    n = n + (1 if defect == "split" else 0)
    for r in range(x.shape[0]):
        for j in range(0, n, block):
            b = x[r, j:min(j + block, n)]
            if tensor_scale is None:
                a = np.float32(np.abs(b).max())
                if defect != "nofloor":
                    a = max(a, np.float32(floor))
                s = np.float32(a * R448)
                if pow2 and defect != "nopow2":
                    with np.errstate(divide="ignore"):
                        s = np.float32(2.0 ** np.ceil(np.log2(np.float64(s)))) if s > 0 else np.float32(0)
            else:
                s = np.float32(tensor_scale)
            with np.errstate(divide="ignore", invalid="ignore"):
                v = np.clip(np.float32(b / s) if np.isscalar(b) else (b / s).astype(np.float32), -448, 448)
            q = v.astype(F8).astype(np.float32)
            y[r, j:j + len(b)] = q if defect == "bytes" else (q * s).astype(np.float32)
    return y
def rows(T, C, scales):
    return np.stack([rng.standard_normal(C).astype(np.float32) * s for s in scales[:T]]).astype(np.float32)
def group(f, name, x, y, dx, contract):
    g = f.create_group(name)
    g.attrs["class"] = "kv_quant"
    import json
    g.attrs["contract"] = json.dumps(contract)
    g["inputs/x"] = bf16(x)
    g["outputs/y"] = y
    dy = rng.standard_normal(x.shape).astype(np.float32)
    g["grad_out/dy"] = dy
    g["grads/dy/d_x"] = dy if dx == "identity" else np.zeros_like(dy)
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    xt_ = bf16(rows(3, 64, [1.0, 8.0, 0.01]))
    swa = {"fp8_channels": 448, "block": 64, "kv_kind": "swa"}
    x = bf16(rows(6, 512, [1.0, 0.0, 1e-6, 30.0, 0.25, 3e-5]))
    x[0, 5] = np.float32(-1e-30)  # a tiny negative: -0 in fp8
    group(f, "kv.swa", x, quant(x, 448, 64, 1e-4), "identity", swa)
    group(f, "kv.compressed", x, quant(x, 448, 64, 1e-4), "identity", dict(swa, kv_kind="compressed"))
    group(f, "kv.dx_zero", x, quant(x, 448, 64, 1e-4), "zero", swa)
    group(f, "kv.nofloor", x, quant(x, 448, 64, 1e-4, defect="nofloor"), "identity", swa)
    group(f, "kv.bytes", x, quant(x, 448, 64, 1e-4, defect="bytes"), "identity", swa)
    group(f, "kv.nopow2", x, quant(x, 448, 64, 1e-4, defect="nopow2"), "identity", swa)
    group(f, "kv.tscale", xt_, quant(xt_, 64, 64, 0, tensor_scale=0.0125, pow2=False), "identity",
          {"scale": "tensor", "tensor_scale": 0.0123, "block": 0})
    group(f, "kv.split", x, quant(x, 448, 64, 1e-4, defect="split"), "identity", swa)
    xi = bf16(rows(4, 128, [1.0, 0.0, 1e-6, 5.0]))
    group(f, "kv.indexer", xi, quant(xi, 128, 128, 1e-4), "identity", {"kv_kind": "indexer", "block": 128})
    xt = xt_
    group(f, "kv.tensor", xt, quant(xt, 64, 64, 0, tensor_scale=0.0123, pow2=False), "identity",
          {"scale": "tensor", "tensor_scale": 0.0123, "block": 0})
P
R='"reasoning": "identity STE: d_x is dY copied"'
TOL="{\"d_x\":{\"rel_l2\":1e-6,$R}}"
group_cases d.h5 kv "$TOL" swa compressed indexer tensor dx_zero nofloor bytes nopow2 tscale split
for g in swa compressed indexer tensor; do
  expect_exit 0 "vLLM's $g KV rule, decoded, passes (y bit for bit, d_x = dY)" "$QATCHECK" vjp --case "$T/$g.json" --json "$T/$g.r.json"
done
# fails_on GROUP TENSOR DESC: the group fails, on that tensor
fails_on() {
  expect_exit 1 "$3 fails" "$QATCHECK" vjp --case "$T/$1.json" --json "$T/$1.r.json"
  $PY - "$T/$1.r.json" "$2" <<'P' && ok "$3: fails on $2" || bad "$3: does not fail on $2"
import json, sys
r = json.load(open(sys.argv[1]))
failed = {c["tensor"] for c in r["checks"] if c["verdict"] == "fail"}
assert sys.argv[2] in failed, failed
P
}
fails_on dx_zero d_x "d_x through the quantizer's derivative (zero), not the identity STE,"
fails_on nofloor y "the amax floor missing (an all-zero head: scale 0, y NaN)"
fails_on bytes y "y returned as the cache bytes (no scale)"
fails_on nopow2 y "the amax scale not rounded up to a power of two (UE8M0 missing)"
fails_on tscale y "another per-tensor scale than the contract's (0.0125 for 0.0123)"
fails_on split y "the fp8/bf16 channel split one channel off"
$PY - "$T/swa.r.json" <<'P' && ok "the forward check judged y bit for bit" || bad "y was not judged exactly"
import json, sys
r = json.load(open(sys.argv[1]))
y = [c for c in r["checks"] if c["tensor"] == "y" and c.get("kind") == "forward"]
assert len(y) == 1 and y[0]["verdict"] == "pass", y
assert y[0]["tolerance"]["max_abs"] == 0, y[0]["tolerance"]
P
finish
