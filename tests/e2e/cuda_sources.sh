#!/bin/sh
# cuda_sources.sh: rules of the CUDA sources (kernels/, src/backend/cuda/)
# that hold without a GPU: every kernel declares __launch_bounds__ on its
# declaration line (docs/gpu.md: the block size of its launches); no
# CUDA, cuBLAS or NCCL status is dropped (no call of theirs stands alone as
# a statement: its status goes to CK / BK, cu_keep / blas_keep or a test);
# the cached cuBLASLt plans have one teardown (cu_plan_free, cuda_priv.h);
# and the environment (the benchmark's side-by-side switches) is read only
# when the backend opens, never on a call.
. "$(dirname "$0")/lib.inc"
files=$(ls kernels/*.cu kernels/*.cuh src/backend/cuda/*.cu 2>/dev/null)
[ -n "$files" ] || { echo "no CUDA sources: skipped"; exit 77; }
nk=$(cat $files | grep -c '__global__')
[ "$nk" -gt 0 ] || bad "no kernel found in $files"
grep -n '__global__' $files | grep -v '__launch_bounds__' >"$T/unbound"
[ -s "$T/unbound" ] && bad "kernels without __launch_bounds__: $(cat "$T/unbound")" || ok "all $nk kernel declarations have __launch_bounds__"
hdrs="$files $(ls src/backend/cuda/*.h kernels/*.h 2>/dev/null)"
grep -nE '(^[[:space:]]*|[;{][[:space:]]*|[)][[:space:]]+|else[[:space:]]+)(cuda|cublas|nccl)[A-Za-z0-9_]*[[:space:]]*\(' $hdrs >"$T/dropped"
[ -s "$T/dropped" ] && bad "CUDA / cuBLAS / NCCL calls whose status is dropped: $(cat "$T/dropped")" \
  || ok "every CUDA, cuBLAS and NCCL call's status is used"
grep -n 'cublasLtMatrixLayoutDestroy\|cublasLtMatmulDescDestroy' $hdrs | grep -v '^src/backend/cuda/cuda_priv.h:' >"$T/teardown"
[ -s "$T/teardown" ] && bad "cuBLASLt plan teardown outside cu_plan_free: $(cat "$T/teardown")" \
  || ok "the cuBLASLt plans' teardown is written once (cu_plan_free)"
grep -n 'getenv' $files | grep -v '^src/backend/cuda/backend.cu:' >"$T/env"
[ -s "$T/env" ] && bad "the environment read outside the backend's open: $(cat "$T/env")" \
  || ok "the environment is read only in backend.cu"
if grep -q 'getenv' src/backend/cuda/backend.cu; then
  n_all=$(grep -c 'getenv' src/backend/cuda/backend.cu)
  n_open=$(sed -n '/^extern "C" int qc_backend_cuda_open(/,/^}/p' src/backend/cuda/backend.cu | grep -c 'getenv')
  [ "$n_all" -eq "$n_open" ] && ok "backend.cu reads it in qc_backend_cuda_open only" \
    || bad "backend.cu reads the environment outside qc_backend_cuda_open ($n_open of $n_all)"
fi
finish
