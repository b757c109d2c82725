#!/usr/bin/python3
"""make_mixed_checkpoint.py: a small master checkpoint whose layers are
deployed in different formats, for `qatcheck contract --master-vs-dequant`
without --weight-format (docs/contract.md, "Each layer's deployed format").

    make_mixed_checkpoint.py OUTDIR [--seed S] [--tokens M]

Writes, from one set of bfloat16 master weights (2 layers of q_proj,
o_proj, mlp.gate, mlp.down_proj, mlp.up_proj, plus lm_head and embeddings):
  OUTDIR/ct/model.safetensors + config.json   compressed-tensors config:
      group 'attn' targets re:.*self_attn.*  -> float 8-bit block [128, 128]  (fp8_block128)
      group 'mlp'  targets Linear            -> float 4-bit tensor_group 16   (nvfp4)
      ignore lm_head, re:.*mlp.gate$                                         (unquantized)
  OUTDIR/fp8/model.safetensors + config.json  transformers fp8 config,
      weight_block_size [128, 128], modules_to_not_convert [lm_head, mlp.gate]
  OUTDIR/batch.h5   one real batch: every linear's grad_out/dy [M, N] and
      inputs/x [M, K] (float32), the module's class and master weight, and a
      contract attribute with the same per-layer weight_format as ct/ (a
      --dump with mixed deployed formats, and a --dy for the checkpoints)
  OUTDIR/partial.h5 the same batch without layer 1's mlp.up_proj
"""
import argparse
import json
import os
import sys

import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("numpy", "safetensors", "h5py")
import h5py
import numpy as np
from safetensors import TensorSpec, serialize_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bf16  # noqa: E402

HIDDEN = 256
LINEARS = [("self_attn.q_proj", 256, 256), ("self_attn.o_proj", 256, 256), ("mlp.gate", 8, 256),
           ("mlp.down_proj", 256, 384), ("mlp.up_proj", 384, 256)]
LAYERS = 2


def fmt_of(name):
    """The deployed format ct/config.json gives module `name`."""
    if name == "lm_head" or name.endswith("mlp.gate"):
        return "none"
    return "fp8_block128" if ".self_attn." in name else "nvfp4"


def masters(seed):
    rng = np.random.default_rng(seed)
    t = {"lm_head": bf16.round_(0.05 * rng.standard_normal((128, HIDDEN)).astype(np.float32))}
    for layer in range(LAYERS):
        for name, n, k in LINEARS:
            w = rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)
            t["model.layers.%d.%s" % (layer, name)] = bf16.round_(w)
    return t


def write_st(folder, m, config):
    os.makedirs(folder, exist_ok=True)
    keep, specs = [], {}
    tensors = {n + ".weight": bf16.to_bits(v) for n, v in m.items()}
    tensors["model.embed_tokens.weight"] = bf16.to_bits(np.ones((128, HIDDEN), np.float32))
    tensors["model.norm.weight"] = bf16.to_bits(np.ones(HIDDEN, np.float32))
    for n in sorted(tensors):
        a = np.ascontiguousarray(tensors[n])
        keep.append(a)
        specs[n] = TensorSpec(dtype="bfloat16", shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
    serialize_file(specs, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "quantization_config": config}, f, indent=1)


def write_h5(path, m, tokens, seed, leave_out=()):
    rng = np.random.default_rng(seed + 1)
    with h5py.File(path, "w") as f:
        f.attrs["qatcheck_dump"] = np.int64(1)
        for n in sorted(m):
            w = m[n]
            dy = rng.standard_normal((tokens, w.shape[0])).astype(np.float32)
            x = rng.standard_normal((tokens, w.shape[1])).astype(np.float32)
            if n in leave_out:
                continue
            g = f.create_group("/" + n)
            g.attrs["class"] = "linear"
            fmt = fmt_of(n)
            if fmt != "none":
                g.attrs["contract"] = json.dumps({"weight_format": fmt})
            ds = g.create_dataset("params/weight", data=bf16.to_bits(w))
            ds.attrs["dtype"] = "bfloat16"
            g.create_dataset("grad_out/dy", data=dy)
            g.create_dataset("inputs/x", data=x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=24)
    a = ap.parse_args()
    m = masters(a.seed)
    ct = {"quant_method": "compressed-tensors", "format": "mixed-precision", "quantization_status": "compressed",
          "config_groups": {
              "attn": {"targets": ["re:.*self_attn.*"],
                       "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block",
                                   "block_structure": [128, 128], "dynamic": False}},
              "mlp": {"targets": ["Linear"],
                      "weights": {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group",
                                  "group_size": 16, "dynamic": False}}},
          "ignore": ["lm_head", "re:.*mlp.gate$"]}
    write_st(os.path.join(a.out, "ct"), m, ct)
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
           "modules_to_not_convert": ["lm_head", "mlp.gate"]}
    write_st(os.path.join(a.out, "fp8"), m, fp8)
    write_h5(os.path.join(a.out, "batch.h5"), m, a.tokens, a.seed)
    write_h5(os.path.join(a.out, "partial.h5"), m, a.tokens, a.seed, leave_out=("model.layers.1.mlp.up_proj",))


if __name__ == "__main__":
    main()
