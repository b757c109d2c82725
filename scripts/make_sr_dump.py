#!/usr/bin/python3
"""make_sr_dump.py: dumps of linear weights whose deployed bytes were
stochastically rounded under the SR contract (docs/numerics.md, "Stochastic
rounding"), by the independent oracle (scripts/conformance/quant_oracle.py),
for `qatcheck quant`: one contract across tied weights, steps and expert
shards.

    make_sr_dump.py OUT.h5 tied    [--legacy]           two module paths, one tied weight
    make_sr_dump.py OUT.h5 replay  --step N [--contract-step M]
    make_sr_dump.py OUT.h5 experts [--ep-rank R --ep-size S] [--expert-id global|local]
    common: [--format FMT] [--seed S] [--n N --k K]

tied: /model.layers.0.attn.q_proj and /model.layers.1.attn.q_proj share one
Parameter (named model.layers.0.attn.q_proj.weight, its identity); the bytes
are its one rounding. The contracts declare sr_salt = the identity, or with
--legacy none (qatcheck then derives each module's salt from its path).
replay: /lin's bytes rounded at step N, its contract says sr_step M
(default N). experts: a stacked expert weight [E = 4, N, K] (identity
model.layers.0.mlp.experts.down_proj.weight) rounded as a whole, expert e's
counter indices e*N*K + i; rank R of S holds global experts [R*E/S,
(R+1)*E/S) as /model.layers.0.mlp.experts.<local>.down_proj, its contract
sr_expert = the global id (or, --expert-id local, the local one)."""
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

E = 4


def module(f, path, w, payload, scale, contract):
    grp = f.create_group(path.lstrip("/"))
    grp.attrs["class"] = "linear"
    grp.attrs["contract"] = json.dumps(contract)
    bf16.write(grp.require_group("params"), "weight", w)
    s = grp.require_group("saved")
    ds = s.create_dataset("weight_q", data=payload.astype(np.uint8))
    ds.attrs["dtype"] = "float8_e4m3fn"
    if np.asarray(scale).dtype == np.uint8:
        ds = s.create_dataset("weight_scale", data=scale)
        ds.attrs["dtype"] = "float8_e8m0fnu"
    else:
        s.create_dataset("weight_scale", data=np.asarray(scale, np.float32))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("scenario", choices=["tied", "replay", "experts"])
    ap.add_argument("--format", default="fp8_channel", choices=["fp8_tensor", "fp8_channel", "fp8_block128",
                                                                "fp8_block128_ue8m0", "mxfp8"])
    ap.add_argument("--seed", type=int, default=20250917)
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--k", type=int, default=160)
    ap.add_argument("--legacy", action="store_true")
    ap.add_argument("--step", type=int, default=0)
    ap.add_argument("--contract-step", type=int, default=None)
    ap.add_argument("--ep-rank", type=int, default=0)
    ap.add_argument("--ep-size", type=int, default=1)
    ap.add_argument("--expert-id", choices=["global", "local"], default="global")
    a = ap.parse_args()
    rng = np.random.default_rng(7)
    base = {"weight_format": a.format, "profile": "vllm", "rounding": {"sr": {"seed": a.seed}}}
    with h5py.File(a.out, "w") as f:
        f.attrs["qatcheck_dump"] = 1
        if a.scenario == "tied":
            ident = "model.layers.0.attn.q_proj.weight"
            w = bf16.round_(rng.standard_normal((a.n, a.k)).astype(np.float32) / np.sqrt(a.k))
            payload, scale, _ = O.quantize(a.format, "vllm", w, (a.seed, O.sr_salt(ident), a.step))
            c = dict(base, sr_step=a.step) if a.legacy else dict(base, sr_salt=ident, sr_step=a.step)
            for layer in (0, 1):
                module(f, "/model.layers.%d.attn.q_proj" % layer, w, payload, scale, c)
        elif a.scenario == "replay":
            ident = "lin.weight"
            w = bf16.round_(rng.standard_normal((a.n, a.k)).astype(np.float32) / np.sqrt(a.k))
            payload, scale, _ = O.quantize(a.format, "vllm", w, (a.seed, O.sr_salt(ident), a.step))
            cs = a.step if a.contract_step is None else a.contract_step
            module(f, "/lin", w, payload, scale, dict(base, sr_salt=ident, sr_step=cs))
        else:
            ident = "model.layers.0.mlp.experts.down_proj.weight"
            W = bf16.round_(rng.standard_normal((E, a.n, a.k)).astype(np.float32) / np.sqrt(a.k))
            per = E // a.ep_size
            for local in range(per):
                e = a.ep_rank * per + local
                payload, scale, _ = O.quantize(a.format, "vllm", W[e], (a.seed, O.sr_salt(ident), a.step, e * a.n * a.k))
                c = dict(base, sr_salt=ident, sr_step=a.step, sr_expert=e if a.expert_id == "global" else local)
                module(f, "/model.layers.0.mlp.experts.%d.down_proj" % local, W[e], payload, scale, c)


if __name__ == "__main__":
    main()
