#!/usr/bin/env python3
"""Writes the load-path fuzz seeds: each fixture model cut after its tensor
infos (and alignment padding). fuzz_load supplies the tensor data itself as
zeros, so the fuzzer mutates only what the loaders read.

    fuzz/make_load_seeds.py OUT_DIR MODEL.gguf...
"""
import os
import struct
import sys

SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def skip_value(b, at, t):
    if t in SCALAR:
        return at + SCALAR[t]
    if t == 8:  # string
        (n,) = struct.unpack_from("<Q", b, at)
        return at + 8 + n
    if t == 9:  # array
        et, n = struct.unpack_from("<IQ", b, at)
        at += 12
        if et in SCALAR:
            return at + n * SCALAR[et]
        for _ in range(n):
            at = skip_value(b, at, et)
        return at
    raise ValueError(f"bad value type {t}")


def header_end(b):
    if b[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    _, n_tensors, n_kv = struct.unpack_from("<IQQ", b, 4)
    at = 24
    align = 32
    for _ in range(n_kv):
        (klen,) = struct.unpack_from("<Q", b, at)
        key = b[at + 8 : at + 8 + klen].decode()
        at += 8 + klen
        (t,) = struct.unpack_from("<I", b, at)
        at += 4
        if key == "general.alignment":
            align = struct.unpack_from("<I", b, at)[0]
        at = skip_value(b, at, t)
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", b, at)
        at += 8 + nlen
        (nd,) = struct.unpack_from("<I", b, at)
        at += 4 + 8 * nd + 4 + 8
    return (at + align - 1) // align * align


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for path in sys.argv[2:]:
        b = open(path, "rb").read()
        end = header_end(b)
        parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
        name = "seed-" + parent + "-" + os.path.basename(path)
        with open(os.path.join(out, name), "wb") as f:
            f.write(b[:end])
        print(f"{name}: {end} bytes (of {len(b)})")


if __name__ == "__main__":
    main()
