#!/bin/sh
# bench/sft.sh: `qatcheck sft` over three arms of STEPS steps x 10 metrics,
# once with the logs in JSONL and once as TensorBoard event files, on one
# core (taskset), side by side in one run against reading the same files:
# their bytes (cat to /dev/null, from the page cache) and their parse by
# qatcheck's readers alone (build/bench/sft_read). Best of R each, elapsed
# and CPU (user + sys: what load from other processes does not inflate).
# Targets: each sft run under 1 s at 100,000 steps, and within 3x of
# reading its files. The case judges all 10 metrics in both pairs
# (pointwise, cumulative mean) and the loss by equivalence (TOST, 2000
# bootstrap resamples).
#   usage: bench/sft.sh [STEPS] [REPEATS]
set -eu
cd "$(dirname "$0")/.."
STEPS=${1:-100000}; R=${2:-5}
make -s all bench-bin
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
build/bench/sft_gen "$T" "$STEPS"
for a in under_test gradient_reference native_baseline; do echo '{"lr": 1e-4, "seed": 1}' >"$T/$a/config.json"; done
PIN=""; command -v taskset >/dev/null && PIN="taskset -c 0"
for f in jsonl tb; do
  checks=""
  for m in loss val_nll grad_norm update_rms clip_ratio nonfinite tokens_per_s lr loss_scale tokens; do
    checks="$checks{\"metric\": \"$m\", \"pointwise_rel\": 0.01, \"pointwise_abs\": 1e-6, \"mean_rel\": 0.01, \"reasoning\": \"bench\"},"
  done
  checks="$checks{\"metric\": \"loss\", \"equivalence\": {\"delta\": 0.01}, \"reasoning\": \"bench\"}"
  if [ $f = jsonl ]; then log=metrics.jsonl; else log=tb; fi
  cat >"$T/$f.json" <<J
{"arms": {"under_test": {"log": "under_test/$log", "config": "under_test/config.json"},
          "gradient_reference": {"log": "gradient_reference/$log", "config": "gradient_reference/config.json"},
          "native_baseline": {"log": "native_baseline/$log", "config": "native_baseline/config.json"}},
 "window": [1, $STEPS],
 "pairs": {"under_test~gradient_reference": [$checks], "under_test~native_baseline": [$checks]}}
J
done
# best of R, interleaved so that load on the machine hits every side alike;
# each line of a .t file: elapsed, cpu
best() { sort -g -k"$1" | head -1 | cut -d' ' -f"$1"; }
run() { # OUT CMD...: append "elapsed cpu" of CMD on one core
  out=$1; shift
  /usr/bin/time -f "%e %U %S %M" -o "$T/t" $PIN "$@" >/dev/null || { echo "failed: $*"; exit 1; }
  awk '{printf "%s %.3f %s\n", $1, $2 + $3, $4}' "$T/t" >>"$out"
}
for i in $(seq "$R"); do
  for f in jsonl tb; do
    if [ $f = jsonl ]; then logs="$T/under_test/metrics.jsonl $T/gradient_reference/metrics.jsonl $T/native_baseline/metrics.jsonl"
    else logs="$T/under_test/tb $T/gradient_reference/tb $T/native_baseline/tb"; fi
    run "$T/cat.$f" sh -c "cat $(echo $logs | sed 's|/tb|/tb/*|g') >/dev/null"
    run "$T/parse.$f" build/bench/sft_read $logs
    run "$T/sft.$f" ./qatcheck sft --case "$T/$f.json" --quiet
  done
done
echo "sft bench: 3 arms x $STEPS steps x 10 metrics, 21 checks per pair, on one core ($PIN), best of $R"
echo "format     MB   cat (elapsed/cpu)   parse (elapsed/cpu)   sft (elapsed/cpu)   sft/cat (cpu)  sft/parse (cpu)  RSS"
for f in jsonl tb; do
  if [ $f = jsonl ]; then files="$T/*/metrics.jsonl"; else files="$T/*/tb/*"; fi
  mb=$(du -cb $files | tail -1 | awk '{printf "%.1f", $1 / 1e6}')
  ce=$(best 1 <"$T/cat.$f"); cc=$(best 2 <"$T/cat.$f")
  pe=$(best 1 <"$T/parse.$f"); pc=$(best 2 <"$T/parse.$f")
  se=$(best 1 <"$T/sft.$f"); sc=$(best 2 <"$T/sft.$f"); rss=$(best 3 <"$T/sft.$f")
  printf "%-6s %6s   %6.3f / %6.3f s     %6.3f / %6.3f s     %6.3f / %6.3f s   %6.1f         %6.2f       %d MB\n" "$f" "$mb" \
    "$ce" "$cc" "$pe" "$pc" "$se" "$sc" "$(awk -v a="$sc" -v b="$cc" 'BEGIN{print (b > 0) ? a / b : 0}')" \
    "$(awk -v a="$sc" -v b="$pc" 'BEGIN{print (b > 0) ? a / b : 0}')" "$((rss / 1024))"
done
