#!/usr/bin/python3
"""conformance.py: qatcheck's quantizers against quant_oracle.py, byte for byte.

  conformance.py encoders [--start S] [--count N]   E4M3/E5M2/E2M1/E8M0 encoders over
                                                  float32 bit patterns [S, S+N)
                                                  (N = 2^32 - S: exhaustive)
  conformance.py quantizers --values N [--seed S] every format x profile on >= N
                                                  random values plus specials
Prints one summary line per item and exits 1 on any mismatching byte.
The C side is scripts/conformance/quant_driver.c, built here with gcc."""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("numpy", "ml_dtypes")
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quant_oracle as O  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def build_driver(tmp):
    exe = os.path.join(tmp, "quant_driver")
    # the quantizers need the core and numerics layers alone
    srcs = [os.path.join(ROOT, "scripts/conformance/quant_driver.c")]
    for layer in ("core", "numerics"):
        d = os.path.join(ROOT, "src", layer)
        srcs += [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".c")]
    subprocess.run(["gcc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-I" + os.path.join(ROOT, "src"), *srcs, "-lm",
                    "-lpthread", "-o", exe], check=True)
    return exe


def e8m0_ceil_oracle(x):
    """ceil(log2(x)) + 127 in float64 (exact for float32 normals: log2 of
    2^k (1 + 2^-23) is k + 1.7e-7, far from an integer in float64)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.ceil(np.log2(x.astype(np.float64)))
    return np.clip(e + 127, 0, 255).astype(np.uint8)


def compared(name, x):
    """Where an encoder has a defined answer to compare: E2M1 has no NaN (a
    quantizer refuses NaN before encoding); the E8M0 ceiling is defined by
    the bit rule on positive normal floats (zero, subnormals and negatives are
    the rule's own corner: 0 -> 0, a subnormal -> 2^-126)."""
    if name == "e2m1":
        return ~np.isnan(x)
    if name == "e8m0":
        return np.isfinite(x) & (x >= np.float32(2.0 ** -126))
    return np.ones(x.shape, bool)


def encoders(exe, start, count):
    chunk = 1 << 25
    enc = {"e4m3": O.enc_e4m3, "e5m2": O.enc_e5m2, "e2m1": O.enc_e2m1, "e8m0": e8m0_ceil_oracle}
    bad = 0
    t0 = time.time()
    for name, ora in enc.items():
        nbad = 0
        ncmp = 0
        first = None
        proc = subprocess.Popen([exe, "enc", name, str(start), str(count)], stdout=subprocess.PIPE)
        done = 0
        while done < count:
            n = min(chunk, count - done)
            got = np.frombuffer(proc.stdout.read(n), np.uint8)
            pats = (np.arange(n, dtype=np.uint64) + np.uint64(start + done)).astype(np.uint32)
            x = pats.view(np.float32)
            with np.errstate(invalid="ignore"):
                want = ora(x)
            sel = compared(name, x)
            ncmp += int(sel.sum())
            diff = np.nonzero((got != want) & sel)[0]
            if diff.size and first is None:
                i = diff[0]
                first = (hex(int(pats[i])), int(want[i]), int(got[i]))
            nbad += diff.size
            done += n
        proc.wait()
        print(f"encoder {name}: patterns [{start:#x}, {start + count:#x}) = {count} values, {ncmp} compared, {nbad} mismatches"
              + (f", first (bits, oracle, qatcheck) {first}" if first else ""), flush=True)
        bad += nbad
    print(f"encoders: {time.time() - t0:.0f} s")
    return bad


def specials(rng, rows, cols):
    """A matrix of planted specials (section 'Evidence' of issue 3)."""
    n = rows * cols
    pool = np.array([0.0, -0.0, -1e-30, -1e-8, 1e-45, -1e-45, 1e-39, 2.0 ** -9, 2.0 ** -10, -2.0 ** -10, 3 * 2.0 ** -11,
                     1.0, 2.0, 0.5, 448.0, -448.0, 464.0, 480.0, 1e4, -1e4, 6.0, 5.0, 0.25, 0.75, 2.5, 3.5,
                     1e-10 * 448, 1e-4, 1e-4 / 448, 2.0 ** -33, 2.0 ** -42], np.float32)
    x = rng.choice(pool, n).astype(np.float32)
    p2 = np.ldexp(np.float32(1), rng.integers(-40, 40, n)).astype(np.float32)
    up = np.nextafter(p2, np.float32(np.inf), dtype=np.float32)
    sel = rng.integers(0, 3, n)
    x = np.where(sel == 0, x, np.where(sel == 1, p2, up)).astype(np.float32)
    x *= np.where(rng.random(n) < 0.5, np.float32(-1), np.float32(1))
    return x.reshape(rows, cols)


def matrix(rng, kind):
    rows = int(rng.choice([1, 3, 127, 128, 129, 255, 300]))
    cols = int(rng.choice([1, 15, 16, 17, 31, 32, 33, 127, 128, 129, 1000, 2048, 4100]))
    if kind == "special":
        return specials(rng, rows, cols)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    # scales that put blocks at, below and above every floor: per matrix,
    # per row and per 16-column group
    f = np.float32(10.0) ** rng.uniform(-14, 5)
    f = f * np.float32(10.0) ** rng.uniform(-4, 2, (rows, 1))
    f = f * np.repeat(np.float32(10.0) ** rng.uniform(-3, 0, (1, -(-cols // 16))), 16, axis=1)[:, :cols]
    x = (x * f.astype(np.float32)).astype(np.float32)
    if rng.random() < 0.3:   # zero regions: a 128x128 block, rows, 16-groups
        x[:128, :128] = 0
        x[rng.random(rows) < 0.1, :] = 0
        g = np.repeat(rng.random(-(-cols // 16)) < 0.1, 16)[:cols]
        x[:, g] = 0
    if rng.random() < 0.3:   # saturating outliers
        m = rng.random(x.shape) < 0.001
        x[m] *= np.float32(1e3)
    return x


def run_one(exe, fmt, prof, x, sr):
    rows, cols = x.shape
    args = [exe, "quant", fmt, prof, str(rows), str(cols)] + ([str(v) for v in sr] if sr else [])
    got = subprocess.run(args, input=x.astype(np.float32).tobytes(), stdout=subprocess.PIPE, check=True).stdout
    payload, scale, g = O.quantize(fmt, prof, x, sr)
    want = payload.tobytes() + np.ascontiguousarray(scale).tobytes() + (g.tobytes() if g is not None else b"")
    if got == want:
        return 0, None
    a = np.frombuffer(got, np.uint8)
    b = np.frombuffer(want, np.uint8)
    if a.size != b.size:
        return max(a.size, b.size), f"size {a.size} vs oracle {b.size}"
    d = np.nonzero(a != b)[0]
    return d.size, f"first byte {d[0]} of {a.size} (payload {payload.size} bytes): qatcheck {a[d[0]]:#x}, oracle {b[d[0]]:#x}"


def quantizers(exe, total, seed):
    rng = np.random.default_rng(seed)
    bad = 0
    t0 = time.time()
    per = max(1, total // len(O.FORMATS))
    total_vals = total_runs = 0
    for fmt in O.FORMATS:
        counts = {}
        nsr = 0
        nvals = 0
        fbad = 0
        while nvals < per:
            x = matrix(rng, "special" if rng.random() < 0.25 else "normal")
            # every profile on a share of the matrices; vllm on all
            profs = ["vllm"] + [p for p in O.PROFILES[1:] if rng.random() < 0.25]
            for prof in profs:
                sr = (int(rng.integers(0, 2 ** 63)), int(rng.integers(0, 2 ** 32)), int(rng.integers(0, 100))) \
                    if rng.random() < 0.2 else None
                n, why = run_one(exe, fmt, prof, x, sr)
                counts[prof] = counts.get(prof, 0) + x.size
                nsr += x.size if sr else 0
                if n:
                    fbad += n
                    print(f"  MISMATCH {fmt}/{prof} shape {x.shape} sr {sr}: {n} bytes; {why}", flush=True)
            nvals += x.size
        print(f"quantizer {fmt}: {nvals} values (per profile: {counts}; {nsr} of the profile runs with "
              f"stochastic rounding), {fbad} mismatching bytes", flush=True)
        bad += fbad
        total_vals += nvals
        total_runs += sum(counts.values())
    print(f"quantizers: {total_vals} values, {total_runs} value-profile comparisons, {time.time() - t0:.0f} s")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["encoders", "quantizers"])
    ap.add_argument("--start", type=lambda s: int(s, 0), default=0)
    ap.add_argument("--count", type=lambda s: int(s, 0), default=None)
    ap.add_argument("--values", type=float, default=1e6)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_driver(tmp)
        if a.what == "encoders":
            count = a.count if a.count is not None else (1 << 32) - a.start
            bad = encoders(exe, a.start, count)
        else:
            bad = quantizers(exe, int(a.values), a.seed)
    print("RESULT:", "0 mismatches" if bad == 0 else f"{bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
