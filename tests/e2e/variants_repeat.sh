#!/bin/sh
# variants_repeat.sh: a reference variant whose reference of the judged
# gradient repeats the contract's or an earlier variant's is not computed
# (qc_class.grad_reads, docs/tolerances.md "Reference variants"): linear's
# d_x = dY W_ref reads no x, so its bf16_inputs variants repeat others;
# d_bias reads dY alone; d_weight = dY^T X_ref with X_ref = x rounds the
# same x under bf16_inputs and round_ops, so either or both is one
# variant. The judgement is the one every variant computed
# gives: each check judged against the same variant, a planted d_x x 1.01
# still fails (against the variant it lies closest to) with its factor
# diagnosed. Under a clipped STE that quantizes the activation d_x reads x
# (its mask), and its bf16_inputs variants are computed.
. "$(dirname "$0")/lib.inc"
$PY tests/e2e/variants_repeat.py "$T/r.h5" 3 || { bad "could not write the dump"; finish; }
printf '{"data": {"dump": "r.h5"}, "candidate": "dump", "tolerances": {"d_x": {"derive": true}, "d_weight": {"derive": true}, "d_bias": {"derive": true}}}\n' >"$T/c.json"
expect_exit 1 "three fp8 linears under autocast's roundings, one with d_x x 1.01" "$QATCHECK" vjp -v --case "$T/c.json" --json "$T/r.json"
$PY - "$T/r.json" <<'P' && ok "every check judged against the variant it fits; the planted d_x fails, its factor named" || bad "the judgement changed"
import json, sys
c = {(k["module"], k["tensor"]): k for k in json.load(open(sys.argv[1]))["checks"]}
for m in ("/lin0", "/lin1", "/lin2"):
    want = {"d_x": "bf16_dy", "d_weight": "bf16_dy+bf16_inputs", "d_bias": "bf16_dy"}
    for g, v in want.items():
        k = c[(m, g)]
        assert k["variant"] == v, (m, g, k["variant"])
        assert k["verdict"] == ("fail" if (m, g) == ("/lin2", "d_x") else "pass"), (m, g, k["verdict"])
assert "k = 1.01" in c[("/lin2", "d_x")]["diagnosis"]["summary"], c[("/lin2", "d_x")]["diagnosis"]
P
for m in lin0 lin2; do
  grep -q "^qatcheck: /$m dy=dy: variant bf16_inputs for d_x: the same reference as the contract's, not judged again$" "$T/err" &&
    grep -q "^qatcheck: /$m dy=dy: variant bf16_dy+bf16_inputs+round_ops for d_x: the same reference as bf16_dy+round_ops, not judged again$" "$T/err" &&
    grep -q "^qatcheck: /$m dy=dy: variant round_ops for d_bias: the same reference as the contract's, not judged again$" "$T/err" &&
    grep -q "^qatcheck: /$m dy=dy: variant bf16_dy+round_ops for d_weight: the same reference as bf16_dy+bf16_inputs, not judged again$" "$T/err" &&
    grep -q "^qatcheck: /$m dy=dy: variant references: 6 computed, 10 saved (repeats of another's)$" "$T/err" &&
    ok "/$m: -v names the variants whose reference repeats another's (6 of 14 variant references computed)" || bad "/$m: -v: $(grep "/$m dy=dy: variant" "$T/err")"
done
! grep -q "^qatcheck: /lin1 dy=dy: variant .* for d_x:" "$T/err" && grep -q "^qatcheck: /lin1 dy=dy: variant references: 10 computed, 4 saved" "$T/err" &&
  ok "/lin1 (a clipped STE on the quantized activation): d_x reads x, every variant of it computed" || bad "/lin1: -v: $(grep "/lin1 dy=dy: variant" "$T/err")"
finish
