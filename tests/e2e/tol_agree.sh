#!/bin/sh
# tol_agree.sh: the two tolerance routes agree. For every module of the
# dumps at hand (cases/data/linear_small.h5, the dump of cases/linear_dump.json;
# every group of scripts/make_class_dump.py, make_diag_dump.py and
# make_linear_dump.py --defects all, and the moe and ssd dumps of
# moe_dump.sh and ssd_dump.sh, planted defects included: the bounds
# do not depend on the verdict), `qatcheck tol --dump` prints, for each
# gradient, the bounds that vjp's {"derive": true} reports in its JSON
# (each check's tolerance): equal, and at worst within 2x. On the correct
# modules vjp then passes with the printed member as declared tolerances.
. "$(dirname "$0")/lib.inc"
$PY scripts/make_class_dump.py "$T/c.h5" >/dev/null || exit 1
$PY scripts/make_diag_dump.py "$T/g.h5" >/dev/null || exit 1
$PY scripts/make_linear_dump.py "$T/l.h5" --defects all >/dev/null || exit 1
# the moe and ssd dumps of moe_dump.sh and ssd_dump.sh (their first writer)
for f in moe ssd; do
  sed -n "/<<'P'/,/^P\$/p" tests/e2e/${f}_dump.sh | sed '1d;$d' | sed '/^P$/,$d' >"$T/$f.py"
  $PY "$T/$f.py" "$T/$f.h5" >/dev/null || { bad "cannot write the $f dump"; exit 1; }
done
# each group: its dump, name, class and candidate (no grads/: qatcheck's
# own production is the candidate), all read here in one process (an
# import of h5py per module was a third of the script's CPU time)
$PY - cases/data/linear_small.h5 "$T/c.h5" "$T/g.h5" "$T/l.h5" "$T/moe.h5" "$T/ssd.h5" >"$T/groups" <<'P' || exit 1
import sys, h5py
for f in sys.argv[1:]:
    with h5py.File(f, "r") as h:
        for name, g in h.items():
            if isinstance(g, h5py.Group) and "class" in g.attrs and not name.startswith("bad."):
                c = g.attrs["class"]
                print(f, "/" + name, c.decode() if isinstance(c, bytes) else c, "dump" if "grads" in g else "builtin")
P
n=0
while read -r dump mod cls cand; do
  [ -n "$dump" ] || continue
  case $dump in /*) ;; *) dump="$(pwd)/$dump" ;; esac
  expect_exit 0 "tol --dump $mod" "$QATCHECK" tol --dump "$dump" --module "$mod" --quiet --json "$T/t.json"
  $PY - "$T/t.json" "$dump" "$mod" "$cls" "$T/case.json" "$T/case_decl.json" "$cand" <<'P' || bad "$mod: cannot write the cases"
import json, sys
t, dump, mod, cls, out, decl, cand = sys.argv[1:]
tols = json.load(open(t))["tolerances"]
rx = "^" + mod.replace(".", "\\.") + "$"
base = {"module": cls, "data": {"dump": dump, "modules": rx}, "candidate": cand}
json.dump(dict(base, tolerances={g: {"derive": True} for g in tols}), open(out, "w"))
json.dump(dict(base, tolerances=tols), open(decl, "w"))
P
  "$QATCHECK" vjp --case "$T/case.json" --json "$T/r.json" >"$T/out" 2>&1
  rc=$?
  [ $rc -le 1 ] || { bad "$mod: vjp with derived tolerances exit $rc: $(tail -2 "$T/out")"; continue; }
  $PY - "$T/t.json" "$T/r.json" "$mod" <<'P' || bad "$mod: tol --dump and derive disagree"
import json, sys
tols = json.load(open(sys.argv[1]))["tolerances"]
checks = [c for c in json.load(open(sys.argv[2]))["checks"] if c["tensor"] in tols and c.get("why") != "missing"]
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
assert seen, "no check compared"
print("ok   %s: %d gradient(s) agree, worst ratio %.3g: %s" % (sys.argv[3], len({s[0] for s in seen}), worst,
      ", ".join("%s %g = %g" % s for s in sorted(seen))))
P
  case $mod in /defect.*) ;; *) "$QATCHECK" vjp --case "$T/case_decl.json" >"$T/out" 2>&1 ||
    bad "$mod: vjp fails with tol --dump's member: $(grep -v ' pass ' "$T/out" | head -3)" ;; esac
  n=$((n + 1))
done <"$T/groups"
g=$(wc -l <"$T/groups")
[ "$n" -eq "$g" ] && [ "$n" -ge 30 ] && ok "$n modules: tol --dump equals derive" || bad "$n of $g modules compared"
finish
