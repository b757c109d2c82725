#!/bin/sh
# tol_cli.sh: `qatcheck tol` prints one JSON member with every key and the
# command line in its reasoning; bad options exit 2 with one error line.
. "$(dirname "$0")/lib.inc"
expect_exit 0 "tol derives a bf16 d_weight" "$QATCHECK" tol --out-dtype bfloat16 --k 4096 --tensor d_weight --scale 8
$PY - "$T/out" <<'P' || bad "tol output is not the expected JSON member"
import json, sys
o = json.load(open(sys.argv[1]))
t = o["d_weight"]
assert set(t) == {"rel_l2", "max_abs", "cosine_min", "norm_ratio", "noise_multiple", "reasoning"}, t
assert t["rel_l2"] == 0.00391 and t["norm_ratio"] == [0.99609, 1.00391], t
assert "derived by: qatcheck tol --out-dtype bfloat16 --k 4096 --tensor d_weight --scale 8" in t["reasoning"], t
P
expect_exit 0 "tol --help" "$QATCHECK" tol --help
for args in "--k 8" "--out-dtype bf16" "--out-dtype bfloat17 --k 8" "--out-dtype bf16 --k 0" \
            "--out-dtype bf16 --k 8.5" "--out-dtype bf16 --k 8 --margin 0.5" "--out-dtype bf16 --k 8 --margin 0" "--out-dtype bf16 --k 8 --lambda 0" "--out-dtype bf16 --k 8 --rounded-operands 3" \
            "--out-dtype bf16 --k 8 --format fp9" "--out-dtype bf16 --k 8 --bogus" "--out-dtype bf16 --k" \
            "--out-dtype bf16 --acc-dtype bf16 --k 100000"; do
  # shellcheck disable=SC2086
  expect_exit 2 "tol $args" "$QATCHECK" tol $args
  n=$(grep -c '^qatcheck: error: ' "$T/err")
  [ "$n" -eq 1 ] && [ ! -s "$T/out" ] || bad "tol $args: expected one error line and no output"
done
finish
