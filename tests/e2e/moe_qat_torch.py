#!/usr/bin/python3
"""moe_qat_torch.py OUT.h5: a torch model with two fused routed-experts
modules under expert QAT (fp8_block128 experts, fp8_group128 activations),
run for one step under scripts/qatdump.py (tests/e2e/moe_qat_torch.sh).

Each module's autograd Function is a trainer's FP8 forward / BF16 backward:
it quantizes every expert's w1[e], w2[e] with the independent oracle
(scripts/conformance/quant_oracle.py: the deployed bytes, saved as uint8,
as torch < 2.1 must), runs the forward on the dequantized experts and the
quantized rows, saves the ids, the FC1 output and the bytes, and returns
in backward the contract's gradients (scripts/make_moe_qat_dump.py's
float64 math): /ok as the contract says, /dx_master with expert 2's
backward through its master weights."""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "conformance"))
import bf16  # noqa: E402
import make_moe_qat_dump as G  # noqa: E402
import qatdump  # noqa: E402

T, H, F, E, K = G.T, G.H, G.F, G.E, G.K
WF, AF = "fp8_block128", "fp8_group128"


class ExpertsFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, wt, w1, w2, mod):
        X, Wt = x.detach().numpy(), wt.detach().numpy()
        y, fc1, _ = G.moe(X, mod.d1, mod.d2, mod.d1, mod.d2, mod.ids, Wt, np.zeros((T, H), np.float32), AF)
        ctx.mod, ctx.X, ctx.Wt = mod, X, Wt
        ctx.save_for_backward(torch.from_numpy(mod.ids), torch.from_numpy(fc1.astype(np.float32)),
                              torch.from_numpy(mod.q1), torch.from_numpy(mod.s1), torch.from_numpy(mod.q2), torch.from_numpy(mod.s2))
        return torch.from_numpy(y.astype(np.float32))

    @staticmethod
    def backward(ctx, gy):
        m = ctx.mod
        master = {2: (m.w1.detach().double().numpy(), m.w2.detach().double().numpy())} if m.planted else None
        _, _, d = G.moe(ctx.X, m.d1, m.d2, m.d1, m.d2, m.ids, ctx.Wt, gy.numpy(), AF, master_e=master)
        f = lambda n: torch.from_numpy(d[n].astype(np.float32))
        return f("d_x"), f("d_topk_weights"), f("d_w1"), f("d_w2"), None


class FP8Experts(torch.nn.Module):
    qatcheck_class = "moe"
    qatcheck_inputs = ["x", "topk_weights"]
    qatcheck_saved = ["topk_ids", "fc1_out", "w1_q", "w1_scale_inv", "w2_q", "w2_scale_inv"]
    qatcheck_contract = {"activation": "swiglu", "expert_weight_format": WF, "expert_act_format": AF, "profile": "vllm"}

    def __init__(self, w1, w2, ids, planted):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.from_numpy(w1))
        self.w2 = torch.nn.Parameter(torch.from_numpy(w2))
        self.ids, self.planted = ids, planted
        self.q1, self.s1, _, self.d1 = G.quant_experts(WF, w1)
        self.q2, self.s2, _, self.d2 = G.quant_experts(WF, w2)
        self.s1, self.s2 = self.s1.astype(np.float32), self.s2.astype(np.float32)

    def forward(self, x, topk_weights):
        return ExpertsFn.apply(x, topk_weights, self.w1, self.w2, self)


class Model(torch.nn.Module):
    def __init__(self, rng):
        super().__init__()
        mk = lambda shape, s: bf16.round_((s * rng.standard_normal(shape)).astype(np.float32))
        ids = np.stack([rng.permutation([e for e in range(E) if e != G.EMPTY])[:K] for _ in range(T)]).astype(np.int64)
        ids[1::4, 1] = ids[1::4, 0]  # a token routed twice to one expert; expert 3 empty
        self.ok = FP8Experts(mk((E, 2 * F, H), 2 / np.sqrt(H)), mk((E, H, F), 1 / np.sqrt(F)), ids, False)
        self.dx_master = FP8Experts(mk((E, 2 * F, H), 2 / np.sqrt(H)), mk((E, H, F), 1 / np.sqrt(F)), ids, True)

    def forward(self, x, wt):
        return self.ok(x, wt) + self.dx_master(x, wt)


def main():
    rng = np.random.default_rng(11)
    model = Model(rng)
    x = torch.from_numpy(bf16.round_(rng.standard_normal((T, H)).astype(np.float32))).requires_grad_()
    wt = torch.from_numpy(rng.random((T, K)).astype(np.float32)).requires_grad_()
    r = torch.from_numpy(bf16.round_(rng.standard_normal((T, H)).astype(np.float32)))
    with qatdump.attach(model, sys.argv[1], modules=r"^(ok|dx_master)$", classes={FP8Experts: "moe"}):
        loss = (model(x, wt) * r).sum()
        loss.backward()


if __name__ == "__main__":
    main()
