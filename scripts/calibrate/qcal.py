"""qcal.py: the calibration file format (writer and reader), shared by the
calibration scripts. qatcheck reads it in src/io/qcal.c; docs/conformance.md
describes it.

File: magic b"QCAL0001", then chunks, each: u32 tag, u32 0, u64 body length,
body (little endian throughout).
  tag 1 input:  u32 id, u32 dtype (0 float32, 1 bfloat16 bits), i64 rows,
                i64 cols, char name[32], the rows*cols elements
  tag 2 output: char profile[24], char format[24], u32 input id, u32 flags
                (bit 0: a global scale follows), i64 payload bytes, i64 scale
                bytes, the payload (qatcheck's layout: e4m3 bytes, or e2m1
                packed two a byte, element 2i in the low nibble), the scales
                (float32 values, or e4m3 / e8m0 bytes), float32 global scale
"""
import struct

import numpy as np

MAGIC = b"QCAL0001"


def pack_e2m1(codes):
    """[rows, cols] uint8 e2m1 codes -> [rows, ceil(cols/2)] packed bytes."""
    rows, cols = codes.shape
    c = np.zeros((rows, cols + (cols & 1)), np.uint8)
    c[:, :cols] = codes & 0xF
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)


class Writer:
    def __init__(self, path):
        self.f = open(path, "wb")
        self.f.write(MAGIC)
        self.next_id = 0

    def _chunk(self, tag, body):
        self.f.write(struct.pack("<IIQ", tag, 0, len(body)))
        self.f.write(body)

    def add_input(self, name, x):
        """x: numpy float32 array, or uint16 array of bfloat16 bits."""
        dt = 1 if x.dtype == np.uint16 else 0
        assert x.dtype in (np.float32, np.uint16) and x.ndim == 2
        iid = self.next_id
        self.next_id += 1
        hdr = struct.pack("<IIqq32s", iid, dt, x.shape[0], x.shape[1], name.encode()[:31])
        self._chunk(1, hdr + np.ascontiguousarray(x).tobytes())
        return iid

    def add_output(self, profile, fmt, iid, payload, scale, gscale=None):
        payload = np.ascontiguousarray(payload).tobytes()
        scale = np.ascontiguousarray(scale).tobytes()
        flags = 1 if gscale is not None else 0
        hdr = struct.pack("<24s24sIIqq", profile.encode(), fmt.encode(), iid, flags, len(payload), len(scale))
        tail = struct.pack("<f", float(gscale)) if gscale is not None else b""
        self._chunk(2, hdr + payload + scale + tail)

    def close(self):
        self.f.close()


def read(path):
    """Yield ("input", dict) and ("output", dict) records."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == MAGIC, path
    pos = 8
    while pos < len(data):
        tag, _, n = struct.unpack_from("<IIQ", data, pos)
        body = data[pos + 16:pos + 16 + n]
        pos += 16 + n
        if tag == 1:
            iid, dt, rows, cols, name = struct.unpack_from("<IIqq32s", body)
            off = struct.calcsize("<IIqq32s")
            arr = np.frombuffer(body, np.uint16 if dt else np.float32, rows * cols, off).reshape(rows, cols)
            yield "input", dict(id=iid, dtype=dt, rows=rows, cols=cols, name=name.rstrip(b"\0").decode(), x=arr)
        elif tag == 2:
            prof, fmt, iid, flags, nq, ns = struct.unpack_from("<24s24sIIqq", body)
            off = struct.calcsize("<24s24sIIqq")
            rec = dict(profile=prof.rstrip(b"\0").decode(), format=fmt.rstrip(b"\0").decode(), input=iid,
                       payload=body[off:off + nq], scale=body[off + nq:off + nq + ns], gscale=None)
            if flags & 1:
                rec["gscale"] = struct.unpack_from("<f", body, off + nq + ns)[0]
            yield "output", rec
