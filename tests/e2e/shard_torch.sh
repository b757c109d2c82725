#!/bin/sh
# shard_torch.sh: sharded dumps (docs/interfaces.md "Sharded dumps"). A
# column-, row-, sequence-, vocab-, expert-parallel and FSDP (flat shards)
# step runs under torch.distributed (gloo, 4 CPU processes;
# tests/e2e/shard_torch.py) and scripts/qatdump.py writes one file per
# rank; `vjp` on the pattern assembles the whole tensors and judges every
# rank's gradients: the correct step passes, each planted reduction bug
# fails on its tensor and rank, with the diagnosis in its why. Bad sharded
# input (flat pieces included) exits 2 with one
# line; under mpirun -np 4 the report equals one process's, and a bad
# rank file of the module rank 2 audits names rank 2. Skips (77) without
# torch.distributed's gloo.
. "$(dirname "$0")/lib.inc"
"$PY" -c "import torch.distributed as d, h5py; assert d.is_available()" 2>/dev/null || { echo "skip: no torch.distributed"; exit 77; }
"$PY" tests/e2e/shard_torch.py "$T/sh" >"$T/py.log" 2>&1 || { cat "$T/py.log"; echo "FAIL: the distributed step"; exit 1; }
# the bias test stays on: a per-rank check takes its gradient's error model
# (an fp32 RMSNorm's one rounded 1/rms per token is allowed, even on a
# rank's 2-token piece)
TOL='"tolerances": {"d_x": {"rel_l2": 1e-5, "reasoning": "fp32"}, "d_weight": {"rel_l2": 1e-5, "reasoning": "fp32"},
  "d_bias": {"rel_l2": 1e-5, "reasoning": "fp32"}, "d_logits": {"rel_l2": 1e-5, "reasoning": "fp32"},
  "d_w1": {"rel_l2": 1e-5, "reasoning": "fp32"}, "d_w2": {"rel_l2": 1e-5, "reasoning": "fp32"},
  "d_topk_weights": {"rel_l2": 1e-5, "reasoning": "fp32"}}'
# check_mode MODE EXIT FAILING-CHECKS (module:tensor, sorted, comma-separated; - none) A-WORD-OF-THE-DIAGNOSIS (-: none)
check_mode() {
  mode=$1; want=$2; failing=$3; note=$4
  echo "{\"data\": {\"dump\": \"sh/$mode/step.rank*.h5\"}, \"candidate\": \"dump\", $TOL}" >"$T/$mode.json"
  expect_exit "$want" "sharded $mode: vjp" "$QATCHECK" vjp --case "$T/$mode.json" --json "$T/$mode.r.json"
  "$PY" - "$T/$mode.r.json" "$failing" "$note" <<'P' || bad "sharded $mode: not exactly the planted checks fail (or no '$note')"
import json, sys
r = json.load(open(sys.argv[1]))
failed = sorted(c["module"] + ":" + c["tensor"] for c in r["checks"] if c["verdict"] == "fail")
want = [] if sys.argv[2] == "-" else sys.argv[2].split(",")
assert failed == want, failed
assert len(r["checks"]) == 72, len(r["checks"])  # 7 modules, every gradient of every rank
note = sys.argv[3]
diag = lambda c: c.get("diagnosis", {}).get("summary", "")
assert note == "-" or all(note in diag(c) for c in r["checks"] if c["verdict"] == "fail"), [diag(c) for c in r["checks"] if c["verdict"] == "fail"]
assert all("parallel_reduction" in m["coverage"] for m in r["modules"]), "coverage without the parallel reduction"
print(sys.argv[1].split("/")[-1], "fails on", failed or "nothing")
P
}
DX=/col:d_x@rank0,/col:d_x@rank1,/col:d_x@rank2,/col:d_x@rank3
check_mode ok 0 - -
check_mode missing 1 $DX partial
check_mode twice 1 $DX twice
check_mode averaged 1 $DX averaged
check_mode order 1 /col:d_bias@rank0,/col:d_bias@rank1,/col:d_weight@rank0,/col:d_weight@rank1,$DX -
check_mode sp_norm 1 /norm:d_weight@rank0,/norm:d_weight@rank1,/norm:d_weight@rank2,/norm:d_weight@rank3 partial
check_mode vocab_lse 1 /logprob:d_logits@rank0,/logprob:d_logits@rank1,/logprob:d_logits@rank2,/logprob:d_logits@rank3 -
grep -q "consistent with: the reference's piece of rank 1: the shards are in the wrong order" "$T/order.r.json" && ok "order: rank 0's d_weight is named as rank 1's piece" || bad "order: no shard-order diagnosis"
# expert parallel (/moe): expert grads scaled by the EP size, the dispatch's
# backward not reduce-scattered, ranks 0 and 1's token pieces swapped
W1W2=/moe:d_w1@rank0,/moe:d_w1@rank1,/moe:d_w1@rank2,/moe:d_w1@rank3,/moe:d_w2@rank0,/moe:d_w2@rank1,/moe:d_w2@rank2,/moe:d_w2@rank3
check_mode ep_div 1 $W1W2 "1/4 of the reference"
check_mode ep_mul 1 $W1W2 "4 times the reference"
check_mode ep_reduce 1 /moe:d_topk_weights@rank0,/moe:d_topk_weights@rank1,/moe:d_topk_weights@rank2,/moe:d_topk_weights@rank3,/moe:d_x@rank0,/moe:d_x@rank1,/moe:d_x@rank2,/moe:d_x@rank3 "own parameter pieces' share only"
check_mode ep_order 1 /moe:d_topk_weights@rank0,/moe:d_topk_weights@rank1,/moe:d_x@rank0,/moe:d_x@rank1 "wrong order"
# FSDP flat shards (/fsdp, grad_reduce mean): summed not averaged, the
# reduce-scatter left out, ranks 0 and 1's flat pieces swapped
FW=/fsdp:d_weight@rank0,/fsdp:d_weight@rank1,/fsdp:d_weight@rank2,/fsdp:d_weight@rank3
check_mode fsdp_sum 1 $FW "4 times the reference (the world size): summed over the ranks where grad_reduce declares a mean"
check_mode fsdp_local 1 $FW "local gradient from its own pieces of the inputs only"
check_mode fsdp_order 1 /fsdp:d_weight@rank0,/fsdp:d_weight@rank1 "wrong order"
check_mode a2a_dup 1 /moe_a2a:d_x@rank0,/moe_a2a:d_x@rank1,/moe_a2a:d_x@rank2,/moe_a2a:d_x@rank3 -
# a flat gradient piece whose padding is not zero fails on that rank
mkdir "$T/sh/fsdp_pad" && cp "$T"/sh/ok/step.rank*.h5 "$T/sh/fsdp_pad/"
"$PY" - "$T/sh/fsdp_pad/step.rank3.h5" <<'P'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    f["fsdp/grads/dy/d_weight"][-1] = 0.5
P
check_mode fsdp_pad 1 /fsdp:d_weight@rank3 -
grep -q "the padding of the flat piece (elements 35 .. 35) holds a gradient" "$T/fsdp_pad.r.json" && ok "fsdp: a non-zero padding gradient is named" || bad "fsdp: no padding why"
# ---- bad sharded input: one line, exit 2, only the error report
refuse() { # refuse DESC NEEDLE PATTERN
  echo "{\"data\": {\"dump\": \"$3\"}, \"candidate\": \"dump\", $TOL}" >"$T/bad.json"
  rm -f "$T/bad.r.json"
  expect_exit 2 "$1" "$QATCHECK" vjp --case "$T/bad.json" --json "$T/bad.r.json"
  [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep 'qatcheck: error:' "$T/err" | grep -q "$2" || bad "$1: $(cat "$T/err")"
  error_or_none "$T/bad.r.json" || bad "$1: a report other than the error report"
}
refuse "no file matches" "no file matches" "sh/none/step.rank*.h5"
mkdir "$T/three" && cp "$T"/sh/ok/step.rank[012].h5 "$T/three/"
refuse "a rank's file missing" "world_size 4, but 3 file(s) match" "three/step.rank*.h5"
mkdir "$T/mixed" && cp "$T"/sh/ok/step.rank[023].h5 "$T/mixed/" && cp "$T/sh/twice/step.rank0.h5" "$T/mixed/step.rank1.h5"
refuse "two files of one rank" "both hold rank 0" "mixed/step.rank*.h5"
mkdir "$T/undecl" && cp "$T"/sh/ok/step.rank*.h5 "$T/undecl/"
"$PY" - "$T/undecl/step.rank2.h5" <<'P'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    del f["row/params/weight"].attrs["shard_dim"]
P
refuse "a split tensor without shard_dim" "no shard_dim: a tensor without it must be the same on every rank\|rank 0's is" "undecl/step.rank*.h5"
mkdir "$T/kind" && cp "$T"/sh/ok/step.rank*.h5 "$T/kind/"
"$PY" -c "import h5py, sys; h5py.File(sys.argv[1], 'r+')['col'].attrs['parallel'] = 'tp'" "$T/kind/step.rank0.h5"
refuse "a parallel kind that is only part of a known one" "attribute parallel 'tp': expected" "kind/step.rank*.h5"
# flat pieces: a piece of the wrong length, non-zero padding in a
# parameter, ranks disagreeing on the whole shape
flat_bad() { # flat_bad DIR RANK PYTHON-ON-f
  mkdir "$T/$1" && cp "$T"/sh/ok/step.rank*.h5 "$T/$1/"
  "$PY" - "$T/$1/step.rank$2.h5" "$3" <<'P'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r+") as f:
    exec(sys.argv[2])
P
}
flat_bad flen 2 'w = f["fsdp/params/weight"]; a = dict(w.attrs); v = w[:-1]; del f["fsdp/params/weight"]; f["fsdp/params/weight"] = v; f["fsdp/params/weight"].attrs.update(a)'
refuse "a flat piece of the wrong length" "flen/step.rank2.h5.*'/fsdp/params/weight' is \[35\]: expected a flat piece \[36\]" "flen/step.rank*.h5"
flat_bad fpad 3 'f["fsdp/params/weight"][-1] = 1.0'
refuse "non-zero padding in a flat parameter" "fpad/step.rank3.h5.*'/fsdp/params/weight': the padding of the flat piece (elements 35 .. 35) is not zero" "fpad/step.rank*.h5"
flat_bad fshape 1 'f["fsdp/params/weight"].attrs["shard_flat"] = "[11, 13]"'
refuse "ranks disagreeing on shard_flat" "fshape/step.rank1.h5.*shard_flat \[11, 13\] where rank 0's is \[13, 11\]" "fshape/step.rank*.h5"
flat_bad fred 0 'f["fsdp"].attrs["grad_reduce"] = "avg"'
refuse "an unknown grad_reduce" "fred/step.rank0.h5.*module '/fsdp': attribute grad_reduce 'avg': expected sum or mean" "fred/step.rank*.h5"
# ---- an FSDP2-style piece of no rows (a weight of 3 rows cut 3 and 0, as
# torch.chunk leaves the last ranks none): that rank's d_weight has no check,
# the rest is judged; a wrong d_weight on rank 0 still fails
mkdir "$T/empty"
"$PY" - "$T/empty" <<'P'
import sys, h5py, numpy as np
rng = np.random.default_rng(0)
x = [rng.standard_normal((2, 3)) for _ in range(2)]; dy = [rng.standard_normal((2, 3)) for _ in range(2)]
w = rng.standard_normal((3, 3)); gw = (np.concatenate(dy).T @ np.concatenate(x)) / 2
for bad in (0, 1, 2):
    for r, (a, b) in enumerate(((0, 3), (3, 3))):
        with h5py.File("%s/%s.rank%d.h5" % (sys.argv[1], ("ok", "bad", "ghost")[bad], r), "w") as f:
            f.attrs["qatcheck_dump"], f.attrs["rank"], f.attrs["world_size"] = 1, r, 2
            g = f.create_group("fc"); g.attrs["class"], g.attrs["parallel"], g.attrs["grad_reduce"] = "linear", "fsdp", "mean"
            for ds, v in (("inputs/x", x[r]), ("grad_out/dy", dy[r]), ("params/weight", w[a:b])):
                g[ds] = v; g[ds].attrs["shard_dim"] = 0
            g["grads/dy/d_x"] = dy[r] @ w
            g["grads/dy/d_weight"] = gw[a:b] * (1.5 if bad == 1 else 1) if bad < 2 or r == 0 else np.ones((2, 3))
P
for m in ok bad ghost; do
  echo "{\"data\": {\"dump\": \"empty/$m.rank*.h5\"}, \"candidate\": \"dump\", \"tolerances\": {\"d_x\": {\"rel_l2\": 1e-9, \"reasoning\": \"float64\"}, \"d_weight\": {\"rel_l2\": 1e-9, \"reasoning\": \"float64\"}}}" >"$T/e$m.json"
done
expect_exit 0 "an empty piece: vjp" "$QATCHECK" vjp --case "$T/eok.json" --json "$T/eok.r.json"
expect_exit 1 "an empty piece, rank 0's d_weight x1.5: vjp" "$QATCHECK" vjp --case "$T/ebad.json" --json "$T/ebad.r.json"
"$PY" - "$T/eok.r.json" "$T/ebad.r.json" <<'P' && ok "an empty piece: no check for it, the other pieces judged" || bad "an empty piece: wrong checks"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert sorted(c["tensor"] for c in a["checks"]) == ["d_weight@rank0", "d_x@rank0", "d_x@rank1"], [c["tensor"] for c in a["checks"]]
assert [c["tensor"] for c in b["checks"] if c["verdict"] == "fail"] == ["d_weight@rank0"]
P
expect_exit 1 "an empty piece whose rank holds a gradient anyway: vjp" "$QATCHECK" vjp --case "$T/eghost.json" --json "$T/eghost.r.json"
"$PY" - "$T/eghost.r.json" <<'P' && ok "an empty piece whose rank holds a gradient: that check fails, named" || bad "an empty piece with a gradient: not failed"
import json, sys
r = json.load(open(sys.argv[1]))
failed = [c for c in r["checks"] if c["verdict"] == "fail"]
assert [c["tensor"] for c in failed] == ["d_weight@rank1"] and "holds no piece" in failed[0]["why"], failed
P
cp "$T"/empty/ok.rank*.h5 "$T/"
"$PY" -c "import h5py, sys; h5py.File(sys.argv[1], 'r+')['fc'].attrs['parallel'] = 'sequence'" "$T/ok.rank1.h5"
refuse "ranks disagreeing on the parallel kind" "parallel 'sequence' where rank 0's is 'fsdp': the ranks disagree" "ok.rank*.h5"
# ---- cpu_bf16_gemm_acc on a sharded dump (gemm_acc.sh: the whole-dump
# rule): every rank's /col says its producer summed bf16 GEMMs in bf16, and
# rank 0's d_x is 0.1% off, within a bf16 sum's reach: cannot judge (exit
# 2, naming the module); under "float32" the same rank fails (exit 1)
for acc in bfloat16 float32; do
  mkdir -p "$T/acc_$acc" && cp "$T"/sh/ok/step.rank*.h5 "$T/acc_$acc/"
  "$PY" - "$T/acc_$acc" "$acc" <<'P' || bad "could not plant cpu_bf16_gemm_acc $acc"
import glob, sys, h5py
for p in sorted(glob.glob(sys.argv[1] + "/step.rank*.h5")):
    with h5py.File(p, "r+") as f:
        f["col"].attrs["cpu_bf16_gemm_acc"] = sys.argv[2]
        if p.endswith("rank0.h5"):
            for dy in f["col/grads"]:
                d = f["col/grads/%s/d_x" % dy]
                d[...] = d[...] * 1.001
P
  echo "{\"data\": {\"dump\": \"acc_$acc/step.rank*.h5\", \"modules\": \"^/col$\"}, \"candidate\": \"dump\", $TOL}" >"$T/acc_$acc.json"
done
expect_exit 2 "sharded, cpu_bf16_gemm_acc bfloat16, rank 0's d_x 0.1% off: cannot judge" "$QATCHECK" vjp --case "$T/acc_bfloat16.json"
grep -q "module '/col': cannot judge: its dy check d_x@rank0 failed at rel_l2 .*'cpu_bf16_gemm_acc' is 'bfloat16'" "$T/err" &&
  ok "sharded: the refusal names the module, rank 0's d_x and the attribute" || bad "sharded refusal: $(cat "$T/err")"
expect_exit 1 "sharded, cpu_bf16_gemm_acc float32, rank 0's d_x 0.1% off: fails" "$QATCHECK" vjp --case "$T/acc_float32.json"
# ---- mpirun -np 4: the same report; a bad file of the module rank 2 audits
if command -v mpirun >/dev/null 2>&1 && "$QATCHECK" vjp --help 2>/dev/null | grep -q . ; then
  MPIRUN="mpirun --oversubscribe -np 4"; [ "$(id -u)" = 0 ] && MPIRUN="mpirun --allow-run-as-root --oversubscribe -np 4"
  export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
  mkdir "$T/m"
  (cd "$T/m" && timeout 300 $MPIRUN "$QATCHECK" vjp --case "$T/missing.json" --json r.json -q >"$T/out" 2>"$T/err"); rc=$?
  if grep -q "built without MPI" "$T/err"; then echo "skip: mpirun part (built without MPI)"; else
    [ $rc -eq 1 ] && ok "sharded under mpirun -np 4: exit 1" || bad "sharded under mpirun: exit $rc: $(tail -3 "$T/err")"
    "$PY" - "$T/missing.r.json" "$T/m/r.json" <<'P' && ok "sharded under mpirun -np 4: the report equals one process's" || bad "sharded under mpirun: reports differ"
import json, sys
def strip(o):
    if isinstance(o, dict): return {k: strip(v) for k, v in o.items() if k not in ("seconds", "timing_s", "command_line")}
    if isinstance(o, list): return [strip(v) for v in o]
    return o
a, b = (strip(json.load(open(p))) for p in sys.argv[1:3])
assert a == b
P
    # modules in path order /col /fsdp /logprob /moe /norm /row, round robin: /logprob is rank 2's
    mkdir "$T/r2" && cp "$T"/sh/ok/step.rank*.h5 "$T/r2/"
    "$PY" - "$T/r2/step.rank1.h5" <<'P'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    del f["logprob/grads/dy/d_logits"]
P
    echo "{\"data\": {\"dump\": \"r2/step.rank*.h5\"}, \"candidate\": \"dump\", $TOL}" >"$T/r2.json"
    (cd "$T/m" && rm -f r.json && timeout 300 $MPIRUN "$QATCHECK" vjp --case "$T/r2.json" --json r.json >"$T/out" 2>"$T/err"); rc=$?
    [ $rc -eq 2 ] && [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep 'qatcheck: error:' "$T/err" | grep -q "rank 2: .*step.rank1.h5.*/logprob.*d_logits" \
      && ok "sharded under mpirun: a bad file of rank 2's module: exit 2 naming rank 2" || bad "sharded bad file under mpirun: exit $rc: $(cat "$T/err")"
    error_or_none "$T/m/r.json" || bad "sharded bad file under mpirun: a report other than the error report"
  fi
fi
finish
