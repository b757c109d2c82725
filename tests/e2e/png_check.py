#!/usr/bin/env python3
"""png_check.py FILE.png MIN_INK MIN_COLOUR: decode the PNG with zlib (8-bit
RGB or RGBA, non-interlaced, as Chromium writes its screenshots) and count
its pixels: not white (some channel below 235) and coloured (channels
apart by more than 60: verdict badges, plot points). Fails when either
fraction is below its minimum: a blank or colourless screenshot."""
import struct
import sys
import zlib


def pixels(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise ValueError(f"unsupported PNG: depth {depth}, colour type {ctype}, interlace {interlace}")
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + ((a + b) >> 1)) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return w, h, bpp, rows


def main():
    path, min_ink, min_col = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    w, h, bpp, rows = pixels(path)
    ink = col = 0
    for line in rows:
        for x in range(0, w * bpp, bpp):
            r, g, b = line[x], line[x + 1], line[x + 2]
            ink += min(r, g, b) < 235
            col += max(r, g, b) - min(r, g, b) > 60
    n = w * h
    print(f"{path}: {w}x{h}, {100 * ink / n:.2f}% ink, {100 * col / n:.3f}% coloured")
    if ink / n < min_ink or col / n < min_col:
        print(f"FAIL the screenshot is blank or colourless (minimum {100 * min_ink}% ink, {100 * min_col}% coloured)")
        sys.exit(1)


if __name__ == "__main__":
    main()
