#!/usr/bin/python3
"""qatdump_sr.py OUT_DIR: qatdump's SR identity (docs/numerics.md,
"Stochastic rounding"). A module whose qatcheck_contract rounds the weight
stochastically gets sr_salt = its weight Parameter's name from
named_parameters(): a weight tied at enc and dec is "enc.weight" at both;
dec with its own Parameter (over enc's storage) is "dec.weight"; an
sr_salt the module declares is kept; a contract without SR gets none."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import h5py  # noqa: E402
import torch  # noqa: E402
import qatdump  # noqa: E402

K = 16
SR = {"weight_format": "fp8_channel", "rounding": {"sr": {"seed": 3}}, "sr_step": 12}


class Tied(torch.nn.Module):
    def __init__(self, own):
        super().__init__()
        self.enc = torch.nn.Linear(K, K)
        self.dec = torch.nn.Linear(K, K)
        self.dec.weight = torch.nn.Parameter(self.enc.weight.data) if own else self.enc.weight
        self.lin = torch.nn.Linear(K, K)

    def forward(self, x):
        return self.lin(self.dec(torch.tanh(self.enc(x))))


def contracts(own, declared):
    torch.manual_seed(0)
    m = Tied(own)
    m.enc.qatcheck_contract = dict(SR)
    m.dec.qatcheck_contract = dict(SR, sr_salt="shared.w") if declared else dict(SR)
    m.lin.qatcheck_contract = {"weight_format": "fp8_channel"}
    out = os.path.join(sys.argv[1], "d%d%d.h5" % (own, declared))
    with qatdump.attach(m, out, modules=r"^(enc|dec|lin)$", mode="eager" if own else "tied"):
        (m(torch.randn(3, K)) ** 2).mean().backward()
    with h5py.File(out, "r") as f:
        return {k: json.loads(f[k].attrs["contract"]) for k in ("enc", "dec", "lin")}


c = contracts(0, 0)
assert c["enc"]["sr_salt"] == "enc.weight" and c["dec"]["sr_salt"] == "enc.weight", c
assert c["dec"]["sr_step"] == 12 and "sr_salt" not in c["lin"], c
c = contracts(1, 0)
assert c["enc"]["sr_salt"] == "enc.weight" and c["dec"]["sr_salt"] == "dec.weight", c
c = contracts(0, 1)
assert c["enc"]["sr_salt"] == "enc.weight" and c["dec"]["sr_salt"] == "shared.w", c
print("ok")
