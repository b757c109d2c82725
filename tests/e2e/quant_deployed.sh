#!/bin/sh
# quant_deployed.sh: `quant` reproduces oracle-made deployed bytes for every
# weight format, catches each planted byte defect (payload, negative zero,
# scale, global scale) with exit 1 and the first mismatch, refuses a scale of
# the wrong shape with exit 2, --identify names the producing profile, and
# vjp on such a dump adds a failed `quantizer` check; a candidate that used
# the master weight under a dequant contract fails on d_x.
. "$(dirname "$0")/lib.inc"
MK="$PY scripts/make_quant_dump.py"
$PY -c "import ml_dtypes" 2>/dev/null || { echo "ml_dtypes missing (scripts/install-deps.sh)"; exit 77; }
for f in fp8_tensor fp8_channel fp8_block128 fp8_block128_ue8m0 nvfp4 mxfp8 mxfp4; do
  $MK "$T/$f.h5" $f --k 161 --n 131 || bad "make $f"
  expect_exit 0 "quant reproduces $f" "$QATCHECK" quant --dump "$T/$f.h5" --module /lin
  $MK "$T/p.h5" $f --plant payload || bad "make $f payload"
  expect_exit 1 "quant catches a flipped $f payload element" "$QATCHECK" quant --dump "$T/p.h5" --module /lin
  grep -q "payload\[" "$T/out" || bad "$f payload mismatch not listed"
  $MK "$T/s.h5" $f --plant scale || bad "make $f scale"
  expect_exit 1 "quant catches a changed $f scale" "$QATCHECK" quant --dump "$T/s.h5" --module /lin
  grep -q "scale\[" "$T/out" || bad "$f scale mismatch not listed"
  $MK "$T/sh.h5" $f --plant scale_shape || bad "make $f scale_shape"
  expect_exit 2 "quant refuses a $f scale of the wrong shape" "$QATCHECK" quant --dump "$T/sh.h5" --module /lin
  grep -q "shape" "$T/err" || bad "$f wrong-shape message does not name the shape"
done
$MK "$T/nz.h5" fp8_block128 --plant negzero
expect_exit 1 "quant catches +0 where the serving cast keeps -0 (0x80)" "$QATCHECK" quant --dump "$T/nz.h5" --module /lin
grep -q "expected 0x80 found 0x00" "$T/out" || bad "negative zero mismatch not shown as bytes"
$MK "$T/g.h5" nvfp4 --plant global
expect_exit 1 "quant catches a changed nvfp4 global scale" "$QATCHECK" quant --dump "$T/g.h5" --module /lin
grep -q "global\[0\]" "$T/out" || bad "global-scale mismatch not listed"
# --identify: te-made group bytes are reproduced by te only
$MK "$T/te.h5" fp8_block128 --profile te
expect_exit 0 "quant --identify finds a profile" "$QATCHECK" quant --dump "$T/te.h5" --module /lin --identify
grep -q ": te$" "$T/out" || { bad "--identify did not name te alone"; cat "$T/out"; }
expect_exit 1 "te bytes do not pass as vllm" "$QATCHECK" quant --dump "$T/te.h5" --module /lin --profile vllm
$MK "$T/nan.h5" fp8_block128 && $PY -c "
import sys, h5py
f = h5py.File(sys.argv[1], 'r+'); d = f['lin/params/weight']; a = d[...]; a[2, 3] = 0x7fc0; d[...] = a; f.close()" "$T/nan.h5"
expect_exit 2 "a NaN master weight is refused, not mapped" "$QATCHECK" quant --dump "$T/nan.h5" --module /lin
grep -q "non-finite value nan at flat index 323" "$T/err" || bad "the NaN is not located"
expect_exit 2 "unknown format exits 2" "$QATCHECK" quant --dump "$T/te.h5" --module /lin --format fp9
expect_exit 2 "unknown profile exits 2" "$QATCHECK" quant --dump "$T/te.h5" --module /lin --profile vllm_rocm
# vjp: the quantizer check
cat > "$T/case.json" <<JSON
{"name": "deployed", "module": "linear", "data": {"dump": "p.h5"}, "candidate": "dump", $LIN_TOL}
JSON
expect_exit 1 "vjp fails the quantizer check on planted bytes" "$QATCHECK" vjp --case "$T/case.json"
grep -q "quantizer" "$T/out" || bad "vjp table has no quantizer row"
sed -i 's/"p.h5"/"mxfp4.h5"/' "$T/case.json"
expect_exit 0 "vjp passes a dump whose bytes and gradients follow the contract" "$QATCHECK" vjp --case "$T/case.json"
# the design card's defect: the candidate used the master weight for d_x
# under a dequant contract (deployed bytes are right, the gradient is not)
$MK "$T/master.h5" nvfp4 --m 64 --cand-weight master
sed -i 's/"[a-z0-9]*\.h5"/"master.h5"/' "$T/case.json"
expect_exit 1 "vjp fails d_x when the candidate used the master weight under dx_weight dequant" "$QATCHECK" vjp --case "$T/case.json"
grep "d_x" "$T/out" | grep -q FAIL || bad "the failed check is not d_x"
grep "quantizer" "$T/out" | grep -q pass || bad "the deployed bytes should pass"
finish
