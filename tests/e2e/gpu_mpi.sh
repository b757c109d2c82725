#!/bin/sh
# gpu_mpi.sh: the device collectives (src/dist/, backend/cuda/coll.cu). On a
# CUDA device built with NCCL, `contract --device cuda` makes an NCCL
# communicator (rank 0's ncclGetUniqueId, ncclCommInitRank) and all-reduces
# the rows' metric sums on the device, checked against the rows: once as one
# process with QATCHECK_NCCL=1 (a communicator of one: no MPI needed), and,
# where mpirun exists, under `mpirun -np 1` (the id broadcast over MPI). Each
# run's JSON equals the plain CPU run's apart from timing fields, and -v
# says the sums went through NCCL. Then `vjp` with modules split across the
# ranks (case key "split", docs/distributed.md) in a world of one on the
# device: a generated lm_head-like linear (partial d_x all-reduced by the
# production in float32 and by the reference in float64) and a
# vocab-parallel log-prob (row max and sum-exp all-reduced), every
# reduction through NCCL, once under QATCHECK_NCCL=1 and once under `mpirun
# -np 1`: the verdicts of the CPU run, the metrics within the device's
# rounding (its bf16 GEMMs accumulate in another order). Skips (77) without
# a CUDA device, without NCCL in the build, or (the mpirun parts) without
# mpirun or MPI.
. "$(dirname "$0")/lib.inc"
CK=cases/data/contract_ckpt.h5
DEV=${GPU_DEVICE:-cuda}
QATCHECK_NCCL=1 "$QATCHECK" contract --master-vs-dequant --dump "$CK" --device "$DEV" --json "$T/nccl1.json" -q -v >"$T/out" 2>"$T/probe"
rc=$?
if grep -qE "no CUDA device|built without CUDA|no CUDA backend|cannot load the CUDA backend" "$T/probe"; then echo "skip: $(grep -m1 error "$T/probe")"; exit 77; fi
if ! grep -q "NCCL" "$T/probe"; then echo "skip: this qatcheck's CUDA backend has no NCCL"; exit 77; fi
"$QATCHECK" contract --master-vs-dequant --dump "$CK" --device cpu --json "$T/cpu.json" -q >/dev/null 2>&1
same() { # the rows, classes and verdicts of cpu.json and $1 (device metrics within 1e-9, as gpu_contract.sh)
  "$PY" - "$T/cpu.json" "$1" <<'P'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ka = [(r["module"], r["tensor"], r["weight_format"], r["dy"], r["verdict"], r["outlier"]) for r in a["rows"]]
kb = [(r["module"], r["tensor"], r["weight_format"], r["dy"], r["verdict"], r["outlier"]) for r in b["rows"]]
assert ka == kb, "rows differ"
for x, y in zip(a["rows"], b["rows"]):
    for m in ("rel_l2", "cosine", "norm_ratio"):
        u, v = x["metrics"][m], y["metrics"][m]
        assert (u is None and v is None) or abs(u - v) <= 1e-9 * max(abs(u), 1e-300), (x["module"], m, u, v)
print(len(ka), "rows agree with the cpu run")
P
}
[ $rc -le 1 ] && ok "QATCHECK_NCCL=1, one process: exit $rc" || bad "QATCHECK_NCCL=1: exit $rc: $(grep error "$T/probe")"
grep -q "communicator, rank 0 of 1" "$T/probe" && ok "one process: an NCCL communicator of one" || bad "one process: no communicator: $(cat "$T/probe")"
grep -q "all-reduced through NCCL" "$T/probe" && ok "one process: the metric sums all-reduced through NCCL" || bad "one process: the sums did not go through NCCL"
same "$T/nccl1.json" >"$T/cmp" 2>&1 && ok "one process: $(tail -1 "$T/cmp")" || bad "one process: $(tail -3 "$T/cmp")"
# ---- vjp with split modules: the case, its CPU run, and the comparison
TOLS='"tolerances": {"d_x": {"rel_l2": 5e-3, "reasoning": "bf16 output rounding"},
   "d_weight": {"rel_l2": 5e-3, "reasoning": "bf16 output rounding"}, "d_bias": {"rel_l2": 5e-3, "reasoning": "bf16 output rounding"},
   "d_logits": {"rel_l2": 1e-5, "reasoning": "fp32 log-sum-exp"}}'
printf '{"module": "linear", "split": "linear", "data": {"generate": {"shapes": [[257, 512, 4096], [64, 128, 1000]], "seed": 3}}, %s}\n' "$TOLS" >"$T/slin.json"
printf '{"module": "logprob", "split": "logprob", "contract": {"vocab_shards": 4}, "data": {"generate": {"shapes": [[2, 33, 32000]], "seed": 3}}, %s}\n' "$TOLS" >"$T/slp.json"
for c in slin slp; do "$QATCHECK" vjp --case "$T/$c.json" --device cpu --json "$T/$c.cpu.json" -q >/dev/null 2>&1; done
same_vjp() { # the checks and verdicts of the cpu run $1 and the device run $2; noise floors within 1e-9, rel-L2 within 10 %
  "$PY" - "$1" "$2" <<'P'
import json, sys
a, b = (json.load(open(p))["checks"] for p in sys.argv[1:3])
ka = [(c["module"], c["dy"], c["tensor"], c["verdict"]) for c in a]
assert ka == [(c["module"], c["dy"], c["tensor"], c["verdict"]) for c in b], "checks or verdicts differ"
for x, y in zip(a, b):
    u, v = x["metrics"]["noise_floor"], y["metrics"]["noise_floor"]
    assert u == v or abs(u - v) <= 1e-9 * abs(u), (x["module"], x["tensor"], "noise floor", u, v)
    u, v = x["metrics"]["rel_l2"], y["metrics"]["rel_l2"]
    assert u == v or abs(u - v) <= 0.1 * abs(u), (x["module"], x["tensor"], "rel_l2", u, v)
print(len(ka), "checks agree with the cpu run")
P
}
for c in slin slp; do
  QATCHECK_NCCL=1 "$QATCHECK" vjp --case "$T/$c.json" --device "$DEV" --json "$T/$c.n1.json" -q -v >"$T/out" 2>"$T/err"
  rc=$?
  [ $rc -eq 0 ] && ok "split $c, QATCHECK_NCCL=1: exit 0" || bad "split $c, QATCHECK_NCCL=1: exit $rc: $(grep error "$T/err")"
  grep -q "split over 1 rank(s): [1-9][0-9]* all-reduce(s) through NCCL on cuda.*, 0 through the host" "$T/err" &&
    ok "split $c, QATCHECK_NCCL=1: every reduction through NCCL" || bad "split $c: not through NCCL: $(grep split "$T/err")"
  same_vjp "$T/$c.cpu.json" "$T/$c.n1.json" >"$T/cmp" 2>&1 && ok "split $c, QATCHECK_NCCL=1: $(tail -1 "$T/cmp")" || bad "split $c: $(tail -3 "$T/cmp")"
done
if ! command -v mpirun >/dev/null 2>&1; then echo "skip: mpirun part (no mpirun)"; finish; fi
MPIRUN="mpirun -np 1"; [ "$(id -u)" = 0 ] && MPIRUN="mpirun --allow-run-as-root -np 1"
timeout 300 $MPIRUN "$QATCHECK" contract --master-vs-dequant --dump "$CK" --device cuda --json "$T/mpi1.json" -q -v >"$T/out" 2>"$T/err"
rc=$?
if grep -q "built without MPI" "$T/err"; then echo "skip: mpirun part (built without MPI)"; finish; fi
[ $rc -le 1 ] && ok "mpirun -np 1 --device cuda: exit $rc" || bad "mpirun -np 1: exit $rc: $(grep error "$T/err")"
grep -q "communicator, rank 0 of 1" "$T/err" && grep -q "all-reduced through NCCL" "$T/err" && ok "mpirun -np 1: NCCL bootstrapped over MPI, sums all-reduced" || bad "mpirun -np 1: $(cat "$T/err")"
same "$T/mpi1.json" >"$T/cmp" 2>&1 && ok "mpirun -np 1: $(tail -1 "$T/cmp")" || bad "mpirun -np 1: $(tail -3 "$T/cmp")"
for c in slin slp; do
  timeout 300 $MPIRUN "$QATCHECK" vjp --case "$T/$c.json" --device cuda --json "$T/$c.m1.json" -q -v >"$T/out" 2>"$T/err"
  rc=$?
  [ $rc -eq 0 ] && ok "split $c, mpirun -np 1: exit 0" || bad "split $c, mpirun -np 1: exit $rc: $(grep error "$T/err")"
  grep -q "communicator, rank 0 of 1" "$T/err" && grep -q "split over 1 rank(s): [1-9][0-9]* all-reduce(s) through NCCL on cuda.*, 0 through the host" "$T/err" &&
    ok "split $c, mpirun -np 1: NCCL bootstrapped over MPI, every reduction through it" || bad "split $c, mpirun -np 1: $(grep -E 'split|communicator' "$T/err")"
  same_vjp "$T/$c.cpu.json" "$T/$c.m1.json" >"$T/cmp" 2>&1 && ok "split $c, mpirun -np 1: $(tail -1 "$T/cmp")" || bad "split $c, mpirun -np 1: $(tail -3 "$T/cmp")"
done
finish
