#!/bin/sh
# bench/cpu_linear.sh: `qatcheck vjp` on a generated 2048 x 2048 x 2048
# linear (one random dY) against the bare BLAS calls it needs (2 DGEMM + 2
# SGEMM of the same shapes), side by side in one run, best of R each.
# Target: ratio <= 1.2. Peak memory (max RSS) against the tensors an audit
# must hold; target <= 1.5.
#   usage: bench/cpu_linear.sh [--check] [M K N] [REPEATS]
# --check: the in-memory audit's ratio to its BLAS floor and the command's
# peak memory against what it must hold, compared with bench/baseline.json
# ("cpu_linear": ratios, not times, lower is better, with a noise allowance
# wide enough for a shared 2-core CI machine); exit 1 on a regression,
# naming it. QC_BENCH_PLANT=F makes the measured audit time F longer (the
# guard's own test: F=0.5 must fail).
set -eu
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
M=${1:-2048}; K=${2:-2048}; N=${3:-2048}; R=${4:-3}
mkdir -p build/bench
make -s bench-bin
# 1. the in-memory audit (what vjp runs per module and dY) vs the BLAS calls
line=$(build/bench/cpu_linear "$M" "$K" "$N" "$R")
echo "$line"
ratio=$(printf '%s\n' "$line" | sed -n 's/.*ratio \([0-9.]*\).*/\1/p')
ratio=$(awk -v r="$ratio" -v p="${QC_BENCH_PLANT:-0}" 'BEGIN { printf "%.4f", r * (1 + p) }')
# 2. the whole command (generation, audit, report), and its peak memory
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
cat >"$T/case.json" <<J
{"module": "linear", "data": {"generate": {"shapes": [[$M, $K, $N, 0]], "seed": 0}}, "dy": ["random"],
 "tolerances": {"d_x": {"rel_l2": 4e-3, "reasoning": "bench"}, "d_weight": {"rel_l2": 4e-3, "reasoning": "bench"}}}
J
# interleaved, so that load on the machine hits both sides alike
floor=1e30; best=1e30; rss=0
for i in $(seq "$R"); do
  f=$(build/bench/cpu_linear "$M" "$K" "$N" 1 floor)
  floor=$(awk -v a="$floor" -v b="$f" 'BEGIN{print (b < a) ? b : a}')
  /usr/bin/time -f "%e %M" -o "$T/time" ./qatcheck vjp --case "$T/case.json" --quiet
  set -- $(cat "$T/time")
  best=$(awk -v a="$best" -v b="$1" 'BEGIN{print (b < a) ? b : a}')
  rss=$2
done
# what an audit must hold: X, W, dY in bf16; the float64 operands of the
# reference GEMMs (X, W, dY); the candidate's bf16 gradients and the
# reference's float64 gradients (d_x, d_weight)
must=$(awk -v M="$M" -v K="$K" -v N="$N" 'BEGIN{e1=M*K; e2=N*K; e3=M*N; print (2*(e1+e2+e3) + 8*(e1+e2+e3) + 2*(e1+e2) + 8*(e1+e2))/1024}')
awk -v a="$best" -v f="$floor" -v r="$rss" -v m="$must" -v M="$M" -v K="$K" -v N="$N" 'BEGIN{
  printf "qatcheck vjp %dx%dx%d end to end: %.3f s, BLAS floor %.3f s, ratio %.2f\n", M, K, N, a, f, a/f;
  printf "peak RSS %.0f MiB, tensors it must hold %.0f MiB, ratio %.2f (target <= 1.5)\n", r/1024, m/1024, r/m }'
rss_ratio=$(awk -v r="$rss" -v m="$must" 'BEGIN { printf "%.4f", r / m }')
echo "ratios: audit_floor $ratio rss_must $rss_ratio"
[ $check = 1 ] || exit 0
/usr/bin/python3 - bench/baseline.json "$ratio" "$rss_ratio" <<'P'
import json, sys
base = json.load(open(sys.argv[1]))["cpu_linear"]
got = {"audit_floor": float(sys.argv[2]), "rss_must": float(sys.argv[3])}
bad = 0
for key, b in sorted(base["ratios"].items()):
    v, ref = got[key], b["value"]
    worse = v > ref * (1 + base["noise"])
    print(f"check: {key} {v:.4f} against baseline {ref:.4f} (lower is better, noise {base['noise']:.0%}): "
          + ("REGRESSION" if worse else "ok"))
    bad += worse
sys.exit(1 if bad else 0)
P
