#!/bin/sh
# bench/split.sh: one lm_head-like linear (generated, M x K x N, builtin
# candidate) audited side by side in one run: as one process unsplit, as
# one process through the split path (a world of one: the split's own
# cost), and split along N over RANKS ranks under mpirun (docs/distributed.md,
# "One module across the ranks"). Prints each wall time (the module's
# `seconds` in the JSON report, and the process's wall clock) and the ratios
# to the unsplit run. On the 2-core development machine RANKS=4
# oversubscribes the cores: the ratio there is the cost of splitting, not a
# speedup; on one GPU per rank the GEMMs divide by RANKS.
# usage: sh bench/split.sh     env: QATCHECK RANKS(4) M(512) K(1024) N(16384) DEVICE(cpu) MPIRUN
set -eu
cd "$(dirname "$0")/.."
QATCHECK=${QATCHECK:-./qatcheck}
PY=${PY:-/usr/bin/python3}
RANKS=${RANKS:-4}
M=${M:-512}
K=${K:-1024}
N=${N:-16384}
DEVICE=${DEVICE:-cpu}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
case "$QATCHECK" in /*) ;; *) QATCHECK="$(pwd)/$QATCHECK" ;; esac
if [ -z "${MPIRUN:-}" ]; then
  MPIRUN="mpirun --oversubscribe -np $RANKS"
  [ "$(id -u)" = 0 ] && MPIRUN="mpirun --allow-run-as-root --oversubscribe -np $RANKS"
fi
TOL='"tolerances": {"d_x": {"rel_l2": 5e-3, "reasoning": "bf16"}, "d_weight": {"rel_l2": 5e-3, "reasoning": "bf16"}, "d_bias": {"rel_l2": 5e-3, "reasoning": "bf16"}}'
printf '{"module": "linear", "dy": ["random"], "data": {"generate": {"shapes": [[%s, %s, %s]], "seed": 1}}, %s}\n' "$M" "$K" "$N" "$TOL" >"$T/whole.json"
printf '{"module": "linear", "split": "linear", "dy": ["random"], "data": {"generate": {"shapes": [[%s, %s, %s]], "seed": 1}}, %s}\n' "$M" "$K" "$N" "$TOL" >"$T/split.json"
now() { date +%s.%N; }
run() { # NAME CMD...: wall seconds of CMD into $T/NAME.wall, its report in $T/NAME.out.json
  name=$1; shift
  t0=$(now)
  "$@" --json "$T/$name.out.json" -q --device "$DEVICE" >/dev/null 2>"$T/$name.err" || [ $? -le 1 ] || { cat "$T/$name.err"; exit 1; }
  t1=$(now)
  echo "$t0 $t1" | awk '{printf "%.3f\n", $2 - $1}' >"$T/$name.wall"
}
run whole "$QATCHECK" vjp --case "$T/whole.json"
run split1 "$QATCHECK" vjp --case "$T/split.json"
run splitN $MPIRUN "$QATCHECK" vjp --case "$T/split.json"
"$PY" - "$T" "$M" "$K" "$N" "$RANKS" <<'P'
import json, sys
t, M, K, N, R = sys.argv[1], *map(int, sys.argv[2:])
rows = []
for name, what in (("whole", "one process, unsplit"), ("split1", "one process, split path (world of one)"),
                   ("splitN", "split over %d ranks (mpirun)" % R)):
    r = json.load(open("%s/%s.out.json" % (t, name)))
    sec = sum(m["seconds"] for m in r["modules"])
    wall = float(open("%s/%s.wall" % (t, name)).read())
    verdicts = sorted({c["verdict"] for c in r["checks"]})
    rows.append((what, sec, wall, verdicts))
base_s, base_w = rows[0][1], rows[0][2]
print("linear M=%d K=%d N=%d (fp64 reference: %.1f GFLOP)" % (M, K, N, 2 * 2 * M * N * K / 1e9))
for what, sec, wall, v in rows:
    print("  %-40s module %7.3f s (x%.2f)   process %7.3f s (x%.2f)   %s" % (what, sec, sec / base_s, wall, wall / base_w, ",".join(v)))
P
