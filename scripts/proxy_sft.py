#!/usr/bin/env python3
"""proxy_sft.py: a real proxy SFT in three arms, for `qatcheck sft` and
`qatcheck step` (docs/layer3.md).

A small transformer learns a task this script generates (sort a list of
digits: prompt, separator, the sorted digits, end), first as a base model
(float32, a few steps of plain language modelling), then by SFT (loss on the
response only) in three arms from the same base weights, with the same
data in the same order, the same seeds and the same optimizer:

  under_test          the FP8 fp8_block128 fake-quantized weights in the
                      forward (128x128 blocks, scale amax/448, e4m3 rounding
                      written in plain torch ops so torch 1.13 runs it), the
                      production bf16 backward: straight-through to the
                      master, dX from the dequantized weight, bf16 operands
                      and outputs, float32 accumulation;
  gradient_reference  the same visible forward on the same weights, through
                      the bridge VisibleWithSurrogate (the value of the
                      visible forward, the gradient of an independent
                      float32 surrogate on the dequantized weight);
  native_baseline     bf16 weights and activations, the bf16 backward.

It writes per arm the per-step log (JSONL in verl's {"step", "data"} form,
CSV, TensorBoard event files through the real `tensorboard` writer, Hugging
Face trainer_state.json, Megatron golden values), the arm's config (JSON;
YAML for the baseline) and, with --step-dump, the one-step update dump of
under_test and gradient_reference from the same parameters and optimizer
state. --plant reproduces real bugs in under_test:

  grad-half         the gradients of the MLP weights halved (an expert
                    data-parallel scaling slip: averaged over twice the ranks);
  refresh-stops=N   the cached quantized weights stop being refreshed after
                    N optimizer steps;
  mask-shift        the loss mask is taken on input positions instead of
                    label positions (off by one);
  adam-l2           Adam with L2 weight decay where AdamW is declared;
  frozen-decay      the frozen embedding is kept in the optimizer with a
                    zeroed gradient, so AdamW's weight decay moves it.

Runs on torch 1.13 on the CPU (CI) and on the GPU with --device cuda
(--size large for a bigger model). bf16 is emulated by rounding float32
tensors to bf16 values (a bf16 GEMM with float32 accumulation rounds its
operands and output the same way).

This file is over 500 lines on purpose: the numerics, the three arms, the
planted bugs and the writers of every output format are one runnable
script that a reader checks against the method from top to bottom.
"""
import argparse
import copy
import csv
import hashlib
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

ARMS = ("under_test", "gradient_reference", "native_baseline")
E4M3_MAX = 448.0
BLOCK = 128


# ---- numerics -------------------------------------------------------------------

def bf(x):
    """x rounded to bfloat16 values, kept in x's float32 container (RNE)."""
    return x.to(torch.bfloat16).to(x.dtype)


def round_e4m3(y):
    """Round float32 y (|y| <= 448) to the nearest float8_e4m3fn value, ties
    to even: the spacing is 2^(e-3) for |y| in [2^e, 2^(e+1)), e >= -6, and
    2^-9 below 2^-6 (subnormals). y / spacing is exact (a power of two), so
    torch.round (half to even) rounds exactly as the hardware cast does."""
    a = y.abs()
    _, e = torch.frexp(a)                      # a = m 2^e, m in [0.5, 1)
    e = torch.clamp(e - 1, min=-6)             # floor(log2 a), subnormals share 2^-6's spacing
    ulp = torch.pow(torch.full_like(a, 2.0), (e - 3).to(a.dtype))
    return torch.round(y / ulp) * ulp


def fake_quant_fp8_block128(w):
    """Dequantized fp8_block128 weight: per 128x128 block, amax (at least
    1e-4, as vLLM clamps it), x * (448 / amax) rounded to e4m3, times
    amax / 448. w is [N, K]; blocks past the edge are padded with zeros."""
    n, k = w.shape
    pn, pk = (-n) % BLOCK, (-k) % BLOCK
    x = F.pad(w.float(), (0, pk, 0, pn))
    xb = x.view((n + pn) // BLOCK, BLOCK, (k + pk) // BLOCK, BLOCK)
    amax = xb.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-4)
    q = round_e4m3(torch.clamp(xb * (E4M3_MAX / amax), -E4M3_MAX, E4M3_MAX))
    return (q * (amax / E4M3_MAX)).view(n + pn, k + pk)[:n, :k].contiguous()


class Bf16Linear(torch.autograd.Function):
    """y = x w^T with bf16 operands and output (float32 accumulation); the
    backward likewise: dX = dY w, dW = dY^T x, bf16 in and out. With wq
    given, the forward and dX use it (the dequantized weight) and dW goes to
    the master unchanged (straight-through)."""

    @staticmethod
    def forward(ctx, x, w, wq):
        wv = bf(w) if wq is None else bf(wq)
        ctx.save_for_backward(x, wv)
        return bf(bf(x) @ wv.t()) if wq is None else bf(bf(x) @ wq.t())

    @staticmethod
    def backward(ctx, g):
        x, wv = ctx.saved_tensors
        g = bf(g)
        gx = bf(g @ wv)
        gw = bf(g.reshape(-1, g.shape[-1]).t() @ bf(x).reshape(-1, x.shape[-1]))
        return gx, gw, None


class STE(torch.autograd.Function):
    """A tensor valued as the dequantized weight whose gradient passes
    straight to the master."""

    @staticmethod
    def forward(ctx, w, wq):
        return wq.clone()

    @staticmethod
    def backward(ctx, g):
        return g, None


class VisibleWithSurrogate(torch.autograd.Function):
    """The method's bridge: the value of the visible (inference) forward,
    the gradient of the surrogate."""

    @staticmethod
    def forward(ctx, visible, surrogate):
        assert visible.shape == surrogate.shape
        assert visible.device == surrogate.device
        assert visible.dtype == surrogate.dtype
        return visible

    @staticmethod
    def backward(ctx, grad_output):
        return None, grad_output


# ---- the task and the model ---------------------------------------------------------

def make_batch(gen, size, n_digits, n_values):
    """size sequences: n_digits random digits, SEP, the digits sorted, EOS.
    Tokens: digits 0..n_values-1, SEP = n_values, EOS = n_values + 1."""
    sep, eos = n_values, n_values + 1
    p = torch.randint(0, n_values, (size, n_digits), generator=gen)
    s, _ = torch.sort(p, dim=1)
    col = lambda v: torch.full((size, 1), v, dtype=torch.long)
    return torch.cat([p, col(sep), s, col(eos)], dim=1)


def response_mask(seq, n_digits, shift=False):
    """The loss mask over label positions j (predicting seq[j+1]): the
    response and EOS, j >= n_digits. shift: taken on input positions
    (j >= n_digits + 1), the classic off by one that drops the first
    response token."""
    L = seq.shape[1] - 1
    j = torch.arange(L)
    m = j >= (n_digits + 1 if shift else n_digits)
    return m.unsqueeze(0).expand(seq.shape[0], L)


def init_params(cfg, gen):
    D, Fd, V, T = cfg["d"], cfg["ffn"], cfg["vocab"], cfg["seq"]
    def nrm(*shape, std=0.02):
        return torch.randn(*shape, generator=gen) * std
    p = {"tok_emb": nrm(V, D), "pos_emb": nrm(T, D)}
    for i in range(cfg["layers"]):
        p[f"layers.{i}.ln1"] = torch.ones(D)
        p[f"layers.{i}.attn.wqkv"] = nrm(3 * D, D, std=D ** -0.5)
        p[f"layers.{i}.attn.wo"] = nrm(D, D, std=D ** -0.5 / math.sqrt(2 * cfg["layers"]))
        p[f"layers.{i}.ln2"] = torch.ones(D)
        p[f"layers.{i}.mlp.w1"] = nrm(Fd, D, std=D ** -0.5)
        p[f"layers.{i}.mlp.w2"] = nrm(D, Fd, std=Fd ** -0.5 / math.sqrt(2 * cfg["layers"]))
    p["ln_f"] = torch.ones(D)
    p["lm_head"] = nrm(V, D, std=D ** -0.5)
    return p


QUANTIZED = ("attn.wqkv", "attn.wo", "mlp.w1", "mlp.w2")


def rmsnorm(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def forward(P, tokens, cfg, lin):
    """Logits of a causal transformer; lin(x, name) applies linear `name`."""
    B, T = tokens.shape
    D, H = cfg["d"], cfg["heads"]
    h = P["tok_emb"][tokens] + P["pos_emb"][:T]
    causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
    for i in range(cfg["layers"]):
        a = rmsnorm(h, P[f"layers.{i}.ln1"])
        qkv = lin(a, f"layers.{i}.attn.wqkv").view(B, T, 3, H, D // H)
        q, k, v = qkv.unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D // H)
        att = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) @ v
        h = h + lin(att.transpose(1, 2).reshape(B, T, D), f"layers.{i}.attn.wo")
        m = rmsnorm(h, P[f"layers.{i}.ln2"])
        h = h + lin(F.gelu(lin(m, f"layers.{i}.mlp.w1")), f"layers.{i}.mlp.w2")
    return lin(rmsnorm(h, P["ln_f"]), "lm_head")


class Arm:
    """One arm's numerics: how its linears compute, forward and backward."""

    def __init__(self, name, P, refresh_stops=None):
        self.name, self.P = name, P
        self.cache, self.refresh_stops, self.updates = {}, refresh_stops, 0

    def refresh(self):
        """The quantized weights from the current masters (after each
        optimizer step; the planted bug stops after N)."""
        if self.refresh_stops is not None and self.updates > self.refresh_stops and self.cache:
            return
        with torch.no_grad():
            self.cache = {n: fake_quant_fp8_block128(bf(self.P[n])) for n in self.P if n.endswith(QUANTIZED)}

    def lin(self, x, name):
        w = self.P[name]
        quant = name.endswith(QUANTIZED)
        if self.name == "native_baseline":
            return Bf16Linear.apply(x, w, None)
        wq = self.cache[name] if quant else None
        if self.name == "under_test":
            return Bf16Linear.apply(x, w, wq)
        # gradient_reference: the visible value, the float32 surrogate's gradient
        with torch.no_grad():
            visible = bf(bf(x) @ (bf(w) if wq is None else wq).t())
        w_ref = STE.apply(w, wq) if quant else w
        surrogate = F.linear(x, w_ref)
        return VisibleWithSurrogate.apply(visible.detach(), surrogate)


SIZES = {
    "tiny": dict(d=64, heads=4, layers=2, ffn=256, n_digits=8, n_values=10, batch=32),
    "small": dict(d=128, heads=4, layers=4, ffn=512, n_digits=12, n_values=16, batch=64),
    "large": dict(d=512, heads=8, layers=8, ffn=2048, n_digits=24, n_values=32, batch=128),
}


def model_cfg(size):
    c = dict(SIZES[size])
    c["vocab"] = c["n_values"] + 2
    c["seq"] = 2 * c["n_digits"] + 2
    return c


def masked_nll(logits, seq, mask):
    labels = seq[:, 1:]
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view(labels.shape)
    m = mask.to(nll.dtype)
    return (nll * m).sum() / m.sum(), int(m.sum().item())


# ---- training ----------------------------------------------------------------------------

FROZEN = ("tok_emb",)  # frozen during SFT (declared in the configs and the step dump)
HALF = (".mlp.w1", ".mlp.w2")  # grad-half: the (expert) MLP weights, whose gradient is halved


_BASES = {}


def base_model(cfg, args, dev):
    """The base checkpoint: float32 language modelling on the task for a few
    steps (seeded by --seed), so SFT starts from weights that already know
    the format and the per-token losses differ. Made once per process for
    each (size, seed, steps, device): runs one after another in one python
    start from copies of the same one."""
    key = (json.dumps(cfg, sort_keys=True), args.seed, args.base_steps, str(dev))
    if key not in _BASES:
        _BASES[key] = _train_base(cfg, args, dev)
    return {k: v.clone() for k, v in _BASES[key].items()}


def _train_base(cfg, args, dev):
    gen = torch.Generator().manual_seed(args.seed)
    P = {k: v.to(dev).requires_grad_(True) for k, v in init_params(cfg, gen).items()}
    opt = torch.optim.AdamW(P.values(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    dgen = torch.Generator().manual_seed(10_000 + args.seed)
    plain = lambda x, n: F.linear(x, P[n])
    for _ in range(args.base_steps):
        seq = make_batch(dgen, cfg["batch"], cfg["n_digits"], cfg["n_values"]).to(dev)
        logits = forward(P, seq[:, :-1], cfg, plain)
        loss = F.cross_entropy(logits.reshape(-1, cfg["vocab"]), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in P.items()}


def optimizer_for(arm, params, args):
    """AdamW as declared; the planted bug runs Adam with L2 in under_test."""
    kw = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=args.wd)
    if arm == "under_test" and args.plant == "adam-l2":
        return torch.optim.Adam(params, **kw)
    return torch.optim.AdamW(params, **kw)


def lr_at(step, args):
    """Linear warm-up over the first 5 steps, then constant."""
    return args.lr * min(1.0, step / 5.0)


def trained_names(arm, P, args):
    """The parameters the optimizer holds: all but the frozen ones, except
    under the frozen-decay bug, which keeps them with a zeroed gradient."""
    if arm == "under_test" and args.plant == "frozen-decay":
        return list(P)
    return [n for n in P if not n.startswith(FROZEN)]


def backward_step(arm, A, P, seq, cfg, args):
    """Loss and gradients of one batch; the planted gradient bugs."""
    shift = arm == "under_test" and args.plant == "mask-shift"
    mask = response_mask(seq, cfg["n_digits"], shift).to(seq.device)
    logits = forward(P, seq[:, :-1], cfg, A.lin)
    loss, ntok = masked_nll(logits, seq, mask)
    for p in P.values():
        p.grad = None
    loss.backward()
    if arm == "under_test" and args.plant == "grad-half":
        for n in P:
            if n.endswith(HALF):
                P[n].grad.mul_(0.5)
    if arm == "under_test" and args.plant == "frozen-decay":
        for n in P:
            if n.startswith(FROZEN):
                P[n].grad = torch.zeros_like(P[n])
    return loss.item(), ntok


def val_nll(A, P, val, cfg):
    with torch.no_grad():
        logits = forward(P, val[:, :-1], cfg, A.lin)
        return masked_nll(logits, val, response_mask(val, cfg["n_digits"]).to(val.device))[0].item()


def run_arm(arm, base, batches, val, cfg, args, dev, snap_at=None):
    """SFT of one arm; returns its per-step records (and, at step snap_at,
    the snapshot the step dump starts from)."""
    P = {k: v.clone().requires_grad_(not k.startswith(FROZEN)) for k, v in base.items()}
    names = trained_names(arm, P, args)
    for n in names:
        P[n].requires_grad_(True)
    refresh = args.plant_arg if (arm == "under_test" and args.plant == "refresh-stops") else None
    A = Arm(arm, P, refresh)
    opt = optimizer_for(arm, [P[n] for n in names], args)
    recs, tokens, clipped, snap = [], 0, 0, None
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        A.refresh()
        seq = batches[step - 1]
        vnll = val_nll(A, P, val, cfg) if step == 1 or step % 10 == 0 else None
        if step == snap_at:
            snap = {"params": {k: v.detach().clone() for k, v in P.items()},
                    "state": {n: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state[P[n]].items()}
                              for n in names if P[n] in opt.state},
                    "lr": lr_at(step, args)}
        loss, ntok = backward_step(arm, A, P, seq, cfg, args)
        grads = [P[n].grad for n in names]
        nonfinite = int(sum((~torch.isfinite(g)).sum().item() for g in grads))
        gn = float(torch.nn.utils.clip_grad_norm_([P[n] for n in names], args.clip))
        clipped += gn > args.clip
        before = [P[n].detach().clone() for n in names]
        opt.step()
        A.updates += 1
        with torch.no_grad():
            sq = sum(((P[n] - b) ** 2).sum().item() for n, b in zip(names, before))
            cnt = sum(b.numel() for b in before)
        tokens += ntok
        r = {"step": step, "tokens": tokens, "loss": loss, "grad_norm": gn, "update_rms": math.sqrt(sq / cnt),
             "clip_ratio": clipped / step, "nonfinite": nonfinite, "lr": lr_at(step, args), "loss_scale": 1.0,
             "tokens_per_s": ntok / max(time.perf_counter() - t0, 1e-9)}
        if vnll is not None:
            r["val_nll"] = vnll
        recs.append(r)
    return recs, snap


# ---- outputs -------------------------------------------------------------------------------

METRICS = ("loss", "val_nll", "grad_norm", "update_rms", "clip_ratio", "nonfinite", "tokens", "lr", "loss_scale", "tokens_per_s")
TB_TAGS = {"loss": "train/loss", "val_nll": "val/nll", "grad_norm": "train/grad_norm", "update_rms": "train/update_rms",
           "clip_ratio": "train/clip_ratio", "nonfinite": "train/nonfinite", "tokens": "train/tokens", "lr": "train/lr",
           "loss_scale": "train/loss_scale", "tokens_per_s": "perf/tokens_per_s"}
MEGATRON = {"loss": "lm loss", "grad_norm": "grad norm", "val_nll": "validation nll", "tokens": "consumed tokens",
            "update_rms": "update rms", "lr": "learning rate"}
HF = {"loss": "loss", "grad_norm": "grad_norm", "lr": "learning_rate", "val_nll": "eval_loss"}


def write_logs(d, recs, formats, new_style):
    os.makedirs(d, exist_ok=True)
    if "jsonl" in formats:  # verl's file logger: {"step": N, "data": {...}}
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            for r in recs:
                f.write(json.dumps({"step": r["step"], "data": {k: v for k, v in r.items() if k != "step"}}) + "\n")
    if "csv" in formats:
        with open(os.path.join(d, "metrics.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=("step",) + METRICS)
            w.writeheader()
            for r in recs:
                w.writerow({k: r.get(k, "") for k in ("step",) + METRICS})
    if "tb" in formats:  # the real tensorboard writer
        from torch.utils.tensorboard import SummaryWriter
        w = SummaryWriter(log_dir=os.path.join(d, "tb"))
        for r in recs:
            for k in METRICS:
                if k in r:
                    w.add_scalar(TB_TAGS[k], r[k], r["step"], new_style=new_style)
        w.close()
    if "hf" in formats:  # Hugging Face Trainer's trainer_state.json
        hist = []
        for r in recs:
            e = {HF[k]: r[k] for k in ("loss", "grad_norm", "lr") if k in r}
            e.update({"step": r["step"], "epoch": r["step"] / len(recs), "num_input_tokens_seen": r["tokens"]})
            hist.append(e)
            if "val_nll" in r:
                hist.append({"eval_loss": r["val_nll"], "step": r["step"], "epoch": r["step"] / len(recs)})
        st = {"best_metric": None, "epoch": 1.0, "global_step": len(recs), "log_history": hist,
              "max_steps": len(recs), "num_train_epochs": 1, "total_flos": 0.0}
        with open(os.path.join(d, "trainer_state.json"), "w") as f:
            json.dump(st, f, indent=2, sort_keys=True)
    if "megatron" in formats:  # Megatron's golden values
        g = {}
        for k, name in MEGATRON.items():
            pts = [(r["step"], r[k]) for r in recs if k in r]
            if pts:
                g[name] = {"start_step": pts[0][0], "end_step": pts[-1][0], "step_interval": 1 if k != "val_nll" else 10,
                           "values": {str(s): v for s, v in pts}}
        with open(os.path.join(d, "golden_values.json"), "w") as f:
            json.dump(g, f, indent=2)


def config_for(arm, args, cfg, base_sha):
    """What the arm's trainer declares: every controlled variable."""
    prec = {"under_test": {"forward": "fp8_block128 weights, bf16 activations", "backward": "bf16 STE, dX from dequantized"},
            "gradient_reference": {"forward": "fp8_block128 weights, bf16 activations", "backward": "float32 reference (bridge)"},
            "native_baseline": {"forward": "bf16", "backward": "bf16"}}[arm]
    return {
        "run": {"name": f"proxy_sft/{arm}", "seed": args.seed, "recompute": "none"},
        "model": {"init_sha256": base_sha, "size": args.size, "frozen": list(FROZEN)},
        "optimizer": {"name": "adamw", "lr": args.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": args.wd,
                      "state": "fresh", "clip_grad_norm": args.clip},
        "schedule": {"name": "linear_warmup_constant", "warmup_steps": 5},
        "data": {"task": f"sort {cfg['n_digits']} digits of {cfg['n_values']}", "seed": args.data_seed, "order": "seeded shuffle",
                 "global_batch": cfg["batch"], "grad_accumulation": 1, "packing": False,
                 "labels_mask": "response and EOS", "loss_normalization": "mean over response tokens"},
        "precision": prec, "loss_scaling": "none",
    }


def write_config(d, arm, conf):
    os.makedirs(d, exist_ok=True)
    if arm == "native_baseline":
        import yaml
        with open(os.path.join(d, "config.yaml"), "w") as f:
            yaml.safe_dump(conf, f, sort_keys=False)
    else:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(conf, f, indent=2)


def bf16_bits(t):
    import numpy as np
    return t.detach().to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)


def step_dump(paths, snap, base, batches, cfg, args, dev, at):
    """The one-step update of under_test and gradient_reference from the
    same parameters and optimizer state (under_test's at step `at`), on the
    same batch, each with its own backward and optimizer."""
    import h5py
    import numpy as np
    files = {}
    for arm in ("under_test", "gradient_reference"):
        P = {k: v.clone().requires_grad_(False) for k, v in snap["params"].items()}
        names = trained_names(arm, P, args)
        for n in names:
            P[n].requires_grad_(True)
        A = Arm(arm, P)
        A.refresh()
        opt = optimizer_for(arm, [P[n] for n in names], args)
        for g in opt.param_groups:
            g["lr"] = snap["lr"]
        for n in names:
            if n in snap["state"]:
                opt.state[P[n]] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in snap["state"][n].items()}
        backward_step(arm, A, P, batches[at - 1], cfg, args)
        grads = {n: P[n].grad.detach().clone() for n in names}
        torch.nn.utils.clip_grad_norm_([P[n] for n in names], args.clip)
        before = {k: v.detach().clone() for k, v in snap["params"].items()}
        opt.step()
        path = paths[0] if len(paths) == 1 else paths[ARMS.index(arm)]
        if path not in files:
            files[path] = h5py.File(path, "w")
            files[path].attrs["qatcheck_step"] = 1
        g = files[path].create_group(arm)
        step_count = 0
        for n in names:
            st = opt.state[P[n]]
            step_count = int(float(st["step"])) - 1 if "step" in st else 0
            break
        g.attrs.update({"optimizer": "adamw", "lr": snap["lr"], "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                        "weight_decay": args.wd, "step": step_count, "max_grad_norm": args.clip, "grad_scale": 1.0})
        g.attrs["frozen"] = [n for n in P if n.startswith(FROZEN)]
        for n, v in before.items():
            g.create_dataset(f"before/{n}", data=v.cpu().numpy())
            g.create_dataset(f"after/{n}", data=P[n].detach().cpu().numpy())
            d = g.create_dataset(f"after_master/{n}", data=bf16_bits(P[n]))
            d.attrs["dtype"] = "bfloat16"
        for n, v in grads.items():
            g.create_dataset(f"grad/{n}", data=v.cpu().numpy())
        for n in names:
            if n in snap["state"]:
                g.create_dataset(f"state/exp_avg/{n}", data=snap["state"][n]["exp_avg"].cpu().numpy())
                g.create_dataset(f"state/exp_avg_sq/{n}", data=snap["state"][n]["exp_avg_sq"].cpu().numpy())
    for f in files.values():
        f.close()


def selftest():
    """The e4m3 rounding against ml_dtypes (and torch's own cast where it
    has one), on every e4m3 value, the midpoints between them and random
    values."""
    import numpy as np
    import ml_dtypes
    codes = np.arange(256, dtype=np.uint8)
    vals = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    vals = np.unique(vals[np.isfinite(vals)])
    mids = (vals[1:] + vals[:-1]) / 2
    rnd = np.random.default_rng(0).uniform(-448, 448, 200000).astype(np.float32)
    tiny = np.random.default_rng(1).uniform(-0.02, 0.02, 200000).astype(np.float32)
    x = np.concatenate([vals, mids, rnd, tiny]).astype(np.float32)
    ours = round_e4m3(torch.from_numpy(x)).numpy()
    ref = x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    bad = int((ours != ref).sum())
    print(f"e4m3 rounding: {x.size} values, {bad} differ from ml_dtypes")
    if hasattr(torch, "float8_e4m3fn"):
        tc = torch.from_numpy(x).to(torch.float8_e4m3fn).float().numpy()
        bad_t = int((ours != tc).sum())
        print(f"e4m3 rounding: {bad_t} differ from torch's cast")
        bad += bad_t
    return 0 if bad == 0 else 1


def main(argv=None):
    """One run from a command line (argv: its arguments; None: sys.argv's).
    Every run seeds its own generators: runs one after another in one
    process (tests/e2e/sft_proxy.sh, one import of torch) write what
    separate processes write."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="output folder (one subfolder per arm)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--base-steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0, help="initial weights and base model")
    ap.add_argument("--data-seed", type=int, default=1, help="the SFT data and its order")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--plant", default="none", help="none, grad-half, refresh-stops=N, mask-shift, adam-l2, frozen-decay")
    ap.add_argument("--arms", default=",".join(ARMS), help="the arms to run (comma-separated)")
    ap.add_argument("--formats", default="jsonl,csv,tb,hf,megatron", help="log formats each arm writes")
    ap.add_argument("--step-dump", default=None, help="write the one-step update dump (HDF5) here; two comma-separated paths split the arms")
    ap.add_argument("--step-at", type=int, default=4, help="the step the dump starts from (its optimizer state has step-1 updates)")
    ap.add_argument("--selftest", action="store_true", help="check the e4m3 rounding against ml_dtypes and exit")
    args = ap.parse_args(argv)
    if args.selftest:
        return selftest()
    if not args.out:
        ap.error("--out is required")
    plants = {"none", "grad-half", "refresh-stops", "mask-shift", "adam-l2", "frozen-decay"}
    name, _, arg = args.plant.partition("=")
    if name not in plants or (name == "refresh-stops") != bool(arg):
        ap.error(f"--plant {args.plant}: expected one of none, grad-half, refresh-stops=N, mask-shift, adam-l2, frozen-decay")
    args.plant, args.plant_arg = name, int(arg) if arg else None
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    cfg = model_cfg(args.size)
    t0 = time.perf_counter()
    base = base_model(cfg, args, dev)
    sha = hashlib.sha256(b"".join(base[k].cpu().numpy().tobytes() for k in sorted(base))).hexdigest()
    dgen = torch.Generator().manual_seed(args.data_seed)
    batches = [make_batch(dgen, cfg["batch"], cfg["n_digits"], cfg["n_values"]).to(dev) for _ in range(args.steps)]
    val = make_batch(torch.Generator().manual_seed(99_999), 256, cfg["n_digits"], cfg["n_values"]).to(dev)
    formats = set(args.formats.split(","))
    arms = [a for a in args.arms.split(",") if a]
    snap = None
    for arm in arms:
        if arm not in ARMS:
            ap.error(f"--arms: '{arm}' is not one of {', '.join(ARMS)}")
        at = args.step_at if (args.step_dump and arm == "under_test") else None
        recs, s = run_arm(arm, base, batches, val, cfg, args, dev, snap_at=at)
        snap = s or snap
        d = os.path.join(args.out, arm)
        write_logs(d, recs, formats, new_style=(arm == "native_baseline"))
        write_config(d, arm, config_for(arm, args, cfg, sha))
        last = recs[-1]
        print(f"{arm:20s} loss {recs[0]['loss']:.4f} -> {last['loss']:.4f}  grad_norm {recs[0]['grad_norm']:.4f}  "
              f"val_nll {last.get('val_nll', float('nan')):.4f}")
    if args.step_dump:
        if snap is None:
            ap.error("--step-dump needs the under_test arm")
        step_dump(args.step_dump.split(","), snap, base, batches, cfg, args, dev, args.step_at)
    print(f"proxy_sft: {len(arms)} arm(s) x {args.steps} steps in {time.perf_counter() - t0:.1f} s ({args.size}, {args.device})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
