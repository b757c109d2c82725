#!/bin/sh
# variants.sh: the reference variants (docs/tolerances.md, "Reference
# variants"). A float32 relu2 whose backward read its input rounded to bf16
# (autocast's cast) fails against the contract's reference and passes
# against the bf16_inputs variant: every check's report names the reference
# it was judged against (the JSON's "variant", the text table's variant
# column), the contract's ("none") where it passes alone. The case narrows
# the set: "variants": "none", or a list without bf16_inputs, makes it fail;
# a list with it passes; an unknown name or value exits 2 with one line.
# The dump's own evidence: the group's autocast "off" (scripts/qatdump.py
# writes it), float32 tensors and an output that is not bf16-valued rule
# the autocast variants out (it fails, -v says why); autocast "bfloat16"
# does not.
. "$(dirname "$0")/lib.inc"
$PY - "$T" <<'P' || { bad "could not write the dumps"; finish; }
import sys
import h5py
import numpy as np
sys.path.insert(0, "scripts")
import bf16
T = sys.argv[1]
rng = np.random.default_rng(7)
x = rng.standard_normal((64, 256)).astype(np.float32)
dy = rng.standard_normal((64, 256)).astype(np.float32)
y = (np.maximum(x, 0).astype(np.float64) ** 2).astype(np.float32)
dx = (2.0 * np.maximum(bf16.round_(x), 0).astype(np.float64) * dy).astype(np.float32)  # X read as bf16
for name, autocast in (("plain", None), ("off", "off"), ("on", "bfloat16")):
    with h5py.File("%s/%s.h5" % (T, name), "w") as f:
        f.attrs["qatcheck_dump"] = np.int64(1)
        g = f.create_group("act")
        g.attrs["class"] = "relu2"
        if autocast:
            g.attrs["autocast"] = autocast
        g["inputs/x"], g["outputs/y"], g["grad_out/dy"], g["grads/dy/d_x"] = x, y, dy, dx
P
mkcase() { # case NAME DUMP [KEY]: $T/NAME.json on $T/DUMP.h5, with KEY (a "variants": ... member) when given
  printf '{"data": {"dump": "%s.h5"}, "candidate": "dump", %s"tolerances": {"d_x": {"derive": true}}}\n' "$2" "${3:+$3, }" >"$T/$1.json"
}
mkcase plain plain
expect_exit 0 "a backward that read its input as bf16 passes against a variant" "$QATCHECK" vjp --case "$T/plain.json" --json "$T/plain.r.json"
grep -Eq "^/act +dy +d_x +.* bf16_inputs +pass" "$T/out" && ok "the text table names the variant d_x was judged against" \
  || bad "text: $(grep d_x "$T/out")"
grep -Eq "^/act +forward +y +.* none +pass" "$T/out" && ok "and 'none' where the contract's reference judged the check" \
  || bad "text: $(grep ' y ' "$T/out")"
$PY - "$T/plain.r.json" <<'P' && ok "the JSON names it for every check, passing ones too" || bad "the JSON's variant"
import json, sys
c = {k["tensor"]: k for k in json.load(open(sys.argv[1]))["checks"]}
assert c["d_x"]["verdict"] == "pass" and c["d_x"]["variant"] == "bf16_inputs", c["d_x"]
assert c["d_x"]["reference_variant"] == "bf16-rounded inputs", c["d_x"]["reference_variant"]
assert c["y"]["verdict"] == "pass" and c["y"]["variant"] == "none" and "reference_variant" not in c["y"], c["y"]
P
mkcase none plain '"variants": "none"'
expect_exit 1 '"variants": "none" judges against the contract'"'"'s reference alone' "$QATCHECK" vjp --case "$T/none.json" --json "$T/none.r.json"
grep -q '"variant":[[:space:]]*"none"' "$T/none.r.json" && ! grep -q '"variant":[[:space:]]*"bf16' "$T/none.r.json" \
  && ok "no variant judged any check" || bad "a variant judged a check under \"none\""
mkcase dyonly plain '"variants": ["bf16_dy", "round_ops"]'
expect_exit 1 "a list without bf16_inputs fails it" "$QATCHECK" vjp --case "$T/dyonly.json"
mkcase inonly plain '"variants": ["bf16_inputs"]'
expect_exit 0 "a list with bf16_inputs passes it" "$QATCHECK" vjp --case "$T/inonly.json"
for v in '["bf16_dx"]:bf16_dx' '"all":"none" or a list' '[1]:1'; do
  mkcase badname plain "\"variants\": ${v%%:*}"
  rm -f "$T/bad.r.json"
  expect_exit 2 "\"variants\": ${v%%:*} is refused" "$QATCHECK" vjp --case "$T/badname.json" --json "$T/bad.r.json"
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "variants.*${v#*:}" "$T/err" \
    && ok "one line naming ${v#*:}" || bad "the refusal: $(cat "$T/err")"
  error_or_none "$T/bad.r.json" || bad "a refused case wrote a report other than its error report"
done
mkcase off off
expect_exit 1 "autocast off, float32 everywhere: the bf16_inputs variant is ruled out" "$QATCHECK" vjp -v --case "$T/off.json" --json "$T/off.r.json"
grep -q "rules out the bf16_inputs and bf16_params variants" "$T/err" && ok "-v says the dump's evidence ruled them out" \
  || bad "-v: $(grep -i 'rules out' "$T/err")"
mkcase on on
expect_exit 0 "autocast on: not ruled out" "$QATCHECK" vjp --case "$T/on.json"
finish
