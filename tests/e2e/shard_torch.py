#!/usr/bin/python3
"""shard_torch.py: a tensor-, sequence- and vocab-parallel step under
torch.distributed (gloo, CPU, WORLD processes), dumped per rank with
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
Modules: /col (linear, tp_column, gather_output), /row (linear, tp_row,
input_is_parallel), /norm (rmsnorm, sequence), /logprob (logprob, vocab).
"""
import os
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 4
MODES = ["ok", "missing", "twice", "averaged", "order", "sp_norm", "vocab_lse"]
M, K, N, V = 8, 32, 48, 64  # tokens, features in, features out, vocabulary
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
        model = torch.nn.ModuleDict({"col": ColumnParallelLinear(w1, b1), "row": RowParallelLinear(w2),
                                     "norm": SPRMSNorm(wn), "logprob": VocabParallelLogProb(ids)})
        os.makedirs(os.path.join(out, mode), exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the Function's other saved tensors are not recorded: said in not_captured
            with qatdump.attach(model, os.path.join(out, mode, "step.rank{rank}.h5")):
                # every module's dY is the same on every rank where its output is whole
                y = model["col"](x.clone().requires_grad_(True))                    # [M, N], gathered
                h = model["row"](chunk(x2, -1, rank).requires_grad_(True))          # [M, K], reduced
                hn = model["norm"](chunk(x3, 0, rank).requires_grad_(True))         # this rank's tokens
                lp = model["logprob"](chunk(logits, -1, rank).requires_grad_(True))  # [M], combined
                loss = (y * c1).sum() + (h * c2).sum() + (hn * chunk(c3, 0, rank)).sum() + (lp * c4).sum()
                loss.backward()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    mp.spawn(run, args=(out,), nprocs=WORLD, join=True)
