#!/usr/bin/env python3
"""make_seeds.py: the seed inputs of the fuzz harnesses for the readers of
safetensors checkpoints, TensorBoard event files, the text logs of layer 3,
configs, step dumps and execution-mode dumps, each written by its real
writer (the safetensors and tensorboard packages, h5py, PyYAML, json,
csv), tiny so that libFuzzer mutates them fast. Run once; the files are committed under
tests/fuzz/seeds/<harness>/ (python3 tests/fuzz/make_seeds.py [HARNESS...])."""
import csv
import io
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = os.path.join(HERE, "seeds")


def out(harness, name):
    d = os.path.join(SEEDS, harness)
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name)


def safetensors_seeds():
    from safetensors.numpy import save_file
    rng = np.random.default_rng(1)
    save_file({"model.layers.0.mlp.down_proj.weight": rng.standard_normal((4, 8)).astype(np.float32),
               "model.layers.0.mlp.down_proj.bias": rng.standard_normal(4).astype(np.float16),
               "lm_head.weight": rng.integers(0, 255, (2, 8), dtype=np.uint8)},
              out("safetensors", "f32_f16_u8.safetensors"), metadata={"format": "pt"})
    save_file({"x": np.zeros((0, 3), np.float64), "s": np.array(3, np.int64)}, out("safetensors", "empty_scalar.safetensors"))
    try:  # bfloat16 and float8 as torch writes them
        import torch
        from safetensors.torch import save_file as tsave
        t = {"w.bf16": torch.randn(3, 4).to(torch.bfloat16), "w.i8": torch.randint(-5, 5, (2, 2), dtype=torch.int8)}
        tsave(t, out("safetensors", "bf16_i8.safetensors"))
    except ImportError:
        pass
    # a hand-made header with the dtypes of deployed checkpoints (F8_E4M3 weight, F32 scale)
    hdr = {"m.weight": {"dtype": "F8_E4M3", "shape": [2, 4], "data_offsets": [0, 8]},
           "m.weight_scale_inv": {"dtype": "F32", "shape": [1, 1], "data_offsets": [8, 12]},
           "e.experts.w": {"dtype": "F4", "shape": [2, 2, 4], "data_offsets": [12, 20]},
           "__metadata__": {"quant_method": "fp8"}}
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(out("safetensors", "f8_f4.safetensors"), "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + bytes(range(20)))


def tfevents_seeds():
    from torch.utils.tensorboard import SummaryWriter
    import glob
    import tempfile
    for style in (False, True):  # simple_value, and the one-element tensor form
        with tempfile.TemporaryDirectory() as d:
            w = SummaryWriter(log_dir=d)
            for s in range(1, 4):
                w.add_scalar("train/loss", 2.0 / s, s, new_style=style)
                w.add_scalar("val/nll", 1.5 / s, s, new_style=style)
            w.close()
            f = sorted(glob.glob(os.path.join(d, "events.out.tfevents.*")))[0]
            with open(f, "rb") as src, open(out("tfevents", "scalars_%s.tfevents" % ("tensor" if style else "simple")), "wb") as dst:
                dst.write(src.read())


def log_seeds():
    """Selector byte first (tests/fuzz/log.c): 0 by content, 1 JSONL, 2 CSV,
    3 Megatron, 4 trainer_state.json."""
    recs = [{"step": s, "loss": 2.0 / s, "grad_norm": 0.5 + s / 10, "lr": 1e-3} for s in range(1, 5)]
    jl = "".join(json.dumps({"step": r["step"], "data": {k: v for k, v in r.items() if k != "step"}}) + "\n" for r in recs)
    flat = "".join(json.dumps(r) + "\n" for r in recs)
    b = io.StringIO()
    w = csv.DictWriter(b, fieldnames=("step", "loss", "grad_norm", "lr"))
    w.writeheader()
    for r in recs:
        w.writerow(r)
    mg = {"lm loss": {"start_step": 1, "end_step": 4, "step_interval": 1, "values": {str(r["step"]): r["loss"] for r in recs}}}
    hf = {"global_step": 4, "log_history": [{"loss": r["loss"], "step": r["step"], "epoch": r["step"] / 4} for r in recs] +
          [{"eval_loss": 1.0, "step": 4}]}
    for name, sel, text in (("verl.jsonl", 1, jl), ("flat.jsonl", 0, flat), ("metrics.csv", 2, b.getvalue()),
                            ("golden_values.json", 3, json.dumps(mg)), ("trainer_state.json", 4, json.dumps(hf, indent=1))):
        with open(out("log", name), "wb") as f:
            f.write(bytes([sel]) + text.encode())


def config_seeds():
    import yaml
    conf = {"run": {"seed": 3}, "optimizer": {"name": "adamw", "lr": 1e-4, "betas": [0.9, 0.95]},
            "schedule": {"name": "cos", "warmup": 5}, "precision": {"forward": "fp8"}, "a.b": True}
    with open(out("config", "config.json"), "w") as f:
        json.dump(conf, f)
    with open(out("config", "config.yaml"), "w") as f:
        yaml.safe_dump(conf, f, sort_keys=False)
    with open(out("config", "anchors.yaml"), "w") as f:
        f.write("base: &b {lr: 0.1, seed: 1}\noptimizer: *b\nlist:\n  - 1\n  - [2, 3]\n")


def stepdump_seeds():
    import h5py
    rng = np.random.default_rng(2)
    with h5py.File(out("stepdump", "two_arms.h5"), "w") as f:
        f.attrs["qatcheck_step"] = 1
        for arm, opt in (("under_test", "adamw"), ("reference", "sgd")):
            g = f.create_group(arm)
            g.attrs.update({"optimizer": opt, "lr": 1e-3, "weight_decay": 0.01, "step": 3, "max_grad_norm": 1.0,
                            "grad_scale": 1.0, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "momentum": 0.9})
            g.attrs["frozen"] = ["emb"]
            for n in ("w", "emb"):
                g.create_dataset(f"before/{n}", data=rng.standard_normal((2, 3)).astype(np.float32))
                g.create_dataset(f"after/{n}", data=rng.standard_normal((2, 3)).astype(np.float32))
            g.create_dataset("grad/w", data=rng.standard_normal((2, 3)).astype(np.float32))
            if opt == "adamw":
                g.create_dataset("state/exp_avg/w", data=np.zeros((2, 3), np.float32))
                g.create_dataset("state/exp_avg_sq/w", data=np.zeros((2, 3), np.float32))
            else:
                g.create_dataset("state/momentum_buffer/w", data=np.zeros((2, 3), np.float32))
            d = g.create_dataset("after_master/w", data=np.zeros((2, 3), np.uint16))
            d.attrs["dtype"] = "bfloat16"


def modes_seeds():
    """Execution-mode dumps (docs/interfaces.md 2d), tiny, each followed by
    the separator and the eager dump of the same step where the mode is
    compared with one (tests/fuzz/modes.c)."""
    import h5py
    import tempfile
    rng = np.random.default_rng(3)
    x, w, b, dy = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3), (2, 3), (2,), (2, 2)))
    grads = {"d_x": dy @ w, "d_weight": dy.T @ x, "d_bias": dy.sum(0)}

    def module(f, path, scale=1.0):
        g = f.create_group(path)
        g.attrs["class"] = "linear"
        g["inputs/x"], g["params/weight"], g["params/bias"] = x, w, b
        g["outputs/y"], g["grad_out/dy"] = x @ w.T + b, dy * scale
        for k, v in grads.items():
            g["grads/dy/" + k] = v * scale

    def image(mode, fill):
        with tempfile.TemporaryDirectory() as d:
            with h5py.File(d + "/f.h5", "w", libver="latest") as f:
                f.attrs["qatcheck_dump"] = np.int64(1)
                if mode:
                    f.attrs["mode"] = mode
                fill(f)
            return open(d + "/f.h5", "rb").read()

    def eager(f):
        module(f, "fc1")

    def recompute(f):
        module(f, "fc1")
        f["qatcheck_mode/first_forward/fc1/inputs/x"], f["qatcheck_mode/first_forward/fc1/outputs/y"] = x, x @ w.T + b

    def grad_accum(f):
        f.attrs["microbatches"] = np.int64(2)
        for k in range(2):
            module(f, "microbatch%d/fc1" % k, 0.5)
        for p in ("d_weight", "d_bias"):
            f["qatcheck_mode/accumulated/fc1/" + p] = grads[p]

    def tied(f):
        module(f, "enc")
        module(f, "dec")
        g = f.create_group("qatcheck_mode/tied/enc.weight")
        g.attrs["sites"], g.attrs["parameters"] = '["/enc/weight", "/dec/weight"]', '["enc.weight"]'
        g["accumulated"] = 2 * grads["d_weight"]

    sep = b"\nQC-EAGER\n"
    e = image(None, eager)
    for name, data in (("recompute_eager", image("recompute", recompute) + sep + e),
                       ("cuda_graph_eager", image("cuda_graph", eager) + sep + e),
                       ("grad_accum_eager", image("grad_accum", grad_accum) + sep + e),
                       ("grad_accum", image("grad_accum", grad_accum)),
                       ("tied", image("tied", tied)),
                       ("autocast", image("autocast", eager)),
                       ("no_mode", image(None, grad_accum))):
        with open(out("modes", name + ".bin"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    only = sys.argv[1:]  # harness names: rewrite only their seeds
    for fn in (safetensors_seeds, tfevents_seeds, log_seeds, config_seeds, stepdump_seeds, modes_seeds):
        if not only or fn.__name__[:-6] in only:
            fn()
    print("seeds written under", SEEDS, file=sys.stderr)
