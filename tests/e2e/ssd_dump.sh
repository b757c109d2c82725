#!/bin/sh
# ssd_dump.sh: the ssd class from a dump (spec schema): a module with an
# initial state passes with the builtin candidate; bad input (A with a
# positive entry, dt negative, Bm of another length than x, dt of another
# head count, an unknown contract key, an initial_state the contract does
# not use) exits 2 with one `qatcheck: error:`
# line naming the dataset or key, and only the error report.
. "$(dirname "$0")/lib.inc"
$PY - "$T/d.h5" <<'P' || exit 1
import json, sys
import h5py
import numpy as np
rng = np.random.default_rng(5)
def bf(a):  # float32 values exactly representable in bf16
    a = np.asarray(a, np.float32).copy()
    a.view(np.uint32)[...] &= 0xFFFF0000
    return a
B, L, H, P, N = 2, 70, 3, 8, 16
def module(f, path, contract, A=None, dt=None, bl=L, dth=H):
    g = f.create_group(path)
    g.attrs["class"] = "ssd"
    g.attrs["contract"] = json.dumps(contract)
    g["inputs/x"] = bf(rng.standard_normal((B, L, H, P)))
    g["inputs/dt"] = dt if dt is not None else np.log1p(np.exp(rng.standard_normal((B, L, dth)) - 2)).astype(np.float32)
    g["inputs/A"] = A if A is not None else (-np.exp(rng.uniform(-1, 1, H))).astype(np.float32)
    g["inputs/Bm"] = bf(rng.standard_normal((B, bl, N)))
    g["inputs/Cm"] = bf(rng.standard_normal((B, bl, N)))
    g["inputs/initial_state"] = rng.standard_normal((B, H, P, N)).astype(np.float32)
    g["grad_out/dy"] = rng.standard_normal((B, L, H, P)).astype(np.float32)
c = {"chunk_size": 32, "initial_state": True}
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    module(f, "model.layers.0.mixer.ssd", c)
    module(f, "bad.A_positive", c, A=np.array([-1.0, 0.5, -0.3], np.float32))
    dt = np.full((B, L, H), 0.1, np.float32); dt[1, 7, 2] = -0.2
    module(f, "bad.dt_negative", c, dt=dt)
    module(f, "bad.Bm_length", c, bl=L - 1)
    module(f, "bad.dt_heads", c, dth=H + 1)
    module(f, "bad.key", {"chunk_size": 32, "ngroups": 2})
    module(f, "bad.state_unused", {"chunk_size": 32})  # initial_state held, contract false
P
R='"reasoning": "float32 chunked scan; bound of cases/ssd.json"'
TOL="{\"d_x\":{\"rel_l2\":2.34e-6,$R},\"d_Bm\":{\"rel_l2\":2.34e-6,$R},\"d_Cm\":{\"rel_l2\":2.34e-6,$R},\"d_initial_state\":{\"rel_l2\":2.34e-6,$R},\"d_dt\":{\"rel_l2\":9.35e-6,$R},\"d_A\":{\"rel_l2\":9.57e-6,$R}}"
cat >"$T/good.json" <<J
{"data": {"dump": "d.h5", "modules": "mixer\\\\.ssd\$"}, "candidate": "builtin", "tolerances": $TOL}
J
expect_exit 0 "ssd module from a dump passes" "$QATCHECK" vjp --case "$T/good.json" --quiet
expect_refused_groups ssd d.h5 "$TOL" <<EOF2
A_positive inputs/A
dt_negative inputs/dt
Bm_length inputs/Bm
dt_heads inputs/dt
key ngroups
state_unused inputs/initial_state
EOF2
finish
