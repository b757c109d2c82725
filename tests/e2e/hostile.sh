#!/bin/sh
# hostile.sh: nothing silently unjudged, nothing unbounded, nothing stale
# after a signal (issue #29). A dump holding grads/d_bias without
# params/bias is refused naming d_bias (it ran 4 checks of 6 and passed); a
# vjp report edited to "verdict": "pass" over failed checks, or with totals
# that disagree with its checks, is refused by `report`; SIGINT, SIGTERM
# and SIGHUP end a hung run with exit 128+signo, one error line, and the
# error report at the --json path (not the previous run's pass); a YAML
# alias bomb and a 100,000-deep YAML config, a 2 GB sparse report,
# baseline and log are refused under a peak RSS of 200 MB in seconds;
# FIFOs as --baseline (before --timeout), report input, --calibration and
# inside a calibration folder are refused, never waited on; an SVG plot
# path that is a symbolic link is refused; libhdf5 hung on a 7 KB dump is
# stopped in seconds without QATCHECK_HDF5_DEADLINE.
. "$(dirname "$0")/lib.inc"
unset QATCHECK_HDF5_DEADLINE
RSS_CAP_KB=204800 # 200 MB: the hostile inputs below must stay under it
# one_line DESC NEEDLE: exactly one error line in $T/err, naming NEEDLE
one_line() {
  [ "$(grep -c '^qatcheck: error:' "$T/err")" -eq 1 ] || bad "$1: expected one error line: $(head -3 "$T/err")"
  grep '^qatcheck: error:' "$T/err" | grep -q -- "$2" && ok "$1: the line names '$2'" || bad "$1: the message does not name '$2': $(head -2 "$T/err")"
}
# rss DESC NEEDLE CMD...: exit 2 within 30 s, one line naming NEEDLE, peak RSS under the cap
rss() {
  desc=$1; needle=$2; shift 2
  "$PY" -c '
import resource, subprocess, sys
try:
    r = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=open(sys.argv[1], "w"), timeout=30).returncode
except subprocess.TimeoutExpired:
    r = 124
print(r, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$T/err" "$@" >"$T/rss"
  read -r code kb <"$T/rss"
  [ "$code" = 2 ] && ok "$desc (exit 2)" || bad "$desc: exit $code, expected 2: $(head -2 "$T/err")"
  [ "$kb" -lt "$RSS_CAP_KB" ] && ok "$desc: peak RSS $kb KB, under $RSS_CAP_KB KB" || bad "$desc: peak RSS $kb KB, over $RSS_CAP_KB KB"
  one_line "$desc" "$needle"
}

# ---- 1. a gradient the dump holds and the case declares is judged or refused ---------
$PY scripts/make_linear_dump.py "$T/nobias.h5" >/dev/null || { bad "make_linear_dump.py"; finish; }
$PY - "$T/nobias.h5" <<'P' || { bad "h5py: cannot remove params/bias"; finish; }
import sys; sys.path.insert(0, "scripts"); import qcpython; qcpython.need("h5py"); import h5py
with h5py.File(sys.argv[1], "a") as f:
    del f["model.layers.0.mlp.down_proj/params/bias"]
P
printf '{"module": "linear", "data": {"dump": "nobias.h5"}, "candidate": "dump", %s}\n' "$LIN_TOL" >"$T/nobias.json"
rm -f "$T/nobias.r.json"
expect_exit 2 "grads/d_bias without params/bias is refused" "$QATCHECK" vjp --case "$T/nobias.json" --json "$T/nobias.r.json"
one_line "grads/d_bias without params/bias" "d_bias"
error_or_none "$T/nobias.r.json" && ok "only its error report" || bad "a report other than the error report"

# ---- 2. `report` recomputes the verdict from the checks --------------------------------
$PY scripts/make_linear_dump.py "$T/bad.h5" --defects wrong_weight >/dev/null || { bad "make_linear_dump.py"; finish; }
printf '{"module": "linear", "data": {"dump": "bad.h5"}, "candidate": "dump", %s}\n' "$LIN_TOL" >"$T/bad.json"
expect_exit 1 "a defective dump fails" "$QATCHECK" vjp --case "$T/bad.json" --json "$T/fail.r.json"
$PY - "$T/fail.r.json" "$T/forged.json" "$T/totals.json" <<'P'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verdict"] == "fail" and any(c["verdict"] == "fail" for c in r["checks"])
r["verdict"] = "pass"
json.dump(r, open(sys.argv[2], "w"))
for c in r["checks"]: c["verdict"] = "pass"
json.dump(r, open(sys.argv[3], "w"))  # totals still count the failures
P
expect_exit 2 "report: a forged \"pass\" over failed checks is refused" "$QATCHECK" report "$T/forged.json" --markdown "$T/a.md"
one_line "forged pass" "contradicts itself: \"verdict\" is \"pass\" but"
grep -q "forged.json" "$T/err" && ok "the line names the file" || bad "the line does not name the file: $(cat "$T/err")"
expect_exit 2 "report: totals that disagree with the checks are refused" "$QATCHECK" report "$T/totals.json"
one_line "totals" "contradicts itself: \"totals\" says"
expect_exit 1 "report: the real failing report still fails" "$QATCHECK" report "$T/fail.r.json"

# ---- 3. signals: exit 128+signo, one line, the error report at the path ------------------
SO=$(pwd)/build/plugins/linear_plugin.so
if [ -f "$SO" ]; then
  printf '{"module": "linear", "data": {"generate": {"shapes": [[4, 8, 8]]}}, "candidate": "builtin", %s}\n' "$LIN_TOL" >"$T/ok.json"
  printf '{"module": "linear", "data": {"generate": {"shapes": [[4, 8, 8]]}}, "candidate": {"plugin": "%s", "symbol": "linear_vjp_hangs"}, %s}\n' \
    "$SO" "$LIN_TOL" >"$T/hangs.json"
  for sig in INT:2 TERM:15 HUP:1; do
    num=${sig#*:}
    sig=${sig%:*}
    expect_exit 0 "a passing run writes r.json" "$QATCHECK" vjp --case "$T/ok.json" --json "$T/r.json"
    # started with the signal's default action (a shell's background job ignores SIGINT)
    $PY -c 'import os, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(s, signal.SIG_DFL)
os.execv(sys.argv[1], sys.argv[1:])' "$QATCHECK" vjp --case "$T/hangs.json" --json "$T/r.json" >"$T/out" 2>"$T/err" &
    pid=$!
    sleep 2
    kill -$sig $pid
    wait $pid
    code=$?
    want=$((128 + num))
    [ "$code" = "$want" ] && ok "SIG$sig: exit $code" || bad "SIG$sig: exit $code, expected $want"
    one_line "SIG$sig" "interrupted by SIG$sig"
    grep -q '"verdict":[[:space:]]*"error"' "$T/r.json" && grep -q "interrupted by SIG$sig" "$T/r.json" &&
      ok "SIG$sig: r.json holds the error report" || bad "SIG$sig: r.json is not the error report: $(head -c 300 "$T/r.json")"
  done
else
  echo "skip: $SO not built (make tests): signals"
fi

# ---- 4. unbounded inputs: size, depth and expansion limits, peak RSS -----------------------
D="$T/sft"
mkdir -p "$D"
for a in ut ref base; do
  printf '{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.9}\n' >"$D/$a.jsonl"
  printf 'lr: 1.0e-5\n' >"$D/$a.yaml"
done
$PY - "$D/ut.yaml" "$D/deep.yaml" <<'P'
import sys
# the alias bomb: 9 levels of nine aliases (9^9 values once expanded), under 500 bytes
lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
for i in range(1, 10):
    lines.append("a%d: &a%d [%s]" % (i, i, ",".join(["*a%d" % (i - 1)] * 9)))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
open(sys.argv[2], "w").write("a: " + "[" * 100000 + "]" * 100000 + "\n")
P
sft_case() { # sft_case CONFIG: the three arms, under_test's config CONFIG
  cat >"$D/case.json" <<J
{"arms": {"under_test": {"log": "ut.jsonl", "config": "$1", "keys": {"lr": "lr"}},
          "gradient_reference": {"log": "ref.jsonl", "config": "ref.yaml", "keys": {"lr": "lr"}},
          "native_baseline": {"log": "base.jsonl", "config": "base.yaml", "keys": {"lr": "lr"}}},
 "window": [1, 2],
 "pairs": {"under_test~gradient_reference": [{"metric": "loss", "pointwise_abs": 0.01, "reasoning": "test"}]}}
J
}
sft_case ut.yaml
rss "sft: a 478-byte YAML alias bomb" "aliases expand to more than" "$QATCHECK" sft --case "$D/case.json"
sft_case deep.yaml
rss "sft: a 100,000-deep YAML config" "nested deeper than 64 levels" "$QATCHECK" sft --case "$D/case.json"
truncate -s 2G "$T/sparse.json" "$D/sparse.jsonl"
rss "report: a 2 GB sparse file" "larger than the limit" "$QATCHECK" report "$T/sparse.json"
rss "--baseline: a 2 GB sparse file" "larger than the limit" "$QATCHECK" vjp --case "$T/ok.json" --baseline "$T/sparse.json"
sft_case ref.yaml
sed 's/"log": "ut.jsonl"/"log": "sparse.jsonl"/' "$D/case.json" >"$D/big.json"
rss "sft: a 2 GB sparse log" "larger than the limit" "$QATCHECK" sft --case "$D/big.json"
rm -f "$T/sparse.json" "$D/sparse.jsonl"

# ---- 5. FIFOs where the input is not the case or the dump ---------------------------------
mkfifo "$T/fifo" "$T/calib.qcal"
mkdir -p "$T/cal" && mkfifo "$T/cal/a.qcal"
expect_exit 2 "--baseline FIFO, --timeout after it" timeout 20 "$QATCHECK" vjp --case "$T/ok.json" --baseline "$T/fifo" --timeout 60
one_line "--baseline FIFO" "a FIFO"
expect_exit 2 "report FIFO" timeout 20 "$QATCHECK" report "$T/fifo"
one_line "report FIFO" "a FIFO"
expect_exit 2 "quant --calibration FIFO" timeout 20 "$QATCHECK" quant --calibration "$T/calib.qcal"
one_line "quant --calibration FIFO" "a FIFO"
expect_exit 2 "quant --calibration with a FIFO inside the folder" timeout 20 "$QATCHECK" quant --calibration "$T/cal"
one_line "a FIFO inside the calibration folder" "a FIFO"

# ---- 7. a plot path that is a symbolic link; libhdf5 hung on a small dump -------------------
$PY - "$D" <<'P'
import sys
for a, k in (("ut", 1.5), ("ref", 1.0), ("base", 1.0)):
    open("%s/%s.jsonl" % (sys.argv[1], a), "w").write("".join('{"step": %d, "loss": %g}\n' % (s, k / s) for s in range(1, 9)))
P
sed 's/"window": \[1, 2\]/"window": [1, 8]/' "$D/case.json" >"$D/plot.json"
mkdir -p "$D/md"
"$QATCHECK" sft --case "$D/plot.json" --markdown "$D/md/a.md" >/dev/null 2>&1
plot=$(ls "$D/md/"*.svg 2>/dev/null | head -1)
if [ -n "$plot" ]; then
  rm -f "$plot"
  echo "keep" >"$T/target.txt"
  ln -s "$T/target.txt" "$plot"
  expect_exit 2 "sft: a plot path that is a symbolic link is refused" "$QATCHECK" sft --case "$D/plot.json" --markdown "$D/md/a.md"
  one_line "symlinked plot" "is a symbolic link"
  [ -L "$plot" ] && [ "$(cat "$T/target.txt")" = keep ] && ok "the link and its target are untouched" || bad "the link or its target changed"
else
  bad "sft --markdown wrote no plot to link"
fi
SRC=cases/data/linear_small.h5
$PY -c 'import sys; b=bytearray(open(sys.argv[1],"rb").read()); b[0x960]=0; open(sys.argv[2],"wb").write(b)' "$SRC" "$T/hang.h5"
printf '{"module": "linear", "data": {"dump": "hang.h5"}, "candidate": "dump", %s}\n' "$LIN_TOL" >"$T/hang.json"
t0=$(date +%s)
expect_exit 2 "libhdf5 hung on a 7 KB dump, no QATCHECK_HDF5_DEADLINE" timeout 120 "$QATCHECK" vjp --case "$T/hang.json"
t1=$(date +%s)
one_line "hung libhdf5" "libhdf5 hung for 4 s reading"
[ $((t1 - t0)) -le 45 ] && ok "stopped after $((t1 - t0)) s" || bad "took $((t1 - t0)) s"
finish
