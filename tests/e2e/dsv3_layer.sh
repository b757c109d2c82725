#!/bin/sh
# dsv3_layer.sh: bench/dsv3_layer.sh at its tiny size on the CPU (the GPU
# sizes, issue38 and real, run in scripts/gpu-verify.sh): a DeepSeek-V3
# layer (MLA, YaRN rope, noaux_tc router, fp8 block-128 routed experts with
# their bytes, a shared expert) under torch 2 and transformers 5 passes,
# the experts' fp8 bytes quantized on the device reproduced byte for byte;
# each planted bug (expert 2's d_w1, the router's bias in its weights,
# o_proj's d_x) fails on its module and tensors alone. Every measurement
# line is printed. Skips (77) without torch 2.
. "$(dirname "$0")/lib.inc"
have_torch2 || { echo "skip: torch 2 missing under $QC_TORCH2 (scripts/install-deps.sh)"; exit 77; }
QATCHECK=$QATCHECK PY=$PY BENCH_TMP=$T/b sh bench/dsv3_layer.sh --size tiny --device cpu --plant >"$T/log" 2>&1
rc=$?
[ $rc = 0 ] && ok "bench/dsv3_layer.sh --size tiny --plant (exit 0)" || { bad "bench/dsv3_layer.sh: exit $rc"; cat "$T/log"; }
for k in est_dump_gib dump_s dump_bytes dumper_rss_gib audit_s audit_rss_gib audit_gpu_gib audit_exit; do
  grep -q "^$k " "$T/log" || bad "no $k line"
done
[ "$(grep -c '^plant_.* ok:' "$T/log")" = 3 ] && ok "three planted bugs fail on their module alone" || bad "planted bugs: $(grep '^plant_' "$T/log")"
"$PY" - "$T/b/none/r.json" <<'P' && ok "the clean layer: every module passes, the experts' bytes checked" || bad "the clean report"
import json, sys
c = json.load(open(sys.argv[1]))["checks"]
ex = {k["tensor"] for k in c if k["module"].endswith("mlp.experts")}
mods = {k["module"].rsplit(".", 1)[-1] for k in c}
assert all(k["verdict"] == "pass" for k in c)
assert {"quantizer/w1", "quantizer/w2", "d_x", "d_w1", "d_w2", "d_topk_weights", "d_shared_w1"} <= ex, ex
assert {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "router", "qc_attn", "qc_rope_q"} <= mods, mods
P
"$PY" - "$T/b/expert_grad/r.json" <<'P' && ok "the planted expert's d_w1 is localized: the diagnosis names expert 2" || bad "expert_grad's diagnosis does not name expert 2"
import json, sys
c = [k for k in json.load(open(sys.argv[1]))["checks"] if k["verdict"] != "pass"]
assert len(c) == 1 and c[0]["tensor"] == "d_w1", c
assert "the error sits in expert 2 of " in c[0]["diagnosis"]["summary"], c[0]["diagnosis"]["summary"]
P
# the dumper's self-check of its MoE block (qatdump_hf.reproduces): a
# float32 sum of 7168 terms in another order is the same block (an
# elementwise atol of 1e-6 refused DeepSeek-V3's real dims on the CPU);
# one expert's weight 1% off is not, nor an output with an Inf
$PY2 - <<'P' && ok "the dumper's block self-check: sum order passes, a 1% wrong expert is refused" || bad "qatdump_hf.reproduces"
import sys
sys.path.insert(0, "scripts")
import torch, qatdump_hf as H
g = torch.Generator().manual_seed(0)
x = torch.randn(6, 7168, generator=g)
w = torch.randn(7168, 512, generator=g) / 7168 ** 0.5
ref = x @ w
alt = sum(x[:, i:i + 97] @ w[i:i + 97] for i in range(0, 7168, 97))  # the same sums, another order
assert (ref - alt).abs().max() > 0, "no order difference to test"
ok, rel = H.reproduces(ref, alt)
assert ok, rel
w2 = w.clone(); w2[:, :64] *= 1.01
ok, rel = H.reproduces(ref, x @ w2)
assert not ok and rel > 1e-4, rel
inf = ref.clone(); inf[0, 0] = float("inf")
assert not H.reproduces(inf, ref)[0] and not H.reproduces(ref, inf)[0], "an Inf output reproduced"
P
sed 's/^/  /' "$T/log"
finish
