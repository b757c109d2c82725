#!/bin/sh
# reports_trust.sh: reports CI can trust, for every verb. A run that exits 2
# replaces each requested report with its error report (JSON verdict
# "error", JUnit with one <error>, Markdown saying so), never leaves an
# older report standing, and touches no other file. A report path must be a
# regular file or absent: a character device (/dev/full, the reproducer),
# a FIFO, a directory, a symbolic link, a path under a file or in a missing
# folder are refused before any work. A 1,204-character path writes its
# report without touching a sibling file the old fixed-size temporary name
# collided with; an unwritable --junit leaves the JSON (its error report) and
# the user's other files alone; a report that cannot be written at commit
# (a file size limit) falls back to the error report; no temporary is left
# and the orphans of a killed run are removed; a report path naming an
# input is refused.
. "$(dirname "$0")/lib.inc"
R="$(pwd)"
$PY scripts/make_linear_dump.py "$T/d.h5" --defects none >/dev/null || { bad "make_linear_dump.py"; finish; }
have_quant=0
$PY -c "import ml_dtypes" 2>/dev/null && have_quant=1
[ $have_quant = 1 ] && { $PY scripts/make_quant_dump.py "$T/q.h5" nvfp4 --k 64 --n 32 >/dev/null || bad "make_quant_dump.py"; }
"$QATCHECK" vjp --case cases/linear_dump.json --json "$T/in.json" --quiet || bad "a vjp report for the report verb"

# a passing run and a run that exits 2, per verb
args_pass() {
  case $1 in
    vjp) echo "vjp --case cases/linear_dump.json" ;;
    contract) echo "contract --master-vs-dequant --dump cases/data/contract_ckpt.h5 --weight-format fp8_block128" ;;
    tol) echo "tol --out-dtype bfloat16 --k 64" ;;
    quant) echo "quant --dump $T/q.h5 --module /lin" ;;
    fd) echo "fd --module rmsnorm" ;;
    report) echo "report $T/in.json --allow-incomplete" ;;
  esac
}
args_bad() {
  case $1 in
    vjp) echo "vjp --case $T/none.json" ;;
    contract) echo "contract --master-vs-dequant --dump $T/none.h5" ;;
    tol) echo "tol --out-dtype bfloat16 --k 0" ;;
    quant) echo "quant --dump $T/none.h5 --module /lin" ;;
    fd) echo "fd --module no_such_class" ;;
    report) echo "report cases/linear_dump.json" ;;   # a case file, not a report
  esac
}
# is_error_reports DIR VERB: DIR/r.{json,xml,md} are the error reports of VERB
is_error_reports() {
  $PY - "$1" "$2" <<'P'
import json, sys, xml.etree.ElementTree as ET
d, verb = sys.argv[1:3]
r = json.load(open(d + "/r.json"))
assert r["verdict"] == "error" and r["verb"] == verb and r["error"], r
assert r["totals"]["checks"] == 0 and r["totals"]["errors"] == 1, r["totals"]
assert r["command_line"][0] == verb and "inputs" in r, r
x = ET.parse(d + "/r.xml").getroot()
assert x.get("tests") == "1" and x.get("errors") == "1" and x.get("failures") == "0", x.attrib
assert len(x.findall(".//testcase")) == 1 and len(x.findall(".//testcase/error")) == 1, "one <error> testcase"
assert x.find(".//error").get("message") == r["error"] or x.find(".//error").get("message").startswith(r["error"])
md = open(d + "/r.md").read()
assert md.startswith(f"# qatcheck {verb}: error") and r["error"].split(":")[0] in md, md[:200]
P
}

for v in vjp contract tol quant fd report; do
  if [ $v = quant ] && [ $have_quant = 0 ]; then echo "skip quant: ml_dtypes missing"; continue; fi
  mkdir -p "$T/$v"
  # shellcheck disable=SC2046
  "$QATCHECK" $(args_pass $v) --json "$T/$v/r.json" --junit "$T/$v/r.xml" --markdown "$T/$v/r.md" --quiet
  [ $? -le 1 ] && grep -q '"verdict":[[:space:]]*"pass"' "$T/$v/r.json" || bad "$v: the passing run's report"
  echo "unrelated" >"$T/$v/other.txt"
  before=$(cd "$T/$v" && ls -a | sort | tr '\n' ' ')
  # the run that exits 2 replaces the passing reports with its error reports
  # shellcheck disable=SC2046
  expect_exit 2 "$v: a run that cannot be judged" "$QATCHECK" $(args_bad $v) --json "$T/$v/r.json" --junit "$T/$v/r.xml" --markdown "$T/$v/r.md"
  is_error_reports "$T/$v" $v && ok "$v: every requested report is the error report" || bad "$v: the reports of a run that exits 2"
  [ "$(cat "$T/$v/other.txt")" = unrelated ] && [ "$(cd "$T/$v" && ls -a | sort | tr '\n' ' ')" = "$before" ] \
    || bad "$v: a run that exits 2 touched another file: $(cd "$T/$v" && ls -a | tr '\n' ' ')"
  # an option error stops before the verb reads its report options: replaced all the same
  # shellcheck disable=SC2046
  "$QATCHECK" $(args_pass $v) --json "$T/$v/r.json" --junit "$T/$v/r.xml" --markdown "$T/$v/r.md" --quiet
  # shellcheck disable=SC2046
  expect_exit 2 "$v: an unknown option before the report options" "$QATCHECK" $v --no-such-option $(args_pass $v | cut -d' ' -f2-) \
    --json "$T/$v/r.json" --junit "$T/$v/r.xml" --markdown "$T/$v/r.md"
  is_error_reports "$T/$v" $v && ok "$v: replaced after an option error" || bad "$v: an option error left an older report"
done

# refused before any work: the linear_nvfp4 case runs for a minute; a refusal is immediate
NVFP4=cases/linear_nvfp4.json
refused() { # DESC NEEDLE ARGS...: exit 2 at once, one line naming NEEDLE
  desc=$1; needle=$2; shift 2
  t0=$(date +%s)
  expect_exit 2 "$desc" timeout 30 "$QATCHECK" "$@"
  el=$(( $(date +%s) - t0 ))
  [ $el -le 5 ] || bad "$desc: refused after ${el} s, not before the work"
  grep -q "$needle" "$T/err" || bad "$desc: the message does not say '$needle': $(cat "$T/err")"
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] || bad "$desc: expected one error line: $(cat "$T/err")"
}
refused "--json /dev/full (the reproducer)" "is a character device" vjp --case $NVFP4 --json /dev/full
[ -c /dev/full ] && ok "/dev/full is still a character device" || bad "/dev/full was replaced"
if mknod "$T/chardev" c 1 3 2>/dev/null; then
  refused "--json at another character device" "is a character device" vjp --case $NVFP4 --json "$T/chardev"
  [ -c "$T/chardev" ] || bad "the character device was replaced"
fi
mkfifo "$T/fifo"
refused "--junit at a FIFO (no hang)" "is a FIFO" vjp --case $NVFP4 --junit "$T/fifo"
[ -p "$T/fifo" ] || bad "the FIFO was replaced"
mkdir "$T/adir"
refused "--markdown at a directory" "is a directory" vjp --case $NVFP4 --markdown "$T/adir"
refused "--json at a path ending in /" "names a folder" vjp --case $NVFP4 --json "$T/adir/"
echo keep >"$T/target"
ln -s "$T/target" "$T/link"
refused "--json at a symbolic link" "is a symbolic link" vjp --case $NVFP4 --json "$T/link"
[ -L "$T/link" ] && [ "$(cat "$T/target")" = keep ] || bad "the link or its target changed"
refused "--json in a missing folder" "does not exist" vjp --case $NVFP4 --json "$T/nodir/r.json"
refused "--json under a regular file" "cannot use" vjp --case $NVFP4 --json "$T/target/r.json"
refused "--html at a FIFO for report" "is a FIFO" report "$T/in.json" --html "$T/fifo"
refused "two reports at one path" "name the same file" vjp --case $NVFP4 --json "$T/same" --junit "$T/same"
cp cases/linear_dump.json "$T/case.json"
sed -i "s|data/linear_small.h5|$R/cases/data/linear_small.h5|" "$T/case.json"
cp "$T/case.json" "$T/case.orig"
expect_exit 2 "a report path naming the case" "$QATCHECK" vjp --case "$T/case.json" --json "$T/case.json"
grep -q "a report would overwrite an input" "$T/err" || bad "the input clash message: $(cat "$T/err")"
cmp -s "$T/case.json" "$T/case.orig" && ok "the case file is untouched" || bad "the case file was overwritten"

# a 1,204-character path next to the sibling the old 1200-byte temporary name collided with
p="$T/long"
while [ ${#p} -lt 1100 ]; do p="$p/dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"; done
mkdir -p "$p"
n=$((1204 - ${#p} - 1))
leaf=$(printf 'r%.0s' $(seq $n))
long="$p/$leaf"
[ ${#long} -eq 1204 ] || bad "the long path has ${#long} characters"
sib=$(printf '%s' "$long" | cut -c1-1199)
echo "the user's file" >"$sib"
expect_exit 0 "vjp --json at a 1,204-character path" "$QATCHECK" vjp --case cases/linear_dump.json --json "$long" --quiet
grep -q '"verdict":[[:space:]]*"pass"' "$long" && ok "the report at the long path" || bad "no report at the long path"
[ "$(cat "$sib")" = "the user's file" ] && ok "the sibling file is untouched" || bad "the sibling file was overwritten"
[ "$(ls -a "$p" | grep -c qctmp)" -eq 0 ] || bad "a temporary left beside the long path"

# an unwritable --junit: the JSON takes the error report (not deleted), other files untouched
mkdir "$T/keep"
echo '{"old": "report"}' >"$T/keep/r.json"
echo "earlier notes" >"$T/keep/notes.md"
expect_exit 2 "an unwritable --junit" "$QATCHECK" vjp --case cases/linear_dump.json --json "$T/keep/r.json" --junit "$T/nodir/r.xml"
grep -q '"verdict":[[:space:]]*"error"' "$T/keep/r.json" && ok "the JSON path holds the error report" || bad "the JSON path: $(head -c 200 "$T/keep/r.json")"
[ "$(cat "$T/keep/notes.md")" = "earlier notes" ] && [ "$(ls -a "$T/keep" | wc -l)" -eq 4 ] || bad "other files changed: $(ls -a "$T/keep")"

# a report that cannot be written at commit (a file size limit: the writes fail) falls back to the error report
mkdir "$T/fsz"
( trap '' XFSZ; ulimit -f 2; "$QATCHECK" vjp --case cases/linear_dump.json --json "$T/fsz/r.json" --junit "$T/fsz/r.xml" >"$T/out" 2>"$T/err" ); rc=$?
[ $rc -eq 2 ] && grep -q "cannot write" "$T/err" && ok "a failed write exits 2 naming the report" || bad "a failed write: exit $rc: $(cat "$T/err")"
grep -q '"verdict":[[:space:]]*"error"' "$T/fsz/r.json" && ok "the small error report replaced it" || bad "after a failed write: $(head -c 200 "$T/fsz/r.json" 2>&1)"
[ "$(ls -a "$T/fsz" | grep -c qctmp)" -eq 0 ] || bad "a temporary left after a failed write"

# orphans: the temporaries of a killed run (its process gone, older than 10 s) are removed, a live one kept
mkdir "$T/orph"
dead=$(sh -c 'echo $$')
touch -d '1 hour ago' "$T/orph/.r.json.qctmp-$dead-a1b2c3" "$T/orph/.r.json.qctmp-$$-d4e5f6"
"$QATCHECK" vjp --case cases/linear_dump.json --json "$T/orph/r.json" --quiet || bad "vjp into the orphans' folder"
[ ! -e "$T/orph/.r.json.qctmp-$dead-a1b2c3" ] && ok "a dead run's temporary is removed" || bad "the orphan temporary is still there"
[ -e "$T/orph/.r.json.qctmp-$$-d4e5f6" ] && ok "a live run's temporary is kept" || bad "a live process's temporary was removed"
finish
