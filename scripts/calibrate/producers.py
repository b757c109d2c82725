"""producers.py: the producer paths of the calibration, written from the
formulas of docs/numerics.md the way each execution engine is fed them:
eager PyTorch ops (profile torch, and vLLM's eager nvfp4 and mx code),
torch.compile'd functions (vLLM's per_block_cast_to_fp8 and its native
activation quantizer run under Inductor), a Triton kernel (vLLM's
per-token-group fallback) and CUDA C++ (producers.cu, loaded by
calibrate.py). Nothing here is copied from a producer's source.

Every function takes a 2-D CUDA tensor x (float32 or bfloat16) and returns
numpy arrays in qatcheck's deployed layout: (payload, scales, global scale or
None). e2m1 codes are returned one a byte and packed by the caller."""
import numpy as np
import torch
import torch.nn.functional as F

F8 = getattr(torch, "float8_e4m3fn", None)
C229 = 1.0 / (448.0 * 512.0)


def e4m3(t):
    """float32 tensor -> e4m3 bytes (torch's cast; callers clamp to +-448 first)."""
    if F8 is None:  # a CPU dry run without float8 dtypes (calibrate.py --dry): ml_dtypes casts
        import ml_dtypes
        a = t.detach().cpu().numpy().astype(np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        return torch.from_numpy(a.copy()).to(t.device)
    return t.to(F8).view(torch.uint8)


def e4m3_float(b):
    """e4m3 bytes -> float32 values (exact)."""
    if F8 is None:
        import ml_dtypes
        a = b.detach().cpu().numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        return torch.from_numpy(a).to(b.device)
    return b.view(F8).float()


def e2m1(t):
    """float32 tensor -> e2m1 codes (uint8, low nibble): round to nearest,
    ties to the even code, saturating at 6, sign kept (as vLLM's reference
    writes it: thresholds)."""
    a = t.abs()
    c = torch.zeros_like(a, dtype=torch.uint8)
    for thr, strict in ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False)):
        c += (a > thr) if not strict else (a >= thr)
    return c | (torch.signbit(t).to(torch.uint8) << 3)


def _np(t):
    return t.detach().cpu().numpy()


def _pad_cols(x, g):
    pad = (-x.shape[1]) % g
    return F.pad(x, (0, pad)) if pad else x


def _pad2(x, b):
    pr, pc = (-x.shape[0]) % b, (-x.shape[1]) % b
    return F.pad(x, (0, pc, 0, pr)) if pr or pc else x


# ---- eager PyTorch ----------------------------------------------------------------

def eager_fp8_tensor(x):
    amax = x.abs().float().amax()
    s = amax / 448.0
    q = e4m3((x.float() * (1.0 / s)).clamp(-448, 448))
    return _np(q), _np(s.reshape(1)), None


def eager_fp8_token(x):
    amax = x.abs().float().amax(dim=1, keepdim=True)
    s = (amax / 448.0).clamp(min=C229)
    q = e4m3((x.float() * (1.0 / s)).clamp(-448, 448))
    return _np(q), _np(s), None


def eager_fp8_group(x, ue8m0=False):
    rows, cols = x.shape
    xg = _pad_cols(x, 128).view(rows, -1, 128).float()
    amax = xg.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10)
    s = amax / 448.0
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = e4m3((xg * (1.0 / s)).clamp(-448, 448)).view(rows, -1)[:, :cols]
    return _np(q), _np(s.view(rows, -1)), None


def block_view(x):
    xp = _pad2(x, 128)
    return xp.view(xp.shape[0] // 128, 128, xp.shape[1] // 128, 128)


def eager_block(x, ue8m0=False):
    """per_block_cast_to_fp8 as eager ops: s = max(amax, 1e-4) / 448, x * (1 / s)."""
    xv = block_view(x)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    s = amax / 448.0
    if ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = e4m3(xv * (1.0 / s))
    return q, s


def unblock(q, rows, cols):
    return q.reshape(q.shape[0] * 128, q.shape[2] * 128)[:rows, :cols]


def eager_fp8_block128(x):
    q, s = eager_block(x)
    return _np(unblock(q, *x.shape)), _np(s.reshape(s.shape[0], s.shape[2])), None


def requant(x, stage1, stage2):
    """Two stages: stage1(x) -> (q, s) blocks; dequantize q * s in float32;
    stage2(values) -> (q2, s2)."""
    q, s = stage1(x)
    deq = unblock(e4m3_float(q) * s, *x.shape).contiguous()
    q2, s2 = stage2(deq)
    return _np(unblock(q2, *x.shape)), _np(s2.reshape(s2.shape[0], s2.shape[2])), None


def eager_fp8_block128_ue8m0(x):
    return requant(x, eager_block, lambda d: eager_block(d, ue8m0=True))


def eager_nvfp4(x):
    """vLLM's nvfp4 reference as eager ops: g = 2688 / amax, sf = e4m3(min(g * (bmax / 6), 448)),
    elements x * (1 / (sf * (1 / g)))."""
    rows, cols = x.shape
    amax = x.abs().float().amax()
    g = 2688.0 / amax
    xg = _pad_cols(x, 16).view(rows, -1, 16).float()
    bmax = xg.abs().amax(dim=-1, keepdim=True)
    sf8 = e4m3((g * (bmax / 6.0)).clamp(max=448.0))
    sf = e4m3_float(sf8)
    out = torch.where(sf != 0, 1.0 / (sf * (1.0 / g)), torch.zeros_like(sf))
    codes = e2m1((xg * out).clamp(-6.0, 6.0)).view(rows, -1)[:, :cols]
    return _np(codes), _np(sf8.view(rows, -1)), float(g)


def eager_nvfp4_modelopt(x):
    """ModelOpt's NVFP4 export as eager ops (NVFP4QTensor, nvfp4_tensor.py @5a4242f,
    docs/conformance.md): w = amax / (6 * 448); sf = bmax / (6 w), a zero sf set
    to 1, cast to e4m3 with no clamp (under 2^-10 the byte is 0); elements
    x / (float(sf) * w), cast by the sign of x < 0 (-0 gives code 0) and the
    magnitude's place among the midpoints, the odd midpoints (0.75, 1.75, 3.5)
    rounding up (ties to even); NaN and Inf give 7 (x / 0 saturates)."""
    rows, cols = x.shape
    amax = x.abs().float().amax()
    w = amax / (6.0 * 448.0)
    xg = _pad_cols(x, 16).view(rows, -1, 16).float()
    bmax = xg.abs().amax(dim=-1, keepdim=True)
    sf = bmax / (6.0 * w)
    sf = torch.where(sf == 0, torch.ones_like(sf), sf)
    sf8 = e4m3(sf)
    v = xg / (e4m3_float(sf8) * w)
    mid = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=v.device)
    a = v.abs().contiguous()
    code = torch.searchsorted(mid, a).to(torch.uint8)  # midpoints strictly below |v|; NaN sorts last
    code += ((a == 0.75) | (a == 1.75) | (a == 3.5)).to(torch.uint8)
    code += (v < 0).to(torch.uint8) << 3
    return _np(code.view(rows, -1)[:, :cols]), _np(sf8.view(rows, -1)), float(w)


def eager_nvfp4_ct(x):
    """compressed-tensors' NVFP4 as eager ops (helpers.py generate_gparam, calculate_qparams,
    _get_dtype_eps; forward_helpers.py _quantize @ac8e2ba, docs/conformance.md):
    g = 2688 / max(amax, FLT_MIN) (a Python number over a tensor: reciprocal, then the
    product), NaN/Inf -> 1; sf = e4m3(clamp(g * (bmax / 6), 448)), a zero sf set to the
    e4m3 eps 0.125; elements cast to e2m1 (thresholds, ties to even) of x / (sf / g)."""
    rows, cols = x.shape
    amax = x.abs().float().amax().clamp(min=torch.finfo(torch.float32).tiny)
    g = torch.nan_to_num(2688.0 / amax, nan=1.0, posinf=1.0, neginf=1.0)
    xg = _pad_cols(x, 16).view(rows, -1, 16).float()
    bmax = xg.abs().amax(dim=-1, keepdim=True)
    sf8 = e4m3((g * (bmax / 6.0)).clamp(max=448.0))
    sf8 = torch.where(sf8 == 0, torch.full_like(sf8, 0x20), sf8)
    codes = e2m1((xg / (e4m3_float(sf8) / g)).clamp(-6.0, 6.0)).view(rows, -1)[:, :cols]
    return _np(codes), _np(sf8.view(rows, -1)), float(g)


def eager_mxfp8(x):
    """vLLM's torch mx path: e = ceil(log2(amax / 448)) as e8m0 (clamped), x / 2^e, saturating."""
    rows, cols = x.shape
    xg = _pad_cols(x, 32).view(rows, -1, 32).float()
    amax = xg.abs().amax(dim=-1, keepdim=True)
    e = torch.ceil(torch.log2(amax / 448.0))
    byte = (e + 127).clamp(0, 254)
    scale = torch.exp2(byte - 127)
    q = e4m3((xg / scale).clamp(-448, 448)).view(rows, -1)[:, :cols]
    return _np(q), _np(byte.to(torch.uint8).view(rows, -1)), None


def eager_mxfp4(x):
    """The EVEN rule on the bits: e = exponent of (bits(amax) + 0x200000) - 2, x / 2^e."""
    rows, cols = x.shape
    xg = _pad_cols(x, 32).view(rows, -1, 32).float()
    amax = xg.abs().amax(dim=-1, keepdim=True)
    ebits = ((amax.view(torch.int32) + 0x200000) >> 23) & 0xFF
    byte = (ebits - 2).clamp(0, 254)
    scale = torch.exp2((byte - 127).float())
    codes = e2m1((xg / scale).clamp(-6.0, 6.0)).view(rows, -1)[:, :cols]
    return _np(codes), _np(byte.to(torch.uint8).view(rows, -1)), None


EAGER = {
    "fp8_tensor": eager_fp8_tensor, "fp8_token": eager_fp8_token, "fp8_channel": eager_fp8_token,
    "fp8_group128": eager_fp8_group, "fp8_group128_ue8m0": lambda x: eager_fp8_group(x, True),
    "fp8_block128": eager_fp8_block128, "fp8_block128_ue8m0": eager_fp8_block128_ue8m0,
    "nvfp4": eager_nvfp4, "mxfp8": eager_mxfp8, "mxfp4": eager_mxfp4,
}


# ---- torch.compile'd (Inductor) -------------------------------------------------------

def _block_fn(ue8m0, bits):
    def fn(x):
        xv = block_view(x)
        amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
        s = amax / 448.0
        if ue8m0 and bits:  # the exponent bit rule (DeepGEMM)
            u = s.view(torch.int32)
            u = torch.where((u & 0x7FFFFF) != 0, (u & -0x800000) + 0x800000, u)
            s = u.view(torch.float32)
        elif ue8m0:
            s = torch.exp2(torch.ceil(torch.log2(s)))
        return e4m3(xv * (1.0 / s)), s
    return fn


def _native_fn(kind, ue8m0=False):
    """vLLM's torch-native activation quantizer (per tensor, token or 128-group)."""
    def fn(x):
        if kind == "group":
            rows = x.shape[0]
            xg = _pad_cols(x, 128).view(rows, -1, 128)
            absmax = xg.abs().amax(dim=-1, keepdim=True).float()
            raw = absmax / 448.0
            if ue8m0:
                raw = torch.exp2(torch.ceil(torch.log2(raw)))
            s = raw.clamp(min=C229)
            return e4m3((xg / s).clamp(-448.0, 448.0)), s
        amax = x.abs().amax(dim=1, keepdim=True).float() if kind == "token" else x.abs().amax().reshape(1, 1).float()
        s = (amax / 448.0).clamp(min=C229)
        return e4m3((x.float() * s.reciprocal()).clamp(-448.0, 448.0)), s
    return fn


class Compiled:
    """The torch.compile'd producers, compiled once each (dynamic shapes)."""

    def __init__(self):
        c = lambda f: torch.compile(f, dynamic=True, fullgraph=True)  # noqa: E731
        self.block = c(_block_fn(False, False))
        self.block_log = c(_block_fn(True, False))
        self.block_bits = c(_block_fn(True, True))
        self.native = {"tensor": c(_native_fn("tensor")), "token": c(_native_fn("token")),
                       "group": c(_native_fn("group")), "group_ue8m0": c(_native_fn("group", True))}

    def run(self, profile, fmt, x):
        x = x.float()  # exact for bf16; the first operation of every path widens anyway
        rows, cols = x.shape
        if profile in ("vllm", "deepgemm") and fmt == "fp8_block128":
            q, s = self.block(x)
            return _np(unblock(q, rows, cols)), _np(s.reshape(s.shape[0], s.shape[2])), None
        if fmt == "fp8_block128_ue8m0":
            return requant(x, self.block, self.block_bits if profile == "deepgemm" else self.block_log)
        kind = {"fp8_tensor": "tensor", "fp8_token": "token", "fp8_channel": "token", "fp8_group128": "group",
                "fp8_group128_ue8m0": "group_ue8m0"}[fmt]
        q, s = self.native[kind](x)
        if kind.startswith("group"):
            return _np(q.view(rows, -1)[:, :cols]), _np(s.view(rows, -1)), None
        return _np(q), _np(s.reshape(1) if kind == "tensor" else s), None


# ---- Triton: vLLM's per-token-group fallback, from its formulas ------------------------

_TRITON = {}


def _triton_kernel():
    if "k" in _TRITON:
        return _TRITON["k"]
    import triton
    import triton.language as tl

    @triton.jit
    def k(x_ptr, q_ptr, s_ptr, cols, ngroups, eps, fp8_max, G: tl.constexpr, UE8M0: tl.constexpr):
        row = tl.program_id(0)
        grp = tl.program_id(1)
        offs = grp * G + tl.arange(0, G)
        mask = offs < cols
        y = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(y)), eps)
        s = amax / fp8_max
        if UE8M0:
            s = tl.exp2(tl.ceil(tl.log2(s)))
        q = tl.clamp(y / s, -fp8_max, fp8_max).to(q_ptr.dtype.element_ty)
        tl.store(q_ptr + row * cols + offs, q, mask=mask)
        tl.store(s_ptr + row * ngroups + grp, s)

    _TRITON["k"] = k
    return k


def triton_group(x, ue8m0):
    k = _triton_kernel()
    x = x.float().contiguous()
    rows, cols = x.shape
    ng = -(-cols // 128)
    q = torch.empty((rows, cols), dtype=F8, device=x.device)
    s = torch.empty((rows, ng), dtype=torch.float32, device=x.device)
    k[(rows, ng)](x, q, s, cols, ng, 1e-10, 448.0, G=128, UE8M0=ue8m0)
    return _np(q.view(torch.uint8)), _np(s), None
