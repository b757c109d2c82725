#!/bin/sh
# install-deps.sh: install what qatcheck needs to build and test, if missing.
# Idempotent and quiet when everything is already there. Debian/Ubuntu, as root
# (or with sudo available).
set -eu
# build: compilers, HDF5, cJSON, OpenBLAS (CBLAS), libyaml (layer 3 configs),
# zlib (gzip-compressed layer 3 logs),
# Open MPI (multi-process runs); tests: Criterion, clang (libFuzzer), chromium
# (the HTML report rendered headless); Python helpers: h5py, numpy, torch (CPU)
pkgs="build-essential pkg-config libcjson-dev libhdf5-dev libcriterion-dev libopenblas-dev libyaml-dev zlib1g-dev openmpi-bin libopenmpi-dev clang chromium fonts-dejavu-core libxml2-utils python3 python3-pip python3-h5py python3-numpy python3-torch python3-yaml"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "install-deps: installing:$missing"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# ml_dtypes: the independent element casts of the quantizer oracle
# (scripts/conformance/). 0.5.1 works with Debian's numpy 1.24; --no-deps so
# pip never replaces the system numpy that h5py is built against.
if ! /usr/bin/python3 -c "import ml_dtypes" 2>/dev/null; then
  echo "install-deps: installing ml_dtypes 0.5.1 (pip)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO /usr/bin/python3 -m pip install -q --break-system-packages --no-deps "ml_dtypes==0.5.1" >/dev/null 2>&1 ||
    echo "install-deps: could not install ml_dtypes: the quantizer e2e test will skip"
fi
# pip_pinned WHAT WARNING PIP-ARGS...: pip-install into Debian's python3
# with numpy held at Debian's version (h5py is built against it; never
# replace it); on failure say WARNING and go on (the tests that need it skip)
pip_pinned() {
  what=$1; warn=$2; shift 2
  echo "install-deps: installing $what (pip)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  c=$(mktemp)
  /usr/bin/python3 -c "import numpy; print('numpy==' + numpy.__version__)" >"$c" 2>/dev/null || : >"$c"
  $SUDO /usr/bin/python3 -m pip install -q --break-system-packages -c "$c" "$@" >/dev/null 2>&1 ||
    echo "install-deps: could not install $what: $warn"
  rm -f "$c"
}
# safetensors and tensorboard: the real writers of the checkpoints and event
# files the tests read
if ! /usr/bin/python3 -c "import safetensors, tensorboard" 2>/dev/null; then
  pip_pinned "safetensors and tensorboard" "the tests that need their files will skip" \
    "safetensors==0.8.0" "tensorboard==2.21.0"
fi
# transformers: whole models from a real model-definition library
# (scripts/qatdump_hf.py, tests/e2e/hf_models.sh). 4.49.0 is the newest that
# runs on Debian's torch 1.13 (4.50 imports torch.distributed.tensor, torch
# >= 2.5); its dependencies pinned to versions that install as wheels.
if ! /usr/bin/python3 -c "import transformers" 2>/dev/null; then
  pip_pinned "transformers 4.49.0" "the whole-model tests will skip" --only-binary=:all: "transformers==4.49.0" \
    "tokenizers==0.21.4" "huggingface-hub==0.36.2" "hf-xet==1.8.0" "regex==2026.11.19" "tqdm==4.70.1" \
    "filelock==4.3.1" "fsspec==2026.9.0"
fi
# torch 2 and transformers 5: what users run. Installed beside Debian's
# python3 (never into it: its numpy and h5py stay Debian's) under
# /opt/qatcheck/torch2, with their own numpy, h5py and safetensors; the tests
# that dump under it put it first with PYTHONPATH ($QC_TORCH2, tests/e2e/
# lib.inc) and skip (77) where it could not be installed. torch 2.11.0 is the
# GPU machine's release, transformers 5.23.0 the one users have (about 7 GB,
# two minutes from PyPI).
T2=${QC_TORCH2:-/opt/qatcheck/torch2}
if ! PYTHONPATH=$T2 /usr/bin/python3 -c "import torch, transformers, h5py; assert torch.__version__.startswith('2.11.0') and transformers.__version__ == '5.23.0'" 2>/dev/null; then
  echo "install-deps: installing torch 2.11.0 and transformers 5.23.0 under $T2 (pip, about 7 GB)"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO mkdir -p "$T2"
  $SUDO /usr/bin/python3 -m pip install -q --upgrade --target "$T2" --only-binary=:all: "torch==2.11.0" "transformers==5.23.0" \
    "h5py==3.16.0" "numpy==2.4.6" "safetensors==0.8.0" "ml_dtypes==0.7.0" >/dev/null 2>&1 ||
    echo "install-deps: could not install torch 2 / transformers 5: their tests will skip"
fi
exit 0
