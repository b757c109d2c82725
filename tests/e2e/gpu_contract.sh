#!/bin/sh
# gpu_contract.sh: `qatcheck contract --master-vs-dequant` on --device cuda
# against --device cpu on the committed checkpoint (grad_out/ and inputs/
# datasets, routed experts, every weight format with GPU kernels, activation
# formats), on a generated-dY run, and under profile te (quantized on the
# host, the rest on the device): the same rows in the same order, metrics
# equal to 1e-9 relative, the same verdicts and outliers; the independent
# numpy check agrees with the cuda report. The pipelined sweep (unit u+1
# queued while the device runs unit u: 2 or more units read ahead) and the
# plain order (QATCHECK_AHEAD 0, 1) both give the CPU's rows, also with more
# rows per unit than the device keeps metrics pending (a sync inside a unit
# while the previous unit's fence is out). Skips (77) without a CUDA device.
. "$(dirname "$0")/lib.inc"
CK=cases/data/contract_ckpt.h5
"$QATCHECK" contract --master-vs-dequant --dump "$CK" --device "${GPU_DEVICE:-cuda}" --quiet >/dev/null 2>"$T/probe"
if grep -qE "no CUDA device|built without CUDA|no CUDA backend|cannot load the CUDA backend" "$T/probe"; then echo "skip: $(head -1 "$T/probe")"; exit 77; fi
compare() { # name: cpu_$1.json against gpu_$1.json
  "$PY" - "$T/cpu_$1.json" "$T/gpu_$1.json" <<'PYEOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ra, rb = a["rows"], b["rows"]
key = lambda r: (r["module"], r["tensor"], r["weight_format"], r["activation_format"], r["dy"])
assert [key(r) for r in ra] == [key(r) for r in rb], "different rows"
worst = 0.0
for x, y in zip(ra, rb):
    for m in ("cosine", "norm_ratio", "rel_l2"):
        u, v = x["metrics"][m], y["metrics"][m]
        if u is None or v is None:
            assert u == v, f"{key(x)} {m}: cpu {u} cuda {v}"
            continue
        d = abs(u - v) / max(abs(u), 1e-300)
        worst = max(worst, d)
        assert d <= 1e-9, f"{key(x)} {m}: cpu {u!r} cuda {v!r}"
    assert x["verdict"] == y["verdict"] and x["outlier"] == y["outlier"], f"{key(x)}: verdict or outlier differs"
print(f"{len(ra)} rows agree, worst relative difference {worst:.2e}")
PYEOF
}
run_both() { # name args...: the same call on both devices; exit codes must match
  n=$1; shift
  "$QATCHECK" contract --master-vs-dequant "$@" --device cpu --json "$T/cpu_$n.json" --quiet >/dev/null 2>"$T/e1"; r1=$?
  env ${GPU_ENV:-} "$QATCHECK" contract --master-vs-dequant "$@" --device "${GPU_DEVICE:-cuda}" --json "$T/gpu_$n.json" --quiet >/dev/null 2>"$T/e2"; r2=$?
  if [ $r1 -ne $r2 ]; then bad "$n: cpu exit $r1, cuda exit $r2 ($(head -1 "$T/e2"))"; return; fi
  if [ $r1 -eq 2 ]; then bad "$n: exit 2 on both: $(head -1 "$T/e1")"; return; fi
  if compare "$n" >"$T/cmp" 2>&1; then ok "$n: exit $r1 on both; $(tail -1 "$T/cmp")"; else bad "$n: $(tail -3 "$T/cmp")"; fi
}
run_both ckpt --dump "$CK" --weight-format nvfp4,fp8_block128,fp8_block128_ue8m0,mxfp8,mxfp4,fp8_tensor,fp8_channel,none \
  --activation-format fp8_token,fp8_group128,fp8_group128_ue8m0
run_both thresholds --dump "$CK" --weight-format nvfp4,mxfp8 --cosine-min 0.999 --norm-ratio 0.99,1.01
run_both te --dump "$CK" --weight-format nvfp4,fp8_block128 --profile te
# several dY datasets of other token counts (7, 5, 3) and odd widths: per-dY
# buffers at odd offsets must stay aligned for the device's vector loads
"$PY" - "$T/multidy.h5" <<'PYEOF' || bad "cannot build the multi-dY checkpoint"
import sys, h5py, numpy as np
rng = np.random.default_rng(5)
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = np.int64(1)
    for l in range(4):
        p = "/model.layers.%d.q_proj" % l
        f.require_group(p).attrs["class"] = "linear"
        f[p + "/params/weight"] = rng.standard_normal((5, 97)).astype(np.float32)
        f[p + "/inputs/x"] = rng.standard_normal((7, 97)).astype(np.float32)
        for k, m in enumerate((7, 7, 7)):
            f[p + "/grad_out/dy%d" % k] = rng.standard_normal((m, 5)).astype(np.float32)
    f.require_group("/lm_head").attrs["class"] = "linear"
    f["/lm_head/params/weight"] = rng.standard_normal((33, 97)).astype(np.float32)
    for k, m in enumerate((7, 5, 3)):
        f["/lm_head/grad_out/dy%d" % k] = rng.standard_normal((m, 33)).astype(np.float32)
PYEOF
run_both multidy --dump "$T/multidy.h5" --weight-format nvfp4,fp8_block128,mxfp8 --modules layers --activation-format fp8_token,fp8_group128
run_both multidy_m --dump "$T/multidy.h5" --weight-format nvfp4,fp8_block128,mxfp8 --modules lm_head
in_flight() { # name want: the cuda report ran `want` units on the device at once
  got=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['timing_s']['units_in_flight'])" "$T/gpu_$1.json" 2>/dev/null)
  if [ "$got" = "$2" ]; then ok "$1: $got unit(s) in flight"; else bad "$1: ${got:-no report}: expected $2 unit(s) in flight"; fi
}
for a in 0 1 2 5; do
  GPU_ENV="QATCHECK_AHEAD=$a" run_both ahead$a --dump "$CK" --weight-format nvfp4,fp8_block128,mxfp8 --activation-format fp8_token \
    --cosine-min 0.99965
  in_flight ahead$a $([ $a -ge 2 ] && echo 2 || echo 1)
done
# 6 dY x (8 weight + 3 activation formats) = 66 rows a unit, over the 64
# metrics the device keeps pending
"$PY" - "$T/manyrows.h5" <<'PYEOF' || bad "cannot build the many-rows checkpoint"
import sys, h5py, numpy as np
rng = np.random.default_rng(7)
with h5py.File(sys.argv[1], "w") as f:
    f.attrs["qatcheck_dump"] = np.int64(1)
    for l in range(5):
        p = "/model.layers.%d.o_proj" % l
        f.require_group(p).attrs["class"] = "linear"
        f[p + "/params/weight"] = rng.standard_normal((64, 256)).astype(np.float32)
        f[p + "/inputs/x"] = rng.standard_normal((9, 256)).astype(np.float32)
        for k in range(6):
            f[p + "/grad_out/dy%d" % k] = rng.standard_normal((9, 64)).astype(np.float32)
PYEOF
GPU_ENV="QATCHECK_AHEAD=2" run_both manyrows --dump "$T/manyrows.h5" \
  --weight-format nvfp4,fp8_block128,fp8_block128_ue8m0,mxfp8,mxfp4,fp8_tensor,fp8_channel,none \
  --activation-format fp8_token,fp8_group128,fp8_group128_ue8m0
in_flight manyrows 2
"$PY" scripts/make_checkpoint.py "$T/nodata.h5" --no-data --layers 2 >/dev/null || bad "make_checkpoint --no-data"
run_both generated --dump "$T/nodata.h5" --tokens 24 --seed 5 --weight-format fp8_block128,nvfp4 --activation-format fp8_token
if "$PY" scripts/contract_check.py "$CK" "$T/gpu_ckpt.json" >"$T/chk" 2>&1; then ok "numpy check agrees with the cuda report: $(tail -1 "$T/chk")"
else bad "numpy check disagrees with the cuda report: $(tail -3 "$T/chk")"; fi
finish
