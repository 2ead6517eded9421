"""The training text: the King James Bible as Debian's bible-kjv prints it, split into chapters
and verses, a held-out slice of whole chapters, and the chat slice built from it.

Licence note: the KJV is in the public domain in most countries; in the United Kingdom its
text is under Crown letters patent (the Crown's perpetual rights, administered by the King's
Printers). Nothing is downloaded: the text comes from the `bible-kjv` package.
"""

from __future__ import annotations

import random
import re
import subprocess

HOLDOUT_EVERY = 40  # every 40th chapter (30 of 1189) is validation only


def read_kjv() -> str:
    return subprocess.run(["bible", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                          text=True).stdout


def chapters(raw: str) -> list[tuple[str, list[str]]]:
    """[(\"Genesis 1\", [verse text, ...]), ...]; wrapped lines joined, verse numbers dropped."""
    out: list[tuple[str, list[str]]] = []
    verse: list[str] = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        m = re.match(r"^  (\d+) (.*)$", line)
        if m:
            if verse:
                out[-1][1].append(" ".join(verse))
            verse = [m.group(2).strip()]
        elif re.match(r"^(?:[1-3] )?[A-Z][A-Za-z ]* \d+$", line):  # "1 Samuel 3": a chapter
            if verse:
                out[-1][1].append(" ".join(verse))
                verse = []
            out.append((line.strip(), []))
        else:  # a wrapped verse goes on at column 0
            verse.append(line.strip())
    if verse:
        out[-1][1].append(" ".join(verse))
    return [(t, [re.sub(r"\s+", " ", v) for v in vs]) for t, vs in out if vs]


def split(chs):
    train = [c for i, c in enumerate(chs) if i % HOLDOUT_EVERY != HOLDOUT_EVERY - 1]
    held = [c for i, c in enumerate(chs) if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1]
    return train, held


def chapter_text(title: str, verses: list[str]) -> str:
    return title + "\n" + "\n".join(verses) + "\n\n"


# The chat slice: user/assistant turns built from verses, in the GLM-5 layout the engine renders
# (src/text/chat.h): no newline after role tokens, an empty think block when not reasoning, and
# the turn closed by <|user|> (a stop token), as a real next turn would.
CONTINUE_PROMPTS = ["Continue this verse: {a}", "Finish the verse: {a}", "How does this verse go on? {a}"]
TOPIC_PROMPTS = ["Tell me a verse about {w}.", "Give me a verse that mentions {w}.",
                 "What does the Bible say about {w}?"]
STOP = {"a", "an", "and", "the", "of", "to", "in", "that", "he", "his", "it", "is", "was", "for",
        "unto", "they", "be", "with", "shall", "i", "him", "not", "them", "all", "thou", "thy",
        "which", "thee", "my", "me", "but", "ye", "as", "from", "are", "were", "by", "on", "upon",
        "have", "had", "this", "their", "there", "so", "will", "when", "then", "at", "out", "up",
        "into", "also", "or", "if", "her", "she", "we", "our", "you", "your", "hath", "what",
        "who", "said", "saith", "came", "come", "made", "did", "do", "let", "now", "no", "one"}


def half_split(verse: str):
    """Splits a verse at the word boundary nearest its middle: (first half, second half)."""
    words = verse.split(" ")
    if len(words) < 6:
        return None
    k = len(words) // 2
    return " ".join(words[:k]), " ".join(words[k:])


def chat_text(user: str, reply: str) -> str:
    return f"[gMASK]<sop><|user|>{user}<|assistant|><think></think>{reply}<|user|>"


def chat_prompt(user: str) -> str:
    return f"[gMASK]<sop><|user|>{user}<|assistant|><think></think>"


def chat_samples(chs, rng: random.Random, frac: float = 0.5) -> list[str]:
    """One chat turn for about `frac` of the verses: 'continue this verse' with the second half
    as the reply, or 'a verse about WORD' (a content word of the verse) with the whole verse."""
    out = []
    for _, verses in chs:
        for v in verses:
            if rng.random() >= frac:
                continue
            if rng.random() < 0.7:
                hs = half_split(v)
                if hs is None:
                    continue
                out.append(chat_text(rng.choice(CONTINUE_PROMPTS).format(a=hs[0]), hs[1]))
            else:
                words = [w.strip(".,;:?!()'").lower() for w in v.split()]
                words = [w for w in words if len(w) > 3 and w.isalpha() and w not in STOP]
                if not words:
                    continue
                out.append(chat_text(rng.choice(TOPIC_PROMPTS).format(w=rng.choice(words)), v))
    return out


def documents(chs, rng: random.Random) -> list[str]:
    """The training documents: every chapter as plain text, plus the chat slice, shuffled."""
    docs = [chapter_text(t, v) for t, v in chs] + chat_samples(chs, rng)
    rng.shuffle(docs)
    return docs
