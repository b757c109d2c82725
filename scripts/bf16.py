"""bf16.py: bfloat16 helpers for numpy (numpy has no bfloat16): round-to-
nearest-even from float32, stored as uint16 bits as the dump schema wants."""
import numpy as np


def to_bits(a):
    """float array -> bfloat16 bits (uint16), RNE; NaN stays NaN."""
    f = np.ascontiguousarray(a, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    nan = np.isnan(f)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def from_bits(b):
    """bfloat16 bits (uint16) -> float32."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_(a):
    """float array -> float32 holding the nearest bfloat16 values."""
    return from_bits(to_bits(a))


def write(group, name, values):
    """Write values as a bfloat16 dataset (uint16 + attribute dtype)."""
    ds = group.create_dataset(name, data=to_bits(values))
    ds.attrs["dtype"] = "bfloat16"
    return ds
