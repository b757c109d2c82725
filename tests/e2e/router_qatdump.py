"""router_qatdump.py OUT.h5: a noaux_tc router whose correction bias is a
buffer (as transformers' DeepseekV3TopkRouter registers
e_score_correction_bias), dumped by scripts/qatdump.py in one training
step (tests/e2e/router_select.sh). The dump must hold the bias
(params/e_score_correction_bias, frozen): without it qatcheck could not
recompute the selection."""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 3)[0] + "/scripts")
import qatdump  # noqa: E402


class _Keep(torch.autograd.Function):
    """Identity on the weights whose node saves the selected ids."""

    @staticmethod
    def forward(ctx, w, ids):
        ctx.save_for_backward(ids)
        return w.clone()

    @staticmethod
    def backward(ctx, g):
        return g, None


class NoauxRouter(torch.nn.Module):
    qatcheck_inputs = ["logits"]
    qatcheck_saved = ["topk_ids"]

    def __init__(self, E=32, k=4, ng=4, tg=2, scale=2.5):
        super().__init__()
        self.k, self.ng, self.tg, self.scale = k, ng, tg, scale
        self.register_buffer("e_score_correction_bias", 0.1 * torch.randn(E))
        self.qatcheck_contract = {"score": "sigmoid", "normalize": "yes", "route_scale": scale, "n_group": ng,
                                  "topk_group": tg}

    def forward(self, logits):
        s = logits.sigmoid()
        key = s.detach() + self.e_score_correction_bias
        E = key.shape[-1]
        gs = key.view(-1, self.ng, E // self.ng).topk(2, dim=-1)[0].sum(-1)
        keep = torch.zeros_like(gs).scatter_(1, gs.topk(self.tg, dim=-1)[1], 1).bool()
        key = key.masked_fill(~keep.repeat_interleave(E // self.ng, dim=1), float("-inf"))
        ids = key.topk(self.k, dim=-1)[1]
        w = s.gather(1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * self.scale
        return _Keep.apply(w, ids)


torch.manual_seed(3)
r = NoauxRouter()
logits = torch.randn(40, 32, requires_grad=True)
with qatdump.attach(r, sys.argv[1], modules=r"^$", classes={NoauxRouter: "router"}):
    y = r(logits)
    (y * torch.randn_like(y)).sum().backward()
