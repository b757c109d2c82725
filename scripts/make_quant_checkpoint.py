#!/usr/bin/python3
"""make_quant_checkpoint.py: a master safetensors checkpoint and a deployed
(quantized) one made from it under a producer's naming convention, written
with the `safetensors` package, for `qatcheck quant --checkpoint --master`.

    make_quant_checkpoint.py OUTDIR --convention deepseek|modelopt|compressed|compressed_fp8
                             [--profile P] [--plant PART:MODULE] [--shards N] [--fp4-dtype u8|f4] [--seed S]

OUTDIR/master/ holds the master (bfloat16) as model.safetensors, or N
shards with model.safetensors.index.json; OUTDIR/deployed/ the deployed
checkpoint, the same way, plus a config.json. The deployed bytes are made by
the independent oracle (scripts/conformance/quant_oracle.py):
  deepseek        weight F8_E4M3 [N, K] + weight_scale_inv F32 [ceil(N/128), ceil(K/128)]
                  (fp8_block128; DeepSeek-V3 style; config quant_method fp8)
  modelopt        weight U8 [N, K/2] (two e2m1 a byte, element 2i low) + weight_scale
                  F8_E4M3 [N, K/16] + weight_scale_2 F32 [] (amax/2688) + input_scale F32 []
                  (nvfp4 under profile modelopt)
  compressed      weight_packed U8 [N, K/2] + weight_scale F8_E4M3 [N, K/16] +
                  weight_global_scale F32 [1] (2688/amax) + input_global_scale F32 [1]
                  (compressed-tensors / llm-compressor NVFP4, profile vllm)
  compressed_fp8  weight F8_E4M3 [N, K] + weight_scale F32 [N, 1] (fp8_channel)
Embeddings, norms and lm_head stay bfloat16 in the deployed checkpoint.
--plant payload:MODULE flips one payload bit of that module (e.g.
payload:model.layers.1.mlp.down_proj), scale:MODULE one scale's last bit,
global:MODULE the global scale's; --fp4-dtype f4 stores FP4 payloads with
safetensors' own F4 dtype instead of U8."""
import argparse
import json
import os
import sys

import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("numpy", "safetensors", "ml_dtypes")
import numpy as np
from safetensors import TensorSpec, serialize_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "conformance"))
import bf16  # noqa: E402
import quant_oracle as O  # noqa: E402

LINEARS = [("self_attn.q_proj", 192, 256), ("self_attn.o_proj", 256, 192), ("mlp.down_proj", 256, 320),
           ("mlp.experts.0.up_proj", 64, 256), ("mlp.experts.1.up_proj", 64, 256)]
LAYERS = 2
HIDDEN = 256
VOCAB = 100


def master_tensors(seed):
    rng = np.random.default_rng(seed)
    t = {"model.embed_tokens.weight": bf16.round_(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)),
         "model.norm.weight": np.ones(HIDDEN, np.float32),
         "lm_head.weight": bf16.round_(0.02 * rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32))}
    for layer in range(LAYERS):
        t["model.layers.%d.input_layernorm.weight" % layer] = np.ones(HIDDEN, np.float32)
        for name, n, k in LINEARS:
            w = rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)
            w[0, :8] = -1e-7  # tiny negatives: e4m3 negative zero
            t["model.layers.%d.%s.weight" % (layer, name)] = bf16.round_(w)
    return t


def quantize(conv, prof, w):
    """The deployed tensors of one master weight w [N, K]: {suffix: (array, safetensors dtype)}."""
    if conv == "deepseek":
        q, s, _ = O.quantize("fp8_block128", prof, w)
        return {".weight": (q, "float8_e4m3fn"), ".weight_scale_inv": (np.asarray(s, np.float32), "float32")}
    if conv == "compressed_fp8":
        q, s, _ = O.quantize("fp8_channel", prof, w)
        return {".weight": (q, "float8_e4m3fn"), ".weight_scale": (np.asarray(s, np.float32).reshape(-1, 1), "float32")}
    q, s, g = O.quantize("nvfp4", prof, w)
    g = np.asarray(g, np.float32)
    if conv == "modelopt":
        return {".weight": (q, "uint8"), ".weight_scale": (s, "float8_e4m3fn"),
                ".weight_scale_2": (g.reshape(()), "float32"), ".input_scale": (np.float32(0.05).reshape(()), "float32")}
    return {".weight_packed": (q, "uint8"), ".weight_scale": (s, "float8_e4m3fn"),
            ".weight_global_scale": (g.reshape(1), "float32"), ".input_global_scale": (np.float32(100).reshape(1), "float32")}


def as_bf16(a):
    return (bf16.to_bits(a), "bfloat16")


def write(folder, tensors, shards, config=None):
    """tensors: {name: (array, dtype)} -> model.safetensors, or `shards` files and an index."""
    os.makedirs(folder, exist_ok=True)
    names = sorted(tensors)
    groups = [names] if shards <= 1 else [names[i::shards] for i in range(shards)]
    files = ["model.safetensors"] if shards <= 1 else \
        ["model-%05d-of-%05d.safetensors" % (i + 1, shards) for i in range(shards)]
    keep, wmap = [], {}
    for fname, group in zip(files, groups):
        specs = {}
        for n in group:
            a, dt = tensors[n]
            a = np.ascontiguousarray(a)
            keep.append(a)
            shape = list(a.shape)
            specs[n] = TensorSpec(dtype=dt, shape=shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
            wmap[n] = fname
        serialize_file(specs, os.path.join(folder, fname), metadata={"format": "pt"})
    if shards > 1:
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": sum(x.nbytes for x in keep)}, "weight_map": wmap}, f, indent=1)
    if config is not None:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=1)


def plant(dep, spec):
    part, module = spec.split(":", 1)
    hits = [n for n in dep if n.startswith(module + ".")]
    if not hits:
        sys.exit("--plant: no deployed tensor of module '%s'" % module)
    if part == "payload":
        n = [h for h in hits if h.endswith((".weight", ".weight_packed"))][0]
        a = dep[n][0].copy()
        a[1, 3] ^= 0x01
    elif part == "scale":
        n = [h for h in hits if h.endswith((".weight_scale", ".weight_scale_inv"))][0]
        a = np.array(dep[n][0]).copy()
        a.reshape(-1).view(np.uint8)[0] ^= 0x01
    elif part == "global":
        n = [h for h in hits if h.endswith((".weight_scale_2", ".weight_global_scale"))][0]
        a = np.array(dep[n][0], np.float32).copy()
        a.reshape(-1).view(np.uint32)[0] ^= 1
    else:
        sys.exit("--plant: expected payload|scale|global:MODULE")
    dep[n] = (a, dep[n][1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--convention", required=True, choices=["deepseek", "modelopt", "compressed", "compressed_fp8"])
    ap.add_argument("--profile", default=None)
    ap.add_argument("--plant", default=None)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--fp4-dtype", choices=["u8", "f4"], default="u8")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    prof = a.profile or ("modelopt" if a.convention == "modelopt" else "vllm")
    m = master_tensors(a.seed)
    write(os.path.join(a.out, "master"), {n: as_bf16(v) for n, v in m.items()}, a.shards)
    dep = {}
    for n, v in m.items():
        if ".layers." in n and v.ndim == 2:
            for suf, (arr, dt) in quantize(a.convention, prof, v).items():
                if a.fp4_dtype == "f4" and dt == "uint8":
                    dt = "float4_e2m1fn_x2"
                dep[n[:-len(".weight")] + suf] = (arr, dt)
        else:
            dep[n] = as_bf16(v)
    if a.plant:
        plant(dep, a.plant)
    qcfg = {"deepseek": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                         "activation_scheme": "dynamic"},
            "modelopt": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
            "compressed": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"},
            "compressed_fp8": {"quant_method": "compressed-tensors", "format": "float-quantized"}}[a.convention]
    write(os.path.join(a.out, "deployed"), dep, a.shards, {"model_type": "llama", "quantization_config": qcfg})


if __name__ == "__main__":
    main()
