#!/bin/sh
# Bad input: every case exits 2 with one "qatcheck: error:" line naming the
# subject, no crash, and no report but the error report.
. "$(dirname "$0")/lib.inc"
$PY scripts/make_linear_dump.py "$T/d.h5" || exit 1
good_gen='"module": "linear", "data": {"generate": {"shapes": [[4, 8, 6]], "seed": 1}}'
# bad CASE-NAME EXPECTED-SUBSTRING: run the case file $T/CASE-NAME.json
bad_case() {
  name=$1; want=$2
  rm -f "$T/r.json"
  "$QATCHECK" vjp --case "$T/$name.json" --json "$T/r.json" >"$T/out" 2>"$T/err"; rc=$?
  first=$(head -1 "$T/err")
  if [ $rc -ne 2 ]; then bad "$name: exit $rc, expected 2"; sed 's/^/      /' "$T/err" "$T/out" | head -5; return; fi
  case "$first" in "qatcheck: error: "*) ;; *) bad "$name: first stderr line is not 'qatcheck: error: ...': $first"; return ;; esac
  if ! grep -qF -- "$want" "$T/err"; then bad "$name: message does not mention '$want': $first"; return; fi
  if ! error_or_none "$T/r.json"; then bad "$name: a report other than the error report was written"; return; fi
  n=$(grep -c '' "$T/err"); [ "$n" -le 2 ] || { bad "$name: $n lines on stderr"; return; }
  ok "$name: $first"
}
w() { printf '%s\n' "$2" >"$T/$1.json"; }

w malformed '{"module": "linear", "data": '
bad_case malformed "malformed JSON"
w unknown_key "{$good_gen, \"tolerance\": {}, $LIN_TOL}"
bad_case unknown_key "unknown key 'tolerance'"
w unknown_tol_key "{$good_gen, \"tolerances\": {\"d_x\": {\"rel_l2\": 1e-3, \"rell2\": 1, \"reasoning\": \"r\"}}}"
bad_case unknown_tol_key "unknown key 'rell2'"
w missing_tolerance "{$good_gen, \"tolerances\": {\"d_x\": {\"rel_l2\": 4e-3, \"reasoning\": \"r\"}, \"d_weight\": {\"rel_l2\": 4e-3, \"reasoning\": \"r\"}}}"
bad_case missing_tolerance "no tolerance for 'd_bias'"
w missing_reasoning "{$good_gen, \"tolerances\": {\"d_x\": {\"rel_l2\": 4e-3}}}"
bad_case missing_reasoning "'reasoning' is missing"
w no_tolerances "{$good_gen}"
bad_case no_tolerances "'tolerances' is missing"
w unknown_class "{\"module\": \"linaer\", \"data\": {\"generate\": {\"shapes\": [[4, 8, 6]]}}, $LIN_TOL}"
bad_case unknown_class "class 'linaer' is not known"
w bad_contract "{$good_gen, \"contract\": {\"weight_fromat\": \"none\"}, $LIN_TOL}"
bad_case bad_contract "unknown contract key 'weight_fromat'"
w bad_contract_value "{$good_gen, \"contract\": {\"dx_weight\": \"both\"}, $LIN_TOL}"
bad_case bad_contract_value "value 'both' is not allowed"
w missing_dump "{\"module\": \"linear\", \"data\": {\"dump\": \"nothere.h5\"}, \"candidate\": \"dump\", $LIN_TOL}"
bad_case missing_dump "nothere.h5"
head -c 3000 "$T/d.h5" >"$T/trunc.h5"
w truncated "{\"module\": \"linear\", \"data\": {\"dump\": \"trunc.h5\"}, \"candidate\": \"dump\", $LIN_TOL}"
bad_case truncated "trunc.h5"
printf 'not an hdf5 file' >"$T/text.h5"
w not_hdf5 "{\"module\": \"linear\", \"data\": {\"dump\": \"text.h5\"}, \"candidate\": \"dump\", $LIN_TOL}"
bad_case not_hdf5 "not an HDF5 file"
w no_modules "{\"module\": \"linear\", \"data\": {\"dump\": \"d.h5\", \"modules\": \"^/nothing\"}, \"candidate\": \"dump\", $LIN_TOL}"
bad_case no_modules "no module group matches"
w bad_regex "{\"module\": \"linear\", \"data\": {\"dump\": \"d.h5\", \"modules\": \"(\"}, \"candidate\": \"dump\", $LIN_TOL}"
bad_case bad_regex "modules regex '('"
w bad_shape "{\"module\": \"linear\", \"data\": {\"generate\": {\"shapes\": [[4, 8]]}}, $LIN_TOL}"
bad_case bad_shape "generate shape needs [M, K, N]"
w absurd "{\"module\": \"linear\", \"data\": {\"generate\": {\"shapes\": [[1000000000, 1000000, 8]]}}, $LIN_TOL}"
bad_case absurd "more than 2^40 elements"
w cand_dump_gen "{$good_gen, \"candidate\": \"dump\", $LIN_TOL}"
bad_case cand_dump_gen "candidate 'dump' needs data from a dump"
w bad_dy "{$good_gen, \"dy\": [\"gaussian\"], $LIN_TOL}"
bad_case bad_dy "'gaussian' is not a generated kind"
w bad_norm_ratio "{$good_gen, \"tolerances\": {\"d_x\": {\"norm_ratio\": [1.1, 0.9], \"reasoning\": \"r\"}}}"
bad_case bad_norm_ratio "norm_ratio"

# dumps with schema errors, made with h5py
$PY - "$T" <<'P'
import sys, h5py, numpy as np, shutil
T = sys.argv[1]
def copy(name):
    shutil.copy(f"{T}/d.h5", f"{T}/{name}.h5")
    return h5py.File(f"{T}/{name}.h5", "a")
with copy("wrong_dtype") as f:
    f["/model.layers.0.mlp.down_proj/inputs/x"].attrs["dtype"] = "bfloat8"
with copy("dtype_storage") as f:
    g = f["/model.layers.0.mlp.down_proj/params"]; del g["weight"]
    d = g.create_dataset("weight", data=np.zeros((64, 64), np.float32)); d.attrs["dtype"] = "bfloat16"
with copy("missing_dataset") as f:
    del f["/model.layers.0.mlp.down_proj/params/weight"]
with copy("shape_mismatch") as f:
    g = f["/model.layers.0.mlp.down_proj/params"]; del g["weight"]
    d = g.create_dataset("weight", data=np.zeros((64, 32), np.uint16)); d.attrs["dtype"] = "bfloat16"
with copy("rank_mismatch") as f:
    g = f["/model.layers.0.mlp.down_proj/params"]; del g["weight"]
    d = g.create_dataset("weight", data=np.zeros((2, 64, 64), np.uint16)); d.attrs["dtype"] = "bfloat16"
with copy("empty_tensor") as f:
    g = f["/model.layers.0.mlp.down_proj/inputs"]; del g["x"]
    d = g.create_dataset("x", data=np.zeros((0, 64), np.uint16)); d.attrs["dtype"] = "bfloat16"
with copy("dy_width") as f:
    g = f["/model.layers.0.mlp.down_proj/grad_out"]; del g["dy"]
    d = g.create_dataset("dy", data=np.zeros((48, 63), np.uint16)); d.attrs["dtype"] = "bfloat16"
with copy("no_root_attr") as f:
    del f.attrs["qatcheck_dump"]
with copy("bad_contract_attr") as f:
    f["/model.layers.0.mlp.down_proj"].attrs["contract"] = "{not json"
with copy("no_grad_out") as f:
    del f["/model.layers.0.mlp.down_proj/grad_out"]; del f["/model.layers.0.mlp.down_proj/grads"]
with copy("unknown_dump_class") as f:
    f["/model.layers.0.mlp.down_proj"].attrs["class"] = "convolution"
P
for d in wrong_dtype:"dtype='bfloat8'" dtype_storage:"does not match its storage" missing_dataset:"params/weight" \
         shape_mismatch:"does not match inputs/x" rank_mismatch:"has rank 3" empty_tensor:"is empty" dy_width:"dY 'dy'" \
         no_root_attr:"qatcheck_dump" bad_contract_attr:"not valid JSON" no_grad_out:"no upstream gradient" \
         unknown_dump_class:"class 'convolution' is not known"; do
  n=${d%%:*}; want=${d#*:}
  w "$n" "{\"data\": {\"dump\": \"$n.h5\", \"modules\": \"^/model\"}, \"candidate\": \"dump\", $LIN_TOL}"
  bad_case "$n" "$want"
done
w dy_not_there "{\"module\": \"linear\", \"data\": {\"dump\": \"d.h5\", \"modules\": \"^/model\"}, \"candidate\": \"dump\", \"dy\": [\"dy_other\"], $LIN_TOL}"
bad_case dy_not_there "grad_out/dy_other"

# command line
expect_exit 2 "no --case" "$QATCHECK" vjp
expect_exit 2 "unknown option" "$QATCHECK" vjp --case x.json --bogus
expect_exit 2 "unknown verb" "$QATCHECK" frobnicate
expect_exit 2 "the dump reader's marker run by hand" "$QATCHECK" --qc-dump-sandbox 1 2 3 4 5 /etc/passwd
[ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep -q "dump reader.*not a verb" "$T/err" && ok "the marker by hand: one line" || bad "the marker by hand: $(cat "$T/err")"
expect_exit 2 "no verb" "$QATCHECK"
expect_exit 2 "missing case file" "$QATCHECK" vjp --case "$T/none.json"
expect_exit 2 "bad --device" "$QATCHECK" vjp --case cases/linear_bf16.json --device tpu
expect_exit 2 "report into a missing folder" "$QATCHECK" vjp --case cases/linear_dump.json --json /nonexistent/dir/r.json
expect_exit 0 "--help" "$QATCHECK" vjp --help
expect_exit 0 "--version" "$QATCHECK" --version
finish
