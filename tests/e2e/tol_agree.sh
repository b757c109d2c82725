#!/bin/sh
# tol_agree.sh: the two tolerance routes agree. For every module of the
# dumps at hand (cases/data/linear_small.h5, the dump of cases/linear_dump.json,
# and scripts/make_class_dump.py's correct rmsnorm, swiglu, logprob, router
# and attention modules), `qatcheck tol --dump` prints, for each gradient,
# the bounds that vjp's {"derive": true} reports in its JSON (each check's
# tolerance): equal, and at worst within 2x. Then vjp passes with the
# printed member as declared tolerances.
. "$(dirname "$0")/lib.inc"
$PY scripts/make_class_dump.py "$T/c.h5" >/dev/null || exit 1
n=0
while read -r dump mod cls; do
  [ -n "$dump" ] || continue
  case $dump in /*) ;; *) dump="$(pwd)/$dump" ;; esac
  expect_exit 0 "tol --dump $mod" "$QATCHECK" tol --dump "$dump" --module "$mod" --quiet --json "$T/t.json"
  $PY - "$T/t.json" "$dump" "$mod" "$cls" "$T/case.json" "$T/case_decl.json" <<'P' || bad "$mod: cannot write the cases"
import json, sys
t, dump, mod, cls, out, decl = sys.argv[1:]
tols = json.load(open(t))["tolerances"]
rx = "^" + mod.replace(".", "\\.") + "$"
base = {"module": cls, "data": {"dump": dump, "modules": rx}, "candidate": "dump"}
json.dump(dict(base, tolerances={g: {"derive": True} for g in tols}), open(out, "w"))
json.dump(dict(base, tolerances=tols), open(decl, "w"))
P
  "$QATCHECK" vjp --case "$T/case.json" --json "$T/r.json" >"$T/out" 2>&1
  rc=$?
  [ $rc -le 1 ] || { bad "$mod: vjp with derived tolerances exit $rc: $(tail -2 "$T/out")"; continue; }
  $PY - "$T/t.json" "$T/r.json" "$mod" <<'P' || bad "$mod: tol --dump and derive disagree"
import json, sys
tols = json.load(open(sys.argv[1]))["tolerances"]
checks = [c for c in json.load(open(sys.argv[2]))["checks"] if c["tensor"] in tols]
assert checks, "no check"
worst, seen = 1.0, set()
for c in checks:
    d, g = c["tolerance"], tols[c["tensor"]]
    if "rel_l2" not in d:  # an exactly-zero reference: judged by max_abs, nothing to compare
        continue
    for k in ("rel_l2", "noise_multiple", "cosine_min"):
        a, b = g[k], d[k]
        r = max(a, b) / min(a, b) if k != "cosine_min" else max(1 - a, 1 - b) / max(min(1 - a, 1 - b), 1e-300)
        worst = max(worst, r)
        assert r <= 2, (c["tensor"], k, "tol --dump", a, "derive", b)
    assert g["norm_ratio"] == d["norm_ratio"], (c["tensor"], g["norm_ratio"], d["norm_ratio"])
    seen.add((c["tensor"], g["rel_l2"], d["rel_l2"]))
print("ok   %s: %d gradient(s) agree, worst ratio %.3g: %s" % (sys.argv[3], len({s[0] for s in seen}), worst,
      ", ".join("%s %g = %g" % s for s in sorted(seen))))
P
  "$QATCHECK" vjp --case "$T/case_decl.json" >"$T/out" 2>&1 || bad "$mod: vjp fails with tol --dump's member: $(grep -v ' pass ' "$T/out" | head -3)"
  n=$((n + 1))
done <<EOF2
cases/data/linear_small.h5 /model.layers.0.mlp.down_proj linear
$T/c.h5 /model.layers.0.input_layernorm rmsnorm
$T/c.h5 /model.layers.0.mlp.act swiglu
$T/c.h5 /model.lm_head.logprob logprob
$T/c.h5 /model.layers.0.mlp.router router
$T/c.h5 /model.layers.0.self_attn.sdpa attention
EOF2
[ "$n" -eq 6 ] && ok "$n modules: tol --dump equals derive" || bad "only $n of 6 modules compared"
finish
