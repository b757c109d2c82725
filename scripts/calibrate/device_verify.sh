#!/bin/sh
# device_verify.sh: the verification run on a GPU machine (results in
# bench/RESULTS.md), from the repository root, with G a folder holding the
# GPU bundle (scripts/gpu-pack.sh), calibrate/ (this folder) and e2e/
# (tests/e2e/lib.inc, quant_torch.sh), writing into OUT:
#   test_gpu.txt     every GPU test: kernels against the CPU quantizers for
#                    every profile and format, rcp.approx and exp2f(ceilf(log2f))
#                    against the tables over every float32 input
#   log.txt          calibrate.py: ceil(log2) of every engine against the
#                    table, the golden subset, the full set (10^7+ values a path)
#   cal_cpu.txt, cal_cuda.txt   quant --calibration on the full set: the host
#                    quantizers and the CUDA kernels against the producers' bytes
#   torch.txt        make_torch_data.py, then tests/e2e/quant_torch.sh on cpu and cuda
#   data.tar.xz      golden subset, torch data, measure.json, the JSON reports
# usage: device_verify.sh G OUT [WORK]
# CAL_FORMATS (a comma list) limits the calibration to some formats,
# CAL_MEASURE replaces the measurement options, TORCHDATA takes torch data
# already made instead of making it.
G=$1; OUT=$2; W=${3:-/tmp/cw}; Q=/tmp/qc
mkdir -p "$Q" "$W" && tar -C "$Q" -xJf "$G/bundle.tar.xz"
export LD_LIBRARY_PATH=$Q/lib QATCHECK=$Q/qatcheck PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$W/ind \
  TRITON_CACHE_DIR=$W/triton TORCHINDUCTOR_COMPILE_THREADS=16
[ -f "$G/libcal.so" ] && cp "$G/libcal.so" "$W/"
t0=$(date +%s)
el() { echo "$1 after $(( $(date +%s) - t0 )) s" >> "$OUT/times.txt"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvcc --version | tail -1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/times.txt" 2>&1
( "$Q/test_gpu" > "$OUT/test_gpu.txt" 2>&1; echo "test_gpu exit $?" >> "$OUT/test_gpu.txt"; el test_gpu ) &
python3 "$G/calibrate/calibrate.py" --work "$W" ${CAL_MEASURE:---measure $W/tables --no-rcpa} --golden "$W/golden" --full "$W/full" \
  ${CAL_FORMATS:+--formats $CAL_FORMATS} > "$OUT/log.txt" 2>&1
echo "calibrate.py exit $?" >> "$OUT/log.txt"; el calibrate
"$Q/qatcheck" quant --calibration "$W/full" --json "$W/cal_cpu.json" > "$OUT/cal_cpu.txt" 2>&1 &
"$Q/qatcheck" quant --calibration "$W/full" --device cuda --json "$W/cal_cuda.json" > "$OUT/cal_cuda.txt" 2>&1
echo "exit $?" >> "$OUT/cal_cuda.txt"; wait; el "calibration (and test_gpu)"
"$Q/qatcheck" quant --calibration "$W/golden" > "$OUT/cal_golden.txt" 2>&1
if [ -z "${TORCHDATA:-}" ]; then TORCHDATA=$W/torch; python3 "$G/calibrate/make_torch_data.py" "$W/torch" > "$OUT/torch.txt" 2>&1; fi
TORCHDATA=$TORCHDATA DEVICES="cpu cuda" PY=python3 CONTRACT_CHECK=$G/calibrate/contract_check.py sh "$G/e2e/quant_torch.sh" >> "$OUT/torch.txt" 2>&1
echo "quant_torch.sh exit $?" >> "$OUT/torch.txt"; el torch
( cd "$W" && tar -cJf "$OUT/data.tar.xz" golden tables full/values.json cal_cpu.json cal_cuda.json $(ls -d torch 2>/dev/null) 2>>"$OUT/times.txt" )
el done
