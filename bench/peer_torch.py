#!/usr/bin/env python3
"""peer_torch.py: the in-memory linear audit of d_x and d_weight written in
PyTorch the way a user would: fp8_block128 quantization of W with torch ops,
BF16 matmuls for the candidate, an FP32 matmul reference (torch's default,
allow_tf32 off, so true FP32), float64 metrics (sums of squares, dot, max
abs with index, non-finite count). Prints "key value" lines; times with CUDA
events, the median of --reps after two warm-ups. Usage:
  peer_torch.py [--M 8192 --K 7168 --N 4096] [--reps 7]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("torch")
import torch
import torch.nn.functional as F


def quant_block128(w):
    """dequant(quant(w)) under fp8_block128: s = max(amax, 1e-4) / 448 per 128x128 tile."""
    n, k = w.shape
    wp = F.pad(w.float(), (0, (-k) % 128, 0, (-n) % 128))
    v = wp.view(wp.shape[0] // 128, 128, wp.shape[1] // 128, 128)
    s = v.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-4) / 448.0
    q = (v * (1.0 / s)).to(torch.float8_e4m3fn)
    return (q.float() * s).view_as(wp)[:n, :k]


def metrics(g, r):
    g64, r64 = g.double().flatten(), r.double().flatten()
    fin = torch.isfinite(g64)
    g64 = torch.where(fin, g64, 0.0)
    d = torch.where(fin, g64 - r64, 0.0)
    mx, idx = d.abs().max(0)
    return torch.stack([(g64 * g64).sum(), (r64 * r64).sum(), (d * d).sum(), (g64 * r64).sum(), mx,
                        idx.double(), (~fin).sum().double()])


def audit(x, w, dy):
    deq = quant_block128(w)
    dx = dy @ deq.bfloat16()
    dw = dy.t() @ x
    dx_r = dy.float() @ deq
    dw_r = dy.float().t() @ x.float()
    return torch.stack([metrics(dx, dx_r), metrics(dw, dw_r)]).cpu()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--M", type=int, default=8192)
    ap.add_argument("--K", type=int, default=7168)
    ap.add_argument("--N", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(a.M, a.K, device="cuda", generator=g).bfloat16()
    w = (torch.randn(a.N, a.K, device="cuda", generator=g) / a.K ** 0.5).bfloat16()
    dy = torch.randn(a.M, a.N, device="cuda", generator=g).bfloat16()
    for _ in range(2):
        res = audit(x, w, dy)
    ts = []
    for _ in range(a.reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        res = audit(x, w, dy)
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    rel = (res[:, 2] / res[:, 1]).sqrt()
    print(f"torch {torch.__version__}")
    print(f"peer_shape {a.M} {a.K} {a.N}")
    print(f"peer_ms {ts[len(ts) // 2]:.4f}")
    print(f"peer_min_ms {ts[0]:.4f}")
    print(f"peer_dx_rel_l2 {rel[0].item():.6g}")
    print(f"peer_dw_rel_l2 {rel[1].item():.6g}")


if __name__ == "__main__":
    main()
