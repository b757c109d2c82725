#!/usr/bin/python3
"""make_big_safetensors.py: a large safetensors master checkpoint for
bench/contract.sh, written by hand (header, then the data streamed one
tensor at a time, so memory stays at one tensor): LAYERS layers x 7 linear
weights (self_attn.q/k/v/o_proj, mlp.gate/up/down_proj) of [HIDDEN, HIDDEN]
BF16, sharded in files of at most --shard-gb GB with a
model.safetensors.index.json, as Hugging Face writes them.

    make_big_safetensors.py OUTDIR [--layers 32] [--hidden 4096] [--shard-gb 5] [--sparse] [--seed S]

Values: random BF16 bit patterns of magnitude 2^-7 .. 2^-3 (the sweep's
speed does not depend on them). --sparse writes only the headers and leaves
the data as holes (zeros; no disk space): a checkpoint larger than host
memory for the streaming test, at no cost."""
import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("numpy")
import numpy as np  # noqa: E402

MODULES = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--sparse", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    h = a.hidden
    nbytes = h * h * 2
    names = ["model.layers.%d.%s.weight" % (l, m) for l in range(a.layers) for m in MODULES]
    per = max(1, int(a.shard_gb * 1e9) // nbytes)
    shards = [names[i:i + per] for i in range(0, len(names), per)]
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    wmap, total = {}, 0
    for si, group in enumerate(shards):
        fname = "model-%05d-of-%05d.safetensors" % (si + 1, len(shards))
        hdr = {"__metadata__": {"format": "pt"}}
        for k, n in enumerate(group):
            hdr[n] = {"dtype": "BF16", "shape": [h, h], "data_offsets": [k * nbytes, (k + 1) * nbytes]}
            wmap[n] = fname
        text = json.dumps(hdr, separators=(",", ":")).encode()
        text += b" " * (-(8 + len(text)) % 8)  # the data starts 8-byte aligned, as the package writes it
        size = 8 + len(text) + len(group) * nbytes
        total += len(group) * nbytes
        with open(os.path.join(a.out, fname), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            if a.sparse:
                f.truncate(size)
                continue
            for _ in group:
                m = rng.integers(0, 1 << 16, size=h * h, dtype=np.uint16)
                bits = (m & np.uint16(0x807F)) | np.uint16(0x3C00) | ((m >> np.uint16(7)) & np.uint16(3)) << np.uint16(7)
                f.write(bits.tobytes())
        print("%s: %d tensors, %.2f GB%s" % (fname, len(group), size / 1e9, " (sparse)" if a.sparse else ""))
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=1)


if __name__ == "__main__":
    main()
