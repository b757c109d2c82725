#!/bin/sh
# report_rejudge.sh: a report read back is evidence, not a verdict (issue
# #42, 1; docs/robustness.md, "Reports read back"). `qatcheck report` and
# --baseline re-judge every check from the metrics and bounds it records
# (the same qc_judge) and refuse, exit 2 with one line naming the file and
# the check: a check whose verdict is "FAIL" (not exactly "fail") under a
# "pass" verdict (it passed: "1 check(s), 1 failed (FAIL)", exit 0), any
# other word qatcheck does not write, a pass with no check (a vjp report
# emptied of its checks passed), a failed report with every verdict edited
# to "pass" (it passed, each check's metrics beyond its recorded bounds; the
# same as a --baseline of vjp and of report), a "pass" that records no
# metrics, a forged contract row, step check and sft pair. A check that
# says "fail" stays failed (exit 1) whatever its metrics say. The reports
# qatcheck writes (nine committed cases, fd, quant --identify with profiles
# that mismatch, which the old reader refused) are read back unchanged, and
# an audit of reports that judged nothing (a tol report alone) is no pass.
. "$(dirname "$0")/lib.inc"
$PY scripts/make_linear_dump.py "$T/bad.h5" --defects wrong_weight >/dev/null || { bad "make_linear_dump.py"; finish; }
printf '{"module": "linear", "data": {"dump": "bad.h5"}, "candidate": "dump", %s}\n' "$LIN_TOL" >"$T/bad.json"
"$QATCHECK" vjp --case cases/linear_dump.json --json "$T/pass.json" --quiet || bad "vjp: the passing report"
"$QATCHECK" vjp --case "$T/bad.json" --json "$T/fail.json" --quiet; [ $? -eq 1 ] || bad "vjp: the failing report"
# refused NAME NEEDLE...: `report NAME` exits 2 with one error line naming the file and each NEEDLE
refused() {
  f=$1; shift
  expect_exit 2 "$f is refused" "$QATCHECK" report "$T/$f" --json "$T/audit.json"
  [ "$(grep -c '^qatcheck: error:' "$T/err")" -eq 1 ] || bad "$f: expected one error line: $(cat "$T/err")"
  for needle in "$T/$f" "$@"; do
    grep '^qatcheck: error:' "$T/err" | grep -qF -- "$needle" || bad "$f: the line does not name '$needle': $(head -1 "$T/err")"
  done
  error_or_none "$T/audit.json" || bad "$f: the audit's JSON is not its error report"
}
# forge IN OUT PYTHON: OUT is report IN edited by the Python statements (r: the report)
forge() {
  $PY - "$T/$1" "$T/$2" "$3" <<'P' || bad "forging $2"
import json, sys
r = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(r, open(sys.argv[2], "w"), indent=1)
P
}

# ---- the reproductions ----------------------------------------------------------------
forge pass.json upper.json 'r["checks"][0]["verdict"] = "FAIL"'
refused upper.json 'check 1 (/model.layers.0.mlp.down_proj dy d_x)' '"verdict" is "FAIL"' 'expected exactly "pass" or "fail"'
forge pass.json empty.json 'r["checks"] = []; r["totals"].update(checks=0, passed=0)'
refused empty.json '"verdict" is "pass" but it holds no check'
forge fail.json edited.json '
r["verdict"] = "pass"
for c in r["checks"]: c["verdict"] = "pass"
r["totals"].update(passed=r["totals"]["checks"], failed=0)'
refused edited.json 'check 1 (/defect.wrong_weight dy d_x): says "pass" but its recorded metrics fail its recorded bounds: rel_l2 0.0519 > 0.004'
# the same report as a baseline: refused before the run, by vjp and by report
expect_exit 2 "vjp --baseline of the edited report is refused" "$QATCHECK" vjp --case cases/linear_dump.json --baseline "$T/edited.json"
grep -q "^qatcheck: error: --baseline '$T/edited.json': check 1 (/defect.wrong_weight dy d_x): says \"pass\"" "$T/err" \
  && ok "--baseline: the line names the file and the check" || bad "--baseline: $(head -1 "$T/err")"
grep -q "^vjp:" "$T/out" && bad "--baseline: the run went on" || ok "--baseline: refused before the run"
expect_exit 2 "report --baseline of the edited report is refused" "$QATCHECK" report "$T/pass.json" --baseline "$T/edited.json"
grep -q "^qatcheck: error: --baseline '$T/edited.json': check 1 " "$T/err" && ok "report --baseline: the line names the check" \
  || bad "report --baseline: $(head -1 "$T/err")"

# ---- every word is one qatcheck writes ----------------------------------------------------
forge pass.json word_pass.json 'r["checks"][2]["verdict"] = "Pass"'
refused word_pass.json 'check 3 (/model.layers.0.mlp.down_proj dy d_bias)' '"verdict" is "Pass"'
forge pass.json word_top.json 'r["verdict"] = "PASS"'
refused word_top.json '"verdict" is "PASS": expected exactly "pass", "fail" or "error"'
forge pass.json word_type.json 'r["checks"][1]["verdict"] = True'
refused word_type.json 'check 2 (' '"verdict" is not a string'
forge pass.json verb.json 'r["verb"] = "vjp2"'
refused verb.json "\"verb\" is 'vjp2'"

# ---- a pass is judged from what it records ----------------------------------------------------
forge pass.json nometrics.json 'del r["checks"][1]["metrics"]'
refused nometrics.json 'check 2 (/model.layers.0.mlp.down_proj dy d_weight): says "pass" but records no metrics'
forge pass.json notol.json 'del r["checks"][0]["tolerance"]'
refused notol.json 'check 1 (' 'records no bounds ("tolerance")'
forge pass.json tighter.json 'r["checks"][4]["tolerance"]["noise_multiple"] = r["checks"][4]["metrics"]["noise_multiple"] * 0.999'
refused tighter.json 'check 5 (' 'noise_multiple'
forge pass.json badbound.json 'r["checks"][0]["tolerance"]["rel_l2"] = "0.1"'
refused badbound.json 'tolerance "rel_l2" is not a number'
# a check that says fail stays failed, whatever its metrics say
forge pass.json saysfail.json 'r["checks"][0]["verdict"] = "fail"; r["verdict"] = "fail"; r["totals"].update(passed=r["totals"]["checks"] - 1, failed=1)'
expect_exit 1 "a check that says fail, its metrics within bounds, stays failed" "$QATCHECK" report "$T/saysfail.json"
grep -q "layer 1 (vjp): 6 check(s), 1 failed (FAIL)" "$T/out" && ok "the console counts it failed" || bad "console: $(cat "$T/out")"
expect_exit 1 "the real failing report fails" "$QATCHECK" report "$T/fail.json"
expect_exit 0 "the real passing report passes" "$QATCHECK" report "$T/pass.json" --allow-incomplete

# ---- contract rows, step checks, sft pairs ------------------------------------------------------
"$QATCHECK" contract --master-vs-dequant --dump cases/data/contract_ckpt.h5 --weight-format nvfp4 --cosine-min 0.999999 \
  --json "$T/c_fail.json" --quiet; [ $? -eq 1 ] || bad "contract: a failing sweep"
forge c_fail.json c_forged.json '
r["verdict"] = "pass"
for w in r["rows"]: w["verdict"] = "pass"
r["totals"].update(passed=r["totals"]["checks"], failed=0)'
refused c_forged.json '): says "pass" but its recorded metrics fail its recorded bounds: cosine'
forge c_fail.json c_loose.json '
r["options"]["cosine_min"] = None; r["verdict"] = "pass"
for w in r["rows"]: w["verdict"] = "pass"
r["totals"].update(passed=r["totals"]["checks"], failed=0)'
expect_exit 0 "contract: rows that pass the thresholds the report records are read as passed" "$QATCHECK" report "$T/c_loose.json" --allow-incomplete
cp tests/data/reports/step.json tests/data/reports/sft.json "$T/"
forge step.json step_forged.json 'r["checks"][0]["metrics"]["rel_l2"] = 1e-3'
refused step_forged.json 'check 1 (under_test /model.layers.0.mlp.down_proj.weight update): says "pass"' 'rel_l2 0.001 > 1e-05'
forge step.json step_frozen.json 'r["checks"][1]["verdict"] = "pass"; r["verdict"] = "pass"; r["totals"].update(passed=3, failed=0)'
refused step_frozen.json 'check 2 (under_test /model.layers.0.input_layernorm.weight frozen): says "pass" but records no bounds'
forge sft.json sft_forged.json 'p = r["pairs"][0]; p["verdict"] = "pass"; p["metrics"][0]["verdict"] = "fail"'
refused sft_forged.json 'pair 1 (' 'says "pass" but its metric'

# ---- a report that judged nothing is no pass --------------------------------------------------
"$QATCHECK" tol --out-dtype bfloat16 --k 64 --json "$T/tol.json" --quiet || bad "tol"
expect_exit 2 "an audit of a tol report alone is refused" "$QATCHECK" report "$T/tol.json"
grep -q "^qatcheck: error: report: the 1 report(s) given hold no judged check" "$T/err" && ok "the line says why" || bad "$(head -1 "$T/err")"
expect_exit 0 "a tol report beside a vjp report is listed" "$QATCHECK" report "$T/tol.json" "$T/pass.json" --allow-incomplete

# ---- what qatcheck writes is read back unchanged ------------------------------------------------
"$QATCHECK" fd --module rmsnorm --json "$T/fd.json" --quiet || bad "fd"
expect_exit 0 "an fd report is read back as its pass" "$QATCHECK" report "$T/fd.json" "$T/pass.json" --allow-incomplete
if $PY -c "import ml_dtypes" 2>/dev/null; then
  # --identify passes when one profile reproduces the bytes: the others' mismatches are no contradiction
  $PY scripts/make_quant_dump.py "$T/q.h5" nvfp4 --k 64 --n 32 >/dev/null || bad "make_quant_dump.py"
  "$QATCHECK" quant --dump "$T/q.h5" --module /lin --identify --json "$T/qi.json" --quiet || bad "quant --identify"
  grep -q '"mismatch"' "$T/qi.json" || bad "quant --identify: no profile mismatched"
  expect_exit 0 "a quant --identify report with mismatching profiles is read back as its pass" "$QATCHECK" report "$T/qi.json" "$T/pass.json" --allow-incomplete
  forge qi.json qi_none.json 'r["checks"] = [c for c in r["checks"] if c["result"] != "reproduced"]; r["totals"].update(checks=len(r["checks"]), passed=0, failed=len(r["checks"]))'
  refused qi_none.json '"verdict" is "pass" but 1 of its'
else
  echo "skip: ml_dtypes missing for $PY: quant --identify"
fi
for c in linear_fp8_block attention_gqa moe_swiglu_special router_sigmoid_special logprob_special ssd_groups rope conv1d; do
  "$QATCHECK" vjp --case "cases/$c.json" --json "$T/v_$c.json" --quiet || bad "vjp $c"
  "$QATCHECK" report "$T/v_$c.json" --allow-incomplete --quiet 2>"$T/err" && ok "$c: its report is read back as a pass" || bad "$c: $(head -1 "$T/err")"
done
finish
