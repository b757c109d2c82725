#!/bin/sh
# backend_abi.sh: `--device cuda` refuses a libqatcheck_cuda.so of another
# build before it calls anything in it (src/backend/open.c, the stamp of
# src/backend/backend.h): exit 2, one error line naming both ABI stamps and
# builds, a hint to rebuild both. Needs no GPU (nor nvcc): the other builds'
# backends are small fakes compiled here with cc, whose functions abort if
# they are ever called. And the stamp's hash covers the headers that cross
# the boundary (scripts/abi-headers.sh): a change to one of them changes it.
. "$(dirname "$0")/lib.inc"
CC=${CC:-cc}
command -v "$CC" >/dev/null 2>&1 || { echo "no C compiler ($CC): skipped"; exit 77; }
unset QATCHECK_CUDA_LIB
HASH=$(sh scripts/abi-headers.sh hash)
echo "$HASH" | grep -qx '[0-9a-f]\{16\}' || { bad "scripts/abi-headers.sh hash: '$HASH', expected 16 hex digits"; finish; }
FORGED=0123456789abcdef

# the set: the headers the issue found crossing unstamped are in it, the .so's own are not
sh scripts/abi-headers.sh list >"$T/list" || bad "scripts/abi-headers.sh list failed"
for h in src/backend/backend.h src/backend/cuda/cuda.h src/numerics/metrics.h src/numerics/recipe.h src/numerics/quant.h \
  src/numerics/qlayout.h src/core/qc.h; do
  grep -qx "$h" "$T/list" && ok "the stamp's hash covers $h" || bad "$h is not in the boundary: $(tr '\n' ' ' <"$T/list")"
done
grep -q -e '^kernels/' -e '^src/backend/cuda/cuda_priv.h' "$T/list" && bad "the .so's own headers are in the boundary: $(cat "$T/list")" \
  || ok "the .so's own headers (kernels/, cuda_priv.h) are not in the boundary"
# a change to a boundary header changes the hash; to a header of the .so alone, not
mkdir -p "$T/tree" && cp -r src kernels "$T/tree/"
[ "$(sh scripts/abi-headers.sh -C "$T/tree" hash)" = "$HASH" ] && ok "a copy of the tree has the same hash" || bad "a copy of the tree hashes differently"
echo '/* a change */' >>"$T/tree/src/numerics/recipe.h"
[ "$(sh scripts/abi-headers.sh -C "$T/tree" hash)" != "$HASH" ] && ok "a change to numerics/recipe.h changes the hash" \
  || bad "a change to numerics/recipe.h (qc_recipe) left the hash as it was"
cp src/numerics/recipe.h "$T/tree/src/numerics/recipe.h" && echo '/* a change */' >>"$T/tree/kernels/kernels.h"
[ "$(sh scripts/abi-headers.sh -C "$T/tree" hash)" = "$HASH" ] && ok "a change to kernels/kernels.h (the .so's own) does not" \
  || bad "a change to kernels/kernels.h changed the hash"
# a header newly included by the .so joins the set
printf '#include "numerics/new_boundary.h"\n' >>"$T/tree/src/backend/cuda/stamp.cu"
echo '/* new */' >"$T/tree/src/numerics/new_boundary.h"
sh scripts/abi-headers.sh -C "$T/tree" list | grep -qx src/numerics/new_boundary.h && ok "a header the .so newly includes joins the set" \
  || bad "a header the .so newly includes is not in the set"
# check: a boundary header the compiler read that the scan missed fails the link
printf 'x.o: src/io/config.h ./kernels/kernels.h src/backend/backend.h\n' >"$T/x.d"
sh scripts/abi-headers.sh check "$T/x.d" 2>"$T/check.err" && bad "check passed a header the scan missed" \
  || { grep -q 'src/io/config.h' "$T/check.err" && ok "check names a boundary header the scan missed" || bad "check: $(cat "$T/check.err")"; }

# fake NAME STAMP: a backend .so with that stamp initializer (empty: no stamp at
# all); OLD: in the format of the numbered ABIs (no hash; backend.h)
fake() {
  {
    echo '#include <stdint.h>'
    echo '#include <stdlib.h>'
    echo 'int qc_backend_cuda_open(int d, const void **o) { (void)d; (void)o; abort(); }'
    echo 'void qc_backend_cuda_close(const void *b) { (void)b; abort(); }'
    if [ "$3" = old ]; then
      echo "const struct { uint32_t abi, size; char build[56]; } qc_backend_cuda_stamp = $2;"
    elif [ -n "$2" ]; then
      echo "const struct { uint32_t format, size; char build[56]; char hash[32]; } qc_backend_cuda_stamp = $2;"
    fi
    [ -n "$4" ] && echo "void $4(void); void call_it(void) { $4(); }" # a function of an older qatcheck, gone from this one
  } >"$T/$1.c"
  "$CC" -shared -fPIC -o "$T/$1.so" "$T/$1.c" || bad "cannot build the fake backend $1"
}
fake forged "{3, 8, \"0.1.0-1a2b3c4\", \"$FORGED\"}"
fake stale "{2, 8, \"0.0.9-1a2b3c4\"}" old
fake nostamp ""
fake resized "{3, 1, \"0.1.0-1a2b3c4\", \"$HASH\"}"
fake unbound "{2, 8, \"0.0.9-1a2b3c4\"}" old qc_gone_from_this_build

# refused LIB NEEDLE DESC [ENV...]: vjp --device cuda with LIB exits 2, one error line matching NEEDLE, the hint
refused() {
  lib=$1; needle=$2; desc=$3
  expect_exit 2 "$desc" env QATCHECK_CUDA_LIB="$lib" "$QATCHECK" vjp --case cases/linear_bf16.json --device cuda
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] || bad "$desc: expected one error line: $(cat "$T/err")"
  grep 'qatcheck: error:' "$T/err" | grep -q -- "$needle" && ok "$desc: the line names both builds" || bad "$desc: $(cat "$T/err")"
  grep -q "^hint: rebuild both with 'make'" "$T/err" && ok "$desc: the hint says how to fix it" || bad "$desc: no rebuild hint: $(cat "$T/err")"
}
refused "$T/forged.so" "qatcheck: error: '$T/forged.so': backend ABI stamp $FORGED (built 0.1.0-1a2b3c4), qatcheck's ABI stamp is $HASH (built [0-9.]*-" \
  "a backend whose headers' hash differs is refused"
refused "$T/stale.so" "qatcheck: error: '$T/stale.so': backend ABI 2 (built 0.0.9-1a2b3c4), qatcheck's ABI stamp is $HASH (built [0-9.]*-" \
  "a backend of a numbered ABI (no hash) is refused"
refused "$T/nostamp.so" "'$T/nostamp.so': backend without an ABI stamp (built before stamps), qatcheck's ABI stamp is $HASH (built " \
  "a backend without a stamp is refused"
refused "$T/resized.so" "'$T/resized.so': backend ABI stamp $HASH with a 1-byte qc_backend (built 0.1.0-1a2b3c4), qatcheck's ABI stamp is $HASH with [0-9]* bytes" \
  "a backend whose qc_backend has another size is refused"
refused "$T/unbound.so" "'$T/unbound.so': backend ABI 2 (built 0.0.9-1a2b3c4), qatcheck's ABI stamp is $HASH" \
  "a stale backend that needs a function this qatcheck lacks is refused for its ABI"

# found beside the executable (no QATCHECK_CUDA_LIB): a copy of qatcheck with the forged .so next to it
mkdir -p "$T/bin"
cp "$QATCHECK" "$T/bin/qatcheck" && cp "$T/forged.so" "$T/bin/libqatcheck_cuda.so"
expect_exit 2 "the forged .so beside a copy of qatcheck is refused" "$T/bin/qatcheck" vjp --case cases/linear_bf16.json --device cuda
grep -q "'$T/bin/libqatcheck_cuda.so': backend ABI stamp $FORGED (built 0.1.0-1a2b3c4), qatcheck's ABI stamp is $HASH" "$T/err" \
  && ok "beside the copy: the line names both builds" || bad "beside the copy: $(cat "$T/err")"

# this build's own backend passes the stamp (then, without a GPU, fails for the device, not the ABI)
if [ -f libqatcheck_cuda.so ] && [ "$(basename "$QATCHECK")" = qatcheck ]; then
  env QATCHECK_CUDA_LIB="$(pwd)/libqatcheck_cuda.so" "$QATCHECK" vjp --case cases/linear_bf16.json --device cuda --quiet >"$T/out" 2>"$T/err"
  grep -q "backend ABI\|ABI stamp" "$T/err" && bad "this build's libqatcheck_cuda.so is refused: $(cat "$T/err")" \
    || ok "this build's libqatcheck_cuda.so passes the stamp check"
fi
finish
