#!/bin/sh
# backend_abi.sh: `--device cuda` refuses a libqatcheck_cuda.so of another
# build before it calls anything in it (src/backend/open.c, the stamp of
# src/backend/backend.h): exit 2, one error line naming both ABIs and builds,
# a hint to rebuild both. Needs no GPU: the stale backends are small fakes
# compiled here with cc, whose functions abort if they are ever called.
. "$(dirname "$0")/lib.inc"
CC=${CC:-cc}
command -v "$CC" >/dev/null 2>&1 || { echo "no C compiler ($CC): skipped"; exit 77; }
unset QATCHECK_CUDA_LIB
ABI=$(sed -n 's/^#define QC_BACKEND_ABI \([0-9][0-9]*\).*/\1/p' src/backend/backend.h)
[ -n "$ABI" ] || { bad "QC_BACKEND_ABI not found in src/backend/backend.h"; finish; }
OLD=$((ABI - 1))

# fake NAME STAMP: a backend .so with that stamp initializer (empty: no stamp at all)
fake() {
  {
    echo '#include <stdint.h>'
    echo '#include <stdlib.h>'
    echo 'int qc_backend_cuda_open(int d, const void **o) { (void)d; (void)o; abort(); }'
    echo 'void qc_backend_cuda_close(const void *b) { (void)b; abort(); }'
    [ -n "$2" ] && echo "const struct { uint32_t abi, size; char build[56]; } qc_backend_cuda_stamp = $2;"
    [ -n "$3" ] && echo "void $3(void); void call_it(void) { $3(); }" # a function of an older qatcheck, gone from this one
  } >"$T/$1.c"
  "$CC" -shared -fPIC -o "$T/$1.so" "$T/$1.c" || bad "cannot build the fake backend $1"
}
fake stale "{$OLD, 8, \"0.0.9-1a2b3c4\"}"
fake nostamp ""
fake resized "{$ABI, 1, \"0.1.0-1a2b3c4\"}"
fake unbound "{$OLD, 8, \"0.0.9-1a2b3c4\"}" qc_gone_from_this_build

# refused LIB NEEDLE DESC [ENV...]: vjp --device cuda with LIB exits 2, one error line matching NEEDLE, the hint
refused() {
  lib=$1; needle=$2; desc=$3
  expect_exit 2 "$desc" env QATCHECK_CUDA_LIB="$lib" "$QATCHECK" vjp --case cases/linear_bf16.json --device cuda
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] || bad "$desc: expected one error line: $(cat "$T/err")"
  grep 'qatcheck: error:' "$T/err" | grep -q -- "$needle" && ok "$desc: the line names both builds" || bad "$desc: $(cat "$T/err")"
  grep -q "^hint: rebuild both with 'make'" "$T/err" && ok "$desc: the hint says how to fix it" || bad "$desc: no rebuild hint: $(cat "$T/err")"
}
refused "$T/stale.so" "qatcheck: error: '$T/stale.so': backend ABI $OLD (built 0.0.9-1a2b3c4), qatcheck expects ABI $ABI (built [0-9.]*-" \
  "a backend of an older ABI is refused"
refused "$T/nostamp.so" "'$T/nostamp.so': backend without an ABI stamp (built before stamps), qatcheck expects ABI $ABI (built " \
  "a backend without a stamp is refused"
refused "$T/resized.so" "'$T/resized.so': backend ABI $ABI with a 1-byte qc_backend (built 0.1.0-1a2b3c4), qatcheck expects ABI $ABI with [0-9]* bytes" \
  "a backend whose qc_backend has another size is refused"
refused "$T/unbound.so" "'$T/unbound.so': backend ABI $OLD (built 0.0.9-1a2b3c4), qatcheck expects ABI $ABI" \
  "a stale backend that needs a function this qatcheck lacks is refused for its ABI"

# found beside the executable (no QATCHECK_CUDA_LIB): a copy of qatcheck with the stale .so next to it
mkdir -p "$T/bin"
cp "$QATCHECK" "$T/bin/qatcheck" && cp "$T/stale.so" "$T/bin/libqatcheck_cuda.so"
expect_exit 2 "the stale .so beside a copy of qatcheck is refused" "$T/bin/qatcheck" vjp --case cases/linear_bf16.json --device cuda
grep -q "'$T/bin/libqatcheck_cuda.so': backend ABI $OLD (built 0.0.9-1a2b3c4), qatcheck expects ABI $ABI" "$T/err" \
  && ok "beside the copy: the line names both builds" || bad "beside the copy: $(cat "$T/err")"

# this build's own backend passes the stamp (then, without a GPU, fails for the device, not the ABI)
if [ -f libqatcheck_cuda.so ] && [ "$(basename "$QATCHECK")" = qatcheck ]; then
  env QATCHECK_CUDA_LIB="$(pwd)/libqatcheck_cuda.so" "$QATCHECK" vjp --case cases/linear_bf16.json --device cuda --quiet >"$T/out" 2>"$T/err"
  grep -q "backend ABI\|ABI stamp" "$T/err" && bad "this build's libqatcheck_cuda.so is refused: $(cat "$T/err")" \
    || ok "this build's libqatcheck_cuda.so passes the stamp check"
fi
finish
