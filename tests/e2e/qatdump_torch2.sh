#!/bin/sh
# qatdump_torch2.sh: scripts/qatdump.py under torch 2 (issue #38 item 0).
# A DeepSeek-V3-style block (tests/e2e/qatdump_torch2.py: MLA-like
# attention with a YaRN rotary Function whose backward returns None for
# its frequency table, a noaux_tc sigmoid router with
# e_score_correction_bias, fused routed experts with a shared expert, a
# custom-Function bf16 linear fed by stochastic rounding) is dumped in
# every CPU mode (eager, recompute under a reentrant and a non-reentrant
# checkpoint, autocast, grad_accum, tied) under torch 2 ($PY2) and torch
# 1.13 ($PY); `vjp` must reach the same verdicts from both: pass for the
# correct block, and fail exactly the planted defect's checks (the shared
# expert's d_x lost; the rotary backward turning dY the wrong way). Both
# torches' dumps hold the same datasets and attributes. (cuda_graph needs a
# GPU: tests/e2e/cuda_graph.sh.) Skips (77) without torch 2.
. "$(dirname "$0")/lib.inc"
. "$(dirname "$0")/qatdump.inc"
have_torch2 || { echo "skip: torch 2 missing under $QC_TORCH2 (scripts/install-deps.sh)"; exit 77; }
LEGS="eager.h5:eager bug.h5:eager:shared_dx rc.h5:recompute rcnr.h5:recompute_nr rcnr_bug.h5:recompute_nr:shared_dx
ac.h5:autocast ac_bug.h5:autocast:rope_sign ga.h5:grad_accum ga_bug.h5:grad_accum:shared_dx tied.h5:tied"
for v in 1 2; do
  mkdir -p "$T/t$v"
  py="$PY"; [ $v = 2 ] && py="$PY2"
  # shellcheck disable=SC2086
  (cd "$T/t$v" && $py -W ignore "$HERE/qatdump_torch2.py" $LEGS) >"$T/t$v.log" 2>&1 \
    && ok "torch $v: every mode dumped" || { bad "torch $v: dumping"; grep '^FAIL' "$T/t$v.log"; }
done

# judge V NAME EAGER WANT FAILED: vjp (tolerances derived) on torch V's dump
# NAME (with --eager EAGER unless "-"): exit WANT, FAILED the failed checks
# "module|dy|tensor" (sorted; "-": none, or an error report's)
judge() {
  v=$1; name=$2; eager=$3; want=$4; failed=$5
  printf '{"data": {"dump": "%s/t%s/%s.h5", "modules": ".*"}, "candidate": "dump", "tolerances": {' "$T" "$v" "$name" >"$T/c.json"
  sep=""
  for t in d_x d_weight d_bias d_logits d_w1 d_w2 d_topk_weights d_shared_w1 d_shared_w2; do
    printf '%s"%s": {"derive": true}' "$sep" $t >>"$T/c.json"; sep=", "
  done
  printf '}}\n' >>"$T/c.json"
  [ -f "$T/t$v/$name.h5" ] || { bad "torch $v: $name: not dumped"; return; }
  if [ "$eager" = - ]; then set -- ; else set -- --eager "$T/t$v/$eager.h5"; fi
  rm -f "$T/r.json"
  "$QATCHECK" vjp --case "$T/c.json" "$@" --json "$T/r.json" >"$T/out" 2>&1
  rc=$?
  got=$("$PY" -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(" ".join(sorted({"%s|%s|%s" % (c["module"], c["dy"], c["tensor"]) for c in r.get("checks", []) if c["verdict"] != "pass"})) or "-")' "$T/r.json" 2>/dev/null)
  if [ "$rc" -eq "$want" ] && [ "$got" = "$failed" ]; then ok "torch $v: $name: exit $rc, failed: $got"
  else bad "torch $v: $name: exit $rc (expected $want), failed: $got (expected $failed)"; tail -8 "$T/out"; fi
}
# cannot_judge V NAME, after judge V NAME - 2 -: torch V's dump NAME, whose
# autocast linears ran torch 1.13's own bf16 GEMMs (no AVX-512: qatdump
# measured cpu_bf16_gemm_acc "bfloat16"), was refused as cannot judge at
# its first failed GEMM check; the report left is its error report or none
cannot_judge() {
  if grep -q "cannot judge: its [a-z_]* check [a-z_/]* failed at rel_l2 .* products can err, and attribute 'cpu_bf16_gemm_acc' is 'bfloat16'" "$T/out" &&
    error_or_none "$T/r.json"; then ok "torch $1: $2: cannot judge: $(grep -o "module '[^']*'" "$T/out" | head -1)"
  else bad "torch $1: $2: the refusal does not name cpu_bf16_gemm_acc, or a report other than the error report was left"; tail -4 "$T/out"; fi
}
acc1=$("$PY" -c 'import sys, h5py
f = h5py.File(sys.argv[1], "r")
print(" ".join(sorted({str(f[g].attrs["cpu_bf16_gemm_acc"]) for g in f if "cpu_bf16_gemm_acc" in f[g].attrs})))' "$T/t1/ac.h5")
for v in 1 2; do
  judge $v eager - 0 -
  judge $v bug - 1 "/block.experts|dy|d_x"
  judge $v rc eager 0 -
  judge $v rcnr eager 0 -
  judge $v rcnr_bug - 1 "/block.experts|dy|d_x"
  if [ $v = 1 ] && [ "$acc1" = bfloat16 ]; then
    judge $v ac - 2 -; cannot_judge $v ac
    judge $v ac_bug - 2 -; cannot_judge $v ac_bug
  else
    [ "$acc1" = float32 ] || [ $v = 2 ] || bad "torch 1: ac.h5 records cpu_bf16_gemm_acc '$acc1': expected float32 or bfloat16"
    judge $v ac - 0 -
    judge $v ac_bug - 1 "/block.k_rope|dy|d_x /block.q_rope|dy|d_x"
  fi
  judge $v ga eager 0 -
  judge $v ga_bug bug 1 "/microbatch0/block.experts|dy|d_x /microbatch1/block.experts|dy|d_x"
  judge $v tied - 0 -
done

# both torches wrote the same dumps: datasets (shape, dtype), attributes
# (not_captured: the rotary table's None gradient named alike;
# cpu_bf16_gemm_acc present alike, its value what each torch measured on
# this CPU), and under
# recompute the recomputed forward of the block's last module and the
# saved topk_ids the backward used
"$PY" - "$T" $LEGS <<'P' && ok "torch 1.13 and torch 2 write the same datasets and attributes" || bad "the dumps differ"
import sys
import h5py
T = sys.argv[1]
def layout(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, (tuple(o.shape), str(o.dtype), dict(o.attrs)) if isinstance(o, h5py.Dataset)
                                                   else {k: "measured" if k == "cpu_bf16_gemm_acc" else v
                                                         for k, v in o.attrs.items()}))
        out["/"] = dict(f.attrs)
    return out
bad = 0
for leg in sys.argv[2:]:
    name = leg.split(":")[0]
    try:
        a, b = layout("%s/t1/%s" % (T, name)), layout("%s/t2/%s" % (T, name))
    except OSError as e:
        print("%s: %s" % (name, e))
        bad = 1
        continue
    for k in sorted(set(a) | set(b)):
        if str(a.get(k)) != str(b.get(k)):
            print("%s: %s: torch 1.13 %s, torch 2 %s" % (name, k, a.get(k), b.get(k)))
            bad = 1
    if name.startswith("rc"):
        for k in ("block.experts/outputs/y", "block.router/saved/topk_ids", "block.experts/saved/topk_ids",
                  "qatcheck_mode/first_forward/block.experts/outputs/y"):
            if k not in b:
                print("%s: no %s" % (name, k))
                bad = 1
    if name == "eager" and "inv_freq" not in str(b.get("block.q_rope")):
        print("eager: the rotary table's None gradient is not named: %s" % b.get("block.q_rope"))
        bad = 1
sys.exit(bad)
P
finish
