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
# FORMAT=safetensors: the same weights as a safetensors master checkpoint,
# sharded in 5 GB files with an index (bench/make_big_safetensors.py, by
# hand), swept with --checkpoint; the ratio sweep / cat of the shards is
# printed beside (target on the GPU: <= 1.15), and the sweep's peak RSS.
# STREAM_GB=G (with FORMAT=safetensors): instead, a sparse checkpoint of G GB
# (holes: no disk, zeros), e.g. larger than host memory, swept with one
# format and 16 tokens under `ulimit -v` of ULIMIT_MB (default 2048): it must
# finish, peak RSS printed against the file size.
# usage: sh bench/contract.sh      env: QATCHECK PY LAYERS(32) HIDDEN(4096)
#        TOKENS(512) WF(nvfp4,fp8_block128,mxfp8) CC(cc) BENCH_TMP(mktemp -d)
#        DEVICE(cpu) FORMAT(hdf5|safetensors) STREAM_GB ULIMIT_MB ST_READ GEMM_GFLOPS
# A run of fewer than 32 layers prints the full sweep extrapolated
# linearly (every layer is the same work), labelled as such.
# RANKS=N: the same sweep, side by side, as one process and under
# `mpirun -np N` (docs/distributed.md): each time, the slowest rank's floor
# (its GEMM work at the measured rate, and 1/N of the read), and the cost of
# distributing: rank 0's time beyond the slowest rank's own run (the
# agreement, the gather of the rows, the merge) and the spread between the
# fastest and slowest rank (stragglers). MPIRUN overrides the launcher.
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

FORMAT=${FORMAT:-hdf5}
fsize() { stat -c %s "$@" | awk '{s += $1} END {printf "%.0f\n", s}'; }
# peak RSS (KiB) of a command: the children's maximum, as getrusage reports it
peak_rss() { "$PY" -c 'import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
open(sys.argv[1], "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(rc)' "$@"; }

if [ -n "${STREAM_GB:-}" ]; then
  [ "$FORMAT" = safetensors ] || { echo "STREAM_GB needs FORMAT=safetensors"; exit 2; }
  L=$("$PY" -c "import math; print(math.ceil($STREAM_GB * 1e9 / (7 * $HIDDEN * $HIDDEN * 2)))")
  [ -d "$T/stream" ] || "$PY" bench/make_big_safetensors.py "$T/stream" --layers "$L" --hidden "$HIDDEN" --sparse
  size=$(fsize "$T"/stream/*.safetensors)
  mem=$(awk '/MemTotal/ {print $2 * 1024}' /proc/meminfo)
  echo "streaming bench: sparse checkpoint of $L layers x 7 [$HIDDEN, $HIDDEN] bf16 = $(echo "$size" | awk '{printf "%.1f", $1/1e9}') GB (host memory $(echo "$mem" | awk '{printf "%.1f", $1/1e9}') GB), ulimit -v ${ULIMIT_MB:-2048} MB"
  t0=$(now)
  ( ulimit -v $(( ${ULIMIT_MB:-2048} * 1024 )); peak_rss "$T/rss" "$QATCHECK" contract --master-vs-dequant --checkpoint "$T/stream" \
      --weight-format fp8_block128 --tokens 16 --quiet --device "$DEVICE" --json "$T/r.json" ) || { echo "streaming sweep FAILED"; exit 1; }
  t1=$(now)
  "$PY" -c "
import json, sys
r = json.load(open(sys.argv[1]))
rss, size, mem, t = int(open(sys.argv[2]).read()) * 1024, int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[6]) - float(sys.argv[5])
print('rows %d, wall %.1f s (%.2f GB/s); peak RSS %.0f MB = %.3f of the file, %.3f of host memory' % (
    len(r['rows']), t, size / t / 1e9, rss / 1e6, rss / size, rss / mem))" "$T/r.json" "$T/rss" "$size" "$mem" "$t0" "$t1"
  [ -n "${BENCH_TMP:-}" ] || rm -rf "$T"
  exit 0
fi

echo "contract bench (--device $DEVICE, $FORMAT): $LAYERS layers x 7 modules, [$HIDDEN, $HIDDEN] bf16, $TOKENS tokens, formats $WF"
if [ "$FORMAT" = safetensors ]; then
  [ -d "$T/st" ] || "$PY" bench/make_big_safetensors.py "$T/st" --layers "$LAYERS" --hidden "$HIDDEN" --shard-gb 5
  FILES=$(ls "$T"/st/*.safetensors)
  SRC="--checkpoint $T/st"
else
  [ -f "$T/bench.h5" ] || "$PY" scripts/make_checkpoint.py "$T/bench.h5" --preset bench --layers "$LAYERS" --hidden "$HIDDEN"
  FILES="$T/bench.h5"
  SRC="--dump $T/bench.h5"
fi
cat $FILES >/dev/null
t0=$(now); cat $FILES >/dev/null; t1=$(now)
if [ "$FORMAT" = safetensors ]; then
  # the reader alone, as many threads as the sweep's readers on this device
  # (READERS overrides): pread and mmap, beside cat
  READERS=${READERS:-$(n=$(nproc); [ "$DEVICE" = cpu ] && echo 1 || { [ "$n" -ge 4 ] && echo $(( n / 2 > 8 ? 8 : n / 2 )) || echo 1; })}
  # ST_READ: the reader built elsewhere (a GPU host without the cJSON headers)
  ST_READ=${ST_READ:-}
  if [ -z "$ST_READ" ]; then
    $CC -O2 -std=c11 -D_GNU_SOURCE -Isrc $(pkg-config --cflags libcjson) bench/st_read.c src/io/safetensors.c src/io/safetensors_files.c src/core/file.c src/core/err.c \
      src/core/tensor.c -o "$T/st_read" $(pkg-config --libs libcjson) -lm -lpthread
    ST_READ="$T/st_read"
  fi
  "$ST_READ" "$T/st" "$READERS" >"$T/st_read.txt"
  awk '{printf "reader alone (%s, %d thread(s)): %.2f GB in %.2f s = %.2f GB/s\n", $2, $3, $4, $5, $4 / $5}' "$T/st_read.txt"
fi

if [ -z "$BLAS_RATE" ]; then
  $CC -O2 -I/usr/include/x86_64-linux-gnu/openblas-pthread -I/usr/include/openblas bench/blas_rate.c -o "$T/blas_rate" -lopenblas
  BLAS_RATE="$T/blas_rate"
fi
# GEMM_GFLOPS: the float64 GEMM rate of a device backend (e.g. the DGEMM rate
# bench/gpu_linear measured on the same GPU); else the CPU's, measured here
rate=${GEMM_GFLOPS:+x $GEMM_GFLOPS}
[ -n "$rate" ] || rate=$("$BLAS_RATE" "$TOKENS" "$HIDDEN" "$HIDDEN" 3)

if [ -n "${RANKS:-}" ]; then
  MPIRUN=${MPIRUN:-mpirun $( [ "$(id -u)" = 0 ] && echo --allow-run-as-root ) --oversubscribe --bind-to none}
  echo "RANKS=$RANKS: one process, then $MPIRUN -np $RANKS"
  "$QATCHECK" contract --master-vs-dequant $SRC --weight-format "$WF" --tokens "$TOKENS" --quiet --device "$DEVICE" --json "$T/r1.json" || [ $? -eq 1 ]
  t2=$(now)
  $MPIRUN -np "$RANKS" "$QATCHECK" contract --master-vs-dequant $SRC --weight-format "$WF" --tokens "$TOKENS" --quiet \
    --device "$DEVICE" --json "$T/rN.json" || [ $? -eq 1 ]
  t3=$(now)
  "$PY" - "$T/r1.json" "$T/rN.json" "$t0" "$t1" "$RANKS" "$($BLAS_RATE "$TOKENS" "$HIDDEN" "$HIDDEN" 3)" "$t2" "$t3" <<'PYEOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
strip = lambda r: {k: v for k, v in r.items() if k not in ("timing_s", "command_line")}
t_cat, n, rate = float(sys.argv[4]) - float(sys.argv[3]), int(sys.argv[5]), float(sys.argv[6].split()[1]) * 1e9
ta, tb = a["timing_s"], b["timing_s"]
print("reports equal apart from timing: %s" % (strip(a) == strip(b)))
print("one process   sweep %7.2f s   floor max(GEMMs %.2f, read %.2f)" % (ta["total"], ta["gemm_flops"] / rate, t_cat))
# the ranks share this node's cores: a rank's GEMM rate is 1/n of the node's
floor = max(tb["rank_gemm_flops_max"] / (rate / n), t_cat / n)
print("%d ranks       sweep %7.2f s (rank 0, plan to report; mpirun wall %.2f s)   slowest rank's floor %.2f s "
      "(its GEMMs at 1/%d of the node's rate %.2f, a %d-th of the read %.2f)" % (n, tb["total"],
      float(sys.argv[8]) - float(sys.argv[7]), floor, n, tb["rank_gemm_flops_max"] / (rate / n), n, t_cat / n))
print("  sweep / slowest rank's floor = %.2f (one process: %.2f)" % (tb["total"] / floor, ta["total"] / max(ta["gemm_flops"] / rate, t_cat)))
print("  ranks' own runs: fastest %.2f s, slowest %.2f s (stragglers: %.1f %% of the slowest)" % (
      tb["rank_fastest"], tb["rank_slowest"], 100 * (tb["rank_slowest"] - tb["rank_fastest"]) / tb["rank_slowest"]))
over = tb["total"] - tb["rank_slowest"]
print("  distribution overhead: %.3f s beyond the slowest rank = %.1f %% of the sweep (merge on rank 0, waiting "
      "included: %.3f s)" % (over, 100 * over / tb["total"], tb["merge"]))
print("  speedup over one process %.2f x with %d ranks" % (ta["total"] / tb["total"], n))
PYEOF
  [ -n "${BENCH_TMP:-}" ] || rm -rf "$T"
  exit 0
fi
peak_rss "$T/rss" "$QATCHECK" contract --master-vs-dequant $SRC --weight-format "$WF" --tokens "$TOKENS" --quiet \
  --device "$DEVICE" --json "$T/r.json"
# the rate again after the sweep: the faster of the two is the GEMM floor
rate2=${GEMM_GFLOPS:+x $GEMM_GFLOPS}
[ -n "$rate2" ] || rate2=$("$BLAS_RATE" "$TOKENS" "$HIDDEN" "$HIDDEN" 3)

"$PY" - "$T/r.json" "$t0" "$t1" "$rate" "$LAYERS" "$(fsize $FILES)" "$(nproc)" "$rate2" "$T/rss" "$FORMAT" <<'PYEOF'
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
      "quantize %.2f, gemm %.2f, metrics %.2f: time in those calls; queueing %.2f, device sync %.2f; "
      "%d unit(s) in flight)" % (
    tm["total"], tm["generate"], tm["read"], max(tm["units_ahead"], 1), tm["wait_read"], tm["quantize"], tm["gemm"],
    tm["metrics"], tm.get("queue", float("nan")), tm["sync"], tm.get("units_in_flight", 1)))
print("GEMMs at BLAS rate %8.2f s   (%.1f GFLOP)" % (gemm_need, tm["gemm_flops"] * 1e-9))
print("file read (cat)    %8.2f s" % t_cat)
print("ratio sweep / max(GEMMs, read) = %.2f  (target <= 1.3: %s)" % (ratio, "met" if ratio <= 1.3 else "NOT met"))
if sys.argv[10] == "safetensors":
    r_cat = tm["total"] / t_cat
    print("ratio sweep / cat of the shards = %.2f  (GPU target <= 1.15: %s)" % (r_cat, "met" if r_cat <= 1.15 else "NOT met"))
print("peak RSS %.0f MB (file %.2f GB)" % (int(open(sys.argv[9]).read()) * 1024 / 1e6, size / 1e9))
if layers < 32:
    print("EXTRAPOLATED to 32 layers (x%.1f, linear): sweep %.1f s, GEMMs %.1f s, read %.1f s" % (
        32 / layers, tm["total"] * 32 / layers, gemm_need * 32 / layers, t_cat * 32 / layers))
PYEOF
[ -n "${BENCH_TMP:-}" ] || rm -rf "$T"
