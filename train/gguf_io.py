"""A small GGUF v3 writer and reader (F32 tensors, the metadata value types glm-dsa uses).

Layout: magic, version, tensor count, key count; key/value pairs; tensor infos (name, dims in
ggml order, type, offset); padding to general.alignment (32); the tensor data, each tensor
aligned to 32 bytes.
"""

from __future__ import annotations

import struct

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
ALIGN = 32
GGML_F32 = 0

_SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
           BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype, v) -> bytes:
    if vtype == STRING:
        return _str(v)
    if vtype == ARRAY:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(_value(et, x) for x in items)
    return struct.pack(_SCALAR[vtype], v)


def write(path: str, metadata: list, tensors: list) -> None:
    """metadata: [(key, vtype, value)], ARRAY values as (elem_type, list);
    tensors: [(name, np.ndarray float32 in numpy order)] (ggml ne is the reversed shape)."""
    head = bytearray(b"GGUF")
    head += struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for k, t, v in metadata:
        head += _str(k) + struct.pack("<I", t) + _value(t, v)
    offset = 0
    blobs = []
    for name, a in tensors:
        a = np.ascontiguousarray(a, dtype=np.float32)
        ne = list(reversed(a.shape))
        head += _str(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        head += struct.pack("<IQ", GGML_F32, offset)
        blob = a.tobytes()
        pad = (-len(blob)) % ALIGN
        blobs.append(blob + b"\0" * pad)
        offset += len(blob) + pad
    head += b"\0" * ((-len(head)) % ALIGN)
    with open(path, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b)


class _Cur:
    def __init__(self, buf):
        self.b, self.p = buf, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.p)
        self.p += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def str(self):
        n = self.take("<Q")
        s = bytes(self.b[self.p: self.p + n]).decode("utf-8")
        self.p += n
        return s

    def value(self, t):
        if t == STRING:
            return self.str()
        if t == ARRAY:
            et, n = self.take("<IQ")
            return [self.value(et) for _ in range(n)]
        return self.take(_SCALAR[t])


def read(path: str):
    """Returns (metadata dict, {name: np.ndarray in numpy order}); F32 tensors only."""
    buf = memoryview(open(path, "rb").read())
    c = _Cur(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    c.p = 4
    ver, n_t, n_kv = c.take("<IQQ")
    if ver not in (2, 3):
        raise ValueError(f"{path}: GGUF version {ver}")
    md = {}
    for _ in range(n_kv):
        k = c.str()
        md[k] = c.value(c.take("<I"))
    infos = []
    for _ in range(n_t):
        name = c.str()
        nd = c.take("<I")
        ne = [c.take("<Q") for _ in range(nd)]
        typ, off = c.take("<IQ")
        infos.append((name, ne, typ, off))
    align = md.get("general.alignment", ALIGN)
    base = c.p + ((-c.p) % align)
    out = {}
    for name, ne, typ, off in infos:
        if typ != GGML_F32:
            raise ValueError(f"{path}: tensor {name} is not F32 (type {typ})")
        n = int(np.prod(ne))
        a = np.frombuffer(buf, dtype=np.float32, count=n, offset=base + off)
        out[name] = a.reshape(list(reversed(ne))).copy()
    return md, out
