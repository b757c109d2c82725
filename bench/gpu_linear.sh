#!/bin/sh
# gpu_linear.sh: the GPU linear-audit benchmark, every figure side by side in
# one run on one device: qatcheck's in-memory audit (bench_gpu_linear) against
# its floor (the two float64 reference GEMMs + the two bf16 candidate GEMMs,
# each timed alone in the same run), against the same audit in PyTorch
# (peer_torch.py), and the metrics kernel against the device copy bandwidth.
# Shapes: prefill M=8192 K=7168 N=4096 and decode M=16; weight fp8_block128.
# Usage: sh bench/gpu_linear.sh [BINDIR] (default build); PY=python3.
# Targets: audit/floor <= 1.15, torch/audit >= 1.4, metrics/copy >= 0.70.
set -u
here=$(cd "$(dirname "$0")" && pwd)
bindir=${1:-build}
PY=${PY:-python3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
get() { awk -v k="$2" '$1 == k {print $2}' "$1"; }
status=0
for shape in "8192 7168 4096 prefill" "16 7168 4096 decode"; do
  set -- $shape
  M=$1; K=$2; N=$3; tag=$4
  if ! "$bindir/bench_gpu_linear" --M "$M" --K "$K" --N "$N" --fmt fp8_block128 >"$out/q_$tag" 2>"$out/qe_$tag"; then
    cat "$out/qe_$tag"; exit 2
  fi
  "$PY" "$here/peer_torch.py" --M "$M" --K "$K" --N "$N" >"$out/t_$tag" 2>"$out/te_$tag" || { cat "$out/te_$tag"; }
  cat "$out/q_$tag" "$out/t_$tag" | sed "s/^/$tag: /"
  a=$(get "$out/q_$tag" audit_ms); f=$(get "$out/q_$tag" floor_ms); p=$(get "$out/t_$tag" peer_ms)
  c=$(get "$out/q_$tag" copy_gbs); m=$(get "$out/q_$tag" metrics_gbs); fm=$(get "$out/q_$tag" floor_mem_ms)
  awk -v tag="$tag" -v a="$a" -v f="$f" -v p="${p:-0}" -v c="$c" -v m="$m" -v fm="$fm" 'BEGIN {
    printf "%s: audit %.3f ms, floor %.3f ms, audit/floor %.3f (target <= 1.15)\n", tag, a, f, a / f;
    printf "%s: with the non-GEMM bytes at copy bandwidth: floor %.3f ms, audit/floor %.3f\n", tag, f + fm, a / (f + fm);
    if (p > 0) printf "%s: peer_torch %.3f ms, torch/audit %.3f (target >= 1.4)\n", tag, p, p / a;
    printf "%s: metrics %.0f GB/s, copy %.0f GB/s, metrics/copy %.3f (target >= 0.70)\n", tag, m, c, m / c }'
done
exit $status
