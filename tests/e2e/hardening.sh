#!/bin/sh
# Regressions from an adversarial review: wrong gradients that once passed,
# inputs that once crashed, and contract slips of exit codes and messages.
. "$(dirname "$0")/lib.inc"
$PY scripts/make_linear_dump.py "$T/ok.h5" || exit 1
case_for() { # case_for NAME DUMP [extra json members]
  printf '{"module": "linear", "data": {"dump": "%s", "modules": "^/model"}, "candidate": "dump", %s %s}\n' "$2" "${3:-}" "$LIN_TOL" >"$T/$1.json"
}
$PY - "$T" <<'P'
import sys, shutil, h5py, numpy as np
T = sys.argv[1]
M = "/model.layers.0.mlp.down_proj"
def copy(name):
    shutil.copy(f"{T}/ok.h5", f"{T}/{name}.h5")
    return h5py.File(f"{T}/{name}.h5", "a")
with copy("zero_dx") as f:                      # an all-zero candidate
    d = f[M + "/grads/dy/d_x"]; d[...] = 0
with copy("nan_dy") as f:                       # a NaN in the upstream gradient
    d = f[M + "/grad_out/dy"]; a = d[...]; a[3, 5] = 0x7fc0; d[...] = a
with copy("be16") as f:                         # big-endian float16 candidate
    g = f[M + "/grads/dy"]; v = g["d_x"][...]
    x = (v.astype(np.uint32) << 16).view(np.float32).astype(">f2"); del g["d_x"]; g.create_dataset("d_x", data=x)
with copy("fp4_weight") as f:                   # packed fp4 where a float operand belongs
    g = f[M + "/params"]; del g["weight"]
    d = g.create_dataset("weight", data=np.zeros((64, 64), np.uint8)); d.attrs["dtype"] = "float4_e2m1fn_x2"
with copy("array_attr") as f:                   # an attribute that is an array
    f[M].attrs.create("class", np.array([b"linear"] * 64, dtype="S6"))
with copy("array_root") as f:
    f.attrs["qatcheck_dump"] = np.ones(64, dtype=np.int64)
with copy("frozen_space") as f:                 # a frozen parameter whose name hides d_x
    g = f[M]; del g["grads/dy/d_x"]; del g["grads/dy_sparse/d_x"]
    d = g["params"].create_dataset("scale d_x", data=np.ones(4, np.float32)); d.attrs["frozen"] = "1"
with copy("newline_class") as f:
    f[M].attrs["class"] = "linear\nqatcheck: vjp: pass"
shutil.copy(f"{T}/ok.h5", f"{T}/linked.h5")
with h5py.File(f"{T}/linked.h5", "a") as f:
    f["model.ext"] = h5py.ExternalLink("zero_dx.h5", M)
P
case_for zero_dx zero_dx.h5
expect_exit 1 "an all-zero d_x fails (cosine undefined is not a pass)" "$QATCHECK" vjp --case "$T/zero_dx.json"
printf '{"module": "linear", "data": {"dump": "zero_dx.h5", "modules": "^/model"}, "candidate": "dump", "dy": ["dy"], "tolerances": {"d_x": {"cosine_min": 0.9999, "reasoning": "r"}, "d_weight": {"cosine_min": 0.9999, "reasoning": "r"}, "d_bias": {"cosine_min": 0.9999, "reasoning": "r"}}}\n' >"$T/zero_cos.json"
expect_exit 2 "a cosine-only bound is refused: it cannot see a scale error" "$QATCHECK" vjp --case "$T/zero_cos.json"
expect_exit 1 "an all-zero d_x fails a cosine-only bound" "$QATCHECK" vjp --case "$T/zero_cos.json" --allow-weak-tolerances
case_for nan_dy nan_dy.h5
expect_exit 2 "a NaN in dY cannot be judged" "$QATCHECK" vjp --case "$T/nan_dy.json"
grep -q "non-finite" "$T/err" && ok "names the non-finite reference" || bad "message"
case_for be16 be16.h5
expect_exit 2 "big-endian float16 is refused, not misread" "$QATCHECK" vjp --case "$T/be16.json"
case_for fp4 fp4_weight.h5
expect_exit 2 "packed fp4 weight as an operand is refused" "$QATCHECK" vjp --case "$T/fp4.json"
expect_exit 2 "quant: packed fp4 weight is refused" "$QATCHECK" quant --dump "$T/fp4_weight.h5" --module /model.layers.0.mlp.down_proj --format fp8_channel
case_for array_attr array_attr.h5
expect_exit 2 "an array 'class' attribute is not a module" "$QATCHECK" vjp --case "$T/array_attr.json"
case_for array_root array_root.h5
expect_exit 2 "an array root attribute is refused" "$QATCHECK" vjp --case "$T/array_root.json"
case_for frozen_space frozen_space.h5
# (it cannot hide d_x: a parameter linear does not model is refused, frozen or not)
expect_exit 2 "a frozen parameter named 'scale d_x' does not hide d_x" "$QATCHECK" vjp --case "$T/frozen_space.json"
grep -q "dataset 'params/scale d_x' is not modelled by class 'linear'" "$T/err" && ok "names the parameter" || bad "frozen 'scale d_x': $(cat "$T/err")"
case_for newline newline_class.h5
expect_exit 2 "a class name with a newline" "$QATCHECK" vjp --case "$T/newline.json"
[ "$(grep -c '' "$T/err")" -le 2 ] && ! grep -q '^qatcheck: vjp' "$T/err" && ok "error stays one line" || bad "error split over lines"
printf '{"data": {"dump": "linked.h5"}, "candidate": "dump", %s}\n' "$LIN_TOL" >"$T/linked.json"
expect_exit 2 "an external link is refused, not skipped" "$QATCHECK" vjp --case "$T/linked.json"
printf '{"module": "linear", "data": {"dump": "ok.h5", "modules": "^/model"}, "candidate": "dump", "tolerances": {"d_x": {"rel_l2": 1, "reasoning": "r"}, "d_x": {"rel_l2": 1e-9, "reasoning": "r"}}}\n' >"$T/dup.json"
expect_exit 2 "a duplicate tolerance key is refused" "$QATCHECK" vjp --case "$T/dup.json"
long=$(printf 'x%.0s' $(seq 1100))
printf '{"module": "linear", "data": {"dump": "%s.h5"}, "candidate": "dump", %s}\n' "$long" "$LIN_TOL" >"$T/long.json"
expect_exit 2 "a path too long is refused, not truncated" "$QATCHECK" vjp --case "$T/long.json"
case_for okc ok.h5
rm -f "$T/r.json"
expect_exit 2 "an unwritable JUnit path" "$QATCHECK" vjp --case "$T/okc.json" --json "$T/r.json" --junit /nonexistent/d/r.xml
error_or_none "$T/r.json" && ok "only the error report at the JSON path on exit 2" || bad "a JSON report other than the error report was left"
printf '{"module": "rmsnorm", "contract": {"eps": -1}, "data": {"generate": {"shapes": [[4, 8]]}}, "tolerances": {"d_x": {"rel_l2": 1e-5, "reasoning": "r"}, "d_weight": {"rel_l2": 1e-5, "reasoning": "r"}}}\n' >"$T/eps.json"
expect_exit 2 "a negative eps is refused" "$QATCHECK" vjp --case "$T/eps.json"
finish
