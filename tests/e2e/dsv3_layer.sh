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
# the dumper's attention a block of heads at a time (--attention chunked,
# the real size's: eager's four [B, heads, S, S] matrices are 32 GiB there):
# in float64 (its softmax in the input's type) O and the gradients those of
# autograd through eager's arithmetic, for every block size; and the tiny
# layer dumped through it passes
$PY2 - <<'P' && ok "chunked attention: O and d_q, d_k, d_v those of eager autograd in float64, blocks of 1 to 3 heads" || bad "bench/dsv3_layer.py's _ChunkedAttn"
import sys
sys.path.insert(0, "bench")
import torch, torch.nn.functional as F, dsv3_layer as D
class F64:  # the module's F, its softmax in the input's dtype
    def __getattr__(self, n): return getattr(F, n)
    @staticmethod
    def softmax(x, dim, dtype=None): return F.softmax(x, dim)
D.F = F64()
g = torch.Generator().manual_seed(0)
B, H, S = 2, 3, 7
q, k = (torch.randn(B, H, S, 5, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
v = torch.randn(B, H, S, 4, generator=g, dtype=torch.float64, requires_grad=True)
mask = torch.full((S, S), torch.finfo(torch.float64).min, dtype=torch.float64).triu(1)[None, None].expand(B, 1, S, S)
s = torch.matmul(q, k.transpose(2, 3)) * 0.37 + mask
o = torch.matmul(F.softmax(s, -1), v)
go = torch.randn(o.shape, generator=g, dtype=torch.float64)
want = torch.autograd.grad(o, (q, k, v), go)
for hb in (1, 2, 3):
    o2, lse = D._ChunkedAttn.apply(q, k, v, mask, 0.37, hb)
    assert torch.allclose(o2, o, rtol=1e-14, atol=0)
    assert lse.dtype == torch.float32 and torch.allclose(lse.double(), torch.logsumexp(s, -1), rtol=1e-6)
    got = torch.autograd.grad(o2, (q, k, v), go)
    for n, a, b in zip("qkv", want, got):
        assert (a - b).abs().max() <= 1e-13 * a.abs().max(), (hb, n, (a - b).abs().max())
P
QATCHECK=$QATCHECK PY=$PY BENCH_TMP=$T/c sh bench/dsv3_layer.sh --size tiny --device cpu --attention chunked >"$T/logc" 2>&1 &&
  grep -q '"attention": "chunked"' "$T/logc" && grep -q '^audit_exit 0' "$T/logc" &&
  ok "the tiny layer with --attention chunked passes" || { bad "--attention chunked"; cat "$T/logc"; }
sed 's/^/  /' "$T/log"
finish
