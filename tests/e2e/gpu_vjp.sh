#!/bin/sh
# gpu_vjp.sh: `qatcheck vjp` on --device cuda against --device cpu: every
# case in cases/ plus bias-less generated cases (the fused device audit),
# the same checks with the same verdicts and metrics close; an out-of-range
# device index exits 2. Skips (77) without a CUDA device.
. "$(dirname "$0")/lib.inc"
"$QATCHECK" vjp --case cases/linear_bf16.json --device cuda --quiet >/dev/null 2>"$T/probe"
if grep -qE "no CUDA device|built without CUDA|no CUDA backend|cannot load the CUDA backend" "$T/probe"; then echo "skip: $(head -1 "$T/probe")"; exit 77; fi
expect_exit 2 "out-of-range device index" "$QATCHECK" vjp --case cases/linear_bf16.json --device cuda:99
grep -q "out of range" "$T/err" && ok "says out of range" || bad "no 'out of range' line: $(cat "$T/err")"
for fmt in none fp8_block128 mxfp8 nvfp4; do
  cat >"$T/nobias_$fmt.json" <<EOF
{"name": "nobias_$fmt", "module": "linear",
 "contract": {"weight_format": "$fmt", "dx_weight": "dequant"},
 "data": {"generate": {"shapes": [[64, 256, 128, 0], [1, 512, 256, 0], [300, 384, 257, 0]], "seed": 3}},
 "candidate": "builtin", "dy": ["random", "zero", "sparse"],
 $LIN_TOL}
EOF
done
# the runs, GPU_VJP_JOBS cases at once (default 4: the CPU side's host
# references are single-threaded), then the comparisons in order
runcase() { # CASE NAME: both devices' reports, errors and exit codes
  "$QATCHECK" vjp --case "$1" --device cpu --json "$T/cpu_$2.json" --quiet >/dev/null 2>"$T/cpu_err_$2"; echo $? >"$T/cpu_rc_$2"
  "$QATCHECK" vjp --case "$1" --device cuda --json "$T/gpu_$2.json" --quiet >/dev/null 2>"$T/gpu_err_$2"; echo $? >"$T/gpu_rc_$2"
}
jobs_n=0
for c in cases/*.json "$T"/nobias_*.json; do
  runcase "$c" "$(basename "$c" .json)" &
  jobs_n=$((jobs_n + 1))
  [ $jobs_n -lt "${GPU_VJP_JOBS:-4}" ] || { wait; jobs_n=0; }
done
wait
for c in cases/*.json "$T"/nobias_*.json; do
  n=$(basename "$c" .json)
  r1=$(cat "$T/cpu_rc_$n"); r2=$(cat "$T/gpu_rc_$n")
  cp "$T/cpu_err_$n" "$T/cpu_err"; cp "$T/gpu_err_$n" "$T/gpu_err"
  if [ $r1 -eq 2 ] && grep -q "not implemented" "$T/cpu_err"; then echo "skip $n: $(head -1 "$T/cpu_err")"; continue; fi
  if [ $r1 -ne $r2 ]; then bad "$n: cpu exit $r1, cuda exit $r2 ($(head -1 "$T/gpu_err"))"; continue; fi
  if [ $r1 -eq 2 ]; then
    if cmp -s "$T/cpu_err" "$T/gpu_err"; then ok "$n: exit 2 on both, same message"; else bad "$n: exit 2 with different messages"; fi
    continue
  fi
  if "$PY" - "$T/cpu_$n.json" "$T/gpu_$n.json" <<'EOF'
import json, sys
a, b = (json.load(open(p))["checks"] for p in sys.argv[1:3])
key = lambda c: (c["module"], c["dy"], c["tensor"])
assert [key(c) for c in a] == [key(c) for c in b], "different checks"
for c, g in zip(a, b):
    assert c["verdict"] == g["verdict"], f"{key(c)}: cpu {c['verdict']} cuda {g['verdict']}"
    if c.get("reference_variant") != g.get("reference_variant"):
        # a z at the variants' retry threshold: each backend judged against a
        # legal reference, not the same one; the verdict must agree (above)
        print(f"{key(c)}: cpu judged against {c.get('reference_variant', 'the reference')}, cuda against "
              f"{g.get('reference_variant', 'the reference')}; same verdict")
        continue
    # 5% of rel_l2, or 1% of the rel_l2 tolerance the verdict is judged
    # against: a float32 candidate far below its tolerance (a MoE's d_w2 at
    # rel_l2 ~1e-6 against 5.5e-3) differs between the backends by its
    # float32 accumulation order alone
    x, y = c["metrics"]["rel_l2"], g["metrics"]["rel_l2"]
    tol = (c.get("tolerance") or {}).get("rel_l2") or 0.0
    assert abs(x - y) <= max(0.05 * abs(x), 0.01 * tol) + 1e-12, f"{key(c)}: rel_l2 cpu {x} cuda {y} (tolerance {tol})"
print(f"{len(a)} checks agree")
EOF
  then ok "$n: exit $r1 on both, same verdicts"; else bad "$n: cpu and cuda disagree"; fi
done
finish
