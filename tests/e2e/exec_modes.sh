#!/bin/sh
# exec_modes.sh: execution modes observed, not declared (docs/qatdump.md
# "Execution modes", docs/audit.md). tests/e2e/exec_modes.py dumps one step
# of a small CPU model under activation recompute, autocast, micro-batch
# accumulation and a tied weight, correct and with a planted defect each,
# beside the eager step; `vjp --eager` must pass the correct ones (exit 0,
# the mode's coverage item covered) and fail each defect (exit 1) on the
# module, mode and tensor it breaks:
#   recompute reseed      a new stochastic-rounding seed in the recompute
#   recompute rescale     a delayed-scaling history advanced by the recompute
#   grad_accum zero_grad  .grad cleared at each micro-batch (one dropped)
#   grad_accum double_scale  the micro-batch mean taken twice
# and the same under torch.autocast (bf16-valued micro-batch gradients
# summed in the float32 .grad: the eager comparison is bounded by the
# precision the values carry, bfloat16's, so the correct step passes and
# the two defects still fail as they do in float32),
#   tied storage          the second site's gradient never reaches the weight
# (a tie of two modules, and one linear called twice, pass)
# and refuse what cannot be judged (exit 2, one line). The CUDA Graph mode
# needs a GPU to capture (tests/e2e/cuda_graph.sh); here its judgement runs
# on the dumps an H200 made (tests/data/torch/cuda_graph/). Each module
# group records autocast ("bfloat16" under torch.autocast, "off" outside).
# The dumps come from a torch that sums CPU bf16 GEMMs in float32 (lib.inc's
# torch_f32acc: torch 2, or torch 1.13 with AVX-512), as the linear class
# models; skips (77) without one, or without torch.
. "$(dirname "$0")/lib.inc"
. "$(dirname "$0")/qatdump.inc"
torch_f32acc || { echo "skip: no torch here sums CPU bf16 GEMMs in float32 (torch 2 missing, torch 1.13 without AVX-512)"; exit 77; }
D=$T/d
mkdir -p "$D"
$PYF "$HERE/exec_modes.py" "$D/eager.h5:eager" "$D/plain.h5:eager:plain" \
  "$D/recompute_ok.h5:recompute" "$D/recompute_nonreentrant.h5:recompute:nonreentrant" "$D/recompute_reseed.h5:recompute:reseed" "$D/recompute_rescale.h5:recompute:rescale" \
  "$D/autocast_ok.h5:autocast" \
  "$D/grad_accum_ok.h5:grad_accum" "$D/grad_accum_zero_grad.h5:grad_accum:zero_grad" \
  "$D/grad_accum_double_scale.h5:grad_accum:double_scale" \
  "$D/eager_bf16.h5:eager:bf16" "$D/grad_accum_bf16.h5:grad_accum:bf16" \
  "$D/grad_accum_bf16_zero_grad.h5:grad_accum:bf16_zero_grad" "$D/grad_accum_bf16_double_scale.h5:grad_accum:bf16_double_scale" \
  "$D/tied_ok.h5:tied" "$D/tied_storage.h5:tied:storage" "$D/tied_repeat.h5:tied:repeat" >"$T/py.txt" 2>&1 || { cat "$T/py.txt"; echo "FAIL: dumping"; exit 1; }

# case DUMP REGEX: the trainer's gradients of the matching linears, tolerances derived
case_for() {
  printf '{"data": {"dump": "%s", "modules": "%s"}, "candidate": "dump", "tolerances": {"d_x": {"derive": true}, "d_weight": {"derive": true}, "d_bias": {"derive": true}}}\n' "$1" "$2"
}
# judge NAME EAGER WANT FAILED COVERED: vjp on dump NAME (with --eager EAGER
# unless "-"), exit WANT; FAILED: the failed checks as "module|dy|tensor"
# (space-separated, sorted; "-": none); COVERED: the coverage item every
# module must show on a pass
judge() {
  name=$1; eager=$2; want=$3; failed=$4; covered=$5
  re='fc[12]$'; case $name in tied_repeat) re='lin$' ;; tied*) re='^/(enc|dec)$' ;; esac
  case_for "$D/$name.h5" "$re" >"$T/$name.json"
  if [ "$eager" = - ]; then set -- ; else set -- --eager "$D/$eager.h5"; fi
  "$QATCHECK" vjp --case "$T/$name.json" "$@" --json "$T/$name.r.json" >"$T/$name.out" 2>&1
  rc=$?
  if [ $rc -ne "$want" ]; then bad "$name: exit $rc, expected $want"; sed 's/^/      /' "$T/$name.out" | tail -20; return; fi
  "$PY" - "$T/$name.r.json" "$failed" "$covered" <<'P' && ok "$name: exit $rc, failed: $failed" || { bad "$name"; tail -20 "$T/$name.out"; }
import json, sys
r = json.load(open(sys.argv[1]))
failed = sorted({"%s|%s|%s" % (c["module"], c["dy"], c["tensor"]) for c in r["checks"] if c["verdict"] != "pass"})
want = [] if sys.argv[2] == "-" else sorted(sys.argv[2].split())
if failed != want:
    print("failed checks %s, expected %s" % (failed, want)); sys.exit(1)
if not failed:
    miss = [m["module"] for m in r["modules"] if sys.argv[3] not in m["coverage"]]
    if miss:
        print("coverage %s missing on %s" % (sys.argv[3], miss)); sys.exit(1)
modes = {c["dy"].split(":")[0] for c in r["checks"] if ":" in c["dy"]}
if sys.argv[3] != "autocast" and not modes:
    print("no mode check was made"); sys.exit(1)
P
}

judge recompute_ok eager 0 - recompute
judge recompute_nonreentrant eager 0 - recompute
ff="/fc1|recompute:first_forward|inputs/x /fc1|recompute:first_forward|outputs/y /fc2|recompute:first_forward|inputs/x /fc2|recompute:first_forward|outputs/y"
ea="/fc1|recompute:eager|inputs/x /fc1|recompute:eager|outputs/y /fc1|recompute:eager|grad_out/dy /fc1|recompute:eager|d_x /fc1|recompute:eager|d_weight /fc1|recompute:eager|d_bias /fc2|recompute:eager|inputs/x /fc2|recompute:eager|outputs/y /fc2|recompute:eager|d_weight"
judge recompute_reseed eager 1 "$ff $ea" -
judge recompute_rescale eager 1 "$ff $ea" -
judge recompute_reseed - 1 "$ff" -   # without the eager step: the first forward alone convicts it
judge autocast_ok - 0 - autocast
judge grad_accum_ok plain 0 - grad_accumulation
judge grad_accum_zero_grad plain 1 "/fc1|grad_accum:accumulated|d_weight /fc1|grad_accum:accumulated|d_bias /fc2|grad_accum:accumulated|d_weight /fc2|grad_accum:accumulated|d_bias" -
grep -q "micro-batch 0's gradient is not in the accumulated .grad" "$T/grad_accum_zero_grad.out" || bad "zero_grad: no diagnosis naming micro-batch 0"
judge grad_accum_double_scale plain 1 "/fc1|grad_accum:eager|d_weight /fc1|grad_accum:eager|d_bias /fc2|grad_accum:eager|d_weight /fc2|grad_accum:eager|d_bias" -
grep -q "constant factor k = 0.5" "$T/grad_accum_double_scale.out" || bad "double_scale: no diagnosis of the factor 0.5"
judge grad_accum_bf16 eager_bf16 0 - grad_accumulation
grep -q "each rounded to the precision their values carry (u = 0.0039" "$T/grad_accum_bf16.r.json" ||
  bad "grad_accum_bf16: the eager bound does not name the values' bfloat16 precision"
judge grad_accum_bf16_zero_grad eager_bf16 1 "/fc1|grad_accum:accumulated|d_weight /fc1|grad_accum:accumulated|d_bias /fc2|grad_accum:accumulated|d_weight /fc2|grad_accum:accumulated|d_bias" -
judge grad_accum_bf16_double_scale eager_bf16 1 "/fc1|grad_accum:eager|d_weight /fc1|grad_accum:eager|d_bias /fc2|grad_accum:eager|d_weight /fc2|grad_accum:eager|d_bias" -
judge tied_ok - 0 - shared_params
judge tied_repeat - 0 - shared_params   # one linear called twice: /call0/lin, /call1/lin
judge tied_storage - 1 "/enc|tied:accumulated|d_weight" -
grep -q "(/dec/weight) is lost" "$T/tied_storage.out" || bad "tied storage: no diagnosis naming the lost site"

# the audit marks the four modes covered and still names CUDA Graph as missing
"$QATCHECK" report --allow-incomplete "$T/recompute_ok.r.json" "$T/autocast_ok.r.json" "$T/grad_accum_ok.r.json" "$T/tied_ok.r.json" \
  --markdown "$T/audit.md" >"$T/report.out" 2>&1 || bad "report of the passing modes: exit $?"
for item in "recompute (activation checkpointing)" "autocast" "gradient accumulation" "shared parameters: gradient accumulation across use sites"; do
  grep -q "^| $item | covered" "$T/audit.md" || bad "audit: '$item' is not covered"
done
grep -q "CUDA Graph\*\* in class linear: needs" "$T/audit.md" && ok "audit: the covered modes, CUDA Graph named missing" \
  || bad "audit: CUDA Graph is not named as missing"

# CUDA Graph on the dumps an H200 made (torch 2.11: tests/e2e/cuda_graph.sh there):
# the replay equals the eager step bit for bit, a stale static input fails
DUMPS="$HERE/../data/torch/cuda_graph" sh "$HERE/cuda_graph.sh" >"$T/cg.out" 2>&1 \
  && ok "cuda_graph: the H200's replay passes, its stale input fails" || { bad "cuda_graph on the H200 dumps"; cat "$T/cg.out"; }

# what cannot be judged: exit 2, one line naming the file
case_for "$D/recompute_ok.h5" 'fc[12]$' >"$T/c.json"
case_for "$D/eager.h5" 'fc[12]$' >"$T/e.json"
expect_exit 2 "--eager on an eager dump is refused" "$QATCHECK" vjp --case "$T/e.json" --eager "$D/eager.h5"
grep -q "qatcheck: error: --eager .*is itself an eager step" "$T/err" || bad "eager on eager: $(cat "$T/err")"
expect_exit 2 "--eager naming a mode dump is refused" "$QATCHECK" vjp --case "$T/c.json" --eager "$D/recompute_ok.h5"
grep -q "root attribute 'mode' is 'recompute': expected the eager dump" "$T/err" || bad "eager mode dump: $(cat "$T/err")"
"$PY" -c "import h5py, shutil, sys; shutil.copy(sys.argv[1], sys.argv[2]); h5py.File(sys.argv[2], 'a').attrs['mode'] = 'jit'" \
  "$D/recompute_ok.h5" "$D/jit.h5"
case_for "$D/jit.h5" 'fc[12]$' >"$T/j.json"
expect_exit 2 "an unknown mode is refused" "$QATCHECK" vjp --case "$T/j.json"
[ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep -q "root attribute 'mode' is 'jit'" "$T/err" || bad "unknown mode: $(cat "$T/err")"
# a mode dump without its evidence: exit 2, one line naming the file and what is missing
"$PY" - "$D" <<'P'
import h5py, shutil, sys
d = sys.argv[1]
shutil.copy(d + "/grad_accum_ok.h5", d + "/noacc.h5")
with h5py.File(d + "/noacc.h5", "a") as f:
    del f["qatcheck_mode/accumulated"]
shutil.copy(d + "/tied_ok.h5", d + "/nosites.h5")
with h5py.File(d + "/nosites.h5", "a") as f:
    del f["qatcheck_mode/tied/enc.weight"].attrs["sites"]
P
case_for "$D/noacc.h5" 'fc[12]$' >"$T/na.json"
case_for "$D/nosites.h5" '^/(enc|dec)$' >"$T/ns.json"
for c in "na:the accumulated gradients of module '/fc1' are missing" "ns:has no string attribute 'sites'"; do
  expect_exit 2 "${c%%:*}: refused" "$QATCHECK" vjp --case "$T/${c%%:*}.json" --json "$T/${c%%:*}.r.json"
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep -q "${c#*:}" "$T/err" || bad "${c%%:*}: $(cat "$T/err")"
  error_or_none "$T/${c%%:*}.r.json" || bad "${c%%:*}: a refused run wrote a report other than its error report"
done
# each module group records whether autocast was on at its call (evidence for the reference variants)
"$PY" - "$D" <<'P' && ok "qatdump records autocast per module: bfloat16 under torch.autocast, off outside" \
  || bad "the module groups' autocast attribute"
import sys, h5py
for name, want in (("autocast_ok", "bfloat16"), ("eager", "off"), ("recompute_ok", "off")):
    with h5py.File("%s/%s.h5" % (sys.argv[1], name), "r") as f:
        got = {g: f[g].attrs.get("autocast") for g in f if "class" in f[g].attrs}
        assert got and all(v == want for v in got.values()), (name, got)
P
finish
