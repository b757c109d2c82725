"""qatdump_torch2.py: the model of tests/e2e/qatdump_torch2.sh. A small
DeepSeek-V3-style decoder block on the CPU, dumped by scripts/qatdump.py
under torch 2.x and torch 1.13 alike:

  attention (MLA-like): a stochastically rounded activation fake-quant
    (straight-through) feeding q_proj, a custom autograd Function linear
    (bf16 operands, float32 accumulation, bf16 out); kv_a_proj, the latent
    RMSNorm kv_norm, kv_b_proj; q_rope and k_rope, a fused-kernel-style
    rotary Function (interleaved pairs, a YaRN-scaled frequency table and
    mscale) whose backward returns no gradient for the table (None); causal
    attention; o_proj
  MoE: the gate linear, a sigmoid router with noaux_tc group-limited
    selection through e_score_correction_bias (a frozen parameter), the
    routed experts fused in one module (w1 [E, 2F, H], w2 [E, H, F]) with a
    DeepSeek shared expert; the router and the experts keep topk_ids in
    their last autograd Function's saved tensors

usage: qatdump_torch2.py OUT.h5:MODE[:VARIANT]...
  MODE     eager | recompute | recompute_nr (use_reentrant=False) | autocast
           | grad_accum (2 micro-batches) | tied (the output head applied
           twice, DeepSeek's multi-token prediction head)
  VARIANT  ok | shared_dx (a planted defect: the shared expert's input is
           detached, so the experts' d_x lacks the shared path) | rope_sign
           (the rotary backward turns dY by +angle instead of -angle)
"""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import torch  # noqa: E402

import qatdump  # noqa: E402

B, S, H = 2, 8, 32                      # sequences, tokens each, hidden
NH, NOPE, ROPE, DV, LORA = 2, 8, 8, 8, 16  # heads, q/k dims without and with rope, v dim, kv latent rank
E, TOPK, NG, TG, F, FS = 8, 2, 4, 2, 16, 16  # experts, k, groups, groups kept, expert / shared intermediate
VARIANT = "ok"
SELECT = r"(^|\.)(q_proj|kv_a_proj|kv_norm|kv_b_proj|o_proj|q_rope|k_rope|gate|router|experts|head)$"
# under autocast: the modules autocast runs (the norm, the gate and the experts turn it off: float32)
AUTOCAST = r"(^|\.)(q_proj|kv_a_proj|kv_b_proj|o_proj|q_rope|k_rope|head)$"


def mm(a, b):
    """bf16 x bf16 product accumulated in float32, stored bf16 (a GPU GEMM)."""
    return (a.to(torch.bfloat16).float() @ b.to(torch.bfloat16).float()).to(torch.bfloat16)


class SRQuant(torch.nn.Module):
    """Stochastic rounding of the activations to a 1/16 grid, the draw a
    hash of each value (the same in a recompute, a micro-batch or the whole
    batch); straight-through. Not audited: it feeds q_proj."""

    def forward(self, x):
        v = x.detach().float()
        u = torch.frac(torch.sin(v * 12.9898 + 78.233).abs() * 43758.5453)
        q = torch.floor(v * 16 + u) / 16
        return x + (q.to(x.dtype) - x).detach()


class LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return mm(x.reshape(-1, x.shape[-1]), w.t()).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        return mm(dy2, w).reshape(x.shape), mm(dy2.t(), x2)


class FnLinear(torch.nn.Module):
    """The quantized-training linear: a custom Function, bf16 weight."""
    qatcheck_class = "linear"
    qatcheck_contract = {"weight_format": "none", "activation_format": "none", "dx_weight": "master"}

    def __init__(self, k, n):
        super().__init__()
        self.weight = torch.nn.Parameter((torch.randn(n, k) / k ** 0.5).to(torch.bfloat16))

    def forward(self, x):
        return LinearFn.apply(x.to(torch.bfloat16), self.weight)


class RopeFn(torch.autograd.Function):
    """Interleaved rotary embedding as a fused kernel wires it: the
    backward rotates dY back and returns no gradient for the positions and
    the frequency table (None)."""

    @staticmethod
    def forward(ctx, x, positions, inv_freq, scale):
        ang = positions.float()[:, None] * inv_freq.float()[None, :]
        cos, sin = (ang.cos() * scale)[:, None, :], (ang.sin() * scale)[:, None, :]
        ctx.save_for_backward(cos, sin)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        d1, d2 = dy[..., 0::2], dy[..., 1::2]
        if VARIANT == "rope_sign":  # the defect: dY turned by +angle, as the forward, not back by -angle
            sin = -sin
        return torch.stack((d1 * cos + d2 * sin, -d1 * sin + d2 * cos), -1).flatten(-2), None, None, None


class Rope(torch.nn.Module):
    qatcheck_class = "rope"
    qatcheck_inputs = ["x", "positions", "inv_freq"]
    MSCALE = 1.0 + 0.1 * math.log(4.0)  # YaRN's attention scaling at factor 4
    qatcheck_contract = {"layout": "interleaved", "scale": MSCALE}

    def forward(self, x, positions, inv_freq):
        return RopeFn.apply(x, positions, inv_freq, self.MSCALE)


def yarn_inv_freq(dim=ROPE, base=10000.0, factor=4.0, low=1.0, high=32.0, orig=16):
    """A YaRN frequency table: the high frequencies kept, the low ones
    divided by factor, a linear ramp between (float32)."""
    pos = torch.arange(0, dim, 2, dtype=torch.float32) / dim
    extra, inter = 1.0 / base ** pos, 1.0 / (factor * base ** pos)
    lo = math.floor(dim * math.log(orig / (high * 2 * math.pi)) / (2 * math.log(base)))
    hi = math.ceil(dim * math.log(orig / (low * 2 * math.pi)) / (2 * math.log(base)))
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - lo) / max(hi - lo, 1e-3)).clamp(0, 1)
    mask = 1 - ramp
    return inter * (1 - mask) + extra * mask


class RMSNorm(torch.nn.Module):
    qatcheck_class = "rmsnorm"
    qatcheck_contract = {"eps": 1e-6}

    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x):
        with torch.autocast("cpu", enabled=False):  # in float32, under autocast too
            x = x.float()
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class KeepIds(torch.autograd.Function):
    """The last Function of the router and the experts: keeps topk_ids in
    its saved tensors (qatcheck_saved), passes the gradient through."""

    @staticmethod
    def forward(ctx, y, ids):
        ctx.save_for_backward(ids)
        return y.clone()

    @staticmethod
    def backward(ctx, dy):
        return dy, None


class Router(torch.nn.Module):
    """DeepSeek-V3's noaux_tc: sigmoid scores; the groups by the sum of
    their top-2 score + bias, the top k of score + bias among the kept
    groups; the weights the unbiased scores of the chosen k, normalized and
    scaled by routed_scaling_factor."""
    qatcheck_class = "router"
    qatcheck_inputs = ["logits"]
    qatcheck_saved = ["topk_ids"]
    qatcheck_contract = {"score": "sigmoid", "normalize": "yes", "route_scale": 2.5, "n_group": NG, "topk_group": TG}

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(0.05 * torch.randn(E), requires_grad=False)  # e_score_correction_bias

    def forward(self, logits):
        scores = torch.sigmoid(logits.float())
        with torch.no_grad():
            sel = scores + self.bias
            grp = sel.view(-1, NG, E // NG).topk(2, dim=-1).values.sum(-1)
            keep = torch.zeros_like(grp).scatter_(1, grp.topk(TG, dim=-1).indices, 1.0)
            mask = keep[:, :, None].expand(-1, NG, E // NG).reshape(-1, E)
            ids = sel.masked_fill(mask == 0, float("-inf")).topk(TOPK, dim=-1).indices
        self.topk_ids = ids  # for the experts
        w = scores.gather(1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * 2.5
        return KeepIds.apply(w, ids)


class Experts(torch.nn.Module):
    """Routed swiglu experts, fused (stacked weights), and one shared expert."""
    qatcheck_class = "moe"
    qatcheck_inputs = ["x", "topk_weights"]
    qatcheck_saved = ["topk_ids"]
    qatcheck_contract = {"activation": "swiglu", "shared_experts": 1}

    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(E, 2 * F, H) / H ** 0.5)
        self.w2 = torch.nn.Parameter(torch.randn(E, H, F) / F ** 0.5)
        self.shared_w1 = torch.nn.Parameter(torch.randn(2 * FS, H) / H ** 0.5)
        self.shared_w2 = torch.nn.Parameter(torch.randn(H, FS) / FS ** 0.5)

    @staticmethod
    def mlp(x, w1, w2, f):
        h = x @ w1.t()
        return (torch.nn.functional.silu(h[:, :f]) * h[:, f:]) @ w2.t()

    def forward(self, x, topk_weights):
        with torch.autocast("cpu", enabled=False):  # float32 experts, under autocast too
            return self.experts(x.float(), topk_weights.float(), self.topk_ids)  # the router's ids, set by the block

    def experts(self, x, topk_weights, topk_ids):
        out = torch.zeros_like(x)
        for e in range(E):
            tok, slot = (topk_ids == e).nonzero(as_tuple=True)
            if tok.numel():
                y = self.mlp(x[tok], self.w1[e], self.w2[e], F)
                out = out.index_add(0, tok, y * topk_weights[tok, slot][:, None])
        xs = x.detach() if VARIANT == "shared_dx" else x  # the defect: the shared path's d_x is lost
        out = out + self.mlp(xs, self.shared_w1, self.shared_w2, FS)
        return KeepIds.apply(out, topk_ids)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = SRQuant()
        self.q_proj = FnLinear(H, NH * (NOPE + ROPE))
        self.kv_a_proj = torch.nn.Linear(H, LORA + ROPE)
        self.kv_norm = RMSNorm(LORA)
        self.kv_b_proj = torch.nn.Linear(LORA, NH * (NOPE + DV))
        self.q_rope, self.k_rope = Rope(), Rope()
        self.o_proj = torch.nn.Linear(NH * DV, H)
        self.gate = torch.nn.Linear(H, E, bias=False)
        self.router = Router()
        self.experts = Experts()
        self.register_buffer("inv_freq", yarn_inv_freq())

    def forward(self, x):
        b, s, _ = x.shape
        T = b * s
        pos = torch.arange(s).repeat(b)
        q = self.q_proj(self.quant(x)).float().view(T, NH, NOPE + ROPE)
        kv = self.kv_a_proj(x)
        c, k_pe = kv[..., :LORA], kv[..., LORA:].reshape(T, 1, ROPE)
        kvb = self.kv_b_proj(self.kv_norm(c)).view(T, NH, NOPE + DV)
        q = torch.cat((q[..., :NOPE], self.q_rope(q[..., NOPE:], pos, self.inv_freq)), -1)
        k_pe = self.k_rope(k_pe, pos, self.inv_freq).expand(T, NH, ROPE)
        k = torch.cat((kvb[..., :NOPE], k_pe), -1)
        v = kvb[..., NOPE:]
        q, k, v = (t.view(b, s, NH, -1).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(NOPE + ROPE)
        att = att.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(b, s, NH * DV)
        h = x + self.o_proj(o)
        hm = h.reshape(T, H)
        with torch.autocast("cpu", enabled=False):  # the gate in float32, as DeepSeek-V3's
            w = self.router(self.gate(hm.float()))
        self.experts.topk_ids = self.router.topk_ids
        return h + self.experts(hm, w).view(b, s, H)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = torch.nn.Linear(H, 16)

    def forward(self, x, mtp=False):
        h = self.block(x)
        y = self.head(h)
        if mtp:  # DeepSeek's multi-token prediction shares the output head
            y = y + self.head(torch.tanh(h))
        return y


def data():
    g = torch.Generator().manual_seed(7)
    return torch.randn(B, S, H, generator=g)


def loss_of(y):
    return (y.float() ** 2).mean()


def step(out, mode, variant):
    global VARIANT
    VARIANT = variant
    torch.manual_seed(0)
    model = Model()
    x = data()
    if mode == "eager":
        with qatdump.attach(model, out, modules=SELECT):
            loss_of(model(x)).backward()
    elif mode in ("recompute", "recompute_nr"):
        from torch.utils.checkpoint import checkpoint
        with qatdump.attach(model, out, modules=SELECT, mode="recompute"):
            xin = x.clone().requires_grad_(True)
            h = checkpoint(model.block, xin, use_reentrant=mode == "recompute")
            loss_of(model.head(h)).backward()
    elif mode == "autocast":
        with qatdump.attach(model, out, modules=AUTOCAST, mode="autocast"):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = model(x)
            loss_of(y).backward()
    elif mode == "grad_accum":
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with qatdump.attach(model, out, modules=SELECT, mode="grad_accum"):
            for mb in x.chunk(2):
                (loss_of(model(mb)) / 2).backward()
        opt.step()
    elif mode == "tied":
        with qatdump.attach(model, out, modules=r"^head$", mode="tied"):
            loss_of(model(x, mtp=True)).backward()
    else:
        raise SystemExit("unknown mode %s" % mode)


if __name__ == "__main__":
    failed = 0
    for arg in sys.argv[1:]:  # every leg, each failure named (one does not hide the others)
        parts = arg.split(":")
        try:
            step(parts[0], parts[1], parts[2] if len(parts) > 2 else "ok")
        except Exception as e:  # noqa: BLE001 (reported, then the exit status)
            print("FAIL %s: %s: %s" % (arg, type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
            failed = 1
    sys.exit(failed)
