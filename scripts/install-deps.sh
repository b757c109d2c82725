#!/bin/sh
# install-deps.sh: install what qatcheck needs to build and test, if missing.
# Idempotent and quiet when everything is already there. Debian/Ubuntu, as root
# (or with sudo available).
set -eu
pkgs="build-essential pkg-config libcjson-dev libhdf5-dev libcriterion-dev libopenblas-dev python3 python3-h5py python3-numpy python3-torch"
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
exit 0
