#!/bin/sh
# mpi-pack.sh: Debian's Open MPI (mpirun, orted, libmpi, its components and
# PMIx) as a relocatable tree in .gpu/ompi.tar.xz, for a GPU machine that
# has no MPI (the device image), so `mpirun -np 1 qatcheck ... --device cuda`
# can run there (tests/e2e/gpu_mpi.sh). On that machine:
#
#   mkdir -p /tmp/ompi && tar -C /tmp/ompi -xJf .gpu/ompi.tar.xz
#   . /tmp/ompi/env.sh     # OPAL_PREFIX, PMIX_INSTALL_PREFIX, PATH, LD_LIBRARY_PATH
#
# Usage: scripts/mpi-pack.sh (needs openmpi-bin from Debian installed here).
set -eu
cd "$(dirname "$0")/.."
ML=/usr/lib/x86_64-linux-gnu/openmpi
PX=/usr/lib/x86_64-linux-gnu/pmix2
[ -d "$ML/lib" ] && [ -x /usr/bin/orterun ] || { echo "mpi-pack: Debian's Open MPI is not installed here" >&2; exit 2; }
st=$(mktemp -d)
trap 'rm -rf "$st"' EXIT
mkdir -p "$st/bin" "$st/lib/x86_64-linux-gnu" "$st/share" "$st/deps" .gpu
cp /usr/bin/orterun /usr/bin/orted "$st/bin/"
ln -s orterun "$st/bin/mpirun"
cp -a "$ML" "$st/lib/x86_64-linux-gnu/"
rm -rf "$st/lib/x86_64-linux-gnu/openmpi/include" "$st/lib/x86_64-linux-gnu/openmpi/lib/"*java* "$st/lib/x86_64-linux-gnu/openmpi/lib/"*.a
cp -a /usr/share/openmpi "$st/share/"
cp -a "$PX" "$st/pmix2"
rm -f "$st/pmix2/lib/"*.a
# every library they load but glibc's
find "$st" -type f \( -name '*.so*' -o -path '*/bin/*' \) | while read -r f; do
  ldd "$f" 2>/dev/null | awk '/=>/ && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
    *) [ -e "$st/deps/$(basename "$lib")" ] || cp -Ln "$lib" "$st/deps/" ;;
  esac
done
cat >"$st/env.sh" <<'E'
# source this file: the relocated Open MPI in this folder
P=$(cd "$(dirname "${QC_OMPI_ENV:-/tmp/ompi/env.sh}")" && pwd)
export OPAL_PREFIX=$P PMIX_INSTALL_PREFIX=$P/pmix2 PATH=$P/bin:$PATH
export LD_LIBRARY_PATH=$P/lib/x86_64-linux-gnu/openmpi/lib:$P/pmix2/lib:$P/deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
E
tar -C "$st" -cJf .gpu/ompi.tar.xz .
echo "mpi-pack: .gpu/ompi.tar.xz ($(du -h .gpu/ompi.tar.xz | cut -f1)); carry .gpu"
