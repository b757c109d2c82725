#!/bin/sh
# sft_proxy.sh: scripts/proxy_sft.py end to end with `qatcheck sft` and
# `qatcheck step` on the committed cases (cases/proxy/): three healthy runs
# (three data orders) pass both; each planted bug gets its verdict and
# localization:
#   grad-half        sft: deviates, backward (grad_norm at step 1); step: gradients
#   refresh-stops=20 sft: deviates, late (after step 20)
#   mask-shift       sft: deviates, forward (loss at step 1)
#   adam-l2          step: the update fails as "Adam with L2", localization update
#   frozen-decay     step: the frozen embedding changed by weight decay
# A planted run trains under_test only; its other arms are the healthy run's.
. "$(dirname "$0")/lib.inc"
have_py "$PY" torch h5py yaml tensorboard || { echo "skip: python3 lacks torch, h5py, yaml or tensorboard"; exit 77; }
P=scripts/proxy_sft.py
# json_is FILE EXPR: a Python expression on the report `r` is true
json_is() { $PY -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1" 2>/dev/null || bad "$1: not ($2)"; }

# runs LIST: each line of LIST "LOG ARGS...", one proxy_sft.py run with
# ARGS, its output in LOG; the runs of a list one after another in one
# python (one import of torch, a run's cost twice over: proxy_sft.main
# seeds each run as a process of its own would)
runs() {
  $PY - "$(dirname "$P")" "$1" <<'P'
import shlex, sys
sys.path.insert(0, sys.argv[1])
import proxy_sft
out, err = sys.stdout, sys.stderr
for line in open(sys.argv[2]):
    log, *argv = shlex.split(line)
    with open(log, "w") as f:
        sys.stdout = sys.stderr = f
        try:
            rc = proxy_sft.main(argv)
        except SystemExit as e:
            rc = e.code
        except Exception:
            import traceback
            traceback.print_exc()
            rc = 1
        sys.stdout, sys.stderr = out, err
        if rc:
            print("proxy_sft.py %s: exit %s" % (" ".join(argv), rc), file=f)
P
}
# the healthy runs (three data orders) and the planted ones (under_test
# only, data order 1), in two pythons (2 cores)
h() { echo "$T/h$1.log --out $T/h$1 --data-seed $1 --formats jsonl,csv,tb --step-dump $T/h$1/step.h5"; }
p() { d=$1; shift; echo "$T/$d.log --out $T/$d --data-seed 1 --arms under_test --plant $* --formats jsonl"; }
{ h 1; h 2; p mask mask-shift; p l2 adam-l2 --steps 4 --step-dump "$T/l2/step.h5"; } >"$T/runs1"
{ h 3; p half grad-half --step-dump "$T/half/step.h5"; p refresh refresh-stops=20; p frozen frozen-decay --steps 4 --step-dump "$T/frozen/step.h5"; } >"$T/runs2"
runs "$T/runs1" &
runs "$T/runs2"
wait
for ds in 1 2 3; do
  [ -f "$T/h$ds/step.h5" ] || { bad "proxy_sft.py data order $ds did not run"; cat "$T/h$ds.log"; continue; }
  cp cases/proxy/sft.json cases/proxy/step.json "$T/h$ds/"
  expect_exit 0 "healthy, data order $ds: sft passes" "$QATCHECK" sft --case "$T/h$ds/sft.json" --json "$T/h$ds/sft.r.json"
  json_is "$T/h$ds/sft.r.json" 'r["conclusion"] == "pass" and all(p["verdict"] == "pass" and p["localization"] is None for p in r["pairs"])'
  expect_exit 0 "healthy, data order $ds: step passes" "$QATCHECK" step --case "$T/h$ds/step.json" --json "$T/h$ds/step.r.json"
  json_is "$T/h$ds/step.r.json" 'r["verdict"] == "pass" and r["localization"] is None and r["totals"]["judged"] > 50'
done

# planted: under_test only, the other arms linked from the healthy run of the same data order
plant() { # NAME PLANT
  d="$T/$1"
  { [ -s "$d.log" ] && ! grep -q '^proxy_sft.py .*: exit' "$d.log"; } || { bad "proxy_sft.py --plant $2"; cat "$d.log"; }
  ln -s "$T/h1/gradient_reference" "$d/gradient_reference"
  ln -s "$T/h1/native_baseline" "$d/native_baseline"
  cp cases/proxy/sft.json cases/proxy/step.json "$d/"
}
plant half grad-half
plant refresh refresh-stops=20
plant mask mask-shift
plant l2 adam-l2
plant frozen frozen-decay

UT='r["pairs"][0]'
expect_exit 1 "grad-half: sft deviates" "$QATCHECK" sft --case "$T/half/sft.json" --json "$T/half/r.json"
json_is "$T/half/r.json" "$UT['verdict'] == 'deviates' and $UT['localization'] == 'backward' and $UT['first_deviation']['metric'] == 'grad_norm' and $UT['first_deviation']['step'] == 1"
expect_exit 1 "grad-half: step fails" "$QATCHECK" step --case "$T/half/step.json" --json "$T/half/s.json"
json_is "$T/half/s.json" "r['localization']['kind'] == 'gradients' and {c['param'] for c in r['checks'] if c['kind'] == 'grad_pair' and c['verdict'] == 'fail'} == {'layers.0.mlp.w1', 'layers.0.mlp.w2', 'layers.1.mlp.w1', 'layers.1.mlp.w2'} and not any(c['verdict'] == 'fail' for c in r['checks'] if c['kind'] == 'update')"
json_is "$T/half/s.json" "all(abs(float(c['why'].split('gradient is ')[1].split(' x')[0]) - 0.5) < 0.01 for c in r['checks'] if c['kind'] == 'grad_pair' and c['verdict'] == 'fail')"

expect_exit 1 "refresh-stops=20: sft deviates" "$QATCHECK" sft --case "$T/refresh/sft.json" --json "$T/refresh/r.json"
json_is "$T/refresh/r.json" "all(p['verdict'] == 'deviates' and p['localization'] == 'late' and p['first_deviation']['step'] > 20 for p in r['pairs'])"

expect_exit 1 "mask-shift: sft deviates" "$QATCHECK" sft --case "$T/mask/sft.json" --json "$T/mask/r.json"
json_is "$T/mask/r.json" "all(p['verdict'] == 'deviates' and p['localization'] == 'forward' and {k: p['first_deviation'][k] for k in ('x', 'step', 'metric', 'bound')} == {'x': 1, 'step': 1, 'metric': 'loss', 'bound': 'pointwise_rel'} and p['first_deviation']['onset']['step'] == 1 for p in r['pairs'])"

expect_exit 1 "adam-l2: step fails" "$QATCHECK" step --case "$T/l2/step.json" --json "$T/l2/s.json"
json_is "$T/l2/s.json" "r['localization']['kind'] == 'update' and all('Adam with L2' in c['why'] for c in r['checks'] if c['kind'] == 'update' and c['arm'] == 'under_test') and all(c['verdict'] == 'pass' for c in r['checks'] if c['kind'] in ('update', 'grad_pair') and c['arm'] != 'under_test')"

expect_exit 1 "frozen-decay: step fails" "$QATCHECK" step --case "$T/frozen/step.json" --json "$T/frozen/s.json"
json_is "$T/frozen/s.json" "[(c['arm'], c['param']) for c in r['checks'] if c['verdict'] == 'fail'] == [('under_test', 'tok_emb')] and 'weight decay' in [c for c in r['checks'] if c['verdict'] == 'fail'][0]['why']"

# the reports of a deviating run: JUnit one testcase per (pair, metric), Markdown with its plots
mkdir -p "$T/mask/rep"
expect_exit 1 "mask-shift: the reports" "$QATCHECK" sft --case "$T/mask/sft.json" --junit "$T/mask/r.xml" --markdown "$T/mask/rep/r.md"
$PY - "$T/mask/r.xml" "$T/mask/rep" <<'P' || bad "mask-shift: JUnit or Markdown plots"
import os, sys, xml.etree.ElementTree as ET
x = ET.parse(sys.argv[1]).getroot()
cases = x.findall(".//testcase")
assert len(cases) == 8 + 2, len(cases)  # 5 + 3 checks, one "controlled variables and x axis" case per pair (tokens differ)
assert len({(c.get("classname"), c.get("name"), c.getparent() if hasattr(c, "getparent") else 0) for c in cases}) >= 6
md = open(os.path.join(sys.argv[2], "r.md")).read()
svgs = sorted(f for f in os.listdir(sys.argv[2]) if f.endswith(".svg"))
assert len(svgs) >= 8, svgs
for s in svgs:
    assert "(%s)" % s in md, s
    ET.parse(os.path.join(sys.argv[2], s))  # well-formed
assert "first deviation" in open(os.path.join(sys.argv[2], svgs[0])).read()
assert "## Controlled variables" in md and "forward" in md
P
# the audit document over the real sft report: each pair metric's curves (a, b, the band, the first failure)
expect_exit 1 "mask-shift: the audit document" "$QATCHECK" report "$T/mask/r.json" --html "$T/mask/a.html" --markdown "$T/mask/a.md"
$PY - "$T/mask/r.json" "$T/mask/a.html" <<'P' || bad "mask-shift: the audit's layer-3 curves"
import json, sys
r = json.load(open(sys.argv[1]))
s = r["pairs"][0]["metrics"][0]["series"]
assert s["kept"] == min(s["points"], 1000) and all(len(s[k]) == s["kept"] for k in ("x", "a", "b", "lo", "hi")), s.keys()
fx = r["pairs"][0]["first_deviation"]["x"]
assert fx in s["x"], "the first failure is among the kept points"
h = open(sys.argv[2]).read()
n = sum(len(p["metrics"]) for p in r["pairs"])
assert h.count("bound around b") >= n and h.count("first failure") >= n, (h.count("bound around b"), n)
P
finish
