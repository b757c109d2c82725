#!/bin/sh
# argv.sh: one reading of the command line (issue 37 section 1, issue 42
# section 7). The option table is the only parser: the report paths a run
# writes its error report to are read with the verb's own table (the
# pre-pass), so `vjp --json --case x.json` and `tol --dump --json x.json`
# exit 2 with one line and create no file; a value that starts with '-' is
# refused unless given as --opt=VALUE; `--` ends the options. Every number
# on the command line and in a numeric QATCHECK_* variable is range-checked:
# out of range or malformed, exit 2 with one line (and only the error
# report), never wrapped, clamped or read as 0.
. "$(dirname "$0")/lib.inc"
R="$(pwd)"
C="$R/cases/linear_dump.json"
W="$T/w"
mkdir "$W"

# one_line DESC: the last run printed exactly one line, "qatcheck: error: ...", on stderr
one_line() {
  n=$(grep -c '' "$T/err"); first=$(head -1 "$T/err")
  case "$first" in "qatcheck: error: "*) ;; *) bad "$1: stderr is not 'qatcheck: error: ...': $first"; return ;; esac
  [ "$n" -eq 1 ] && ok "$1: $first" || { bad "$1: $n lines on stderr, expected 1"; sed 's/^/      /' "$T/err"; }
}
# no_file DESC: the run left the scratch folder empty
no_file() {
  [ -z "$(ls -A "$W")" ] && ok "$1: no file created" || { bad "$1: created $(ls -A "$W" | tr '\n' ' ')"; rm -rf "${W:?}"/* "${W:?}"/.[!.]* "$W/--"*; }
}
# in_w EXIT DESC ARGS...: qatcheck ARGS in the scratch folder, its exit status checked
in_w() { want=$1; desc=$2; shift 2; (cd "$W" && expect_exit "$want" "$desc" "$QATCHECK" "$@"); }

# ---- the two reproductions: no report at a path the parse did not take as one
in_w 2 "vjp --json --case x.json" vjp --json --case x.json
one_line "vjp --json --case x.json"
grep -q "option '--json' needs a value: '--case' starts with '-'" "$T/err" || bad "the message does not name --json and --case"
no_file "vjp --json --case x.json"
in_w 2 "tol --dump --json x.json" tol --dump --json x.json
one_line "tol --dump --json x.json"
grep -q "option '--dump' needs a value: '--json' starts with '-'" "$T/err" || bad "the message does not name --dump and --json"
no_file "tol --dump --json x.json"
for v in vjp contract tol quant fd report sft step; do
  in_w 2 "$v --junit --json r.json" $v --junit --json r.json
  one_line "$v --junit --json r.json"
  no_file "$v --junit --json r.json"
done

# ---- a value that starts with '-': only as --opt=VALUE
in_w 0 "--json=-r.json" vjp --case "$C" --json=-r.json --quiet
grep -q '"verdict":[[:space:]]*"pass"' "$W/-r.json" && ok "the report at -r.json" || bad "no report at -r.json"
rm -f "$W/-r.json"
in_w 2 "--json -r.json" vjp --case "$C" --json -r.json
one_line "--json -r.json"
no_file "--json -r.json"
# a report path read before the refused value still gets the error report; none after it
in_w 2 "--json before a refused value" vjp --json r.json --case --bogus --junit r.xml
one_line "--json before a refused value"
error_or_none "$W/r.json" && [ -e "$W/r.json" ] && ok "r.json holds the error report" || bad "r.json: not the error report"
[ ! -e "$W/r.xml" ] && ok "no JUnit after the refused value" || bad "r.xml written after the refused value"
rm -f "$W/r.json"
# a NUMBER option's negative number is its value
expect_exit 0 "--cosine-min -1" "$QATCHECK" contract --master-vs-dequant --dump cases/data/contract_ckpt.h5 --weight-format fp8_block128 --cosine-min -1 --quiet

# ---- `--`: the end of the options
in_w 0 "vjp ... --" vjp --case "$C" --json r.json --quiet --
grep -q '"verdict":[[:space:]]*"pass"' "$W/r.json" && ok "-- at the end: the report written" || bad "-- at the end: no report"
rm -f "$W/r.json"
in_w 2 "vjp -- --json r.json" vjp --case "$C" -- --json r.json
one_line "vjp -- --json r.json"
grep -q "vjp: unexpected argument '--json' after '--'" "$T/err" || bad "the message does not name the argument after --"
no_file "vjp -- --json r.json"
"$QATCHECK" vjp --case "$C" --json "$W/-in.json" --quiet || bad "a vjp report for report"
in_w 0 "report --markdown a.md -- -in.json" report --markdown a.md --allow-incomplete --quiet -- -in.json
grep -q "^# " "$W/a.md" && ok "report read the input named -in.json" || bad "report: no audit from -in.json"
rm -f "$W/a.md" "$W/-in.json"

# ---- numbers: in their declared range, never wrapped or clamped
in_w 2 "--reference fast:4294967299 (wrapped to 3 before)" vjp --case "$C" --reference fast:4294967299 --json r.json
one_line "--reference fast:4294967299"
error_or_none "$W/r.json" || bad "--reference: a report other than the error report"
rm -f "$W/r.json"
expect_exit 0 "--reference fast:3" "$QATCHECK" vjp --case "$C" --reference fast:3 --quiet
expect_exit 2 "fd --directions 1000 (clamped to 100 before)" "$QATCHECK" fd --module rmsnorm --directions 1000
one_line "fd --directions 1000"
grep -q "option '--directions' is '1000': expected a whole number from 1 to 100" "$T/err" || bad "--directions: the range is not named"
expect_exit 2 "fd --seed 1.5 (truncated before)" "$QATCHECK" fd --module rmsnorm --seed 1.5
one_line "fd --seed 1.5"
expect_exit 2 "tol --rounded-operands 3" "$QATCHECK" tol --out-dtype bfloat16 --k 64 --rounded-operands 3
grep -q "option '--rounded-operands' is '3': expected a whole number from 0 to 2" "$T/err" || bad "--rounded-operands: $(cat "$T/err")"
expect_exit 2 "--timeout abc" "$QATCHECK" tol --out-dtype bfloat16 --k 64 --timeout abc
one_line "--timeout abc"
expect_exit 2 "--regression-factor 1" "$QATCHECK" report "$C" --regression-factor 1
grep -q "option '--regression-factor' is '1': expected a number above 1" "$T/err" || bad "--regression-factor: $(cat "$T/err")"

# ---- numeric environment variables: refused before any work, with the error report
env_bad() { # VAR=VALUE: refused with one line naming it, only the error report written
  rm -f "$W/r.json"
  (cd "$W" && env "$1" "$QATCHECK" vjp --case "$C" --json r.json >"$T/out" 2>"$T/err"); rc=$?
  [ $rc -eq 2 ] && ok "$1: exit 2" || bad "$1: exit $rc, expected 2"
  one_line "$1"
  grep -q "environment variable ${1%%=*} is '${1#*=}': expected" "$T/err" || bad "$1: the message does not name it"
  error_or_none "$W/r.json" && [ -e "$W/r.json" ] && ok "$1: the error report" || bad "$1: not the error report"
}
env_bad QATCHECK_RANK_TIMEOUT=abc   # read as 0 before: the stall check off
env_bad QATCHECK_RANK_TIMEOUT=-5
env_bad QATCHECK_THREADS=abc        # read as 1 thread before
env_bad QATCHECK_THREADS=0
env_bad QATCHECK_AHEAD=9            # clamped to 8 before
env_bad QATCHECK_MEM_FREE=-1        # 2^64 - 1 bytes before
env_bad QATCHECK_HDF5_DEADLINE=0    # ignored before
rm -f "$W/r.json"
expect_exit 0 "QATCHECK_THREADS=2 QATCHECK_AHEAD=1 taken" env QATCHECK_THREADS=2 QATCHECK_AHEAD=1 "$QATCHECK" vjp --case "$C" --quiet
finish
