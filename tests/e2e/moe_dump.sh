#!/bin/sh
# moe_dump.sh: the moe class from a dump (spec schema): a routed-experts
# module with repeated routing and an empty expert passes with the builtin
# candidate, with DeepSeek-V3's shared experts and Qwen2-MoE's gated one; bad input (ids out of [0, E), w1 inconsistent with the
# activation, topk_weights not [T, k], an unknown activation, a transposed
# dY of the right size, shared-expert tensors the contract does not use or
# whose Fs is not a multiple of shared_experts) exits 2 with
# one `qatcheck: error:` line naming the dataset or key, and only the error report.
. "$(dirname "$0")/lib.inc"
$PY - "$T/d.h5" <<'P' || exit 1
import json, sys
import h5py
import numpy as np
rng = np.random.default_rng(3)
def bf(a):  # float32 values exactly representable in bf16
    a = np.asarray(a, np.float32).copy()
    a.view(np.uint32)[...] &= 0xFFFF0000
    return a
T, H, F, E, k = 24, 32, 16, 5, 3
def module(f, path, ids, w1_rows=2 * F, wshape=(T, k), contract=None, shared=None):
    g = f.create_group(path)
    for name, a in (shared or {}).items():  # shared experts: params/shared_*
        g["params/" + name] = a
    g.attrs["class"] = "moe"
    if contract is not None:
        g.attrs["contract"] = json.dumps(contract)
    g["inputs/x"] = bf(rng.standard_normal((T, H)))
    g["inputs/topk_weights"] = rng.random(wshape).astype(np.float32)
    g["params/w1"] = bf(rng.standard_normal((E, w1_rows, H)) / np.sqrt(H))
    g["params/w2"] = bf(rng.standard_normal((E, H, F)) / np.sqrt(F))
    g["saved/topk_ids"] = ids
    g["grad_out/dy"] = bf(rng.standard_normal((T, H)))
good = rng.integers(0, E - 1, (T, k)).astype(np.int32)
good[good >= E // 2] += 1  # expert E/2 empty, the last one used
good[1::4, 1] = good[1::4, 0]                           # repeated routing
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    module(f, "model.layers.0.mlp.experts", good, contract={"activation": "swiglu"})
    bad = good.astype(np.int64); bad[5, 2] = E
    module(f, "bad.ids_range", bad)
    module(f, "bad.w1_shape", good, w1_rows=F)
    module(f, "bad.weights_shape", good, wshape=(T, k + 1))
    module(f, "bad.activation", good, contract={"activation": "gelu"})
    # shared experts: DeepSeek-V3 (2 of intermediate F, added unweighted) and
    # Qwen2-MoE (one, gated by sigmoid(x . shared_gate), the gate as [H])
    Fs = 2 * F
    ds = {"shared_w1": bf(rng.standard_normal((2 * Fs, H)) / np.sqrt(H)), "shared_w2": bf(rng.standard_normal((H, Fs)) / np.sqrt(Fs))}
    qw = dict(ds, shared_gate=bf(rng.standard_normal(H) / np.sqrt(H)))
    module(f, "deepseek.mlp", good, contract={"shared_experts": 2}, shared=ds)
    module(f, "qwen2.mlp", good, contract={"shared_experts": 2, "shared_gate": True}, shared=qw)
    module(f, "bad.shared_unused", good, shared=ds)
    module(f, "bad.gate_unused", good, contract={"shared_experts": 2}, shared=qw)
    module(f, "bad.shared_count", good, contract={"shared_experts": 3}, shared=ds)
    module(f, "bad.dy_transposed", good)
    del f["bad.dy_transposed/grad_out/dy"]  # [H, T]: the same count in another layout
    f["bad.dy_transposed/grad_out/dy"] = bf(rng.standard_normal((H, T)))
P
TOL='{"d_x":{"rel_l2":2e-2,"reasoning":"bf16 GEMM operands"},"d_w1":{"rel_l2":2e-2,"reasoning":"bf16 GEMM operands"},"d_w2":{"rel_l2":2e-2,"reasoning":"bf16 GEMM operands"},"d_topk_weights":{"rel_l2":2e-2,"reasoning":"bf16 GEMM operands"}}'
cat >"$T/good.json" <<J
{"data": {"dump": "d.h5", "modules": "experts\$"}, "candidate": "builtin", "tolerances": $TOL}
J
expect_exit 0 "moe module from a dump passes" "$QATCHECK" vjp --case "$T/good.json" --quiet
STOL=$(echo "$TOL" | sed 's/}}$/},"d_shared_w1":{"rel_l2":2e-2,"reasoning":"bf16 GEMM operands"},"d_shared_w2":{"rel_l2":2e-2,"reasoning":"bf16 GEMM operands"},"d_shared_gate":{"rel_l2":2e-2,"reasoning":"one dot per token"}}/')
for arch in deepseek qwen2; do
  cat >"$T/$arch.json" <<J
{"data": {"dump": "d.h5", "modules": "^/$arch\\\\.mlp$"}, "candidate": "builtin", "tolerances": $STOL}
J
  expect_exit 0 "moe with $arch shared experts passes" "$QATCHECK" vjp --case "$T/$arch.json" --json "$T/$arch.r.json"
done
grep -q '"d_shared_w1"' "$T/deepseek.r.json" && ok "deepseek: d_shared_w1 is checked" || bad "deepseek: d_shared_w1 not in the report"
grep -q '"d_shared_gate"' "$T/qwen2.r.json" && ok "qwen2: d_shared_gate is checked" || bad "qwen2: d_shared_gate not in the report"
expect_refused_groups moe d.h5 "$TOL" <<EOF2
ids_range saved/topk_ids
shared_unused params/shared_w1
gate_unused params/shared_gate
shared_count shared_w2
w1_shape params/w1
weights_shape topk_weights
activation activation
dy_transposed last dimension
EOF2

# the clamp's derivative exactly at the limit: gate and up pre-activations
# built to equal +-7 exactly (bf16-exact weights and inputs), under
# at_limit pass and block; the builtin production must follow the contract
# (a swapped rule shows up here, where generated data never lands on +-7)
$PY - "$T/lim.h5" <<'P' || exit 1
import json, sys
import h5py
import numpy as np
T, H, F, E, k, L = 6, 4, 3, 2, 2, 7.0
x = np.zeros((T, H), np.float32); x[:, 0] = 1.0; x[:, 1] = [0.5, -0.5, 1.0, 0.25, 0.5, -0.5]
w1 = np.zeros((E, 2 * F, H), np.float32)
w1[:, :, 0] = [7, -3, 2, 7, -7, 1]  # gate0 = 7, up0 = 7, up1 = -7 exactly
w1[:, 2, 1] = 1.0                    # gate2 moves with x[:, 1]
rng = np.random.default_rng(5)
w2 = (rng.standard_normal((E, H, F)) * 4).round() / 4
ids = np.array([[0, 1]] * T, np.int64); ids[1, 1] = 0
wt = ((rng.standard_normal((T, k)) * 8).round() / 8).astype(np.float32)
dy = ((rng.standard_normal((T, H)) * 8).round() / 8).astype(np.float32)
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = np.int64(1)
    for name in ("pass", "block"):
        g = f.create_group("/lim." + name); g.attrs["class"] = "moe"
        g.attrs["contract"] = json.dumps({"activation": "swiglu", "limit": L, "at_limit": name})
        g["inputs/x"] = x; g["inputs/topk_weights"] = wt; g["params/w1"] = w1
        g["params/w2"] = w2.astype(np.float32); g["saved/topk_ids"] = ids; g["grad_out/dy"] = dy
P
for rule in pass block; do
  cat >"$T/lim_$rule.json" <<J
{"data": {"dump": "lim.h5", "modules": "^/lim\\\\.$rule\$"}, "candidate": "builtin", "tolerances": $TOL}
J
  expect_exit 0 "moe at exactly the clamp limit, at_limit $rule" "$QATCHECK" vjp --case "$T/lim_$rule.json" --quiet
done
finish
