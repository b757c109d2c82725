#!/usr/bin/python3
"""make_checkpoint.py: write a deterministic checkpoint dump (docs/interfaces.md
section 2) for `qatcheck contract --master-vs-dequant`.

Presets:
  small (default): 6 layers of q_proj [128,128], k_proj [64,128], o_proj
      [128,128], up_proj [192,128], down_proj [128,192] (192: a partial
      128-block), routed experts
      mlp.experts.down_proj [4, 64, 128], an input_layernorm (class rmsnorm,
      not a linear: skipped by the verb) and an lm_head [256, 128] without a
      layer index. BF16 master weights N(0, 0.02^2); every linear has
      grad_out/dy [16, N] and inputs/x [16, K] (bfloat16; experts: one per
      expert). Datasets are gzip-compressed (the file stays under 2 MB). Layer PLANTED_LAYER's mlp.down_proj is heavy-tailed (Student t,
      1.2 degrees of freedom): the outlier the verb must find.
  bench: --layers L layers of q/k/v/o/gate/up/down, each [--hidden, --hidden]
      BF16, no grad_out/ (the verb generates dY with --tokens), written one
      module at a time.

  --no-data: the small preset without grad_out/ and inputs/ (the verb then
      generates dY and X from --tokens/--seed).

usage: make_checkpoint.py OUT.h5 [--preset small|bench] [--layers L] [--hidden H] [--seed S] [--no-data]
"""
import argparse
import sys

import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("h5py", "numpy")
import h5py
import numpy as np

PLANTED_LAYER = 3
PLANTED_MODULE = "/model.layers.%d.mlp.down_proj" % PLANTED_LAYER
WITH_DATA = True  # write grad_out/ and inputs/ (--no-data clears it)


def bf16_bits(a):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def put(f, path, data, dtype_attr=None, compress=False):
    kw = dict(compression="gzip", compression_opts=9, shuffle=True) if compress else {}
    ds = f.create_dataset(path, data=data, track_times=False, **kw)
    if dtype_attr:
        ds.attrs["dtype"] = dtype_attr


def linear(f, path, w, dy=None, x=None, compress=False):
    g = f.require_group(path)
    g.attrs["class"] = "linear"
    put(f, path + "/params/weight", bf16_bits(w), "bfloat16", compress)
    if not WITH_DATA:
        return
    if dy is not None:
        put(f, path + "/grad_out/dy", bf16_bits(dy), "bfloat16", compress)
    if x is not None:
        put(f, path + "/inputs/x", bf16_bits(x), "bfloat16", compress)


def small(f, layers, seed):
    rng = np.random.default_rng(seed)
    M, H, F, E, FE, V = 16, 128, 192, 4, 64, 256
    shapes = [("self_attn.q_proj", H, H), ("self_attn.k_proj", H // 2, H), ("self_attn.o_proj", H, H),
              ("mlp.up_proj", F, H), ("mlp.down_proj", H, F)]
    for layer in range(layers):
        base = "/model.layers.%d" % layer
        norm = f.require_group(base + ".input_layernorm")
        norm.attrs["class"] = "rmsnorm"
        put(f, base + ".input_layernorm/params/weight", bf16_bits(np.ones(H, np.float32)), "bfloat16")
        for name, n, k in shapes:
            path = "%s.%s" % (base, name)
            if path == PLANTED_MODULE:
                w = 0.02 * rng.standard_t(1.2, size=(n, k))
            else:
                w = 0.02 * rng.standard_normal((n, k))
            linear(f, path, w.astype(np.float32), rng.standard_normal((M, n)), rng.standard_normal((M, k)), True)
        linear(f, base + ".mlp.experts.down_proj", (0.02 * rng.standard_normal((E, FE, H))).astype(np.float32),
               rng.standard_normal((E, M, FE)), rng.standard_normal((E, M, H)), True)
    linear(f, "/lm_head", (0.02 * rng.standard_normal((V, H))).astype(np.float32), rng.standard_normal((M, V)),
           rng.standard_normal((M, H)), True)


def bench(f, layers, hidden, seed):
    rng = np.random.default_rng(seed)
    names = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj"]
    for layer in range(layers):
        for name in names:
            w = rng.standard_normal((hidden, hidden), dtype=np.float32)
            w *= np.float32(0.02)
            linear(f, "/model.layers.%d.%s" % (layer, name), w)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--preset", choices=["small", "bench"], default="small")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-data", action="store_true")
    a = ap.parse_args()
    global WITH_DATA
    WITH_DATA = not a.no_data
    with h5py.File(a.out, "w", track_order=False) as f:
        f.attrs["qatcheck_dump"] = np.int64(1)
        if a.preset == "small":
            small(f, a.layers or 6, a.seed)
        else:
            bench(f, a.layers or 32, a.hidden, a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
