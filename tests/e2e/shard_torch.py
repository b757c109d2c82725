#!/usr/bin/python3
"""shard_torch.py: a tensor-, sequence-, vocab-, expert-parallel and FSDP
step under torch.distributed (gloo, CPU, WORLD processes), dumped per rank with
scripts/qatdump.py, once correct and once per planted reduction bug.

    shard_torch.py OUTDIR

writes OUTDIR/<mode>/step.rank<r>.h5 for every mode:
  ok          Megatron-style layers, every reduction right
  missing     column-parallel d_x: the backward all-reduce left out
  twice       column-parallel d_x: all-reduced twice (WORLD times the sum)
  averaged    column-parallel d_x: all-reduced and divided by WORLD
  order       column-parallel d_weight: ranks 0 and 1 take each other's
              chunk of the gathered output's gradient
  sp_norm     sequence-parallel RMSNorm d_weight: the all-reduce over the
              sequence shards left out
  vocab_lse   vocab-parallel log-prob: each rank normalizes by its own
              shard's sum-exp (the all-reduce of the sum left out)
  ep_div      expert parallel: the expert gradients divided by the EP size
              (the expert-DP to DP scaling ratio applied to the gradient)
  ep_mul      expert parallel: ... multiplied by the EP size
  ep_reduce   expert parallel: the dispatch's backward (the combine's
              gradient flowing back to the tokens' ranks) not reduce-
              scattered: each rank's d_x holds its own experts' share only
  ep_order    expert parallel: the dispatch's backward hands ranks 0 and 1
              each other's token piece
  fsdp_sum    FSDP: the weight gradient summed over the ranks, not averaged
  fsdp_local  FSDP: the reduce-scatter left out (this rank's local
              gradient's flat piece)
  fsdp_order  FSDP: ranks 0 and 1 take each other's flat piece
  a2a_dup     expert parallel, all-to-all dispatch: the permutation's
              backward stores each slot's gradient into its token instead
              of adding it (every token keeps one of its TOPK slots' share)
Modules: /col (linear, tp_column, gather_output), /row (linear, tp_row,
input_is_parallel), /norm (rmsnorm, sequence), /logprob (logprob, vocab),
/moe (moe, expert: data-parallel tokens, E/WORLD experts a rank, all-gather
dispatch, reduce-scatter combine), /moe_a2a (the same experts and pieces,
all-to-all dispatch: each slot's row only to its expert's rank), /fsdp
(linear, fsdp_flat: FSDP1-style flat weight shards, gradients averaged over
the ranks).
"""
import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 4
MODES = ["ok", "missing", "twice", "averaged", "order", "sp_norm", "vocab_lse", "ep_div", "ep_mul", "ep_reduce",
         "ep_order", "fsdp_sum", "fsdp_local", "fsdp_order", "a2a_dup"]
M, K, N, V = 8, 32, 48, 64  # tokens, features in, features out, vocabulary
T, H, F, E, TOPK = 16, 16, 8, 8, 2  # moe: tokens, hidden, expert width, experts, slots a token
N2, K2 = 13, 11  # fsdp linear: 143 weight elements, not a multiple of WORLD (the last piece is padded)
BUG = "ok"


def chunk(t, dim, r):
    return t.chunk(WORLD, dim)[r].contiguous()


class CopyToTP(torch.autograd.Function):
    """Identity forward; backward all-reduces the input gradient (each rank
    holds the partial sum over its output features)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        if BUG == "missing":
            return g
        dist.all_reduce(g)
        if BUG == "twice":
            dist.all_reduce(g)
        if BUG == "averaged":
            g /= WORLD
        return g


class GatherFromTP(torch.autograd.Function):
    """All-gather along the last dimension; backward takes this rank's chunk."""

    @staticmethod
    def forward(ctx, y):
        parts = [torch.empty_like(y) for _ in range(WORLD)]
        dist.all_gather(parts, y.contiguous())
        return torch.cat(parts, -1)

    @staticmethod
    def backward(ctx, g):
        r = dist.get_rank()
        if BUG == "order" and r in (0, 1):
            r = 1 - r  # the shard order of ranks 0 and 1 swapped
        return chunk(g, -1, r)


class ColumnParallelLinear(torch.nn.Module):
    qatcheck_class = "linear"
    qatcheck_parallel = "tp_column"
    qatcheck_shard = {"outputs/y": None, "grad_out/dy": None}  # gather_output: y and dY whole

    def __init__(self, w, b):
        super().__init__()
        r = dist.get_rank()
        self.weight = torch.nn.Parameter(chunk(w, 0, r))
        self.bias = torch.nn.Parameter(chunk(b, 0, r))

    def forward(self, x):
        return GatherFromTP.apply(torch.nn.functional.linear(CopyToTP.apply(x), self.weight, self.bias))


class RowParallelLinear(torch.nn.Module):
    qatcheck_class = "linear"
    qatcheck_parallel = "tp_row"

    def __init__(self, w):
        super().__init__()
        self.weight = torch.nn.Parameter(chunk(w, 1, dist.get_rank()))

    def forward(self, x):  # x: this rank's input features
        y = torch.nn.functional.linear(x, self.weight)
        return AllReduceSum.apply(y)


class AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y):
        y = y.clone()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, g):
        return g


class SPRMSNorm(torch.nn.Module):
    """RMSNorm on this rank's tokens (sequence parallel); the weight's
    gradient must be all-reduced over the sequence shards."""
    qatcheck_class = "rmsnorm"
    qatcheck_parallel = "sequence"
    qatcheck_shard = {"inputs/x": 0, "outputs/y": 0, "grad_out/dy": 0}
    qatcheck_contract = {"eps": 1e-6}

    def __init__(self, w):
        super().__init__()
        self.weight = torch.nn.Parameter(w.clone())
        if BUG != "sp_norm":
            self.weight.register_hook(self._reduce)

    @staticmethod
    def _reduce(g):
        g = g.clone()
        dist.all_reduce(g)
        return g

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class VocabParallelLogProbFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, ids, lo):
        zmax = z.max(-1).values
        dist.all_reduce(zmax, op=dist.ReduceOp.MAX)
        e = torch.exp(z - zmax[:, None])
        s = e.sum(-1)
        if BUG != "vocab_lse":
            dist.all_reduce(s)
        lse = zmax + torch.log(s)
        local = ids - lo
        inside = (local >= 0) & (local < z.shape[-1])
        zid = torch.where(inside, z.gather(-1, local.clamp(0, z.shape[-1] - 1)[:, None])[:, 0], torch.zeros_like(lse))
        dist.all_reduce(zid)
        ctx.save_for_backward(ids, z, lse)
        ctx.lo = lo
        return zid - lse

    @staticmethod
    def backward(ctx, g):
        ids, z, lse = ctx.saved_tensors
        p = torch.exp(z - lse[:, None])
        local = ids - ctx.lo
        onehot = torch.zeros_like(z)
        inside = (local >= 0) & (local < z.shape[-1])
        onehot[inside, local[inside]] = 1
        return g[:, None] * (onehot - p), None, None


class VocabParallelLogProb(torch.nn.Module):
    qatcheck_class = "logprob"
    qatcheck_parallel = "vocab"
    qatcheck_inputs = ["logits"]
    qatcheck_saved = ["token_ids"]  # what the reference needs of what the Function saved

    def __init__(self, ids):
        super().__init__()
        self.ids = ids
        self.lo = dist.get_rank() * (V // WORLD)

    def forward(self, logits):  # this rank's vocabulary slice
        return VocabParallelLogProbFn.apply(logits, self.ids, self.lo)


class Dispatch(torch.autograd.Function):
    """Expert-parallel dispatch (all-gather): every rank gets every rank's
    tokens; backward reduce-scatters the tokens' gradients (the sum of the
    ranks' experts' contributions, this rank's token piece)."""

    @staticmethod
    def forward(ctx, t):
        parts = [torch.empty_like(t) for _ in range(WORLD)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, 0)

    @staticmethod
    def backward(ctx, g):
        r = dist.get_rank()
        if BUG == "ep_reduce":
            return chunk(g, 0, r)  # this rank's experts' share only
        g = g.clone()
        dist.all_reduce(g)
        if BUG == "ep_order" and r in (0, 1):
            r = 1 - r
        return chunk(g, 0, r)


class Combine(torch.autograd.Function):
    """Expert-parallel combine (reduce-scatter): the ranks' partial outputs
    summed, this rank's tokens kept; backward all-gathers the tokens'
    gradients. Saves the routing (as an unpermute does)."""

    @staticmethod
    def forward(ctx, y, ids):
        ctx.save_for_backward(ids)
        y = y.clone()
        dist.all_reduce(y)
        return chunk(y, 0, dist.get_rank())

    @staticmethod
    def backward(ctx, g):
        parts = [torch.empty_like(g) for _ in range(WORLD)]
        dist.all_gather(parts, g.contiguous())
        return torch.cat(parts, 0), None


class EPMoE(torch.nn.Module):
    """Routed experts, expert parallel with data-parallel tokens: this rank
    holds its tokens (x, topk_weights, topk_ids with global expert ids) and
    experts [r*E/WORLD, (r+1)*E/WORLD) of w1 [E, 2F, H], w2 [E, H, F]."""
    qatcheck_class = "moe"
    qatcheck_parallel = "expert"
    qatcheck_inputs = ["x", "topk_weights"]
    qatcheck_saved = ["topk_ids"]
    qatcheck_contract = {"activation": "swiglu"}

    def __init__(self, w1, w2, ids, planted=True):
        super().__init__()
        r = dist.get_rank()
        self.w1 = torch.nn.Parameter(chunk(w1, 0, r))
        self.w2 = torch.nn.Parameter(chunk(w2, 0, r))
        self.ids = chunk(ids, 0, r)
        self.e0 = r * (E // WORLD)
        scale = {"ep_div": 1.0 / WORLD, "ep_mul": float(WORLD)}.get(BUG)
        if scale and planted:  # the expert-DP to DP scaling ratio applied to the gradient itself
            for p in (self.w1, self.w2):
                p.register_hook(lambda g, s=scale: g * s)

    def forward(self, x, topk_weights):
        xa, wa = Dispatch.apply(x), Dispatch.apply(topk_weights)
        parts = [torch.empty_like(self.ids) for _ in range(WORLD)]
        dist.all_gather(parts, self.ids)
        ida = torch.cat(parts, 0)
        y = torch.zeros_like(xa)
        for le in range(self.w1.shape[0]):
            gate = (wa * (ida == self.e0 + le)).sum(-1)  # [T]: the expert's weight per token (0: not routed)
            h = xa @ self.w1[le].t()
            a = torch.nn.functional.silu(h[:, :F]) * h[:, F:]
            y = y + gate[:, None] * (a @ self.w2[le].t())
        return Combine.apply(y, self.ids)


class AllToAll(torch.autograd.Function):
    """Rows to their ranks (send[r] of them to rank r, recv[r] from rank r),
    as an all-to-all token dispatcher sends them; backward sends the rows'
    gradients back the reverse way."""

    @staticmethod
    def forward(ctx, t, send, recv):
        ctx.send, ctx.recv = send, recv
        out = t.new_empty((sum(recv),) + tuple(t.shape[1:]))
        dist.all_to_all_single(out, t.contiguous(), recv, send)
        return out

    @staticmethod
    def backward(ctx, g):
        out = g.new_empty((sum(ctx.send),) + tuple(g.shape[1:]))
        dist.all_to_all_single(out, g.contiguous(), ctx.send, ctx.recv)
        return out, None, None


class Permute(torch.autograd.Function):
    """A token's row once per slot, in dispatch order; backward adds each
    slot's gradient back into its token."""

    @staticmethod
    def forward(ctx, x, idx):
        ctx.save_for_backward(idx)
        ctx.n = x.shape[0]
        return x[idx]

    @staticmethod
    def backward(ctx, g):
        idx, = ctx.saved_tensors
        out = g.new_zeros((ctx.n,) + tuple(g.shape[1:]))
        if BUG == "a2a_dup":
            out[idx] = g  # a plain store: a token keeps one of its slots' gradients
        else:
            out.index_add_(0, idx, g)
        return out, None


class Unpermute(torch.autograd.Function):
    """The slots' outputs summed back into token order; saves the routing
    (first, for qatdump's saved topk_ids)."""

    @staticmethod
    def forward(ctx, yp, idx, ids, n):
        ctx.save_for_backward(ids, idx)
        return yp.new_zeros((n,) + tuple(yp.shape[1:])).index_add_(0, idx, yp)

    @staticmethod
    def backward(ctx, g):
        _, idx = ctx.saved_tensors
        return g[idx], None, None, None


class EPMoEAllToAll(EPMoE):
    """The same routed experts and pieces as EPMoE, dispatched by
    all-to-all as DeepEP / Megatron's alltoall dispatcher do: each (token,
    slot) row goes only to the rank holding its expert, with its slot
    weight, and comes back weighted to be summed into its token."""

    def forward(self, x, topk_weights):
        n = x.shape[0]
        tok = torch.arange(n).repeat_interleave(TOPK)  # slot -> its token
        eid = self.ids.reshape(-1)
        dest = eid // (E // WORLD)
        order = torch.sort(dest, stable=True)[1]
        send = torch.bincount(dest, minlength=WORLD)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        send, recv = send.tolist(), recv.tolist()
        xs = AllToAll.apply(Permute.apply(x, tok[order]), send, recv)
        ws = AllToAll.apply(topk_weights.reshape(-1)[order], send, recv)
        es = eid.new_empty(sum(recv))
        dist.all_to_all_single(es, eid[order].contiguous(), recv, send)
        y = xs.new_zeros(xs.shape)
        for le in range(self.w1.shape[0]):
            sel = (es == self.e0 + le).nonzero()[:, 0]
            h = xs[sel] @ self.w1[le].t()
            a = torch.nn.functional.silu(h[:, :F]) * h[:, F:]
            y = y.index_add(0, sel, ws[sel, None] * (a @ self.w2[le].t()))
        return Unpermute.apply(AllToAll.apply(y, recv, send), tok[order], self.ids, n)


class AllGatherFlat(torch.autograd.Function):
    """FSDP1-style unshard: all-gather the ranks' flat pieces; backward
    reduce-scatters the flat gradient, averaged over the ranks."""

    @staticmethod
    def forward(ctx, p):
        parts = [torch.empty_like(p) for _ in range(WORLD)]
        dist.all_gather(parts, p.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, g):
        r = dist.get_rank()
        g = g.clone()
        if BUG != "fsdp_local":
            dist.all_reduce(g)
            if BUG != "fsdp_sum":
                g /= WORLD
        if BUG == "fsdp_order" and r in (0, 1):
            r = 1 - r
        return chunk(g, 0, r)


class FlatShardedLinear(torch.nn.Module):
    """A linear whose weight [N2, K2] is held as FSDP1 holds a FlatParameter:
    flattened row-major, zero-padded to a multiple of WORLD, rank r keeping
    flat piece r; tokens data-parallel."""
    qatcheck_class = "linear"
    qatcheck_parallel = "fsdp_flat"
    qatcheck_grad_reduce = "mean"
    qatcheck_shard = {"params/weight": ("fsdp_flat", (N2, K2))}

    def __init__(self, w):
        super().__init__()
        L = -(-w.numel() // WORLD)
        flat = torch.nn.functional.pad(w.reshape(-1), (0, L * WORLD - w.numel()))
        self.weight = torch.nn.Parameter(chunk(flat, 0, dist.get_rank()))
        self.shape = tuple(w.shape)

    def forward(self, x):
        n = self.shape[0] * self.shape[1]
        return torch.nn.functional.linear(x, AllGatherFlat.apply(self.weight)[:n].view(self.shape))


def run(rank, out):
    global BUG
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "rendezvous"), rank=rank,
                            world_size=WORLD)
    import qatdump
    for mode in MODES:
        BUG = mode
        g = torch.Generator().manual_seed(7)  # the same whole tensors on every rank
        x = torch.randn(M, K, generator=g)
        w1, b1 = torch.randn(N, K, generator=g) / K ** 0.5, torch.randn(N, generator=g)
        w2 = torch.randn(K, N, generator=g) / N ** 0.5
        wn = 1 + 0.1 * torch.randn(K, generator=g)
        logits = torch.randn(M, V, generator=g)
        ids = torch.randint(0, V, (M,), generator=g)
        x2, x3 = torch.randn(M, N, generator=g), torch.randn(M, K, generator=g)
        c1, c2, c3, c4 = (torch.randn(*sh, generator=g) for sh in ((M, N), (M, K), (M, K), (M,)))
        xe, we = torch.randn(T, H, generator=g), torch.rand(T, TOPK, generator=g)
        ide = torch.randint(0, E, (T, TOPK), generator=g)
        ide[1::5, 1] = ide[1::5, 0]  # a token routed twice to one expert
        e1, e2 = torch.randn(E, 2 * F, H, generator=g) / H ** 0.5, torch.randn(E, H, F, generator=g) / F ** 0.5
        wf, xf = torch.randn(N2, K2, generator=g) / K2 ** 0.5, torch.randn(M, K2, generator=g)
        c5, c6 = torch.randn(T, H, generator=g), torch.randn(M, N2, generator=g)
        model = torch.nn.ModuleDict({"col": ColumnParallelLinear(w1, b1), "row": RowParallelLinear(w2),
                                     "norm": SPRMSNorm(wn), "logprob": VocabParallelLogProb(ids),
                                     "moe": EPMoE(e1, e2, ide), "fsdp": FlatShardedLinear(wf),
                                     "moe_a2a": EPMoEAllToAll(e1, e2, ide, planted=False)})
        os.makedirs(os.path.join(out, mode), exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the Function's other saved tensors are not recorded: said in not_captured
            with qatdump.attach(model, os.path.join(out, mode, "step.rank{rank}.h5")):
                # every module's dY is the same on every rank where its output is whole
                y = model["col"](x.clone().requires_grad_(True))                    # [M, N], gathered
                h = model["row"](chunk(x2, -1, rank).requires_grad_(True))          # [M, K], reduced
                hn = model["norm"](chunk(x3, 0, rank).requires_grad_(True))         # this rank's tokens
                lp = model["logprob"](chunk(logits, -1, rank).requires_grad_(True))  # [M], combined
                ye = model["moe"](chunk(xe, 0, rank).requires_grad_(True), chunk(we, 0, rank).requires_grad_(True))
                yf = model["fsdp"](chunk(xf, 0, rank).requires_grad_(True))  # this rank's tokens
                ya = model["moe_a2a"](chunk(xe, 0, rank).requires_grad_(True), chunk(we, 0, rank).requires_grad_(True))
                loss = (y * c1).sum() + (h * c2).sum() + (hn * chunk(c3, 0, rank)).sum() + (lp * c4).sum()
                loss = loss + (ye * chunk(c5, 0, rank)).sum() + (yf * chunk(c6, 0, rank)).sum() + (ya * chunk(c5, 0, rank)).sum()
                loss.backward()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    mp.spawn(run, args=(out,), nprocs=WORLD, join=True)
