#!/bin/sh
# contract_checkpoint.sh: `qatcheck contract --master-vs-dequant` on the
# committed checkpoint (cases/data/contract_ckpt.h5, scripts/make_checkpoint.py):
# the per-class table and report, every row's numbers against the independent
# numpy computation (scripts/contract_check.py, 1e-9 relative), the outlier
# rule flags the planted layer (and only it) in every weight format, and
# thresholds turn crossing rows into exit 1. Also a checkpoint without
# grad_out/ and inputs/ (generated dY and X, replayed by the checker).
set -u
. "$(dirname "$0")/lib.inc"
CKPT=cases/data/contract_ckpt.h5
PLANTED=/model.layers.3.mlp.down_proj
WF=nvfp4,fp8_block128,mxfp8,fp8_channel,fp8_tensor
AF=fp8_token,fp8_group128
fail() { echo "FAIL: $*"; exit 1; }

"$QATCHECK" contract --master-vs-dequant --dump "$CKPT" --weight-format $WF --activation-format $AF \
  --json "$T/r.json" >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 0 ] || { cat "$T/out" "$T/err"; fail "exit $rc, expected 0 (no thresholds)"; }
# the table: one line per class and format, the planted layer listed as an outlier
grep -q "^d_x  *nvfp4  *none  */model.layers.\*.mlp.down_proj  *6  *6 " "$T/out" || fail "no nvfp4 down_proj class row in the table"
grep -q "^d_x  *fp8_block128  *none  */model.layers.\*.mlp.experts.\*.down_proj  *24  *6 " "$T/out" || fail "no expert class row"
grep -q "^d_weight  *none  *fp8_token  */model.layers.\*.self_attn.q_proj " "$T/out" || fail "no d_weight class row"
n=$(grep -c "^  OUTLIER $PLANTED d_x" "$T/out")
[ "$n" -eq 5 ] || fail "expected the planted layer listed once per weight format (5), got $n"
[ "$(grep -c '^  OUTLIER' "$T/out")" -eq 5 ] || fail "outliers other than the planted layer listed"

# numbers against the independent numpy computation, classes and outlier marks recomputed
"$PY" scripts/contract_check.py "$CKPT" "$T/r.json" --require nvfp4,fp8_block128,mxfp8,fp8_channel,fp8_token,fp8_group128 \
  || fail "report disagrees with the independent computation"

# report structure: envelope, rows, classes; outliers only on the planted module
"$PY" - "$T/r.json" "$PLANTED" <<'PYEOF' || fail "report structure"
import json, sys
r = json.load(open(sys.argv[1])); planted = sys.argv[2]
assert r["qatcheck_report"] == 1 and r["verb"] == "contract" and r["verdict"] == "pass", r["verdict"]
rows = r["rows"]
# 37 linear groups (6 of them routed experts x 4): 55 units; 5 weight formats + 2 activation formats
assert len(rows) == 55 * 7, len(rows)
ex = [x for x in rows if x["expert"] is not None]
assert ex and all(x["class"] == "/model.layers.*.mlp.experts.*.down_proj" for x in ex)
assert {x["expert"] for x in ex} == {0, 1, 2, 3}
lm = [x for x in rows if x["module"] == "/lm_head"]
assert lm and all(x["layer"] is None and x["class"] == "/lm_head" for x in lm)
q = [x for x in rows if x["module"] == "/model.layers.2.self_attn.q_proj"]
assert all(x["layer"] == 2 and x["class"] == "/model.layers.*.self_attn.q_proj" for x in q)
out = [x for x in rows if x["outlier"]]
assert out and all(x["module"] == planted and x["tensor"] == "d_x" for x in out), [x["module"] for x in out]
assert {x["weight_format"] for x in out} == {"nvfp4", "fp8_block128", "mxfp8", "fp8_channel", "fp8_tensor"}
assert not any(x["module"].startswith("/model.layers.3.input_layernorm") for x in rows), "rmsnorm swept"
c = [k for k in r["classes"] if k["class"] == "/model.layers.*.mlp.down_proj" and k["weight_format"] == "nvfp4"]
assert len(c) == 1 and c[0]["layers"] == 6 and c[0]["outliers"] == 1
for k in r["classes"]:
    assert k["cosine"]["min"] <= k["cosine"]["median"] <= k["cosine"]["max"]
PYEOF

# units prepared ahead on worker threads give the very same rows, in order
QATCHECK_AHEAD=3 "$QATCHECK" contract --master-vs-dequant --dump "$CKPT" --weight-format $WF --activation-format $AF \
  --quiet --json "$T/a.json" || fail "QATCHECK_AHEAD=3: exit $?"
"$PY" -c 'import json,sys; a,b=(json.load(open(p))["rows"] for p in sys.argv[1:]); assert a==b' "$T/r.json" "$T/a.json" \
  || fail "rows differ when units are prepared ahead"

# thresholds: nvfp4 rows have cosine ~0.995, fp8 ~0.9996: with 0.999 only nvfp4 fails: they fail, exit 1
"$QATCHECK" contract --master-vs-dequant --dump "$CKPT" --weight-format nvfp4,fp8_block128 --cosine-min 0.999 \
  --quiet --json "$T/t.json"
rc=$?
[ $rc -eq 1 ] || fail "--cosine-min 0.999: exit $rc, expected 1"
"$PY" - "$T/t.json" <<'PYEOF' || fail "threshold report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verdict"] == "fail"
for x in r["rows"]:
    want = "fail" if x["metrics"]["cosine"] < 0.999 else "pass"
    assert x["verdict"] == want, (x["module"], x["weight_format"], x["metrics"], x["verdict"])
    assert (want == "fail") == (x["why"] != "")
assert any(x["verdict"] == "fail" for x in r["rows"] if x["weight_format"] == "nvfp4")
assert all(x["verdict"] == "pass" for x in r["rows"] if x["weight_format"] == "fp8_block128")
PYEOF
"$QATCHECK" contract --master-vs-dequant --dump "$CKPT" --weight-format mxfp8 --norm-ratio 0.99,1.01 --quiet
rc=$?
[ $rc -eq 1 ] || fail "--norm-ratio 0.99,1.01 with mxfp8 (planted layer at 1.037): exit $rc, expected 1"
"$QATCHECK" contract --master-vs-dequant --dump "$CKPT" --weight-format nvfp4 --cosine-min 0.9 --norm-ratio 0.8,1.2 --quiet
rc=$?
[ $rc -eq 0 ] || fail "loose thresholds: exit $rc, expected 0"

# generated dY and X: a checkpoint without grad_out/ and inputs/
"$PY" scripts/make_checkpoint.py "$T/nodata.h5" --no-data || fail "make_checkpoint --no-data"
"$QATCHECK" contract --master-vs-dequant --dump "$T/nodata.h5" --tokens 8 --seed 7 --weight-format fp8_block128,nvfp4 \
  --activation-format fp8_token --json "$T/g.json" >"$T/gout" || fail "generated run: exit $?"
grep -q "dY: generated.*8 tokens, seed 7" "$T/gout" || fail "generated dY not stated on the console"
"$PY" -c 'import json,sys; g=json.load(open(sys.argv[1]))["generated"]; assert g["dy"] and g["x"] and g["tokens"]==8 and g["seed"]==7, g' "$T/g.json" \
  || fail "generated dY not recorded in the report"
"$PY" scripts/contract_check.py "$T/nodata.h5" "$T/g.json" --require fp8_block128,nvfp4,fp8_token || fail "generated run disagrees"

# the Markdown report: the class table (one line per class of the JSON), the
# outliers, and on a threshold crossing FAIL with the failed rows
"$QATCHECK" contract --master-vs-dequant --dump "$CKPT" --weight-format nvfp4,mxfp8 --cosine-min 0.999 \
  --json "$T/m.json" --markdown "$T/m.md" --quiet; [ $? -eq 1 ] || fail "threshold run with --markdown: expected exit 1"
head -1 "$T/m.md" | grep -q "^# qatcheck contract: FAIL" || fail "Markdown report does not say FAIL"
grep -q "^## Failed rows" "$T/m.md" || fail "Markdown report lists no failed rows"
"$PY" - "$T/m.json" "$T/m.md" <<'PYEOF' || fail "Markdown class table disagrees with the JSON"
import json, sys
r = json.load(open(sys.argv[1])); md = open(sys.argv[2]).read()
table = md.split("## Classes")[1].split("## Outliers")[0]
lines = [l for l in table.splitlines() if l.startswith("| d_")]
assert len(lines) == len(r["classes"]), (len(lines), len(r["classes"]))
rows = md.split("## Rows")[1]
assert sum(1 for l in rows.splitlines() if l.startswith("| `")) == len(r["rows"])
assert md.count("FAIL |") == r["summary"]["failed"], "failed rows in the row table"
PYEOF
echo "ok"
