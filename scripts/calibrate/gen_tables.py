#!/usr/bin/env python3
"""gen_tables.py: turn the GPU measurements of calibrate.py --measure into
the tables qatcheck embeds (src/numerics/ptables.h describes them):

  rcpa_data.c      rcp.approx.f32: the mantissas m where rcp.approx(1.m)
                   differs from RN(1/1.m), as Golomb-Rice coded gaps (the
                   parameter k that codes them shortest), then one direction
                   bit each (1: larger magnitude); bits least significant
                   first in each byte; base64 text in C string literals
  ceil2log_data.c  the float32 inputs v > 0 where the GPU's ceil(log2f(v))
                   is one below the exact ceiling, sorted: those where
                   log2(v), correctly rounded to float32, is the integer
                   below (ceil2log_theory; calibrate.py --measure checks the
                   GPU's log2f against it on every input)

    gen_tables.py --delta rcpa_delta.bin [--ceil2log LIST.bin] --source TEXT --out DIR

rcpa_delta.bin: 2^23 int8, bits(rcp.approx(1.m)) - bits(RN(1/1.m));
ceil2log_cuda.bin: uint32 float bits. The decoder is checked here against
the input before anything is written."""
import argparse
import base64
import os

import numpy as np


def rice_encode(pos, k):
    """Bits (uint8 0/1 array) of the gaps pos[i] - pos[i-1] (pos[-1] = -1),
    each gap - 1 = q 2^k + r: q ones, a zero, r in k bits (LSB first)."""
    gaps = np.diff(np.concatenate([[-1], pos])) - 1
    q = gaps >> k
    out = []
    for g, qq in zip(gaps.tolist(), q.tolist()):
        out.append([1] * qq + [0] + [(g >> j) & 1 for j in range(k)])
    return np.array([b for grp in out for b in grp], np.uint8)


def rice_decode(bits, n, k):
    pos, i, m = [], 0, -1
    for _ in range(n):
        q = 0
        while bits[i]:
            q += 1
            i += 1
        i += 1
        r = 0
        for j in range(k):
            r |= int(bits[i]) << j
            i += 1
        m += (q << k | r) + 1
        pos.append(m)
    return np.array(pos), i


def ceil2log_theory(jmax=64):
    """The inputs where RN_float32(log2(v)) is the integer just below the
    exact ceiling of log2(v): v = 2^k (1 + j 2^-23) for every normal
    exponent (k != 0), and v = 2^-127 (1 + j 2^-22) in the subnormal band
    (2^-127, 2^-126), with log2 correctly rounded (decided exactly: v's
    log2 is compared with k plus half the float32 spacing next to k). The
    measured sets are this one: calibrate.py --measure checks it."""
    import mpmath
    mpmath.mp.prec = 160
    out = []

    def rounds_to(k, l):
        d = l - k  # > 0
        a = abs(k)
        e = int(mpmath.floor(mpmath.log(a, 2)))
        if k > 0:
            half = mpmath.mpf(2) ** (e - 24)
        else:  # |l| = |k| - d: the spacing below |k|
            half = mpmath.mpf(2) ** (e - 24 - (1 if a == 2 ** e else 0))
        return d < half

    for E in range(1, 255):
        k = E - 127
        if k == 0:
            continue
        for j in range(1, jmax):
            v = mpmath.mpf(2) ** k * (1 + mpmath.mpf(j) / 2 ** 23)
            if not rounds_to(k, mpmath.log(v, 2)):
                break
            out.append((E << 23) | j)
    for j in range(1, jmax):
        v = mpmath.mpf(2) ** -127 * (1 + mpmath.mpf(j) / 2 ** 22)
        if not rounds_to(-127, mpmath.log(v, 2)):
            break
        out.append(0x400000 + j)
    assert all(j < jmax - 1 for j in [x & 0x3FFFFF for x in out])
    return np.array(sorted(out), np.uint32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--delta", required=True)
    ap.add_argument("--ceil2log", help="a measured list (default: ceil2log_theory, which the measurement checks)")
    ap.add_argument("--source", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    d = np.fromfile(a.delta, np.int8)
    assert d.size == 1 << 23 and np.all(np.abs(d) <= 1), "rcp.approx must be within one ulp of RN"
    pos = np.nonzero(d)[0]
    best = None
    for k in range(0, 8):
        gaps = np.diff(np.concatenate([[-1], pos])) - 1
        nbits = int(((gaps >> k) + 1 + k).sum())
        if best is None or nbits < best[1]:
            best = (k, nbits)
    k = best[0]
    bits = rice_encode(pos, k)
    up = (d[pos] > 0).astype(np.uint8)
    allbits = np.concatenate([bits, up])
    packed = np.packbits(allbits, bitorder="little")
    # check the decoder before writing anything
    un = np.unpackbits(np.frombuffer(base64.b64decode(base64.b64encode(packed.tobytes())), np.uint8), bitorder="little")
    got, used = rice_decode(un, len(pos), k)
    assert np.array_equal(got, pos) and np.array_equal(un[used:used + len(pos)], up), "rice round trip"
    text = base64.b64encode(packed.tobytes()).decode()
    lines = [text[i:i + 100] for i in range(0, len(text), 100)]
    src = a.source.replace('"', "'")
    with open(os.path.join(a.out, "rcpa_data.c"), "w") as f:
        f.write("/* rcpa_data.c: rcp.approx.f32 against RN(1/x) for the 2^23 mantissas, as\n"
                " * measured on %s.\n"
                " * Generated by scripts/calibrate/gen_tables.py (format: numerics/ptables.h);\n"
                " * do not edit. %d mantissas differ (%.2f%%), %d of them one ulp up. */\n"
                % (src, len(pos), 100.0 * len(pos) / d.size, int(up.sum())))
        f.write('#include "numerics/ptables.h"\n\n')
        f.write('const char qc_ptables_source[] = "%s";\n' % src)
        f.write("const uint32_t qc_rcpa_ndiff = %du, qc_rcpa_rice_k = %du, qc_rcpa_nup = %du;\n" % (len(pos), k, int(up.sum())))
        f.write("const char qc_rcpa_rice_b64[] =\n")
        for i, ln in enumerate(lines):
            f.write('    "%s"%s\n' % (ln, ";" if i == len(lines) - 1 else ""))
        if not lines:
            f.write('    "";\n')
    exc = np.unique(np.fromfile(a.ceil2log, np.uint32)) if a.ceil2log else ceil2log_theory()
    with open(os.path.join(a.out, "ceil2log_data.c"), "w") as f:
        f.write("/* ceil2log_data.c: the %d float32 inputs v (as bits) where ceil(log2f(v)) on\n"
                " * the GPU is one below the exact ceiling: v = 2^k (1 + j 2^-23) with log2(v)\n"
                " * rounding to k, for every normal exponent, and the band just above 2^-127.\n"
                " * Checked against every float32 input on %s.\n"
                " * Generated by scripts/calibrate/gen_tables.py; do not edit. */\n" % (len(exc), src))
        f.write('#include "numerics/ptables.h"\n\n')
        f.write("const uint32_t qc_ceil2log_nexc = %du;\n" % len(exc))
        f.write("const uint32_t qc_ceil2log_exc[] = {\n")
        vals = ["0x%08xu" % v for v in exc.tolist()] or ["0"]
        for i in range(0, len(vals), 8):
            f.write("    " + ", ".join(vals[i:i + 8]) + ",\n")
        f.write("};\n")
    print("rcpa: %d differ (k=%d, %d bytes packed, %d base64); ceil2_log: %d exceptions"
          % (len(pos), k, packed.size, len(text), len(exc)))


if __name__ == "__main__":
    main()
