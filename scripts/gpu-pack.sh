#!/bin/sh
# gpu-pack.sh: pack what a GPU machine without HDF5, cJSON, OpenBLAS or
# Criterion needs to run qatcheck's GPU tests and benchmarks: ./qatcheck,
# libqatcheck_cuda.so, build/test_gpu, build/bench_gpu_linear and every shared
# library they load except glibc's and CUDA's, stripped, into one compressed
# archive .gpu/bundle.tar.xz (the folder is git-ignored). On the GPU machine:
#
#   mkdir -p /tmp/qc && tar -C /tmp/qc -xJf .gpu/bundle.tar.xz
#   export LD_LIBRARY_PATH=/tmp/qc/lib QATCHECK=/tmp/qc/qatcheck
#   /tmp/qc/test_gpu; sh tests/e2e/gpu_vjp.sh; sh bench/gpu_linear.sh /tmp/qc
#
# Usage: scripts/gpu-pack.sh [BUILD] (default build). Run `make all tests` first.
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" .gpu
for f in qatcheck libqatcheck_cuda.so "$build/test_gpu" "$build/bench_gpu_linear"; do
  [ -e "$f" ] || { echo "gpu-pack: $f is missing: run 'make all tests' first" >&2; exit 2; }
  cp "$f" "$stage/"
  ldd "$f" | awk '/=>/ {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcudart*|libcublas*|libnccl*|libstdc++*|libgcc_s*) ;;
      *) cp -Ln "$lib" "$stage/lib/" ;;
    esac
  done
done
# the safetensors reader alone, for bench/contract.sh FORMAT=safetensors (ST_READ)
cc -O2 -std=c11 -D_GNU_SOURCE -Isrc $(pkg-config --cflags libcjson) bench/st_read.c src/io/safetensors.c src/io/safetensors_files.c src/core/file.c src/core/err.c \
  src/core/tensor.c -o "$stage/st_read" $(pkg-config --libs libcjson) -lm -lpthread
ldd "$stage/st_read" | awk '/=>/ {print $3}' | grep cjson | xargs -r -I{} cp -Ln {} "$stage/lib/" 2>/dev/null || true
strip --strip-unneeded "$stage"/* "$stage"/lib/* 2>/dev/null || true
# the wheels of transformers and its dependencies (scripts/install-deps.sh's
# pins; pure Python or manylinux), for gpu-verify.sh's hf_models check on a
# machine that lacks them and cannot reach a registry; best effort
mkdir -p .gpu/wheels
/usr/bin/python3 -m pip download -q --only-binary=:all: --no-deps -d .gpu/wheels "transformers==4.49.0" \
  "tokenizers==0.21.4" "huggingface-hub==0.36.2" "regex==2026.11.19" "tqdm==4.70.1" "filelock==4.3.1" \
  "fsspec==2026.9.0" "safetensors==0.8.0" "ml_dtypes==0.5.1" "packaging==26.4" "pyyaml==6.0.4" \
  "requests==2.34.2" "urllib3==2.8.0" "idna==3.20" "certifi==2026.10.19.post1" "charset-normalizer==3.5.3" >/dev/null 2>&1 ||
  echo "gpu-pack: could not download the transformers wheels: gpu-verify's hf_models check needs them on the GPU machine"
# the compiled ones again for CPython 3.12 (the GPU machine's Python may not be this one's)
/usr/bin/python3 -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .gpu/wheels \
  "regex==2026.11.19" "pyyaml==6.0.4" "charset-normalizer==3.5.3" >/dev/null 2>&1 ||
  echo "gpu-pack: could not download the CPython 3.12 wheels of regex, pyyaml and charset-normalizer"
tar -C "$stage" -cJf .gpu/bundle.tar.xz .
echo "gpu-pack: .gpu/bundle.tar.xz ($(du -h .gpu/bundle.tar.xz | cut -f1)); carry .gpu"
