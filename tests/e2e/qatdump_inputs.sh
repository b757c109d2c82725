#!/bin/sh
# qatdump_inputs.sh: the dump helper's own dumps are accepted as written.
# Keyword-argument calls are captured (vjp then checks d_x); a [2, 24, 64]
# batch dY is 48 tokens for both `contract` and `vjp`; what the helper could
# not capture is named in `not_captured` (qatdump_inputs.py checks it);
# float8 bytes saved as torch.uint8 get their dtype, so `quant --dump`
# without --module reproduces them; a uint8 weight_q without one makes vjp
# exit 2 with a hint. Skips (77) without torch.
. "$(dirname "$0")/lib.inc"
. "$(dirname "$0")/qatdump.inc"
"$PY" -c "import ml_dtypes" 2>/dev/null || { echo "ml_dtypes missing (scripts/install-deps.sh)"; exit 77; }
"$PY" "$HERE/qatdump_inputs.py" "$T" || { bad "qatdump_inputs.py"; finish; }

tol_case "$T/kw.h5" '^/proj$' >"$T/kw.json" || bad "qatcheck tol"
expect_exit 0 "vjp passes the module called with x=h" "$QATCHECK" vjp --case "$T/kw.json" --json "$T/kw.r.json"
"$PY" -c "
import json, sys
t = sorted(c['tensor'] for c in json.load(open(sys.argv[1]))['checks'])
sys.exit(0 if t == ['d_bias', 'd_weight', 'd_x', 'y'] else 'checked %s' % t)" "$T/kw.r.json" || bad "keyword call: d_x (or the forward) not checked"

expect_exit 0 "contract takes the helper's [2, 24, 64] dY" "$QATCHECK" contract --master-vs-dequant --dump "$T/batch.h5" \
  --weight-format fp8_block128 --json "$T/b.json"
"$PY" -c "
import json, sys
s = json.load(open(sys.argv[1]))['rows'][0]['shape']
sys.exit(0 if s == [48, 64] else 'row shape %s' % s)" "$T/b.json" || bad "batch dY: expected 48 tokens"
tol_case "$T/batch.h5" '^/proj$' >"$T/batch.json" || bad "qatcheck tol"
expect_exit 0 "vjp passes the batched module" "$QATCHECK" vjp --case "$T/batch.json"

expect_exit 0 "quant --dump without --module reproduces uint8-saved fp8 bytes (dtype from the contract)" \
  "$QATCHECK" quant --dump "$T/fp8.h5"
grep -q "^/root .*reproduced" "$T/out" || bad "quant: /root not reproduced: $(cat "$T/out")"
expect_exit 0 "the same with qatcheck_dtypes and --format" "$QATCHECK" quant --dump "$T/fp8d.h5" --format fp8_block128

"$PY" -c "
import h5py, shutil, sys
shutil.copy(sys.argv[1], sys.argv[2])
with h5py.File(sys.argv[2], 'r+') as f: del f['root/saved/weight_q'].attrs['dtype']" "$T/fp8.h5" "$T/u8.h5"
cat >"$T/u8.json" <<JSON
{"data": {"dump": "u8.h5"}, "candidate": "dump", $LIN_TOL}
JSON
expect_exit 2 "vjp refuses a uint8 weight_q under an fp8 contract" "$QATCHECK" vjp --case "$T/u8.json" --json "$T/u8.r.json"
[ "$(grep -c '^qatcheck: error:' "$T/err")" -eq 1 ] || bad "uint8 weight_q: not one error line"
grep -q "saved/weight_q is uint8 without a 'dtype' attribute: expected float8_e4m3fn" "$T/err" || bad "uint8 weight_q: $(cat "$T/err")"
grep -q "^hint: .*qatcheck_dtypes" "$T/err" || bad "uint8 weight_q: no hint"
error_or_none "$T/u8.r.json" || bad "uint8 weight_q: a report was written other than its error report"
finish
