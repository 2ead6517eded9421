#!/usr/bin/env python3
"""Generate tests/data/image/resize.golden.json: Pillow's 8-bit bicubic resize of RGB images to
sizes that shrink, enlarge and mix both, the oracle for src/image/resize.cpp (spec 12.3).

A developer tool, not run by CI: it needs Debian's python3-pil (apt-get install python3-pil).
Sources are the fixture PNGs in tests/data/glm5next/ and a synthetic pattern that
tests/test_image.cpp recomputes (pattern() below), so only the outputs are stored, as hex.

It also writes tests/data/image/img-a.jpg (img-a.png as a baseline and a 4:2:0 JPEG) and stores
what Pillow decodes from it, so the JPEG path is checked against the same decoder settings.

Usage: scripts/gen_resize_goldens.py > tests/data/image/resize.golden.json
"""

import json
import os
import sys

from PIL import Image

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "tests", "data")


def pattern(w, h):
    """Deterministic RGB bytes with edges and ramps (keep in step with tests/test_image.cpp)."""
    out = bytearray()
    for y in range(h):
        for x in range(w):
            for c in range(3):
                v = (x * (7 + c) + y * (13 - 2 * c) + ((x * y + c) % 17) * 9) % 256
                if (x // 5 + y // 3) % 2 == 0:
                    v = 255 - v
                out.append(v)
    return Image.frombytes("RGB", (w, h), bytes(out))


SOURCES = {
    "img-a.png": lambda: Image.open(os.path.join(DATA, "glm5next", "img-a.png")).convert("RGB"),
    "img-b.png": lambda: Image.open(os.path.join(DATA, "glm5next", "img-b.png")).convert("RGB"),
    "pattern:97x61": lambda: pattern(97, 61),
}
TARGETS = {
    "img-a.png": [(50, 50), (111, 111), (113, 37), (28, 300), (1, 1), (160, 130), (3, 112), (112, 5)],
    "img-b.png": [(140, 93), (17, 11), (61, 40), (60, 200), (250, 2)],
    "pattern:97x61": [(96, 61), (97, 60), (33, 20), (10, 7), (190, 120), (98, 29), (41, 180)],
}


def main():
    cases = []
    for src, sizes in TARGETS.items():
        img = SOURCES[src]()
        for w, h in sizes:
            out = img.resize((w, h), Image.BICUBIC)
            cases.append({"source": src, "size": [w, h], "rgb_hex": out.tobytes().hex()})
    jpg = os.path.join(DATA, "image", "img-a.jpg")
    SOURCES["img-a.png"]().save(jpg, "JPEG", quality=85)
    decoded = Image.open(jpg).convert("RGB")
    json.dump({"schema": "glm5-resize-golden/1",
               "jpeg": {"file": "img-a.jpg", "size": list(decoded.size),
                        "rgb_hex": decoded.tobytes().hex()},
               "generator": "scripts/gen_resize_goldens.py, Pillow " + Image.__version__ +
                            " (Debian python3-pil), Image.BICUBIC on RGB",
               "cases": cases}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
