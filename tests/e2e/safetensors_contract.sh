#!/bin/sh
# safetensors_contract.sh: layer 2 on a safetensors master checkpoint, as
# the safetensors package writes it (one file; shards with an index). With
# dY from the committed HDF5 checkpoint, every row equals the HDF5 sweep's
# (the same numbers from either source, which scripts/contract_check.py
# recomputes independently for the HDF5 one); with generated dY the file,
# the folder and the index give the same rows; embeddings and norms are
# left out, routed experts [E, N, K] are E units; a deployed (FP8)
# checkpoint is refused. Every refusal of the reader (a header over 100 MB,
# offsets past the end, overlapping tensors, a byte count that is not dtype
# x shape, an unknown dtype, a shard named in the index but missing) exits
# 2 with one line and no report.
. "$(dirname "$0")/lib.inc"
have_py "$PY" torch safetensors h5py || { echo "skip: torch, safetensors or h5py missing for $PY"; exit 77; }
H5=cases/data/contract_ckpt.h5
"$PY" - "$H5" "$T" <<'PYEOF' || { bad "cannot write the checkpoints"; finish; }
import json, os, sys
import h5py, numpy as np, torch
from safetensors.torch import save_file
src, t = sys.argv[1], sys.argv[2]
out = {}
def visit(name, obj):
    if isinstance(obj, h5py.Dataset) and name.endswith("/params/weight"):
        a = obj[...]
        v = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if obj.attrs.get("dtype") == "bfloat16" else torch.from_numpy(a)
        out[name[:-len("/params/weight")] + ".weight"] = v.contiguous()
with h5py.File(src, "r") as f:
    f.visititems(visit)
out["model.embed_tokens.weight"] = torch.ones(300, 128, dtype=torch.bfloat16)
out["model.norm.weight"] = torch.ones(128, dtype=torch.bfloat16)
save_file(out, t + "/ck.safetensors", metadata={"format": "pt"})
os.makedirs(t + "/sh")
names = sorted(out)
wmap = {}
for i in range(3):
    fn = "model-%05d-of-00003.safetensors" % (i + 1)
    part = {n: out[n] for n in names[i::3]}
    save_file(part, t + "/sh/" + fn, metadata={"format": "pt"})
    wmap.update({n: fn for n in part})
json.dump({"metadata": {}, "weight_map": wmap}, open(t + "/sh/model.safetensors.index.json", "w"))
PYEOF
C="$QATCHECK contract --master-vs-dequant --weight-format nvfp4,fp8_block128 --activation-format fp8_token"
expect_exit 0 "contract on the HDF5 checkpoint" $C --dump $H5 --json "$T/h5.json"
expect_exit 0 "contract on the safetensors master with --dy from the HDF5 dump" $C --checkpoint "$T/ck.safetensors" --dy $H5 --json "$T/st.json"
"$PY" - "$T/h5.json" "$T/st.json" <<'PYEOF' || bad "safetensors rows differ from the HDF5 rows"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
strip = lambda r: [{k: v for k, v in x.items()} for x in r["rows"]]
assert len(a["rows"]) == len(b["rows"]) == 165, (len(a["rows"]), len(b["rows"]))
assert strip(a) == strip(b), "rows differ"
assert a["summary"]["units"] == b["summary"]["units"] == 55, b["summary"]
assert not any("embed" in x["module"] or "norm" in x["module"] for x in b["rows"])
print("ok   165 rows identical from HDF5 and safetensors, 55 units (routed experts split)")
PYEOF
G="$QATCHECK contract --master-vs-dequant --weight-format mxfp8 --tokens 16 --seed 3"
expect_exit 0 "generated dY: one file" $G --checkpoint "$T/ck.safetensors" --json "$T/g1.json"
expect_exit 0 "generated dY: the shards' folder" $G --checkpoint "$T/sh" --json "$T/g2.json"
expect_exit 0 "generated dY: the index" $G --checkpoint "$T/sh/model.safetensors.index.json" --json "$T/g3.json"
"$PY" - "$T"/g1.json "$T"/g2.json "$T"/g3.json <<'PYEOF' || bad "file, folder and index give different rows"
import json, sys
r = [json.load(open(p))["rows"] for p in sys.argv[1:]]
assert r[0] == r[1] == r[2] and len(r[0]) == 55, len(r[0])
assert all(x["shape"] == [16, x["shape"][1]] for x in r[0])
PYEOF
expect_exit 0 "--modules selects by module path" $G --checkpoint "$T/sh" --modules 'experts' --json "$T/g4.json"
"$PY" -c "
import json, sys
m = {x['module'] for x in json.load(open(sys.argv[1]))['rows']}
sys.exit(0 if len(m) == 24 and all('.experts.' in x for x in m) else 'modules %s' % sorted(m))" "$T/g4.json" || bad "--modules experts"

# refusals: exit 2, one line naming the cause, no report
refuse() { # DESC NEEDLE PATH [args]
  d=$1; n=$2; shift 2
  rm -f "$T/r.json"
  expect_exit 2 "$d" $G --checkpoint "$@" --json "$T/r.json"
  [ "$(grep -c '^qatcheck: error:' "$T/err")" -eq 1 ] || bad "$d: not one error line"
  grep -q "^qatcheck: error: .*$n" "$T/err" || bad "$d: message does not say '$n': $(cat "$T/err")"
  error_or_none "$T/r.json" || bad "$d: a report was written other than its error report"
}
"$PY" - "$T" <<'PYEOF' || bad "cannot write the bad files"
import json, struct, sys
t = sys.argv[1]
def st(name, header, data, hlen=None):
    h = json.dumps(header).encode()
    with open(t + "/" + name, "wb") as f:
        f.write(struct.pack("<Q", len(h) if hlen is None else hlen) + h + data)
w = lambda dt, shape, a, b: {"dtype": dt, "shape": shape, "data_offsets": [a, b]}
st("big.safetensors", {}, b"{}" + b" " * 64, hlen=100_000_001)
st("past.safetensors", {"m.q_proj.weight": w("BF16", [4, 8], 0, 64)}, bytes(32))
st("overlap.safetensors", {"m.a.weight": w("BF16", [4, 8], 0, 64), "m.b.weight": w("BF16", [4, 8], 32, 96)}, bytes(96))
st("count.safetensors", {"m.q_proj.weight": w("F32", [4, 8], 0, 64)}, bytes(64))
st("dtype.safetensors", {"m.q_proj.weight": w("BF17", [4, 8], 0, 64)}, bytes(64))
PYEOF
refuse "a header over 100 MB" "header length 100000001 bytes is over the 100 MB limit" "$T/big.safetensors"
refuse "offsets past the end" "tensor 'm.q_proj.weight': data_offsets \[0, 64\] run past the end of the data (32 bytes)" "$T/past.safetensors"
refuse "overlapping tensors" "tensors 'm.a.weight' and 'm.b.weight' overlap" "$T/overlap.safetensors"
refuse "a byte count that is not dtype x shape" "'m.q_proj.weight' holds 64 bytes: expected 128 (F32 x 32 elements)" "$T/count.safetensors"
refuse "an unknown dtype" "tensor 'm.q_proj.weight' has unknown dtype 'BF17'" "$T/dtype.safetensors"
rm "$T/sh/model-00002-of-00003.safetensors"
refuse "a shard named in the index but missing" "shard 'model-00002-of-00003.safetensors' (holding '.*', ...) is missing" "$T/sh"
refuse "a missing checkpoint" "cannot open" "$T/nothere.safetensors"
mkdir "$T/empty"
refuse "a folder without safetensors" "holds no \*.safetensors file" "$T/empty"
refuse "--modules matching nothing lists a module" "no linear weight matches --modules 'nothing' (37 linear weight(s), e.g. '/lm_head')" "$T/ck.safetensors" --modules nothing
"$PY" scripts/make_quant_checkpoint.py "$T/q" --convention deepseek || bad "make_quant_checkpoint"
refuse "a deployed (FP8) checkpoint" "10 linear weight(s) are stored quantized (e.g. '.*' F8_E4M3): expected a master checkpoint" "$T/q/deployed"
expect_exit 2 "--dy without --checkpoint" $G --dump $H5 --dy $H5
expect_exit 2 "--dump and --checkpoint together" $G --dump $H5 --checkpoint "$T/ck.safetensors"
finish
