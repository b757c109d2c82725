#!/bin/sh
# bench/gpu_classes.sh: the references that run on the device besides the
# GEMM classes' (rmsnorm and layernorm: reference/norm_dev.c; swiglu and
# gelu: reference/pointwise_dev.c; logprob: reference/logprob_dev.c; rope:
# reference/rope_dev.c; conv1d: reference/conv1d_dev.c), at a real model's
# size (4,096 tokens; hidden 7168, DeepSeek-V3's; intermediate 14336,
# Llama 3 8B's; logprob 2 x 1,024 positions of DeepSeek-V3's vocab of
# 129,280; rope DeepSeek-V3's query rope, 128 heads of 64 interleaved
# dims; conv1d 2 x 4,096 steps of 8,448 channels, 4 taps),
# timed side by side in one run against the same audit with those
# references on the host (QC_CUDA_NORM_HOST=1 QC_CUDA_PW_HOST=1
# QC_CUDA_LP_HOST=1 QC_CUDA_ROPE_HOST=1 QC_CUDA_CONV_HOST=1: the host loops
# on every core), runs alternating,
# best of R each. Per class: the
# reference's seconds both ways (`vjp --verbose`'s "reference" lines of
# its random dY, after a first dY of ones that warms the device's
# buffers up, as the modules before it do in a model's audit) and host /
# device; the two runs' exit codes must agree (the
# tolerances here are a timing case's, wide: the verdict is compared
# between the paths, not judged).
#   usage: bench/gpu_classes.sh [--check] [QATCHECK] [REPEATS]
# CLASSES (default "rmsnorm layernorm swiglu gelu logprob rope conv1d")
# picks some.
# --check: every class's host / device ratio against bench/baseline.json
# ("gpu_classes", higher is better, with its noise allowance); exit 1 on
# a regression, naming it; exit 2 for a class with no baseline yet (its
# first measurement goes into the file). Exit 77 without a CUDA device.
set -eu
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
Q=${1:-${QATCHECK:-./qatcheck}}; R=${2:-2}
PY=${PY:-/usr/bin/python3}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
case_of() { # CLASS CONTRACT SHAPE TENSORS: a generated case, one random dY
  tol=""; for t in $4; do tol="$tol${tol:+, }\"$t\": {\"rel_l2\": 1e-4, \"reasoning\": \"a timing case\"}"; done
  printf '{"name": "%s_real", "module": "%s", "contract": %s, "data": {"generate": {"shapes": [%s], "seed": 1}},\n "candidate": "builtin", "dy": ["ones", "random"], "tolerances": {%s}}\n' \
    "$1" "$1" "$2" "$3" "$tol" >"$T/$1.json"
}
case_of rmsnorm '{"eps": 1e-6}' '[4096, 7168]' "d_x d_weight"
case_of layernorm '{}' '[4096, 7168]' "d_x d_weight d_bias"
case_of swiglu '{}' '[4096, 14336]' "d_gate d_up"
case_of gelu '{"approximate": "tanh"}' '[4096, 14336]' "d_x"
case_of logprob '{}' '[2, 1024, 129280]' "d_logits"
case_of rope '{"layout": "interleaved"}' '[4096, 128, 64]' "d_x"
case_of conv1d '{}' '[2, 4096, 8448, 4]' "d_x d_weight d_bias"
"$Q" vjp --case "$T/gelu.json" --device cuda --quiet >/dev/null 2>"$T/probe" || true
if grep -qE "no CUDA device|built without CUDA|no CUDA backend|cannot load the CUDA backend" "$T/probe"; then echo "skip: $(head -1 "$T/probe")"; exit 77; fi
ref_s() { # LOG: the reference seconds of the random dY (the second: "ones" before it warms the device's buffers up)
  sed -n 's/.* dy=random: reference \([0-9.]*\) s, candidate.*/\1/p' "$1" | tail -1
}
: >"$T/rows"
for c in ${CLASSES:-rmsnorm layernorm swiglu gelu logprob rope conv1d}; do
  dev=1e30; host=1e30; rd=; rh=
  for i in $(seq "$R"); do
    set +e
    "$Q" vjp --case "$T/$c.json" --device cuda --verbose >/dev/null 2>"$T/d.log"; rd=$?
    env QC_CUDA_NORM_HOST=1 QC_CUDA_PW_HOST=1 QC_CUDA_LP_HOST=1 QC_CUDA_ROPE_HOST=1 QC_CUDA_CONV_HOST=1 "$Q" vjp --case "$T/$c.json" --device cuda --verbose >/dev/null 2>"$T/h.log"; rh=$?
    set -e
    [ "$rd" = "$rh" ] || { echo "gpu_classes: $c: exit $rd with the device's reference, $rh with the host's" >&2; exit 1; }
    [ "$rd" -le 1 ] || { echo "gpu_classes: $c: exit $rd: $(grep -m1 error "$T/d.log")" >&2; exit 1; }
    dev=$(awk -v a="$dev" -v b="$(ref_s "$T/d.log")" 'BEGIN{print (b < a) ? b : a}')
    host=$(awk -v a="$host" -v b="$(ref_s "$T/h.log")" 'BEGIN{print (b < a) ? b : a}')
  done
  r=$(awk -v h="$host" -v d="$dev" -v p="${QC_BENCH_PLANT:-0}" 'BEGIN { printf "%.4f", (d > 0) ? h / (d * (1 + p)) : 0 }')
  printf '%s reference: device %.3f s, host %.3f s, host / device %.2f (exit %s both)\n' "$c" "$dev" "$host" "$r" "$rd"
  echo "$c $r" >>"$T/rows"
done
[ $check = 1 ] || exit 0
"$PY" - "$T/rows" bench/baseline.json <<'PYEOF'
import json, sys
base = json.load(open(sys.argv[2]))["gpu_classes"]
bad, unjudged = 0, 0
for line in open(sys.argv[1]):
    c, r = line.split(); r = float(r)
    if c + ".host_device" not in base["ratios"]:  # measured, never guarded: cannot judge
        print(f"check: {c}.host_device {r:.4f}: no baseline in bench/baseline.json (gpu_classes.ratios): record this run's value")
        unjudged = 2
        continue
    ref = base["ratios"][c + ".host_device"]["value"]
    ok = r >= ref * (1 - base["noise"])
    print(f"check: {c}.host_device {r:.4f} against baseline {ref:.4f} (higher is better, noise {base['noise']:.0%}): {'ok' if ok else 'REGRESSION'}")
    bad |= not ok
sys.exit(1 if bad else unjudged)  # a regression found outranks a class not yet guarded
PYEOF
