#!/bin/sh
# split.sh: one module split across ranks (case key "split", engine/split.c,
# docs/distributed.md) under `mpirun --oversubscribe -np 4` on the CPU:
# an lm_head-like linear split along N and a vocab-parallel log-prob split
# along V give one process's verdicts with metrics equal within 1e-9
# (relative; the sums run in another order), from a dump written with h5py
# (candidates computed as a trainer does, in numpy) and from generated
# instances; planted defects (d_x scaled by 1.01; d_weight rows of rank 2's
# slice doubled; each vocab shard normalized by its own sum-exp) fail on
# their tensor under the split; a bad module on rank 2 before a split unit:
# every rank exits 2 with one error line naming rank 2, no rank hangs, only
# the error report; a module that cannot be split: exit 2 with one line.
# The automatic split (a linear too big for the free device memory,
# pretended with QATCHECK_MEM_FREE) gives the same checks. The split in a
# world of one runs without mpirun. Skipped (77) without
# mpirun or without MPI in this qatcheck.
. "$(dirname "$0")/lib.inc"
ROOT=$(pwd)
"$PY" - "$T/d.h5" "$ROOT/scripts" <<'P' || exit 1
import json, sys
sys.path.insert(0, sys.argv[2])
import h5py
import numpy as np
import bf16
F = np.float32
rng = np.random.default_rng(7)
nrm = lambda *s: bf16.round_(rng.standard_normal(s).astype(F))
def lin(f, path, M, K, N, dx_scale=1.0, rows=None):
    x, w, b, dy = nrm(M, K), bf16.round_(nrm(N, K) / F(np.sqrt(K))), nrm(N) * F(0.1), nrm(M, N)
    g = f.create_group(path)
    g.attrs["class"] = "linear"
    g.attrs["contract"] = json.dumps({"weight_format": "none"})
    bf16.write(g.require_group("inputs"), "x", x)
    bf16.write(g.require_group("params"), "weight", w)
    bf16.write(g.require_group("params"), "bias", bf16.round_(b))
    bf16.write(g.require_group("grad_out"), "dy", dy)
    dw = dy.T @ x  # float32 accumulation of bf16 operands
    if rows is not None:
        dw[rows[0]:rows[1]] *= F(2)
    c = g.require_group("grads").require_group("dy")
    bf16.write(c, "d_x", (dy @ w) * F(dx_scale))
    bf16.write(c, "d_weight", dw)
    bf16.write(c, "d_bias", dy.sum(0, dtype=F))
def logprob(f, path, B, S, V, own_shards=0):
    z = (rng.standard_normal((B, S, V)) * 2).astype(F)
    ids = rng.integers(0, V, (B, S)).astype(np.int64)
    mask = (rng.random((B, S)) < 0.8).astype(F)
    dy = rng.standard_normal((B, S)).astype(F)
    g = f.create_group(path)
    g.attrs["class"] = "logprob"
    g.attrs["contract"] = json.dumps({"vocab_shards": 4, "normalization": "mean_tokens"})
    g.require_group("inputs").create_dataset("logits", data=z)
    g.require_group("saved").create_dataset("token_ids", data=ids)
    g.require_group("saved").create_dataset("loss_mask", data=mask)
    g.require_group("grad_out").create_dataset("dy", data=dy)
    p = np.empty_like(z)
    for k in range(4):  # vocab-parallel: shard max and sum-exp combined over the shards
        sl = slice(k * V // 4, (k + 1) * V // 4)
        p[..., sl] = np.exp(z[..., sl] - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True, dtype=F)
    if own_shards:  # the bug: each shard normalized by its own sum-exp
        for k in range(4):
            sl = slice(k * V // 4, (k + 1) * V // 4)
            p[..., sl] = np.exp(z[..., sl]) / np.exp(z[..., sl]).sum(-1, keepdims=True, dtype=F)
    c = (dy * mask / F(max(mask.sum(), 1))).astype(F)
    d = -c[..., None] * p
    bb, ss = np.nonzero(mask)
    d[bb, ss, ids[bb, ss]] += c[bb, ss]
    g.require_group("grads").require_group("dy").create_dataset("d_logits", data=d.astype(F))
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = 1
    lin(f, "model.layers.0.mlp.down_proj", 24, 64, 48)
    lin(f, "model.layers.1.mlp.down_proj", 24, 64, 48)
    lin(f, "model.lm_head", 40, 64, 256)
    lin(f, "defect.lm_head_dx", 40, 64, 256, dx_scale=1.01)
    lin(f, "defect.lm_head_rows", 40, 64, 256, rows=(128, 192))  # rank 2's slice of 4
    logprob(f, "model.logprob", 3, 8, 400)
    logprob(f, "defect.logprob_shard", 3, 8, 400, own_shards=1)
P
TOLS='"tolerances": {"d_x": {"rel_l2": 5e-3, "reasoning": "bf16 output rounding"},
   "d_weight": {"rel_l2": 5e-3, "reasoning": "bf16 output rounding"}, "d_bias": {"rel_l2": 5e-3, "reasoning": "bf16 output rounding"},
   "d_logits": {"rel_l2": 1e-5, "reasoning": "fp32 log-sum-exp"}}'
printf '{"data": {"dump": "d.h5"}, "candidate": "dump", %s}\n' "$TOLS" >"$T/whole.json"
printf '{"data": {"dump": "d.h5"}, "candidate": "dump", "split": "lm_head|logprob", %s}\n' "$TOLS" >"$T/split.json"
printf '{"module": "linear", "split": "^linear$", "data": {"generate": {"shapes": [[33, 96, 256], [17, 64, 200]], "seed": 3}}, %s}\n' "$TOLS" >"$T/glin.json"
sed 's/"split": "^linear$", //' "$T/glin.json" >"$T/glin1.json"
printf '{"module": "logprob", "split": "logprob", "contract": {"vocab_shards": 4}, "data": {"generate": {"shapes": [[3, 7, 1000], [2, 5, 512]], "seed": 3}}, %s}\n' "$TOLS" >"$T/glp.json"
sed 's/"split": "logprob", //' "$T/glp.json" >"$T/glp1.json"
mkdir "$T/one" "$T/split1" "$T/four"
# same A B [BOUND]: the same checks and verdicts, every metric within BOUND
# (relative; 1e-9: the float64 sums in another order; a builtin candidate's
# float32 partial sums in another order may round a bf16 d_x element to its
# other neighbour: 1e-6)
same() {
  "$PY" - "$1" "$2" "${3:-1e-9}" <<'P'
import json, sys
a, b = (json.load(open(p))["checks"] for p in sys.argv[1:3])
assert len(a) == len(b), (len(a), len(b))
worst = 0.0
for x, y in zip(a, b):
    kx = (x["module"], x["dy"], x["tensor"], x["verdict"])
    assert kx == (y["module"], y["dy"], y["tensor"], y["verdict"]), (kx, y["verdict"])
    for k in ("rel_l2", "max_abs", "norm_ratio", "cosine", "noise_floor", "bias_z"):
        u, v = x["metrics"].get(k), y["metrics"].get(k)
        if isinstance(u, (int, float)) and isinstance(v, (int, float)) and u != v:
            worst = max(worst, abs(u - v) / max(abs(u), 1e-300))
assert worst < float(sys.argv[3]), worst
print("same verdicts for %d checks, metrics within %.1e" % (len(a), worst))
P
}
# ---- one process: the whole modules, and the split in a world of one
(cd "$T/one" && "$QATCHECK" vjp --case "$T/whole.json" --json r.json -q); rc1=$?
(cd "$T/split1" && "$QATCHECK" vjp --case "$T/split.json" --json r.json -q); rcs=$?
[ $rc1 -eq 1 ] && [ $rcs -eq 1 ] && ok "one process: whole and split (world of one) both exit 1 (planted defects)" || bad "one process: exits $rc1 (whole) and $rcs (split), expected 1 and 1"
printf '{"data": {"dump": "d.h5"}, "candidate": "dump", "split": "lm_(head", %s}\n' "$TOLS" >"$T/badre.json"
expect_exit 2 "a split regex that does not compile is refused" "$QATCHECK" vjp --case "$T/badre.json"
[ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep -q "key 'split': regex 'lm_(head'" "$T/err" && ok "the refusal names the key and the regex" || bad "bad split regex: $(cat "$T/err")"
same "$T/one/r.json" "$T/split1/r.json" && ok "split in a world of one: one process's verdicts and metrics" || bad "split in a world of one: the checks differ"
"$PY" - "$T/split1/r.json" <<'P' && ok "the planted defects fail on their tensor, nothing else fails" || bad "the failed checks are not the planted defects"
import json, sys
r = json.load(open(sys.argv[1]))
failed = sorted((c["module"], c["tensor"]) for c in r["checks"] if c["verdict"] == "fail")
assert failed == [("/defect.lm_head_dx", "d_x"), ("/defect.lm_head_rows", "d_weight"), ("/defect.logprob_shard", "d_logits")], failed
P
# ---- 4 ranks
command -v mpirun >/dev/null 2>&1 || { echo "skip: no mpirun"; finish; }
MPIRUN="mpirun --oversubscribe -np 4"
[ "$(id -u)" = 0 ] && MPIRUN="mpirun --allow-run-as-root --oversubscribe -np 4"
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" # Open MPI's own allocations at MPI_Init
TO="timeout 300"
$TO $MPIRUN "$QATCHECK" vjp --help >/dev/null 2>"$T/probe" || { grep -q "built without MPI" "$T/probe" && { echo "skip: built without MPI"; finish; }; }
(cd "$T/four" && $TO $MPIRUN "$QATCHECK" vjp --case "$T/split.json" --json r.json -q >"$T/out" 2>"$T/err"); rc4=$?
[ $rc4 -eq 1 ] && ok "4 ranks: exit 1 (planted defects)" || bad "4 ranks: exit $rc4, expected 1: $(tail -3 "$T/err")"
same "$T/one/r.json" "$T/four/r.json" && ok "4 ranks, 5 modules split: one process's verdicts, metrics equal to rounding" || bad "4 ranks: the checks differ from one process's"
for c in glin glp; do
  rm -f "$T/one/g.json" "$T/four/g.json"
  (cd "$T/one" && "$QATCHECK" vjp --case "$T/${c}1.json" --json g.json -q); r1=$?
  (cd "$T/four" && $TO $MPIRUN "$QATCHECK" vjp --case "$T/$c.json" --json g.json -q >"$T/out" 2>"$T/err"); r4=$?
  [ $r1 -eq 0 ] && [ $r4 -eq 0 ] && same "$T/one/g.json" "$T/four/g.json" 1e-6 && ok "generated $c split over 4 ranks: one process's checks" || bad "generated $c: exits $r1 and $r4, or the checks differ: $(tail -2 "$T/err")"
done
# ---- the automatic split: a linear whose fused audit (64 MiB + its tensors) does not fit the
# free device memory, here pretended (QATCHECK_MEM_FREE) on the CPU: the three lm_heads, not the down_projs
rm -f "$T/four/r.json"
(cd "$T/four" && QATCHECK_MEM_FREE=67300000 $TO $MPIRUN -x QATCHECK_MEM_FREE "$QATCHECK" vjp --case "$T/whole.json" --json r.json -q -v >"$T/out" 2>"$T/err"); rc4=$?
[ $rc4 -eq 1 ] && same "$T/one/r.json" "$T/four/r.json" && ok "automatic split over 4 ranks: one process's checks" || bad "automatic split: exit $rc4, or the checks differ: $(grep error "$T/err")"
[ "$(grep -c 'more than a rank has free.*split across the 4 ranks' "$T/err")" = 3 ] && ! grep -q "down_proj.*split" "$T/err" &&
  ok "automatic split: the three lm_heads split, the small modules not" || bad "automatic split: $(grep split "$T/err")"
# ---- a bad module on rank 2 (the third unsplit unit), between split units (the defect.* before, model.lm_head after)
"$PY" - "$T/d.h5" <<'P' || exit 1
import sys
import h5py
import numpy as np
with h5py.File(sys.argv[1], "a") as f:
    f.copy("model.layers.1.mlp.down_proj", "model.layers.2.mlp.bad_proj")  # the third unsplit unit: rank 2
    x = f["model.layers.2.mlp.bad_proj/inputs/x"]
    v = x[...]
    v.flat[5] = np.uint16(0x7fc0)  # a bf16 NaN
    x[...] = v
P
bad_rank_run "$T/split.json" "bad_proj.*inputs/x" # split units before and after it
# ---- a split module that cannot be split, every rank alike
printf '{"data": {"dump": "d.h5", "modules": "lm_head$"}, "candidate": "dump", "contract": {"weight_format": "fp8_tensor"}, "split": "lm_head", %s}\n' "$TOLS" >"$T/tensor.json"
rm -f "$T/four/r.json"
(cd "$T/four" && $TO $MPIRUN "$QATCHECK" vjp --case "$T/tensor.json" --json r.json >"$T/out" 2>"$T/err"); rc=$?
[ $rc -eq 2 ] && [ "$(grep -c 'qatcheck: error:' "$T/err")" -eq 1 ] && grep -q "per-tensor scale" "$T/err" &&
  ok "fp8_tensor lm_head split: exit 2, one line (a per-tensor scale)" || bad "fp8_tensor split: exit $rc: $(cat "$T/err")"
error_or_none "$T/four/r.json" && ok "fp8_tensor split: only the error report" || bad "fp8_tensor split: a report other than the error report"
printf '{"module": "rmsnorm", "split": "rmsnorm", "contract": {"eps": 1e-6}, "data": {"generate": {"shapes": [[8, 64]], "seed": 1}}, %s}\n' "$TOLS" >"$T/norm.json"
expect_exit 2 "a split rmsnorm (no split dimension) is refused" $TO $MPIRUN "$QATCHECK" vjp --case "$T/norm.json"
grep -q "cannot be split across ranks" "$T/err" && ok "the refusal says the class cannot be split" || bad "rmsnorm split: $(cat "$T/err")"
finish
