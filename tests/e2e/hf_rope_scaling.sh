#!/bin/sh
# hf_rope_scaling.sh: a transformers Llama whose config scales RoPE (Llama
# 3.1's llama3 bands, YaRN with its attention scaling) dumped by
# scripts/qatdump_hf.py --rope-scaling: each rope module carries the
# rotary_emb's inv_freq table (inputs/inv_freq) and its attention_scaling
# (contract scale), and the whole model passes. A backward that leaves out
# YaRN's scale (d_x of one rope module divided by it) fails on that module
# only; an inv_freq table of the wrong length exits 2 naming it; at
# positions 30000+ a correct table passes and one the trainer rounded to
# bf16 fails. Before the
# rope class took the table, these correct models failed every rope check
# (rel_l2 0.14 under YaRN). Skips (77) without transformers 4.49.
. "$(dirname "$0")/lib.inc"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
need_hf
L3='{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}'
YA='{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}'
for t in llama3 yarn; do
  [ $t = llama3 ] && spec=$L3 || spec=$YA
  "$PY" "$ROOT/scripts/qatdump_hf.py" --arch llama --rope-scaling "$spec" --seq 48 --out "$T/$t" >"$T/$t.log" 2>&1 ||
    { bad "qatdump_hf.py --rope-scaling $t"; tail -5 "$T/$t.log"; continue; }
  expect_exit 0 "a Llama under $t rope scaling passes" sh -c 'cd "$1" && "$2" vjp --case case.json --json r.json' - "$T/$t" "$QATCHECK"
  "$PY" - "$T/$t" "$t" <<'P' && ok "$t: every rope module has the table and was checked" || bad "$t: a rope module lacks the table or a check"
import json, sys, h5py
d, t = sys.argv[1], sys.argv[2]
r = json.load(open(d + "/r.json"))
ropes = sorted({c["module"] for c in r["checks"] if ".qc_rope_" in c["module"]})
assert len(ropes) == 4, ropes
with h5py.File(d + "/step.h5", "r") as f:
    for m in ropes:
        g = f[m]
        c = json.loads(g.attrs["contract"])
        assert "inv_freq" in g["inputs"] and g["inputs/inv_freq"].shape == (8,), m
        assert (c["scale"] > 1.1) == (t == "yarn"), (m, c)
P
done
# YaRN's scale left out of one rope module's backward: that module fails, alone
"$PY" - "$T/yarn" <<'P' || bad "could not plant the unscaled rope backward"
import json, h5py
with h5py.File(__import__("sys").argv[1] + "/step.h5", "a") as f:
    g = f["model.layers.1.self_attn.qc_rope_q"]
    k = json.loads(g.attrs["contract"])["scale"]
    d = g["grads/dy/d_x"][...]
    del g["grads/dy/d_x"]
    g["grads/dy/d_x"] = (d / k).astype(d.dtype)
P
expect_exit 1 "YaRN's scale left out of one rope backward" sh -c 'cd "$1" && "$2" vjp --case case.json --json r2.json' - "$T/yarn" "$QATCHECK"
"$PY" - "$T/yarn/r2.json" <<'P' && ok "only the planted rope module fails" || bad "the failures are not the planted rope module's alone"
import json, sys
r = json.load(open(sys.argv[1]))
assert {c["module"] for c in r["checks"] if c["verdict"] != "pass"} == {"/model.layers.1.self_attn.qc_rope_q"}
P
# an inv_freq of the wrong length: exit 2, the dataset named
"$PY" - "$T/llama3" <<'P' || bad "could not write the bad table"
import h5py, sys
with h5py.File(sys.argv[1] + "/step.h5", "a") as f:
    g = f["model.layers.0.self_attn.qc_rope_k/inputs"]
    v = g["inv_freq"][...]
    del g["inv_freq"]
    g["inv_freq"] = v[:-1]
P
expect_exit 2 "an inv_freq table of the wrong length" sh -c 'cd "$1" && "$2" vjp --case case.json' - "$T/llama3" "$QATCHECK"
grep -q "error: .*inputs/inv_freq" "$T/err" && ok "the error names inputs/inv_freq" || bad "the error does not name inputs/inv_freq"
# a scaled table at long positions, written here in float32 as torch does
# (angle p f, cos and sin, the half-split rotation): correct, the forward's
# model is still rope's own (float32 angles at p ~ 30000), and it passes;
# the trainer's table rounded to bf16 while the dump keeps float32 fails
# (the bf16-inputs variant rounds the differentiated x, never the table)
"$PY" - "$T/long.h5" "$ROOT/scripts" <<'P' || bad "could not write the long-position rope dump"
import json, sys
import h5py, numpy as np
sys.path.insert(0, sys.argv[2])
from bf16 import round_ as bf  # to bfloat16 and back, nearest even (torch's .to(torch.bfloat16))
r = np.random.default_rng(5)
T, H, D = 64, 2, 16
x, dy = bf(r.standard_normal((T, H, D))), bf(r.standard_normal((T, H, D)))
pos = np.arange(30000, 30000 + T, dtype=np.int64)
f = (1.0 / 10000.0 ** (np.arange(0, D, 2) / D)).astype(np.float32)
f[D // 4:] /= 8  # a llama3-like low band, scaled
def rope(x, f, sign=1.0):
    ang = (pos.astype(np.float32)[:, None] * f[None, :]).astype(np.float32)
    c, s = np.cos(ang)[:, None, :], sign * np.sin(ang)[:, None, :]
    a, b = x[..., : D // 2], x[..., D // 2:]
    return np.concatenate([a * c - b * s, a * s + b * c], -1).astype(np.float32)
with h5py.File(sys.argv[1], "w") as h:
    h.attrs["qatcheck_dump"] = 1
    for name, fr in (("ok", f), ("table_bf16", bf(f))):
        g = h.create_group(name)
        g.attrs["class"] = "rope"
        g.attrs["contract"] = json.dumps({"theta": 10000.0, "layout": "half"})
        g["inputs/x"], g["inputs/positions"], g["inputs/inv_freq"] = x, pos, f
        g["outputs/y"], g["grad_out/dy"] = rope(x, fr), dy
        g["grads/dy/d_x"] = rope(dy, fr, -1.0)
P
for t in ok:0 table_bf16:1; do
  cat >"$T/long_${t%%:*}.json" <<J
{"data": {"dump": "long.h5", "modules": "^/${t%%:*}\$"}, "candidate": "dump", "tolerances": {"rope": {"d_x": {"derive": true, "reasoning": "the class's model"}}}}
J
  expect_exit "${t#*:}" "a scaled rope at positions 30000+: ${t%%:*}" "$QATCHECK" vjp --case "$T/long_${t%%:*}.json"
done
finish
