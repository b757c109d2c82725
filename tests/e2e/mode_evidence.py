"""mode_evidence.py: the reproductions of tests/e2e/mode_evidence.sh.
Each is a correct (or planted) execution-mode dump of tests/e2e/exec_modes.py
with a piece of its evidence, or of the eager dump's, taken away or added
with h5py (docs/robustness.md, "Execution modes"): before, qatcheck
compared less than the dumps hold and passed.

usage: mode_evidence.py DIR
  DIR holds exec_modes.py's eager.h5, plain.h5, recompute_ok.h5,
  grad_accum_ok.h5, grad_accum_zero_grad.h5, tied_storage.h5; each
  reproduction is written beside them as DIR/<name>.h5.
"""
import shutil
import sys

import h5py

D = sys.argv[1]


def copy(src, name):
    """DIR/src.h5 copied to DIR/name.h5, opened for editing."""
    shutil.copy("%s/%s.h5" % (D, src), "%s/%s.h5" % (D, name))
    return h5py.File("%s/%s.h5" % (D, name), "a")


def empty(g):
    """Every child of group g deleted (its attributes stay)."""
    for k in list(g):
        del g[k]


# grad_accum: an accumulated group emptied (the comparison used to run over its datasets: none)
with copy("grad_accum_ok", "accum_empty") as f:
    empty(f["qatcheck_mode/accumulated/fc1"])
# grad_accum: an accumulated group without d_bias (that accumulation was never compared)
with copy("grad_accum_ok", "accum_no_bias") as f:
    del f["qatcheck_mode/accumulated/fc1/d_bias"]
# grad_accum zero_grad: micro-batch 0's parameter gradients gone (summed as zero, the dropped micro-batch passed)
with copy("grad_accum_zero_grad", "accum_mb_no_grad") as f:
    for mod in ("fc1", "fc2"):
        for dy in f["microbatch0/%s/grads" % mod]:
            for p in ("d_weight", "d_bias"):
                del f["microbatch0/%s/grads/%s/%s" % (mod, dy, p)]
# grad_accum: micro-batch 1 renumbered 2 (a gap: micro-batch 2 was never summed)
with copy("grad_accum_ok", "accum_gap") as f:
    f.move("microbatch1", "microbatch2")
# grad_accum zero_grad with its evidence but no root `mode`: the planted defect passed
with copy("grad_accum_zero_grad", "accum_no_mode") as f:
    del f.attrs["mode"]
# the same with mode "eager" written out
with copy("grad_accum_zero_grad", "accum_mode_eager") as f:
    f.attrs["mode"] = "eager"
# --eager dumps whose module groups are empty, or lack grads/
with copy("eager", "eager_empty") as f:
    for mod in ("fc1", "fc2"):
        empty(f[mod])
with copy("eager", "eager_no_grads") as f:
    for mod in ("fc1", "fc2"):
        del f[mod + "/grads"]
# an --eager dump that holds a mode's evidence
with copy("eager", "eager_with_evidence") as f:
    f.copy(h5py.File("%s/grad_accum_ok.h5" % D, "r")["qatcheck_mode"], "qatcheck_mode")
# an --eager dump with a module the recompute dump lacks (fc2: never compared)
with copy("recompute_ok", "recompute_no_fc2") as f:
    del f["fc2"]
    del f["qatcheck_mode/first_forward/fc2"]
# a recompute dump whose fc1 lacks grads/ (a failed check "missing" before, a refusal now)
with copy("recompute_ok", "recompute_no_grads") as f:
    del f["fc1/grads"]
# recompute: the first forward of fc1 emptied (nothing compared with it)
with copy("recompute_ok", "recompute_ff_empty") as f:
    empty(f["qatcheck_mode/first_forward/fc1"])
# tied storage (the second site's share lost) with that site's share gone too: it passed
with copy("tied_storage", "tied_site_no_grad") as f:
    for dy in f["dec/grads"]:
        del f["dec/grads/%s/d_weight" % dy]
# tied: sites that name no module, on a tie named after a selected module (refused, never skipped)
with copy("tied_storage", "tied_bad_sites") as f:
    f["qatcheck_mode/tied/enc.weight"].attrs["sites"] = "[1, 2]"
