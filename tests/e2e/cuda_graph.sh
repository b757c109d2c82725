#!/bin/sh
# cuda_graph.sh: a step captured in a CUDA Graph and replayed, judged
# against the eager step (docs/qatdump.md "Execution modes"). Hooks run at
# the capture only; what qatdump recorded there is replayed with the graph,
# so the dump holds the replay's tensors. tests/e2e/exec_modes.py dumps the
# eager step and the graph's replay on the GPU: `vjp --eager` passes the
# correct replay (exit 0, CUDA Graph covered) and fails a replay whose
# batch was rebound instead of copied into the static input (exit 1 on
# inputs/x). GPU only: skips (77) without a CUDA device for torch.
# DUMPS=DIR: judge the dumps made there (cuda_eager.h5, cuda_graph_ok.h5,
# cuda_graph_stale.h5) instead of making them (a GPU machine without
# qatcheck's libraries made them).
. "$(dirname "$0")/lib.inc"
. "$(dirname "$0")/qatdump.inc"
D=${DUMPS:-$T/d}
if [ -z "${DUMPS:-}" ]; then
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 77)" 2>/dev/null \
    || { echo "skip: torch sees no CUDA device (a CUDA Graph is captured and replayed on a GPU)"; exit 77; }
  mkdir -p "$D"
  "$PY" "$HERE/exec_modes.py" "$D/cuda_eager.h5:cuda_eager" "$D/cuda_graph_ok.h5:cuda_graph" \
    "$D/cuda_graph_stale.h5:cuda_graph:stale" >"$T/py.txt" 2>&1
  rc=$?
  [ $rc -eq 77 ] && { cat "$T/py.txt"; exit 77; }
  [ $rc -eq 0 ] || { cat "$T/py.txt"; echo "FAIL: dumping on the GPU"; exit 1; }
fi
for v in ok stale; do
  printf '{"data": {"dump": "%s", "modules": "fc[12]$"}, "candidate": "dump", "tolerances": {"d_x": {"derive": true}, "d_weight": {"derive": true}, "d_bias": {"derive": true}}}\n' \
    "$D/cuda_graph_$v.h5" >"$T/$v.json"
  "$QATCHECK" vjp --case "$T/$v.json" --eager "$D/cuda_eager.h5" --json "$T/$v.r.json" >"$T/$v.out" 2>&1
  rc=$?
  want=0; [ $v = ok ] || want=1
  [ $rc -eq $want ] || { bad "cuda_graph $v: exit $rc, expected $want"; tail -30 "$T/$v.out"; continue; }
  "$PY" - "$T/$v.r.json" "$v" <<'P' && ok "cuda_graph $v: exit $rc" || { bad "cuda_graph $v"; tail -30 "$T/$v.out"; }
import json, sys
r = json.load(open(sys.argv[1]))
failed = {(c["module"], c["dy"], c["tensor"]) for c in r["checks"] if c["verdict"] != "pass"}
eager = [c for c in r["checks"] if c["dy"] == "cuda_graph:eager"]
if not eager:
    print("no comparison with the eager step"); sys.exit(1)
if sys.argv[2] == "ok":
    miss = [m["module"] for m in r["modules"] if "cuda_graph" not in m["coverage"]]
    if failed or miss:
        print("failed %s, not covered %s" % (sorted(failed), miss)); sys.exit(1)
elif ("/fc1", "cuda_graph:eager", "inputs/x") not in failed:
    print("the stale input is not named: failed %s" % sorted(failed)); sys.exit(1)
P
done
finish
