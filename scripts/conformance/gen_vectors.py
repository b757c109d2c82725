#!/usr/bin/python3
"""gen_vectors.py: write tests/data/quant_vectors.bin from the oracle, for
the CI unit test (tests/unit/test_quant_vectors.c). Every format x profile,
round to nearest and stochastic, on small matrices with specials.

Record: char fmt[24], char prof[24], u32 rows, u32 cols, u32 sr_on, u32 salt,
u64 seed, u32 step, u32 nexp; float32 in[rows*cols]; u8 expected[nexp]
(payload, scale, global-scale bytes as qc_quantize lays them out).
File: magic "QCQV0002", u32 count, then the records (little endian)."""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("numpy", "ml_dtypes")
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quant_oracle as O  # noqa: E402
from conformance import specials  # noqa: E402


def main(out):
    rng = np.random.default_rng(20261129)
    recs = []
    for fmt in O.FORMATS:
        for prof in O.PROFILES:
            for sr in (None, (0x123456789ABCDEF, 0xC0FFEE, 7)):
                rows, cols = (130, 20) if "block" in fmt else (3, 70)
                x = rng.standard_normal((rows, cols)).astype(np.float32)
                x *= np.float32(10.0) ** rng.uniform(-6, 3, (rows, 1)).astype(np.float32)
                x[:, :9] = specials(rng, rows, 9)
                x[1, :] = 0          # an all-zero row / group
                x = x.astype(np.float32)
                p, s, g = O.quantize(fmt, prof, x, sr)
                exp = p.tobytes() + np.ascontiguousarray(s).tobytes() + (g.tobytes() if g is not None else b"")
                seed, salt, step = sr if sr else (0, 0, 0)
                hdr = struct.pack("<24s24sIIIIQII", fmt.encode(), prof.encode(), rows, cols, 1 if sr else 0, salt, seed,
                                  step, len(exp))
                recs.append(hdr + x.tobytes() + exp)
    with open(out, "wb") as f:
        f.write(b"QCQV0002" + struct.pack("<I", len(recs)) + b"".join(recs))
    print(f"{out}: {len(recs)} records")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/quant_vectors.bin")
