#!/bin/sh
# gpu_mpi.sh: the device collectives (src/dist/, backend/cuda/coll.cu). On a
# CUDA device built with NCCL, `contract --device cuda` makes an NCCL
# communicator (rank 0's ncclGetUniqueId, ncclCommInitRank) and all-reduces
# the rows' metric sums on the device, checked against the rows: once as one
# process with QATCHECK_NCCL=1 (a communicator of one: no MPI needed), and,
# where mpirun exists, under `mpirun -np 1` (the id broadcast over MPI). Each
# run's JSON equals the plain CPU run's apart from timing fields, and -v
# says the sums went through NCCL. Skips (77) without a CUDA device, without
# NCCL in the build, or (the mpirun part) without mpirun or MPI.
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
if ! command -v mpirun >/dev/null 2>&1; then echo "skip: mpirun part (no mpirun)"; finish; fi
MPIRUN="mpirun -np 1"; [ "$(id -u)" = 0 ] && MPIRUN="mpirun --allow-run-as-root -np 1"
timeout 300 $MPIRUN "$QATCHECK" contract --master-vs-dequant --dump "$CK" --device cuda --json "$T/mpi1.json" -q -v >"$T/out" 2>"$T/err"
rc=$?
if grep -q "built without MPI" "$T/err"; then echo "skip: mpirun part (built without MPI)"; finish; fi
[ $rc -le 1 ] && ok "mpirun -np 1 --device cuda: exit $rc" || bad "mpirun -np 1: exit $rc: $(grep error "$T/err")"
grep -q "communicator, rank 0 of 1" "$T/err" && grep -q "all-reduced through NCCL" "$T/err" && ok "mpirun -np 1: NCCL bootstrapped over MPI, sums all-reduced" || bad "mpirun -np 1: $(cat "$T/err")"
same "$T/mpi1.json" >"$T/cmp" 2>&1 && ok "mpirun -np 1: $(tail -1 "$T/cmp")" || bad "mpirun -np 1: $(tail -3 "$T/cmp")"
finish
