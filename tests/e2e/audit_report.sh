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
# an audit of passing reports passes
expect_exit 0 "report over passing inputs exits 0" "$QATCHECK" report "$T/v_pass.json" "$T/c.json" --markdown "$T/p.md"
head -1 "$T/p.md" | grep -q "^# qatcheck audit: pass" || bad "the passing audit's title: $(head -1 "$T/p.md")"

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
