#!/bin/sh
# ssd_dump.sh: the ssd class from a dump (spec schema): a module with an
# initial state passes with the builtin candidate; bad input (A with a
# positive entry, dt negative, Bm of another length than x, dt of another
# head count, an unknown contract key, an initial_state the contract does
# not use) exits 2 with one `qatcheck: error:`
# line naming the dataset or key, and only the error report. With Mamba-2's
# D skip (d_skip = true), a trainer's gradients from the dump: correct
# passes, d_x without the skip path D dy fails on d_x. With ngroups = 2
# (Bm, Cm [B, L, G, N], H = 4: once refused by rank), a trainer's
# gradients pass, and d_Bm, d_Cm summed over the wrong heads (h mod G
# instead of h / (H/G)) fail on d_Bm and d_Cm alone. With the z gate
# (z_gate = true: the output is y silu(z), mamba_ssm's z), a trainer's
# gradients pass under derived tolerances, the builtin candidate passes, a
# backward that forgets d_z fails on d_z alone and one that forgets the
# gate's effect on d_x (d_x from the ungated dY) fails on d_x alone; an
# inputs/z the contract does not use is refused. The outputs/y of the float64
# scan passes the forward check.
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
# Mamba-2's D skip (issue 26): a trainer's float32 gradients from a dump.
# The correct backward passes; one that forgets the skip path D dy in d_x
# (which used to pass: inputs/D was ignored) fails on d_x alone.
$PY - "$T/dskip.h5" <<'P' || exit 1
import json, sys
import h5py
import numpy as np
rng = np.random.default_rng(26)
B, L, H, P, N = 2, 40, 3, 4, 8
x = rng.standard_normal((B, L, H, P)); dt = np.log1p(np.exp(rng.standard_normal((B, L, H)) - 2))
A = -np.exp(rng.uniform(-1, 1, H)); Bm = rng.standard_normal((B, L, N)); Cm = rng.standard_normal((B, L, N))
D = 1 + 0.5 * rng.standard_normal(H); dy = rng.standard_normal((B, L, H, P))
x, dt, A, Bm, Cm, D, dy = (a.astype(np.float32) for a in (x, dt, A, Bm, Cm, D, dy))
X, DT, AA, BB, CC, DD, G = (a.astype(np.float64) for a in (x, dt, A, Bm, Cm, D, dy))
dx = np.zeros_like(X); ddt = np.zeros_like(DT); dA = np.zeros(H); dB = np.zeros_like(BB); dC = np.zeros_like(CC)
dD = np.zeros(H)
for b in range(B):
    for h in range(H):  # the recurrence h_t = g_t h_{t-1} + dt_t x_t (x) B_t, y_t = h_t C_t + D x_t, and its reverse scan
        hs = [np.zeros((P, N))]
        for t in range(L):
            hs.append(np.exp(DT[b, t, h] * AA[h]) * hs[-1] + DT[b, t, h] * np.outer(X[b, t, h], BB[b, t]))
        adj = np.zeros((P, N))
        for t in range(L - 1, -1, -1):
            g = np.exp(DT[b, t, h] * AA[h]); gy = G[b, t, h]
            adj += np.outer(gy, CC[b, t])
            dC[b, t] += hs[t + 1].T @ gy
            gb = adj @ BB[b, t]
            dx[b, t, h] = DT[b, t, h] * gb + DD[h] * gy
            dB[b, t] += DT[b, t, h] * adj.T @ X[b, t, h]
            e = g * np.sum(adj * hs[t])
            ddt[b, t, h] = AA[h] * e + X[b, t, h] @ gb
            dA[h] += DT[b, t, h] * e
            dD[h] += gy @ X[b, t, h]
            adj *= g
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    nos = dx - DD[None, None, :, None] * G
    # skip_unused: inputs/D held, the contract's d_skip left false, the
    # backward without the skip (the scan alone, no d_D)
    for path, gx, skip in (("mixer.ok", dx, True), ("mixer.no_skip_grad", nos, True), ("mixer.skip_unused", nos, False)):
        g = f.create_group(path)
        g.attrs["class"] = "ssd"
        g.attrs["contract"] = json.dumps({"chunk_size": 16, "d_skip": skip})
        for k, v in (("x", x), ("dt", dt), ("A", A), ("Bm", Bm), ("Cm", Cm), ("D", D)):
            g["inputs/" + k] = v
        g["grad_out/dy"] = dy
        for k, v in (("d_x", gx), ("d_dt", ddt), ("d_A", dA), ("d_Bm", dB), ("d_Cm", dC), ("d_D", dD))[:6 if skip else 5]:
            g["grads/dy/" + k] = v.astype(np.float32)
P
DTOL=$(echo "$TOL" | sed 's/}}$/},"d_D":{"rel_l2":2.34e-6,"reasoning":"float32 sum of dy x"}}/')
group_cases dskip.h5 mixer "$DTOL" ok no_skip_grad
expect_exit 0 "ssd D skip: the correct trainer backward passes" "$QATCHECK" vjp --case "$T/ok.json" --quiet
expect_exit 1 "ssd D skip: a backward without the skip path in d_x fails" "$QATCHECK" vjp --case "$T/no_skip_grad.json" --json "$T/ns.r.json"
$PY - "$T/ns.r.json" <<'P' && ok "it fails on d_x alone" || bad "the D-skip defect does not fail exactly d_x"
import json, sys
r = json.load(open(sys.argv[1]))
failed = {c["tensor"] for c in r["checks"] if c["verdict"] == "fail"}
assert failed == {"d_x"}, failed
P
# inputs/D held while the contract's d_skip is false (issue 38): refused
# the same way whatever the tolerances: declared bounds (which used to
# pass it: only the derivation read the class's view), derived ones, and
# `tol --dump`. The backward is the scan without the skip, which the
# reference without D would match.
STOL=$(echo "$TOL" | sed 's/,"d_initial_state":{[^}]*}//')
group_cases dskip.h5 mixer "$STOL" skip_unused
cp "$T/skip_unused.json" "$T/skip_unused_declared.json"
group_cases dskip.h5 mixer '{"d_x":{"derive":true},"d_dt":{"derive":true},"d_A":{"derive":true},"d_Bm":{"derive":true},"d_Cm":{"derive":true}}' skip_unused
mv "$T/skip_unused.json" "$T/skip_unused_derived.json"
for form in skip_unused_declared skip_unused_derived; do
  rm -f "$T/su.r.json"
  expect_exit 2 "ssd inputs/D without d_skip is refused ($form)" "$QATCHECK" vjp --case "$T/$form.json" --json "$T/su.r.json"
  grep -q "inputs/D.*d_skip" "$T/err" || bad "$form: the refusal does not name inputs/D and d_skip: $(cat "$T/err")"
  error_or_none "$T/su.r.json" || bad "$form: a refused run wrote a report other than its error report"
done
expect_exit 2 "ssd inputs/D without d_skip is refused by tol --dump" "$QATCHECK" tol --dump "$T/dskip.h5" --module /mixer.skip_unused
grep -q "inputs/D" "$T/err" || bad "tol --dump: the refusal does not name inputs/D: $(cat "$T/err")"
# Mamba-2's ngroups (issue 26): Bm, Cm [B, L, G, N], head h reads group
# h // (H // G); d_Bm, d_Cm sum over the heads of a group. A planted
# backward that sums them over the interleaved heads h % G fails there.
$PY - "$T/groups.h5" <<'P' || exit 1
import json, sys
import h5py
import numpy as np
rng = np.random.default_rng(62)
B, L, H, P, N, G = 2, 30, 4, 4, 8, 2
x = rng.standard_normal((B, L, H, P)); dt = np.log1p(np.exp(rng.standard_normal((B, L, H)) - 2))
A = -np.exp(rng.uniform(-1, 1, H)); Bm = rng.standard_normal((B, L, G, N)); Cm = rng.standard_normal((B, L, G, N))
dy = rng.standard_normal((B, L, H, P))
x, dt, A, Bm, Cm, dy = (a.astype(np.float32) for a in (x, dt, A, Bm, Cm, dy))
X, DT, AA, BB, CC, GY = (a.astype(np.float64) for a in (x, dt, A, Bm, Cm, dy))
def grads(group_of_grad):
    dx = np.zeros_like(X); ddt = np.zeros_like(DT); dA = np.zeros(H); dB = np.zeros_like(BB); dC = np.zeros_like(CC)
    for b in range(B):
        for h in range(H):
            g_in, g_out = h // (H // G), group_of_grad(h)
            hs = [np.zeros((P, N))]
            for t in range(L):
                hs.append(np.exp(DT[b, t, h] * AA[h]) * hs[-1] + DT[b, t, h] * np.outer(X[b, t, h], BB[b, t, g_in]))
            adj = np.zeros((P, N))
            for t in range(L - 1, -1, -1):
                g = np.exp(DT[b, t, h] * AA[h]); gy = GY[b, t, h]
                adj += np.outer(gy, CC[b, t, g_in])
                dC[b, t, g_out] += hs[t + 1].T @ gy
                gb = adj @ BB[b, t, g_in]
                dx[b, t, h] = DT[b, t, h] * gb
                dB[b, t, g_out] += DT[b, t, h] * adj.T @ X[b, t, h]
                e = g * np.sum(adj * hs[t])
                ddt[b, t, h] = AA[h] * e + X[b, t, h] @ gb
                dA[h] += DT[b, t, h] * e
                adj *= g
    return dx, ddt, dA, dB, dC
def forward():  # y_t = h_t C_t, h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, float64
    Y = np.zeros_like(X)
    for b in range(B):
        for h in range(H):
            hs, gi = np.zeros((P, N)), h // (H // G)
            for t in range(L):
                hs = np.exp(DT[b, t, h] * AA[h]) * hs + DT[b, t, h] * np.outer(X[b, t, h], BB[b, t, gi])
                Y[b, t, h] = hs @ CC[b, t, gi]
    return Y
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    for path, grp in (("mixer.groups_ok", lambda h: h // (H // G)), ("mixer.groups_wrong_heads", lambda h: h % G)):
        g = f.create_group(path)
        g.attrs["class"] = "ssd"
        g.attrs["contract"] = json.dumps({"chunk_size": 8})
        for k, v in (("x", x), ("dt", dt), ("A", A), ("Bm", Bm), ("Cm", Cm)):
            g["inputs/" + k] = v
        g["grad_out/dy"] = dy
        g["outputs/y"] = forward().astype(np.float32)
        for k, v in zip(("d_x", "d_dt", "d_A", "d_Bm", "d_Cm"), grads(grp)):
            g["grads/dy/" + k] = v.astype(np.float32)
P
GTOL=$(echo "$TOL" | sed 's/,"d_initial_state":{[^}]*}//')
group_cases groups.h5 mixer "$GTOL" groups_ok groups_wrong_heads
expect_exit 0 "ssd ngroups 2, H 4: the trainer's backward passes" "$QATCHECK" vjp --case "$T/groups_ok.json" --json "$T/go.r.json"
$PY - "$T/go.r.json" <<'P' && ok "its outputs/y passes the forward check" || bad "the ssd outputs/y fails or is not checked"
import json, sys
sys.exit(0 if [c["verdict"] for c in json.load(open(sys.argv[1]))["checks"] if c.get("kind") == "forward"] == ["pass"] else 1)
P
sed 's/"candidate": "dump"/"candidate": "builtin"/' "$T/groups_ok.json" >"$T/groups_builtin.json"
expect_exit 0 "ssd ngroups 2, H 4: the builtin candidate passes" "$QATCHECK" vjp --case "$T/groups_builtin.json" --quiet
expect_exit 1 "ssd ngroups: d_Bm, d_Cm summed over the wrong heads fail" "$QATCHECK" vjp --case "$T/groups_wrong_heads.json" --json "$T/gw.r.json"
$PY - "$T/gw.r.json" <<'P' && ok "it fails on d_Bm and d_Cm alone" || bad "the wrong-heads defect does not fail exactly d_Bm, d_Cm"
import json, sys
r = json.load(open(sys.argv[1]))
failed = {c["tensor"] for c in r["checks"] if c["verdict"] == "fail"}
assert failed == {"d_Bm", "d_Cm"}, failed
P
# Mamba-2's z gate (issue 26): o = y silu(z), y the scan plus the D skip.
$PY - "$T/gate.h5" <<'P' || exit 1
import json, sys
import h5py
import numpy as np
rng = np.random.default_rng(27)
B, L, H, P, N = 2, 36, 3, 4, 8
x = rng.standard_normal((B, L, H, P)); dt = np.log1p(np.exp(rng.standard_normal((B, L, H)) - 2))
A = -np.exp(rng.uniform(-1, 1, H)); Bm = rng.standard_normal((B, L, N)); Cm = rng.standard_normal((B, L, N))
D = 1 + 0.5 * rng.standard_normal(H); z = 2 * rng.standard_normal((B, L, H, P)); do = rng.standard_normal((B, L, H, P))
x, dt, A, Bm, Cm, D, z, do = (a.astype(np.float32) for a in (x, dt, A, Bm, Cm, D, z, do))
X, DT, AA, BB, CC, DD, Z, DO = (a.astype(np.float64) for a in (x, dt, A, Bm, Cm, D, z, do))
sg = 1 / (1 + np.exp(-Z))
def grads(gy):
    """the scan's gradients under its upstream gradient gy, and its output y"""
    y = np.zeros_like(X); dx = np.zeros_like(X); ddt = np.zeros_like(DT); dA = np.zeros(H); dB = np.zeros_like(BB)
    dC = np.zeros_like(CC); dD = np.zeros(H)
    for b in range(B):
        for h in range(H):
            hs = [np.zeros((P, N))]
            for t in range(L):
                hs.append(np.exp(DT[b, t, h] * AA[h]) * hs[-1] + DT[b, t, h] * np.outer(X[b, t, h], BB[b, t]))
                y[b, t, h] = hs[-1] @ CC[b, t] + DD[h] * X[b, t, h]
            adj = np.zeros((P, N))
            for t in range(L - 1, -1, -1):
                g = np.exp(DT[b, t, h] * AA[h]); gt = gy[b, t, h]
                adj += np.outer(gt, CC[b, t])
                dC[b, t] += hs[t + 1].T @ gt
                gb = adj @ BB[b, t]
                dx[b, t, h] = DT[b, t, h] * gb + DD[h] * gt
                dB[b, t] += DT[b, t, h] * adj.T @ X[b, t, h]
                e = g * np.sum(adj * hs[t])
                ddt[b, t, h] = AA[h] * e + X[b, t, h] @ gb
                dA[h] += DT[b, t, h] * e
                dD[h] += gt @ X[b, t, h]
                adj *= g
    return y, {"d_x": dx, "d_dt": ddt, "d_A": dA, "d_Bm": dB, "d_Cm": dC, "d_D": dD}
y, ok = grads(DO * Z * sg)
ok["d_z"] = DO * y * sg * (1 + Z * (1 - sg))
no_dz = {k: v for k, v in ok.items() if k != "d_z"}
ungated = dict(ok, d_x=grads(DO)[1]["d_x"])
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    for path, gr, contract in (("gate.ok", ok, {"z_gate": True}), ("gate.no_dz", no_dz, {"z_gate": True}),
                               ("gate.ungated_dx", ungated, {"z_gate": True}), ("gate.z_unused", no_dz, {})):
        g = f.create_group(path)
        g.attrs["class"] = "ssd"
        g.attrs["contract"] = json.dumps(dict(contract, chunk_size=16, d_skip=True))
        for k, v in (("x", x), ("dt", dt), ("A", A), ("Bm", Bm), ("Cm", Cm), ("D", D), ("z", z)):
            g["inputs/" + k] = v
        g["grad_out/dy"] = do
        for k, v in gr.items():
            g["grads/dy/" + k] = v.astype(np.float32)
P
ZTOL='{"d_x":{"derive":true},"d_dt":{"derive":true},"d_A":{"derive":true},"d_Bm":{"derive":true},"d_Cm":{"derive":true},"d_D":{"derive":true},"d_z":{"derive":true}}'
group_cases gate.h5 gate "$ZTOL" ok no_dz ungated_dx z_unused
expect_exit 0 "ssd z gate: the correct trainer backward passes" "$QATCHECK" vjp --case "$T/ok.json" --quiet
sed 's/"candidate": "dump"/"candidate": "builtin"/' "$T/ok.json" >"$T/gate_builtin.json"
expect_exit 0 "ssd z gate: the builtin candidate passes" "$QATCHECK" vjp --case "$T/gate_builtin.json" --quiet
for d in no_dz:d_z ungated_dx:d_x; do
  grp=${d%%:*} tens=${d#*:}
  expect_exit 1 "ssd z gate: $grp fails" "$QATCHECK" vjp --case "$T/$grp.json" --json "$T/$grp.r.json"
  $PY - "$T/$grp.r.json" "$tens" <<'P' && ok "$grp fails on $tens alone" || bad "$grp does not fail exactly $tens"
import json, sys
r = json.load(open(sys.argv[1]))
failed = {c["tensor"] for c in r["checks"] if c["verdict"] == "fail"}
assert failed == {sys.argv[2]}, failed
P
done
expect_exit 2 "ssd: inputs/z without z_gate is refused" "$QATCHECK" vjp --case "$T/z_unused.json" --quiet
grep -q "inputs/z" "$T/err" || bad "the refusal does not name inputs/z: $(cat "$T/err")"
finish
