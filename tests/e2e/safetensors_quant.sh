#!/bin/sh
# safetensors_quant.sh: `quant --checkpoint DEPLOYED --master MASTER` on
# checkpoints written with the safetensors package (scripts/
# make_quant_checkpoint.py, bytes by the independent oracle) in the naming
# conventions of DeepSeek FP8 (weight_scale_inv, 128x128 blocks, sharded
# with an index), ModelOpt NVFP4 (weight_scale, weight_scale_2, input_scale;
# packed U8 and safetensors' F4) and compressed-tensors (weight_packed,
# weight_global_scale; FP8 per channel): each reproduces with exit 0 and
# one row per module; a planted payload, scale or global-scale error fails
# with exit 1 on its module and no other; a missing or misshapen master
# exits 2. `quant --dump F` without --module checks every module of a dump.
. "$(dirname "$0")/lib.inc"
"$PY" -c "import safetensors, ml_dtypes, h5py" 2>/dev/null || { echo "skip: safetensors, ml_dtypes or h5py missing for $PY"; exit 77; }
MK="$PY scripts/make_quant_checkpoint.py"
Q="$QATCHECK quant"
# only the planted module fails, with the named part
only_fails() { # REPORT MODULE PART
  "$PY" - "$@" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
bad = [c["module"] for c in r["checks"] if c["result"] != "reproduced"]
assert bad == [sys.argv[2]], "mismatching modules %s, expected [%s]" % (bad, sys.argv[2])
c = [c for c in r["checks"] if c["module"] == sys.argv[2]][0]
assert c["mismatches"][sys.argv[3]] > 0, c
assert r["verdict"] == "fail" and r["summary"]["modules"] == 10, r["summary"]
PYEOF
}
$MK "$T/ds" --convention deepseek --shards 2 || bad "make deepseek"
expect_exit 0 "DeepSeek FP8 (sharded) reproduces" $Q --checkpoint "$T/ds/deployed" --master "$T/ds/master" --json "$T/ds.json"
[ "$(grep -c ' fp8_block128 .* deepseek_fp8 .* reproduced ' "$T/out")" -eq 10 ] || bad "deepseek: expected 10 reproduced fp8_block128 rows: $(cat "$T/out")"
grep -q "/lm_head: not quantized" "$T/out" || bad "deepseek: the BF16 lm_head is not listed as not compared"
for conv in modelopt compressed compressed_fp8; do
  $MK "$T/$conv" --convention $conv || bad "make $conv"
  expect_exit 0 "$conv reproduces" $Q --checkpoint "$T/$conv/deployed" --master "$T/$conv/master"
done
grep -q " fp8_channel .* compressed_tensors .* reproduced " "$T/out" || bad "compressed_fp8: no fp8_channel rows"
$MK "$T/mo4" --convention modelopt --fp4-dtype f4 || bad "make modelopt f4"
expect_exit 0 "ModelOpt NVFP4 with F4 payloads reproduces" $Q --checkpoint "$T/mo4/deployed/model.safetensors" --master "$T/mo4/master/model.safetensors"
grep -q " nvfp4 .* modelopt .* modelopt .* reproduced " "$T/out" || bad "modelopt f4: $(head -3 "$T/out")"

M=model.layers.1.mlp.down_proj
$MK "$T/dsp" --convention deepseek --shards 2 --plant payload:$M || bad "make deepseek payload"
expect_exit 1 "DeepSeek FP8: a flipped payload bit fails" $Q --checkpoint "$T/dsp/deployed" --master "$T/dsp/master" --json "$T/r.json"
only_fails "$T/r.json" /$M payload || bad "deepseek payload: not on /$M alone"
$MK "$T/dss" --convention deepseek --plant scale:model.layers.0.self_attn.q_proj || bad "make deepseek scale"
expect_exit 1 "DeepSeek FP8: a changed weight_scale_inv fails" $Q --checkpoint "$T/dss/deployed" --master "$T/dss/master" --json "$T/r.json"
only_fails "$T/r.json" /model.layers.0.self_attn.q_proj scale || bad "deepseek scale: not on q_proj alone"
M=model.layers.0.self_attn.o_proj
$MK "$T/mop" --convention modelopt --plant payload:$M || bad "make modelopt payload"
expect_exit 1 "ModelOpt NVFP4: a flipped nibble fails" $Q --checkpoint "$T/mop/deployed" --master "$T/mop/master" --json "$T/r.json"
only_fails "$T/r.json" /$M payload || bad "modelopt payload: not on /$M alone"
grep -q "^/$M .*MISMATCH .*payload\[" "$T/out" || bad "modelopt payload: the row does not show the first mismatch"
$MK "$T/mog" --convention modelopt --plant global:model.layers.1.mlp.experts.0.up_proj || bad "make modelopt global"
expect_exit 1 "ModelOpt NVFP4: a changed weight_scale_2 fails" $Q --checkpoint "$T/mog/deployed" --master "$T/mog/master" --json "$T/r.json"
only_fails "$T/r.json" /model.layers.1.mlp.experts.0.up_proj global_scale || bad "modelopt global"
$MK "$T/ctg" --convention compressed --plant global:$M || bad "make compressed global"
expect_exit 1 "compressed-tensors NVFP4: a changed weight_global_scale fails" $Q --checkpoint "$T/ctg/deployed" --master "$T/ctg/master" --json "$T/r.json"
only_fails "$T/r.json" /$M global_scale || bad "compressed global"
expect_exit 0 "--modules narrows the rows" $Q --checkpoint "$T/ctg/deployed" --master "$T/ctg/master" --modules 'layers\.1\.'
[ "$(grep -c ' reproduced ' "$T/out")" -eq 5 ] || bad "--modules: expected 5 rows"
expect_exit 1 "--profile vllm on ModelOpt bytes fails (the global scale is the other way round)" \
  $Q --checkpoint "$T/modelopt/deployed" --master "$T/modelopt/master" --profile vllm

# cannot judge: exit 2, one line, no report
refuse() { # DESC NEEDLE ARGS...
  d=$1; n=$2; shift 2
  rm -f "$T/x.json"
  expect_exit 2 "$d" $Q "$@" --json "$T/x.json"
  [ "$(grep -c '^qatcheck: error:' "$T/err")" -eq 1 ] || bad "$d: not one error line"
  grep -q -- "$n" "$T/err" || bad "$d: $(cat "$T/err")"
  error_or_none "$T/x.json" || bad "$d: a report was written other than its error report"
}
refuse "a deployed checkpoint without --master" "needs --master" --checkpoint "$T/ds/deployed"
"$PY" - "$T" <<'PYEOF' || bad "cannot write the odd masters"
import sys, numpy as np
from safetensors.numpy import save_file
t = sys.argv[1]
save_file({"x.weight": np.ones((2, 2), np.float32)}, t + "/q_empty.safetensors")
save_file({"model.layers.0.mlp.down_proj.weight": np.ones((256, 64), np.float32)}, t + "/q_shape.safetensors")
PYEOF
refuse "a master missing a module's weight" "tensor 'model.layers.0.mlp.down_proj.weight' is missing (the master of deployed" \
  --checkpoint "$T/ds/deployed" --master "$T/q_empty.safetensors"
refuse "a master of another shape" "but its master 'model.layers.0.mlp.down_proj.weight' is \[256, 64\]" \
  --checkpoint "$T/ds/deployed" --master "$T/q_shape.safetensors" --modules 'layers\.0\.mlp\.down_proj$'
refuse "a master checkpoint given as the deployed one" "no quantized module" --checkpoint "$T/ds/master" --master "$T/ds/master"
refuse "--identify is for one module" "--identify checks one module" --checkpoint "$T/ds/deployed" --master "$T/ds/master" --identify

# quant --dump without --module: every module with deployed bytes
for f in fp8_block128 nvfp4 mxfp8; do "$PY" scripts/make_quant_dump.py "$T/d_$f.h5" $f $( [ $f = nvfp4 ] && echo --plant payload ) || bad "make $f"; done
"$PY" - "$T" <<'PYEOF' || bad "cannot join the dumps"
import sys, h5py
t = sys.argv[1]
with h5py.File(t + "/all.h5", "w") as out:
    out.attrs["qatcheck_dump"] = 1
    for f, g in (("fp8_block128", "a"), ("nvfp4", "b"), ("mxfp8", "c")):
        with h5py.File("%s/d_%s.h5" % (t, f), "r") as src:
            src.copy("lin", out, name=g)
PYEOF
expect_exit 1 "quant --dump without --module checks every module and fails the planted one" $Q --dump "$T/all.h5" --json "$T/all.json"
"$PY" -c "
import json, sys
r = json.load(open(sys.argv[1]))
res = {c['module']: c['result'] for c in r['checks']}
sys.exit(0 if res == {'/a': 'reproduced', '/b': 'mismatch', '/c': 'reproduced'} else 'results %s' % res)" "$T/all.json" || bad "quant --dump: per-module results"
finish
