#!/usr/bin/python3
"""qatdump_hf: whole Hugging Face transformers models, dumped for `qatcheck vjp`
(docs/models.md).

A model is built from its config with random weights (nothing is
downloaded), instrumented so that each library module runs as one module
qatcheck has a class for, run for one training step with scripts/qatdump.py
attached to every mapped module, and written with a case file whose
tolerances are derived by qatcheck. What cannot be mapped is listed by name
(printed, and in the dump's root attribute `not_mapped`, a JSON list).

    import qatdump_hf
    model = qatdump_hf.build("llama", size="tiny")      # or your own transformers model
    plan = qatdump_hf.instrument(model, fmt="fp8_block128")
    ids, mask = qatdump_hf.batch(model)                 # token ids [B, S], loss mask [B, S-1]
    qatdump_hf.dump_step(model, plan, ids, mask, "step.h5")  # forward, backward, dump, optimizer step
    qatdump_hf.write_case(plan, "step.h5", "case.json")

or from the shell (--help lists the rest):

    scripts/qatdump_hf.py --arch llama [gemma2 qwen2_moe:PLANT ...] --out DIR
                          [--format fp8_block128|nvfp4|none] [--size tiny|gpu] [--device cpu|cuda]

Two releases are followed: transformers 5 (5.23's module code, any 5.x
whose pieces match, checked first: qatdump_hf5.py; also Qwen3-MoE, Gemma 3,
DeepSeek-V3) and 4.49 (Debian's torch 1.13). Another release is refused
naming them (--other-version tries it, naming a piece that differs).

The mapping (4.49's names; 5.x's in docs/models.md; what each class's contract is set from):

  nn.Linear                 linear: the serving engine's quantized forward (fake
                            quant of the master under --format, bf16 operands,
                            fp32 accumulation; its deployed bytes saved) and the
                            trainer's backward (dX from the dequantized weight,
                            dW straight through)
  *RMSNorm                  rmsnorm (eps; Gemma's (1 + w): zero_centered)
  attention interface       attention (causal, HF's own mask: window, softcap,
                            scaling, GQA); Llama and Gemma 2 (ALL_ATTENTION_FUNCTIONS),
                            Qwen2-MoE's inline eager lines
  apply_rotary_pos_emb      rope, one module for q and one for k (theta, half;
                            under rope_scaling the table inv_freq and scale)
  MLP act(gate) * up        swiglu (silu); Gemma 2's act_fn alone: gelu (tanh)
  Qwen2MoeSparseMoeBlock    router (softmax, top-k, norm_topk_prob) and moe
                            (stacked experts, shared expert, sigmoid gate)
  Mamba2Mixer               conv1d (the causal depthwise conv), ssd (D skip,
                            ngroups), the gated norm's rmsnorm; in_proj, out_proj
  the loss                  logprob (per-token log-probabilities, mean_tokens)
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import h5py
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as _e:
    sys.stderr.write("qatdump_hf: needs torch, h5py and numpy (%s): run it with /usr/bin/python3 "
                     "(scripts/install-deps.sh)\n" % _e)
    sys.exit(2)
import qatdump  # noqa: E402

try:
    import transformers
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
except ImportError:
    transformers = None

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "conformance"))

BF16 = torch.bfloat16
# the GPU's measured arithmetic (rcp.approx, ceil(log2)) the vllm profile's
# quantizers use: a copy of qatcheck's src/numerics/*_data.c shipped with the
# scripts (tests/e2e/hf_models5.sh checks that the two agree)
TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tables")
PLANTS = ("none", "o_proj_dx", "softcap_grad", "dskip_grad", "swiglu_gate_grad", "qk_norm_dx", "route_scale_grad")


def class_grads(qatcheck=None):
    """The gradients of each class, {class: [d_...]}, from qatcheck's class
    table (`qatcheck classes --json`, the one source of class facts). Read
    from the first of: `qatcheck`, a path to the qatcheck binary or to a
    file holding that JSON (.json); $QATCHECK_CLASSES (such a file);
    $QATCHECK (the binary); and when none is given, the qatcheck of this
    script's repository (scripts/..), else qatcheck on $PATH. Raises
    QatDumpError naming where it looked."""
    given = [t for t in (qatcheck, os.environ.get("QATCHECK_CLASSES"), os.environ.get("QATCHECK")) if t]
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "qatcheck")
    tried = given[:1] or [t for t in (here, shutil.which("qatcheck")) if t]
    for t in tried:
        if not os.path.isfile(t):
            continue
        try:
            if t.endswith(".json"):
                with open(t) as f:
                    doc = json.load(f)
            else:
                out = subprocess.run([t, "classes", "--json"], capture_output=True, check=True, timeout=60)
                doc = json.loads(out.stdout)
            return {c["name"]: list(c["grads"]) for c in doc["classes"]}
        except (OSError, ValueError, KeyError, TypeError, subprocess.SubprocessError) as e:
            raise qatdump.QatDumpError("cannot read the class table from %s (`qatcheck classes --json`): %s" % (t, e))
    raise qatdump.QatDumpError("the case's gradients come from qatcheck's class table, and no qatcheck was found "
                               "(looked at %s): build it (make), or pass --qatcheck PATH (the binary, or the "
                               "output of `qatcheck classes --json`), or set QATCHECK" % (", ".join(tried) or here))


RELEASES = ("4.49", "5.23")   # the releases whose module code the instrumentation follows


def release():
    """The instrumentation path for the installed transformers: "5" (5.x:
    5.23's module code), "4.49", or None (a release it does not follow)."""
    v = transformers.__version__ if transformers is not None else ""
    if v.startswith("4.49."):
        return "4.49"
    if v.split(".")[0] == "5":
        return "5"
    return None


def need_transformers(other_version=False):
    """transformers imported and a release followed; with other_version, an
    unknown one is tried on the nearest path (5 for 5 and later, else 4.49),
    and a piece that differs is named (check_structure) before any change."""
    if transformers is None:
        raise ImportError("qatdump_hf needs transformers (5.x, or 4.49.0 under torch 1.13: scripts/install-deps.sh)")
    if release() is None and not other_version:
        raise qatdump.QatDumpError(
            "qatdump_hf follows transformers 5.23's module code (any 5.x, checked piece by piece) and 4.49's; "
            "this is %s, whose modules it does not know (4.50 to 4.57 moved the attention, the rope and the MoE "
            "blocks between the two): install 5.x, or pass other_version=True (--other-version) to try it anyway"
            % transformers.__version__)
    return release() or ("5" if int(transformers.__version__.split(".")[0]) >= 5 else "4.49")


class _Saved(torch.autograd.Function):
    """Identity on y whose autograd node saves the forward's results (the
    attention's O and LSE, the routing ids): what qatdump writes to saved/."""

    @staticmethod
    def forward(ctx, y, *saved):
        ctx.save_for_backward(*saved)
        return y.clone()

    @staticmethod
    def backward(ctx, g):
        return (g,) + (None,) * len(ctx.saved_tensors)


# ---- linear: the serving engine's quantized forward, the trainer's backward ----

_QUANT_S = [0.0]   # seconds spent in the host-side fake quantization


def dequant_weight(w, fmt, deployed=False):
    """dequant(quant(W)) under fmt (qatcheck's contract, profile vllm), as
    the bf16 operand the GEMMs read; with deployed, also the bytes a serving
    engine holds: [weight_q (uint8 payload), weight_scale (float32 block
    multipliers, or nvfp4's e4m3 bytes), weight_global_scale (nvfp4)]."""
    if fmt == "none":
        return w.detach().to(BF16), []
    import quant_oracle  # the independent oracle of the formats (scripts/conformance/)
    quant_oracle.use_tables(TABLES)  # the measured tables shipped with the scripts, not the C sources
    t0 = time.perf_counter()
    wn = w.detach().float().cpu().numpy()
    fq = quant_oracle.fake_quant(fmt, "vllm", wn)
    r = torch.from_numpy(np.ascontiguousarray(fq)).to(w.device).to(BF16)
    saved = []
    if deployed:
        q, sc, g = quant_oracle.quantize(fmt, "vllm", wn)
        saved = [torch.from_numpy(np.ascontiguousarray(q, np.uint8)),
                 torch.from_numpy(np.ascontiguousarray(sc, np.uint8 if sc.dtype == np.uint8 else np.float32))]
        if g is not None:
            saved.append(torch.from_numpy(np.ascontiguousarray(g, np.float32)))
    _QUANT_S[0] += time.perf_counter() - t0
    return r, saved


class _QLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, mod):
        wq, dep = dequant_weight(w, mod.qc_format, mod.qc_deployed)
        ctx.save_for_backward(*dep)  # the deployed bytes only (saved/ of the dump); the rest as attributes
        xb = x.detach().to(BF16)
        y = xb.float() @ wq.float().t()
        if b is not None:
            y = y + b.detach().float()
        ctx.xb, ctx.wq, ctx.mod, ctx.has_b = xb, wq, mod, b is not None
        ctx.xdtype, ctx.wdtype = x.dtype, w.dtype
        return y.to(BF16).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        g = dy.to(BF16).float()
        g2 = g.reshape(-1, g.shape[-1])
        dx = g @ ctx.wq.float()
        if ctx.mod.qc_plant == "o_proj_dx":
            dx = dx * 1.001                     # the planted bug: d_x scaled by 1.001
        dx = dx.to(BF16).to(ctx.xdtype)
        dw = (g2.t() @ ctx.xb.reshape(-1, ctx.xb.shape[-1]).float()).to(BF16).to(ctx.wdtype)
        db = g2.sum(0).to(BF16).to(ctx.wdtype) if ctx.has_b else None
        return dx, dw, db, None


class QcLinear(torch.nn.Linear):
    """nn.Linear whose forward is the serving engine's (quantized weight,
    bf16 GEMM) and whose backward is the trainer's under test."""
    qatcheck_class = "linear"

    def forward(self, x):
        return _QLinearFn.apply(x, self.weight, self.bias, self)


def reproduces(ref, got):
    """Whether an instrumented block's output GOT is the library's REF up to
    the order of float32 sums: the difference's norm within 1e-5 of REF's
    (an elementwise atol fails a correct block at hidden 7168 on the CPU,
    where sums of thousands of terms differ by a few ulps; one wrong expert,
    weight or routing is O(1) relative; a non-finite output is never the
    same). Returns (ok, relative difference)."""
    d = (ref.double() - got.double()).norm().item()
    r = ref.double().norm().item()
    return math.isfinite(d) and math.isfinite(r) and d <= 1e-5 * r, d / r if r > 0 else d


def _to_qc_linear(lin, fmt, deployed=True):
    lin.__class__ = QcLinear
    lin.qc_format, lin.qc_plant, lin.qc_deployed = fmt, "none", deployed and fmt != "none"
    if lin.qc_deployed:
        lin.qatcheck_saved = ["weight_q", "weight_scale"] + (["weight_global_scale"] if fmt == "nvfp4" else [])
    lin.qatcheck_contract = {"weight_format": fmt, "activation_format": "none",
                             "dx_weight": "dequant" if fmt != "none" else "master"}
    if fmt != "none":
        lin.qatcheck_contract["profile"] = "vllm"


# ---- pieces computed inline by the library, made modules ----

class QcSwiGLU(torch.nn.Module):
    """act(gate) * up, the MLP's product, with the library's own act_fn."""
    qatcheck_class = "swiglu"
    qatcheck_inputs = ["gate", "up"]
    qatcheck_contract = {"limit": 0}

    def __init__(self, act):
        super().__init__()
        object.__setattr__(self, "_act", act)

    def forward(self, gate, up):
        if getattr(self, "qc_plant", "none") == "swiglu_gate_grad":
            gate = ScaleGrad.apply(gate, 1.003)  # the planted bug: d_gate scaled by 1.003
        return self._act(gate) * up


class ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times f, rounded to the gradient's dtype."""

    @staticmethod
    def forward(ctx, x, f):
        ctx.f = f
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # in float32: a bf16 tensor times a Python float takes the float as bf16 (1.003 -> 1)
        return (g.float() * ctx.f).to(g.dtype), None


def _mlp_forward(self, x):
    # LlamaMLP / Qwen2MoeMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))
    return self.down_proj(self.qc_swiglu(self.gate_proj(x), self.up_proj(x)))


class QcRope(torch.nn.Module):
    """The library's apply_rotary_pos_emb on one of q, k: x [T, H, D] (tokens
    first), positions [T]; cos and sin are the model's rotary_emb output.
    With table (the model's rotary_emb under a config's rope_scaling:
    llama3, yarn, linear, dynamic), its inv_freq at the call is an input
    (the frequencies the angles used) and its attention_scaling the
    contract's scale (cos and sin are multiplied by it)."""
    qatcheck_class = "rope"
    qatcheck_inputs = ["x", "positions"]

    def __init__(self, rotate_half, theta, table=None):
        super().__init__()
        object.__setattr__(self, "_rot", rotate_half)
        object.__setattr__(self, "table", table)  # not a submodule: the model owns it
        self.qatcheck_contract = {"theta": float(theta), "layout": "half"}
        if table is not None:
            self.qatcheck_inputs = ["x", "positions", "inv_freq"]
            self.qatcheck_contract["scale"] = float(table.attention_scaling)
        self.cos = self.sin = None

    def forward(self, x, positions, inv_freq=None):
        return x * self.cos + self._rot(x) * self.sin


def _rope_table(model):
    """The model's rotary embedding when its config scales RoPE (a
    rope_type other than default, or an attention_scaling other than 1),
    else None."""
    for m in model.modules():
        if torch.is_tensor(getattr(m, "inv_freq", None)) and hasattr(m, "attention_scaling"):
            if getattr(m, "rope_type", "default") != "default" or float(m.attention_scaling) != 1.0:
                return m
            return None
    return None


class QcAttention(torch.nn.Module):
    """The library's attention function on q, k, v [B, H, S, D] under the mask
    the library built (causal, sliding window); saves O and the LSE of the
    capped, masked logits."""
    qatcheck_class = "attention"
    qatcheck_inputs = ["q", "k", "v"]
    qatcheck_saved = ["out", "lse"]

    def __init__(self, eager, contract):
        super().__init__()
        object.__setattr__(self, "_eager", eager)
        self.qatcheck_contract = contract
        self.qc_plant = "none"
        self.call = None

    def forward(self, q, k, v):
        parent, mask, scaling, softcap = self.call
        eager = _eager_softcap_st if self.qc_plant == "softcap_grad" else self._eager
        o, _ = eager(parent, q, k, v, mask, dropout=0.0, scaling=scaling, softcap=softcap)
        o = o.transpose(1, 2)
        with torch.no_grad():
            rep = q.shape[1] // k.shape[1]
            kk = k.repeat_interleave(rep, dim=1)
            s = torch.matmul(q.float(), kk.float().transpose(2, 3)) * scaling
            if softcap is not None:
                s = torch.tanh(s / softcap) * softcap
            if mask is not None:
                s = s + mask[:, :, :, : k.shape[-2]]
            lse = torch.logsumexp(s, dim=-1)
        return _Saved.apply(o, o.detach().float().contiguous(), lse.float().contiguous())


def _eager_softcap_st(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kw):
    """Gemma 2's eager attention with the planted bug: the cap's value in the
    forward, its derivative taken as 1 (a detached tanh)."""
    from transformers.models.gemma2.modeling_gemma2 import repeat_kv
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    s = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if softcap is not None:
        s = s + (torch.tanh(s / softcap) * softcap - s).detach()
    if attention_mask is not None:
        s = s + attention_mask[:, :, :, : key_states.shape[-2]]
    p = F.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(p, value_states).transpose(1, 2).contiguous(), p


def _qc_attention_interface(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None,
                            **kwargs):
    core = module.qc_attn
    core.call = (module, attention_mask, scaling if scaling is not None else module.head_dim ** -0.5, softcap)
    out = core(query, key, value)
    return out.transpose(1, 2).contiguous(), None


def _qwen2moe_eager(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kw):
    """Qwen2MoeAttention.forward's inline eager attention (transformers 4.49),
    its lines unchanged, from repeat_kv to the product with V."""
    from transformers.models.qwen2_moe.modeling_qwen2_moe import repeat_kv
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) / math.sqrt(module.head_dim)
    if attention_mask is not None:
        causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
        attn_weights = attn_weights + causal_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=module.attention_dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def _qwen2moe_attn_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None,
                           output_attentions=False, use_cache=False, cache_position=None, position_embeddings=None):
    """Qwen2MoeAttention.forward (4.49) with the attention core as a module."""
    from transformers.models.qwen2_moe import modeling_qwen2_moe as mq
    if past_key_value is not None:
        raise qatdump.QatDumpError("qatdump_hf: Qwen2-MoE attention is instrumented for training steps (no cache)")
    bsz, q_len, _ = hidden_states.size()
    query_states = self.q_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
    key_states = self.k_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
    value_states = self.v_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
    cos, sin = position_embeddings
    query_states, key_states = mq.apply_rotary_pos_emb(query_states, key_states, cos, sin, position_ids)
    self.qc_attn.call = (self, attention_mask, 1.0 / math.sqrt(self.head_dim), None)
    attn_output = self.qc_attn(query_states, key_states, value_states)
    attn_output = attn_output.transpose(1, 2).contiguous().reshape(bsz, q_len, self.hidden_size)
    return self.o_proj(attn_output), None, past_key_value


_CURRENT = []   # the attention module running (for apply_rotary_pos_emb)


def _track_current(m):
    def pre(mod, args):
        _CURRENT.append(mod)

    def post(mod, args, out):
        _CURRENT.pop()
    m.register_forward_pre_hook(pre)
    m.register_forward_hook(post)


def _rope_patch(orig):
    def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        att = _CURRENT[-1] if _CURRENT else None
        if att is None or not hasattr(att, "qc_rope_q") or unsqueeze_dim != 1:
            return orig(q, k, cos, sin, position_ids, unsqueeze_dim)
        out = []
        for t, rope in ((q, att.qc_rope_q), (k, att.qc_rope_k)):
            b, h, s, d = t.shape
            rope.cos = cos.reshape(b * s, 1, d)
            rope.sin = sin.reshape(b * s, 1, d)
            extra = () if rope.table is None else (rope.table.inv_freq.detach().float(),)
            y = rope(t.transpose(1, 2).reshape(b * s, h, d), att.qc_positions, *extra)
            out.append(y.reshape(b, s, h, d).transpose(1, 2))
        return tuple(out)
    apply_rotary_pos_emb.qc_orig = orig
    return apply_rotary_pos_emb


class QcLogprob(torch.nn.Module):
    """The causal-LM loss as per-token terms: y[b, s] = w (log p(id)) with
    w = mask / (counted tokens); loss = -sum(y) is the library's mean
    cross-entropy over the counted tokens."""
    qatcheck_class = "logprob"
    qatcheck_inputs = ["logits"]
    qatcheck_saved = ["token_ids", "loss_mask"]
    qatcheck_contract = {"normalization": "mean_tokens"}

    def __init__(self):
        super().__init__()
        self.ids = self.mask = None

    def forward(self, logits):
        b, s, v = logits.shape
        ids = torch.where(self.mask.bool(), self.ids, torch.full_like(self.ids, -100))
        nll = F.cross_entropy(logits.float().reshape(-1, v), ids.reshape(-1), ignore_index=-100, reduction="none")
        y = -nll.reshape(b, s) / self.mask.sum().clamp(min=1).float()
        return _Saved.apply(y, self.ids, self.mask)


# ---- Qwen2-MoE: router and experts ----

class QcRouter(torch.nn.Module):
    """Qwen2MoeSparseMoeBlock's routing: softmax over the experts in float32,
    top-k, optionally renormalized (norm_topk_prob)."""
    qatcheck_class = "router"
    qatcheck_inputs = ["logits"]
    qatcheck_saved = ["topk_ids"]

    def __init__(self, k, norm):
        super().__init__()
        self.k, self.norm = k, norm
        self.qatcheck_contract = {"score": "softmax", "normalize": "yes" if norm else "no"}
        self.ids = None

    def forward(self, logits):
        rw = F.softmax(logits, dim=1, dtype=torch.float)
        rw, ids = torch.topk(rw, self.k, dim=-1)
        if self.norm:
            rw = rw / rw.sum(dim=-1, keepdim=True)
        self.ids = ids
        return _Saved.apply(rw, ids)


class QcMoE(torch.nn.Module):
    """The routed experts and the gated shared expert of
    Qwen2MoeSparseMoeBlock, its forward line for line, with the experts'
    weights stacked as qatcheck's moe class holds them: w1 [E, 2F, H] (gate
    rows, then up rows), w2 [E, H, F], shared_w1 [2Fs, H], shared_w2 [H, Fs],
    shared_gate [1, H]."""
    qatcheck_class = "moe"
    qatcheck_inputs = ["x", "topk_weights"]
    qatcheck_saved = ["topk_ids"]

    def __init__(self, block):
        super().__init__()
        ex = block.experts
        self.w1 = torch.nn.Parameter(torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight]) for e in ex]).detach().clone())
        self.w2 = torch.nn.Parameter(torch.stack([e.down_proj.weight for e in ex]).detach().clone())
        se = block.shared_expert
        self.shared_w1 = torch.nn.Parameter(torch.cat([se.gate_proj.weight, se.up_proj.weight]).detach().clone())
        self.shared_w2 = torch.nn.Parameter(se.down_proj.weight.detach().clone())
        self.shared_gate = torch.nn.Parameter(block.shared_expert_gate.weight.detach().clone())
        object.__setattr__(self, "_act", ex[0].act_fn)
        self.E, self.F, self.Fs = len(ex), ex[0].gate_proj.weight.shape[0], se.gate_proj.weight.shape[0]
        self.qatcheck_contract = {"activation": "swiglu", "shared_experts": 1, "shared_gate": True}
        self.ids = None

    def _mlp(self, x, w1, w2, f):
        return F.linear(self._act(F.linear(x, w1[:f])) * F.linear(x, w1[f:]), w2)

    def forward(self, x, topk_weights):
        ids = self.ids
        out = torch.zeros_like(x)
        mask = F.one_hot(ids, num_classes=self.E).permute(2, 1, 0)
        w1s, w2s = self.w1.unbind(0), self.w2.unbind(0)  # one stacked gradient, not E full-size scatters
        for e in range(self.E):
            idx, top_x = torch.where(mask[e])
            h = self._mlp(x[None, top_x].reshape(-1, x.shape[-1]), w1s[e], w2s[e], self.F)
            out = out.index_add(0, top_x, (h * topk_weights[top_x, idx, None]).to(x.dtype))
        sh = torch.sigmoid(F.linear(x, self.shared_gate)) * self._mlp(x, self.shared_w1, self.shared_w2, self.Fs)
        return _Saved.apply(out + sh, ids)


class QcMoEBlock(torch.nn.Module):
    """Replaces Qwen2MoeSparseMoeBlock: gate (linear) -> router -> moe."""

    def __init__(self, block):
        super().__init__()
        self.gate = block.gate
        self.router = QcRouter(block.top_k, block.norm_topk_prob)
        self.experts = QcMoE(block)

    def forward(self, hidden_states):
        b, s, h = hidden_states.shape
        x = hidden_states.view(-1, h)
        logits = self.gate(x)
        rw = self.router(logits).to(x.dtype)
        self.experts.ids = self.router.ids
        return self.experts(x, rw).reshape(b, s, h), logits


# ---- Mamba2: conv1d, ssd, the gated norm ----

class QcConv1d(torch.nn.Module):
    """Mamba2Mixer's causal depthwise conv on x [B, L, C] (channels last):
    the library's conv1d(x^T)[..., :L]^T, weight [C, 1, K], bias [C]."""
    qatcheck_class = "conv1d"

    def __init__(self, conv):
        super().__init__()
        self.weight, self.bias = conv.weight, conv.bias
        self.padding, self.groups = conv.padding, conv.groups

    def forward(self, x):
        L = x.shape[1]
        return F.conv1d(x.transpose(1, 2), self.weight, self.bias, padding=self.padding,
                        groups=self.groups)[..., :L].transpose(1, 2)


class QcSSD(torch.nn.Module):
    """Mamba2Mixer.torch_forward's chunked SSD (transformers 4.49, the
    training path), its lines unchanged: x [B, L, H, P], dt [B, L, H] (after
    softplus and clamp), A [H], Bm, Cm [B, L, G, N], D [H]; y [B, L, H, P]."""
    qatcheck_class = "ssd"
    qatcheck_inputs = ["x", "dt", "A", "Bm", "Cm", "D"]

    def __init__(self, mixer):
        super().__init__()
        self.chunk_size, self.num_heads, self.n_groups = mixer.chunk_size, mixer.num_heads, mixer.n_groups
        self.qatcheck_contract = {"chunk_size": int(mixer.chunk_size), "d_skip": True}
        self.qc_plant = "none"
        # "tile": transformers 4.49's torch path, B.repeat(1, 1, H/G, 1): head h reads group h mod G;
        # "interleave": mamba_ssm's (and qatcheck's) convention, head h reads group h / (H/G)
        self.group_map = "tile"

    def forward(self, x, dt, A, Bm, Cm, D):
        from transformers.models.mamba2.modeling_mamba2 import pad_tensor_by_size, reshape_into_chunks, segment_sum
        batch_size, seq_len = x.shape[:2]
        hidden_states = x.float()
        r = self.num_heads // self.n_groups
        if self.group_map == "tile":
            B, C = Bm.float().repeat(1, 1, r, 1), Cm.float().repeat(1, 1, r, 1)
        else:
            B, C = Bm.float().repeat_interleave(r, dim=2), Cm.float().repeat_interleave(r, dim=2)
        pad_size = (self.chunk_size - seq_len % self.chunk_size) % self.chunk_size
        xs = hidden_states.detach() if self.qc_plant == "dskip_grad" else hidden_states  # planted: D x's d_x lost
        D_residual = D[..., None] * pad_tensor_by_size(xs, pad_size)
        hidden_states = hidden_states * dt[..., None]
        A = A.to(hidden_states.dtype) * dt
        hidden_states, A, B, C = [reshape_into_chunks(t, pad_size, self.chunk_size) for t in (hidden_states, A, B, C)]
        A = A.permute(0, 3, 1, 2)
        A_cumsum = torch.cumsum(A, dim=-1)
        L = torch.exp(segment_sum(A))
        G = (C[:, :, :, None, :, :] * B[:, :, None, :, :, :]).sum(dim=-1)
        M = (G[..., None] * L.permute(0, 2, 3, 4, 1)[..., None]).sum(dim=-1)
        Y_diag = (M[..., None] * hidden_states[:, :, None]).sum(dim=3)
        decay_states = torch.exp((A_cumsum[:, :, :, -1:] - A_cumsum))
        B_decay = B * decay_states.permute(0, -2, -1, 1)[..., None]
        states = (B_decay[..., None, :] * hidden_states[..., None]).sum(dim=2)
        previous_states = torch.zeros_like(states[:, :1])
        states = torch.cat([previous_states, states], dim=1)
        decay_chunk = torch.exp(segment_sum(F.pad(A_cumsum[:, :, :, -1], (1, 0))))
        decay_chunk = decay_chunk.transpose(1, 3)
        new_states = (decay_chunk[..., None, None] * states[:, :, None, ...]).sum(dim=1)
        states = new_states[:, :-1]
        state_decay_out = torch.exp(A_cumsum)
        C_times_states = (C[..., None, :] * states[:, :, None, ...])
        Y_off = (C_times_states.sum(-1) * state_decay_out.permute(0, 2, 3, 1)[..., None])
        y = Y_diag + Y_off
        y = y.reshape(batch_size, -1, self.num_heads, y.shape[-1])
        y = y + D_residual
        if pad_size > 0:
            y = y[:, :seq_len, :, :]
        return y


class QcRMSNorm(torch.nn.Module):
    """The rmsnorm half of MambaRMSNormGated (its weight, its eps)."""
    qatcheck_class = "rmsnorm"

    def __init__(self, gated):
        super().__init__()
        self.weight = gated.weight
        self.variance_epsilon = gated.variance_epsilon
        self.qatcheck_contract = {"eps": float(gated.variance_epsilon)}

    def forward(self, h):
        dt = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dt)


class QcGatedNorm(torch.nn.Module):
    """MambaRMSNormGated(y, gate) as two pieces: y * silu(gate) (no class:
    not mapped), then the rmsnorm."""

    def __init__(self, gated):
        super().__init__()
        self.rms = QcRMSNorm(gated)

    def forward(self, hidden_states, gate=None):
        h = hidden_states.to(torch.float32)
        if gate is not None:
            h = h * F.silu(gate.to(torch.float32))
        return self.rms(h).to(hidden_states.dtype) if hidden_states.dtype != torch.float32 else self.rms(h)


def _mamba2_forward(self, input_states, cache_params=None, cache_position=None, attention_mask=None):
    """Mamba2Mixer.torch_forward (transformers 4.49), the training path (no
    cache, no padding mask), with the conv, the SSD and the gated norm as
    modules."""
    if cache_params is not None or attention_mask is not None and not bool(attention_mask.all()):
        raise qatdump.QatDumpError("qatdump_hf: Mamba2 is instrumented for training steps without cache or padding")
    batch_size, seq_len, _ = input_states.shape
    dtype = input_states.dtype
    projected_states = self.in_proj(input_states)
    d_mlp = (projected_states.shape[-1] - 2 * self.intermediate_size - 2 * self.n_groups * self.ssm_state_size
             - self.num_heads) // 2
    _, _, gate, hidden_states_B_C, dt = projected_states.split(
        [d_mlp, d_mlp, self.intermediate_size, self.conv_dim, self.num_heads], dim=-1)
    hidden_states_B_C = self.act(self.qc_conv(hidden_states_B_C))
    hidden_states, B, C = torch.split(
        hidden_states_B_C,
        [self.intermediate_size, self.n_groups * self.ssm_state_size, self.n_groups * self.ssm_state_size], dim=-1)
    A = -torch.exp(self.A_log.float())
    dt = F.softplus(dt + self.dt_bias)
    dt = torch.clamp(dt, self.time_step_limit[0], self.time_step_limit[1])
    x = hidden_states.reshape(batch_size, seq_len, -1, self.head_dim)
    B = B.reshape(batch_size, seq_len, -1, self.ssm_state_size)
    C = C.reshape(batch_size, seq_len, -1, self.ssm_state_size)
    y = self.qc_ssd(x, dt, A, B, C, self.D)
    y = y.reshape(batch_size, seq_len, -1)
    scan_output = self.norm(y, gate)
    return self.out_proj(scan_output.to(dtype))


# ---- the model zoo: tiny configs for the tests, realistic ones for a GPU ----

def config_for(arch, size="tiny", other_version=False):
    need_transformers(other_version)
    T = transformers
    tiny = size == "tiny"
    if arch in NEW_ARCHS and release() != "5":
        raise ValueError("--arch %s needs transformers 5 (this is %s)" % (arch, transformers.__version__))
    if arch == "llama":
        return T.LlamaConfig(vocab_size=96 if tiny else 32000, hidden_size=64 if tiny else 2048,
                             intermediate_size=96 if tiny else 5632, num_hidden_layers=2 if tiny else 4,
                             num_attention_heads=4 if tiny else 16, num_key_value_heads=2 if tiny else 4,
                             rope_theta=10000.0 if tiny else 500000.0, tie_word_embeddings=False)
    if arch == "gemma2":
        cfg = T.Gemma2Config(vocab_size=96 if tiny else 32000, hidden_size=64 if tiny else 2048,
                              intermediate_size=96 if tiny else 8192, num_hidden_layers=2 if tiny else 4,
                              num_attention_heads=4 if tiny else 8, num_key_value_heads=2 if tiny else 4,
                              head_dim=16 if tiny else 256, sliding_window=5 if tiny else 512,
                              query_pre_attn_scalar=16 if tiny else 256, attn_logit_softcapping=50.0,
                              final_logit_softcapping=30.0, tie_word_embeddings=True)
        if tiny:  # logits of a tiny random model are O(1): a cap of 5 bends them (50 would not)
            cfg.attn_logit_softcapping = 5.0
        return cfg
    if arch == "qwen2_moe":
        return T.Qwen2MoeConfig(vocab_size=96 if tiny else 32000, hidden_size=64 if tiny else 2048,
                                intermediate_size=96 if tiny else 5632, moe_intermediate_size=32 if tiny else 1408,
                                shared_expert_intermediate_size=64 if tiny else 5632,
                                num_experts=4 if tiny else 16, num_experts_per_tok=2 if tiny else 4,
                                num_hidden_layers=2 if tiny else 4, num_attention_heads=4 if tiny else 16,
                                num_key_value_heads=2 if tiny else 16, norm_topk_prob=False,
                                decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)
    if arch == "mamba2":
        return T.Mamba2Config(vocab_size=96 if tiny else 32000, hidden_size=64 if tiny else 2048,
                              num_hidden_layers=2 if tiny else 4, num_heads=8 if tiny else 64,
                              head_dim=16 if tiny else 64, state_size=16 if tiny else 64, n_groups=1,
                              expand=2, chunk_size=4 if tiny else 128, conv_kernel=4, tie_word_embeddings=False)
    if arch == "qwen3_moe":  # Qwen3-30B-A3B's shape, scaled down: qk-norm, 128 experts top 8 (tiny: 8, top 2)
        return T.Qwen3MoeConfig(vocab_size=96 if tiny else 32000, hidden_size=64 if tiny else 2048,
                                intermediate_size=96 if tiny else 6144, moe_intermediate_size=32 if tiny else 768,
                                num_experts=8 if tiny else 32, num_experts_per_tok=2 if tiny else 8,
                                num_hidden_layers=2 if tiny else 4, num_attention_heads=4 if tiny else 32,
                                num_key_value_heads=2 if tiny else 4, head_dim=16 if tiny else 128,
                                norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                                rope_theta=1000000.0, tie_word_embeddings=False)
    if arch == "gemma3":  # Gemma 3 text: qk-norm, sliding layers (local theta 1e4) and a global one (1e6)
        return T.Gemma3TextConfig(vocab_size=96 if tiny else 32000, hidden_size=64 if tiny else 2048,
                                  intermediate_size=96 if tiny else 8192, num_hidden_layers=3 if tiny else 6,
                                  num_attention_heads=4 if tiny else 8, num_key_value_heads=2 if tiny else 4,
                                  head_dim=16 if tiny else 256, sliding_window=5 if tiny else 512,
                                  query_pre_attn_scalar=16 if tiny else 256, sliding_window_pattern=3 if tiny else 6,
                                  tie_word_embeddings=True)
    if arch == "deepseek_v3":  # MLA (q and kv LoRA, rope on 8 of 24 dims), noaux_tc router, shared experts
        return T.DeepseekV3Config(vocab_size=96 if tiny else 32000, hidden_size=64 if tiny else 2048,
                                  intermediate_size=96 if tiny else 5632, moe_intermediate_size=32 if tiny else 512,
                                  num_hidden_layers=2 if tiny else 4, first_k_dense_replace=1,
                                  num_attention_heads=4 if tiny else 16, num_key_value_heads=4 if tiny else 16,
                                  q_lora_rank=48 if tiny else 768, kv_lora_rank=32 if tiny else 256,
                                  qk_nope_head_dim=16 if tiny else 128, qk_rope_head_dim=8 if tiny else 64,
                                  v_head_dim=16 if tiny else 128, n_routed_experts=8 if tiny else 64,
                                  num_experts_per_tok=2 if tiny else 6, n_group=4 if tiny else 8,
                                  topk_group=2 if tiny else 4, n_shared_experts=1, routed_scaling_factor=2.5,
                                  norm_topk_prob=True, rope_interleave=True, tie_word_embeddings=False)
    raise ValueError("unknown architecture %r: one of %s" % (arch, ", ".join(ARCHS)))


ARCHS = ("llama", "gemma2", "qwen2_moe", "mamba2", "qwen3_moe", "gemma3", "deepseek_v3")
NEW_ARCHS = ("qwen3_moe", "gemma3", "deepseek_v3")   # transformers 5 only


def build(arch, size="tiny", seed=0, ngroups=None, rope_scaling=None, other_version=False):
    need_transformers(other_version)
    torch.manual_seed(seed)
    cfg = config_for(arch, size, other_version)
    if ngroups and arch == "mamba2":
        cfg.n_groups = ngroups
    if rope_scaling:
        if arch == "mamba2":
            raise ValueError("--rope-scaling: mamba2 has no rotary embedding")
        if release() == "5":  # 5.x reads config.rope_parameters
            if arch == "gemma3":
                raise ValueError("--rope-scaling: gemma3 has one rope per layer type (set its rope_parameters)")
            cfg.rope_parameters = dict(rope_scaling, rope_theta=cfg.rope_parameters["rope_theta"])
        else:
            cfg.rope_scaling = dict(rope_scaling)
    cls = {"llama": "LlamaForCausalLM", "gemma2": "Gemma2ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
           "mamba2": "Mamba2ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "gemma3": "Gemma3ForCausalLM",
           "deepseek_v3": "DeepseekV3ForCausalLM"}[arch]
    model = getattr(transformers, cls)(cfg).float()
    model.train()
    return model


# ---- instrumenting a model ----

def _is_norm(m):
    n = type(m).__name__
    return n.endswith("RMSNorm") and n != "MambaRMSNormGated"


def instrument(model, fmt="fp8_block128", plant="none", plant_layer=1, keep_linear=("lm_head", r"\.gate$"),
               ssd_groups=None, other_version=False, deployed=True):
    """Map every module of `model` that qatcheck has a class for; return the
    plan: {"modules": {name: class}, "not_mapped": [(name, why)], ...}.
    Linears named by keep_linear (regexes) run unquantized (weight_format
    none), as serving engines keep the head and the router. With deployed,
    each quantized linear's Function saves the bytes a serving engine holds
    (saved/weight_q, weight_scale, nvfp4's weight_global_scale), which vjp
    compares byte for byte with its own quantizer. ssd_groups: Mamba2's
    group map, None for the library's (4.49: tile; 5.x: interleave).
    Under transformers 5 every piece changed is first checked against
    5.23's module code (a release that differs is named, with what differs)."""
    rel = need_transformers(other_version)
    if plant not in PLANTS:
        raise ValueError("unknown plant %r: one of %s" % (plant, ", ".join(PLANTS)))
    cfg = model.config
    arch = cfg.model_type
    need = {"softcap_grad": ("gemma2",), "dskip_grad": ("mamba2",), "qk_norm_dx": ("qwen3_moe", "gemma3_text"),
            "route_scale_grad": ("deepseek_v3",)}.get(plant)
    if need and arch not in need:
        raise ValueError("plant %r applies to %s, not to %s" % (plant, " and ".join(need), arch))
    if rel == "5":
        import qatdump_hf5 as H5
        H5.H = sys.modules[__name__]
        H5.check_structure(model)
        return _instrument5(model, H5, fmt, plant, plant_layer, keep_linear, ssd_groups, deployed)
    try:
        return _instrument449(model, fmt, plant, plant_layer, keep_linear, ssd_groups or "tile", deployed)
    except AttributeError as e:
        if release() is not None:
            raise
        raise qatdump.QatDumpError("qatdump_hf follows transformers 4.49's module code (and 5.23's); this is %s, "
                                   "where %s: the instrumentation does not apply" % (transformers.__version__, e))


def _quantize_linears(model, fmt, keep_linear, deployed):
    """every linear: the quantized forward, the trainer's backward"""
    for name, m in list(model.named_modules()):
        if type(m) is torch.nn.Linear:
            _to_qc_linear(m, "none" if any(re.search(r, name) for r in keep_linear) else fmt, deployed)


def _norm_module(m):
    eps = getattr(m, "variance_epsilon", getattr(m, "eps", 1e-6))
    m.qatcheck_class = "rmsnorm"
    m.qatcheck_contract = {"eps": float(eps)}
    if type(m).__name__.startswith("Gemma"):
        m.qatcheck_contract["zero_centered"] = True


def _geglu_module(name, m, notes):
    a = m.act_fn
    if type(a).__name__ in ("PytorchGELUTanh", "GELUTanh") or getattr(a, "approximate", None) == "tanh":
        a.qatcheck_class = "gelu"
        a.qatcheck_contract = {"approximate": "tanh"}
    notes.append((name + " (act_fn(gate) * up)", "the GeGLU product: no class for it (act_fn is dumped "
                                               "as gelu, the linears as linear)"))


def _instrument5(model, H5, fmt, plant, plant_layer, keep_linear, ssd_groups, deployed):
    """transformers 5 (qatdump_hf5.py: 5.23's module code)."""
    cfg = model.config
    arch = cfg.model_type
    notes = []
    mod, attn_cls = H5.instrument5(model)  # the MoE blocks first
    _quantize_linears(model, fmt, keep_linear, deployed)
    for name, m in list(model.named_modules()):
        tn = type(m).__name__
        if _is_norm(m):
            _norm_module(m)
        elif tn.endswith("MLP") and hasattr(m, "act_fn") and hasattr(m, "gate_proj"):
            if tn.startswith("Gemma"):
                _geglu_module(name, m, notes)
            else:
                m.qc_swiglu = QcSwiGLU(m.act_fn)
                m.forward = _mlp_forward.__get__(m)
        elif attn_cls and tn == attn_cls:
            H5.attention_module(m, cfg, mod, H5.rope_table(model, m))
            _track_current(m)
        elif tn == "Mamba2Mixer":
            H5.mamba2_mixer(name, m, notes, ssd_groups)
    if attn_cls:
        ALL_ATTENTION_FUNCTIONS["qatcheck"] = H5._qc_attention_interface
        H5._qc_mask_interface()
        cfg._attn_implementation = "qatcheck"
        H5._patch_rope(mod)
    if arch == "gemma2" or (arch == "gemma3_text" and getattr(cfg, "final_logit_softcapping", None)):
        notes.append(("lm_head (final_logit_softcapping)", "the final logit softcap: inline, no class (the capped "
                                                           "logits are the logprob's input)"))
    model.qc_logprob = QcLogprob()
    for name, m in model.named_modules():  # the attention cores know their names (messages)
        if isinstance(m, QcAttention):
            m.qc_name = name
    return _plant(model, notes, plant, plant_layer, H5)


def _plant(model, notes, plant, plant_layer, H5=None):
    """planted bugs, each in one module of layer plant_layer"""
    arch = model.config.model_type
    layers = [n for n, _ in model.named_modules() if re.fullmatch(r"(model|backbone)\.layers\.\d+", n)]
    pl = layers[min(plant_layer, len(layers) - 1)] if layers else ""
    planted = None
    if plant == "o_proj_dx":
        planted = pl + ".self_attn.o_proj" if arch != "mamba2" else pl + ".mixer.out_proj"
    elif plant == "softcap_grad":
        planted = pl + ".self_attn.qc_attn"
    elif plant == "dskip_grad":
        planted = pl + ".mixer.qc_ssd"
    elif plant == "swiglu_gate_grad":
        planted = pl + ".mlp.qc_swiglu"
    elif plant == "qk_norm_dx":
        planted = pl + ".self_attn.q_norm"
        H5.plant_qk_norm(model.get_submodule(planted))
    elif plant == "route_scale_grad":
        planted = pl + ".mlp.router"
    if planted:
        model.get_submodule(planted).qc_plant = plant
    return _plan(model, notes, planted)


def _instrument449(model, fmt, plant, plant_layer, keep_linear, ssd_groups, deployed):
    """transformers 4.49."""
    from transformers.models.gemma2 import modeling_gemma2 as mg
    from transformers.models.llama import modeling_llama as ml
    from transformers.models.qwen2_moe import modeling_qwen2_moe as mq
    cfg = model.config
    arch = cfg.model_type
    if arch not in ("llama", "gemma2", "qwen2_moe", "mamba2"):
        raise qatdump.QatDumpError("qatdump_hf: %s needs transformers 5 (this is %s)" % (arch, transformers.__version__))
    notes = []
    table = _rope_table(model)  # a scaled RoPE: its frequencies go into the dump
    # the MoE blocks first (their linears are replaced by the stacked experts)
    for name, m in list(model.named_modules()):
        if type(m).__name__ == "Qwen2MoeSparseMoeBlock":
            parent = model.get_submodule(name.rsplit(".", 1)[0])
            new = QcMoEBlock(m)
            with torch.no_grad():
                xt = torch.randn(2, 3, m.gate.in_features, device=m.gate.weight.device, dtype=m.gate.weight.dtype)
                ref, _ = mq.Qwen2MoeSparseMoeBlock.forward(m, xt)
                got, _ = new(xt)
            ok, rel = reproduces(ref, got)
            if not ok:
                raise qatdump.QatDumpError("qatdump_hf: %s: the stacked experts do not reproduce the library's "
                                           "block (relative difference %.3g, expected <= 1e-5)" % (name, rel))
            setattr(parent, name.rsplit(".", 1)[1], new)
            new.router.ids = new.experts.ids = None
    _quantize_linears(model, fmt, keep_linear, deployed)
    for name, m in list(model.named_modules()):
        tn = type(m).__name__
        if _is_norm(m):
            _norm_module(m)
        elif tn in ("LlamaMLP", "Qwen2MoeMLP"):
            m.qc_swiglu = QcSwiGLU(m.act_fn)
            m.forward = _mlp_forward.__get__(m)
        elif tn == "Gemma2MLP":
            _geglu_module(name, m, notes)
        elif isinstance(m, (ml.LlamaAttention, mg.Gemma2Attention)):
            tn = "LlamaAttention" if isinstance(m, ml.LlamaAttention) else "Gemma2Attention"
            eager = ml.eager_attention_forward if tn == "LlamaAttention" else mg.eager_attention_forward
            contract = {"causal": True, "softmax_scale": float(m.scaling)}
            if tn == "Gemma2Attention":
                if m.sliding_window:
                    contract["window"] = int(m.sliding_window)
                if cfg.attn_logit_softcapping:
                    contract["softcap"] = float(cfg.attn_logit_softcapping)
            m.qc_attn = QcAttention(eager, contract)
            rot = ml.rotate_half if tn == "LlamaAttention" else mg.rotate_half
            m.qc_rope_q = QcRope(rot, cfg.rope_theta, table)
            m.qc_rope_k = QcRope(rot, cfg.rope_theta, table)
            _track_current(m)
        elif isinstance(m, mq.Qwen2MoeAttention):  # eager, sdpa and flash classes alike: run as eager
            m.qc_attn = QcAttention(_qwen2moe_eager, {"causal": True, "softmax_scale": 1.0 / math.sqrt(m.head_dim)})
            m.qc_rope_q = QcRope(mq.rotate_half, cfg.rope_theta, table)
            m.qc_rope_k = QcRope(mq.rotate_half, cfg.rope_theta, table)
            m.forward = _qwen2moe_attn_forward.__get__(m)
            _track_current(m)
            cfg._attn_implementation = "eager"    # the model builds the 4-D causal mask eager attention reads
            if getattr(cfg, "use_sliding_window", False):
                raise qatdump.QatDumpError("qatdump_hf: %s: Qwen2-MoE's use_sliding_window is not instrumented" % name)
        elif tn == "Mamba2Mixer":
            m.qc_conv = QcConv1d(m.conv1d)
            del m.conv1d
            m.qc_ssd = QcSSD(m)
            m.qc_ssd.group_map = ssd_groups
            m.norm = QcGatedNorm(m.norm)
            m.torch_forward = _mamba2_forward.__get__(m)
            m.forward = (lambda mm: lambda hidden_states, cache_params=None, cache_position=None, attention_mask=None:
                         mm.torch_forward(hidden_states, cache_params, cache_position, attention_mask))(m)
            notes.append((name + ".act", "the SiLU after the conv: no class for it"))
            notes.append((name + ".norm (y * silu(gate))", "the gated norm's gate product: no class (its rmsnorm "
                                                           "is dumped as .norm.rms)"))
            notes.append((name + " (softplus(dt + dt_bias), -exp(A_log))", "the dt and A parametrizations: no "
                                                                        "class (ssd takes dt and A after them)"))
    # the attention interface and rope
    if arch in ("llama", "gemma2"):
        ALL_ATTENTION_FUNCTIONS["qatcheck"] = _qc_attention_interface
        cfg._attn_implementation = "qatcheck"
    for mod in (ml, mg, mq):
        if not hasattr(mod.apply_rotary_pos_emb, "qc_orig"):
            mod.apply_rotary_pos_emb = _rope_patch(mod.apply_rotary_pos_emb)
    model.qc_logprob = QcLogprob()
    return _plant(model, notes, plant, plant_layer)


def _plan(model, notes, planted):
    tied = {}
    for mname, m in model.named_modules():
        for pn, p in m._parameters.items():
            if p is not None:
                tied.setdefault(id(p), []).append("%s.%s" % (mname, pn) if mname else pn)
    shared = {n.rsplit(".", 1)[0] for names in tied.values() if len(names) > 1 for n in names}
    mods, not_mapped = {}, list(notes)
    for name, m in model.named_modules():
        cls = getattr(m, "qatcheck_class", None) or (None if type(m) is not torch.nn.Linear else "linear")
        if cls:
            if name in shared:
                not_mapped.append((name, "a weight tied to another module (%s): its gradient sums over the users"
                                   % ", ".join(n for names in tied.values() if len(names) > 1 for n in names)))
            else:
                mods[name] = cls
        elif not list(m.children()) and name and not any(n.split(" ")[0] == name for n, _ in notes):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            if name.endswith(".act_fn") and hasattr(parent, "qc_swiglu"):
                continue  # inside the swiglu module
            why = "%s: no qatcheck class" % type(m).__name__
            if type(m).__name__.endswith("RotaryEmbedding"):
                why += " (it makes cos and sin from the positions, no gradient; the rotations are dumped as rope)"
            not_mapped.append((name, why))
    return {"modules": mods, "not_mapped": not_mapped, "planted": planted, "arch": model.config.model_type}


# ---- one training step, dumped ----

def batch(model, bsz=2, seq=12, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (bsz, seq), generator=g).to(device)
    mask = torch.ones(bsz, seq - 1, dtype=torch.int32, device=device)
    mask[:, :2] = 0                              # a prompt: not counted
    return ids, mask


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def dump_step(model, plan, ids, mask, path, lr=1e-3, warm=0, host_copies=False):
    """One training step: forward, loss (the logprob module), backward,
    dump, optimizer step. With warm > 0, that many undumped steps run
    first and the last is timed (forward, backward, optimizer step). With
    host_copies, the dumper keeps what it records in host memory, copied
    tensor by tensor as the step produces it (qatdump.attach's
    host_copies: no device-side snapshot of the parameters nor clone of
    the gradients; the same dump). Returns {"loss", "dumped_step_s"
    (forward and backward with the dump's hooks), "write_s", and with
    warm: "step_s", "quant_s" (of step_s, the host-side fake quantization
    by the conformance oracle)}."""
    names = sorted(plan["modules"])
    rx = "^(%s)$" % "|".join(re.escape(n) for n in names)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    b, s = ids.shape
    pos = torch.arange(s, device=ids.device)[None].expand(b, s)
    for m in model.modules():
        if hasattr(m, "qc_rope_q"):
            m.qc_positions = pos.reshape(-1).contiguous()
    lp = model.qc_logprob
    lp.ids, lp.mask = ids[:, 1:].contiguous(), mask
    kw = {} if plan["arch"] == "mamba2" else {"position_ids": pos}
    out = {}

    def step():
        logits = model(input_ids=ids, use_cache=False, **kw).logits
        loss = -lp(logits[:, :-1]).sum()
        loss.backward()
        return loss
    for _ in range(warm):
        opt.zero_grad(set_to_none=True)
        _QUANT_S[0] = 0.0
        _sync(ids.device)
        t0 = time.perf_counter()
        step()
        opt.step()
        _sync(ids.device)
        out["step_s"], out["quant_s"] = time.perf_counter() - t0, _QUANT_S[0]
    opt.zero_grad(set_to_none=True)
    d = qatdump.attach(model, path, modules=rx, host_copies=host_copies)
    t0 = time.perf_counter()
    loss = step()
    _sync(ids.device)
    t1 = time.perf_counter()
    d.write()
    d.detach()
    out["dumped_step_s"], out["write_s"], out["loss"] = t1 - t0, time.perf_counter() - t1, float(loss)
    opt.step()
    with h5py.File(path, "a") as f:
        f.attrs["not_mapped"] = json.dumps(["%s: %s" % nm for nm in plan["not_mapped"]])
        f.attrs["hf_model"] = "%s (transformers %s)" % (plan["arch"], transformers.__version__)
    return out


def write_case(plan, dump, path, name=None, qatcheck=None):
    """A case over every dumped module, each tolerance derived by qatcheck
    (each class's gradients from its class table: class_grads(qatcheck))."""
    classes = sorted(set(plan["modules"].values()))
    grads = class_grads(qatcheck)
    missing = [c for c in classes if c not in grads]
    if missing:
        raise qatdump.QatDumpError("class(es) %s not in qatcheck's class table (%s)" % (", ".join(missing), ", ".join(grads)))
    tol = {c: {g: {"derive": True, "reasoning": "derived from the class's error model"} for g in grads[c]}
           for c in classes}
    case = {"name": name or "hf_%s" % plan["arch"], "data": {"dump": os.path.basename(dump), "modules": ".*"},
            "candidate": "dump", "tolerances": tol}
    with open(path, "w") as f:
        json.dump(case, f, indent=1)


def run_one(arch, plant, out, a):
    """Build, instrument, step, dump, write the case; print the summary."""
    os.makedirs(out, exist_ok=True)
    model = build(arch, a.size, a.seed, a.ngroups, a.rope_scaling, a.other_version).to(a.device)
    plan = instrument(model, a.format, plant, a.plant_layer, ssd_groups=a.ssd_groups, deployed=not a.no_deployed,
                      other_version=a.other_version)
    if a.dtype != "float32":
        # a bf16 model as from_pretrained(torch_dtype=...) makes it: every
        # parameter in bf16, the rotary inv_freq buffers kept in float32
        # (.to() alone rounds them too, and every rope then turns by other
        # angles than the config's theta says: at 1024 positions the
        # rotation's y is 5% off). Every buffer named *inv_freq is kept as
        # built, in float32: 4.49's inv_freq, 5.x's original_inv_freq too
        # (a buffer there, which .to() rounds) and Gemma 3's per layer type
        keep = [(m, n, b.detach().clone()) for m in model.modules() for n, b in m.named_buffers(recurse=False)
                if n.endswith("inv_freq") and b.is_floating_point()]
        model.to(getattr(torch, a.dtype))
        for m, n, b in keep:
            setattr(m, n, b.to(dtype=torch.float32))
    seq = a.seq or (12 if a.size == "tiny" else 1024)
    ids, mask = batch(model, a.batch, seq, a.seed + 1, a.device)
    dump = os.path.join(out, "step.h5")
    tm = dump_step(model, plan, ids, mask, dump, warm=a.warm if a.warm >= 0 else int(a.size == "gpu") * 2)
    write_case(plan, dump, os.path.join(out, "case.json"), qatcheck=a.qatcheck)
    with open(os.path.join(out, "plan.json"), "w") as f:
        json.dump(dict({"modules": plan["modules"], "not_mapped": plan["not_mapped"], "planted": plan["planted"],
                        "transformers": transformers.__version__, "tokens": ids.numel(),
                        "device": str(ids.device)}, **tm), f, indent=1)
    t_step, loss = tm.get("step_s", tm["dumped_step_s"]), tm["loss"]
    counts = {}
    for c in plan["modules"].values():
        counts[c] = counts.get(c, 0) + 1
    print("qatdump_hf: %s: %d modules dumped (%s), step %.3f s, loss %.4f%s" % (
        arch, len(plan["modules"]), ", ".join("%s %d" % kv for kv in sorted(counts.items())), t_step, loss,
        ", planted %s in %s" % (plant, plan["planted"]) if plan["planted"] else ""))
    for n, why in plan["not_mapped"]:
        print("  not mapped: %s: %s" % (n, why))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", required=True, nargs="+",
                    help="%s (the last three: transformers 5), each optionally ARCH:PLANT (%s); with more than "
                         "one, each goes to OUT/ARCH or OUT/ARCH_PLANT" % (", ".join(ARCHS), ", ".join(PLANTS[1:])))
    ap.add_argument("--out", required=True, help="folder: step.h5, case.json, plan.json")
    ap.add_argument("--format", default="fp8_block128", choices=["fp8_block128", "nvfp4", "none"])
    ap.add_argument("--size", default="tiny", choices=["tiny", "gpu"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--plant", default="none", choices=PLANTS)
    ap.add_argument("--plant-layer", type=int, default=1)
    ap.add_argument("--seq", type=int, default=0, help="sequence length (default 12 tiny, 1024 gpu)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ngroups", type=int, default=0, help="Mamba2's n_groups (default 1)")
    ap.add_argument("--no-deployed", action="store_true", help="do not save the quantized linears' deployed bytes")
    ap.add_argument("--warm", type=int, default=-1, help="undumped steps before the dumped one, the last timed "
                    "(default 2 at --size gpu, else 0)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the model's parameter dtype: float32 masters (the default) or a pure bf16 model, "
                         "every module computing in bf16 as the library does")
    ap.add_argument("--ssd-groups", default=None, choices=["tile", "interleave"],
                    help="how Mamba2's heads read the B, C groups: tile (transformers 4.49's torch path, its "
                         "default) or interleave (mamba_ssm's kernels; transformers 5's torch path, its only one)")
    ap.add_argument("--other-version", action="store_true",
                    help="try a transformers release the instrumentation does not follow (it names what differs)")
    ap.add_argument("--rope-scaling", type=json.loads, default=None, metavar="JSON",
                    help="the config's rope_scaling, e.g. '{\"rope_type\": \"llama3\", \"factor\": 8, ...}' (Llama 3.1); "
                         "the dumped rope modules then carry the table's inv_freq and attention_scaling")
    ap.add_argument("--qatcheck", metavar="PATH", default=None,
                    help="the qatcheck binary, or a file holding `qatcheck classes --json`, whose class table gives "
                         "the case's gradients (default: $QATCHECK_CLASSES, $QATCHECK, the qatcheck of this "
                         "script's repository, qatcheck on PATH)")
    a = ap.parse_args(argv)
    if transformers is None:
        print("skip: qatdump_hf needs transformers for %s (not installed; scripts/install-deps.sh)" % sys.executable)
        return 77
    if release() is None and not a.other_version:
        try:
            need_transformers()
        except qatdump.QatDumpError as e:
            print("qatdump_hf: %s" % e, file=sys.stderr)
            return 2
    try:  # before any model is built: a missing qatcheck is said at once
        class_grads(a.qatcheck)
    except qatdump.QatDumpError as e:
        print("qatdump_hf: %s" % e, file=sys.stderr)
        return 2
    runs = []
    for item in a.arch:
        arch, _, plant = item.partition(":")
        plant = plant or a.plant
        if arch not in ARCHS or plant not in PLANTS:
            ap.error("--arch %r: expected ARCH[:PLANT], ARCH one of %s, PLANT one of %s"
                     % (item, ", ".join(ARCHS), ", ".join(PLANTS)))
        out = a.out if len(a.arch) == 1 else os.path.join(a.out, arch if plant == "none" else arch + "_" + plant)
        runs.append((arch, plant, out))
    for arch, plant, out in runs:
        try:
            run_one(arch, plant, out, a)
        except (ValueError, qatdump.QatDumpError) as e:
            print("qatdump_hf: %s: %s" % (arch, e), file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
