#!/bin/sh
# progress.sh: long runs show one progress line on stderr when it is a
# terminal (done / total, rate, ETA; redrawn in place, cleared at the end),
# and nothing at all otherwise (a CI log, a pipe) or under --quiet. The
# terminal is a pseudo-terminal from util-linux `script` (skipped, 77,
# without it).
. "$(dirname "$0")/lib.inc"
command -v script >/dev/null 2>&1 || { echo "util-linux script not installed"; exit 77; }
$PY scripts/make_linear_dump.py "$T/d.h5" --defects all >/dev/null || { bad "make_linear_dump.py"; finish; }
printf '{"module": "linear", "data": {"dump": "d.h5"}, "candidate": "dump", %s}\n' "$LIN_TOL" >"$T/defects.json"
CON="$QATCHECK contract --master-vs-dequant --dump cases/data/contract_ckpt.h5 --weight-format nvfp4"
on_tty() { script -qec "$1" /dev/null >"$T/tty" 2>&1; }
on_tty "$CON"
grep -q "contract: 55/55 units (100%), [0-9.e+]* units/s, ETA " "$T/tty" && ok "contract: units done / total, rate, ETA on a terminal" \
  || bad "contract progress: $(head -c 300 "$T/tty" | cat -v)"
grep -q "$(printf '\r\033\\[K')" "$T/tty" && ok "the line is redrawn in place and cleared" || bad "no carriage return and clear"
on_tty "$QATCHECK vjp --case $T/defects.json"
grep -q "vjp: 7/7 modules (100%)" "$T/tty" && ok "multi-module vjp: modules done / total" || bad "vjp progress: $(head -c 300 "$T/tty" | cat -v)"
on_tty "$CON --quiet"
[ ! -s "$T/tty" ] && ok "--quiet on a terminal: nothing" || bad "--quiet printed: $(head -c 200 "$T/tty" | cat -v)"
# not a terminal: nothing on stderr
$CON >"$T/out" 2>"$T/err"
[ ! -s "$T/err" ] && ok "stderr not a terminal: no progress" || bad "progress in a pipe: $(head -c 200 "$T/err" | cat -v)"
"$QATCHECK" vjp --case "$T/defects.json" >"$T/out" 2>"$T/err"
[ ! -s "$T/err" ] && ok "vjp, stderr not a terminal: no progress" || bad "vjp progress in a pipe: $(head -c 200 "$T/err" | cat -v)"
# QATCHECK_PROFILE: the backend seam's profile on stderr at the end, the verdict unchanged
QATCHECK_PROFILE=1 "$QATCHECK" vjp --case "$T/defects.json" --quiet >"$T/out" 2>"$T/err"; prc=$?
"$QATCHECK" vjp --case "$T/defects.json" --quiet >/dev/null 2>&1; nrc=$?
grep -q "^qatcheck: profile: cpu: [0-9.]* s since open, [0-9.]* s in the backend, [0-9.]* s outside it$" "$T/err" &&
  grep -qE "^qatcheck: profile: gemm_f64(_x)? +[1-9][0-9]* calls +[0-9.]+ s +[0-9.]+ GB$" "$T/err" && [ "$prc" = "$nrc" ] &&
  ok "QATCHECK_PROFILE: the seam's calls and times, the same exit ($prc)" || bad "profile: exit $prc vs $nrc: $(head -c 300 "$T/err")"
# --verbose: where each module's time went, and the run's phases (docs/gpu.md "Where the time goes")
"$QATCHECK" vjp --case "$T/defects.json" --verbose >"$T/out" 2>"$T/err"
n=$(grep -c "^qatcheck: /[a-z_.0-9]*: [0-9.]* s in all, [0-9.]* s of it waiting for its read, [0-9.]* s checking its inputs$" "$T/err")
f=$(grep -c "^qatcheck: /[a-z_.0-9]*: forward check [0-9.]* s$" "$T/err")
[ "$n" = 7 ] && [ "$f" = 7 ] && grep -q "^qatcheck: the backend opened in [0-9.]* s$" "$T/err" &&
  grep -q "^qatcheck: every module audited in [0-9.]* s$" "$T/err" && grep -q "^qatcheck: the reports written in [0-9.]* s$" "$T/err" &&
  ok "--verbose: each module's time in all, read, inputs and forward check; the run's phases" || bad "--verbose: $n modules' times, $f forward checks: $(head -c 400 "$T/err")"
finish
