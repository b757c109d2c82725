#!/bin/sh
# bench/contract.sh: `qatcheck contract --master-vs-dequant` over a generated
# checkpoint of LAYERS layers x 7 linear modules (q/k/v/o/gate/up/down) at
# HIDDEN x HIDDEN, bf16, dY generated with TOKENS tokens, under the weight
# formats WF. Measured side by side in one run:
#   - the sweep's wall time (qatcheck's own clock, from its JSON report);
#   - the GEMMs it must do (its report's FLOP count) at the float64 GEMM rate
#     this machine's CBLAS reaches at that shape (bench/blas_rate.c), and
#   - the time to read the file (cat, page cache as the sweep sees it).
# Target: sweep <= 1.3 x max(GEMM time, read time).
# usage: sh bench/contract.sh      env: QATCHECK PY LAYERS(32) HIDDEN(4096)
#        TOKENS(512) WF(nvfp4,fp8_block128,mxfp8) CC(cc) BENCH_TMP(mktemp -d)
# A run of fewer than 32 layers prints the full sweep extrapolated
# linearly (every layer is the same work), labelled as such.
set -eu
cd "$(dirname "$0")/.."
QATCHECK=${QATCHECK:-./qatcheck}
PY=${PY:-/usr/bin/python3}
LAYERS=${LAYERS:-32}
HIDDEN=${HIDDEN:-4096}
TOKENS=${TOKENS:-512}
WF=${WF:-nvfp4,fp8_block128,mxfp8}
CC=${CC:-cc}
DEVICE=${DEVICE:-cpu}
BLAS_RATE=${BLAS_RATE:-}
T=${BENCH_TMP:-$(mktemp -d)}
mkdir -p "$T"
now() { date +%s.%N; }

echo "contract bench (--device $DEVICE): $LAYERS layers x 7 modules, [$HIDDEN, $HIDDEN] bf16, $TOKENS tokens, formats $WF"
[ -f "$T/bench.h5" ] || "$PY" scripts/make_checkpoint.py "$T/bench.h5" --preset bench --layers "$LAYERS" --hidden "$HIDDEN"
cat "$T/bench.h5" >/dev/null
t0=$(now); cat "$T/bench.h5" >/dev/null; t1=$(now)

if [ -z "$BLAS_RATE" ]; then
  $CC -O2 -I/usr/include/x86_64-linux-gnu/openblas-pthread -I/usr/include/openblas bench/blas_rate.c -o "$T/blas_rate" -lopenblas
  BLAS_RATE="$T/blas_rate"
fi
# GEMM_GFLOPS: the float64 GEMM rate of a device backend (e.g. the DGEMM rate
# bench/gpu_linear measured on the same GPU); else the CPU's, measured here
rate=${GEMM_GFLOPS:+x $GEMM_GFLOPS}
[ -n "$rate" ] || rate=$("$BLAS_RATE" "$TOKENS" "$HIDDEN" "$HIDDEN" 3)

"$QATCHECK" contract --master-vs-dequant --dump "$T/bench.h5" --weight-format "$WF" --tokens "$TOKENS" --quiet \
  --device "$DEVICE" --json "$T/r.json"
# the rate again after the sweep: the faster of the two is the GEMM floor
rate2=${GEMM_GFLOPS:+x $GEMM_GFLOPS}
[ -n "$rate2" ] || rate2=$("$BLAS_RATE" "$TOKENS" "$HIDDEN" "$HIDDEN" 3)

"$PY" - "$T/r.json" "$t0" "$t1" "$rate" "$LAYERS" "$(stat -c %s "$T/bench.h5")" "$(nproc)" "$rate2" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
t_cat = float(sys.argv[3]) - float(sys.argv[2])
rate = max(float(sys.argv[4].split()[1]), float(sys.argv[8].split()[1]))
layers, size, ncpu = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
tm = r["timing_s"]
gemm_need = tm["gemm_flops"] / (rate * 1e9)
floor = max(gemm_need, t_cat)
ratio = tm["total"] / floor
print("cores %s, file %.2f GB, %d rows" % (ncpu, size / 1e9, len(r["rows"])))
print("BLAS dgemm rate at the sweep's shape: %.1f GFLOP/s (best of before %s / after %s)" % (
    rate, sys.argv[4].split()[1], sys.argv[8].split()[1]))
print("sweep total        %8.2f s   (generate %.2f; read %.2f summed over %d reader(s), waited for %.2f; "
      "quantize %.2f, gemm %.2f, metrics %.2f, device sync %.2f: time in those calls)" % (
    tm["total"], tm["generate"], tm["read"], max(tm["units_ahead"], 1), tm["wait_read"], tm["quantize"], tm["gemm"],
    tm["metrics"], tm["sync"]))
print("GEMMs at BLAS rate %8.2f s   (%.1f GFLOP)" % (gemm_need, tm["gemm_flops"] * 1e-9))
print("file read (cat)    %8.2f s" % t_cat)
print("ratio sweep / max(GEMMs, read) = %.2f  (target <= 1.3: %s)" % (ratio, "met" if ratio <= 1.3 else "NOT met"))
if layers < 32:
    print("EXTRAPOLATED to 32 layers (x%.1f, linear): sweep %.1f s, GEMMs %.1f s, read %.1f s" % (
        32 / layers, tm["total"] * 32 / layers, gemm_need * 32 / layers, t_cat * 32 / layers))
PYEOF
[ -n "${BENCH_TMP:-}" ] || rm -rf "$T"
