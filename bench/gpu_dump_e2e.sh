#!/bin/sh
# gpu_dump_e2e.sh: end-to-end time of `qatcheck vjp` from an HDF5 dump on
# local disk (one prefill-sized bias-less linear, M=8192 K=7168 N=4096, its
# candidate gradients from PyTorch), on --device cuda and on --device cpu, in
# one run. Prints "key value" lines. Usage: sh bench/gpu_dump_e2e.sh
# [QATCHECK]; PY=python3 (needs torch with a GPU and h5py).
set -u
here=$(cd "$(dirname "$0")" && pwd)
Q=${1:-./qatcheck}
PY=${PY:-python3}
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
t0=$(date +%s.%N)
"$PY" "$here/make_big_dump.py" "$d/big.h5" || exit 2
t1=$(date +%s.%N)
cat >"$d/case.json" <<EOC
{"name": "big_dump", "module": "linear", "data": {"dump": "big.h5", "modules": "^/model\\\\."}, "candidate": "dump",
 "tolerances": {
  "d_x": {"rel_l2": 4e-3, "cosine_min": 0.99999, "norm_ratio": [0.999, 1.001], "noise_multiple": 1.25, "reasoning": "bf16 output rounding"},
  "d_weight": {"rel_l2": 4e-3, "cosine_min": 0.99999, "norm_ratio": [0.999, 1.001], "noise_multiple": 1.25, "reasoning": "bf16 output rounding"}}}
EOC
echo "dump_bytes $(stat -c %s "$d/big.h5")"
echo "dump_write_s $(awk -v a="$t0" -v b="$t1" "BEGIN {printf \"%.3f\", b - a}")"
for dev in cuda cpu; do
  t0=$(date +%s.%N)
  "$Q" vjp --case "$d/case.json" --device $dev --verbose >"$d/out_$dev" 2>&1; rc=$?
  t1=$(date +%s.%N)
  sed "s/^/$dev: /" "$d/out_$dev" | tail -8
  echo "e2e_${dev}_exit $rc"
  echo "e2e_${dev}_s $(awk -v a="$t0" -v b="$t1" "BEGIN {printf \"%.3f\", b - a}")"
done
