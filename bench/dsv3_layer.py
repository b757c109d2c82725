#!/usr/bin/python3
"""dsv3_layer.py: one DeepSeek-V3 decoder layer (MLA attention, noaux_tc
router, 256-style routed experts with fp8 block-128 expert QAT and a shared
expert) with random weights, one training step dumped by scripts/qatdump.py
and audited by `qatcheck vjp` (bench/dsv3_layer.sh; docs/models.md).

The layer is transformers 5's DeepseekV3ForCausalLM with one MoE layer,
instrumented by scripts/qatdump_hf.py (its MLA linears fp8_block128 with
their deployed bytes, the interleaved YaRN rope, the attention core, the
noaux_tc router, the logprob loss); only the routed experts are replaced
here by a trainer's FP8 forward / float32 backward (QcMoEFP8): each expert's
w1[e], w2[e] quantized fp8_block128 (profile vllm) on the device, the
forward on the dequantized experts, d_x through them (dx_weight dequant),
d_w1, d_w2 straight through, the bytes and scales saved (saved/w1_q,
w1_scale, w2_q, w2_scale: checked byte for byte by the audit), or not
dumped under --no-expert-bytes (the audit then quantizes the masters
itself, as for any expert-QAT dump without bytes: 256 experts' bytes are
11 GB the lent machines' disk cannot spare). At the real size the
attention core runs eager attention's arithmetic a block of heads at a
time (--attention chunked, _ChunkedAttn), so that 256 experts fit an
H100's 80 GB: eager's four [1, 128, 4096, 4096] float32 matrices in its
backward are 32 GiB.

The routed experts' masters w1, w2 (and so their gradients) are float32 or
bfloat16 (--expert-dtype; the size's default: float32 for tiny and issue38,
bf16 for real, where float32 experts alone are 84 GiB of masters and
gradients): a trainer holding bf16 expert masters, the rest of the model
float32. The experts' arithmetic is float32 either way (the quantizer reads
the master as float32, the products run on the dequantized bytes), each
expert's d_w1, d_w2 rounded once into the master's dtype; the contract
says compute_dtype float32 (else the dumper would declare a pure-bf16
module from the bf16 parameters). The dumper keeps what it records in host
memory (qatdump_hf.dump_step's host_copies), so the device holds the
model, its gradients, the fp8 bytes and one expert's temporaries, not a
second copy of the experts.

usage: dsv3_layer.py --out DIR [--size tiny|issue38|real] [--hidden N]
         [--experts N] [--topk N] [--n-group N] [--topk-group N]
         [--expert-width N] [--tokens N] [--heads N] [--device cpu|cuda]
         [--expert-dtype float32|bf16] [--attention eager|chunked] [--no-expert-bytes]
         [--plant P[,P...]] [--estimate]
  P: none | expert_grad (expert 2's d_w1 one percent high; the lowest expert
  with a token where expert 2 gets none) | router_bias (the
  router's weights from score + bias) | o_proj_dx (o_proj's d_x x 1.001);
  with several, each variant goes to DIR/P
Prints "key value" lines: the estimate (est_*), then dump_s, dump_bytes,
dumper_rss_gib, dumper_gpu_gib. Exit 77 (one "skip:" line) when the
estimate exceeds the disk under DIR or the device's memory."""
import argparse
import gc
import json
import os
import resource
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
sys.path.insert(0, os.path.join(HERE, "..", "scripts", "conformance"))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import qatdump_hf  # noqa: E402

# per size: hidden, routed experts, top-k, n_group, topk_group, expert width F, tokens (batch x seq), heads,
# q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head, vocab, the routed experts' master dtype
SIZES = {
    "tiny": dict(hidden=256, experts=32, topk=8, n_group=8, topk_group=3, expert_width=128, batch=2, seq=16,
                 heads=2, q_lora=128, kv_lora=128, nope=16, rope=8, v_head=16, vocab=96, expert_dtype="float32"),
    # issue 38: hidden >= 2048, >= 64 experts, top-8, 3 of 8 groups kept
    "issue38": dict(hidden=2048, experts=64, topk=8, n_group=8, topk_group=3, expert_width=512, batch=2, seq=512,
                    heads=16, q_lora=768, kv_lora=256, nope=128, rope=64, v_head=128, vocab=1024,
                    expert_dtype="float32"),
    # issue 41: DeepSeek-V3's own layer (config.json of deepseek-ai/DeepSeek-V3); bf16 expert masters
    # (float32 ones: 84 GiB of masters and gradients on the device, 105 GiB of dump)
    "real": dict(hidden=7168, experts=256, topk=8, n_group=8, topk_group=4, expert_width=2048, batch=1, seq=4096,
                 heads=128, q_lora=1536, kv_lora=512, nope=128, rope=64, v_head=128, vocab=1024, expert_dtype="bf16",
                 attention="chunked"),
}
EXPERT_DTYPES = {"float32": torch.float32, "bf16": torch.bfloat16}
PLANTS = ("none", "expert_grad", "router_bias", "o_proj_dx")
YARN = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}
GIB = float(1 << 30)


# ---- fp8 block-128 on the device: the vllm profile's arithmetic ----

def quant_fp8_block128(w, chunk=1 << 28):
    """Each w[e] [R, C] (R, C multiples of 128) quantized as a weight matrix
    of its own under fp8_block128, profile vllm (scripts/conformance/
    quant_oracle.py's rule, which the audit reproduces byte for byte):
    a = max(amax of the 128 x 128 block, 1e-4), s = fl32(a * fl32(1/448)),
    k = rcp.approx(s) (the oracle's measured table, on the host: one value a
    block), code = e4m3(clamp(fl32(w k), +-448)), nearest even. Returns the
    codes [E, R, C] float8_e4m3fn and the multipliers s [E, R/128, C/128]
    float32; experts in chunks of about `chunk` elements (no whole-tensor
    float32 temporaries)."""
    import quant_oracle
    quant_oracle.use_tables(qatdump_hf.TABLES)
    E, R, C = w.shape
    if R % 128 or C % 128:
        raise ValueError("fp8_block128 experts: %d x %d is not a multiple of 128" % (R, C))
    q = torch.empty((E, R, C), dtype=torch.float8_e4m3fn, device=w.device)
    s = torch.empty((E, R // 128, C // 128), dtype=torch.float32, device=w.device)
    step = max(1, chunk // (R * C))
    with torch.no_grad():
        for e0 in range(0, E, step):
            b = w[e0:e0 + step].float().reshape(-1, R // 128, 128, C // 128, 128)
            amax = b.abs().amax(dim=(2, 4)).cpu().numpy().astype(np.float32)
            a = np.maximum(amax, np.float32(1e-4))
            sc = (a * np.float32(1.0 / 448)).astype(np.float32)
            k = torch.from_numpy(np.ascontiguousarray(quant_oracle.rcpa(sc), np.float32)).to(w.device)
            v = (b * k[:, :, None, :, None]).clamp_(-448.0, 448.0)
            q[e0:e0 + step] = v.reshape(-1, R, C).to(torch.float8_e4m3fn)
            s[e0:e0 + step] = torch.from_numpy(sc).to(w.device)
    return q, s


def dequant(q, s):
    """codes [R, C] times their block's multiplier, float32"""
    R, C = q.shape
    return (q.float().view(R // 128, 128, C // 128, 128) * s[:, None, :, None]).view(R, C)


class _ExpertsFn(torch.autograd.Function):
    """The routed experts: forward on dequant(quant(W)); backward d_x
    through the dequantized experts, d_w1 = d_h^T x, d_w2 = (w dY)^T a
    (x and a = silu(gate) up unquantized: identity straight-through), all
    float32, each expert's d_w1, d_w2 rounded once into the masters' dtype
    (bf16 masters: bf16 gradients, RNE); the activations recomputed per
    expert (nothing per expert kept between the passes but the bytes)."""

    @staticmethod
    def forward(ctx, x, tw, w1, w2, mod):
        q1, s1 = quant_fp8_block128(w1)
        q2, s2 = quant_fp8_block128(w2)
        F_ = w2.shape[2]
        out = torch.zeros_like(x)
        for e in range(w1.shape[0]):
            tok, slot = torch.where(mod.ids == e)
            if tok.numel() == 0:
                continue
            h = x[tok] @ dequant(q1[e], s1[e]).t()
            a = F.silu(h[:, :F_]) * h[:, F_:]
            out.index_add_(0, tok, (a @ dequant(q2[e], s2[e]).t()) * tw[tok, slot, None])
        ctx.save_for_backward(x, tw, mod.ids, q1, s1, q2, s2)
        ctx.mod, ctx.shapes = mod, (w1.shape, w2.shape, w1.dtype)
        mod.qc_bytes = (q1, s1, q2, s2)
        return out

    @staticmethod
    def backward(ctx, gy):
        x, tw, ids, q1, s1, q2, s2 = ctx.saved_tensors
        sh1, sh2, dt = ctx.shapes
        F_ = sh2[2]
        dx, dtw = torch.zeros_like(x), torch.zeros_like(tw)
        dw1 = torch.zeros(sh1, dtype=dt, device=x.device)
        dw2 = torch.zeros(sh2, dtype=dt, device=x.device)
        busy = torch.bincount(ids.flatten(), minlength=sh1[0]) > 0
        # the planted expert: 2, or the lowest with a token where 2 gets none (an empty expert's
        # gradient is 0, and 1.01 x 0 would plant nothing: top-1 routing, few tokens)
        pe = 2 if busy.numel() > 2 and busy[2] else int(torch.nonzero(busy)[0]) if busy.any() else -1
        for e in range(sh1[0]):
            tok, slot = torch.where(ids == e)
            if tok.numel() == 0:
                continue  # an empty expert: exactly zero gradients
            xe, d1, d2 = x[tok], dequant(q1[e], s1[e]), dequant(q2[e], s2[e])
            h = xe @ d1.t()
            g, u = h[:, :F_], h[:, F_:]
            sg = torch.sigmoid(g)
            a = g * sg * u
            dy = gy[tok]
            dtw[tok, slot] = (dy * (a @ d2.t())).sum(-1)
            wdy = dy * tw[tok, slot, None]
            dw2[e] = wdy.t() @ a  # float32 products, rounded once into the master's dtype
            da = wdy @ d2
            dh = torch.cat((da * u * sg * (1 + g * (1 - sg)), da * g * sg), -1)
            g1 = dh.t() @ xe
            if ctx.mod.qc_plant == "expert_grad" and e == pe:
                g1 *= 1.01  # the planted bug: one expert's d_w1 one percent high (before any bf16 rounding)
            dw1[e] = g1
            dx.index_add_(0, tok, dh @ d1)
        return dx, dtw, dw1, dw2, None


def fp8_experts(moe, expert_dtype="float32", bytes_=True):
    """qatdump_hf5.QcMoE5 (the library's experts as the moe class) turned
    into the FP8 expert-QAT trainer: the routed experts through _ExpertsFn,
    the shared expert unquantized (as QcMoE5 runs it). With expert_dtype
    bf16, the routed experts' masters w1, w2 become bfloat16 parameters
    (the float32 ones as built, rounded to nearest even, the float32 ones
    dropped): their gradients are bf16 too; the module still computes in
    float32 (compute_dtype float32 in its contract)."""
    moe.__class__ = type("QcMoEFP8", (type(moe),), {"forward": _moe_forward})
    moe.qatcheck_contract = dict(moe.qatcheck_contract, expert_weight_format="fp8_block128",
                                 expert_act_format="none", dx_weight="dequant", profile="vllm")
    dt = EXPERT_DTYPES[expert_dtype]
    if moe.w1.dtype != dt:
        with torch.no_grad():
            for n in ("w1", "w2"):
                w = getattr(moe, n)
                setattr(moe, n, torch.nn.Parameter(w.detach().to(dt), requires_grad=w.requires_grad))
                del w
        gc.collect()  # the float32 masters: nothing else holds them (the library's experts module is gone)
    if dt != torch.float32:
        # its arithmetic is float32 on the dequantized bytes: said, so that the dumper does not declare a
        # pure-bf16 module from the bf16 parameters (compute_dtype bfloat16, docs/classes.md)
        moe.qatcheck_contract["compute_dtype"] = "float32"
    moe.qatcheck_saved = ["topk_ids"] + (["w1_q", "w1_scale", "w2_q", "w2_scale"] if bytes_ else [None] * 4)
    moe.qc_plant = "none"


def _moe_forward(self, x, topk_weights):
    out = _ExpertsFn.apply(x, topk_weights, self.w1, self.w2, self)
    f = self.Fs
    if f:
        out = out + F.linear(self._act(F.linear(x, self.shared_w1[:f])) * F.linear(x, self.shared_w1[f:]),
                             self.shared_w2)
    q1, s1, q2, s2 = self.qc_bytes
    self.qc_bytes = None
    return qatdump_hf._Saved.apply(out, self.ids, q1, s1, q2, s2)


def _router_bias_forward(self, logits):
    """The planted router bug: the weights from the biased keys (score +
    e_score_correction_bias), which should only select."""
    with torch.no_grad():
        type(self).forward(self, logits)  # the class's own forward: the selection (self.ids)
    w = (logits.sigmoid() + self.bias).gather(1, self.ids)
    w = w / (w.sum(dim=-1, keepdim=True) + 1e-20) * self.scale
    return qatdump_hf._Saved.apply(w, self.ids)


# ---- the attention core a block of heads at a time ----

ATT_BLOCK_BYTES = 1 << 30   # one block's [B, heads, S, S] float32 scores at most (at least one head)


def att_block(B, S, heads):
    """Heads a block of _ChunkedAttn takes: its scores within ATT_BLOCK_BYTES."""
    return max(1, min(heads, ATT_BLOCK_BYTES // (4 * B * S * S)))


def _att_scores(q, k, mask, scaling):
    """transformers' eager attention's scores (eager_attention_forward in
    models/deepseek_v3/modeling_deepseek_v3.py, 5.x): q k^T, scaled, the
    additive mask added."""
    s = torch.matmul(q, k.transpose(2, 3)) * scaling
    return s if mask is None else s + mask[:, :, :, : k.shape[-2]]


class _ChunkedAttn(torch.autograd.Function):
    """Eager attention's arithmetic (float32 scores, the additive mask, a
    float32 softmax, P V), a block of heads at a time, forward and backward:
    eager attention keeps P [B, heads, S, S] for its backward and holds four
    such matrices in it (8 GiB each at the real dims, 32 GiB of the 80 GiB
    the step at 256 experts needed); here at most a block's few are alive,
    and the backward recomputes each block's P from q and k. Its gradients
    are the softmax's: dS = P (dP - rowsum(dP P)), dP = dO V^T, then d_q =
    c dS K, d_k = c dS^T Q, d_v = P^T dO (c the scaling). Returns O [B,
    heads, S, Dv] and the LSE [B, heads, S] of the masked, scaled scores
    (no gradient). MHA only (as many key heads as query heads)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, scaling, hb):
        B, H, S, _ = q.shape
        o = q.new_empty(B, H, S, v.shape[-1])
        lse = q.new_empty(B, H, S, dtype=torch.float32)
        for h0 in range(0, H, hb):
            b = slice(h0, h0 + hb)
            s = _att_scores(q[:, b], k[:, b], mask, scaling)
            lse[:, b] = torch.logsumexp(s.float(), dim=-1)
            p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
            del s
            o[:, b] = torch.matmul(p, v[:, b])
            del p
        ctx.save_for_backward(q, k, v, mask)
        ctx.scaling, ctx.hb = scaling, hb
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, mask = ctx.saved_tensors
        c, hb = ctx.scaling, ctx.hb
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for h0 in range(0, q.shape[1], hb):
            b = slice(h0, h0 + hb)
            p = F.softmax(_att_scores(q[:, b], k[:, b], mask, c), dim=-1, dtype=torch.float32).to(q.dtype)
            dv[:, b] = torch.matmul(p.transpose(2, 3), do[:, b])
            dp = torch.matmul(do[:, b], v[:, b].transpose(2, 3))
            ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
            del dp, p
            ds *= c
            dq[:, b] = torch.matmul(ds, k[:, b])
            dk[:, b] = torch.matmul(ds.transpose(2, 3), q[:, b])
            del ds
        return dq, dk, dv, None, None, None


def _chunked_core(self, q, k, v):
    """qatdump_hf.QcAttention.forward through _ChunkedAttn: the same O and
    LSE saved, the same gradients to within float32 rounding."""
    parent, mask, scaling, softcap = self.call
    if softcap is not None or k.shape[1] != q.shape[1] or self.qc_plant != "none":
        raise ValueError("--attention chunked: MHA without a softcap or a plant only")
    o, lse = _ChunkedAttn.apply(q, k, v, mask, scaling, att_block(q.shape[0], q.shape[2], q.shape[1]))
    return qatdump_hf._Saved.apply(o, o.detach().float().contiguous(), lse.contiguous())


# ---- the layer ----

def dims(a):
    d = dict(SIZES[a.size])
    d.setdefault("attention", "eager")
    for k in ("hidden", "experts", "topk", "n_group", "topk_group", "expert_width", "heads", "expert_dtype",
              "attention"):
        if getattr(a, k) is not None:
            d[k] = getattr(a, k)
    if a.tokens is not None:
        d["batch"], d["seq"] = 1, a.tokens
    if getattr(a, "no_expert_bytes", False):
        d["expert_bytes"] = False
    return d


def _cdiv(a, b):
    return -(-a // b)


def dump_bytes(d):
    """The dump's datasets, byte for byte (HDF5's headers aside: about 1.5 KB
    a dataset): per module, what scripts/qatdump.py writes for it. The
    routed experts' masters and gradients in the experts' dtype, their fp8
    bytes and float32 block scales; everything else float32 (token ids
    int64, the loss mask int32), the MLA linears with their fp8 bytes."""
    B, S = d["batch"], d["seq"]
    T, Tl = B * S, B * (S - 1)
    H, E, K, F, h = d["hidden"], d["experts"], d["topk"], d["expert_width"], d["heads"]
    ql, kl, nope, rope, vh, V = d["q_lora"], d["kv_lora"], d["nope"], d["rope"], d["v_head"], d["vocab"]
    qk, es = nope + rope, 2 if d["expert_dtype"] == "bf16" else 4
    pe = E * 3 * H * F

    def linear(i, o, fp8):  # x, d_x, y, dy, weight, d_weight (+ weight_q, weight_scale)
        return 4 * (2 * T * i + 2 * T * o + 2 * i * o) + (i * o + 4 * _cdiv(o, 128) * _cdiv(i, 128) if fp8 else 0)

    def rmsnorm(n):  # x, d_x, y, dy, weight, d_weight
        return 4 * (4 * T * n + 2 * n)
    b = linear(H, V, False) + linear(H, E, False)                    # lm_head, the router's gate
    b += (linear(H, ql, True) + linear(ql, h * qk, True) + linear(H, kl + rope, True)
          + linear(kl, h * (nope + vh), True) + linear(h * vh, H, True))   # the MLA linears
    b += 3 * rmsnorm(H) + rmsnorm(ql) + rmsnorm(kl)
    b += 4 * (2 * T * K + 2 * T * E + E) + 8 * T * K                 # router: logits, d_logits, y, dy, bias; ids
    b += 4 * (4 * T * H + 2 * T * K + 2 * 3 * F * H) + 8 * T * K     # moe: x, d_x, y, dy, weights, shared, ids
    b += 2 * pe * es + (pe + 4 * (pe // (128 * 128)) if d.get("expert_bytes", True) else 0)  # experts: w, d_w; fp8 bytes, scales
    b += 4 * T * h * (4 * qk + 5 * vh + 1)                           # attention: q, k, v, grads, y, dy, O, LSE
    b += 16 * T * (h + 1) * rope + 16 * T + 4 * rope                 # rope q, k: x, d_x, y, dy; positions, inv_freq
    b += 4 * (2 * Tl * V + 3 * Tl) + 8 * Tl                          # logprob: logits, d_logits, y, dy, mask; ids
    return b


def estimate(d, device="cuda"):
    """Bytes: the dump (dump_bytes), the device's peak (torch's allocated
    peak in the dumper), the host's peak. The dumper keeps its records on
    the host (host_copies), so the device holds the model (routed experts
    in their dtype, the rest float32), the gradients, the experts' fp8
    bytes while the autograd graph holds them, eager attention's
    [B, heads, S, S] float32 matrices and the other activations. The peak
    is the largest of: the build (float32 experts as built, and their bf16
    copy), the forward's attention, the experts' quantization, the
    experts' backward (their fp8 bytes, the new gradients beside the
    masters, the probabilities kept), the attention's backward (every
    gradient, four score-sized matrices: P, dP, dS and the scaled dS).
    Under chunked attention (_ChunkedAttn) no P is kept and a block's
    scores replace the four matrices. Measured on an H100 at the real dims
    with 32 and 64 experts (bf16 and float32, eager): the peak is the
    attention's backward, 35.75 GiB plus twice
    the experts' bytes (masters and gradients), which this overestimates
    by 2.1 GiB; the dump's datasets to the byte. The host: what the dumper
    recorded (the whole dump, until it is written) plus about 3 GiB (the
    interpreter, torch, CUDA, the oracle's fake quantization of the MLA
    linears: 2.2 GiB measured); on a cpu device the model and its step
    live there too."""
    B, S = d["batch"], d["seq"]
    T = B * S
    H, E, F, h, V = d["hidden"], d["experts"], d["expert_width"], d["heads"], d["vocab"]
    ql, kl, nope, rope, vh = d["q_lora"], d["kv_lora"], d["nope"], d["rope"], d["v_head"]
    qk, es = nope + rope, 2 if d["expert_dtype"] == "bf16" else 4
    pe = E * 3 * H * F                                                # routed expert elements
    lin = [(H, ql), (ql, h * qk), (H, kl + rope), (kl, h * (nope + vh)), (h * vh, H)]
    pa = sum(i * o for i, o in lin)                                   # the MLA linears' elements
    experts = pe * es
    rest = 4 * (2 * V * H + pa + 3 * F * H + E * H + 3 * H + ql + kl + E)   # embedding, lm_head, MLA, shared, gate
    fp8 = pe + 4 * (pe // (128 * 128))
    att = B * h * S * S * 4                                           # one eager score matrix, float32
    kept, work = att, 4 * att              # eager: P kept for the backward; four alive in the backward
    if d.get("attention") == "chunked":    # _ChunkedAttn: nothing kept, a block's five at most
        kept, work = 0, 5 * B * att_block(B, S, h) * S * S * 4
    # activations the graph keeps (norms, the linears' bf16 inputs and dequantized weights, q, k, v, O, the
    # MLA projections) and one expert's float32 temporaries
    act = 4 * T * (8 * H + h * (4 * qk + 4 * vh) + 2 * V) + 2 * pa + 16 * F * H
    chunk = 3 * 4 * min(E, max(1, (1 << 28) // (2 * F * H))) * 2 * F * H  # quant_fp8_block128's float32 chunks
    build = rest + 4 * pe + (experts if es != 4 else 0)
    phases = (experts + rest + work + act,                             # the attention's forward
              experts + rest + kept + fp8 + chunk + act,               # the experts' quantization
              2 * (experts + rest) + kept + fp8 + act,                 # the experts' backward
              2 * (experts + rest) + work + act)                       # the attention's backward
    dev = max(build, max(phases))
    dump = dump_bytes(d)
    host = dump + (3 << 30)
    if not str(device).startswith("cuda"):
        host += dev
    return dump, dev, host


def build(d, device, seed):
    import transformers as T
    cfg = T.DeepseekV3Config(
        vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=4 * d["hidden"],
        moe_intermediate_size=d["expert_width"], num_hidden_layers=1, first_k_dense_replace=0,
        num_attention_heads=d["heads"], num_key_value_heads=d["heads"], q_lora_rank=d["q_lora"],
        kv_lora_rank=d["kv_lora"], qk_nope_head_dim=d["nope"], qk_rope_head_dim=d["rope"], v_head_dim=d["v_head"],
        n_routed_experts=d["experts"], num_experts_per_tok=d["topk"], n_group=d["n_group"],
        topk_group=d["topk_group"], n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_interleave=True, tie_word_embeddings=False, max_position_embeddings=max(4096, d["seq"]),
        rope_parameters=dict(YARN))
    torch.manual_seed(seed)
    with torch.device(device):
        model = T.DeepseekV3ForCausalLM(cfg).float()
    with torch.no_grad():  # the correction bias: random, as a trained model's (zero at init)
        for m in model.modules():
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.normal_(0, 0.05)
    model.train()
    return model


def one(a, d, plant, out):
    """Build, instrument (with `plant`), step, dump into OUT/step.h5, write
    OUT/case.json and OUT/plan.json; print the measurements."""
    os.makedirs(out, exist_ok=True)
    dev = torch.device(a.device)
    model = build(d, dev, a.seed)
    plan = qatdump_hf.instrument(model, "fp8_block128", "o_proj_dx" if plant == "o_proj_dx" else "none", 0)
    for name, m in model.named_modules():
        if type(m).__name__ == "QcMoE5":
            fp8_experts(m, d["expert_dtype"], d.get("expert_bytes", True))
            m.qc_plant = plant
            if plant == "expert_grad":
                plan["planted"] = name
        elif type(m).__name__ == "QcRouterDS" and plant == "router_bias":
            m.forward = _router_bias_forward.__get__(m)
            plan["planted"] = name
        elif type(m).__name__ == "QcAttention" and d["attention"] == "chunked":
            m.forward = _chunked_core.__get__(m)
    ids, mask = qatdump_hf.batch(model, d["batch"], d["seq"], a.seed + 1, dev)
    dump = os.path.join(out, "step.h5")
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    tm = qatdump_hf.dump_step(model, plan, ids, mask, dump, host_copies=True)
    dump_s = time.perf_counter() - t0
    qatdump_hf.write_case(plan, dump, os.path.join(out, "case.json"), name="dsv3_layer_" + a.size,
                          qatcheck=a.qatcheck)
    with open(os.path.join(out, "plan.json"), "w") as f:
        json.dump(dict(plan, dims=d, tokens=ids.numel(), device=str(dev), **tm), f, indent=1)
    print("modules %d (%s)" % (len(plan["modules"]), ", ".join(sorted(plan["modules"]))))
    print("planted %s" % (plan["planted"] or "-"))
    print("step_s %.3f" % tm["dumped_step_s"])
    print("dump_write_s %.3f" % tm["write_s"])
    print("dump_s %.3f" % dump_s)
    print("dump_bytes %d" % os.path.getsize(dump))
    print("dumper_rss_gib %.2f" % (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / float(1 << 20)))
    print("dumper_gpu_gib %s" % ("%.2f" % (torch.cuda.max_memory_allocated(dev) / GIB) if dev.type == "cuda"
                                 else "n/a"))
    print("dumper_gpu_reserved_gib %s" % ("%.2f" % (torch.cuda.max_memory_reserved(dev) / GIB)
                                          if dev.type == "cuda" else "n/a"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    for k in ("hidden", "experts", "topk", "n-group", "topk-group", "expert-width", "tokens", "heads"):
        ap.add_argument("--" + k, type=int, default=None)
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when torch sees a device, else cpu; "
                    "with --estimate, cuda: the estimate of the GPU run)")
    ap.add_argument("--expert-dtype", default=None, choices=sorted(EXPERT_DTYPES),
                    help="the routed experts' masters w1, w2 and their gradients (default: the size's, %s)"
                         % ", ".join("%s %s" % (k, v["expert_dtype"]) for k, v in sorted(SIZES.items())))
    ap.add_argument("--no-expert-bytes", action="store_true",
                    help="leave the routed experts' fp8 bytes and scales out of the dump (the audit quantizes the masters)")
    ap.add_argument("--attention", default=None, choices=("eager", "chunked"),
                    help="the attention core: transformers' eager function, or the same arithmetic a block of "
                         "heads at a time (_ChunkedAttn; default: the size's, %s)"
                    % ", ".join("%s %s" % (k, v.get("attention", "eager")) for k, v in sorted(SIZES.items())))
    ap.add_argument("--plant", default="none", help="a planted bug, or a comma-separated list (each into OUT/PLANT): %s" % ", ".join(PLANTS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--estimate", action="store_true", help="print the estimate and stop")
    ap.add_argument("--qatcheck", default=None, help="the qatcheck binary (the case's gradients: its class table)")
    a = ap.parse_args(argv)
    if a.device is None:
        a.device = "cuda" if a.estimate or torch.cuda.is_available() else "cpu"
    d = dims(a)
    dump_b, dev_b, host_b = estimate(d, a.device)
    print("dims %s" % json.dumps(d, sort_keys=True))
    print("est_device %s" % a.device)
    print("est_dump_gib %.2f" % (dump_b / GIB))
    print("est_dumper_gpu_gib %.2f" % (dev_b / GIB))
    print("est_host_gib %.2f" % (host_b / GIB))
    if a.estimate:
        return 0
    os.makedirs(a.out, exist_ok=True)
    free, n = shutil.disk_usage(a.out).free, len(a.plant.split(","))
    if n * dump_b > 0.9 * free:
        print("skip: %d dump(s) of about %.1f GiB do not fit the %.1f GiB free under %s"
              % (n, dump_b / GIB, free / GIB, a.out))
        return 77
    if a.device.startswith("cuda"):
        have = torch.cuda.get_device_properties(torch.device(a.device)).total_memory
        if dev_b > 0.95 * have:
            print("skip: the step needs about %.1f GiB of device memory, the device has %.1f GiB"
                  % (dev_b / GIB, have / GIB))
            return 77
    for v in a.plant.split(","):
        if v not in PLANTS:
            ap.error("--plant %s: expected a comma-separated list of %s" % (v, ", ".join(PLANTS)))
    for v in a.plant.split(","):
        print("variant %s" % v)
        one(a, d, v, os.path.join(a.out, v) if "," in a.plant else a.out)
        gc.collect()  # the variant's model (its modules hold cycles) before the next one's is built
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
