#!/bin/sh
# step_derived.sh: `qatcheck step` judges an update no tolerance is declared
# for at bounds derived from the optimizer's float32 arithmetic and the
# precision of `after` (docs/layer3.md, "Derived bounds"). One real
# torch.optim.AdamW step (float32 parameters, after 3 earlier steps so its
# moments are non-trivial, weight decay, clipping) and one SGD step with
# momentum, dumped as the trainer made them: every update passes its derived
# bound; the same updates scaled by 1.001 (a 0.1% systematic error) fail on
# every parameter; an update whose `after` is stored in bfloat16 passes at
# the coarser bound its type allows; a declared tolerance still wins.
. "$(dirname "$0")/lib.inc"
have_py "$PY" torch h5py || { echo "skip: python3 lacks torch or h5py"; exit 77; }
json_is() { $PY -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1" 2>/dev/null; }
$PY - "$T" <<'P' || { bad "writing the step dumps"; finish; }
import sys
import h5py
import numpy as np
import torch
out = sys.argv[1]
torch.manual_seed(3)
def model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
def loss_of(m, i):
    g = torch.Generator().manual_seed(100 + i)
    x = torch.randn(64, 16, generator=g)
    return (m(x) ** 2).mean()
def bf16_bits(t):
    return (t.detach().to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
def dump(path, kind, scale=1.0, after_bf16=False):
    m = model()
    if kind == "adamw":
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    else:
        opt = torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9, weight_decay=0.01)
    for i in range(3):
        opt.zero_grad(); loss_of(m, i).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step()
    opt.zero_grad(); loss_of(m, 3).backward()
    names = dict(m.named_parameters())
    before = {n: p.detach().clone() for n, p in names.items()}
    grads = {n: p.grad.detach().clone() for n, p in names.items()}
    state = {n: {k: v.detach().clone() for k, v in opt.state[p].items() if torch.is_tensor(v) and v.dim() > 0} for n, p in names.items()}
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step()
    with h5py.File(path, "w") as f:
        f.attrs["qatcheck_step"] = 1
        g = f.create_group("under_test")
        g.attrs["optimizer"] = kind
        g.attrs["lr"] = opt.param_groups[0]["lr"]
        g.attrs["weight_decay"] = opt.param_groups[0]["weight_decay"]
        g.attrs["max_grad_norm"] = 1.0
        g.attrs["grad_scale"] = 1.0
        if kind == "adamw":
            g.attrs["beta1"], g.attrs["beta2"] = opt.param_groups[0]["betas"]
            g.attrs["eps"] = opt.param_groups[0]["eps"]
        else:
            g.attrs["momentum"] = opt.param_groups[0]["momentum"]
        g.attrs["step"] = 3
        for n, p in names.items():
            after = before[n] + (p.detach() - before[n]) * scale if scale != 1.0 else p.detach()
            g[f"before/{n}"] = before[n].numpy()
            g[f"grad/{n}"] = grads[n].numpy()
            if after_bf16:
                d = g.create_dataset(f"after/{n}", data=bf16_bits(after))
                d.attrs["dtype"] = "bfloat16"
            else:
                g[f"after/{n}"] = after.numpy()
            for k, v in state[n].items():
                g[f"state/{k}/{n}"] = v.numpy()
for kind in ("adamw", "sgd"):
    dump(f"{out}/{kind}.h5", kind)
    dump(f"{out}/{kind}_x1001.h5", kind, scale=1.001)
P
# before in float32 and after in bfloat16 cannot be one optimizer's values:
# a bf16 run's before is bf16 too (its own after, an earlier step)
$PY - "$T" <<'P' || { bad "writing the bfloat16 dump"; finish; }
import sys
import h5py
import numpy as np
import torch
out = sys.argv[1]
def bf(t): return t.to(torch.bfloat16)
def bits(t): return t.view(torch.int16).numpy().view(np.uint16)
torch.manual_seed(4)
p = torch.nn.Parameter(bf(torch.randn(32, 16)))
opt = torch.optim.AdamW([p], lr=1e-2, weight_decay=0.1)
for i in range(4):
    opt.zero_grad(); (p.float() ** 2).sum().backward()
    if i == 3:
        before, grad = p.detach().clone(), p.grad.detach().clone()
        st = {k: v.detach().clone() for k, v in opt.state[p].items() if v.dim() > 0}
    opt.step()
with h5py.File(f"{out}/bf16.h5", "w") as f:
    f.attrs["qatcheck_step"] = 1
    g = f.create_group("under_test")
    for k, v in (("optimizer", "adamw"), ("lr", 1e-2), ("weight_decay", 0.1), ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-8), ("step", 3)):
        g.attrs[k] = v
    for name, t in (("before/w", before), ("grad/w", grad), ("after/w", p.detach()), ("state/exp_avg/w", st["exp_avg"]), ("state/exp_avg_sq/w", st["exp_avg_sq"])):
        d = g.create_dataset(name, data=bits(t))
        d.attrs["dtype"] = "bfloat16"
P
for k in adamw adamw_x1001 sgd sgd_x1001 bf16; do echo "{\"dump\": \"$k.h5\"}" >"$T/$k.json"; done
for k in adamw sgd; do
  expect_exit 0 "$k: a correct step passes its derived bounds" "$QATCHECK" step --case "$T/$k.json" --json "$T/$k.r.json"
  json_is "$T/$k.r.json" "all(c['verdict'] == 'pass' and c['tolerance']['reasoning'].startswith('derived:') for c in r['checks'] if c['kind'] == 'update') and sum(c['kind'] == 'update' for c in r['checks']) == 4" \
    && ok "$k: every update judged (4), each at a derived bound" || bad "$k: $(cat "$T/$k.r.json" | head -60)"
  expect_exit 1 "$k: updates x 1.001 fail their derived bounds" "$QATCHECK" step --case "$T/${k}_x1001.json" --json "$T/$k.x.json"
  json_is "$T/$k.x.json" "sum(c['verdict'] == 'fail' for c in r['checks'] if c['kind'] == 'update') == 4" \
    && ok "$k: x 1.001 fails on every parameter" || bad "$k x 1.001: not every update failed"
done
expect_exit 0 "bfloat16 parameters: a correct step passes" "$QATCHECK" step --case "$T/bf16.json" --json "$T/bf16.r.json"
json_is "$T/bf16.r.json" "'bfloat16' in [c for c in r['checks'] if c['kind'] == 'update'][0]['tolerance']['reasoning']" \
  && ok "bfloat16: the derived bound names bfloat16 arithmetic" || bad "bfloat16: $(grep reasoning "$T/bf16.r.json")"
# a declared tolerance wins over the derived one
echo '{"dump": "adamw_x1001.h5", "tolerances": {"update": {"rel_l2": 0.01, "reasoning": "a loose bound on purpose"}}}' >"$T/decl.json"
expect_exit 0 "a declared update tolerance is used instead of the derived one" "$QATCHECK" step --case "$T/decl.json"
finish
