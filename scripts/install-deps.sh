#!/bin/sh
# install-deps.sh: install what qatcheck needs to build and test, if missing.
# Idempotent and quiet when everything is already there. Debian/Ubuntu, as root
# (or with sudo available).
set -eu
pkgs="build-essential pkg-config libcjson-dev libhdf5-dev libcriterion-dev libopenblas-dev python3 python3-pip python3-h5py python3-numpy python3-torch"
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
exit 0
