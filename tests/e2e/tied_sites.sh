#!/bin/sh
# tied_sites.sh: attribute limits follow the data (issue #42, 4). A tie's
# `sites` attribute was cut at 4 KB, so a legitimate 60-site tie was
# refused as "not a JSON list". A 60-site tie (torch, scripts/qatdump.py,
# long module names: its sites list is 4.8 KB) is judged, and the same tie
# with its last site's share lost fails naming that site. Skips (77)
# without torch.
. "$(dirname "$0")/lib.inc"
have_py "$PY" torch h5py || { echo "skip: torch or h5py missing for $PY"; exit 77; }
cat >"$T/tie.py" <<'P'
"""One weight used by 60 projections (weights shared across the layers of a
stack); "lost": the last site holds its own Parameter over the weight's
storage, so its share never reaches the weight's .grad."""
import sys
sys.path.insert(0, "scripts")
import torch  # noqa: E402
import qatdump  # noqa: E402
K, SITES = 8, 60
class Shared(torch.nn.Module):
    def __init__(self, lost):
        super().__init__()
        self.model_decoder_shared_layer_stack = torch.nn.ModuleList()
        for i in range(SITES):
            blk = torch.nn.Module()
            blk.self_attention_output_projection = torch.nn.Linear(K, K)
            if i:
                w = self.model_decoder_shared_layer_stack[0].self_attention_output_projection.weight
                blk.self_attention_output_projection.weight = torch.nn.Parameter(w.data) if lost and i == SITES - 1 else w
            self.model_decoder_shared_layer_stack.append(blk)
    def forward(self, x):
        for b in self.model_decoder_shared_layer_stack:
            x = torch.tanh(b.self_attention_output_projection(x))
        return x
for out, lost in ((sys.argv[1], False), (sys.argv[2], True)):
    torch.manual_seed(0)
    m = Shared(lost)
    with qatdump.attach(m, out, modules=r"self_attention_output_projection$", mode="tied"):
        (m(torch.randn(2, 4, K, generator=torch.Generator().manual_seed(1))) ** 2).mean().backward()
P
$PY "$T/tie.py" "$T/tie60.h5" "$T/tie60_lost.h5" >"$T/py.txt" 2>&1 || { cat "$T/py.txt"; bad "dumping the 60-site tie"; finish; }
$PY - "$T/tie60.h5" <<'P' && ok "the tie's sites attribute is over 4 KB" || bad "the sites attribute is not over 4 KB"
import json, sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    (g,) = f["qatcheck_mode/tied"].values()
    s = g.attrs["sites"]
    s = s.decode() if isinstance(s, bytes) else s
    assert len(json.loads(s)) == 60 and len(s) > 4096, len(s)
P
for d in tie60 tie60_lost; do
  printf '{"data": {"dump": "%s.h5", "modules": "self_attention_output_projection$"}, "candidate": "dump", "tolerances": {"d_x": {"derive": true}, "d_weight": {"derive": true}, "d_bias": {"derive": true}}}\n' "$d" >"$T/$d.json"
done
expect_exit 0 "a 60-site tie is judged" "$QATCHECK" vjp --case "$T/tie60.json" --json "$T/tie60.r.json"
grep -q "tied:accumulated  d_weight .* pass" "$T/out" && ok "its accumulated gradient checked against the 60 shares" || bad "no tie check: $(tail -3 "$T/out")"
expect_exit 1 "the 60-site tie with its last share lost fails" "$QATCHECK" vjp --case "$T/tie60_lost.json"
grep -q "tied:accumulated  d_weight .* FAIL" "$T/out" && grep -q "site 59's share (/model_decoder_shared_layer_stack.59.self_attention_output_projection/weight) is lost" "$T/out" \
  && ok "the lost share named" || bad "lost share: $(grep -i "tied\|lost" "$T/out" | head -3)"
finish
