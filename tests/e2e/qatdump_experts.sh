#!/bin/sh
# qatdump_experts.sh: empty and late experts (issue #38 item 4). Routed
# experts as separate nn.Linear MLPs (tests/e2e/qatdump_experts.py): expert
# 2 receives no token, so its forward never runs; under grad_accum expert 3
# runs in micro-batch 1 only. scripts/qatdump.py writes each as an empty
# call (no token in, an empty dY, its parameter gradients what the step gave
# them), the late expert under its true micro-batch; `vjp` expects a zero
# gradient there and checks it: the correct step passes, with checks for the
# empty expert, and a gradient left in the idle expert's .grad fails exactly
# that parameter (eager: its d_weight; grad_accum: its accumulated .grad),
# while a .grad it held before attach() passes.
# Under torch 1.13 ($PY) and, where installed, torch 2 ($PY2) alike.
# Skips (77) without torch.
. "$(dirname "$0")/lib.inc"
. "$(dirname "$0")/qatdump.inc"
vs=1; have_torch2 && vs="1 2"
for v in $vs; do
  mkdir -p "$T/t$v"
  py="$PY"; [ $v = 2 ] && py="$PY2"
  (cd "$T/t$v" && $py -W ignore "$HERE/qatdump_experts.py" e.h5:eager ebug.h5:eager:idle_grad ebefore.h5:eager:grad_before ga.h5:grad_accum \
    gabug.h5:grad_accum:idle_grad) >"$T/t$v.log" 2>&1 && ok "torch $v: an empty and a late expert dumped" \
    || { bad "torch $v: dumping"; tail -3 "$T/t$v.log"; }
done

# judge V NAME EAGER WANT FAILED: as in qatdump_torch2.sh, tolerances derived
judge() {
  v=$1; name=$2; eager=$3; want=$4; failed=$5
  [ -f "$T/t$v/$name.h5" ] || { bad "torch $v: $name: not dumped"; return; }
  printf '{"data": {"dump": "%s", "modules": ".*"}, "candidate": "dump", "tolerances": {"d_x": {"derive": true}, "d_weight": {"derive": true}}}\n' \
    "$T/t$v/$name.h5" >"$T/c.json"
  if [ "$eager" = - ]; then set -- ; else set -- --eager "$T/t$v/$eager.h5"; fi
  "$QATCHECK" vjp --case "$T/c.json" "$@" --json "$T/$v.$name.r.json" >"$T/out" 2>&1
  rc=$?
  got=$("$PY" -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(" ".join(sorted({"%s|%s|%s" % (c["module"], c["dy"], c["tensor"]) for c in r["checks"] if c["verdict"] != "pass"})) or "-")' "$T/$v.$name.r.json" 2>/dev/null)
  if [ "$rc" -eq "$want" ] && [ "$got" = "$failed" ]; then ok "torch $v: $name: exit $rc, failed: $got"
  else bad "torch $v: $name: exit $rc (expected $want), failed: $got (expected $failed)"; tail -4 "$T/out"; fi
}
for v in $vs; do
  judge $v e - 0 -
  judge $v ebug - 1 "/experts.2.gate_proj|dy|d_weight"
  judge $v ebefore - 0 -   # a .grad from before attach() is not the step's
  judge $v ga e 0 -
  judge $v gabug e 1 "/experts.2.gate_proj|grad_accum:accumulated|d_weight"
  # the empty expert is judged (its zero gradients checked), not left out; the late one sits in micro-batch 1
  "$PY" - "$T/$v.e.r.json" "$T/$v.ga.r.json" "$T/t$v/ga.h5" <<'P' && ok "torch $v: the empty expert is checked, the late one is under /microbatch1" \
    || bad "torch $v: the empty or the late expert"
import json, sys
import h5py
bad = 0
e = {(c["module"], c["tensor"]): c for c in json.load(open(sys.argv[1]))["checks"]}
for p in ("gate_proj", "up_proj", "down_proj"):
    for t in ("d_weight", "d_x"):
        c = e.get(("/experts.2." + p, t))
        if c is None or c["verdict"] != "pass":
            print("eager: no passing %s check of /experts.2.%s: %s" % (t, p, c)); bad = 1
ga = {(c["module"], c["tensor"]) for c in json.load(open(sys.argv[2]))["checks"]}
for k in ("/microbatch0/experts.3.gate_proj", "/microbatch1/experts.3.gate_proj", "/microbatch0/experts.2.gate_proj"):
    if (k, "d_weight") not in ga:
        print("grad_accum: %s d_weight not checked" % k); bad = 1
with h5py.File(sys.argv[3], "r") as f:
    x0, x1 = f["microbatch0/experts.3.gate_proj/inputs/x"], f["microbatch1/experts.3.gate_proj/inputs/x"]
    if x0.shape != (0, 16) or x1.shape != (4, 16) or f.attrs["microbatches"] != 2:
        print("late expert: micro-batch 0 holds %s, 1 holds %s (microbatches %s): expected [0, 16] and [4, 16]"
              % (x0.shape, x1.shape, f.attrs["microbatches"])); bad = 1
sys.exit(bad)
P
done
finish
