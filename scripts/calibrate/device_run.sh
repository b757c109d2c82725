#!/bin/sh
# device_run.sh: the calibration run on a GPU machine (bench/RESULTS.md has
# what it printed). From a folder G holding src/ (core, numerics, io/qcal.*,
# engine/calib.*, model/deployed.h, backend/backend.h) and calibrate/ (this
# folder), writing into OUT:
#   1. calibrate.py: measure (tables), golden subset, full set
#   2. qcal_check built with the measured tables: the host quantizers against
#      the full set and the golden subset
#   3. make_torch_data.py: torch-made dumps and checkpoint
#   4. data.tar.xz: tables, golden subset, torch data, raw rcp.approx deltas
# usage: device_run.sh G OUT [WORK]
G=$1; OUT=$2; W=${3:-/tmp/cw}
mkdir -p "$W"
[ -f "$G/libcal.so" ] && cp "$G/libcal.so" "$W/"  # prebuilt by nvcc -O3 -arch=sm_90 -shared (else calibrate.py builds it)
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$W/ind TRITON_CACHE_DIR=$W/triton TORCHINDUCTOR_COMPILE_THREADS=16
t0=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/env.txt" 2>&1
python3 "$G/calibrate/calibrate.py" --work "$W" --measure "$W/tables" --golden "$W/golden" --full "$W/full" > "$OUT/log.txt" 2>&1
echo "calibrate.py exit $? after $(( $(date +%s) - t0 )) s" >> "$OUT/log.txt"
rm -rf "$W/src"; cp -r "$G/src" "$W/src"
[ -f "$W/tables/rcpa_data.c" ] && cp "$W/tables/rcpa_data.c" "$W/tables/ceil2log_data.c" "$W/src/numerics/"
gcc -O2 -std=c11 -D_GNU_SOURCE -Wno-format-truncation -I"$W/src" "$W"/src/core/*.c "$W"/src/numerics/*.c "$W/src/io/qcal.c" \
  "$W/src/engine/calib.c" "$G/calibrate/qcal_check.c" -lm -lpthread -o "$W/qcal_check" >> "$OUT/log.txt" 2>&1
for f in "$W"/full/*.qcal; do "$W/qcal_check" "$f" > "$f.txt" 2>&1 & done; wait
cat "$W"/full/*.qcal.txt > "$OUT/compare_full.txt"
"$W/qcal_check" "$W/golden" > "$OUT/compare_golden.txt" 2>&1
echo "compare done after $(( $(date +%s) - t0 )) s" >> "$OUT/log.txt"
python3 "$G/calibrate/make_torch_data.py" "$W/torch" >> "$OUT/log.txt" 2>&1
echo "torch data done after $(( $(date +%s) - t0 )) s" >> "$OUT/log.txt"
( cd "$W" && tar -cJf "$OUT/data.tar.xz" tables golden torch full/values.json rcpa_delta.bin ceil2log_*.bin 2>>"$OUT/log.txt" )
( cd "$W" && tar -cJf "$OUT/cache.tar.xz" libcal.so ind triton 2>/dev/null; s=$(stat -c %s "$OUT/cache.tar.xz"); [ "$s" -lt 15000000 ] || rm -f "$OUT/cache.tar.xz" )
echo "all done after $(( $(date +%s) - t0 )) s" >> "$OUT/log.txt"
