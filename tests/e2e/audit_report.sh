#!/bin/sh
# audit_report.sh: `qatcheck report` assembles one audit from the JSON
# reports of vjp (a passing case, a dump with planted defects, special
# values), contract and hand-written sft and step reports (the formats of
# docs/interfaces.md, with a field the reader does not know). The Markdown
# is GitHub-flavoured Markdown with valid tables (tests/e2e/gfm_check.py,
# itself shown to reject a broken table); the HTML is one file with no
# external resource and no script; headless Chromium loads it with no
# console message, its screenshot is neither blank nor colourless
# (tests/e2e/png_check.py decodes the PNG with zlib), and it prints to PDF. The document holds
# the summary, each layer, the coverage matrix with what is missing by
# name, and the plots. Skipped (77) only when chromium is absent; the rest
# still runs first.
. "$(dirname "$0")/lib.inc"
D="$(dirname "$0")"
$PY scripts/make_linear_dump.py "$T/d.h5" --defects all >/dev/null || { bad "make_linear_dump.py"; finish; }
printf '{"module": "linear", "data": {"dump": "d.h5"}, "candidate": "dump", %s}\n' "$LIN_TOL" >"$T/defects.json"
"$QATCHECK" vjp --case cases/linear_dump.json --json "$T/v_pass.json" --quiet || bad "vjp pass"
"$QATCHECK" vjp --case "$T/defects.json" --json "$T/v_fail.json" --quiet; [ $? -eq 1 ] || bad "vjp defects"
"$QATCHECK" vjp --case cases/swiglu_special.json --json "$T/v_special.json" --quiet || bad "vjp swiglu special"
"$QATCHECK" contract --master-vs-dequant --dump cases/data/contract_ckpt.h5 --weight-format nvfp4 --json "$T/c.json" --quiet || bad "contract"
IN="$T/v_pass.json $T/v_fail.json $T/v_special.json $T/c.json tests/data/reports/sft.json tests/data/reports/step.json"
# shellcheck disable=SC2086
expect_exit 1 "report over failing inputs exits 1" "$QATCHECK" report $IN --markdown "$T/a.md" --html "$T/a.html" --json "$T/a.json" --junit "$T/a.xml"
grep -q "^report: FAIL: 6 report(s)" "$T/out" || bad "the console line: $(head -2 "$T/out")"
cp "$T/out" "$T/out.all"
# passing reports that leave layers 3 and the one-step update out: incomplete
# (exit 1), accepted by --allow-incomplete (exit 0), still incomplete
# (tests/e2e/audit_complete.sh: the whole rule)
expect_exit 1 "report over passing inputs without sft and step exits 1" "$QATCHECK" report "$T/v_pass.json" "$T/c.json" --markdown "$T/p.md"
head -1 "$T/p.md" | grep -q "^# qatcheck audit: INCOMPLETE" || bad "the incomplete audit's title: $(head -1 "$T/p.md")"
expect_exit 0 "--allow-incomplete accepts it" "$QATCHECK" report "$T/v_pass.json" "$T/c.json" --allow-incomplete --markdown "$T/p.md"
head -1 "$T/p.md" | grep -q "^# qatcheck audit: INCOMPLETE" || bad "the accepted audit's title: $(head -1 "$T/p.md")"

# Markdown: GFM tables, and the checker rejects a broken one
$PY "$D/gfm_check.py" "$T/a.md" 10 >"$T/out" 2>&1 && ok "$(cat "$T/out")" || bad "$(cat "$T/out")"
awk '/^\| --- /{print; getline; sub(/ \|$/, ""); print; next} {print}' "$T/a.md" >"$T/broken.md"
$PY "$D/gfm_check.py" "$T/broken.md" >"$T/out" 2>&1 && bad "the GFM check passed a row missing a cell" || ok "the GFM check rejects a short row"

# the content the method asks for; each failed check's bias z and diagnosis
$PY - "$T/a.md" "$T/a.json" <<'P' && ok "the audit holds every section the method asks for" || bad "audit content"
import json, sys
md = open(sys.argv[1]).read()
for need in ["# qatcheck audit: FAIL", "## Summary", "The worst checks", "## Layer 1", "### Class linear", "### Class swiglu",
             "#### Gradient contract", "`dx_weight`", "#### Reference, candidate and upstream gradients", "dY sparse",
             "#### Shapes and paths covered", "#### Metrics against the tolerances declared in advance",
             "rel\\_l2 \\<= 0.004", "bf16 output rounding", "#### Failed checks", "/defect.scaled_dw",
             "### Coverage against the method's list", "#### Missing coverage, by name",
             "**small M (decode: one token)** in class linear", "**recompute (activation checkpointing)**",
             "## Layer 2", "outlier", "Per class and layer", "## Layer 3", "Configuration of the three arms",
             "differs, not expected", "localization **late**", "## One-step update", "frozen parameter changed",
             "## Inputs", "*Plot (in the HTML audit):"]:
    assert need in md, need
j = json.load(open(sys.argv[2]))
assert j["verb"] == "report" and j["verdict"] == "fail" and j["audit"] == "FAIL", (j["verdict"], j["audit"])
assert j["layers"]["vjp"]["failed"] == 12 and j["layers"]["sft"]["verdict"] == "FAIL", j["layers"]
assert j["coverage"]["covered"] < j["coverage"]["applicable"] and "decode" in j["coverage"]["missing"], j["coverage"]
assert [i["role"] for i in j["inputs"]] == ["report"] * 6 and all(len(i["sha256"]) == 64 for i in j["inputs"]), j["inputs"]
# each failed check with its bias z and its diagnosis (the vjp report's diagnosis object, its summary)
fails = md.split("#### Failed checks", 1)[1].split("\n### ", 1)[0]
lines = [l for l in fails.splitlines() if l.startswith("- `/defect.")]
assert len(lines) == 12, len(lines)
for l in lines:
    assert "**Diagnosis:** " in l and '{"summary"' not in l, l
    assert "missing_bias" in l or "bias\\_z" in l, l
scaled = [l for l in lines if "/defect.scaled_dw" in l]
assert scaled and all("beyond +-5" in l and "consistent with: a constant factor k = 1.00" in l for l in scaled), scaled
assert any("transposed_dw" in l and "within +-5" in l and "consistent with: the gradient transposed" in l for l in lines), lines
assert any("/defect.nan" in l and "traced: first non-finite value" in l for l in lines), lines
P

# HTML: one file, nothing external, no script; the plots inline
$PY - "$T/a.html" <<'P' && ok "the HTML is self-contained, with its plots inline" || bad "HTML self-containment"
import re, sys
h = open(sys.argv[1]).read()
low = h.lower()
assert low.startswith("<!doctype html>") and low.rstrip().endswith("</html>")
for bad in ["<script", "<link", "<iframe", "<img", "@import", "http://", "https://", "src="]:
    assert bad not in low.replace('xmlns="http://www.w3.org/2000/svg"', ""), bad
assert all(u.startswith("#") for u in re.findall(r"url\(([^)]*)\)", h)), "a url() that is not an internal reference"
assert all(u.startswith("#") for u in re.findall(r'href="([^"]*)"', h)), "a link that leaves the document"
assert h.count("<svg") >= 6 and "@media print" in h, (h.count("<svg"), "@media print" in h)
assert 'id="summary"' in h and "noise multiple against its bound" in h and "per layer" in h
P

# a real browser: loads with no console message, renders the summary and the plots
# issue 27: where each failed check and shape row came from; each reasoning
# once; the step's grad_norm and clip_coef in words; all layers on the
# console; a quant mismatch counted; passes far beyond the noise floor listed
grep -q "^report: FAIL: 6 report(s); layer 1 (vjp): .*; layer 2 (contract): .*; layer 3 (sft): .*; one-step (step): " "$T/out.all" \
  && ok "the console names every layer" || bad "console: $(head -1 "$T/out.all")"
$PY - "$T/a.md" <<'P' && ok "sources named, reasoning once, step numbers formatted" || bad "audit issue-27 content"
import sys
md = open(sys.argv[1]).read()
fails = md.split("#### Failed checks", 1)[1].split("\n### ", 1)[0]
lines = [l for l in fails.splitlines() if l.startswith("- `/defect.")]
assert lines and all("(from `v_fail.json" in l for l in lines), lines[:2]
assert "| instance | report | source |" in md and "| `v_pass.json" in md, "the shapes table names the report"
assert md.count("- `d_x`: bf16 output rounding") == 1, md.count("- `d_x`: bf16 output rounding")
assert "grad\\_norm: under\\_test 1.8421 (implied by the update 1.8421)" in md and '{"' not in md.split("## One-step update", 1)[1], "step notes"
P
# a checkpoint whose quantization does not reproduce, and a tolerance so loose a defect passes
$PY scripts/make_quant_checkpoint.py "$T/qck" --convention deepseek --plant payload:model.layers.1.mlp.down_proj >/dev/null 2>&1 || bad "make_quant_checkpoint.py"
"$QATCHECK" quant --checkpoint "$T/qck/deployed" --master "$T/qck/master" --json "$T/q.json" --quiet; [ $? -eq 1 ] || bad "quant mismatch"
L='{"rel_l2": 1e9, "noise_multiple": 1e9, "bias_z": 0, "reasoning": "far too loose"}'
printf '{"module": "linear", "data": {"dump": "d.h5", "modules": "transposed_dw"}, "candidate": "dump", "tolerances": {"d_x": %s, "d_weight": %s, "d_bias": %s}}\n' "$L" "$L" "$L" >"$T/loose.json"
"$QATCHECK" vjp --case "$T/loose.json" --json "$T/v_loose.json" --quiet || bad "vjp loose passes"
expect_exit 1 "report with a quant mismatch and a loose pass" "$QATCHECK" report "$T/q.json" "$T/v_loose.json" --markdown "$T/q.md"
grep -q "other: [0-9]* check(s), 1 failed (FAIL).*suspicious pass" "$T/out" && ok "the console counts the quant mismatch and the suspicious pass" || bad "console: $(cat "$T/out")"
$PY - "$T/q.md" <<'P' && ok "the quant mismatch counted in the summary and the inputs; the suspicious pass listed" || bad "quant/suspicious content"
import sys
md = open(sys.argv[1]).read()
row = [l for l in md.splitlines() if l.startswith("| other (fd, quant, tol)")][0]
assert row.split("|")[5].strip() == "1", row
inp = [l for l in md.splitlines() if l.startswith("| `") and "q.json" in l and "| quant |" in l][0]
assert inp.split("|")[6].strip() == "1", inp
sus = md.split("### Suspicious passes", 1)[1].split("\n## ", 1)[0]
assert "/defect.transposed_dw" in sus and "far too loose" in sus and "v_loose.json" in sus, sus[:400]
P

CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROME" ]; then
  echo "chromium not installed: the browser check is skipped"
  [ "$fails" -eq 0 ] && exit 77
  finish
fi
run_chrome() { # URL PNG HEIGHT
  timeout 120 "$CHROME" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --mute-audio \
    --enable-logging=stderr --v=0 --window-size=1280,"$3" --screenshot="$2" "$1" >"$T/chrome.log" 2>&1
}
run_chrome "file://$T/a.html" "$T/shot.png" 1000
[ -s "$T/shot.png" ] && ok "chromium rendered the audit" || { bad "chromium wrote no screenshot: $(tail -3 "$T/chrome.log")"; finish; }
if grep -q ":CONSOLE" "$T/chrome.log"; then bad "console messages: $(grep ':CONSOLE' "$T/chrome.log" | head -3)"; else ok "no console message"; fi
$PY "$D/png_check.py" "$T/shot.png" 0.03 0.002 >"$T/out" 2>&1 && ok "$(cat "$T/out")" || bad "$(cat "$T/out")"
# it prints: Chromium's PDF of it has its pages (the print stylesheet keeps rows and plots whole)
timeout 120 "$CHROME" --headless --no-sandbox --disable-gpu --no-pdf-header-footer --print-to-pdf="$T/a.pdf" "file://$T/a.html" >"$T/chrome.log" 2>&1
pages=$($PY -c "import re, sys; print(len(re.findall(rb'/Type\s*/Page[^s]', open(sys.argv[1], 'rb').read())))" "$T/a.pdf" 2>/dev/null)
[ "${pages:-0}" -ge 3 ] && ok "printed to PDF: $pages pages" || bad "printing to PDF: ${pages:-no} pages: $(tail -2 "$T/chrome.log")"
# the check fails on a blank page
printf '<!DOCTYPE html><html><body></body></html>\n' >"$T/blank.html"
run_chrome "file://$T/blank.html" "$T/blank.png" 400
$PY "$D/png_check.py" "$T/blank.png" 0.03 0.002 >"$T/out" 2>&1 && bad "a blank page passed the screenshot check" || ok "the screenshot check rejects a blank page"
# and notices a page with a script error
printf '<!DOCTYPE html><html><body><p>x</p><script>undefined_function();</script></body></html>\n' >"$T/err.html"
run_chrome "file://$T/err.html" "$T/err.png" 400
grep -q ":CONSOLE" "$T/chrome.log" && ok "the console check sees a script error" || bad "the console check missed a script error"
finish
