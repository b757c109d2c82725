#!/bin/sh
# mode_evidence.sh: every piece of an execution mode's evidence is compared
# both ways, or the run is refused (docs/robustness.md, "Execution
# modes"). tests/e2e/exec_modes.py dumps the steps; tests/e2e/mode_evidence.py
# takes a piece of evidence away (or adds one) with h5py. Each of these
# passed, or compared less than the dumps hold, before; now `vjp` exits 2
# with one line naming what is missing and writes only its error report:
#   grad_accum   an accumulated group empty, or without d_bias; micro-batch
#                0's parameter gradients gone (a zero_grad passed); a gap
#                in the micro-batch numbers
#   no mode      /qatcheck_mode evidence without the root attribute `mode`
#                (a planted zero_grad passed), or with mode "eager"
#   --eager      an eager dump whose groups are empty, lack grads/, or hold
#                a mode's evidence; a module of the eager dump the mode's
#                dump lacks; a mode dump without grads/; --eager with a
#                tied or an autocast dump (accepted and never read)
#   recompute    the first forward's group empty
#   tied         a site without its share (a lost share passed); sites that
#                name no module
# and a tie whose first site is not selected is judged (exit 1, planted).
# The dumps come from a torch that sums CPU bf16 GEMMs in float32 (lib.inc's
# torch_f32acc), as exec_modes.sh's do. Skips (77) without one, or without
# torch.
. "$(dirname "$0")/lib.inc"
. "$(dirname "$0")/qatdump.inc"
torch_f32acc || { echo "skip: no torch here sums CPU bf16 GEMMs in float32 (torch 2 missing, torch 1.13 without AVX-512)"; exit 77; }
D=$T/d
mkdir -p "$D"
$PYF "$HERE/exec_modes.py" "$D/eager.h5:eager" "$D/plain.h5:eager:plain" "$D/recompute_ok.h5:recompute" \
  "$D/autocast_ok.h5:autocast" "$D/grad_accum_ok.h5:grad_accum" "$D/grad_accum_zero_grad.h5:grad_accum:zero_grad" \
  "$D/tied_ok.h5:tied" "$D/tied_storage.h5:tied:storage" >"$T/py.txt" 2>&1 &&
  $PYF "$HERE/mode_evidence.py" "$D" >>"$T/py.txt" 2>&1 || { cat "$T/py.txt"; echo "FAIL: dumping"; exit 1; }

# vjp NAME EAGER REGEX: vjp on dump NAME's linears (the trainer's gradients, tolerances derived),
# with --eager EAGER unless "-"
vjp() {
  printf '{"data": {"dump": "%s", "modules": "%s"}, "candidate": "dump", "tolerances": {"d_x": {"derive": true}, "d_weight": {"derive": true}, "d_bias": {"derive": true}}}\n' \
    "$D/$1.h5" "$3" >"$T/case.json"
  if [ "$2" = - ]; then set --; else set -- --eager "$D/$2.h5"; fi
  rm -f "$T/r.json"
  "$QATCHECK" vjp --case "$T/case.json" "$@" --json "$T/r.json"
}
# refused NAME EAGER REGEX NEEDLE: exit 2, one error line matching NEEDLE (grep), only the error report
refused() {
  expect_exit 2 "$1 (--eager $2) is refused" vjp "$1" "$2" "$3"
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep 'qatcheck: error:' "$T/err" | grep -q -- "$4" ||
    bad "$1: expected one error line naming '$4': $(cat "$T/err")"
  error_or_none "$T/r.json" || bad "$1: a refused run wrote a report other than its error report"
}
L='fc[12]$'
refused accum_empty plain "$L" "no '/qatcheck_mode/accumulated/fc1/d_bias': the micro-batch's module '/microbatch0/fc1'"
refused accum_empty - "$L" "no '/qatcheck_mode/accumulated/fc1/d_bias'"
refused accum_no_bias plain "$L" "no '/qatcheck_mode/accumulated/fc1/d_bias'"
refused accum_mb_no_grad - "$L" "module '/microbatch0/fc1' has no gradient d_bias"
refused accum_gap - "$L" "no '/microbatch1/fc1': micro-batches are numbered from 0 without a gap"
refused accum_no_mode - "$L" "holds '/qatcheck_mode'.* root attribute 'mode' is missing"
refused accum_mode_eager - "$L" "root attribute 'mode' is 'eager'"
refused recompute_ok eager_empty "$L" "eager_empty.h5': no '/fc1/inputs/x'"
refused recompute_ok eager_no_grads "$L" "eager_no_grads.h5': no '/fc1/grads/[a-z_]*/d_bias'"
refused recompute_ok eager_with_evidence "$L" "eager_with_evidence.h5' holds '/qatcheck_mode'"
refused recompute_no_fc2 eager "$L" "module '/fc2' has no counterpart '/fc2'"
refused recompute_no_grads eager "$L" "recompute_no_grads.h5': no '/fc1/grads/[a-z_]*/d_bias'"
refused recompute_ff_empty - "$L" "no '/qatcheck_mode/first_forward/fc1/inputs/x'"
refused tied_ok eager '^/(enc|dec)$' "is written in mode tied"
refused autocast_ok eager "$L" "is written in mode autocast"
refused tied_site_no_grad - '^/(enc|dec)$' "site module '/dec' holds no gradient d_weight"
refused tied_bad_sites - '^/enc$' "tie '/qatcheck_mode/tied/enc.weight': site 0 is not \"/module/param\""
# the tie named after /enc is judged when only /dec, its second site, is selected
expect_exit 1 "tied storage, only its second site selected: the tie fails" vjp tied_storage - '^/dec$'
"$PY" - "$T/r.json" <<'P' && ok "tied storage, /dec alone: /enc's tie fails" || bad "tied storage, /dec alone: $(cat "$T/out")"
import json, sys
r = json.load(open(sys.argv[1]))
assert [(c["module"], c["dy"], c["tensor"]) for c in r["checks"] if c["verdict"] != "pass"] == [("/enc", "tied:accumulated", "d_weight")], r["checks"]
P
finish
