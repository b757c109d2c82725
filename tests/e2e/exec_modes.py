"""exec_modes.py: the models of tests/e2e/exec_modes.sh and cuda_graph.sh.
One training step of a small model dumped by scripts/qatdump.py under an
execution mode, correct or with a planted defect, beside the eager dump of
the same step (docs/qatdump.md "Execution modes").

usage: exec_modes.py OUT.h5 MODE [VARIANT]
       exec_modes.py OUT.h5:MODE[:VARIANT]...   (several steps, one process)
  eager [plain|bf16]          the plain step (the whole batch, one backward);
                              plain: without the quantizer (grad_accum's eager);
                              bf16: plain, the forward under torch.autocast
                              (CPU, bfloat16): bf16-valued gradients of the
                              float32 parameters
  recompute ok|nonreentrant|reseed|rescale
                              the block under torch.utils.checkpoint (reentrant;
                              nonreentrant: use_reentrant=False); reseed:
                              the recompute draws a new stochastic-rounding
                              seed; rescale: a delayed-scaling amax history
                              advanced by the recompute (another scale)
  autocast ok                 the forward under torch.autocast (CPU, bfloat16)
  grad_accum ok|zero_grad|double_scale|bf16|bf16_zero_grad|bf16_double_scale
                              2 micro-batches; zero_grad: .grad cleared at
                              each micro-batch (the first one is dropped);
                              double_scale: the loss divided by 2 twice;
                              bf16: each micro-batch's forward under
                              torch.autocast (CPU, bfloat16), its bf16-valued
                              gradients summed in the float32 .grad;
                              bf16_zero_grad, bf16_double_scale: bf16 with
                              zero_grad's, double_scale's bug
  tied ok|storage|repeat
                              a weight used at two sites (enc, dec); storage:
                              dec holds its own Parameter over enc's storage
                              (its gradient never reaches enc's .grad);
                              repeat: one linear (lin) called twice
  cuda_eager / cuda_graph ok|stale
                              on the GPU; stale: the step's batch rebinds the
                              static input instead of copying into it
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import torch  # noqa: E402

import qatdump  # noqa: E402

MODE = VARIANT = None  # the step's, set by step()
K, N, B, S = 32, 48, 4, 8  # features in, hidden, sequences, tokens each: 32 tokens


class Quant(torch.nn.Module):
    """Fake-quantizes activations to a 4-bit grid with stochastic rounding:
    scale = amax / 7 (delayed scaling: the amax of the previous forward),
    noise from a generator seeded per step. Not audited: it feeds fc1."""

    def __init__(self):
        super().__init__()
        self.history = [3.0]   # the amax of the previous step
        self.seed, self.draws = 1234, 0

    def forward(self, x):
        if MODE in ("grad_accum", "cuda_eager", "cuda_graph") or VARIANT in ("plain", "bf16"):
            return x  # draws that depend on the batch's shape, a host sync: not the subject there
        amax = float(x.detach().abs().max())
        scale = self.history[-1] / 7.0
        if VARIANT == "rescale":
            self.history.append(amax)  # the bug: the recompute advances the history again
        seed = self.seed + (self.draws if VARIANT == "reseed" else 0)
        self.draws += 1
        g = torch.Generator().manual_seed(seed)
        u = torch.rand(x.shape, generator=g)
        q = torch.clamp(torch.floor(x.detach() / scale + u), -8, 7) * scale
        return x + (q - x).detach()  # straight-through


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = Quant()
        self.fc1 = torch.nn.Linear(K, N)
        self.fc2 = torch.nn.Linear(N, K)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(self.quant(x))))


class Twice(torch.nn.Module):
    """One linear applied twice: its weight is used at two sites."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(K, K)

    def forward(self, x):
        return self.lin(torch.tanh(self.lin(x)))


class Tied(torch.nn.Module):
    def __init__(self, storage_bug):
        super().__init__()
        self.enc = torch.nn.Linear(K, K)
        self.dec = torch.nn.Linear(K, K)
        self.dec.weight = torch.nn.Parameter(self.enc.weight.data) if storage_bug else self.enc.weight

    def forward(self, x):
        return self.dec(torch.tanh(self.enc(x)))


def data(device="cpu"):
    g = torch.Generator().manual_seed(7)
    return torch.randn(B, S, K, generator=g).to(device)


def loss_of(y):
    return (y.float() ** 2).mean()


def step(OUT, mode, variant):
    """Dump one step of MODE / VARIANT into OUT; 77 when it needs a GPU and there is none."""
    global MODE, VARIANT
    MODE, VARIANT = mode, variant
    torch.manual_seed(0)
    if MODE == "tied":
        model = Twice() if VARIANT == "repeat" else Tied(VARIANT == "storage")
        with qatdump.attach(model, OUT, modules=r"^(enc|dec|lin)$", mode="tied"):
            loss_of(model(data())).backward()
        return 0

    if MODE in ("cuda_eager", "cuda_graph"):
        if not torch.cuda.is_available():
            print("skip: no CUDA device for torch")
            return 77
        model = Block().cuda()
        x = data("cuda")
        if MODE == "cuda_eager":
            with qatdump.attach(model, OUT, modules=r"^fc[12]$"):
                loss_of(model(x)).backward()
            return 0
        static_x = torch.zeros_like(x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up before capture, as torch asks
            for _ in range(3):
                model.zero_grad(set_to_none=True)
                loss_of(model(static_x)).backward()
        torch.cuda.current_stream().wait_stream(s)
        model.zero_grad(set_to_none=True)
        model.quant.draws = 0
        d = qatdump.attach(model, OUT, modules=r"^fc[12]$", mode="cuda_graph")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss_of(model(static_x)).backward()
        if VARIANT == "stale":
            static_x = x.clone()   # the bug: a new tensor, the graph still reads the old one
        else:
            static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        d.write()
        d.detach()
        return 0

    model = Block()
    x = data()
    if MODE == "eager":
        with qatdump.attach(model, OUT, modules=r"^fc[12]$"):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=VARIANT == "bf16"):
                y = model(x)
            loss_of(y).backward()
    elif MODE == "recompute":
        from torch.utils.checkpoint import checkpoint
        with qatdump.attach(model, OUT, modules=r"^fc[12]$", mode="recompute"):
            xin = x.clone().requires_grad_(True)
            loss_of(checkpoint(model, xin, use_reentrant=VARIANT != "nonreentrant")).backward()
    elif MODE == "autocast":
        with qatdump.attach(model, OUT, modules=r"^fc[12]$", mode="autocast"):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = model(x)
            loss_of(y).backward()
    elif MODE == "grad_accum":
        n = 2
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with qatdump.attach(model, OUT, modules=r"^fc[12]$", mode="grad_accum"):
            for mb in x.chunk(n):
                if VARIANT in ("zero_grad", "bf16_zero_grad"):
                    opt.zero_grad()  # the bug: clears what the earlier micro-batches accumulated
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=VARIANT.startswith("bf16")):
                    y = model(mb)
                loss = loss_of(y) / n
                if VARIANT in ("double_scale", "bf16_double_scale"):
                    loss = loss / n  # the bug: the mean over micro-batches taken twice
                loss.backward()
        opt.step()
    else:
        raise SystemExit("unknown mode %s" % MODE)
    return 0


if __name__ == "__main__":
    runs = [a.split(":") for a in sys.argv[1:]] if ":" in sys.argv[1] else [sys.argv[1:]]
    for r in runs:
        rc = step(r[0], r[1], r[2] if len(r) > 2 else "ok")
        if rc:
            sys.exit(rc)
