#!/bin/sh
# quant_torch.sh: dumps and a checkpoint that eager PyTorch 2.11 made on an
# H200 (tests/data/torch/, scripts/calibrate/make_torch_data.py; float32
# masters with near-ties planted in up_proj, where eager's rcp.rn and
# Inductor's rcp.approx round apart):
#   quant --identify names torch for every module, and not vllm (compiled)
#     nor exact (a true division) where the planted near-ties decide
#   vjp with the profile left to auto passes, names torch among the
#     producers of every module and picks it for the planted one;
#     --profile torch passes; --profile vllm and --profile exact fail the
#     quantizer check of the planted module and pass the others
#   contract --master-vs-dequant --profile torch matches torch's own float64
#     numbers to 1e-6 relative; --profile exact does not
# TORCHDATA (default tests/data/torch) and DEVICES (default cpu; the device
# run sets "cpu cuda") select the data and the devices.
. "$(dirname "$0")/lib.inc"
D=${TORCHDATA:-tests/data/torch}
DEVS=${DEVICES:-cpu}
CHK=${CONTRACT_CHECK:-scripts/calibrate/contract_check.py}
[ -f "$D/torch_ckpt.h5" ] || { echo "skip: no torch data in $D"; exit 77; }
$PY -c "import h5py" 2>/dev/null || { echo "h5py missing"; exit 77; }
TOL='"tolerances": {
  "d_x": {"rel_l2": 0.00553, "cosine_min": 0.9999847, "norm_ratio": [0.99447, 1.00553], "noise_multiple": 3.61, "reasoning": "qatcheck tol --out-dtype bfloat16 --k 256 --tensor d_x --rounded-operands 1: the candidate rounds the dequantized weight to bf16"},
  "d_weight": {"rel_l2": 4e-3, "cosine_min": 0.99999, "norm_ratio": [0.999, 1.001], "noise_multiple": 1.25, "reasoning": "bf16 output rounding"},
  "d_bias": {"rel_l2": 4e-3, "cosine_min": 0.99999, "norm_ratio": [0.995, 1.005], "noise_multiple": 1.25, "reasoning": "bf16 output rounding"}}'
for fmt in fp8_block128 fp8_block128_ue8m0; do
  f="$(cd "$(dirname "$D/x")" && pwd)/torch_$fmt.h5"
  for m in q_proj down_proj up_proj; do
    mod=$("$PY" -c "import h5py,sys; f=h5py.File(sys.argv[1],'r'); print([k for k in f if k.endswith('$m')][0])" "$f")
    expect_exit 0 "$fmt $m: quant --identify finds a profile" "$QATCHECK" quant --dump "$f" --module "/$mod" --identify
    grep -q "bytes: .*torch" "$T/out" || bad "$fmt $m: --identify does not name torch: $(cat "$T/out")"
    if [ $m = up_proj ] && [ $fmt = fp8_block128 ]; then  # (stage 2's coarser power-of-two scale merges them again)
      grep -q "bytes: .*vllm " "$T/out" && bad "$fmt $m: the near-ties should rule out vllm: $(cat "$T/out")"
      grep -q "bytes: .*exact" "$T/out" && bad "$fmt $m: the near-ties should rule out exact: $(cat "$T/out")"
      expect_exit 1 "$fmt $m: vllm's bytes differ" "$QATCHECK" quant --dump "$f" --module "/$mod" --profile vllm
    fi
    expect_exit 0 "$fmt $m: quant --profile torch reproduces the bytes" "$QATCHECK" quant --dump "$f" --module "/$mod" --profile torch
  done
  echo "{\"name\": \"torch_$fmt\", \"module\": \"linear\", \"data\": {\"dump\": \"$f\"}, \"candidate\": \"dump\", $TOL}" >"$T/case.json"
  for dev in $DEVS; do
    expect_exit 0 "$fmt on $dev: vjp with the profile auto passes" "$QATCHECK" vjp --case "$T/case.json" --device "$dev" --json "$T/r.json"
    "$PY" - "$T/r.json" "$fmt" <<'PYEOF' || bad "$fmt on $dev: the quantizer checks do not say profile torch (auto)"
import json, sys
r = json.load(open(sys.argv[1]))
q = {c["module"].rsplit(".", 1)[-1]: c["why"] for c in r["checks"] if c["tensor"] == "quantizer"}
assert len(q) == 3 and all("auto: reproduced by" in w and "torch" in w for w in q.values()), q
assert "ue8m0" in sys.argv[2] or q["up_proj"].startswith("profile torch (auto: reproduced by torch"), q["up_proj"]
PYEOF
    expect_exit 0 "$fmt on $dev: vjp --profile torch passes" "$QATCHECK" vjp --case "$T/case.json" --device "$dev" --profile torch
    [ $fmt = fp8_block128 ] || continue
    for p in vllm exact; do
      expect_exit 1 "$fmt on $dev: vjp --profile $p fails" "$QATCHECK" vjp --case "$T/case.json" --device "$dev" --profile $p
      n=$(grep "quantizer" "$T/out" | grep -c FAIL)
      [ "$n" -ge 1 ] || bad "$fmt on $dev: --profile $p: no failed quantizer check"
      [ $p = exact ] || grep "up_proj" "$T/out" | grep quantizer | grep -q FAIL || bad "$fmt on $dev: --profile $p: the planted module passed"
    done
  done
done
for dev in $DEVS; do
  expect_exit 0 "contract --profile torch on $dev" "$QATCHECK" contract --master-vs-dequant --dump "$D/torch_ckpt.h5" --profile torch \
    --weight-format nvfp4,fp8_block128,fp8_block128_ue8m0,mxfp8 --device "$dev" --json "$T/c.json"
  if "$PY" "$CHK" "$T/c.json" "$D/torch_ckpt_expected.json" >"$T/chk"; then ok "$dev: $(tail -1 "$T/chk")"; else bad "$dev: $(cat "$T/chk")"; fi
  "$QATCHECK" contract --master-vs-dequant --dump "$D/torch_ckpt.h5" --profile exact --weight-format nvfp4,fp8_block128 \
    --device "$dev" --json "$T/c2.json" >/dev/null 2>&1
  if "$PY" "$CHK" "$T/c2.json" "$D/torch_ckpt_expected.json" >"$T/chk"; then bad "$dev: --profile exact should not match torch"; else ok "$dev: --profile exact differs from torch ($(tail -1 "$T/chk"))"; fi
done
finish
