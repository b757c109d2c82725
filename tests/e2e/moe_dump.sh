#!/bin/sh
# moe_dump.sh: the moe class from a dump (spec schema): a routed-experts
# module with repeated routing and an empty expert passes with the builtin
# candidate; bad input (ids out of [0, E), w1 inconsistent with the
# activation, topk_weights not [T, k], an unknown activation) exits 2 with
# one `qatcheck: error:` line naming the dataset or key, and no report.
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
def module(f, path, ids, w1_rows=2 * F, wshape=(T, k), contract=None):
    g = f.create_group(path)
    g.attrs["class"] = "moe"
    if contract is not None:
        g.attrs["contract"] = json.dumps(contract)
    g["inputs/x"] = bf(rng.standard_normal((T, H)))
    g["inputs/topk_weights"] = rng.random(wshape).astype(np.float32)
    g["params/w1"] = bf(rng.standard_normal((E, w1_rows, H)) / np.sqrt(H))
    g["params/w2"] = bf(rng.standard_normal((E, H, F)) / np.sqrt(F))
    g["saved/topk_ids"] = ids
    g["grad_out/dy"] = bf(rng.standard_normal((T, H)))
good = rng.integers(0, E - 1, (T, k)).astype(np.int32)  # expert E-1 empty
good[1::4, 1] = good[1::4, 0]                           # repeated routing
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    module(f, "model.layers.0.mlp.experts", good, contract={"activation": "swiglu"})
    bad = good.astype(np.int64); bad[5, 2] = E
    module(f, "bad.ids_range", bad)
    module(f, "bad.w1_shape", good, w1_rows=F)
    module(f, "bad.weights_shape", good, wshape=(T, k + 1))
    module(f, "bad.activation", good, contract={"activation": "gelu"})
P
TOL='{"d_x":{"rel_l2":2e-2,"reasoning":"bf16 GEMM operands"},"d_w1":{"rel_l2":2e-2,"reasoning":"bf16 GEMM operands"},"d_w2":{"rel_l2":2e-2,"reasoning":"bf16 GEMM operands"},"d_topk_weights":{"rel_l2":2e-2,"reasoning":"bf16 GEMM operands"}}'
cat >"$T/good.json" <<J
{"data": {"dump": "d.h5", "modules": "experts\$"}, "candidate": "builtin", "tolerances": $TOL}
J
expect_exit 0 "moe module from a dump passes" "$QATCHECK" vjp --case "$T/good.json" --quiet
while read -r grp needle; do
  cat >"$T/bad.json" <<J
{"data": {"dump": "d.h5", "modules": "^/bad\\\\.$grp\$"}, "candidate": "builtin", "tolerances": $TOL}
J
  rm -f "$T/bad.r.json"
  expect_exit 2 "moe $grp is refused" "$QATCHECK" vjp --case "$T/bad.json" --json "$T/bad.r.json"
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] || bad "$grp: expected one error line: $(cat "$T/err")"
  grep 'qatcheck: error:' "$T/err" | grep -q "$needle" || bad "$grp: the message does not name '$needle': $(cat "$T/err")"
  [ ! -e "$T/bad.r.json" ] || bad "$grp: a refused run wrote a report"
done <<EOF2
ids_range saved/topk_ids
w1_shape params/w1
weights_shape topk_weights
activation activation
EOF2
finish
