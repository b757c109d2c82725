#!/bin/sh
# quant_vllm_group.sh: fp8_group128_ue8m0 bytes made the way vLLM's own
# source makes them (scripts/conformance/vllm_group_dump.py, transcribed
# from vLLM, not from qatcheck): the CUDA kernels floor the SCALE at 1e-10
# (an all-zero group gets 2^-33, 0x2f000000), the Triton kernel only the
# amax (2^-42, 0x2a800000). --identify names vllm_cuda (and vllm, its
# alias for these formats) for the CUDA bytes, as float32 scales and as
# UE8M0 bytes, never vllm_triton; the Triton bytes the other way round.
. "$(dirname "$0")/lib.inc"
MK="$PY scripts/conformance/vllm_group_dump.py"
$PY -c "import ml_dtypes, h5py" 2>/dev/null || { echo "ml_dtypes or h5py missing (scripts/install-deps.sh)"; exit 77; }
$MK "$T/cuda.h5" cuda || bad "make cuda"
$MK "$T/cuda8.h5" cuda --e8m0 || bad "make cuda --e8m0"
$MK "$T/triton.h5" triton || bad "make triton"
$MK "$T/cuda0.h5" cuda --zero-only || bad "make cuda --zero-only"
$MK "$T/triton0.h5" triton --zero-only || bad "make triton --zero-only"
for f in cuda cuda8; do
  expect_exit 0 "vLLM CUDA bytes ($f) are identified" "$QATCHECK" quant --dump "$T/$f.h5" --module /lin --identify
  grep -q "reproduce the deployed bytes: .*vllm_cuda" "$T/out" || bad "$f: --identify does not name vllm_cuda: $(cat "$T/out")"
  grep "reproduce the deployed bytes" "$T/out" | grep -q "vllm_triton" && bad "$f: CUDA bytes identified as vllm_triton"
  expect_exit 0 "--profile vllm_cuda reproduces the $f bytes" "$QATCHECK" quant --dump "$T/$f.h5" --module /lin --profile vllm_cuda
  expect_exit 0 "--profile vllm (the CUDA path) reproduces the $f bytes" "$QATCHECK" quant --dump "$T/$f.h5" --module /lin --profile vllm
  expect_exit 1 "the Triton rule does not pass the $f bytes" "$QATCHECK" quant --dump "$T/$f.h5" --module /lin --profile vllm_triton
done
expect_exit 1 "the Triton rule does not pass the UE8M0 CUDA bytes" "$QATCHECK" quant --dump "$T/cuda8.h5" --module /lin --profile vllm_triton
grep -q "scale\[0\]: expected 0x55 found 0x5e" "$T/out" || bad "the all-zero group's UE8M0 byte (2^-33 = 0x5e) is not shown: $(cat "$T/out")"
expect_exit 1 "the Triton rule does not pass the float32 CUDA scales" "$QATCHECK" quant --dump "$T/cuda0.h5" --module /lin --profile vllm_triton
grep -q "scale\[0\]: expected 0x2a800000 found 0x2f000000" "$T/out" || bad "the all-zero group's scale 2^-33 is not shown: $(cat "$T/out")"
expect_exit 0 "vLLM Triton bytes are identified" "$QATCHECK" quant --dump "$T/triton.h5" --module /lin --identify
grep -q "reproduce the deployed bytes: vllm_triton" "$T/out" || bad "--identify does not name vllm_triton first: $(cat "$T/out")"
grep "reproduce the deployed bytes" "$T/out" | grep -q "vllm_cuda" && bad "Triton bytes identified as vllm_cuda"
expect_exit 1 "the CUDA rule does not pass the Triton bytes" "$QATCHECK" quant --dump "$T/triton0.h5" --module /lin --profile vllm_cuda
grep -q "scale\[0\]: expected 0x2f000000 found 0x2a800000" "$T/out" || bad "the all-zero group's scale is not shown: $(cat "$T/out")"
expect_exit 2 "vllm_cuda makes no weight block format" "$QATCHECK" quant --dump "$T/cuda.h5" --module /lin --profile vllm_cuda --format fp8_block128
finish
