#!/bin/sh
# quant_cpu.sh: CPU bulk quantizers vs memcpy of the same bytes, as a ratio
# in one run (target: FP8 formats within 4x). Builds bench/quant_cpu.c with
# the core and numerics layers alone (numerics depends on nothing else). Usage: bench/quant_cpu.sh [ROWS COLS REPS]
set -eu
cd "$(dirname "$0")/.."
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
gcc -O2 -std=c11 -D_GNU_SOURCE -Isrc bench/quant_cpu.c src/core/*.c src/numerics/*.c -lm -lpthread -o "$T/quant_cpu"
echo "quant_cpu: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
"$T/quant_cpu" "$@"
