"""qatdump_experts.py: the model of tests/e2e/qatdump_experts.sh. Routed
experts as separate MLPs of nn.Linear (the Mixtral / DeepSeek loop of
transformers: an expert no token is routed to is not called), the routing
fixed: sequence 0's tokens go to experts 0 and 1, sequence 1's to 1 and 3;
expert 2 receives no token, and over the two micro-batches of grad_accum
(a sequence each) expert 3 runs in micro-batch 1 only.

usage: qatdump_experts.py OUT.h5:MODE[:VARIANT]...
  MODE     eager | grad_accum
  VARIANT  ok | idle_grad (the planted defect: the trainer leaves a
           gradient in the idle expert 2's gate_proj.weight, as a stale
           or padded expert-parallel buffer would) | grad_before (correct: the
           idle expert's .grad holds an earlier step's gradient before
           attach(), which the step leaves as it is)
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import torch  # noqa: E402

import qatdump  # noqa: E402

B, S, H, F, E = 2, 4, 16, 8, 4
SELECT = r"^experts\.\d+\.(gate|up|down)_proj$"


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = torch.nn.Linear(H, F, bias=False)
        self.up_proj = torch.nn.Linear(H, F, bias=False)
        self.down_proj = torch.nn.Linear(F, H, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Moe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(H, E, bias=False)
        self.experts = torch.nn.ModuleList(Mlp() for _ in range(E))

    def forward(self, x, seq_ids):
        b, s, _ = x.shape
        xt = x.reshape(-1, H)
        seq = seq_ids.repeat_interleave(s)
        ids = torch.where(seq[:, None] == 0, torch.tensor([0, 1]), torch.tensor([1, 3]))
        w = self.gate(xt).softmax(-1).gather(1, ids)
        out = torch.zeros_like(xt)
        for e in range(E):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue  # as transformers' loops: an expert without a token is not called
            out = out.index_add(0, tok, self.experts[e](xt[tok]) * w[tok, slot][:, None])
        return out.view(b, s, H)


def step(out, mode, variant):
    torch.manual_seed(0)
    model = Moe()
    x = torch.randn(B, S, H, generator=torch.Generator().manual_seed(7))
    seqs = torch.arange(B)
    if variant == "grad_before":
        p = model.experts[2].gate_proj.weight
        p.grad = 1e-3 * torch.randn_like(p)
    d = qatdump.attach(model, out, modules=SELECT, mode=mode)
    if mode == "eager":
        (model(x, seqs) ** 2).mean().backward()
    else:
        for mb, sid in zip(x.chunk(2), seqs.chunk(2)):
            ((model(mb, sid) ** 2).mean() / 2).backward()
    if variant == "idle_grad":  # the defect: an idle expert's .grad is not left alone
        p = model.experts[2].gate_proj.weight
        p.grad = 1e-3 * torch.randn_like(p)
    d.write()
    d.detach()


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        parts = arg.split(":")
        step(parts[0], parts[1], parts[2] if len(parts) > 2 else "ok")
