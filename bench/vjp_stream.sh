#!/bin/sh
# bench/vjp_stream.sh: `qatcheck vjp` reads a dump module by module (one
# read ahead on the CPU, two on a device, the rest on disk), so its peak
# memory should not grow with the dump: two dumps of the same linear module, N1 and N2 copies
# (bench/make_many_dump.py, [M, K] x [N, K] bf16 each), audited with derived
# tolerances; prints each dump's size, the audit's wall time and peak RSS
# (/usr/bin/time), and what the peak grows by per module added against the
# dump's growth per module (target: under 5%: a module's data is released
# after its audit; what stays is its checks for the report).
#   usage: bench/vjp_stream.sh [N1 N2] (default 8 64)
set -eu
cd "$(dirname "$0")/.."
N1=${1:-8}; N2=${2:-64}
PY=${PY:-python3}
T=$(mktemp -d "${BENCH_TMP:-/tmp}/vjp_stream.XXXXXX"); trap 'rm -rf "$T"' EXIT
for n in "$N1" "$N2"; do
  "$PY" bench/make_many_dump.py "$T/d$n.h5" "$n"
  cat >"$T/c$n.json" <<J
{"data": {"dump": "d$n.h5"}, "candidate": "dump", "tolerances": {"d_x": {"derive": true}, "d_weight": {"derive": true}}}
J
  (cd "$T" && /usr/bin/time -f "%e %M" -o "t$n" "$OLDPWD/qatcheck" vjp --case "c$n.json" --quiet) || { echo "vjp_stream: the audit of $n modules did not pass"; exit 1; }
  set -- $(cat "$T/t$n")
  echo "modules $n dump_mb $(du -m "$T/d$n.h5" | cut -f1) audit_s $1 rss_mb $(( $2 / 1024 ))"
  eval "rss$n=$2 dump$n=$(du -k "$T/d$n.h5" | cut -f1)"
done
eval "a=\$rss$N1 b=\$rss$N2 da=\$dump$N1 db=\$dump$N2"
awk -v a="$a" -v b="$b" -v da="$da" -v db="$db" -v n1="$N1" -v n2="$N2" 'BEGIN {
  g = (b - a) / (n2 - n1); d = (db - da) / (n2 - n1)
  printf "peak RSS %.2f MB more a module, the dump %.2f MB: %.4f (target < 0.05)\n", g / 1024, d / 1024, g / d
  exit !(g / d < 0.05) }'
