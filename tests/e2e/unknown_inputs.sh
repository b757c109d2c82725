#!/bin/sh
# unknown_inputs.sh: every class refuses what it does not model (issue 26).
# For each class, a valid dump group (/ok.CLASS) passes with the builtin
# candidate; the same group with one planted dataset the class does not
# take (inputs/D, params/extra, saved/extra, outputs/final_state, a
# candidate gradient grads/dy/d_extra) exits 2 with one `qatcheck: error:`
# line naming the dataset and listing what the class takes, and only the
# error report. Then the cases that used to pass silently: an SSD group
# with Mamba-2's D skip and z gate (both modelled now, each refused when
# its contract key is off), an rmsnorm with a bias, a linear
# candidate d_bias without params/bias, linear deployed bytes without a
# weight_format (or scales without bytes), an ssd initial_state the
# contract does not use, moe shared experts the contract does not declare,
# a group attribute or subgroup the reader does not read. The classes and
# their gradients are the class table's (`qatcheck classes --json`).
. "$(dirname "$0")/lib.inc"
$PY - "$T/d.h5" <<'P' || exit 1
import json, sys
import h5py
import numpy as np
rng = np.random.default_rng(26)
def bf(*shape, s=1.0):  # float32 values exactly representable in bf16
    a = (s * rng.standard_normal(shape)).astype(np.float32)
    a.view(np.uint32)[...] &= 0xFFFF0000
    return a
def attention():
    q, k, v = bf(1, 2, 5, 4), bf(1, 1, 5, 4), bf(1, 1, 5, 4)
    s = np.einsum("bhid,bjd->bhij", q.astype(np.float64), k[:, 0].astype(np.float64)) / 2.0
    s = np.where(np.tril(np.ones((5, 5), bool)), s, -np.inf)
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    out = np.einsum("bhij,bjd->bhid", np.exp(s - lse[..., None]), v[:, 0].astype(np.float64))
    return {"inputs": {"q": q, "k": k, "v": v}, "saved": {"out": out.astype(np.float32), "lse": lse.astype(np.float32)},
            "dy": bf(1, 2, 5, 4)}
def moe():
    ids = np.array([[i % 3, (i + 1) % 3] for i in range(6)], np.int64)
    return {"inputs": {"x": bf(6, 8), "topk_weights": rng.random((6, 2)).astype(np.float32)},
            "saved": {"topk_ids": ids}, "params": {"w1": bf(3, 8, 8, s=0.3), "w2": bf(3, 8, 4, s=0.5)}, "dy": bf(6, 8)}
def ssd(extra=None):
    d = {"inputs": {"x": bf(1, 5, 2, 3), "dt": np.log1p(np.exp(rng.standard_normal((1, 5, 2)) - 2)).astype(np.float32),
                    "A": (-np.exp(rng.uniform(-1, 1, 2))).astype(np.float32), "Bm": bf(1, 5, 4), "Cm": bf(1, 5, 4)},
         "dy": bf(1, 5, 2, 3)}
    d["inputs"].update(extra or {})
    return d
C = {
    "linear": lambda: {"inputs": {"x": bf(4, 8)}, "params": {"weight": bf(6, 8), "bias": bf(6)}, "dy": bf(4, 6)},
    "rmsnorm": lambda: {"inputs": {"x": bf(4, 8)}, "params": {"weight": bf(8)}, "dy": bf(4, 8)},
    "layernorm": lambda: {"inputs": {"x": bf(4, 8)}, "params": {"weight": bf(8), "bias": bf(8)}, "dy": bf(4, 8)},
    "rope": lambda: {"inputs": {"x": bf(5, 2, 8), "positions": np.arange(5, dtype=np.int64)}, "dy": bf(5, 2, 8)},
    "swiglu": lambda: {"inputs": {"gate": bf(4, 8), "up": bf(4, 8)}, "dy": bf(4, 8)},
    "relu2": lambda: {"inputs": {"x": bf(4, 8)}, "dy": bf(4, 8)},
    "gelu": lambda: {"inputs": {"x": bf(4, 8)}, "dy": bf(4, 8)},
    "logprob": lambda: {"inputs": {"logits": bf(2, 3, 10)}, "saved": {"token_ids": rng.integers(0, 10, (2, 3))},
                        "dy": bf(2, 3)},
    # the ids are the logits' top-2: the selection the contract defines (a saved selection is judged)
    "router": lambda: (lambda x: {"inputs": {"logits": x}, "saved": {"topk_ids": np.argsort(-x, axis=1, kind="stable")[:, :2]},
                                  "dy": bf(4, 2)})(bf(4, 6)),
    "attention": attention,
    "moe": moe,
    "ssd": ssd,
    "conv1d": lambda: {"inputs": {"x": bf(2, 6, 5)}, "params": {"weight": bf(5, 4), "bias": bf(5)}, "dy": bf(2, 6, 5)},
}
def group(f, path, cls, d, plant=None, grads=None, contract=None):
    g = f.create_group(path)
    g.attrs["class"] = cls
    if contract:
        g.attrs["contract"] = json.dumps(contract)
    for role in ("inputs", "params", "saved"):
        for k, v in d.get(role, {}).items():
            g[role + "/" + k] = v
    g["grad_out/dy"] = d["dy"]
    if plant:
        g[plant] = np.ones(3, np.float32)
    for k, v in (grads or {}).items():
        g["grads/dy/" + k] = v
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    for cls, make in C.items():
        group(f, "ok." + cls, cls, make())
        group(f, "extra_input." + cls, cls, make(), "inputs/D")
        group(f, "extra_param." + cls, cls, make(), "params/extra")
        group(f, "extra_saved." + cls, cls, make(), "saved/extra")
        group(f, "extra_output." + cls, cls, make(), "outputs/final_state")
        group(f, "extra_grad." + cls, cls, make(), grads={"d_extra": np.ones(3, np.float32)})
    # Mamba-2's D skip and z gate (issue 26): D is modelled under d_skip =
    # true, z under z_gate = true (each refused without its key)
    group(f, "mamba2.D", "ssd", ssd({"D": bf(2)}), contract={"d_skip": True})
    group(f, "mamba2.D_off", "ssd", ssd({"D": bf(2)}))
    group(f, "mamba2.D_z", "ssd", ssd({"D": bf(2), "z": bf(1, 5, 2, 3)}), contract={"d_skip": True})
    group(f, "mamba2.z", "ssd", ssd({"z": bf(1, 5, 2, 3)}))
    group(f, "mamba2.D_z_gate", "ssd", ssd({"D": bf(2), "z": bf(1, 5, 2, 3)}), contract={"d_skip": True, "z_gate": True})
    # an rmsnorm bias is a layernorm's, not an rmsnorm's
    d = C["rmsnorm"](); d["params"]["bias"] = bf(8)
    group(f, "rmsnorm_bias", "rmsnorm", d)
    # a candidate d_bias for a linear without a bias
    d = C["linear"](); del d["params"]["bias"]
    group(f, "linear_dbias", "linear", d, grads={"d_bias": np.ones(6, np.float32)})
    # deployed bytes no weight_format can check, and scales without their bytes
    d = C["linear"](); d["saved"] = {"weight_q": np.zeros((6, 8), np.uint8)}
    group(f, "linear_bytes_no_format", "linear", d)
    d = C["linear"](); d["saved"] = {"weight_scale": np.ones((1, 1), np.float32)}
    group(f, "linear_scale_no_bytes", "linear", d)
    # a setting as a group attribute, a role the reader does not know
    group(f, "ssd_attr", "ssd", ssd()); f["ssd_attr"].attrs["ngroups"] = 2
    group(f, "ssd_role", "ssd", ssd()); f["ssd_role/state/h"] = np.ones(3, np.float32)
    # shared experts (DeepSeek-V3, Qwen2-MoE) the contract does not declare
    d = moe(); d["params"]["shared_w1"] = bf(16, 8); d["params"]["shared_w2"] = bf(8, 8)
    group(f, "moe_shared_unused", "moe", d)
    # an initial state the contract does not use
    d = ssd({"initial_state": bf(1, 2, 3, 4)})
    group(f, "ssd_state_unused", "ssd", d)
P
# the class table: each class's gradients, and the classes to plant into
"$QATCHECK" classes --json >"$T/classes.json" || { bad "qatcheck classes --json"; finish; }
tol() { # tolerances for every gradient of class $1, as the class table lists them
  "$PY" - "$T/classes.json" "$1" <<'P'
import json, sys
c = [c for c in json.load(open(sys.argv[1]))["classes"] if c["name"] == sys.argv[2]][0]
print("{%s}" % ",".join('"%s":{"rel_l2":1e-2,"reasoning":"float32 or bf16 production on tiny shapes"}' % g for g in c["grads"]))
P
}
# refused GROUP CANDIDATE NEEDLE DESC: exit 2, one error line naming NEEDLE
# and what the class takes, only the error report
refused() {
  cat >"$T/c.json" <<J
{"data": {"dump": "d.h5", "modules": "^/$(echo "$1" | sed 's/\./\\\\./g')\$"}, "candidate": "$2", "tolerances": $TOL}
J
  rm -f "$T/r.json"
  expect_exit 2 "$4" "$QATCHECK" vjp --case "$T/c.json" --json "$T/r.json"
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] || bad "$1: expected one error line: $(cat "$T/err")"
  grep 'qatcheck: error:' "$T/err" | grep -qF "$3" || bad "$1: the message does not name '$3': $(cat "$T/err")"
  grep 'qatcheck: error:' "$T/err" | grep -q "$5" || bad "$1: the message does not say '$5': $(cat "$T/err")"
  error_or_none "$T/r.json" || bad "$1: a refused run wrote a report other than its error report"
}
for cls in $("$PY" -c 'import json,sys; print(" ".join(c["name"] for c in json.load(open(sys.argv[1]))["classes"]))' "$T/classes.json"); do
  # a class this test has no valid group for (the generator above) is said, not failed
  "$PY" -c 'import h5py,sys; sys.exit(0 if "ok." + sys.argv[2] in h5py.File(sys.argv[1], "r") else 1)' "$T/d.h5" "$cls" ||
    { echo "note $cls: no hand-made group in this test (add one to C above)"; continue; }
  TOL=$(tol $cls)
  cat >"$T/ok.json" <<J
{"data": {"dump": "d.h5", "modules": "^/ok\\\\.$cls\$"}, "candidate": "builtin", "tolerances": $TOL}
J
  expect_exit 0 "$cls: the valid group passes" "$QATCHECK" vjp --case "$T/ok.json" --quiet
  TAKES="not modelled by class '$cls'.*the class takes"
  if [ $cls = ssd ]; then # ssd models inputs/D under d_skip; plant another input
    refused "extra_input.$cls" builtin "'inputs/D'" "$cls: inputs/D is refused (d_skip false)" "the contract's d_skip is false"
  else
    refused "extra_input.$cls" builtin "'inputs/D'" "$cls: inputs/D is refused" "$TAKES"
  fi
  refused "extra_param.$cls" builtin "'params/extra'" "$cls: params/extra is refused" "$TAKES"
  refused "extra_saved.$cls" builtin "'saved/extra'" "$cls: saved/extra is refused" "$TAKES"
  refused "extra_output.$cls" builtin "'outputs/final_state'" "$cls: outputs/final_state is refused" "$TAKES"
  refused "extra_grad.$cls" dump "'grads/dy/d_extra'" "$cls: a candidate grads/dy/d_extra is refused" "not a gradient class '$cls' checks.*it checks"
done
TOL=$(tol ssd)
DTOL=$TOL # d_D and d_z are in the class's gradients
cat >"$T/d.json" <<J
{"data": {"dump": "d.h5", "modules": "^/mamba2\\\\.D\$"}, "candidate": "builtin", "tolerances": $DTOL}
J
expect_exit 0 "ssd with Mamba-2's inputs/D under d_skip = true passes" "$QATCHECK" vjp --case "$T/d.json" --json "$T/d.r.json"
grep -q '"d_D"' "$T/d.r.json" && ok "d_D is checked" || bad "d_D is not in the report"
refused mamba2.D_off builtin "'inputs/D'" "ssd with inputs/D but d_skip false is refused" "the contract's d_skip is false"
refused mamba2.D_z builtin "'inputs/z'" "ssd with inputs/D and inputs/z but z_gate false is refused (z)" "the contract's z_gate is false"
refused mamba2.z builtin "'inputs/z'" "ssd with inputs/z but z_gate false is refused" "the contract's z_gate is false"
ZTOL=$TOL
cat >"$T/z.json" <<J
{"data": {"dump": "d.h5", "modules": "^/mamba2\\\\.D_z_gate\$"}, "candidate": "builtin", "tolerances": $ZTOL}
J
expect_exit 0 "ssd with Mamba-2's inputs/D and inputs/z under d_skip and z_gate passes" "$QATCHECK" vjp --case "$T/z.json" --json "$T/z.r.json"
grep -q '"d_z"' "$T/z.r.json" && ok "d_z is checked" || bad "d_z is not in the report"
TOL=$(tol rmsnorm)
refused rmsnorm_bias builtin "'params/bias'" "rmsnorm with a params/bias is refused" "the class takes inputs/x, params/weight"
TOL=$(tol linear)
refused linear_dbias dump "'grads/dy/d_bias'" "linear candidate d_bias without params/bias is refused" "missing dataset 'params/bias'"
refused linear_bytes_no_format builtin "'saved/weight_q'" "linear deployed bytes without a weight_format are refused" "weight_format is 'none'"
refused linear_scale_no_bytes builtin "'saved/weight_scale'" "linear scales without saved/weight_q are refused" "without 'saved/weight_q'"
TOL=$(tol moe)
refused moe_shared_unused builtin "'params/shared_w1'" "moe with shared experts but shared_experts 0 is refused" "shared_experts is 0"
TOL=$(tol ssd)
refused ssd_attr builtin "attribute 'ngroups'" "ssd with a group attribute ngroups is refused" "is not one qatcheck reads"
refused ssd_role builtin "'state'" "ssd with a subgroup state/ is refused" "is not one of a module group's roles"
refused ssd_state_unused builtin "'inputs/initial_state'" "ssd initial_state under initial_state = false is refused" "contract's initial_state is false"
finish
