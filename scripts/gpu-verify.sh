#!/bin/sh
# gpu-verify.sh: the GPU checks of a release, in one run on a GPU machine
# (results go into bench/RESULTS.md), from the repository root, with .gpu/
# holding the bundle of scripts/gpu-pack.sh. Writes OUT/<check>.txt and a
# summary OUT/summary.txt:
#   test_gpu       the GPU test binary (kernels, backends, against the CPU)
#   gpu_vjp        tests/e2e/gpu_vjp.sh: cuda vs cpu on every case
#   gpu_contract   tests/e2e/gpu_contract.sh
#   calib          quant --calibration on the committed producer bytes, CPU and CUDA
#   quant_torch    tests/e2e/quant_torch.sh on cpu and cuda
#   st_bench       bench/contract.sh FORMAT=safetensors DEVICE=cuda (DGEMM rate
#                  measured here by bench_gpu_linear)
#   proxy          scripts/proxy_sft.py --device cuda: a healthy run and two
#                  planted bugs, judged by `qatcheck sft` and `qatcheck step`
#   gpu_mpi        tests/e2e/gpu_mpi.sh: the NCCL communicator and device
#                  all-reduce, one process and under `mpirun -np 1` (Open MPI
#                  from .gpu/ompi.tar.xz, scripts/mpi-pack.sh, when the
#                  machine has none)
#   linear_bench   bench/gpu_linear.sh --check: the fused audit's ratios
#                  against bench/baseline.json (exit 1 on a regression)
#   bench_guard    the same guard on a planted 10% slowdown: must exit 1
#   ozaki          the fast reference (vjp --reference fast) and auto (the
#                  default): the GPU test's gpu_ozaki suite (against DGEMM,
#                  odd shapes, the audit's verdicts, auto's pick at prefill
#                  and decode) and bench/gpu_linear.sh --reference fast
#                  (times, errors against DGEMM for 3 and 4 slices, the
#                  audit under auto against float64)
#   gpu_classes    bench/gpu_classes.sh --check: the norms' and the
#                  elementwise classes' references on the device against
#                  their host loops at a real model's size (host / device
#                  against bench/baseline.json; exit 1 on a regression)
#   dump_e2e       bench/gpu_dump_e2e.sh: the end-to-end dump run
#   fsdp_real      tests/e2e/fsdp_real.sh: the fsdp_flat layout against real
#                  FSDP1 bytes (this machine's torch runs FSDP1 on the CPU;
#                  Debian's does not, so CI skips it)
#   cuda_graph     tests/e2e/cuda_graph.sh: a step captured in a CUDA Graph and
#                  replayed, dumped by qatdump (mode cuda_graph) and judged by
#                  `vjp --eager` against the eager step: the replay passes bit
#                  for bit, a stale static input fails (exit 77 without a
#                  CUDA device for torch)
#   hf_models      bench/hf_models.sh: whole transformers models (Llama,
#                  Gemma 2, Qwen2-MoE, Mamba2) at hidden 2048, one training
#                  step on the GPU, the whole-model audit on the GPU, audit
#                  time against step time; transformers 4.49.0 from
#                  .gpu/wheels (scripts/gpu-pack.sh) put first on the path
#                  when the machine has another release or none; exit 77
#                  (skipped) without transformers 4.49 or a CUDA device.
#                  hf_models_ARCH (hf_models_llama, ...): one architecture
#                  (Llama's dump and audit took 5 minutes on the H200);
#                  hf_models_ARCH_bf16: that model in pure bf16 (torch's own
#                  bf16 arithmetic on the GPU, judged with compute_dtype)
#   hf_e2e         tests/e2e/hf_models.sh (CI's tiny whole models, clean and
#                  planted) under this machine's torch and the bundle's
#                  transformers 4.49.0: the dumper against another torch release
#   hf_e2e5        tests/e2e/hf_models5.sh under this machine's own torch 2 and
#                  transformers 5 (the dumper follows 5.23's module code: this
#                  checks the machine's 5.x against it; exit 77 without them)
#   dsv3_issue38   bench/dsv3_layer.sh --size issue38 --device cuda --plant: a
#                  DeepSeek-V3 layer (hidden 2048, 64 fp8 block-128 experts,
#                  top-8, 3 of 8 groups, MLA, 1024 tokens) dumped and audited
#                  on the GPU (dump and audit times, dump size, peak host RSS
#                  and GPU memory, the verdict), and its three planted bugs
#                  failing on their module alone (issue 38); under the
#                  machine's own torch 2 and transformers 5 (exit 77 without
#                  them or a CUDA device)
#   dsv3_real      the same at DeepSeek-V3's real size (hidden 7168, 256
#                  experts of width 2048 top-8, 4 of 8 groups, 4096 tokens, MLA
#                  at its real dims; issue 41), clean only; it prints its
#                  estimate first and exits 77 when the dump or the step
#                  does not fit this machine's disk or GPU memory.
#                  DSV3_ARGS passes dims to both (e.g. "--experts 32")
# usage: scripts/gpu-verify.sh OUT [CHECKS...] (default: all, in that order)
# PY (python3), BENCH_TMP (/tmp/stbench), LAYERS (32) pass through;
# QC_UNPACKED=1: the bundle is already unpacked in /tmp/qc (parallel runs).
set -u
OUT=$1; shift
CHECKS=${*:-test_gpu gpu_vjp gpu_contract calib quant_torch linear_bench bench_guard ozaki gpu_classes dump_e2e st_bench proxy gpu_mpi fsdp_real cuda_graph hf_models}
Q=/tmp/qc
mkdir -p "$Q" "$OUT"
[ "${QC_UNPACKED:-0}" = 1 ] || tar -C "$Q" -xJf .gpu/bundle.tar.xz || { echo "gpu-verify: no .gpu/bundle.tar.xz (scripts/gpu-pack.sh)"; exit 2; }
export LD_LIBRARY_PATH=$Q/lib QATCHECK=$Q/qatcheck PY=${PY:-python3}
[ -d .gpu/py ] && export PYTHONPATH=$PWD/.gpu/py${PYTHONPATH:+:$PYTHONPATH}
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  git rev-parse --short HEAD 2>/dev/null; $PY -c "import torch; print('torch', torch.__version__)"; } > "$OUT/summary.txt" 2>&1
run() { # name cmd...: time a check, keep its output and exit status
  n=$1; shift
  t0=$(date +%s.%N)
  "$@" > "$OUT/$n.txt" 2>&1; rc=$?
  echo "$n: exit $rc in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s" >> "$OUT/summary.txt"
}
proxy() { # healthy + grad-half + mask-shift on the GPU, judged with the committed cases
  W=/tmp/proxy; rm -rf "$W"; mkdir -p "$W"
  f=jsonl,csv,hf,megatron; $PY -c "import tensorboard" 2>/dev/null && f=$f,tb
  for p in none grad-half mask-shift; do
    $PY scripts/proxy_sft.py --out "$W/$p" --device cuda --formats "$f" --step-dump "$W/$p/step.h5" \
      $( [ $p = none ] || echo "--plant $p" ) || return 2
    cp cases/proxy/sft.json cases/proxy/step.json "$W/$p/"
    case $f in *tb*) ;; *) $PY - "$W/$p/sft.json" <<'P' ;; esac
import json, sys  # no tensorboard here: every arm's JSONL log
c = json.load(open(sys.argv[1]))
for a in c["arms"].values(): a["log"] = a["log"].split("/")[0] + "/metrics.jsonl"
json.dump(c, open(sys.argv[1], "w"), indent=1)
P
    for v in sft step; do
      "$QATCHECK" $v --case "$W/$p/$v.json" --json "$W/$p/$v.r.json"
      echo "proxy $p $v: exit $?"
      $PY -c "import json,sys; r=json.load(open(sys.argv[1])); print(' ', r.get('conclusion', r.get('verdict')), [(p.get('verdict'), p.get('localization'), p.get('first_deviation')) for p in r.get('pairs', [])] or r.get('localization'))" "$W/$p/$v.r.json"
    done
  done
}
st_bench() {
  r=$("$Q/bench_gpu_linear" --M 512 --K 4096 --N 4096 --fmt fp8_block128 | awk '$1 == "dgemm_tflops" {print $2 * 1000}')
  echo "DGEMM at 512 x 4096 x 4096: $r GFLOP/s"
  FORMAT=safetensors DEVICE=cuda GEMM_GFLOPS=$r ST_READ=$Q/st_read BENCH_TMP=${BENCH_TMP:-/tmp/stbench} sh bench/contract.sh
}
hf_path() { # qatdump_hf.py follows transformers 4.49.0: the bundle's pinned wheels go first on the path
  if ! $PY -c "import transformers, sys; sys.exit(transformers.__version__ != '4.49.0')" 2>/dev/null &&
     [ -d .gpu/wheels ]; then
    for w in .gpu/wheels/*.whl; do # one by one: a wheel of another Python ABI is skipped (the machine's own is used)
      $PY -m pip install -q --no-index --no-deps --target "$Q/py" "$w" >/dev/null 2>&1 ||
        echo "hf_models: $(basename "$w") does not install here: the machine's own package is used"
    done
    export PYTHONPATH=$Q/py${PYTHONPATH:+:$PYTHONPATH}
  fi
}
hf_models() { hf_path; PY=$PY sh bench/hf_models.sh --device cuda "$@"; }
hf_e2e() { hf_path; PY=$PY sh tests/e2e/hf_models.sh; }
for c in $CHECKS; do
  case $c in
    test_gpu) run test_gpu "$Q/test_gpu" --verbose ;;
    gpu_vjp) run gpu_vjp sh tests/e2e/gpu_vjp.sh ;;
    gpu_contract) run gpu_contract sh tests/e2e/gpu_contract.sh ;;
    calib) run calib sh -c '"$QATCHECK" quant --calibration tests/data/calib && "$QATCHECK" quant --calibration tests/data/calib --device cuda' ;;
    quant_torch) run quant_torch env DEVICES="cpu cuda" sh tests/e2e/quant_torch.sh ;;
    st_bench) run st_bench st_bench ;;
    proxy) run proxy proxy ;;
    gpu_mpi) run gpu_mpi sh -c 'if ! command -v mpirun >/dev/null && [ -f .gpu/ompi.tar.xz ]; then
        mkdir -p /tmp/ompi && tar -C /tmp/ompi -xJf .gpu/ompi.tar.xz && . /tmp/ompi/env.sh; fi; sh tests/e2e/gpu_mpi.sh' ;;
    linear_bench) run linear_bench sh bench/gpu_linear.sh --check "$Q" ;;
    bench_guard) run bench_guard sh -c 'QC_BENCH_PLANT=0.10 sh bench/gpu_linear.sh --check --no-peer "$0"; rc=$?
        [ $rc = 1 ] && echo "bench_guard: the planted 10% slowdown fails the check (exit 1)" && exit 0
        echo "bench_guard: the planted 10% slowdown gave exit $rc, expected 1"; exit 1' "$Q" ;;
    ozaki) run ozaki sh -c '"$0/test_gpu" --filter "gpu_ozaki/*" --verbose && sh bench/gpu_linear.sh --check --no-peer --reference fast "$0"' "$Q" ;;
    gpu_classes) run gpu_classes sh bench/gpu_classes.sh --check "$QATCHECK" ;;
    dump_e2e) run dump_e2e sh bench/gpu_dump_e2e.sh "$QATCHECK" ;;
    fsdp_real) run fsdp_real sh tests/e2e/fsdp_real.sh ;;
    cuda_graph) run cuda_graph sh tests/e2e/cuda_graph.sh ;;
    hf_models) run hf_models hf_models ;;
    hf_e2e) run hf_e2e hf_e2e ;;
    hf_e2e5) run hf_e2e5 env -u PYTHONPATH QC_TORCH2=/nonexistent PY=$PY sh tests/e2e/hf_models5.sh ;; # the machine's own torch and transformers
    dsv3_issue38) run dsv3_issue38 env -u PYTHONPATH QC_TORCH2=/nonexistent PY=$PY BENCH_TMP=/tmp/dsv3_issue38 \
        sh bench/dsv3_layer.sh --size issue38 --device cuda --plant ${DSV3_ARGS:-} ;;
    dsv3_real) run dsv3_real env -u PYTHONPATH QC_TORCH2=/nonexistent PY=$PY BENCH_TMP=/tmp/dsv3_real \
        sh bench/dsv3_layer.sh --size real --device cuda ${DSV3_ARGS:-} ;;
    hf_models_*_bf16) a=${c#hf_models_}; run "$c" hf_models --dtype bfloat16 "${a%_bf16}" ;; # the same in pure bf16
    hf_models_*) run "$c" hf_models "${c#hf_models_}" ;; # one architecture (a device call is 10 minutes at most)
    *) echo "gpu-verify: unknown check '$c'" >> "$OUT/summary.txt" ;;
  esac
done
cat "$OUT/summary.txt"
