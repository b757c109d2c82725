#!/bin/sh
# gpu_linear.sh: the GPU linear-audit benchmark, every figure side by side in
# one run on one device: qatcheck's in-memory audit (bench_gpu_linear) against
# its floor (the two float64 reference GEMMs + the two bf16 candidate GEMMs,
# each timed alone in the same run), against the same audit in PyTorch
# (peer_torch.py), and the metrics kernel against the device copy bandwidth.
# Shapes: prefill M=8192 K=7168 N=4096 and decode M=16; weight fp8_block128.
#
# Usage: sh bench/gpu_linear.sh [--check] [--no-peer] [--reference fast|auto] [BINDIR]
# (default build); PY=python3.
# Targets: prefill audit/floor <= 1.05 and torch/audit >= 1.55; decode
# audit/memfloor (the floor with the non-GEMM bytes at copy bandwidth) <= 1.3
# and torch/audit >= 5; metrics/copy >= 0.70.
#
# --check: every ratio against bench/baseline.json ("gpu_linear": ratios,
# not times, each with the side that is better); a ratio worse than its
# baseline by more than the file's noise allowance is a regression: exit 1,
# naming it. QC_BENCH_PLANT=F makes each timed audit call F longer (the
# guard's own test: F=0.10 must fail). --no-peer leaves PyTorch out (its
# ratios are then not checked).
#
# --reference fast: also the fast reference (vjp --reference fast: the Ozaki
# scheme on int8 tensor cores, docs/gpu.md) for 3 and 4 slices on both
# shapes: its time against the two DGEMMs, the whole audit with it, its
# error against DGEMM (max and normwise, absolute and relative to the noise
# floor), its self-check, the metrics' difference between the two audits
# (bench_gpu_linear --ref-fast; its lines are prefixed refS_). It also
# times the audit under --reference auto (vjp's default: per GEMM, the fast
# reference where this device's probed rates predict it 10% faster, else
# DGEMM) against the float64 audit, naming what auto ran for d_x and
# d_weight and the slice products its plan ran (refauto_ lines), and adds
# one ratio to the float64 audit's: prefill.auto_floor, the auto audit over
# the float64 floor (issue 41's target: <= 0.8). --reference auto is the
# same run.
set -u
here=$(cd "$(dirname "$0")" && pwd)
check=0; peer=1; bindir=build; reffast=; want_ref=0
for a in "$@"; do
  if [ $want_ref = 1 ]; then
    want_ref=0
    case $a in fast|auto) reffast=--ref-fast ;; float64) reffast= ;; *) echo "gpu_linear.sh: --reference fast|auto|float64, not '$a'" >&2; exit 2 ;; esac
    continue
  fi
  case $a in
    --check) check=1 ;;
    --no-peer) peer=0 ;;
    --reference) want_ref=1 ;;
    --reference=fast|--reference=auto) reffast=--ref-fast ;;
    --reference=float64) reffast= ;;
    -*) echo "gpu_linear.sh: unknown option '$a'" >&2; exit 2 ;;
    *) bindir=$a ;;
  esac
done
PY=${PY:-python3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
get() { awk -v k="$2" '$1 == k {print $2}' "$1"; }
: >"$out/ratios"
for shape in "8192 7168 4096 prefill" "16 7168 4096 decode"; do
  set -- $shape
  M=$1; K=$2; N=$3; tag=$4
  if ! "$bindir/bench_gpu_linear" --M "$M" --K "$K" --N "$N" --fmt fp8_block128 --plant-slowdown "${QC_BENCH_PLANT:-0}" $reffast \
      >"$out/q_$tag" 2>"$out/qe_$tag"; then
    cat "$out/qe_$tag"; exit 2
  fi
  : >"$out/t_$tag"
  if [ $peer = 1 ]; then
    "$PY" "$here/peer_torch.py" --M "$M" --K "$K" --N "$N" >"$out/t_$tag" 2>"$out/te_$tag" || cat "$out/te_$tag"
  fi
  cat "$out/q_$tag" "$out/t_$tag" | sed "s/^/$tag: /"
  a=$(get "$out/q_$tag" audit_ms); f=$(get "$out/q_$tag" floor_ms); p=$(get "$out/t_$tag" peer_ms)
  c=$(get "$out/q_$tag" copy_gbs); m=$(get "$out/q_$tag" metrics_gbs); fm=$(get "$out/q_$tag" floor_mem_ms)
  awk -v tag="$tag" -v a="$a" -v f="$f" -v p="${p:-0}" -v c="$c" -v m="$m" -v fm="$fm" -v R="$out/ratios" 'BEGIN {
    printf "%s: audit %.3f ms, floor %.3f ms, audit/floor %.3f\n", tag, a, f, a / f;
    printf "%s: with the non-GEMM bytes at copy bandwidth: floor %.3f ms, audit/memfloor %.3f\n", tag, f + fm, a / (f + fm);
    if (p > 0) printf "%s: peer_torch %.3f ms, torch/audit %.3f\n", tag, p, p / a;
    printf "%s: metrics %.0f GB/s, copy %.0f GB/s, metrics/copy %.3f\n", tag, m, c, m / c;
    printf "%s.audit_floor %.4f\n%s.audit_memfloor %.4f\n%s.metrics_copy %.4f\n", tag, a / f, tag, a / (f + fm), tag, m / c >> R;
    if (p > 0) printf "%s.torch_audit %.4f\n", tag, p / a >> R }'
  if [ -n "$reffast" ]; then
    for S in 3 4; do
      awk -v tag="$tag" -v S="$S" -v a="$a" '{v[$1] = $2; w[$1] = $3} END {
        p = "ref" S "_";
        printf "%s: fast reference S=%d: %.3f ms (+ self-check %.3f ms) against DGEMM %.3f ms: %.2fx; audit %.3f ms against %.3f ms (fast kept: d_x %s, d_weight %s)\n",
          tag, S, v[p "fast2_ms"], v[p "check2_ms"], v[p "dgemm2_ms"], v[p "speedup"], v[p "audit_ms"], a, v[p "kept"], w[p "kept"];
        printf "%s: S=%d in the audit: the plan ran d_x %d, d_weight %d of the %d pairs\n", tag, S, v[p "pairs"], w[p "pairs"], S * (S + 1) / 2;
        for (i = 0; i < 2; i++) { g = i ? "dw" : "dx";
          printf "%s: S=%d %s: error against DGEMM: max %.3g (%.3g of noise floor x rms), rel_l2 %.3g (%.3g of the noise floor); self-check %.3g / norm %.3g, gate %.3g; rel_l2 fast - float64 %.3g\n",
            tag, S, g, v[p g "_err_max_abs"], v[p g "_err_max_of_nf_rms"], v[p g "_err_rel_l2"], v[p g "_err_rel_l2_of_nf"],
            v[p g "_check_err"], v[p g "_check_err_norm"], v[p g "_check_gate"], v[p g "_rel_l2_diff"] } }' "$out/q_$tag"
    done
    awk -v tag="$tag" -v a="$a" -v R="$out/ratios" '{v[$1] = $2; w[$1] = $3} END {
      if (tag == "prefill") printf "%s.auto_floor %.4f\n", tag, v["refauto_audit_ms"] / v["floor_ms"] >> R;
      dx = v["refauto_ran"] ? sprintf("fast S=%d%s", v["refauto_ran"], v["refauto_kept"] ? "" : " (fell back)") : "float64";
      dw = w["refauto_ran"] ? sprintf("fast S=%d%s", w["refauto_ran"], w["refauto_kept"] ? "" : " (fell back)") : "float64";
      if (v["refauto_ran"]) dx = dx sprintf(", %d pairs", v["refauto_pairs"]);
      if (w["refauto_ran"]) dw = dw sprintf(", %d pairs", w["refauto_pairs"]);
      printf "%s: reference auto: audit %.3f ms against float64 %.3f ms: %.2fx; auto / float64 floor %.3f (d_x %s, d_weight %s; rel_l2 auto - float64 %.3g %.3g)\n",
        tag, v["refauto_audit_ms"], a, a / v["refauto_audit_ms"], v["refauto_audit_ms"] / v["floor_ms"], dx, dw, v["refauto_dx_rel_l2_diff"], v["refauto_dw_rel_l2_diff"] }' "$out/q_$tag"
  fi
done
echo "ratios:"; sed 's/^/  /' "$out/ratios"
[ $check = 1 ] || exit 0
"$PY" - "$here/baseline.json" "$out/ratios" <<'P'
import json, sys
base = json.load(open(sys.argv[1]))["gpu_linear"]
noise = base["noise"]
got = dict(l.split() for l in open(sys.argv[2]) if l.strip())
bad = 0
for key, b in sorted(base["ratios"].items()):
    if key not in got:
        print(f"check: {key}: not measured in this run (baseline {b['value']})")
        continue
    v, ref, better = float(got[key]), b["value"], b["better"]
    worse = v > ref * (1 + noise) if better == "lower" else v < ref * (1 - noise)
    print(f"check: {key} {v:.4f} against baseline {ref:.4f} ({better} is better, noise {noise:.0%}): "
          + ("REGRESSION" if worse else "ok"))
    bad += worse
sys.exit(1 if bad else 0)
P
