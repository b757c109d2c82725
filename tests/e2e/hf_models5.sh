#!/bin/sh
# hf_models5.sh: whole models under transformers 5 (issue 38 item 1), the
# release users have: scripts/qatdump_hf.py follows 5.23's module code
# (qatdump_hf5.py) under torch 2 ($PY2). Tiny Llama, Gemma 2, Qwen2-MoE,
# Mamba2 and the 5.x architectures Qwen3-MoE (qk-norm), Gemma 3 (qk-norm,
# sliding layers with their own rope theta, a global layer) and DeepSeek-V3
# (MLA, the noaux_tc router with e_score_correction_bias, a shared expert)
# are built from configs with random weights, instrumented, stepped and
# dumped; each clean model passes `qatcheck vjp` with every mapped module
# checked and its quantized linears' deployed bytes reproduced; a bug planted
# in one module (Gemma 2's softcap derivative taken as 1, Mamba2's D skip
# left out of d_x, a qk-norm's d_x x 1.003 in Qwen3-MoE and Gemma 3,
# DeepSeek's routed_scaling_factor left out of d_logits) fails on that
# module alone. The dumper runs from a copy of scripts/ with no src/ beside
# it (the vllm quantizers' measured tables ship in scripts/tables/, which
# must equal src/numerics/'s: checked first, without torch). A release the
# dumper does not follow is refused naming the releases it follows; tried
# anyway (--other-version), a piece that differs is named, not an
# AttributeError. Mamba2 with n_groups 2 passes on 5.x's own grouping and
# lists the per-group gated norm as not judged (a release whose gated norm
# takes the whole row, 5.17, dumps it as rmsnorm). Gemma 3 (a rotary table
# per layer type) and DeepSeek-V3 (YaRN) in bf16 at 1024 tokens pass: 5.x's
# original_inv_freq is a buffer that model.to(bfloat16) rounded, and every
# rope failed (y 3% to 5% off) until the dumper kept the tables in float32.
# Skips (77) without torch 2 + transformers 5.
. "$(dirname "$0")/lib.inc"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

# the shipped tables are qatcheck's (before the skip: no torch needed)
for t in rcpa_data ceil2log_data; do
  cmp -s "$ROOT/scripts/tables/$t.txt" "$ROOT/src/numerics/$t.c" &&
    ok "scripts/tables/$t.txt is src/numerics/$t.c" || bad "scripts/tables/$t.txt differs from src/numerics/$t.c"
done
have_torch2 || { [ "$fails" -eq 0 ] || finish; echo "skip: torch 2 + transformers 5 missing ($QC_TORCH2)"; exit 77; }

# the scripts alone, no source tree around them
mkdir -p "$T/dist/conformance" "$T/dist/calibrate"
cp "$ROOT"/scripts/qatdump.py "$ROOT"/scripts/qatdump_hf.py "$ROOT"/scripts/qatdump_hf5.py "$T/dist/"
cp -r "$ROOT/scripts/tables" "$T/dist/"
cp "$ROOT/scripts/conformance/quant_oracle.py" "$T/dist/conformance/"
cp "$ROOT/scripts/calibrate/gen_tables.py" "$T/dist/calibrate/"
HF="$T/dist/qatdump_hf.py"

clean="llama gemma2 qwen2_moe mamba2 qwen3_moe gemma3 deepseek_v3"
planted="gemma2:softcap_grad mamba2:dskip_grad qwen3_moe:qk_norm_dx gemma3:qk_norm_dx deepseek_v3:route_scale_grad"
# shellcheck disable=SC2086
$PY2 -W ignore "$HF" --qatcheck "$QATCHECK" --arch $clean $planted --out "$T" >"$T/dump.log" 2>&1 ||
  { bad "qatdump_hf.py under transformers 5"; tail -30 "$T/dump.log"; finish; }
# in a second process (one import of torch and transformers each, the
# test's cost): Mamba2 with n_groups 2; then a release the dumper does not
# follow: refused, naming the releases it follows; tried anyway, what
# differs is named (no AttributeError)
cat >"$T/second.py" <<'PYEOF'
import contextlib, io, sys
sys.path.insert(0, sys.argv[3])
import transformers
import qatdump, qatdump_hf as H
qc, t = sys.argv[1], sys.argv[2]
rc = H.main(["--qatcheck", qc, "--arch", "mamba2", "--ngroups", "2", "--out", t + "/mamba2_g2"])
print("mamba2_g2 exit %d" % rc)
rc = H.main(["--qatcheck", qc, "--arch", "gemma3", "deepseek_v3", "--dtype", "bfloat16", "--seq", "1024", "--out", t + "/bf16l"])
print("bf16l exit %d" % rc)
real = transformers.__version__
transformers.__version__ = "4.57.1"
err = io.StringIO()
with contextlib.redirect_stderr(err):
    rc = H.main(["--qatcheck", qc, "--arch", "llama", "--out", t + "/v457"])
print("v457 exit %d: %d line(s): %s" % (rc, len(err.getvalue().splitlines()), err.getvalue().strip()))
transformers.__version__ = "6.0.0"
m = H.build("qwen2_moe", other_version=True)
del m.model.layers[1].mlp.gate.top_k      # a router as another release may hold it
try:
    H.instrument(m, other_version=True)
    print("instrumented")
except qatdump.QatDumpError as e:
    print(e)
m = H.build("llama", other_version=True)
from transformers.models.llama import modeling_llama as ml
orig = ml.apply_rotary_pos_emb
ml.apply_rotary_pos_emb = lambda q, k, cos, sin, position_ids=None, unsqueeze_dim=1: orig(q, k, cos, sin)
try:
    H.instrument(m, other_version=True)
    print("instrumented")
except qatdump.QatDumpError as e:
    print(e)
PYEOF
$PY2 -W ignore "$T/second.py" "$QATCHECK" "$T" "$T/dist" >"$T/second.out" 2>&1
grep -q "^mamba2_g2 exit 0" "$T/second.out" || { bad "mamba2 n_groups 2"; tail -20 "$T/second.out"; finish; }
grep -q "^bf16l exit 0" "$T/second.out" && mv "$T/bf16l/gemma3" "$T/gemma3_bf16_long" &&
  mv "$T/bf16l/deepseek_v3" "$T/deepseek_v3_bf16_long" || { bad "bf16 models at 1024 tokens"; tail -20 "$T/second.out"; finish; }
grep '^qatdump_hf' "$T/dump.log"
grep -q "transformers 5\." "$T/llama/plan.json" 2>/dev/null || grep -q '"transformers": "5\.' "$T/llama/plan.json" ||
  bad "the plan does not name a transformers 5 release: $(grep transformers "$T/llama/plan.json")"

# check_report DIR WANT: every module of DIR/plan.json was checked, the
# quantized linears' bytes reproduced, and the failed checks exactly the
# planted module's (none when clean), on the tensors its bug reaches
check_report() {
  $PY2 "$(dirname "$0")/hf_report.py" '{"gemma2_softcap_grad": [["d_k", "d_q"], ["d_q"]], "mamba2_dskip_grad": [["d_x"]],
    "qwen3_moe_qk_norm_dx": [["d_x"]], "gemma3_qk_norm_dx": [["d_x"]], "deepseek_v3_route_scale_grad": [["d_logits"]]}' "$1" "$2"
}
for d in $clean mamba2_g2 gemma3_bf16_long deepseek_v3_bf16_long gemma2_softcap_grad mamba2_dskip_grad qwen3_moe_qk_norm_dx gemma3_qk_norm_dx deepseek_v3_route_scale_grad; do
  want=0
  case $d in *_grad|*_dx) want=1 ;; esac
  (cd "$T/$d" && "$QATCHECK" vjp --case case.json --json r.json >out.txt 2>&1)
  rc=$?
  if [ $rc -ne $want ]; then bad "$d: vjp exit $rc, expected $want"; tail -15 "$T/$d/out.txt"; continue; fi
  check_report "$T/$d" $want || fails=$((fails+1))
done

# what 5.x's modules are, in the dumps: Gemma 3's sliding layers (0, 1)
# window 5 with the local theta 1e4, its global layer (2) no window, theta
# 1e6; qk-norms zero-centred; DeepSeek's MLA q, k [.., 24] and v [.., 16],
# the rope on the 8 rotary dims, k's rope on its one shared head; the
# router's noaux_tc contract; the fused experts as the moe class's w1 [E, 2F, H]
$PY2 - "$T" <<'PYEOF' || fails=$((fails+1))
import json, sys
import h5py
t = sys.argv[1]
errs = []
def contract(a, m):
    with h5py.File("%s/%s/step.h5" % (t, a), "r") as f:
        g = f[m]
        return json.loads(g.attrs["contract"]), {k: tuple(g["inputs"][k].shape) for k in g.get("inputs", {})}, \
            {k: tuple(g["params"][k].shape) for k in g.get("params", {})}
want = [("gemma3", "model.layers.0.self_attn.qc_attn", {"window": 5}),
        ("gemma3", "model.layers.2.self_attn.qc_attn", {"window": None}),
        ("gemma3", "model.layers.0.self_attn.qc_rope_q", {"theta": 10000.0}),
        ("gemma3", "model.layers.2.self_attn.qc_rope_k", {"theta": 1000000.0}),
        ("gemma3", "model.layers.1.self_attn.k_norm", {"zero_centered": True}),
        ("qwen3_moe", "model.layers.0.self_attn.q_norm", {"zero_centered": None}),
        ("deepseek_v3", "model.layers.1.mlp.router", {"score": "sigmoid", "n_group": 4, "topk_group": 2,
                                                      "route_scale": 2.5, "normalize": "yes"}),
        ("deepseek_v3", "model.layers.1.mlp.experts", {"shared_experts": 1, "shared_gate": False}),
        ("qwen2_moe", "model.layers.0.mlp.experts", {"shared_experts": 1, "shared_gate": True})]
for a, m, kv in want:
    c = contract(a, m)[0]
    for k, v in kv.items():
        if c.get(k) != v:
            errs.append("%s %s: contract %s = %r, expected %r" % (a, m, k, c.get(k), v))
_, ins, _ = contract("deepseek_v3", "model.layers.1.self_attn.qc_attn")
if (ins["q"][-1], ins["k"][-1], ins["v"][-1]) != (24, 24, 16):
    errs.append("deepseek_v3 MLA shapes %s" % ins)
_, ins, _ = contract("deepseek_v3", "model.layers.1.self_attn.qc_rope_k")
if ins["x"][1:] != (1, 8):
    errs.append("deepseek_v3 k rope %s, expected [T, 1, 8]" % (ins["x"],))
_, _, ps = contract("qwen3_moe", "model.layers.1.mlp.experts")
if ps.get("w1") != (8, 64, 64) or ps.get("w2") != (8, 64, 32):
    errs.append("qwen3_moe experts params %s" % ps)
_, _, ps = contract("deepseek_v3", "model.layers.1.mlp.router")
if ps.get("bias") != (8,):
    errs.append("deepseek_v3 router: params/bias (e_score_correction_bias) %s" % ps)
nm = json.load(open(t + "/mamba2_g2/plan.json"))["not_mapped"]
rms = any(m.endswith(".norm.rms") for m in json.load(open(t + "/mamba2_g2/plan.json"))["modules"])
import inspect
import transformers
from transformers.models.mamba2 import modeling_mamba2
if "group_size" in inspect.signature(modeling_mamba2.MambaRMSNormGated.__init__).parameters:
    if not any(n.endswith(".norm") and "per group" in why for n, why in nm):  # 5.23: a norm per group
        errs.append("mamba2 n_groups 2: the per-group gated norm is not listed as not judged: %s" % nm)
    if rms:
        errs.append("mamba2 n_groups 2: a per-group norm dumped as rmsnorm")
elif not rms:  # a release whose gated norm takes the whole row (5.17, as 4.49): an rmsnorm, judged
    errs.append("mamba2 n_groups 2: transformers %s's whole-row gated norm not dumped as rmsnorm" % transformers.__version__)
nm = json.load(open(t + "/gemma3/plan.json"))["not_mapped"]
for want_nm in ("model.embed_tokens", "lm_head", "model.layers.0.mlp (act_fn(gate) * up)"):
    if not any(n == want_nm for n, _ in nm):
        errs.append("gemma3: %s not listed as not mapped: %s" % (want_nm, nm))
print("FAIL " + "; ".join(errs) if errs else "ok   5.x's structure in the dumps: Gemma 3's per-layer windows and "
      "thetas, qk-norms, DeepSeek's MLA and router, the fused experts; what is not judged is listed")
sys.exit(1 if errs else 0)
PYEOF

# Gemma 3's conventions are the contract's: window 5 on a sliding layer
# passes, 4 fails; its rope at the global theta fails (each layer type has
# its own theta)
mk_case() { # NAME REGEX CONTRACT TENSORS...
  mc_n=$1; mc_r=$2; mc_c=$3; shift 3
  { printf '{"data": {"dump": "step.h5", "modules": "%s"}, "candidate": "dump", "contract": %s, "tolerances": {' "$mc_r" "$mc_c"
    mc_sep=""; for mc_t in "$@"; do printf '%s"%s": {"derive": true}' "$mc_sep" "$mc_t"; mc_sep=", "; done
    printf '}}\n'; } >"$T/gemma3/$mc_n.json"
}
mk_case w5 'layers\\.0\\.self_attn\\.qc_attn$' '{"window": 5}' d_q d_k d_v
mk_case w4 'layers\\.0\\.self_attn\\.qc_attn$' '{"window": 4}' d_q d_k d_v
mk_case th 'layers\\.0\\.self_attn\\.qc_rope_q$' '{"theta": 1000000}' d_x
for c in w5:0 w4:1 th:1; do
  (cd "$T/gemma3" && "$QATCHECK" vjp --case "${c%:*}.json" >"${c%:*}.out" 2>&1)
  rc=$?
  [ $rc -eq "${c#*:}" ] || bad "gemma3 convention ${c%:*}: vjp exit $rc, expected ${c#*:}"
done
[ "$fails" -eq 0 ] && ok "Gemma 3: window 5 passes, 4 fails; the sliding layer's rope at the global theta fails"

grep -q "^v457 exit 2: 1 line(s): qatdump_hf: qatdump_hf follows transformers 5.23's module code.* and 4.49's; this is 4.57.1" "$T/second.out" &&
  [ ! -e "$T/v457/step.h5" ] && ok "transformers 4.57.1: exit 2, one line naming the releases followed" ||
  bad "transformers 4.57.1: $(grep v457 "$T/second.out")"
grep -q "follows transformers 5.23's module code (and 4.49's); this is 6.0.0, where model.layers.1.mlp.gate (Qwen2MoeTopKRouter) has no top_k" "$T/second.out" &&
  grep -q "this is 6.0.0, where modeling_llama.apply_rotary_pos_emb takes (q, k, cos, sin, position_ids, unsqueeze_dim)" "$T/second.out" &&
  ! grep -q "AttributeError\|Traceback\|^instrumented" "$T/second.out" &&
  ok "transformers 6.0.0 tried anyway: the router without top_k and the old rope signature are named" ||
  bad "a release that differs: $(cat "$T/second.out")"
finish
