#!/usr/bin/python3
"""fsdp_real.py: real FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel,
use_orig_params=False) on WORLD CPU processes over gloo, a two-layer MLP of
linears each wrapped on its own (two bias-free, the last with a bias), every rank with its own tokens;
after one backward each rank writes its dump with FSDP's own bytes: the
FlatParameter's local piece (the weight, flattened row-major and padded by
FSDP) and its .grad (reduce-scattered, averaged by FSDP), the tokens' x and
dY and d_x from hooks.

    fsdp_real.py OUTDIR

writes OUTDIR/step.rank<r>.h5 (format: docs/interfaces.md 2c: shard_flat,
grad_reduce mean, tokens along shard_dim 0); the same step dumped by
scripts/qatdump.py (its FSDP1 path) in OUTDIR/q/, and once more after rank
1's first-layer gradient was doubled (planted) in OUTDIR/p/. Exits 77 where this torch has
no FSDP1 that runs on the CPU (Debian's 1.13 under Python 3.11 cannot
import it)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))

try:
    import h5py
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
except Exception as e:  # noqa: BLE001 (any import failure means: no FSDP1 here)
    print("skip: no FSDP1 here (%s)" % e)
    sys.exit(77)
import qatdump  # noqa: E402

WORLD = 4
T, H, F = 6, 9, 11  # tokens per rank; 11 x 9 = 99 and 9 x 11 = 99 elements: pieces of 25, the last padded by 1


def worker(rank, out, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)  # the same initial weights on every rank
    l1, l2 = torch.nn.Linear(H, F, bias=False), torch.nn.Linear(F, H, bias=False)
    l3 = torch.nn.Linear(H, 5)  # weight and bias in one FlatParameter: qatdump cuts it per tensor
    shapes = {"fc1": tuple(l1.weight.shape), "fc2": tuple(l2.weight.shape)}
    f1 = FSDP(l1, device_id=torch.device("cpu"), use_orig_params=False)
    f2 = FSDP(l2, device_id=torch.device("cpu"), use_orig_params=False)
    f3 = FSDP(l3, device_id=torch.device("cpu"), use_orig_params=False)
    torch.manual_seed(1000 + rank)  # this rank's own tokens
    x = torch.randn(T, H, requires_grad=True)
    seen = {}

    def keep(name):
        def hook(mod, inp, out):
            xin = inp[0]
            if not xin.requires_grad:
                xin.requires_grad_(True)
            seen[name + "/x"] = xin.detach().clone()
            xin.register_hook(lambda g: seen.__setitem__(name + "/d_x", g.detach().clone()))
            out.register_hook(lambda g: seen.__setitem__(name + "/dy", g.detach().clone()))
        return hook

    l1.register_forward_hook(keep("fc1"))
    l2.register_forward_hook(keep("fc2"))
    model = torch.nn.Sequential(f1, torch.nn.ReLU(), f2, torch.nn.ReLU(), f3)
    dumper = qatdump.attach(model)  # the helper too: nn.Linear under FSDP1 -> groups /0, /2 and /4
    y = model(x)
    (y.square().sum() * 0.5 + y.sum()).backward()
    dumper.write(os.path.join(out, "q", "step.rank{rank}.h5"))
    if rank == 1:  # planted: rank 1's flat gradient doubled after the reduce-scatter (a loss scale left on)
        f1._flat_param.grad.mul_(2)
    dumper.write(os.path.join(out, "p", "step.rank{rank}.h5"))
    if rank == 1:
        f1._flat_param.grad.div_(2)
    dumper.detach()
    path = os.path.join(out, "step.rank%d.h5" % rank)
    with h5py.File(path, "w") as f:
        f.attrs["qatcheck_dump"] = np.int64(1)
        f.attrs["rank"], f.attrs["world_size"] = np.int64(rank), np.int64(WORLD)
        for name, fs in (("fc1", f1), ("fc2", f2)):
            fp = fs._flat_param  # after backward: this rank's piece, FSDP's own padding
            assert fp.numel() == -(-int(np.prod(shapes[name])) // WORLD), (fp.shape, shapes[name])
            g = f.create_group(name)
            g.attrs["class"], g.attrs["parallel"], g.attrs["grad_reduce"] = "linear", "fsdp_flat", "mean"
            for role, key in (("inputs", "x"), ("grad_out", "dy")):
                qatdump.write_tensor(g.require_group(role), key, seen[name + "/" + key])
                g[role + "/" + key].attrs["shard_dim"] = np.int64(0)
            qatdump.write_tensor(g.require_group("params"), "weight", fp.detach())
            g["params/weight"].attrs["shard_flat"] = "[%d, %d]" % shapes[name]
            gg = g.require_group("grads/dy")
            qatdump.write_tensor(gg, "d_x", seen[name + "/d_x"])
            qatdump.write_tensor(gg, "d_weight", fp.grad.detach())
    fsdp2(rank, out)
    dist.barrier()
    dist.destroy_process_group()


def fsdp2(rank, out):
    """The same kind of step under FSDP2 (fully_shard on a CPU mesh): each
    parameter a DTensor sharded along dimension 0 (torch.chunk's uneven
    pieces), dumped by qatdump into OUTDIR/f2/ and, after rank 2's first
    weight gradient was doubled (planted), into OUTDIR/f2p/."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        return  # torch < 2.4: no FSDP2 (the shell script says so)
    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(0)
    a, b = torch.nn.Linear(H, F), torch.nn.Linear(F, 7, bias=False)  # rows 11 and 7: pieces 3,3,3,2 and 2,2,2,1
    model = torch.nn.Sequential(a, torch.nn.ReLU(), b)
    fully_shard(a, mesh=mesh)
    fully_shard(b, mesh=mesh)
    dumper = qatdump.attach(model)
    torch.manual_seed(2000 + rank)
    y = model(torch.randn(T, H))
    (y.square().sum() * 0.5 + y.sum()).backward()
    dumper.write(os.path.join(out, "f2", "step.rank{rank}.h5"))
    if rank == 2:
        a.weight.grad.to_local().mul_(2)
    dumper.write(os.path.join(out, "f2p", "step.rank{rank}.h5"))
    dumper.detach()


if __name__ == "__main__":
    out = sys.argv[1]
    for d in ("", "q", "p", "f2", "f2p"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    mp.spawn(worker, args=(out, 29600 + os.getpid() % 1000), nprocs=WORLD, join=True)
    print("fsdp_real: wrote %d rank files to %s (torch %s)" % (WORLD, out, torch.__version__))
