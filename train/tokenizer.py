"""Byte-level BPE with the glm4 pre-tokenizer split and the GLM special tokens.

The vocabulary is laid out like the fixtures' (tests/data/glm-dsa/vocab.json): ids 0-255 are
the byte tokens in GPT-2 byte-to-unicode order, then the merged tokens in merge order, then the
26 GLM special tokens (CONTROL). Encoding applies merges by rank, as llama.cpp and src/text do;
the C++ golden test checks that the engine tokenizes the golden prompts to the same ids.
"""

from __future__ import annotations

import heapq
import json
import re
import unicodedata
from collections import Counter, defaultdict

SPECIALS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
    "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
    "<|begin_of_video|>", "<|end_of_video|>", "<|image|>", "<|video|>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>",
    "</arg_key>", "<arg_value>", "</arg_value>",
]
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3


def byte_order() -> list[int]:
    """GPT-2's byte-to-unicode order: the printable bytes first, then the rest."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    return bs + [b for b in range(256) if b not in bs]


def byte_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _cls(ch: str) -> str:
    """'L' letter, 'N' number, 'S' space, 'O' other: the classes of src/text/unicode.h."""
    if ch.isspace():
        return "S"
    c = unicodedata.category(ch)[0]
    return c if c in ("L", "N") else "O"


def pretokenize_glm4(text: str) -> list[str]:
    """The glm4 split, written as the same scanner as src/text/pretokenize.cpp:
    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|
    \\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"""
    n = len(text)
    cls = [_cls(c) for c in text]
    out = []
    pos = 0
    start = 0

    def is_(p, c):
        return p < n and cls[p] == c

    while pos < n:
        c = text[pos]
        k = cls[pos]
        if c == "'" and pos + 1 < n:
            c1 = text[pos + 1].lower() if text[pos + 1].isascii() else text[pos + 1]
            if c1 in ("s", "t", "m", "d"):
                pos += 2
                out.append(text[start:pos])
                start = pos
                continue
            if pos + 2 < n:
                c2 = text[pos + 2].lower() if text[pos + 2].isascii() else text[pos + 2]
                if (c1 + c2) in ("re", "ve", "ll"):
                    pos += 3
                    out.append(text[start:pos])
                    start = pos
                    continue
        if c not in "\r\n" and k != "N" and (k == "L" or is_(pos + 1, "L")):
            pos += 1
            while is_(pos, "L"):
                pos += 1
            out.append(text[start:pos])
            start = pos
            continue
        if k == "N":
            run = 0
            while is_(pos, "N"):
                pos += 1
                run += 1
                if run == 3:
                    out.append(text[start:pos])
                    start = pos
                    run = 0
            if pos > start:
                out.append(text[start:pos])
                start = pos
            continue
        space_lead = c == " "
        q = pos + 1 if space_lead else pos
        if (space_lead if q >= n else is_(q, "O")):
            pos = q
            while is_(pos, "O"):
                pos += 1
            while pos < n and text[pos] in "\r\n":
                pos += 1
            out.append(text[start:pos])
            start = pos
            continue
        ws = 0
        last_rn_end = 0
        while is_(pos + ws, "S"):
            if text[pos + ws] in "\r\n":
                last_rn_end = pos + ws + 1
            ws += 1
        if last_rn_end > 0:
            pos = last_rn_end
        elif ws > 1 and pos + ws < n:
            pos += ws - 1
        elif ws > 0:
            pos += ws
        else:
            pos += 1
        out.append(text[start:pos])
        start = pos
    return out


class Tokenizer:
    def __init__(self, tokens: list[str], merges: list[str]):
        self.tokens = tokens
        self.merges = merges
        self.id_of = {t: i for i, t in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
        self.b2u = byte_to_unicode()
        self.u2b = {u: b for b, u in self.b2u.items()}
        self.n_normal = len(tokens) - len(SPECIALS)
        self.special = {s: self.n_normal + i for i, s in enumerate(SPECIALS)}
        self._cache: dict[str, list[int]] = {}

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def types(self) -> list[int]:
        return [TOKEN_NORMAL] * self.n_normal + [TOKEN_CONTROL] * len(SPECIALS)

    def _bpe(self, piece: str) -> list[int]:
        hit = self._cache.get(piece)
        if hit is not None:
            return hit
        sym = [self.b2u[b] for b in piece.encode("utf-8")]
        while len(sym) > 1:
            best, bi = None, -1
            for i in range(len(sym) - 1):
                r = self.ranks.get((sym[i], sym[i + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            sym = sym[:bi] + [sym[bi] + sym[bi + 1]] + sym[bi + 2:]
        ids = [self.id_of[s] for s in sym]
        self._cache[piece] = ids
        return ids

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        """Like llama-tokenize: control tokens in the text are matched when parse_special."""
        out: list[int] = []
        if parse_special:
            i, seg = 0, 0
            while i < len(text):
                if text[i] in "<[":
                    m = next((s for s in sorted(SPECIALS, key=len, reverse=True) if text.startswith(s, i)), None)
                    if m:
                        for p in pretokenize_glm4(text[seg:i]):
                            out += self._bpe(p)
                        out.append(self.special[m])
                        i += len(m)
                        seg = i
                        continue
                i += 1
            text = text[seg:]
        for p in pretokenize_glm4(text):
            out += self._bpe(p)
        return out

    def decode(self, ids: list[int]) -> str:
        bs = bytearray()
        for i in ids:
            t = self.tokens[i]
            if i >= self.n_normal:
                bs += t.encode("utf-8")
            else:
                bs += bytes(self.u2b[c] for c in t)
        return bs.decode("utf-8", errors="replace")

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({"tokens": self.tokens, "merges": self.merges}, f)

    @staticmethod
    def load(path: str) -> "Tokenizer":
        d = json.load(open(path))
        return Tokenizer(d["tokens"], d["merges"])


def train_bpe(text: str, n_vocab: int, log=print) -> Tokenizer:
    """Learns n_vocab - 256 - 26 merges on the pre-tokenized corpus (pieces counted once each,
    merges taken by count, ties by the pair's ids: deterministic)."""
    b2u = byte_to_unicode()
    order = byte_order()
    tokens = [b2u[b] for b in order]
    n_merges = n_vocab - 256 - len(SPECIALS)
    if n_merges < 0:
        raise ValueError("n_vocab too small")
    # Special tokens are matched whole before BPE, so they take no part in learning merges.
    counts: Counter = Counter()
    for part in re.split("|".join(re.escape(s) for s in SPECIALS), text):
        counts.update(pretokenize_glm4(part))
    sym_id = {t: i for i, t in enumerate(tokens)}
    words = []
    freq = []
    for piece, c in counts.items():
        words.append([sym_id[b2u[b]] for b in piece.encode("utf-8")])
        freq.append(c)
    pair_count: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += freq[wi]
            where[(a, b)].add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or negc == 0:
            continue
        a, b = pair
        new = len(tokens)
        tokens.append(tokens[a] + tokens[b])
        merges.append(tokens[a] + " " + tokens[b])
        touched: dict[tuple[int, int], int] = {}
        for wi in list(where[pair]):
            w = words[wi]
            f = freq[wi]
            for p in zip(w, w[1:]):
                pair_count[p] -= f
                touched[p] = 1
            nw, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    nw.append(new)
                    i += 2
                else:
                    nw.append(w[i])
                    i += 1
            words[wi] = nw
            for p in zip(nw, nw[1:]):
                pair_count[p] += f
                where[p].add(wi)
                touched[p] = 1
        del pair_count[pair]
        where.pop(pair, None)
        for p in touched:
            c = pair_count.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, p))
        if log and len(merges) % 500 == 0:
            log(f"bpe: {len(merges)}/{n_merges} merges")
    tokens += SPECIALS
    return Tokenizer(tokens, merges)
