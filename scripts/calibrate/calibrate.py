#!/usr/bin/env python3
"""calibrate.py: measure the GPU's approximate arithmetic and write the bytes
every producer path makes, for qatcheck's quantizers to be compared against
(docs/conformance.md). Runs on a CUDA GPU with PyTorch (2.x, float8 dtypes),
Triton and nvcc.

    calibrate.py --work DIR [--measure OUT] [--full DIR] [--golden DIR] [--seed S]

  --measure OUT  measure rcp.approx.f32 (all 2^23 mantissas, then all 2^32
                 inputs against the table), div.full.f32 = RN(x * rcp.approx(y))
                 on 2 x 2^30 pairs, what eager PyTorch, Inductor and Triton
                 compute for 1/t, x/y and t/448, and exp2(ceil(log2(v))) over
                 every positive float in CUDA C++, eager, Inductor and Triton;
                 writes OUT/measure.json and the tables (gen_tables.py) as
                 OUT/rcpa_data.c and OUT/ceil2log_data.c
  --full DIR     the full calibration set: one DIR/<format>.qcal per format,
                 10^7+ values, every producer path of the format
  --golden DIR   the small golden subset (same paths, small inputs) for CI

The producer paths (which engine runs which formula) are listed in PATHS."""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
for _k, _v in (("recompile_limit", 256), ("cache_size_limit", 256), ("accumulated_recompile_limit", 4096),
               ("accumulated_cache_size_limit", 4096)):
    try:  # the compiled producers recompile per shape and per closure: allow it
        import torch._dynamo
        setattr(torch._dynamo.config, _k, _v)
    except (ImportError, AttributeError):
        pass
sys.path.insert(0, HERE)
import producers as P  # noqa: E402
import qcal  # noqa: E402

FORMATS = ["fp8_tensor", "fp8_token", "fp8_channel", "fp8_group128", "fp8_group128_ue8m0", "fp8_block128",
           "fp8_block128_ue8m0", "nvfp4", "mxfp8", "mxfp4"]
FP4 = ("nvfp4", "mxfp4")

# (profile, format) -> engine: "eager", "inductor", "triton" or a CUDA C++ path
# of producers.cu (cuda:<kind>:<path>[:afloor:sfloor:pow2]).
FP8_GEO = {"fp8_tensor": (0, 0), "fp8_token": (1, 0), "fp8_channel": (1, 0), "fp8_group128": (1, 128),
           "fp8_group128_ue8m0": (1, 128), "fp8_block128": (128, 128), "fp8_block128_ue8m0": (128, 128)}
PATHS = {}
for f in FORMATS:
    PATHS[("torch", f)] = "eager"
PATHS.update({
    ("vllm", "fp8_tensor"): "cuda:fp8:0", ("vllm", "fp8_token"): "cuda:fp8:1", ("vllm", "fp8_channel"): "cuda:fp8:1",
    ("vllm", "fp8_group128"): "cuda:fp8:2", ("vllm", "fp8_group128_ue8m0"): "cuda:fp8:3",
    ("vllm", "fp8_block128"): "inductor", ("vllm", "fp8_block128_ue8m0"): "inductor",
    ("vllm", "nvfp4"): "eager", ("vllm", "mxfp8"): "eager", ("vllm", "mxfp4"): "cuda:mx:2",
    ("vllm_native", "fp8_tensor"): "inductor", ("vllm_native", "fp8_token"): "inductor",
    ("vllm_native", "fp8_channel"): "inductor", ("vllm_native", "fp8_group128"): "inductor",
    ("vllm_native", "fp8_group128_ue8m0"): "inductor",
    ("vllm_triton", "fp8_group128"): "triton", ("vllm_triton", "fp8_group128_ue8m0"): "triton",
    ("vllm_cuda_nvfp4", "nvfp4"): "cuda:nvfp4:2",
    ("deepgemm", "fp8_block128_ue8m0"): "inductor",
    ("modelopt", "nvfp4"): "eager:modelopt", ("compressed_tensors", "nvfp4"): "eager:ct",
    ("ocp", "mxfp8"): "cuda:mx:0", ("ocp", "mxfp4"): "cuda:mx:0",
    ("exact", "nvfp4"): "cuda:nvfp4:1", ("exact", "mxfp8"): "cuda:mx:1", ("exact", "mxfp4"): "cuda:mx:1",
    ("te", "nvfp4"): "cuda:nvfp4:0",
})
for f in FP8_GEO:
    PATHS[("te", f)] = "cuda:fp8:%d" % (5 if f.endswith("ue8m0") else 4)
    afloor = 1e-4 if "block" in f else 1e-10 if "group" in f else 0.0
    sfloor = 1.0 / 229376 if f in ("fp8_token", "fp8_channel") else 0.0
    path = 7 if f == "fp8_block128_ue8m0" else 6
    PATHS[("exact", f)] = "cuda:fp8:%d:%r:%r:%d" % (path, afloor, sfloor, 1 if f == "fp8_group128_ue8m0" else 0)


DEV = "cuda"


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


class Cal:
    """libcal.so (measure.cu + producers.cu) through ctypes; device pointers."""

    def __init__(self, work):
        so = os.path.join(work, "libcal.so")
        if not os.path.exists(so):
            t0 = time.time()
            subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", os.path.join(HERE, "measure.cu"),
                            os.path.join(HERE, "producers.cu"), "-o", so], check=True)
            log("nvcc libcal.so: %.1f s" % (time.time() - t0))
        self.lib = ctypes.CDLL(so)

    def __call__(self, name, *args):
        conv = []
        for a in args:
            if isinstance(a, torch.Tensor):
                conv.append(ctypes.c_void_p(a.data_ptr()))
            elif isinstance(a, float):
                conv.append(ctypes.c_float(a))
            else:
                conv.append(ctypes.c_int64(a) if abs(a) > 2**31 - 1 or name in () else ctypes.c_int64(a))
        torch.cuda.synchronize()
        rc = getattr(self.lib, name)(*conv)
        torch.cuda.synchronize()
        if rc:
            raise RuntimeError("%s: cuda error %d" % (name, rc))


def u64(n):
    return torch.zeros(n, dtype=torch.int64, device="cuda")


# ---- measurement ---------------------------------------------------------------------

def measure(cal, work, out, rcpa=True, c2l=True):
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    try:
        import triton
        res["triton"] = triton.__version__
    except ImportError:
        res["triton"] = None
    res["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    # exp2 of the integers an e8m0 byte stands for, as CUDA C++ and torch compute them
    ks = torch.arange(-149, 128, dtype=torch.float32, device="cuda")
    ec = torch.empty_like(ks)
    cal("cal_exp2f", ks, ec, ks.numel())
    et = torch.exp2(ks)
    exact = torch.tensor([2.0 ** k for k in range(-149, 128)], dtype=torch.float32, device="cuda")
    res["exp2f_of_integers"] = {
        "cuda_inexact": {int(k): hex(int(v)) for k, v, w in zip(ks.tolist(), ec.view(torch.int32).tolist(),
                                                                exact.view(torch.int32).tolist()) if v != w},
        "torch_inexact": {int(k): hex(int(v)) for k, v, w in zip(ks.tolist(), et.view(torch.int32).tolist(),
                                                                 exact.view(torch.int32).tolist()) if v != w}}
    log("exp2 of integers", res["exp2f_of_integers"])
    if rcpa:
        measure_rcpa(cal, work, res)
    # engines: 1/t, x/y, t/448, 2688/t (with the table)
    try:
        res["engines"] = engines(cal) if rcpa else "measured with the table"
        log("engines", res["engines"])
    except Exception as e:  # keep measuring
        res["engines"] = {"error": repr(e)}
        log("engines failed", repr(e))
    try:
        res["ceil2_log"] = ceil2log(cal, work) if c2l else "not measured in this run"
        log("ceil2_log", json.dumps(res["ceil2_log"]))
    except Exception as e:
        res["ceil2_log"] = {"error": repr(e)}
        log("ceil2_log failed", repr(e))
    with open(os.path.join(out, "measure.json"), "w") as f:
        json.dump(res, f, indent=1)
    if rcpa:
        src = "%s, torch %s, triton %s, %s, %s" % (res["gpu"], res["torch"], res["triton"], res["nvcc"], time.strftime("%Y-%m-%d"))
        subprocess.run([sys.executable, os.path.join(HERE, "gen_tables.py"), "--delta", os.path.join(work, "rcpa_delta.bin"),
                        "--source", src, "--out", out], check=True)
    return res


def measure_rcpa(cal, work, res):
    """rcp.approx.f32: the table, every input against it, div.full."""
    t0 = time.time()
    delta = torch.empty(1 << 23, dtype=torch.int8, device="cuda")
    bad = u64(1)
    lib = cal.lib
    torch.cuda.synchronize()
    assert lib.cal_rcpa_table(ctypes.c_void_p(delta.data_ptr()), ctypes.c_void_p(bad.data_ptr())) == 0
    torch.cuda.synchronize()
    d = delta.cpu().numpy()
    d.tofile(os.path.join(work, "rcpa_delta.bin"))
    res["rcpa"] = {"mantissas": 1 << 23, "differ": int((d != 0).sum()), "up": int((d > 0).sum()),
                   "beyond_one_ulp": int(bad.item())}
    counts = u64(21)
    ex = torch.zeros(32, dtype=torch.int32, device="cuda")
    assert lib.cal_rcpa_check(ctypes.c_void_p(delta.data_ptr()), ctypes.c_void_p(counts.data_ptr()),
                              ctypes.c_void_p(ex.data_ptr())) == 0
    c = counts.cpu().numpy().tolist()
    classes = ["normal", "subnormal_result", "subnormal_input", "zero_inf_nan"]
    res["rcpa_all_inputs"] = {
        cl: {"inputs": c[16 + i], "mismatch_by_variant": c[4 * i:4 * i + 4],
             "examples_v3": [hex(v & 0xFFFFFFFF) for v in ex.cpu().numpy()[8 * i:8 * i + 8].tolist() if v]}
        for i, cl in enumerate(classes)}
    res["rcpa_all_inputs"]["ftz_differs"] = c[20]
    res["rcpa_all_inputs"]["variants"] = "bit0: subnormal input normalized (else Inf); bit1: subnormal result rounded (else 0)"
    log("rcp.approx table and 2^32 check: %.1f s" % (time.time() - t0), res["rcpa"])
    # div.full against RN(x * rcp.approx(y))
    res["div_full"] = {}
    for rng_ in (0, 1):
        o = u64(3)
        exf = torch.zeros(8, device="cuda")
        assert lib.cal_divfull_sample(ctypes.c_uint64(1 << 30), ctypes.c_int(rng_), ctypes.c_void_p(o.data_ptr()),
                                      ctypes.c_void_p(exf.data_ptr())) == 0
        oo = o.cpu().numpy().tolist()
        res["div_full"]["range%d" % rng_] = {"pairs": oo[2], "differs_from_x_times_rcpa": oo[0], "differs_from_div_rn": oo[1],
                                             "examples": exf.cpu().numpy().tolist()}
    log("div.full", res["div_full"])


def engines(cal):
    """What each engine computes for 1/t, t.reciprocal(), x/y, t/448 and 2688/t."""
    out = {}
    m = torch.arange(1 << 23, dtype=torch.int32, device="cuda")
    ys = [((m | ((127 + e) << 23)).view(torch.float32)) for e in (-40, -3, 0, 9, 60)]
    y = torch.cat(ys)
    g = torch.Generator(device="cuda").manual_seed(7)
    bits = torch.randint(0, 1 << 23, (2, 1 << 26), device="cuda", generator=g, dtype=torch.int32)
    ex = torch.randint(100, 150, (2, 1 << 26), device="cuda", generator=g, dtype=torch.int32)
    sg = torch.randint(0, 2, (2, 1 << 26), device="cuda", generator=g, dtype=torch.int32) << 31
    xy = (bits | (ex << 23) | sg).view(torch.float32)
    px, py = xy[0].contiguous(), xy[1].contiguous()

    def rcp(name, r):
        o = u64(2)
        cal("cal_rcp_check", y, r.contiguous(), y.numel(), o)
        out[name] = {"n": y.numel(), "differs_from_rcp_approx": int(o[0]), "differs_from_rcp_rn": int(o[1])}

    def div(name, q):
        o = u64(3)
        cal("cal_div_check", px, py, q.contiguous(), px.numel(), o)
        out[name] = {"n": px.numel(), "differs_from_x_times_rcp_approx": int(o[0]), "differs_from_div_rn": int(o[1])}

    rcp("eager 1.0/t", 1.0 / y)
    div("eager x/y", px / py)
    ind = torch.compile(lambda t, a, b: (1.0 / t, t.reciprocal(), a / b, a.abs() / 448.0))(y, px, py)
    rcp("inductor 1.0/t", ind[0])
    rcp("inductor t.reciprocal()", ind[1])
    div("inductor x/y", ind[2])
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def kdiv(a_ptr, b_ptr, o_ptr, n, RECIP: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            msk = offs < n
            b = tl.load(b_ptr + offs, mask=msk, other=1.0)
            if RECIP:
                r = 1.0 / b
            else:
                r = tl.load(a_ptr + offs, mask=msk, other=1.0) / b
            tl.store(o_ptr + offs, r, mask=msk)

        q = torch.empty_like(px)
        kdiv[(triton.cdiv(px.numel(), 1024),)](px, py, q, px.numel(), RECIP=False, BLOCK=1024)
        div("triton x/y", q)
        r = torch.empty_like(y)
        kdiv[(triton.cdiv(y.numel(), 1024),)](y, y, r, y.numel(), RECIP=True, BLOCK=1024)
        rcp("triton 1.0/t", r)
    except ImportError:
        pass
    # constants: t / 448 and 2688 / t
    t = px.abs()
    r448 = torch.tensor(np.float32(1 / 448), device="cuda")
    rt = ind[3]
    out["eager t/448 == t*RN(1/448)"] = bool(((t / 448.0) == t * r448).all())
    out["inductor t/448 == t*RN(1/448)"] = bool((rt == t * r448).all())
    out["eager 2688/t == RN(1/t)*2688"] = bool(((2688.0 / t) == (1.0 / t) * 2688.0).all())
    return out


def ceil2log(cal, work):
    """exp2(ceil(log2(v))) and ceil(log2(v)) over every positive finite float,
    per engine (CUDA C++, eager, Inductor, Triton), against the emulation from
    gen_tables.ceil2log_theory(), the list qatcheck embeds."""
    import gen_tables
    exc_np = gen_tables.ceil2log_theory()
    exc = torch.from_numpy(exc_np.view(np.int32)).cuda()
    res = {"list": int(exc_np.size)}
    classes = ("v>=2^-126 (exp2 of it)", "2^-127<v<2^-126 (ceil only)", "v<=2^-127 (ceil only)")

    def summary(cnt, ex):
        c = cnt.cpu().numpy().tolist()
        e = ex.cpu().numpy().view(np.uint32).tolist()
        return {cl: {"inputs": c[3 + i], "mismatches": c[i], "examples": [hex(x) for x in e[4 * i:4 * i + min(4, c[i])]]}
                for i, cl in enumerate(classes)}

    cnt, ex = u64(6), torch.zeros(12, dtype=torch.int32, device="cuda")
    cal("cal_ceil2log_cmp", 0, 0, 0, 0x7F800000 - 1, exc, exc_np.size, cnt, ex)
    res["cuda"] = summary(cnt, ex)
    fns = {"eager": lambda v: torch.ceil(torch.log2(v)),
           "inductor": torch.compile(lambda v: torch.ceil(torch.log2(v)), dynamic=True)}
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def kc(v_ptr, o_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            msk = offs < n
            v = tl.load(v_ptr + offs, mask=msk, other=1.0)
            tl.store(o_ptr + offs, tl.ceil(tl.log2(v)), mask=msk)

        def tri(v):
            o = torch.empty_like(v)
            kc[(triton.cdiv(v.numel(), 1024),)](v, o, v.numel(), BLOCK=1024)
            return o
        fns["triton"] = tri
    except ImportError:
        pass
    step = 1 << 28
    for name, fn in fns.items():
        try:
            cnt.zero_()
            ex.zero_()
            for s0 in range(1, 0x7F800000, step):
                v = torch.arange(s0, min(s0 + step, 0x7F800000), dtype=torch.int32, device="cuda").view(torch.float32)
                k = fn(v)
                g = torch.exp2(k) if name == "eager" else (fn_exp2(name)(k))
                cal("cal_ceil2log_cmp", v, g, k, v.numel(), exc, exc_np.size, cnt, ex)
                del v, k, g
            res[name] = summary(cnt, ex)
        except Exception as e:
            res[name] = {"error": repr(e)}
    return res


_EXP2 = {}


def fn_exp2(name):
    """exp2 as the engine computes it (Inductor: compiled; Triton: a kernel)."""
    if name in _EXP2:
        return _EXP2[name]
    if name == "inductor":
        _EXP2[name] = torch.compile(lambda k: torch.exp2(k), dynamic=True)
    else:
        import triton
        import triton.language as tl

        @triton.jit
        def ke(k_ptr, o_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            msk = offs < n
            tl.store(o_ptr + offs, tl.exp2(tl.load(k_ptr + offs, mask=msk, other=0.0)), mask=msk)

        def f(k):
            o = torch.empty_like(k)
            ke[(triton.cdiv(k.numel(), 1024),)](k, o, k.numel(), BLOCK=1024)
            return o
        _EXP2[name] = f
    return _EXP2[name]


# ---- inputs ------------------------------------------------------------------------------

def bf16_round(t):
    return t.to(torch.bfloat16)


def make_inputs(seed, golden=False):
    """A list of (name, tensor on cuda): bf16 master weights (tie-heavy),
    normal and heavy-tailed float32, zeros and negative zeros, blocks at the
    floors, saturating outliers, unaligned shapes. Golden: the same kinds,
    small."""
    torch.manual_seed(seed)
    g = torch.Generator(device=DEV).manual_seed(seed)
    dev = DEV

    def randn(r, c):
        return torch.randn(r, c, device=dev, generator=g)

    out = []
    # bf16 weights: per-row power-of-two scales; block amax values of the form 7 m 2^j make exact quotients
    r, c = (2048, 2560) if not golden else (130, 136)
    w = randn(r, c) * torch.exp2(torch.randint(-14, 9, (r, 1), device=dev, generator=g).float())
    w[:, ::97] = torch.sign(w[:, ::97]) * 1.75 * torch.exp2(torch.round(torch.log2(w[:, ::97].abs() + 1e-30)))
    w[3::11, 5] = -1e-30
    out.append(("bf16_weights", bf16_round(w)))
    # heavy-tailed float32 (Student t, 1.5 degrees of freedom)
    r, c = (1024, 2560) if not golden else (64, 100)
    chi = torch.distributions.Chi2(torch.tensor(1.5, device=dev)).sample((r, c))
    out.append(("f32_heavy", randn(r, c) / torch.sqrt(chi / 1.5).clamp(min=1e-3)))
    # specials, bf16: zero blocks/rows/groups, -0, tiny negatives, outliers, per-block scales
    r, c = (1000, 1000) if not golden else (150, 140)
    s = randn(r, c) * torch.exp2(torch.randint(-12, 6, (r // 8 + 1, 1), device=dev, generator=g).float()).repeat_interleave(8, 0)[:r]
    s[:128, :128] = 0.0
    s[200:210, :] = 0.0
    s[:, 300:316] = 0.0
    s[::13, ::7] = -0.0
    s[5::17, 3::5] = -1e-30
    s[7::19, 11] *= 1000.0
    s[9::23, :64] = 448.0
    out.append(("bf16_specials", bf16_round(s)))
    # float32 at the floors: rows whose amax sits at 1e-10, 1e-4, 448/229376, 2^-33, subnormal, ...
    r, c = (777, 1111) if not golden else (64, 100)
    targets = torch.tensor([0.0, 1e-12, 1e-10, 1.0000001e-10, 9.999999e-11, 2e-10, 5e-5, 1e-4, 1.0001e-4, 2e-4,
                            448.0 / 229376, 1e-3, 2.0 ** -33, 2.0 ** -40, 1e-36, 3e-39, 0.1, 1.0, 448.0, 1e4],
                           device=dev)
    t = targets[torch.arange(r, device=dev) % len(targets)].unsqueeze(1)
    base = randn(r, c)
    base = base / base.abs().amax(dim=1, keepdim=True)
    fl = (base * t).float()
    fl[:, 0] = t[:, 0] * torch.where(torch.arange(r, device=dev) % 2 == 0, 1.0, -1.0)
    out.append(("f32_floors", fl))
    # unaligned small shapes
    for (rr, cc, bf) in ((1, 16, True), (3, 17, False), (129, 130, True), (7, 33, False), (257, 129, True),
                         (300, 457, False)):
        if golden and rr * cc > 400:
            continue
        x = randn(rr, cc) * 3.0
        out.append(("shape_%dx%d" % (rr, cc), bf16_round(x) if bf else x))
    # float32 elements planted next to e4m3 midpoints where rcp.approx(s) and rcp.rn(s) round apart
    if DEV == "cuda":
        import make_torch_data
        r, c = (512, 640) if not golden else (130, 136)
        out.append(("f32_near_ties", make_torch_data.plant_near_ties(randn(r, c) * 0.05)[0]))
    if not golden:
        x = randn(512, 1024) * torch.exp2(torch.randint(-20, 10, (4, 8), device=dev, generator=g).float()).repeat_interleave(128, 0).repeat_interleave(128, 1)
        out.append(("bf16_block_spread", bf16_round(x)))
    return out


def to_numpy_input(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(np.uint16)
    return t.float().cpu().numpy()


# ---- running the producers ---------------------------------------------------------------

def run_path(cal, comp, profile, fmt, x):
    eng = PATHS[(profile, fmt)]
    if eng.startswith("eager"):
        return {"eager:modelopt": P.eager_nvfp4_modelopt, "eager:ct": P.eager_nvfp4_ct}.get(eng, P.EAGER[fmt])(x)
    if eng == "inductor":
        return comp.run(profile, fmt, x)
    if eng == "triton":
        return P.triton_group(x, fmt.endswith("ue8m0"))
    parts = eng.split(":")
    kind, path = parts[1], int(parts[2])
    xx = x.contiguous()
    bf = 1 if x.dtype == torch.bfloat16 else 0
    if not bf:
        xx = xx.float()
    rows, cols = x.shape
    codes = torch.zeros((rows, cols), dtype=torch.uint8, device="cuda")
    if kind == "fp8":
        br, bc = FP8_GEO[fmt]
        gr = -(-rows // br) if br else 1
        gc = -(-cols // bc) if bc else 1
        sc = torch.zeros(gr * gc, dtype=torch.float32, device="cuda")
        afloor, sfloor, pow2 = (float(parts[3]), float(parts[4]), int(parts[5])) if len(parts) > 3 else (0.0, 0.0, 0)
        lib = cal.lib
        torch.cuda.synchronize()
        rc = lib.cal_fp8(ctypes.c_int(path), ctypes.c_int64(rows), ctypes.c_int64(cols), ctypes.c_int(br), ctypes.c_int(bc),
                         ctypes.c_int(bf), ctypes.c_void_p(xx.data_ptr()), ctypes.c_void_p(codes.data_ptr()),
                         ctypes.c_void_p(sc.data_ptr()), ctypes.c_float(afloor), ctypes.c_float(sfloor), ctypes.c_int(pow2))
        assert rc == 0, rc
        s = sc.cpu().numpy()
        return codes.cpu().numpy(), (s.reshape(1) if fmt == "fp8_tensor" else s.reshape(gr, gc)), None
    if kind == "nvfp4":
        ng = -(-cols // 16)
        sb = torch.zeros(rows * ng, dtype=torch.uint8, device="cuda")
        if path == 2:  # the vLLM kernel takes the global scale its caller computed in eager PyTorch
            gval = float(2688.0 / x.abs().float().amax())
        else:
            gdev = torch.zeros(1, dtype=torch.float32, device="cuda")
            scr = torch.zeros(1, dtype=torch.int32, device="cuda")
            torch.cuda.synchronize()
            assert cal.lib.cal_gdiv(ctypes.c_void_p(xx.data_ptr()), ctypes.c_int(bf), ctypes.c_int64(rows * cols),
                                    ctypes.c_void_p(scr.data_ptr()), ctypes.c_void_p(gdev.data_ptr()),
                                    ctypes.c_int(path == 0)) == 0
            gval = float(gdev.item())
        torch.cuda.synchronize()
        assert cal.lib.cal_nvfp4(ctypes.c_int(path), ctypes.c_int64(rows), ctypes.c_int64(cols), ctypes.c_int(bf),
                                 ctypes.c_void_p(xx.data_ptr()), ctypes.c_float(gval), ctypes.c_void_p(codes.data_ptr()),
                                 ctypes.c_void_p(sb.data_ptr())) == 0
        return codes.cpu().numpy(), sb.cpu().numpy().reshape(rows, ng), gval
    if kind == "mx":
        ng = -(-cols // 32)
        sb = torch.zeros(rows * ng, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        assert cal.lib.cal_mx(ctypes.c_int(path), ctypes.c_int64(rows), ctypes.c_int64(cols), ctypes.c_int(bf),
                              ctypes.c_int(1 if fmt == "mxfp4" else 0), ctypes.c_void_p(xx.data_ptr()),
                              ctypes.c_void_p(codes.data_ptr()), ctypes.c_void_p(sb.data_ptr())) == 0
        return codes.cpu().numpy(), sb.cpu().numpy().reshape(rows, ng), None
    raise ValueError(eng)


def produce(cal, comp, inputs, outdir, only=None, small=False, formats=None):
    """One <format>.qcal per format: the inputs once, every path's bytes."""
    os.makedirs(outdir, exist_ok=True)
    table = {}
    for fmt in formats or FORMATS:
        w = qcal.Writer(os.path.join(outdir, fmt + ".qcal"))
        ids = []
        for name, x in inputs:
            if fmt in ("fp8_tensor", "nvfp4") and not bool((x != 0).any()):
                continue  # an all-zero tensor: no producer defines its scale (docs/numerics.md)
            if small and name == "f32_near_ties" and not fmt.startswith("fp8_block128"):
                continue  # the golden subset keeps the near-ties where they decide (128x128 blocks): under 5 MB
            ids.append((w.add_input(name, to_numpy_input(x)), x))
        for (prof, f2) in PATHS:
            if f2 != fmt or (only and PATHS[(prof, f2)].split(":")[0] not in only):
                continue
            t0 = time.time()
            nval = 0
            for iid, x in ids:
                pay, sc, gs = run_path(cal, comp, prof, fmt, x)
                if fmt in FP4:
                    pay = qcal.pack_e2m1(np.asarray(pay, np.uint8))
                w.add_output(prof, fmt, iid, np.asarray(pay, np.uint8), sc, gs)
                nval += x.numel()
            table["%s/%s" % (prof, fmt)] = nval
            log("%-20s %-20s %10d values %.2f s" % (prof, fmt, nval, time.time() - t0))
        w.close()
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--measure")
    ap.add_argument("--no-rcpa", action="store_true", help="--measure without the rcp.approx table (already committed)")
    ap.add_argument("--no-ceil2log", action="store_true", help="--measure without the ceil(log2) scan")
    ap.add_argument("--full")
    ap.add_argument("--golden")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--dry", action="store_true", help="CPU plumbing test: eager paths only, no GPU")
    ap.add_argument("--formats", help="a comma list: only these formats' files")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    global DEV
    if a.dry:
        DEV = "cpu"
        only = ("eager",)
        cal = comp = None
        if a.golden:
            produce(cal, comp, make_inputs(a.seed + 1, golden=True), a.golden, only)
        if a.full:
            produce(cal, comp, make_inputs(a.seed, golden=True), a.full, only)
        return
    cal = Cal(a.work)
    rc = 0
    if a.measure:
        os.makedirs(a.measure, exist_ok=True)
        try:
            measure(cal, a.work, a.measure, rcpa=not a.no_rcpa, c2l=not a.no_ceil2log)
        except Exception:
            import traceback
            traceback.print_exc()
            rc = 1
    comp = P.Compiled() if (a.full or a.golden) else None
    for which, d, gold, seed in (("golden", a.golden, True, a.seed + 1), ("full", a.full, False, a.seed)):
        if not d:
            continue
        try:
            t = produce(cal, comp, make_inputs(seed, golden=gold), d, small=gold,
                        formats=a.formats.split(",") if a.formats else None)
            with open(os.path.join(d, "values.json"), "w") as f:
                json.dump(t, f, indent=1)
            log("%s: %d paths, at least %d values each" % (which, len(t), min(t.values())))
        except Exception:
            import traceback
            traceback.print_exc()
            rc = 1
    sys.exit(rc)


if __name__ == "__main__":
    main()
