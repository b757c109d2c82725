#!/usr/bin/python3
"""qatdump: dump a PyTorch model's modules for `qatcheck vjp` (docs/qatdump.md).

One call wraps the model; one training step's forward and backward run as
usual; the dump is written before the optimizer step:

    import qatdump
    with qatdump.attach(model, "step.h5", modules=r"mlp\\.", classes={MyLinear: "linear"}):
        loss = model(batch).loss
        loss.backward()
    optimizer.step()

Per selected module the dump holds (docs/interfaces.md section 2):
  inputs/<x>          what the forward received (as it received it)
  params/<name>       the master parameters, as they were at the forward
                      (and the buffers BUFFER_DEFAULTS or the module's
                      `qatcheck_buffers` name, frozen: a router's bias)
  saved/<name>        tensors the module's autograd Function saved, when the
                      module names them (attribute `qatcheck_saved`, one
                      name a saved tensor in order; None leaves it out)
  outputs/<y>         the visible forward output
  grad_out/<dy>       the dY its backward received, in the dtype it received
  grads/<dy>/d_<n>    the gradients its production backward produced: input
                      gradients from this module alone (not summed with other
                      consumers of the same input), parameter gradients from
                      this backward alone (hooks on the parameter, before
                      accumulation into .grad, before any optimizer scaling)
Attributes: `class` on each module group, `contract` (JSON) when the module
has a `qatcheck_contract` dict (one that rounds the weight stochastically,
"rounding": {"sr": ...}, gets sr_salt = the weight Parameter's name from
model.named_parameters() unless it names one: a tied weight's sites share
it), `frozen` = "1" on a params/ dataset whose
parameter does not require grad (and no d_ gradient is written for it),
`not_captured` (a JSON list of strings) naming what the helper saw but could
not record (non-tensor arguments, tensors inside lists, non-tensor outputs,
uint8 tensors of unknown element type), each also raised as a warning,
`autocast` on each module group: "off", or the dtype torch.autocast ran in
when the module was called ("mixed" when its calls differ),
`cpu_bf16_gemm_acc` on a module group called on the CPU in bf16 (a bf16
input or parameter, or CPU autocast to bf16): "float32" or "bfloat16", how
this torch accumulates bf16 GEMMs on this CPU (measured once: torch 1.13
accumulates them in bf16 on CPUs without AVX-512; qatcheck refuses, as
cannot judge, a class that multiplies matrices there). Each tensor is
written in the dtype it had (bfloat16 and float8 with a `dtype` attribute).

Sharded runs (tensor, vocab, sequence, expert parallel or FSDP flat shards;
docs/interfaces.md "Sharded dumps"): under torch.distributed every rank
writes its own file (a "{rank}" in the path is replaced by the rank) with
root attributes `rank` and `world_size`; a module declares
`qatcheck_parallel` (tp_column, tp_row, vocab, sequence, expert, fsdp_flat:
written as the group's `parallel` attribute) and which of its datasets hold
this rank's piece along which dimension, `qatcheck_shard = {"params/weight":
0, "grad_out/dy": -1}` (written as each dataset's integer `shard_dim`
attribute; the defaults of SHARD_DEFAULTS are filled in: the linear class's
tp_column / tp_row / sequence / fsdp_flat, the logprob class's vocab, the
moe class's expert). A parameter held as an FSDP1 flat shard (the tensor
flattened, zero-padded to a multiple of the world size, this rank's equal
piece) is declared `{"params/weight": ("fsdp_flat", (N, K))}` with the
whole tensor's shape (written as its `shard_flat` attribute). A module
whose parameter gradients the trainer averages over the ranks declares
`qatcheck_grad_reduce = "mean"` (the group's `grad_reduce`; the default is
a sum). Every other dataset must be the same on every rank.

Execution modes (docs/qatdump.md "Execution modes"): attach(..., mode=)
records the step as it ran under activation recompute ("recompute": the
recomputed forward in the module group, the first one under
/qatcheck_mode/first_forward), autocast ("autocast": its device and dtype
as root attributes), a CUDA Graph capture and replay ("cuda_graph": the
hooks' records are replayed with the graph; write() after replay()),
micro-batch accumulation ("grad_accum": /microbatch<k>/<module> per
micro-batch, each parameter's accumulated .grad under
/qatcheck_mode/accumulated) or a tied parameter ("tied": each site's share
through a private alias of the parameter, the accumulated gradient and the
sites under /qatcheck_mode/tied); the root attribute `mode` names it
("eager" by default). `qatcheck vjp --eager EAGER.h5` judges it against
the eager dump of the same step.

Where the copies are kept: by default every tensor the helper records
(inputs, parameters as at the forward, saved tensors, outputs, dY and
gradients) is cloned on its own device until write(). With
attach(..., host_copies=True) each is copied to host memory the moment it
is recorded (one synchronous device-to-host copy per tensor), so the
device holds only what the step itself holds: a whole model's parameter
snapshot and gradient clones would otherwise double its parameters and
gradients there (a large MoE layer's experts). The dump is the same, byte
for byte; the host then holds about the dump's size until write(). Not
under mode cuda_graph (no host copy inside a capture).

Tensor arguments are recorded whether passed by position or by keyword
(`lin(x=x)`): the call is bound to the forward's signature. float8 tensors
get their `dtype` attribute; on torch < 2.1 (no float8 dtypes) uint8 bytes
get it from the module's `qatcheck_dtypes` ({dataset name: dtype}) or, for
saved/weight_q and saved/weight_scale, from its contract's weight_format (a
moe's saved/w1_q, w1_scale, w2_q, w2_scale: its expert_weight_format).

Guards against the false differences of the method (they raise QatDumpError
with the module's name): a module called more than once in the step (its
parameter gradients sum over the calls; unless mode recompute, grad_accum or
tied says why), a parameter shared with another module (its gradient sums
over the users; unless mode tied), an FSDP2-managed parameter that
is not a DTensor (an unsharded compute copy: cannot tell it from the
master; FSDP1's FlatParameters are read whole and cut per parameter, see
docs/qatdump.md "FSDP1"), a DTensor parameter's gradient (reduce-scattered across ranks, not
this rank's VJP), an output that received no gradient.

A linear that never ran while a sibling of the same shapes did (an expert
no token was routed to: experts.3 beside experts.0), or, under grad_accum,
skipped a micro-batch, is written as an empty call (no token; its
parameter gradients what the step added to .grad, zero per micro-batch),
which `qatcheck vjp` checks against the zero VJP (docs/qatdump.md "Empty
and late experts"). A gradient hook receiving None (torch 2, where a
backward returns no gradient) stores nothing, as torch 1.13's uncalled hook
does; write() names the input or parameter in `not_captured`. Runs under
torch 1.13 and torch 2.x alike (docs/qatdump.md "torch 2").
"""
import inspect
import json
import os
import re
import sys
import warnings

try:
    import h5py
    import numpy as np
    import torch
    import torch.utils.checkpoint
except ImportError as _e:  # the wrong interpreter: say which one has them
    raise ImportError("qatdump needs torch, h5py and numpy (%s); on Debian they are installed for /usr/bin/python3 "
                      "(scripts/install-deps.sh): run your training script with /usr/bin/python3, or install them "
                      "for %s" % (_e, sys.executable)) from _e

__all__ = ["attach", "Dumper", "QatDumpError", "write_tensor", "DEFAULT_CLASSES", "SHARD_DEFAULTS", "MODES"]

# The execution modes a step can be captured under (the root attribute
# `mode`; docs/qatdump.md "Execution modes"): what each one changes in the
# dump is said at Dumper.
MODES = ("eager", "recompute", "autocast", "cuda_graph", "grad_accum", "tied")
# the root group of the evidence a mode adds beside the module groups
MODE_GROUP = "qatcheck_mode"

# The pieces a rank holds under each parallel layout, by class: dataset ->
# the dimension it is split along (docs/interfaces.md "Sharded dumps").
# Datasets not named are whole on every rank (their gradients are whole too:
# the trainer's all-reduce completes them).
SHARD_DEFAULTS = {
    ("linear", "tp_column"): {"params/weight": 0, "params/bias": 0, "outputs/y": -1, "grad_out/dy": -1},
    ("linear", "tp_row"): {"params/weight": 1, "inputs/x": -1},
    ("linear", "sequence"): {"inputs/x": 0, "outputs/y": 0, "grad_out/dy": 0},
    ("linear", "fsdp_flat"): {"inputs/x": 0, "outputs/y": 0, "grad_out/dy": 0},  # the weight: declare its shape
    ("logprob", "vocab"): {"inputs/logits": -1},
    # data-parallel tokens, E / world experts a rank (global expert ids in topk_ids)
    ("moe", "expert"): {"inputs/x": 0, "inputs/topk_weights": 0, "saved/topk_weights": 0, "saved/topk_ids": 0,
                        "params/w1": 0, "params/w2": 0, "outputs/y": 0, "grad_out/dy": 0},
}
# moe under expert QAT: each expert's deployed bytes are the rank's experts' (global expert ids)
for _p in ("w1", "w2"):
    for _s in ("_q", "_scale", "_scale_inv", "_scale_2", "_global_scale"):
        SHARD_DEFAULTS[("moe", "expert")]["saved/" + _p + _s] = 0
PARALLEL_KINDS = ("tp_column", "tp_row", "vocab", "expert", "sequence", "fsdp_flat", "fsdp")
GRAD_REDUCE = ("sum", "mean")


# torch >= 2.1: a non-reentrant checkpoint hands each saved tensor out once
# per backward (a second read raises CheckpointError) and stops its
# recompute as soon as the backward's tensors are rebuilt (early stop);
# torch 1.13's reads them any number of times and recomputes the whole block
_UNPACK_ONCE = hasattr(torch.utils.checkpoint, "CheckpointError")


def _saved_hooks_active():
    """Whether saved-tensor hooks pack what an autograd Function saves now
    (inside a non-reentrant checkpoint's forward or its recompute): then
    reading ctx.saved_tensors is an unpack. True where torch cannot say."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return True
    try:
        return top(False) is not None
    except TypeError:
        return top() is not None


class QatDumpError(RuntimeError):
    """A dump that would mislead qatcheck; the message names the module."""


# torch module classes qatcheck knows without being told
DEFAULT_CLASSES = {torch.nn.Linear: "linear"}

# Buffers dumped as frozen params/<name>, by class: a router's selection bias
# is a buffer in transformers (DeepseekV3TopkRouter.e_score_correction_bias)
# and selects the experts, so qatcheck needs it to judge saved/topk_ids. A
# module names others in `qatcheck_buffers`; a router's other buffers are
# noted in `not_captured`, never silently left out.
BUFFER_DEFAULTS = {"router": ("bias", "e_score_correction_bias")}

_FLOAT8 = {}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
    if hasattr(torch, _name):
        _FLOAT8[getattr(torch, _name)] = _name
_FP4 = getattr(torch, "float4_e2m1fn_x2", None)


# element types a uint8 tensor may declare (torch < 2.1 has no float8 dtypes)
BYTE_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float4_e2m1fn_x2")

# what a contract's weight_format deploys: {dataset: dtype} for saved/
_DEPLOYED = {"nvfp4": {"weight_q": "float4_e2m1fn_x2", "weight_scale": "float8_e4m3fn"},
             "mxfp4": {"weight_q": "float4_e2m1fn_x2", "weight_scale": "float8_e8m0fnu"},
             "mxfp8": {"weight_q": "float8_e4m3fn", "weight_scale": "float8_e8m0fnu"}}
for _f in ("fp8_tensor", "fp8_channel", "fp8_block128", "fp8_block128_ue8m0"):
    _DEPLOYED[_f] = {"weight_q": "float8_e4m3fn"}


# attention's saved O: its dtype, recorded as the contract's saved_out_dtype
_OUT_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _deployed_dtypes(cls, contract):
    """{saved dataset: dtype} the contract's weight formats deploy (uint8
    bytes on torch < 2.1): a linear's weight_q and weight_scale under
    weight_format; a moe's w1_q, w1_scale, w2_q, w2_scale (each expert's,
    stacked) under expert_weight_format."""
    contract = contract or {}
    if cls == "moe":
        d = _DEPLOYED.get(contract.get("expert_weight_format"), {})
        return {"saved/%s%s" % (p, k[len("weight"):]): v for p in ("w1", "w2") for k, v in d.items()}
    return {"saved/" + k: v for k, v in _DEPLOYED.get(contract.get("weight_format"), {}).items()}


def write_tensor(group, name, t, byte_dtype=None):
    """Write tensor t as dataset `name` of h5py group `group`, stored per the
    spec: native float64/32/16 and ints, bfloat16 as uint16 + dtype
    attribute, float8/float4 payload as uint8 + dtype attribute. byte_dtype
    names the element type of a uint8 tensor that holds float8/float4 bytes
    (torch < 2.1)."""
    t = t.detach()
    if _is_dtensor(t):
        raise QatDumpError("dataset '%s': a DTensor reached the writer: gather it first" % name)
    t = t.cpu().contiguous()
    attr = None
    if t.dtype == torch.bfloat16:
        arr, attr = t.view(torch.int16).numpy().view(np.uint16), "bfloat16"
    elif t.dtype in _FLOAT8:
        arr, attr = t.view(torch.uint8).numpy(), _FLOAT8[t.dtype]
    elif _FP4 is not None and t.dtype == _FP4:
        arr, attr = t.view(torch.uint8).numpy(), "float4_e2m1fn_x2"
    elif t.dtype == torch.uint8 and byte_dtype:
        if byte_dtype not in BYTE_DTYPES:
            raise QatDumpError("dataset '%s': declared dtype %r: expected one of %s" % (name, byte_dtype, ", ".join(BYTE_DTYPES)))
        arr, attr = t.numpy(), byte_dtype
    elif t.dtype in (torch.float64, torch.float32, torch.float16, torch.int32, torch.int64, torch.uint8):
        arr = t.numpy()
    else:
        raise QatDumpError("dataset '%s': dtype %s has no dump encoding: expected float64, float32, float16, "
                           "bfloat16, float8, int32, int64 or uint8" % (name, t.dtype))
    ds = group.create_dataset(name, data=arr)
    if attr:
        ds.attrs["dtype"] = attr
    return ds


def _is_dtensor(t):
    return type(t).__name__ == "DTensor" or (hasattr(t, "placements") and hasattr(t, "to_local"))


def _fsdp_managed(model):
    """True when fully_shard (FSDP2) wraps part of the model (FSDP1's
    FullyShardedDataParallel wrappers are read by _fsdp1_params)."""
    for m in model.modules():
        for c in type(m).__mro__:
            if c.__name__.startswith("FSDP") and not c.__name__.startswith("FullyShardedDataParallel"):
                return True
    return False


def _fsdp1_params(model):
    """The parameters FSDP1 (FullyShardedDataParallel, use_orig_params=False)
    holds in FlatParameters: {id(module): (flat_param, fsdp_wrapper,
    {param name: (offset in the flat parameter, numel, shape)})} for every
    module owning one. A layout qatdump cannot cut per tensor (padding
    between parameters, shared parameters, a torch without FlatParameter
    metadata) raises QatDumpError."""
    out = {}
    for w in model.modules():
        if not any(c.__name__ == "FullyShardedDataParallel" for c in type(w).__mro__):
            continue
        fp = getattr(w, "_flat_param", None)
        if fp is None:
            continue  # a wrapper without parameters of its own
        infos, numels, shapes = (getattr(fp, a, None) for a in ("_param_infos", "_numels", "_shapes"))
        if infos is None or numels is None or shapes is None:
            raise QatDumpError("an FSDP1 FlatParameter without _param_infos/_numels/_shapes (torch %s): cannot cut it "
                               "per parameter; dump from torch >= 2.0" % torch.__version__)
        padded = getattr(fp, "_numels_with_padding", None)
        if padded is not None and tuple(padded) != tuple(numels):
            raise QatDumpError("an FSDP1 FlatParameter with alignment padding between its parameters "
                               "(use_orig_params=True): not supported; wrap with use_orig_params=False")
        if getattr(fp, "_shared_param_infos", None):
            raise QatDumpError("an FSDP1 FlatParameter holds shared (tied) parameters: their gradient sums over "
                               "every user, not one module's VJP")
        off = 0
        for info, n, shape in zip(infos, numels, shapes):
            ent = out.setdefault(id(info.module), (fp, w, {}))
            if ent[0] is not fp:
                raise QatDumpError("module '%s': its parameters are spread over two FSDP1 FlatParameters"
                                   % info.module_name)
            ent[2][info.param_name] = (off, int(n), tuple(int(v) for v in shape))
            off += int(n)
    return out


def _fsdp2_params(model, world):
    """The parameters FSDP2 (fully_shard) shards: {id(module): (reduce,
    [param names])} for every module owning some, reduce "mean" (FSDP2's
    default, or a gradient divide factor equal to the world size) or "sum"
    (a factor of 1). Their pieces are read after the backward (write()):
    the forward sees the unsharded compute copies. A param group qatdump
    cannot read raises QatDumpError."""
    out = {}
    for w in model.modules():
        if not any(c.__name__ == "FSDPModule" for c in type(w).__mro__):
            continue
        try:
            pg = w._get_fsdp_state()._fsdp_param_group
            if pg is None:
                continue
            factor = getattr(pg, "gradient_divide_factor", None)
            owned = [(fp._module_info.module, fp._module_info.param_name) for fp in pg.fsdp_params]
        except AttributeError as e:
            raise QatDumpError("cannot read FSDP2's parameter groups in torch %s (%s): dump from an unsharded run"
                               % (torch.__version__, e)) from e
        if factor is None or abs(float(factor) - world) < 1e-9 * world:
            reduce = "mean"
        elif abs(float(factor) - 1) < 1e-9:
            reduce = "sum"
        else:
            raise QatDumpError("an FSDP2 module divides gradients by %g over %d ranks: neither a mean nor a sum"
                               % (float(factor), world))
        for mod, pn in owned:
            out.setdefault(id(mod), (reduce, []))[1].append(pn)
    return out


def _fsdp1_reduce(w, world):
    """How FSDP1 wrapper w reduces gradients over the ranks: "mean" (its
    default: pre- and post-divide factors whose product is the world size)
    or "sum" (a product of 1)."""
    pre, post = (getattr(w, a, None) for a in ("_gradient_predivide_factor", "_gradient_postdivide_factor"))
    if pre is None or post is None:
        raise QatDumpError("an FSDP1 wrapper without _gradient_predivide_factor/_gradient_postdivide_factor: cannot "
                           "tell whether its gradients are averaged or summed")
    f = float(pre) * float(post)
    if abs(f - world) < 1e-9 * world:
        return "mean"
    if abs(f - 1) < 1e-9:
        return "sum"
    raise QatDumpError("an FSDP1 wrapper divides gradients by %g over %d ranks: neither a mean nor a sum" % (f, world))


def _clean_name(mname):
    """A module name without FSDP1's wrapper level ("fc1._fsdp_wrapped_module" -> "fc1")."""
    return ".".join(p for p in mname.split(".") if p != "_fsdp_wrapped_module")


def _autocast_on(device):
    """Whether torch.autocast is on for device ("cuda" or "cpu"): torch 2's
    is_autocast_enabled(device) (2.4 and later), else the older queries
    (is_autocast_enabled() for CUDA, is_autocast_cpu_enabled(); deprecated
    in torch 2)."""
    try:
        return bool(torch.is_autocast_enabled(device))
    except TypeError:  # torch < 2.4: no device argument
        if device == "cuda":
            return bool(torch.is_autocast_enabled())
        return bool(getattr(torch, "is_autocast_cpu_enabled", lambda: False)())


_CPU_BF16_GEMM_ACC = []  # the probe's answer, once per process


def _cpu_bf16_gemm_acc():
    """How this torch accumulates bf16 GEMMs on this CPU: "float32" or
    "bfloat16", measured once. torch 1.13 hands them to oneDNN (float32
    accumulation) only on CPUs with AVX-512; elsewhere its own kernels
    (gemm_notrans_ and the batched baddbmm in aten/src/ATen/native/cpu at
    v1.13.1) add each product into the bf16 output: measured on an AVX2
    AMD EPYC, a linear's d_x (K = 48) and d_weight (K = 32) and a bmm
    (K = 512) differ from the float32-accumulated product rounded once by
    0.7% to 2.6% (rel L2), where float32 accumulation differs by ~0 (torch
    2.11: 1e-8). A linear's forward, its backward and a bmm are probed,
    outside any autocast and inference mode; any beyond 2^-9 is
    "bfloat16"."""
    if not _CPU_BF16_GEMM_ACC:
        with torch.autocast("cpu", enabled=False), torch.inference_mode(False):
            _CPU_BF16_GEMM_ACC.append(_probe_bf16_gemm())
    return _CPU_BF16_GEMM_ACC[0]


def _probe_bf16_gemm():
    """_cpu_bf16_gemm_acc's measurement."""
    bf = torch.bfloat16
    g = torch.Generator().manual_seed(0)
    x, w, dy = (torch.randn(*s, generator=g).to(bf) for s in ((32, 512), (48, 512), (32, 48)))
    q, k = (torch.randn(*s, generator=g).to(bf) for s in ((4, 32, 512), (4, 512, 40)))
    with torch.enable_grad():
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        torch.nn.functional.linear(xg, wg).backward(dy)
        y = torch.nn.functional.linear(x, w)
    xf, wf, dyf = x.float(), w.float(), dy.float()
    pairs = ((y, xf @ wf.t()), (xg.grad, dyf @ wf), (wg.grad, dyf.t() @ xf),
             (torch.matmul(q, k), torch.matmul(q.float(), k.float())))
    worst = max(float((a.float() - b.to(bf).float()).norm() / b.norm()) for a, b in pairs)
    return "bfloat16" if worst > 2.0 ** -9 else "float32"


def _autocast_state():
    """(device, dtype name) of the autocast on at this call (CUDA's first),
    or None when it is off."""
    for device in ("cuda", "cpu"):
        if _autocast_on(device):
            getd = getattr(torch, "get_autocast_dtype", None)  # torch >= 2.4
            if getd is not None:
                dt = getd(device)
            elif device == "cuda":
                old = getattr(torch, "get_autocast_gpu_dtype", None)
                dt = old() if old else "float16"
            else:
                dt = torch.get_autocast_cpu_dtype()
            return device, str(dt).replace("torch.", "")
    return None


class _Record:
    """What one module's forward and backward left behind."""

    def __init__(self, name, cls):
        self.name, self.cls = name, cls
        self.calls = 0
        self.inputs = {}        # name -> tensor snapshot
        self.input_grads = {}   # name -> grad from this module alone
        self.params = {}        # name -> (snapshot, frozen)
        self.param_grads = {}   # name -> grad of this backward
        self.outputs = {}
        self.grad_out = {}      # dy name -> dY as received
        self.saved = {}
        self.dy_expected = []   # dY names the backward should deliver
        self.handles = []
        self.not_captured = []  # what was seen but not recorded, in words
        self.restore = None     # undoes the forward wrapper
        self.per_call = []      # (inputs, outputs, saved) of each call, in call order
        self.tied = []          # parameter names read through a per-site alias (mode tied)
        self.by_call = {}       # mode tied: {call: {kind: {name: [gradients]}}}
        self.autocast = None    # "off", or the dtype autocast ran in, at the module's call(s) ("mixed": calls differ)
        self.cpu_bf16 = False   # a call ran on the CPU in bf16 (a bf16 input or parameter, or CPU autocast bf16)
        self.fsdp1 = None       # (flat_param, wrapper, {param: (offset, numel, shape)}) under FSDP1
        self.fsdp2 = None       # (reduce, [param names]) under FSDP2
        self.hooked = {"input_grads": [], "param_grads": []}  # names given a gradient hook (taps, parameters)
        self.nones = set()      # (kind, name) whose hook received None: the backward returned no gradient
        self.mb_of_call = []    # mode grad_accum: the micro-batch of each call
        self.empty = {}         # write(): {micro-batch or 0: call index} of the empty calls synthesized


class Dumper:
    """Hooks on the selected modules of one model; see attach()."""

    def __init__(self, model, path=None, modules=None, classes=None, prefix="/", rank=None, world_size=None,
                 mode="eager", host_copies=False):
        self.model, self.path, self.prefix = model, path, prefix
        if mode not in MODES:
            raise QatDumpError("mode %r: expected one of %s" % (mode, ", ".join(MODES)))
        if host_copies and mode == "cuda_graph":
            raise QatDumpError("mode cuda_graph with host_copies: a device-to-host copy cannot run inside a CUDA "
                               "Graph capture; record on the device (host_copies=False)")
        self.host_copies = bool(host_copies)
        if mode == "cuda_graph" and not torch.cuda.is_available():
            raise QatDumpError("mode cuda_graph: no CUDA device (torch.cuda.is_available() is False): a CUDA Graph "
                               "is captured and replayed on a GPU")
        self.mode = mode
        self._multi = mode in ("recompute", "grad_accum", "tied")  # a module may run more than once
        self._autocast = None   # (device, dtype name) the forward ran under (mode autocast)
        self._captured = False  # a forward ran inside a CUDA Graph capture (mode cuda_graph)
        # mode grad_accum: the micro-batch under way (a forward after a backward starts the next one)
        self._mb, self._bwd_seen = 0, False
        self._early_stop = None  # mode recompute: torch 2's checkpoint early stop, turned off while attached
        if rank is None and torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if (rank is None) != (world_size is None) or (rank is not None and not 0 <= rank < world_size):
            raise QatDumpError("rank %r of world_size %r: give both, with 0 <= rank < world_size" % (rank, world_size))
        self.rank, self.world_size = rank, world_size
        self.classes = dict(DEFAULT_CLASSES)
        self.classes.update(classes or {})
        rx = re.compile(modules) if modules else None
        self.records = {}
        self._handles = []
        self._fsdp = _fsdp_managed(model)
        self._fsdp1 = _fsdp1_params(model)  # FSDP1 FlatParameters: read whole and cut per tensor in write()
        self._fsdp2 = _fsdp2_params(model, world_size or 1) if self._fsdp else {}  # FSDP2: Shard(0) pieces in write()
        owners = {}
        for mname, m in model.named_modules():
            for pn, p in m._parameters.items():
                if p is not None:
                    owners.setdefault(id(p), []).append(mname + "." + pn if mname else pn)
        self._owners = owners
        for mname, m in model.named_modules():
            cls = getattr(m, "qatcheck_class", None) or self._class_of(m)
            if cls is None or (rx is not None and not rx.search(mname)):
                continue
            self._guard_params(mname, m)
            rec = _Record(mname, cls)
            rec.module = m
            rec.fsdp1 = self._fsdp1.get(id(m))
            rec.fsdp2 = self._fsdp2.get(id(m))
            self.records[mname] = rec
            self._handles.append(m.register_forward_pre_hook(self._pre_hook(rec)))
            self._handles.append(m.register_forward_hook(self._post_hook(rec)))
            self._wrap_forward(m, rec)
        if not self.records:
            raise QatDumpError("no module matched: modules=%r among classes %s" %
                               (modules, sorted(c.__name__ for c in self.classes)))
        if mode == "tied":
            self._tie_prepare()
        if mode == "grad_accum":  # the micro-batches: the model's calls and the backwards through its outputs
            self._handles.append(model.register_forward_pre_hook(lambda m, args: self._forward_event()))
            self._handles.append(model.register_forward_hook(self._root_output_hook))
        if mode == "recompute" and hasattr(torch.utils.checkpoint, "set_checkpoint_early_stop"):
            # a non-reentrant checkpoint of torch >= 2.1 stops its recompute once the backward's saved
            # tensors are rebuilt: the modules after the last one saving a tensor would not run again, and
            # their recomputed forward (the one the backward used) could not be recorded; run it whole, as
            # torch 1.13 and a reentrant checkpoint do (the backward's tensors are the same)
            self._early_stop = torch.utils.checkpoint.set_checkpoint_early_stop(False)
            self._early_stop.__enter__()
        # each parameter's .grad before the step: the accumulated gradient is what the step adds to it
        # (and an empty call's, an expert that received no token: write())
        self._grad0 = {}
        for rec in self.records.values():
            if mode not in ("grad_accum", "tied") and (rec.cls != "linear" or not re.search(r"(^|\.)\d+(\.|$)", rec.name)):
                continue  # only what can become an empty call (a linear named with an index) needs it
            for p in rec.module._parameters.values():
                if p is not None and p.grad is not None:
                    self._grad0[id(p)] = self._copy(p.grad)

    def _copy(self, t):
        """The helper's own copy of tensor t as it is now: a clone on its
        device, or with host_copies a copy in host memory."""
        t = t.detach()
        return t.to("cpu", copy=True) if self.host_copies else t.clone()

    def _tie_prepare(self):
        """Mode tied: every trainable parameter of the selected modules is
        read through a private alias at each call (a site), so each site's
        share of its gradient is its own; the ties (a tensor used at two or
        more sites: one Parameter held by several modules or used by one
        module called several times, or distinct Parameters over the same
        storage) are found in write(). Every user of such a Parameter must
        be selected: its accumulated gradient sums over all of them."""
        selected = set(self.records)
        for rec in self.records.values():
            for pn, p in rec.module._parameters.items():
                if p is None or not p.requires_grad:
                    continue
                for user in self._owners.get(id(p), []):
                    umod = user.rsplit(".", 1)[0] if "." in user else ""
                    if umod not in selected:
                        raise QatDumpError("mode tied: parameter '%s.%s' is also used by '%s', which is not selected: "
                                           "its accumulated gradient sums over every site; select it too"
                                           % (rec.name, pn, umod or "the root module"))
                rec.tied.append(pn)

    def _site_path(self, rec, k):
        """The group of module rec's call k: its own path, or /call<k><path>
        when mode tied saw it called more than once (each call a site)."""
        if self.mode == "tied" and rec.calls > 1:
            return "/call%d%s" % (k, self._gpath(rec))
        return self._gpath(rec)

    def _find_ties(self):
        """Mode tied, after the step: [(module name, call, param name,
        parameter), ...] per tensor used at two or more sites, sites in
        module and call order."""
        groups = {}
        for rec in self.records.values():
            for k in range(rec.calls):
                for pn in rec.tied:
                    p = rec.module._parameters[pn]
                    key = (p.data_ptr(), tuple(p.shape), tuple(p.stride()), p.dtype, p.device)
                    groups.setdefault(key, []).append((rec.name, k, pn, p))
        ties = [g for g in groups.values() if len(g) > 1]
        if not ties:
            raise QatDumpError("mode tied: no parameter of the selected modules was used at two sites (one Parameter "
                               "held by two modules or used by a module called twice, or two Parameters over one "
                               "storage); select every site")
        return ties

    def _class_of(self, m):
        for c in type(m).__mro__:
            if c in self.classes:
                return self.classes[c]
        return None

    def _guard_params(self, mname, m):
        for pn, p in m._parameters.items():
            if p is None:
                continue
            users = self._owners.get(id(p), [])
            if len(users) > 1 and self.mode != "tied":
                raise QatDumpError("module '%s': parameter '%s' is shared with %s: its gradient sums over every "
                                   "user, not this module's VJP; dump it with mode='tied' (each site's share and "
                                   "the sum), a model without tied weights, or select another module" % (mname, pn, ", ".join(u for u in users if u != mname + "." + pn)))
            if self._fsdp and id(m) not in self._fsdp1 and not _is_dtensor(p):
                raise QatDumpError("module '%s': parameter '%s' is FSDP-managed but not a DTensor: it may be the "
                                   "unsharded compute copy, not the sharded master; cannot tell, so refusing "
                                   "(dump from an FSDP2 (fully_shard) model whose parameters are DTensors, or "
                                   "from an unsharded run)" % (mname, pn))

    # -- hooks ---------------------------------------------------------------
    def _names(self, m, attr, base, n):
        names = getattr(m, attr, None)
        if names:
            return list(names)
        return [base] if n == 1 else ["%s%d" % (base, i) for i in range(n)]

    def _wrap_forward(self, m, rec):
        """Record the forward's tensor arguments, positional or keyword: the
        call is bound to forward's signature, so `lin(x=x)` is `lin(x)`.
        (Forward pre-hooks of torch < 2.0 see positional arguments only.)"""
        orig = m.forward
        try:
            sig = inspect.signature(orig)
        except (TypeError, ValueError):
            sig = None
        had = "forward" in m.__dict__

        def forward(*args, **kwargs):
            if (rec.calls == 1 or self._multi) and not rec.inputs:
                args, kwargs = self._capture_inputs(m, rec, sig, args, kwargs)
            swapped = []
            if rec.tied and torch.is_grad_enabled():
                # a private alias of each tied parameter: its gradient is this site's share alone
                for pn in rec.tied:
                    p = m._parameters[pn]
                    alias = p.view_as(p)
                    alias.register_hook(self._grad_hook(rec, "param_grads", pn))
                    rec.hooked["param_grads"].append(pn)
                    m._parameters[pn] = alias
                    swapped.append((pn, p))
            try:
                return orig(*args, **kwargs)
            finally:
                for pn, p in swapped:
                    m._parameters[pn] = p

        m.forward = forward

        def restore():
            if had:
                m.forward = orig
            else:
                del m.forward
        rec.restore = restore

    def _capture_inputs(self, m, rec, sig, args, kwargs):
        """The call's tensors in signature order, recorded and replaced by taps."""
        if sig is None:
            tk = [k for k, v in kwargs.items() if torch.is_tensor(v)]
            if tk:
                raise QatDumpError("module '%s' was called with keyword tensor argument(s) %s and its forward has no "
                                   "signature to bind them to: call it positionally" % (rec.name, tk))
            slots = [("arg%d" % i, a) for i, a in enumerate(args)]
            bound = None
        else:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as e:
                raise QatDumpError("module '%s': the call's arguments do not match its forward%s: %s"
                                   % (rec.name, sig, e)) from e
            slots = []
            for pname, val in bound.arguments.items():
                kind = sig.parameters[pname].kind
                if kind == inspect.Parameter.VAR_POSITIONAL:
                    slots += [("%s[%d]" % (pname, i), v) for i, v in enumerate(val)]
                elif kind == inspect.Parameter.VAR_KEYWORD:
                    slots += [(k, v) for k, v in val.items()]
                else:
                    slots.append((pname, val))
        tens = [i for i, (_, v) in enumerate(slots) if torch.is_tensor(v)]
        names = self._names(m, "qatcheck_inputs", "x", len(tens))
        new = [v for _, v in slots]
        for name, i in zip(names, tens):
            a = slots[i][1]
            rec.inputs[name] = self._copy(a)
            if a.is_floating_point() and torch.is_grad_enabled():
                # (a forward without grad, a checkpoint's first, gets no tap: its backward never runs)
                # a private alias: its gradient is this module's alone;
                # a leaf input gets grad so the backward computes d_x
                tap = a.view_as(a) if a.requires_grad else a.detach().requires_grad_(True)
                tap.register_hook(self._grad_hook(rec, "input_grads", name))
                rec.hooked["input_grads"].append(name)
                new[i] = tap
        # a module of a bf16 model (a floating input or parameter in bf16, no
        # autocast): its own ops round their results to bf16, and a bf16
        # input used at several sites (Mamba2's dt, also promoted to float32
        # against a float32 A) gets its gradient contributions rounded and
        # summed in bf16 (compute_dtype)
        fl = [t.dtype for t in rec.inputs.values() if t.is_floating_point()]
        fl += [p.dtype for p in m.parameters(recurse=False) if p.is_floating_point()]
        autocast = _autocast_state()
        rec.bf16_compute = any(d == torch.bfloat16 for d in fl) and not autocast
        state = autocast[1] if autocast else "off"
        rec.autocast = state if rec.autocast in (None, state) else "mixed"
        on_cpu = all(slots[i][1].device.type == "cpu" for i in tens)  # the call's own (records: host copies)
        if on_cpu and (autocast == ("cpu", "bfloat16") or (not autocast and any(d == torch.bfloat16 for d in fl))):
            rec.cpu_bf16 = True
        for pname, v in slots:
            if torch.is_tensor(v) or v is None:
                continue
            if isinstance(v, (list, tuple, dict)):
                vals = v.values() if isinstance(v, dict) else v
                if any(torch.is_tensor(x) for x in vals):
                    rec.not_captured.append("argument '%s': a %s holding tensors (not recorded: pass them as "
                                            "separate arguments)" % (pname, type(v).__name__))
                    continue
            rec.not_captured.append("argument '%s' = %.60s (not a tensor: not recorded)" % (pname, repr(v)))
        if bound is None:
            return tuple(new), kwargs
        # put the taps back where the tensors were
        k = 0
        for pname in list(bound.arguments):
            kind = sig.parameters[pname].kind
            val = bound.arguments[pname]
            if kind == inspect.Parameter.VAR_POSITIONAL:
                bound.arguments[pname] = tuple(new[k:k + len(val)])
                k += len(val)
            elif kind == inspect.Parameter.VAR_KEYWORD:
                bound.arguments[pname] = dict(zip(val.keys(), new[k:k + len(val)]))
                k += len(val)
            else:
                bound.arguments[pname] = new[k]
                k += 1
        return bound.args, bound.kwargs

    def _forward_event(self):
        """Mode grad_accum: a forward after a backward starts the next micro-batch."""
        if self._bwd_seen:
            self._mb += 1
            self._bwd_seen = False

    def _root_output_hook(self, m, args, out):
        """Mode grad_accum: a hook on each output of the model that requires
        grad, telling a micro-batch's backward even where no selected module
        ran in it."""
        def mark(g):
            self._bwd_seen = True
            return None
        seq = [out]
        while seq:
            o = seq.pop()
            if torch.is_tensor(o):
                if o.requires_grad and torch.is_grad_enabled():
                    o.register_hook(mark)
            elif isinstance(o, (list, tuple)):
                seq.extend(o)
            elif isinstance(o, dict):
                seq.extend(o.values())
        return None

    def _pre_hook(self, rec):
        def hook(m, args):
            if self.mode == "grad_accum":
                self._forward_event()
                rec.mb_of_call.append(self._mb)
            rec.calls += 1
            if rec.calls == 1 or self._multi:
                rec.inputs, rec.outputs, rec.saved = {}, {}, {}
                rec.per_call.append((rec.inputs, rec.outputs, rec.saved))
            if rec.calls == 1:
                self._mode_facts(rec)
            if rec.calls > 1:
                return None  # reported in write(): parameter gradients sum over calls
            if id(m) in self._fsdp1 or id(m) in self._fsdp2:
                return None  # FSDP's unsharded compute copies: the sharded parameters are read in write()
            for pn, p in m._parameters.items():
                if p is None:
                    continue
                if self._fsdp and not _is_dtensor(p):
                    # FSDP2 swaps in the unsharded compute copy for the forward
                    raise QatDumpError("module '%s': parameter '%s' is an unsharded plain tensor inside an FSDP "
                                       "forward: the compute copy, not the sharded master; refusing (dump from "
                                       "an unsharded, single-rank run)" % (rec.name, pn))
                master = p.full_tensor() if _is_dtensor(p) else p  # the sharded master, gathered
                rec.params[pn] = (self._copy(master), not p.requires_grad)
                if p.requires_grad:
                    if _is_dtensor(p):
                        raise QatDumpError("module '%s': parameter '%s' is a DTensor: its gradient is "
                                           "reduce-scattered across ranks, not this rank's VJP; dump the "
                                           "gradients from an unsharded (single-rank) run" % (rec.name, pn))
                    if pn not in rec.tied:  # a tied parameter's share comes from its alias (_wrap_forward)
                        rec.handles.append(p.register_hook(self._store(rec, "param_grads", pn)))
                        rec.hooked["param_grads"].append(pn)
            self._capture_buffers(m, rec)
            return None
        return hook

    def _capture_buffers(self, m, rec):
        """The buffers the class reads (BUFFER_DEFAULTS, the module's
        `qatcheck_buffers`) as frozen params; a router's others noted."""
        names = tuple(getattr(m, "qatcheck_buffers", None) or ()) + BUFFER_DEFAULTS.get(rec.cls, ())
        for bn, b in m._buffers.items():
            if b is None or bn in rec.params:
                continue
            if bn in names:
                rec.params[bn] = (self._copy(b), True)
            elif rec.cls in BUFFER_DEFAULTS:
                rec.not_captured.append("buffer %r not dumped: name it in qatcheck_buffers if the forward reads it" % bn)

    def _mode_facts(self, rec):
        """What the mode needs to see at a module's first forward: the
        autocast state, a CUDA Graph capture under way."""
        if self.mode == "autocast":
            state = _autocast_state()
            if state is None:
                raise QatDumpError("module '%s' ran outside torch.autocast in mode autocast: run the forward inside "
                                   "`with torch.autocast(...)`" % rec.name)
            if self._autocast is not None and self._autocast != state:
                raise QatDumpError("module '%s' ran under autocast %s, another module under %s: one autocast per dump"
                                   % (rec.name, state, self._autocast))
            self._autocast = state
        if self.mode == "cuda_graph" and torch.cuda.is_current_stream_capturing():
            self._captured = True

    def _post_hook(self, rec):
        def hook(m, args, out):
            if rec.calls > 1 and not self._multi:
                return None
            seq = [out] if torch.is_tensor(out) else list(out) if isinstance(out, (list, tuple)) else [out]
            outs = [o for o in seq if torch.is_tensor(o)]
            for i, o in enumerate(seq):
                if not torch.is_tensor(o) and o is not None:
                    rec.not_captured.append("output %d: a %s (not a tensor: not recorded, no dY for it)"
                                            % (i, type(o).__name__))
            names = self._names(m, "qatcheck_outputs", "y", len(outs))
            for name, o in zip(names, outs):
                rec.outputs[name] = self._copy(o)
                if o.requires_grad and torch.is_grad_enabled():
                    dyname = "dy" if len(outs) == 1 else "d" + name
                    rec.dy_expected.append(dyname)
                    o.register_hook(self._grad_hook(rec, "grad_out", dyname))
            saved_names = getattr(m, "qatcheck_saved", None)
            fn = outs[0].grad_fn if outs else None
            if saved_names and self.mode == "recompute" and _UNPACK_ONCE:
                # torch >= 2.1: read at the forward, unless it is a checkpoint's first (its saved tensors are
                # handed out once, to the backward): there they are read at the recompute (call 2), whose
                # Function saved the very tensors the backward gets (under either checkpoint)
                # (even hasattr(fn, "saved_tensors") unpacks them: in a checkpoint's first forward that runs
                # a recompute of its own)
                st = None
                if fn is not None and (rec.calls >= 2 or not _saved_hooks_active()):
                    try:
                        st = fn.saved_tensors
                    except (AttributeError, RuntimeError):
                        st = None
                    if st is not None:
                        self._keep_saved(rec, rec.per_call[-1][2], st, saved_names)
                if st is None and (fn is None or rec.calls >= 2 or not _saved_hooks_active()) and \
                        torch.is_grad_enabled():
                    rec.not_captured.append("saved %s: the output has no autograd Function with saved_tensors"
                                            % list(saved_names))
            elif saved_names and self.mode == "recompute":
                # read when the backward reaches the Function: a non-reentrant checkpoint's
                # saved tensors exist only then (reading them now would recompute the block)
                if fn is not None and outs[0].requires_grad and torch.is_grad_enabled():
                    outs[0].register_hook(self._read_saved(rec, fn, saved_names))
            elif saved_names and (fn is None or not hasattr(fn, "saved_tensors")):
                rec.not_captured.append("saved %s: the output has no autograd Function with saved_tensors"
                                        % list(saved_names))
            elif saved_names:
                self._keep_saved(rec, rec.saved, fn.saved_tensors, saved_names)
            return None
        return hook

    def _keep_saved(self, rec, into, st, saved_names):
        for name, t in zip(saved_names, st):
            if name is None:  # a position the module leaves out of the dump
                continue
            if not isinstance(name, str) or not name or "/" in name:
                raise QatDumpError("module '%s': qatcheck_saved entry %r: expected a dataset name (a string without "
                                   "'/') or None to leave that saved tensor out" % (rec.name, name))
            if t is None:
                rec.not_captured.append("saved %s: the Function saved None there" % name)
                continue
            into[name] = self._copy(t)
        if len(st) != len(saved_names):
            rec.not_captured.append("saved: %d tensor(s) saved, %d named by qatcheck_saved (the extra "
                                    "ones are not recorded)" % (len(st), len(saved_names)))

    def _read_saved(self, rec, fn, saved_names):
        """Mode recompute: the saved tensors the backward uses, read as it
        reaches fn (under a non-reentrant checkpoint the read is what runs
        the recompute), into the last forward's record."""
        def hook(g):
            if not hasattr(fn, "saved_tensors"):
                rec.not_captured.append("saved %s: the output has no autograd Function with saved_tensors"
                                        % list(saved_names))
                return None
            st = fn.saved_tensors
            self._keep_saved(rec, rec.per_call[-1][2], st, saved_names)
            return None
        return hook

    def _grad_hook(self, rec, kind, name):
        """The hook storing a gradient of module rec (kind: grad_out,
        input_grads, param_grads): appended in arrival order, or in mode
        tied under the call it belongs to (a backward reaches the sites in
        reverse order)."""
        if self.mode != "tied":
            return self._store(rec, kind, name)
        k = rec.calls - 1

        def hook(g):
            if g is None:  # torch 2 calls a tensor's hooks with None where the backward returned none
                rec.nones.add((kind, name))
                return None
            rec.by_call.setdefault(k, {}).setdefault(kind, {}).setdefault(name, []).append(self._copy(g))
            return None
        return hook

    def _store(self, rec, kind, name):
        """The hook appending gradient `name` of kind (grad_out, input_grads,
        param_grads) to module rec's record. A hook called with None (torch
        2 calls a leaf's and a parameter's hooks with None where the
        backward returned no gradient for them; any torch a view's) stores
        nothing, as torch 1.13, which calls no hook there, stores nothing:
        write() names what received no gradient."""
        d = getattr(rec, kind)

        def hook(g):
            self._bwd_seen = True
            if g is None:
                rec.nones.add((kind, name))
                return None
            d.setdefault(name, []).append(self._copy(g))
            return None
        return hook

    # -- output --------------------------------------------------------------
    def write(self, path=None):
        """Write the dump (call after backward, before optimizer.step())."""
        path = path or self.path
        if not path:
            raise QatDumpError("no dump path: pass one to attach() or write()")
        self._sharded = "{rank}" in path
        if self._sharded:
            if self.rank is None:
                raise QatDumpError("dump path %r names a rank, but torch.distributed is not initialized: pass rank= "
                                   "and world_size= to attach()" % path)
            path = path.replace("{rank}", str(self.rank))
        self._fsdp1_collect()
        self._fsdp2_collect()
        for rec in self.records.values():
            for k, kinds in sorted(rec.by_call.items()):  # mode tied: the gradients in call order
                for kind, d in kinds.items():
                    for name, gs in d.items():
                        if len(gs) != 1:
                            raise QatDumpError("module '%s': call %d's '%s' received %d gradients: more than one "
                                               "backward ran inside attach(); dump one step" % (rec.name, k, name, len(gs)))
                        getattr(rec, kind).setdefault(name, [None] * rec.calls)[k] = gs[0]
            if rec.calls == 0:
                if self.mode != "tied" and self._sibling(rec) is not None:
                    continue  # an expert that received no token: an empty call (below)
                raise QatDumpError("module '%s' did not run in this step: run one forward and backward "
                                   "inside attach(), or narrow `modules` (a linear that received no token, an "
                                   "expert, is written as an empty call when a sibling of the same shape ran: "
                                   "experts.0 for experts.3)" % rec.name)
            if rec.calls > 1 and not (self.mode in ("grad_accum", "tied") or (self.mode == "recompute" and rec.calls == 2)):
                raise QatDumpError("module '%s' ran %d times in this step: its parameter gradients sum over the "
                                   "calls; dump a step that calls it once (under activation checkpointing: "
                                   "mode='recompute'; over micro-batches: mode='grad_accum'; a layer applied twice: mode='tied')"
                                   % (rec.name, rec.calls))
            missing = [n for n in rec.dy_expected if n not in rec.grad_out]
            if missing or not rec.grad_out:
                raise QatDumpError("module '%s': output %s received no gradient%s: run backward before write() "
                                   "(and make the loss depend on the module)"
                                   % (rec.name, missing or "y", " (None)" if any(k == "grad_out" for k, _ in rec.nones)
                                      else ""))
            want = rec.calls if self.mode in ("grad_accum", "tied") else 1
            for kind in ("grad_out", "input_grads", "param_grads"):
                for n, gs in getattr(rec, kind).items():
                    if 0 < len(gs) < want and want > 1 and self.mode == "grad_accum":
                        raise QatDumpError("module '%s': '%s' received a gradient in %d of its %d micro-batches: the "
                                           "backward returned none for it in the others (a gradient that is "
                                           "sometimes None cannot be summed per micro-batch)"
                                           % (rec.name, n, len(gs), rec.calls))
                    if len(gs) != want or any(g is None for g in gs):
                        raise QatDumpError("module '%s': '%s' received %d gradients in %d forward(s): %s"
                                           % (rec.name, n, len(gs), rec.calls,
                                              "one backward per micro-batch, in order" if want > 1 else
                                              "more than one backward ran inside attach(); dump one step"))
            for kind, what in (("input_grads", "input"), ("param_grads", "parameter")):
                for n in dict.fromkeys(rec.hooked[kind]):
                    if n not in getattr(rec, kind):  # torch 2 called its hook with None, torch 1.13 none at all
                        rec.not_captured.append("%s '%s' received no gradient: the module's backward returned none "
                                                "for it (None), so no grads/<dy>/d_%s is written (vjp reports it "
                                                "missing where the class differentiates it)" % (what, n, n))
        self._empty_calls()
        if self.mode == "autocast" and self._autocast is None:
            raise QatDumpError("mode autocast: no selected module ran under torch.autocast")
        if self.mode == "cuda_graph" and not self._captured:
            raise QatDumpError("mode cuda_graph: no selected module's forward ran inside a CUDA Graph capture "
                               "(torch.cuda.graph): attach() after the warm-up, capture, replay, then write()")
        try:
            with h5py.File(path, "w") as f:
                f.attrs["qatcheck_dump"] = np.int64(1)
                f.attrs["mode"] = self.mode
                if self._sharded:
                    f.attrs["rank"] = np.int64(self.rank)
                    f.attrs["world_size"] = np.int64(self.world_size)
                if self.mode == "autocast":
                    f.attrs["autocast_device"], f.attrs["autocast_dtype"] = self._autocast
                for rec in self.records.values():
                    if self.mode == "grad_accum":
                        for k in range(self._mb + 1):  # each micro-batch's call, an empty one where it ran in none
                            c = rec.mb_call[k]
                            self._write_module(f, rec, "/microbatch%d%s" % (k, self.prefix), c, c)
                    elif self.mode == "tied" and rec.calls > 1:
                        for k in range(rec.calls):
                            self._write_module(f, rec, "/call%d%s" % (k, self.prefix), k, k)
                    else:
                        self._write_module(f, rec, None, -1, 0)
                self._write_mode(f)
        except BaseException:
            if os.path.exists(path):
                os.remove(path)  # a refused or interrupted dump leaves no half-written file
            raise
        for rec in self.records.values():
            for what in dict.fromkeys(rec.not_captured):
                warnings.warn("qatdump: module '%s': %s" % (rec.name, what), stacklevel=2)
        return path

    def _sibling(self, rec):
        """For a linear module that never ran, an expert that received no
        token: a selected module that ran, of the same class and parameter
        shapes, whose name differs from rec's in numeric components only
        (experts.0 for experts.3); None when there is none."""
        def key(r):
            return (re.sub(r"(?<![^.])\d+(?![^.])", "#", r.name), r.cls,
                    tuple((pn, tuple(p.shape), p.dtype) for pn, p in r.module._parameters.items() if p is not None))
        if rec.cls != "linear" or "#" not in key(rec)[0]:
            return None
        for r in self.records.values():
            if r is not rec and r.calls > 0 and key(r) == key(rec):
                return r
        return None

    def _add_empty_call(self, rec, like, c, grads):
        """Append an empty call to module rec: no token in, none out (the
        shapes and dtypes of call c of record `like`, rec's own or a
        sibling's, with a leading dimension of 0), an empty dY and input
        gradient, and `grads` ({parameter: gradient}) as its parameter
        gradients. Its call index."""
        def none_of(t):
            return t.new_empty((0,) + tuple(t.shape[-1:]))
        ins, outs, _ = like.per_call[c]
        rec.per_call.append(({n: none_of(t) for n, t in ins.items()}, {n: none_of(t) for n, t in outs.items()}, {}))
        for n, gs in like.grad_out.items():
            rec.grad_out.setdefault(n, []).append(none_of(gs[c]))
        for n, gs in like.input_grads.items():
            rec.input_grads.setdefault(n, []).append(none_of(gs[c]))
        for n, g in grads.items():
            rec.param_grads.setdefault(n, []).append(g)
        return len(rec.per_call) - 1

    def _empty_calls(self):
        """A selected linear that received no token in the step (an expert
        nobody was routed to: its forward never ran) or, under grad_accum,
        in a micro-batch, is written as an empty call, whose parameter
        gradients qatcheck expects to be zero: the step's (what it added
        to .grad) where the module never ran, zero in a micro-batch where it
        did not (the accumulated check sees .grad). rec.mb_call: grad_accum's
        {micro-batch: call index}."""
        for rec in self.records.values():
            if rec.empty:
                continue  # write() called again
            if rec.calls == 0:
                like, c = self._sibling(rec), 0
                rec.bf16_compute = getattr(like, "bf16_compute", False)
                rec.autocast = like.autocast
                for pn, p in rec.module._parameters.items():
                    if p is not None:
                        rec.params[pn] = (self._copy(p), not p.requires_grad)
            else:
                like, c = rec, 0
            trainable = {pn: p for pn, p in rec.module._parameters.items() if p is not None and p.requires_grad}
            if self.mode == "grad_accum":
                rec.mb_call = {}
                for c0, k in enumerate(rec.mb_of_call):
                    if k in rec.mb_call:
                        raise QatDumpError("module '%s' ran more than once in micro-batch %d: its parameter gradients "
                                           "sum over the calls" % (rec.name, k))
                    rec.mb_call[k] = c0
                for k in range(self._mb + 1):
                    if k not in rec.mb_call:
                        rec.mb_call[k] = rec.empty[k] = self._add_empty_call(
                            rec, like, c, {pn: torch.zeros_like(p.detach()) for pn, p in trainable.items()})
            elif rec.calls == 0:
                grads = {}
                for pn, p in trainable.items():
                    g = self._grad_now(p)
                    grads[pn] = g if g is not None else torch.zeros_like(p.detach())
                rec.empty[0] = self._add_empty_call(rec, like, c, grads)

    def _fsdp1_collect(self):
        """The parameters and gradients of FSDP1-managed modules, cut per
        tensor: each FlatParameter's pieces (and its reduce-scattered
        gradient's) all-gathered over the ranks (collective: every rank's
        write() reaches it, in the same order), each parameter taken out of
        the concatenation and cut as docs/interfaces.md's shard_flat layout
        says (flattened, zero-padded to a multiple of the world size, this
        rank's piece). A FlatParameter holding one parameter gives FSDP's
        own piece back, byte for byte."""
        if not self._fsdp1:
            return
        if self.rank is None:
            raise QatDumpError("FSDP1-managed modules are dumped one file per rank: torch.distributed is not "
                               "initialized")
        W, gathered = self.world_size, {}
        for rec in self.records.values():
            if rec.fsdp1 is None:
                continue
            fp, _, params = rec.fsdp1
            if id(fp) not in gathered:
                local = fp.detach().reshape(-1).contiguous()
                grad = fp.grad.detach().reshape(-1).contiguous() if fp.grad is not None else torch.zeros_like(local)
                total = sum(n for _, n, _ in params.values())
                if local.numel() * W < total or W == 1:
                    full, fullg = local, grad  # not sharded (NO_SHARD, one rank): every rank holds it whole
                else:
                    parts = [torch.empty_like(local) for _ in range(W)]
                    torch.distributed.all_gather(parts, local)
                    gparts = [torch.empty_like(grad) for _ in range(W)]
                    torch.distributed.all_gather(gparts, grad)
                    full, fullg = torch.cat(parts), torch.cat(gparts)
                gathered[id(fp)] = (full, fullg, fp.grad is not None)
            full, fullg, has_grad = gathered[id(fp)]
            for pn, (off, n, shape) in params.items():
                L = -(-n // W)

                def piece(t):
                    flat = torch.nn.functional.pad(t[off:off + n], (0, L * W - n))
                    return flat[self.rank * L:(self.rank + 1) * L].clone()

                rec.params[pn] = (piece(full), not fp.requires_grad)
                if fp.requires_grad:
                    if not has_grad:
                        raise QatDumpError("module '%s': FSDP1's FlatParameter has no gradient: run backward before "
                                           "write()" % rec.name)
                    rec.param_grads[pn] = [piece(fullg)]

    def _fsdp2_collect(self):
        """The pieces of FSDP2-sharded parameters and of their gradients:
        after the backward each is a DTensor sharded along dimension 0
        (torch.chunk's pieces: the last ones may be shorter), this rank's
        local piece written with shard_dim 0."""
        if not self._fsdp2:
            return
        mods = dict(self.model.named_modules())
        for rec in self.records.values():
            if rec.fsdp2 is None:
                continue
            m = mods[rec.name]
            for pn in rec.fsdp2[1]:
                p = getattr(m, pn)
                pl = tuple(getattr(p, "placements", ()))
                if not _is_dtensor(p) or len(pl) != 1 or type(pl[0]).__name__ != "Shard" or pl[0].dim != 0:
                    raise QatDumpError("module '%s': FSDP2 parameter '%s' is %s after the backward: expected a DTensor "
                                       "sharded along dimension 0 on a 1-D mesh (HSDP and other placements are not "
                                       "supported)" % (rec.name, pn, pl or type(p).__name__))
                rec.params[pn] = (self._copy(p.to_local()), not p.requires_grad)
                if p.requires_grad:
                    if p.grad is None:
                        raise QatDumpError("module '%s': FSDP2 parameter '%s' has no gradient: run backward before "
                                           "write()" % (rec.name, pn))
                    g = p.grad.to_local() if _is_dtensor(p.grad) else p.grad
                    rec.param_grads[pn] = [self._copy(g)]

    def _grad_now(self, p):
        """What this step added to p.grad (None when it has none)."""
        if p.grad is None:
            return None
        g = self._copy(p.grad)
        g0 = self._grad0.get(id(p))
        return (g - g0) if g0 is not None else g

    def _gpath(self, rec):
        """The module group's path: "/fc1" (the dumper's prefix, the name without FSDP's wrapper level)."""
        return self.prefix + (_clean_name(rec.name) or "root")

    def _write_mode(self, f):
        """The evidence a mode adds under /qatcheck_mode: the first forward of
        a recomputed module (recompute), each parameter's accumulated
        gradient (grad_accum), each tie's sites and accumulated gradient
        (tied)."""
        if self.mode == "recompute":
            for rec in self.records.values():
                if rec.calls != 2:
                    continue  # not under a checkpoint: run once
                first, last = rec.per_call[0], rec.per_call[1]
                g = f.require_group("%s/first_forward%s" % (MODE_GROUP, self._gpath(rec)))
                equal = {}
                for role, d0, d1 in zip(("inputs", "outputs", "saved"), first, last):
                    for name, t in d0.items():
                        write_tensor(g.require_group(role), name, t)
                        t1 = d1.get(name)
                        equal[role + "/" + name] = bool(t1 is not None and t1.dtype == t.dtype and
                                                        t1.shape == t.shape and torch.equal(t1.cpu(), t.cpu()))
                g.attrs["equal"] = json.dumps(equal)  # for the reader: qatcheck compares the data itself
        elif self.mode == "grad_accum":
            f.attrs["microbatches"] = np.int64(self._mb + 1)
            for rec in self.records.values():
                g = f.require_group("%s/accumulated%s" % (MODE_GROUP, self._gpath(rec)))
                for pn, p in rec.module._parameters.items():
                    if p is None or not p.requires_grad or pn not in rec.param_grads:
                        continue
                    acc = self._grad_now(p)
                    if acc is None and rec.calls == 0:
                        acc = torch.zeros_like(p.detach())  # an expert that received no token in any micro-batch
                    if acc is None:
                        raise QatDumpError("module '%s': parameter '%s' has no .grad after the micro-batches: "
                                           "write() before optimizer.zero_grad()" % (rec.name, pn))
                    write_tensor(g, "d_" + pn, acc)
        elif self.mode == "tied":
            names = {id(p): n for n, p in self.model.named_parameters()}
            for tie in self._find_ties():
                mname, k0, pn, p = tie[0]
                g = f.require_group("%s/tied/%s.%s" % (MODE_GROUP, self._site_path(self.records[mname], k0)[1:], pn))
                params = list(dict.fromkeys(id(q) for _, _, _, q in tie))
                g.attrs["sites"] = json.dumps(["%s/%s" % (self._site_path(self.records[n], k), q) for n, k, q, _ in tie])
                g.attrs["parameters"] = json.dumps([names.get(i, "?") for i in params])
                acc = self._grad_now(p)
                if acc is None:
                    raise QatDumpError("mode tied: parameter '%s.%s' has no .grad: run backward before write()"
                                       % (mname, pn))
                write_tensor(g, "accumulated", acc)

    def _write_module(self, f, rec, gprefix=None, call=-1, gi=0):
        """Module rec as a group: its call `call`'s inputs, outputs and saved
        tensors and the gi-th gradient of each (a micro-batch's; the one
        backward's otherwise), under gprefix (default: the dumper's)."""
        m = rec.module
        gpath = (gprefix or self.prefix) + (_clean_name(rec.name) or "root")
        ins, outs, saveds = rec.per_call[call]
        g = f.require_group(gpath)
        g.attrs["class"] = rec.cls
        contract = getattr(m, "qatcheck_contract", None)
        if getattr(rec, "bf16_compute", False) and "compute_dtype" not in (contract or {}):
            contract = dict(contract or {}, compute_dtype="bfloat16")  # observed at its forward
        out = saveds.get("out") if rec.cls == "attention" else None
        if out is not None and out.dtype in _OUT_DTYPES and "saved_out_dtype" not in (contract or {}):
            # the dtype the backward reads O in for Delta = rowsum(dO * O) (docs/classes.md, attention)
            contract = dict(contract or {}, saved_out_dtype=_OUT_DTYPES[out.dtype])
        contract = self._sr_identity(rec, contract)
        if contract is not None:
            g.attrs["contract"] = json.dumps(contract)
        dys = {n: gs[gi] for n, gs in rec.grad_out.items()}
        declared = _deployed_dtypes(rec.cls, contract)
        for k, v in (getattr(m, "qatcheck_dtypes", None) or {}).items():
            declared[k if "/" in k else "saved/" + k] = v
        for role, d in (("inputs", ins), ("outputs", outs), ("saved", saveds),
                        ("grad_out", dys), ("params", {k: t for k, (t, _) in rec.params.items()})):
            for name, t in d.items():
                if t.dtype == torch.uint8 and role + "/" + name not in declared and role in ("saved", "params"):
                    rec.not_captured.append("%s/%s is uint8 with no declared element type: if it holds float8 or "
                                            "float4 bytes, set qatcheck_dtypes = {'%s/%s': 'float8_e4m3fn'} on the "
                                            "module" % (role, name, role, name))
        g.attrs["not_captured"] = json.dumps(list(dict.fromkeys(rec.not_captured)))
        if rec.autocast is not None:  # evidence for qatcheck's reference variants (docs/tolerances.md)
            g.attrs["autocast"] = rec.autocast
        if rec.cpu_bf16:  # qatcheck refuses GEMM classes whose producer accumulated them in bf16
            g.attrs["cpu_bf16_gemm_acc"] = _cpu_bf16_gemm_acc()
        for role, d in (("inputs", ins), ("outputs", outs), ("saved", saveds),
                        ("grad_out", dys)):
            if d:
                sub = g.require_group(role)
                for name, t in d.items():
                    write_tensor(sub, name, t, declared.get(role + "/" + name))
        psub = g.require_group("params")
        for name, (t, frozen) in rec.params.items():
            ds = write_tensor(psub, name, t, declared.get("params/" + name))
            if frozen:
                ds.attrs["frozen"] = "1"
        self._write_sharding(g, m, rec)
        # one backward per step: every gradient belongs to the one dY
        for dyname in rec.grad_out:
            gg = g.require_group("grads/" + dyname)
            for d in (rec.input_grads, rec.param_grads):
                for name, gs in d.items():
                    write_tensor(gg, "d_" + name, gs[gi])

    def _sr_identity(self, rec, contract):
        """A contract that rounds the weight stochastically ("rounding":
        {"sr": ...}) without an sr_salt gets sr_salt = the weight Parameter's
        name as model.named_parameters() gives it (the first module that
        registered it, FSDP1's wrapper level dropped): the parameter's
        identity of docs/numerics.md "Stochastic rounding", so the sites of a
        tied weight declare one identity, not one per module path."""
        r = (contract or {}).get("rounding")
        if not (isinstance(r, dict) and "sr" in r) or "sr_salt" in contract:
            return contract
        p = rec.module._parameters.get("weight")
        if p is None:
            return contract
        if getattr(self, "_param_names", None) is None:
            self._param_names = {id(q): _clean_name(n) for n, q in self.model.named_parameters()}
        own = (_clean_name(rec.name) + ".weight") if rec.name else "weight"
        return dict(contract, sr_salt=self._param_names.get(id(p), own))

    def _write_sharding(self, g, m, rec):
        """The module's parallel layout: `parallel` on the group, `shard_dim`
        on the datasets holding this rank's piece."""
        kind = getattr(m, "qatcheck_parallel", None)
        shard = dict(getattr(m, "qatcheck_shard", None) or {})
        reduce = getattr(m, "qatcheck_grad_reduce", None)
        if rec.fsdp1 is not None or rec.fsdp2 is not None:  # FSDP: its pieces, its reduction, data-parallel tokens
            if rec.fsdp1 is not None:
                fp, w, params = rec.fsdp1
                kind = kind or "fsdp_flat"
                reduce = reduce or _fsdp1_reduce(w, self.world_size)
                for pn, (_, _, shape) in params.items():
                    shard.setdefault("params/" + pn, ("fsdp_flat", shape))
            else:
                kind = kind or "fsdp"
                reduce = reduce or rec.fsdp2[0]
                for pn in rec.fsdp2[1]:
                    shard.setdefault("params/" + pn, 0)
            if (rec.cls, kind) not in SHARD_DEFAULTS:
                for role in ("inputs", "outputs", "grad_out"):
                    for name in (g[role] if role in g else {}):
                        if g[role][name].ndim >= 1:
                            shard.setdefault(role + "/" + name, 0)
        if kind is None and not shard and reduce is None:
            return
        if not self._sharded:
            raise QatDumpError("module '%s' declares a parallel layout (qatcheck_parallel / qatcheck_shard): each rank "
                               "writes its own file: put '{rank}' in the dump path (step.rank{rank}.h5)" % rec.name)
        if kind is not None:
            if kind not in PARALLEL_KINDS:
                raise QatDumpError("module '%s': qatcheck_parallel %r: expected one of %s"
                                   % (rec.name, kind, ", ".join(PARALLEL_KINDS)))
            g.attrs["parallel"] = kind
        if reduce is not None:
            if reduce not in GRAD_REDUCE:
                raise QatDumpError("module '%s': qatcheck_grad_reduce %r: expected sum or mean" % (rec.name, reduce))
            g.attrs["grad_reduce"] = reduce
        defaults = SHARD_DEFAULTS.get((rec.cls, kind), {}) if kind is not None else {}
        declared = set(shard)
        for k, v in defaults.items():
            shard.setdefault(k, v)
        for name, dim in shard.items():
            if dim is None:
                continue
            if name not in g:
                if name not in declared:
                    continue  # a default for a dataset this module does not have (no bias, saved topk_weights)
                raise QatDumpError("module '%s': qatcheck_shard names %r, which the dump does not hold" % (rec.name, name))
            if isinstance(dim, (tuple, list)) and len(dim) == 2 and dim[0] == "fsdp_flat":
                shape = [int(v) for v in dim[1]]
                n = int(np.prod(shape))
                if g[name].ndim != 1 or g[name].shape[0] != -(-n // self.world_size):
                    raise QatDumpError("module '%s': %r is %s: an fsdp_flat piece of the whole %s over %d ranks is 1-D "
                                       "of %d elements" % (rec.name, name, list(g[name].shape), shape, self.world_size,
                                                           -(-n // self.world_size)))
                g[name].attrs["shard_flat"] = json.dumps(shape)
            elif isinstance(dim, (int, np.integer)) and not isinstance(dim, bool):
                g[name].attrs["shard_dim"] = np.int64(dim)
            else:
                raise QatDumpError("module '%s': qatcheck_shard[%r] = %r: expected a dimension (int), None, or "
                                   "(\"fsdp_flat\", whole shape)" % (rec.name, name, dim))

    def detach(self):
        """Remove every hook and forward wrapper this dumper placed."""
        if self._early_stop is not None:
            self._early_stop.__exit__(None, None, None)
            self._early_stop = None
        for h in self._handles:
            h.remove()
        for rec in self.records.values():
            for h in rec.handles:
                h.remove()
            if rec.restore:
                rec.restore()
                rec.restore = None
        self._handles = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.write()
        finally:
            self.detach()
        return False


def attach(model, path=None, modules=None, classes=None, prefix="/", rank=None, world_size=None, mode="eager",
           host_copies=False):
    """Hook the modules of `model` whose name matches the regex `modules`
    (None: all) and whose class is in `classes` ({torch class: qatcheck
    class}, added to DEFAULT_CLASSES) or that carry a `qatcheck_class`
    attribute. Run one forward and backward, then write() (or leave the
    `with` block) before the optimizer step. Under torch.distributed (or
    with rank= and world_size=) each rank writes its own file: put "{rank}"
    in the path. `mode` names the execution mode the step runs under
    (MODES; docs/qatdump.md "Execution modes"): written as the root
    attribute `mode`, with the evidence the mode needs. With host_copies
    every recorded tensor is copied to host memory at once instead of
    cloned on its device (the same dump; the device holds no second copy
    of the parameters and gradients)."""
    return Dumper(model, path, modules, classes, prefix, rank, world_size, mode, host_copies)


def _ls(path):
    with h5py.File(path, "r") as f:
        print("mode=%s%s" % (f.attrs.get("mode", "eager"), "".join(
            "  %s=%s" % (k, f.attrs[k]) for k in ("autocast_device", "autocast_dtype", "microbatches") if k in f.attrs)))

        def show(name, obj):
            if isinstance(obj, h5py.Group) and "class" in obj.attrs:
                print("/%s  class=%s%s" % (name, obj.attrs["class"],
                                           "  contract=" + obj.attrs["contract"] if "contract" in obj.attrs else ""))
                if obj.attrs.get("not_captured", "[]") != "[]":
                    print("  not captured: %s" % obj.attrs["not_captured"])
            elif isinstance(obj, h5py.Group) and ("sites" in obj.attrs or "equal" in obj.attrs):
                print("/%s  %s" % (name, "  ".join("%s=%s" % (k, obj.attrs[k]) for k in ("sites", "parameters", "equal")
                                                    if k in obj.attrs)))
            elif isinstance(obj, h5py.Dataset):
                print("  /%s %s %s%s" % (name, list(obj.shape), obj.attrs.get("dtype", obj.dtype),
                                         " frozen" if "frozen" in obj.attrs else ""))
        f.visititems(show)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "ls":
        _ls(sys.argv[2])
    else:
        print("usage: qatdump.py ls DUMP.h5   (the library: import qatdump; see docs/qatdump.md)", file=sys.stderr)
        sys.exit(2)
