#!/bin/sh
# gemm_acc.sh: qatdump's cpu_bf16_gemm_acc (scripts/qatdump.py measures how
# the producer's torch sums bf16 GEMMs on its CPU: torch 1.13 without
# AVX-512 adds each product into a bf16 sum), judged on any CPU by planting
# the attribute into the committed linear dump and a hand-written gelu one:
# - "float32", and "bfloat16" on a correct linear: its checks pass (a pass
#   under the float32 model stands);
# - "bfloat16" on a linear whose d_x is 1% off: cannot judge (exit 2, one
#   line naming the module, the check and the attribute; an error report);
#   "float32" on the same: fails (exit 1); "bfloat16" on a d_x twice what
#   it should be, farther off than a bf16 sum can err: fails (exit 1);
# - a value other than float32 or bfloat16, a long one, an integer: refused naming both;
# - --eager beside the 1%-off dump marked mode autocast: refused before the
#   audit (the pair is wrong), not reported as cannot judge;
# - "bfloat16" on a gelu (no GEMM) whose d_x is 0.5% off, within a bf16
#   sum's reach: still fails (exit 1).
. "$(dirname "$0")/lib.inc"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
have_py "$PY" h5py numpy || { echo "skip: h5py or numpy missing"; exit 77; }
TOL=$(sed -n '/"tolerances"/,$p' "$ROOT/cases/linear_dump.json" | sed '$d')
G=/model.layers.0.mlp.down_proj

# plant NAME ACC FACTOR: $T/NAME.h5, the linear dump with the attribute ACC
# ("-": none) and d_x times FACTOR, and its case $T/NAME.json
plant() {
  cp "$ROOT/cases/data/linear_small.h5" "$T/$1.h5"
  $PY - "$T/$1.h5" "$G" "$2" "$3" "$ROOT/scripts" <<'P' || bad "could not plant $1"
import sys, h5py, numpy as np
sys.path.insert(0, sys.argv[5])
import bf16
f = h5py.File(sys.argv[1], "a")
g = f[sys.argv[2]]
if sys.argv[3] != "-":
    g.attrs["cpu_bf16_gemm_acc"] = sys.argv[3]
if float(sys.argv[4]) != 1.0:  # the bf16 values (stored as their bits) scaled, rounded to nearest even
    for dy in g["grads"]:
        d = g["grads/%s/d_x" % dy]
        d[...] = bf16.to_bits(bf16.from_bits(d[...]) * np.float32(sys.argv[4]))
P
  printf '{"module": "linear", "data": {"dump": "%s.h5", "modules": "^/model\\\\."}, "candidate": "dump",\n%s}\n' "$1" "$TOL" >"$T/$1.json"
}
plant f32 float32 1
expect_exit 0 "cpu_bf16_gemm_acc float32, a correct linear: passes" "$QATCHECK" vjp --case "$T/f32.json"
plant b16 bfloat16 1
expect_exit 0 "cpu_bf16_gemm_acc bfloat16, a correct linear: its passes stand" "$QATCHECK" vjp --case "$T/b16.json"
plant f32_bad float32 1.01
expect_exit 1 "cpu_bf16_gemm_acc float32, d_x 1% off: fails" "$QATCHECK" vjp --case "$T/f32_bad.json"
plant b16_bad bfloat16 1.01
expect_exit 2 "cpu_bf16_gemm_acc bfloat16, d_x 1% off: cannot judge" "$QATCHECK" vjp --case "$T/b16_bad.json" --json "$T/b16_bad.r.json"
[ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] &&
  grep -q "module '$G': cannot judge: its dy check d_x failed at rel_l2 0.01[0-9]*, within the 0.0609 a bf16 sum of 64 products can err, and attribute 'cpu_bf16_gemm_acc' is 'bfloat16'" "$T/err" &&
  error_or_none "$T/b16_bad.r.json" && ok "one error line naming the module, d_x and the attribute; an error report" ||
  bad "the refusal: $(cat "$T/err")"
plant b16_gross bfloat16 2
expect_exit 1 "cpu_bf16_gemm_acc bfloat16, d_x doubled (beyond a bf16 sum's reach): fails" "$QATCHECK" vjp --case "$T/b16_gross.json"
# --eager with an autocast dump is refused before any module is audited:
# the refusal, not the module's cannot judge
cp "$T/b16_bad.h5" "$T/ac.h5"
$PY -c "import sys, h5py; h5py.File(sys.argv[1], 'a').attrs['mode'] = 'autocast'" "$T/ac.h5" || bad "could not mark ac.h5"
sed 's/b16_bad.h5/ac.h5/' "$T/b16_bad.json" >"$T/ac.json"
expect_exit 2 "--eager with an autocast dump is refused" "$QATCHECK" vjp --case "$T/ac.json" --eager "$T/f32.h5"
[ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep -q "ac.h5' is written in mode autocast" "$T/err" &&
  ok "the refusal comes before the audit: one line, the mode named" || bad "--eager refusal: $(cat "$T/err")"
plant num - 1
$PY -c "import sys, h5py; h5py.File(sys.argv[1], 'a')[sys.argv[2]].attrs['cpu_bf16_gemm_acc'] = 16" "$T/num.h5" "$G" ||
  bad "could not plant an integer attribute"
expect_exit 2 "an integer cpu_bf16_gemm_acc is refused" "$QATCHECK" vjp --case "$T/num.json"
grep -q "attribute 'cpu_bf16_gemm_acc' is not a string: expected \"float32\" or \"bfloat16\"" "$T/err" &&
  ok "the refusal names the string values expected" || bad "the refusal: $(cat "$T/err")"
plant odd bf16 1
expect_exit 2 "cpu_bf16_gemm_acc 'bf16' is refused" "$QATCHECK" vjp --case "$T/odd.json"
grep -q "attribute 'cpu_bf16_gemm_acc' is 'bf16': expected float32 or bfloat16" "$T/err" &&
  ok "the refusal names the values expected" || bad "the refusal: $(cat "$T/err")"

plant long bfloat16_measured_on_an_amd_epyc_without_avx512 1
expect_exit 2 "a cpu_bf16_gemm_acc value longer than any expected one is refused" "$QATCHECK" vjp --case "$T/long.json"
grep -q "attribute 'cpu_bf16_gemm_acc' is 'bfloat16_measured_on_an_amd_e[a-z_]*': expected float32 or bfloat16" "$T/err" &&
  ok "the refusal names the value (cut) and the values expected" || bad "the refusal: $(cat "$T/err")"

# a gelu, no GEMM: judged whatever the attribute says
$PY - "$T/gelu.h5" <<'P' || bad "could not write the gelu dump"
import math, sys, h5py, numpy as np
rng = np.random.default_rng(3)
x = rng.standard_normal((64, 96)) * 2
dy = rng.standard_normal((64, 96))
erf = np.vectorize(math.erf)
y = 0.5 * x * (1 + erf(x / math.sqrt(2)))
d = 0.5 * (1 + erf(x / math.sqrt(2))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = np.int64(1)
    g = f.create_group("act")
    g.attrs["class"] = "gelu"
    g.attrs["cpu_bf16_gemm_acc"] = "bfloat16"
    g["inputs/x"] = x.astype(np.float32)
    g["outputs/y"] = y.astype(np.float32)
    g["grad_out/dy"] = dy.astype(np.float32)
    g["grads/dy/d_x"] = (1.005 * dy * d).astype(np.float32)
P
printf '{"data": {"dump": "%s/gelu.h5"}, "candidate": "dump", "tolerances": {"d_x": {"derive": true}}}\n' "$T" >"$T/gelu.json"
expect_exit 1 "cpu_bf16_gemm_acc bfloat16 on a gelu (no GEMM), d_x 0.5% off: fails" "$QATCHECK" vjp --case "$T/gelu.json"
finish
