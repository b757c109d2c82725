"""qatdump_hf5: the transformers 5 instrumentation of scripts/qatdump_hf.py
(docs/models.md). qatdump_hf imports it when the installed release is a 5.x;
what is shared with the 4.49 path (the quantized linear, the attention core,
the rope module, the loss) stays in qatdump_hf.

It follows transformers 5.23's module code (transformers/models/*/modeling_*.py):
  - every attention calls its library's eager_attention_forward through
    ALL_ATTENTION_FUNCTIONS (Qwen2-MoE too, inline in 4.49), with the 4-D
    mask built by ALL_MASK_ATTENTION_FUNCTIONS (the "qatcheck" entry is the
    eager one); apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim) has no
    position_ids; rope_theta lives in config.rope_parameters (per layer
    type for Gemma 3);
  - MoE experts are fused 3-D parameters (gate_up_proj [E, 2F, H]: gate rows
    then up rows, down_proj [E, H, F]: the moe class's w1 and w2 as they
    are), the router a module holding its weight (TopKRouter);
  - Mamba2's torch path calls mamba2_chunk_scan (B and C repeat_interleave'd
    over the heads: head h reads group h / (H/G), as the ssd class) and its
    gated norm is per group (group_size = intermediate / n_groups).
"""
import torch
import torch.nn.functional as F

import qatdump

H = None   # qatdump_hf, the module that imported this one (bound by it: it may run as __main__)

FOLLOWS = "5.23"   # the 5.x release whose module code this follows

# the library's attention classes this instruments, by model_type: (module
# file, attention class, the MoE block class or None)
ARCHS = {
    "llama": ("llama", "LlamaAttention", None),
    "gemma2": ("gemma2", "Gemma2Attention", None),
    "qwen2_moe": ("qwen2_moe", "Qwen2MoeAttention", "Qwen2MoeSparseMoeBlock"),
    "mamba2": ("mamba2", None, None),
    "qwen3_moe": ("qwen3_moe", "Qwen3MoeAttention", "Qwen3MoeSparseMoeBlock"),
    "gemma3_text": ("gemma3", "Gemma3Attention", None),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3Attention", "DeepseekV3MoE"),
}

# what each instrumented library piece must have (5.23): checked before any
# change, so that another release says what differs instead of failing inside
NEEDS = {
    "Attention": ("scaling", "num_key_value_groups", "o_proj"),
    "Qwen2MoeSparseMoeBlock": ("gate", "experts", "shared_expert", "shared_expert_gate"),
    "Qwen3MoeSparseMoeBlock": ("gate", "experts"),
    "DeepseekV3MoE": ("gate", "experts", "shared_experts"),
    "TopKRouter": ("weight", "top_k", "norm_topk_prob"),
    "TopkRouter": ("weight", "top_k", "norm_topk_prob", "e_score_correction_bias", "routed_scaling_factor",
                   "num_group", "topk_group"),
    "Experts": ("gate_up_proj", "down_proj", "act_fn"),
    "Mamba2Mixer": ("in_proj", "conv1d", "norm", "out_proj", "A_log", "D", "dt_bias", "time_step_limit",
                    "intermediate_size", "conv_dim", "num_heads", "head_dim", "n_groups", "ssm_state_size",
                    "chunk_size", "act"),
}


def _mod(name):
    import importlib
    return importlib.import_module("transformers.models.%s.modeling_%s" % (name, name))


def _differs(what):
    return qatdump.QatDumpError("qatdump_hf follows transformers %s's module code (and 4.49's); this is %s, "
                                "where %s: the instrumentation does not apply" % (FOLLOWS, H.transformers.__version__,
                                                                                  what))


def check_structure(model):
    """Every piece instrument5 changes has what 5.23's has; else a
    QatDumpError naming the release followed and what differs."""
    arch = model.config.model_type
    if arch not in ARCHS:
        raise qatdump.QatDumpError("qatdump_hf: model_type %r is not instrumented (%s)" % (arch, ", ".join(ARCHS)))
    fname, attn, moe = ARCHS[arch]
    try:
        mod = _mod(fname)
    except ImportError as e:
        raise _differs("transformers.models.%s cannot be imported (%s)" % (fname, e))
    for fn in ("apply_rotary_pos_emb", "eager_attention_forward", "rotate_half") if attn else ("mamba2_chunk_scan",):
        if not hasattr(mod, fn):
            raise _differs("modeling_%s has no %s" % (fname, fn))
    if attn:
        import inspect
        params = list(inspect.signature(getattr(mod, "apply_rotary_pos_emb")).parameters)
        if params[:4] != ["q", "k", "cos", "sin"] or "position_ids" in params:
            raise _differs("modeling_%s.apply_rotary_pos_emb takes (%s), 5.23's (q, k, cos, sin, unsqueeze_dim)"
                           % (fname, ", ".join(params)))
    for name, m in model.named_modules():
        tn = type(m).__name__
        key = ("Attention" if tn == attn else tn if tn in NEEDS else
               "TopkRouter" if tn.endswith("TopkRouter") else "TopKRouter" if tn.endswith("TopKRouter") else
               "Experts" if tn.endswith("Experts") and moe else None)
        if key is None:
            continue
        missing = [a for a in NEEDS[key] if not hasattr(m, a)]
        if missing:
            raise _differs("%s (%s) has no %s" % (name, tn, ", ".join(missing)))
        if key == "Experts" and tuple(m.gate_up_proj.shape[1:]) != (2 * m.down_proj.shape[2], m.down_proj.shape[1]):
            raise _differs("%s.gate_up_proj is %s, not [E, 2F, H] with down_proj %s [E, H, F]"
                           % (name, tuple(m.gate_up_proj.shape), tuple(m.down_proj.shape)))
    if not hasattr(model.config, "rope_parameters") and arch != "mamba2":
        raise _differs("the config has no rope_parameters")


def rope_theta(cfg, layer_type=None):
    """rope_theta: 5.x's config.rope_parameters (per layer type for Gemma 3),
    4.49's config.rope_theta."""
    rp = getattr(cfg, "rope_parameters", None)
    if rp is None:
        return float(cfg.rope_theta)
    if layer_type is not None and isinstance(rp.get(layer_type), dict):
        rp = rp[layer_type]
    return float(rp["rope_theta"])


class _TypedTable:
    """Gemma 3's rotary embedding for one layer type (its {type}_inv_freq
    and {type}_attention_scaling), read as a scaled table is."""

    def __init__(self, rotary, layer_type):
        self.rotary, self.layer_type = rotary, layer_type

    @property
    def inv_freq(self):
        return getattr(self.rotary, self.layer_type + "_inv_freq")

    @property
    def attention_scaling(self):
        return getattr(self.rotary, self.layer_type + "_attention_scaling")


def rope_table(model, attn_module):
    """The rotary table attn_module's rope reads when scaled (a rope_type
    other than default, or an attention_scaling other than 1), else None."""
    lt = getattr(attn_module, "layer_type", None)
    for m in model.modules():
        if lt is not None and hasattr(m, lt + "_inv_freq"):
            t = _TypedTable(m, lt)
            if m.rope_type.get(lt, "default") != "default" or float(t.attention_scaling) != 1.0:
                return t
            return None
    return H._rope_table(model)


# ---- MoE: the fused experts and the routers ----

class QcRouterDS(torch.nn.Module):
    """DeepseekV3TopkRouter after its logits (noaux_tc): sigmoid scores, the
    selection by scores + e_score_correction_bias within the topk_group best
    of n_group groups (by each group's top-2 sum), the weights gathered from
    the scores (no bias), normalized (+ 1e-20) and times
    routed_scaling_factor: the library's lines."""
    qatcheck_class = "router"
    qatcheck_inputs = ["logits"]
    qatcheck_saved = ["topk_ids"]

    def __init__(self, r):
        super().__init__()
        self.bias = torch.nn.Parameter(r.e_score_correction_bias.detach().clone().float(), requires_grad=False)
        self.k, self.E, self.n_group, self.topk_group = r.top_k, r.num_experts, r.num_group, r.topk_group
        self.norm, self.scale = bool(r.norm_topk_prob), float(r.routed_scaling_factor)
        self.qatcheck_contract = {"score": "sigmoid", "normalize": "yes" if self.norm else "no", "norm_eps": 1e-20,
                                  "route_scale": self.scale, "n_group": int(self.n_group),
                                  "topk_group": int(self.topk_group)}
        self.qc_plant, self.ids = "none", None

    def forward(self, logits):
        scores = logits.sigmoid()
        with torch.no_grad():
            sc = scores + self.bias
            gs = sc.view(-1, self.n_group, self.E // self.n_group).topk(2, dim=-1)[0].sum(dim=-1)
            gi = torch.topk(gs, k=self.topk_group, dim=-1, sorted=False)[1]
            gm = torch.zeros_like(gs).scatter_(1, gi, 1)
            sm = gm.unsqueeze(-1).expand(-1, self.n_group, self.E // self.n_group).reshape(-1, self.E)
            ids = torch.topk(sc.masked_fill(~sm.bool(), float("-inf")), k=self.k, dim=-1, sorted=False)[1]
        w = scores.gather(1, ids)
        if self.norm:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        if self.qc_plant == "route_scale_grad":  # the planted bug: the scale in the forward, not in d_logits
            w = w + (w * self.scale - w).detach()
        else:
            w = w * self.scale
        self.ids = ids
        return H._Saved.apply(w, ids)


class QcMoE5(torch.nn.Module):
    """The routed experts (5.x's fused Experts.forward, its lines) and the
    shared experts: Qwen2-MoE's gated one (sigmoid(shared_expert_gate x)),
    DeepSeek-V3's ungated n_shared_experts, Qwen3-MoE none. w1, w2 are the
    library's gate_up_proj and down_proj parameters themselves."""
    qatcheck_class = "moe"
    qatcheck_inputs = ["x", "topk_weights"]
    qatcheck_saved = ["topk_ids"]

    def __init__(self, block, shared=None, shared_gate=None, n_shared=1):
        super().__init__()
        ex = block.experts
        self.w1, self.w2 = ex.gate_up_proj, ex.down_proj
        object.__setattr__(self, "_act", ex.act_fn)
        self.E = self.w1.shape[0]
        self.qatcheck_contract = {"activation": "swiglu", "shared_experts": 0, "shared_gate": False}
        self.Fs = 0
        if shared is not None:
            self.shared_w1 = torch.nn.Parameter(torch.cat([shared.gate_proj.weight, shared.up_proj.weight]).detach()
                                                .clone())
            self.shared_w2 = torch.nn.Parameter(shared.down_proj.weight.detach().clone())
            self.Fs = shared.gate_proj.weight.shape[0]
            self.qatcheck_contract["shared_experts"] = int(n_shared)
        if shared_gate is not None:
            self.shared_gate = torch.nn.Parameter(shared_gate.weight.detach().clone())
            self.qatcheck_contract["shared_gate"] = True
        self.ids = None

    def forward(self, x, topk_weights):
        ids = self.ids
        out = torch.zeros_like(x)
        mask = F.one_hot(ids, num_classes=self.E).permute(2, 1, 0)
        w1s, w2s = self.w1.unbind(0), self.w2.unbind(0)
        for e in range(self.E):
            pos, tok = torch.where(mask[e])
            if tok.numel() == 0:
                continue
            gate, up = F.linear(x[tok], w1s[e]).chunk(2, dim=-1)
            h = F.linear(self._act(gate) * up, w2s[e]) * topk_weights[tok, pos, None]
            out = out.index_add(0, tok, h.to(out.dtype))
        if self.Fs:
            f = self.Fs
            sh = F.linear(self._act(F.linear(x, self.shared_w1[:f])) * F.linear(x, self.shared_w1[f:]), self.shared_w2)
            if "shared_gate" in self._parameters:
                sh = torch.sigmoid(F.linear(x, self.shared_gate)) * sh
            out = out + sh
        return H._Saved.apply(out, ids)


def _gate_linear(router, fp32=False):
    """The router's weight as a linear module (the class's d_x, d_weight):
    the library's F.linear(hidden, weight); DeepSeek's in float32."""
    lin = torch.nn.Linear(router.weight.shape[1], router.weight.shape[0], bias=False,
                          device=router.weight.device, dtype=router.weight.dtype)
    lin.weight = router.weight
    if fp32:
        lin.__class__ = QcFp32Linear
    return lin


class QcFp32Linear(torch.nn.Linear):
    """DeepSeek-V3's router logits: F.linear(x.float(), W.float()), unquantized."""
    qatcheck_class = "linear"
    qatcheck_contract = {"weight_format": "none", "dx_weight": "master"}

    def forward(self, x):
        return F.linear(x.float(), self.weight.float())


class QcMoEBlock5(torch.nn.Module):
    """Replaces a 5.x sparse MoE block: gate (linear) -> router -> moe; the
    library's block forward, its sums in its order."""

    def __init__(self, block, kind, n_shared=1):
        super().__init__()
        r = block.gate
        self.kind = kind
        if kind == "deepseek_v3":
            self.gate = _gate_linear(r, fp32=True)
            self.router = QcRouterDS(r)
            self.experts = QcMoE5(block, shared=block.shared_experts, n_shared=n_shared)
        else:
            self.gate = _gate_linear(r)
            self.router = H.QcRouter(r.top_k, r.norm_topk_prob)
            if kind == "qwen2_moe":
                self.experts = QcMoE5(block, shared=block.shared_expert, shared_gate=block.shared_expert_gate)
            else:
                self.experts = QcMoE5(block)

    def forward(self, hidden_states):
        b, s, h = hidden_states.shape
        x = hidden_states.reshape(-1, h)
        rw = self.router(self.gate(x))
        if self.kind != "deepseek_v3":
            rw = rw.to(x.dtype)  # router_top_value.to(router_logits.dtype)
        self.experts.ids = self.router.ids
        return self.experts(x, rw).reshape(b, s, h)


def _replace_moe(model, arch, block_cls):
    for name, m in list(model.named_modules()):
        if type(m).__name__ != block_cls:
            continue
        new = QcMoEBlock5(m, arch, int(getattr(model.config, "n_shared_experts", 1) or 1))
        with torch.no_grad():
            xt = torch.randn(2, 3, m.gate.weight.shape[1], device=m.gate.weight.device, dtype=m.gate.weight.dtype)
            ref = type(m).forward(m, xt)
            ref = ref[0] if isinstance(ref, tuple) else ref
            got = new(xt)
        ok, rel = H.reproduces(ref, got)
        if not ok:
            raise qatdump.QatDumpError("qatdump_hf: %s: the instrumented block does not reproduce the library's "
                                       "(relative difference %.3g, expected <= 1e-5)" % (name, rel))
        new.router.ids = new.experts.ids = None
        parent = model.get_submodule(name.rsplit(".", 1)[0])
        setattr(parent, name.rsplit(".", 1)[1], new)


# ---- attention, rope, the mask ----

def _qc_mask_interface():
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    AttentionMaskInterface.register("qatcheck", eager_mask)  # the global mapping: the mask builder reads it


def _check_mask(core, mask, s):
    """The 4-D additive mask the library built is the contract's: causal, or
    the window i - W < j <= i; else refuse (padding, packing, bidirectional)."""
    if mask is None:
        raise qatdump.QatDumpError("qatdump_hf: %s: the library passed no mask (the contract is causal)" % core.qc_name)
    vis = (mask[:, 0, :, :s] == 0)
    i = torch.arange(s, device=mask.device)
    want = i[None, :] <= i[:, None]
    w = core.qatcheck_contract.get("window", 0)
    if w:
        want = want & (i[:, None] - i[None, :] < w)
    if not bool((vis == want[None]).all()):
        raise qatdump.QatDumpError("qatdump_hf: %s: the library's mask is not the contract's (causal%s): padding, "
                                   "packed sequences or another window are not instrumented"
                                   % (core.qc_name, ", window %d" % w if w else ""))


def _qc_attention_interface(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None,
                            **kwargs):
    core = module.qc_attn
    _check_mask(core, attention_mask, key.shape[-2])
    core.call = (module, attention_mask, scaling if scaling is not None else module.head_dim ** -0.5, softcap)
    out = core(query, key, value)
    return out.transpose(1, 2).contiguous(), None


def _rope_patch(orig, interleave=False):
    """apply_rotary_pos_emb (5.x: q, k, cos, sin, unsqueeze_dim) with each of
    q, k through the attention's rope module. DeepSeek's interleaved variant
    first gathers the pairs (2j, 2j + 1) into halves, a permutation (its
    output is in halves: cat(x1 cos - x2 sin, x2 cos + x1 sin)), then
    rotates in the half layout: the same products and sums."""
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kw):
        att = H._CURRENT[-1] if H._CURRENT else None
        if att is None or not hasattr(att, "qc_rope_q") or args or kw.get("unsqueeze_dim", 1) != 1:
            return orig(q, k, cos, sin, *args, **kw)
        out = []
        for t, rope in ((q, att.qc_rope_q), (k, att.qc_rope_k)):
            if interleave:
                t = torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1)
            b, h, s, d = t.shape
            rope.cos = cos.reshape(b * s, 1, d)
            rope.sin = sin.reshape(b * s, 1, d)
            extra = () if rope.table is None else (rope.table.inv_freq.detach().float(),)
            y = rope(t.transpose(1, 2).reshape(b * s, h, d), att.qc_positions, *extra)
            out.append(y.reshape(b, s, h, d).transpose(1, 2))
        return tuple(out)
    apply_rotary_pos_emb.qc_orig = orig
    return apply_rotary_pos_emb


def _patch_rope(mod):
    if not hasattr(mod.apply_rotary_pos_emb, "qc_orig"):
        mod.apply_rotary_pos_emb = _rope_patch(mod.apply_rotary_pos_emb)
    f = getattr(mod, "apply_rotary_pos_emb_interleave", None)
    if f is not None and not hasattr(f, "qc_orig"):
        mod.apply_rotary_pos_emb_interleave = _rope_patch(f, interleave=True)


# ---- Mamba2 ----

class QcSSD5(torch.nn.Module):
    """5.x's mamba2_chunk_scan itself on x [B, L, H, P], dt after softplus and
    clamp, A = -exp(A_log) [H], Bm, Cm [B, L, G, N], D [H]: the library's lines
    (B and C repeat_interleave'd: head h reads group h / (H/G))."""
    qatcheck_class = "ssd"
    qatcheck_inputs = ["x", "dt", "A", "Bm", "Cm", "D"]

    def __init__(self, mixer):
        super().__init__()
        self.chunk_size = int(mixer.chunk_size)
        self.qatcheck_contract = {"chunk_size": self.chunk_size, "d_skip": True}
        self.qc_plant = "none"

    def forward(self, x, dt, A, Bm, Cm, D):
        scan = _mod("mamba2").mamba2_chunk_scan
        if self.qc_plant == "dskip_grad":  # planted: D x's d_x lost
            y = scan(x, dt, A, Bm, Cm, chunk_size=self.chunk_size, D=None)
            return y + D[..., None] * x.float().detach()
        return scan(x, dt, A, Bm, Cm, chunk_size=self.chunk_size, D=D)


class QcGatedNormGroups(torch.nn.Module):
    """5.x's MambaRMSNormGated with n_groups > 1: y * silu(gate), then an
    rmsnorm per group of group_size features with one weight over all: no
    class (rmsnorm normalizes the whole row). Not mapped."""

    def __init__(self, gated):
        super().__init__()
        self.inner = gated

    def forward(self, hidden_states, gate=None):
        return self.inner(hidden_states, gate)


def _mamba2_forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
    """Mamba2Mixer.forward (5.23), the training path of its torch branch (no
    cache, no padding), with the conv, the SSD and the gated norm as modules."""
    if cache_params is not None or attention_mask is not None and not bool(attention_mask.all()):
        raise qatdump.QatDumpError("qatdump_hf: Mamba2 is instrumented for training steps without cache or padding")
    batch_size, seq_len, _ = hidden_states.shape
    dtype = hidden_states.dtype
    projected_states = self.in_proj(hidden_states)
    A = -torch.exp(self.A_log.float())
    gate, xbc, dt = projected_states.split([self.intermediate_size, self.conv_dim, self.num_heads], dim=-1)
    xbc = self.act(self.qc_conv(xbc))
    x, B, C = torch.split(xbc, [self.intermediate_size, self.n_groups * self.ssm_state_size,
                                self.n_groups * self.ssm_state_size], dim=-1)
    dt = torch.clamp(F.softplus(dt + self.dt_bias.to(dt.dtype)), min=self.time_step_limit[0],
                     max=self.time_step_limit[1])
    y = self.qc_ssd(x.view(batch_size, seq_len, self.num_heads, self.head_dim), dt, A,
                    B.view(batch_size, seq_len, self.n_groups, self.ssm_state_size),
                    C.view(batch_size, seq_len, self.n_groups, self.ssm_state_size), self.D)
    scan_output = self.norm(y.reshape(batch_size, seq_len, -1), gate)
    return self.out_proj(scan_output.to(dtype))


# ---- the whole model ----

def instrument5(model):
    """The first of instrument()'s 5.x steps: the MoE blocks replaced (their
    router weight becomes a linear). Returns the model's modeling module and
    its attention class name."""
    cfg = model.config
    arch = cfg.model_type
    fname, attn_cls, moe_cls = ARCHS[arch]
    mod = _mod(fname)
    if arch in ("qwen2_moe", "qwen3_moe") and getattr(cfg, "use_sliding_window", False):
        raise qatdump.QatDumpError("qatdump_hf: %s's use_sliding_window is not instrumented" % arch)
    if moe_cls:
        _replace_moe(model, arch, moe_cls)
    return mod, attn_cls


def attention_module(m, cfg, mod, table):
    """Instrument one 5.x attention module: its core and its two ropes."""
    contract = {"causal": True, "softmax_scale": float(m.scaling)}
    if getattr(m, "sliding_window", None):
        contract["window"] = int(m.sliding_window)
    softcap = getattr(m, "attn_logit_softcapping", None)
    if softcap and type(m).__name__ == "Gemma2Attention":  # Gemma 3 passes no softcap to the interface
        contract["softcap"] = float(softcap)
    m.qc_attn = H.QcAttention(mod.eager_attention_forward, contract)
    theta = rope_theta(cfg, getattr(m, "layer_type", None))
    m.qc_rope_q = H.QcRope(mod.rotate_half, theta, table)
    m.qc_rope_k = H.QcRope(mod.rotate_half, theta, table)


def _gated_norm_group(norm, width):
    """The features MambaRMSNormGated normalizes together: its group_size
    (5.23); a release without one (5.17) is checked to normalize the whole
    row, as 4.49 does, on a random input, and refused naming what differs."""
    if hasattr(norm, "group_size"):
        return norm.group_size
    w = norm.weight
    x = torch.randn(2, width, dtype=w.dtype, device=w.device)
    g = torch.randn(2, width, dtype=w.dtype, device=w.device)
    with torch.no_grad():
        got = norm(x, g).float()
        h = x.float() * F.silu(g.float())
        want = w.float() * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)).to(w.dtype).float()
    if not torch.allclose(got, want, rtol=1e-2, atol=1e-3):
        raise qatdump.QatDumpError("qatdump_hf: transformers %s: MambaRMSNormGated has no group_size and does not "
                                   "normalize the whole row (y * silu(gate), then one rmsnorm): not modelled"
                                   % H.transformers.__version__)
    return width


def mamba2_mixer(name, m, notes, ssd_groups):
    if ssd_groups not in (None, "interleave"):
        raise ValueError("--ssd-groups %s: transformers 5's torch path interleaves the groups (head h reads group "
                         "h / (H/G)); tile is 4.49's" % ssd_groups)
    m.qc_conv = H.QcConv1d(m.conv1d)
    del m.conv1d
    m.qc_ssd = QcSSD5(m)
    if _gated_norm_group(m.norm, m.intermediate_size) == m.intermediate_size:
        m.norm = H.QcGatedNorm(m.norm)
        notes.append((name + ".norm (y * silu(gate))", "the gated norm's gate product: no class (its rmsnorm is "
                                                       "dumped as .norm.rms)"))
    else:
        m.norm = QcGatedNormGroups(m.norm)
        notes.append((name + ".norm", "MambaRMSNormGated with n_groups %d: y * silu(gate), then an rmsnorm per group "
                                      "of %d features: no class (rmsnorm normalizes the whole row)"
                      % (m.n_groups, m.norm.inner.group_size)))
    m.forward = _mamba2_forward.__get__(m)
    notes.append((name + ".act", "the SiLU after the conv: no class for it"))
    notes.append((name + " (softplus(dt + dt_bias), -exp(A_log))", "the dt and A parametrizations: no class (ssd "
                                                                   "takes dt and A after them)"))


def plant_qk_norm(m):
    """The planted bug of qk_norm_dx: the norm's d_x scaled by 1.003."""
    orig = m.forward

    def forward(x):
        return orig(H.ScaleGrad.apply(x, 1.003))
    m.forward = forward
