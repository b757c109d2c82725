#!/bin/sh
# safetensors_vjp.sh: a vjp case takes params/ from a safetensors
# checkpoint by name (data.checkpoint, data.checkpoint_prefix). The
# committed linear dump with its params/ removed passes with the same
# weights from a checkpoint; a checkpoint whose weight differs in one
# element fails d_x; a checkpoint without the module's tensors exits 2
# naming the tensor it expected.
. "$(dirname "$0")/lib.inc"
have_py "$PY" torch safetensors h5py || { echo "skip: torch, safetensors or h5py missing for $PY"; exit 77; }
"$PY" - cases/data/linear_small.h5 "$T" <<'PYEOF' || { bad "cannot write the checkpoints"; finish; }
import shutil, sys
import h5py, numpy as np, torch
from safetensors.torch import save_file
src, t = sys.argv[1], sys.argv[2]
shutil.copy(src, t + "/noparams.h5")
good, bad, pre = {}, {}, {}
with h5py.File(t + "/noparams.h5", "r+") as f:
    for g in f:
        if "params" not in f[g]:
            continue
        for p in f[g]["params"]:
            v = torch.from_numpy(f[g]["params"][p][...].view(np.int16)).view(torch.bfloat16).clone()
            good["%s.%s" % (g, p)] = v
            pre["base.%s.%s" % (g, p)] = v
            w = v.float().clone()
            if p == "weight":
                w[3, 5] *= 1.5
            bad["%s.%s" % (g, p)] = w.to(torch.bfloat16)
        del f[g]["params"]
save_file(good, t + "/good.safetensors")
save_file(bad, t + "/bad.safetensors")
save_file(pre, t + "/pre.safetensors")
PYEOF
mk() { # CHECKPOINT [PREFIX] -> case.json
  "$PY" - cases/linear_dump.json "$T" "$@" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["data"] = {"dump": "noparams.h5", "modules": "^/model\\.", "checkpoint": sys.argv[3]}
if len(sys.argv) > 4:
    c["data"]["checkpoint_prefix"] = sys.argv[4]
json.dump(c, open(sys.argv[2] + "/case.json", "w"))
PYEOF
}
mk good.safetensors
expect_exit 0 "params/ from the checkpoint: the dump's gradients pass" "$QATCHECK" vjp --case "$T/case.json"
mk pre.safetensors base.
expect_exit 0 "checkpoint_prefix names the tensors" "$QATCHECK" vjp --case "$T/case.json"
mk bad.safetensors
expect_exit 1 "a checkpoint weight off in one element fails" "$QATCHECK" vjp --case "$T/case.json" --json "$T/r.json"
"$PY" -c "
import json, sys
f = sorted({c['tensor'] for c in json.load(open(sys.argv[1]))['checks'] if c['verdict'] != 'pass'})
sys.exit(0 if f == ['d_x'] else 'failed %s' % f)" "$T/r.json" || bad "the perturbed weight should fail d_x alone"
mk pre.safetensors
expect_exit 2 "a checkpoint without the module's tensors" "$QATCHECK" vjp --case "$T/case.json" --json "$T/x.json"
grep -q "no tensor 'model.layers.0.mlp.down_proj.<param>' for module '/model.layers.0.mlp.down_proj'" "$T/err" || bad "$(cat "$T/err")"
error_or_none "$T/x.json" || bad "a refused run wrote a report other than its error report"
finish
