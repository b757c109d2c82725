#!/bin/sh
# common_opts.sh: every verb (vjp, contract, tol, quant, fd) takes the common
# options of docs/interfaces.md section 1 and does what they say:
# --json writes a valid report whose verdict matches the exit status;
# --junit writes XML with one testcase per check and a <failure> per failed
# check (counts checked against the JSON of the same run); a failing run
# exits 1 with failures in the JUnit; --device bogus exits 2 with one error
# line and only its error report; --device cuda on a verb with no device work exits 2
# with one line; --quiet prints nothing for a passing run; --help lists the
# common options; a report that cannot be written takes the others back.
. "$(dirname "$0")/lib.inc"
CKPT=cases/data/contract_ckpt.h5
$PY scripts/make_linear_dump.py "$T/d.h5" --defects all >/dev/null || { bad "make_linear_dump.py"; finish; }
cat >"$T/defects.json" <<J
{"module": "linear", "data": {"dump": "d.h5"}, "candidate": "dump", $LIN_TOL}
J
have_quant=0
$PY -c "import ml_dtypes" 2>/dev/null && have_quant=1
if [ $have_quant = 1 ]; then
  $PY scripts/make_quant_dump.py "$T/q_ok.h5" nvfp4 --k 161 --n 131 >/dev/null || bad "make_quant_dump.py ok"
  $PY scripts/make_quant_dump.py "$T/q_bad.h5" fp8_block128 --plant payload >/dev/null || bad "make_quant_dump.py payload"
fi

# The argument lists of one passing and one failing run per verb.
args_pass() {
  case $1 in
    vjp) echo "vjp --case cases/linear_dump.json" ;;
    contract) echo "contract --master-vs-dequant --dump $CKPT --weight-format fp8_block128" ;;
    tol) echo "tol --out-dtype bfloat16 --k 4096 --tensor d_weight --scale 8" ;;
    quant) echo "quant --dump $T/q_ok.h5 --module /lin" ;;
    fd) echo "fd --module rmsnorm" ;;
  esac
}
args_fail() {
  case $1 in
    vjp) echo "vjp --case $T/defects.json" ;;                     # six planted defects
    contract) echo "contract --master-vs-dequant --dump $CKPT --weight-format nvfp4,fp8_block128 --cosine-min 0.999" ;;
    quant) echo "quant --dump $T/q_bad.h5 --module /lin" ;;        # a flipped payload byte
    fd) echo "fd --module rmsnorm --values special" ;;             # a zero row bends on the scale of h
  esac
}

# check_reports VERB JSON XML WANT_VERDICT: the JSON is a report of VERB with
# that verdict; the JUnit parses, its testcases and failures are the JSON's
# checks and failed checks, and its attributes agree with what it holds.
check_reports() {
  $PY - "$@" <<'P'
import json, sys, xml.etree.ElementTree as ET
verb, jp, xp, want = sys.argv[1:5]
r = json.load(open(jp))
assert r["qatcheck_report"] == 1 and r["verb"] == verb, (r.get("qatcheck_report"), r.get("verb"))
assert r["verdict"] == want, ("json verdict", r["verdict"], want)
if verb in ("vjp", "quant"):
    checks = r["checks"]
    if verb == "vjp":
        failed = sum(c["verdict"] != "pass" for c in checks)
    else:
        failed = sum(c["result"] != "reproduced" for c in checks)
        assert all(set(c) >= {"module", "format", "profile", "result", "detail"} for c in checks), checks
elif verb == "contract":
    checks = r["rows"]
    failed = sum(x["verdict"] == "fail" for x in checks)
elif verb == "fd":
    checks = r["rows"]
    failed = sum(not x["pass"] for x in checks)
    assert all(set(x) >= {"class", "tensor", "vjp", "jvp", "rel_err", "tol", "bound", "pass"} for x in checks), checks[0]
elif verb == "tol":
    (tensor, t), = r["tolerances"].items()
    assert {"rel_l2", "cosine_min", "norm_ratio", "noise_multiple", "reasoning"} <= set(t), t
    assert "derived by: qatcheck tol" in t["reasoning"] and "--json" not in t["reasoning"], t["reasoning"]
    assert r["inputs"]["k"] > 0 and "e_out" in r["terms"], r
    checks = [k for k in t if k != "reasoning"]   # one passed testcase per derived bound
    failed = 0
root = ET.parse(xp).getroot()
cases = root.findall(".//testcase")
fails = root.findall(".//testcase/failure")
assert root.tag == "testsuites", root.tag
assert len(cases) == len(checks), ("testcases", len(cases), "checks", len(checks))
assert len(fails) == failed, ("failures", len(fails), "failed checks", failed)
assert int(root.get("tests")) == len(cases) and int(root.get("failures")) == len(fails), root.attrib
for s in root.findall("testsuite"):
    assert int(s.get("tests")) == len(s.findall("testcase")), s.attrib
    assert int(s.get("failures")) == len(s.findall("testcase/failure")), s.attrib
assert (want == "fail") == (failed > 0), (want, failed)
assert all(f.get("message") for f in fails), "a failure without a message"
print(f"{verb}: {len(cases)} testcases, {len(fails)} failures")
P
}

# one_error_line DESC: the last run wrote nothing on stdout and exactly one
# line, "qatcheck: error: ...", on stderr
one_error_line() {
  n=$(grep -c '' "$T/err"); first=$(head -1 "$T/err")
  case "$first" in "qatcheck: error: "*) ;; *) bad "$1: stderr is not 'qatcheck: error: ...': $first"; return ;; esac
  [ "$n" -eq 1 ] || { bad "$1: $n lines on stderr, expected 1"; sed 's/^/      /' "$T/err"; return; }
  [ ! -s "$T/out" ] || { bad "$1: output on stdout"; return; }
  ok "$1: $first"
}

for v in vjp contract tol quant fd; do
  if [ $v = quant ] && [ $have_quant = 0 ]; then echo "skip quant: ml_dtypes missing (scripts/install-deps.sh)"; continue; fi
  rm -f "$T"/r.* "$T"/f.*
  # a passing run: every report, verdict pass, exit 0
  md="--markdown $T/r.md"
  # shellcheck disable=SC2046,SC2086
  expect_exit 0 "$v passes with --json --junit $md" "$QATCHECK" $(args_pass $v) \
    --json "$T/r.json" --junit "$T/r.xml" $md
  check_reports $v "$T/r.json" "$T/r.xml" pass || bad "$v: passing reports"
  [ -z "$md" ] || head -1 "$T/r.md" | grep -q "^# qatcheck $v: pass" || bad "$v: the Markdown report does not say pass"
  [ "$(ls -a "$T" | grep -c 'qctmp')" -eq 0 ] || bad "$v: a temporary report file is left behind"

  # --quiet: nothing at all for a passing run
  # shellcheck disable=SC2046
  expect_exit 0 "$v --quiet" "$QATCHECK" $(args_pass $v) --quiet
  if [ -s "$T/out" ] || [ -s "$T/err" ]; then bad "$v --quiet printed something"; head -3 "$T/out" "$T/err"; else ok "$v --quiet prints nothing"; fi
  # without --quiet it does print (so the check above can fail)
  # shellcheck disable=SC2046
  "$QATCHECK" $(args_pass $v) >"$T/out" 2>&1 && [ -s "$T/out" ] || bad "$v without --quiet printed nothing"

  # a failing run: exit 1, failures in the JUnit, verdict fail
  if [ $v != tol ]; then
    # shellcheck disable=SC2046
    expect_exit 1 "$v fails a planted defect" "$QATCHECK" $(args_fail $v) --quiet --json "$T/f.json" --junit "$T/f.xml"
    check_reports $v "$T/f.json" "$T/f.xml" fail || bad "$v: failing reports"
    [ ! -s "$T/out" ] || bad "$v --quiet printed on a failing run"
  fi

  # --device: bogus names exit 2 with one line and only the error report
  rm -f "$T"/r.*
  # shellcheck disable=SC2046
  expect_exit 2 "$v --device bogus" "$QATCHECK" $(args_pass $v) --device bogus --json "$T/r.json" --junit "$T/r.xml"
  one_error_line "$v --device bogus"
  grep -q "'bogus'" "$T/err" || bad "$v --device bogus: the message does not quote the device"
  error_or_none "$T/r.json" && { [ ! -e "$T/r.xml" ] || grep -q '<error ' "$T/r.xml"; } || bad "$v --device bogus: a report other than the error report was written"
  # --device cpu is accepted everywhere
  # shellcheck disable=SC2046
  expect_exit 0 "$v --device cpu" "$QATCHECK" $(args_pass $v) --device cpu --quiet
  # verbs with no device work refuse cuda in one line instead of ignoring it
  case $v in tol|quant|fd)
    for dev in cuda cuda:1; do
      # shellcheck disable=SC2046
      expect_exit 2 "$v --device $dev" "$QATCHECK" $(args_pass $v) --device $dev --json "$T/r.json"
      one_error_line "$v --device $dev"
      grep -q "^qatcheck: error: $v: --device cuda is not supported: " "$T/err" || bad "$v --device $dev: not the 'not supported' message"
      error_or_none "$T/r.json" || bad "$v --device $dev: a report other than the error report was written"
    done ;;
  esac

  # all reports or none: a JUnit path that cannot be written takes the JSON back
  # shellcheck disable=SC2046
  expect_exit 2 "$v with an unwritable --junit" "$QATCHECK" $(args_pass $v) --json "$T/r.json" --junit "$T/nodir/r.xml"
  error_or_none "$T/r.json" || bad "$v: the JSON report of a run that exits 2 is not its error report"

  # --help lists the common options
  expect_exit 0 "$v --help" "$QATCHECK" $v --help
  for o in --json --junit --device --quiet --help; do
    grep -q -- "^  $o" "$T/out" || bad "$v --help does not list $o"
  done
done

# tol judges nothing: each derived bound is a passed testcase (max_abs too with --scale)
"$QATCHECK" tol --out-dtype bfloat16 --k 64 --junit "$T/t.xml" --quiet || bad "tol --junit"
$PY -c "
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
names = [c.get('name') for c in r.iter('testcase')]
assert names == ['rel_l2', 'cosine_min', 'norm_ratio', 'noise_multiple'], names
assert not r.findall('.//failure')" "$T/t.xml" && ok "tol --junit: one passed testcase per bound" || bad "tol --junit testcases"
# an exit-2 tol run writes only its error report
rm -f "$T/r.json"
expect_exit 2 "tol with a bad --k" "$QATCHECK" tol --out-dtype bfloat16 --k 0 --json "$T/r.json"
error_or_none "$T/r.json" || bad "tol: a run that exits 2 wrote a report other than its error report"
# the contract's JUnit names the format and crossed threshold
"$QATCHECK" $(args_fail contract) --quiet --junit "$T/c.xml"
grep -q 'name="d_x/nvfp4/dy" time="[0-9.]*"><failure type="failure" message="cosine [0-9.]* &lt; 0.999"' "$T/c.xml" || bad "contract JUnit: no nvfp4 failure naming the threshold"
# fd --profile: a class without a quantizer says so
expect_exit 2 "fd --profile on a class without a quantizer" "$QATCHECK" fd --module rmsnorm --profile te
one_error_line "fd --profile te"
if [ $have_quant = 1 ]; then
  # quant --identify: one testcase, passed when some profile reproduces the bytes
  "$QATCHECK" quant --dump "$T/q_ok.h5" --module /lin --identify --quiet --json "$T/i.json" --junit "$T/i.xml" || bad "quant --identify"
  $PY -c "
import json, sys, xml.etree.ElementTree as ET
r = json.load(open(sys.argv[1])); x = ET.parse(sys.argv[2]).getroot()
assert r['mode'] == 'identify' and 'vllm' in r['reproduced_by'] and len(r['checks']) == 12, r
assert len(x.findall('.//testcase')) == 1 and not x.findall('.//failure')" "$T/i.json" "$T/i.xml" \
    && ok "quant --identify reports" || bad "quant --identify reports"
  expect_exit 2 "quant --identify with --profile" "$QATCHECK" quant --dump "$T/q_ok.h5" --module /lin --identify --profile te
  one_error_line "quant --identify --profile"
fi
# XML escaping: a module path with markup and a byte that is not UTF-8
$PY - "$T/esc.h5" "$T/d.h5" <<'P' || bad "make the escaping dump"
import sys, shutil, h5py
shutil.copy(sys.argv[2], sys.argv[1])
with h5py.File(sys.argv[1], "a") as f:
    for k in list(f.keys()):
        if k != "defect.nan": del f[k]
    f.move("defect.nan", b'a<b>&"c\xff')   # bytes: the name holds a byte that is not UTF-8
P
cat >"$T/esc.json" <<J
{"module": "linear", "data": {"dump": "esc.h5"}, "candidate": "dump", $LIN_TOL}
J
"$QATCHECK" vjp --case "$T/esc.json" --junit "$T/esc.xml" >/dev/null 2>&1
$PY -c "
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
assert r.find('testsuite').get('name') == '/a<b>&\"c\\\\xff', r.find('testsuite').get('name')
assert r.findall('.//failure')" "$T/esc.xml" && ok "JUnit escapes markup and non-UTF-8 bytes" || bad "JUnit escaping"

[ $have_quant = 1 ] || { [ "$fails" -eq 0 ] && { echo "quant parts skipped: ml_dtypes missing"; exit 77; }; }
finish
