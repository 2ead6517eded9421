"""Reference goldens for an exported F32 glm-dsa file, from the PyTorch forward (float32).

    /usr/bin/python3 train/goldens.py MODEL.gguf OUT.golden.json [--prompts-from kjv|random]

For each prompt: the text and its token ids (the engine must tokenize the text to the same ids),
last-position logits, a greedy continuation with its top-1/top-2 margins, and, for the longest
prompt, every position's logits (as the top 8 plus a fixed stride of the vocabulary, to keep
the file small) and the NextN draft logits. Decision margins are recorded per position: the
smallest gap between the top_k-th and (top_k+1)-th indexer score over the full layers, and the
smallest gap between the last chosen and first rejected expert score over the MoE layers.

The bound: the same forward in float64 shows how far float32 rounding moves this model's
logits (delta_f32) and its decision scores; an engine that computes in float32 with another
summation order sits at a comparable distance from exact arithmetic, so two float32
implementations differ by at most about twice that. The golden's `bound` is 4 x the measured
delta_f32 with a floor of 1e-4 (the max is taken over every stored position). A position is
compared only when every decision at it and before it (a later token attends to the earlier
ones) has a margin above `gap_bound` (4 x the largest float32-vs-float64 change of any decision
score, floor 1e-5); the rest are excluded and counted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import export  # noqa: E402

STRIDE = 64  # logits_all keeps ids 0, 64, 128, ... plus the top 8 of each position
N_GREEDY = 16


def f32(x):
    return [float(np.float32(v)) for v in x]


def short(v):
    """Shortest decimal that reads back to the same float32."""
    return float(np.format_float_positional(np.float32(v), unique=True, trim="-"))


def pos_margins(model, ids):
    """Per position: smallest indexer top-k gap over full layers, smallest expert gap over the
    MoE layers (inf where no choice is made)."""
    out = model(torch.tensor([ids]), sparse=True, want=("diag",))
    T = len(ids)
    ig = torch.full((T,), float("inf"), dtype=torch.float64)
    for g in out["diag"]["idx_gap"]:
        ig = torch.minimum(ig, g[0].double())
    eg = torch.full((T,), float("inf"), dtype=torch.float64)
    for g in out["diag"]["exp_gap"]:
        eg = torch.minimum(eg, g[0].double())
    return out, ig.numpy(), eg.numpy()


@torch.no_grad()
def greedy(model, ids, n):
    toks, margins, gaps = list(ids), [], []
    for _ in range(n):
        out, ig, eg = pos_margins(model, toks)
        lg = out["logits"][0, -1].double()
        top = torch.topk(lg, 2)
        margins.append(float(top.values[0] - top.values[1]))
        gaps.append(float(min(ig.min(), eg.min())))
        toks.append(int(top.indices[0]))
    return toks[len(ids):], margins, gaps


SCREEN_MODEL = None
SCREEN_GAP = 1e-5


def screen_long(tok, held, n_ctx, top_k):
    """The long prompt: the first of a fixed list of held-out chapters whose every position is
    further than SCREEN_GAP from an indexer or expert tie (else the one that stays clear the
    longest), as the llama.cpp fixtures screen their prompts; the screen is recorded."""
    limit = min(n_ctx - N_GREEDY - 1, 2 * top_k + 70)
    best, tried = None, []
    for ci in (17, 5, 12, 25, 2, 8, 20, 28):
        t, vs = held[ci]
        ids = tok.encode(corpus.chapter_text(t, vs))[:limit]
        text = tok.decode(ids)
        if tok.encode(text) != ids:
            continue
        _, ig, eg = pos_margins(SCREEN_MODEL, ids)
        worst = np.minimum(ig, eg)
        clear = next((i for i, v in enumerate(worst) if v <= SCREEN_GAP), len(ids))
        tried.append({"chapter": t, "clear_positions": clear, "of": len(ids)})
        if best is None or clear > best[0]:
            best = (clear, {"name": "long", "text": text, "tokens": ids})
        if clear == len(ids):
            break
    best[1]["screen"] = tried
    return best[1]


def pick_prompts(tok, source, n_ctx, top_k, seed):
    rng = random.Random(seed)
    if source == "random":
        n_normal = tok.n_normal
        lens = [5, 24, top_k + 37, min(n_ctx - N_GREEDY - 1, 2 * top_k + 70)]
        out = []
        for i, L in enumerate(lens):
            ids = [rng.randrange(n_normal) for _ in range(L)]
            out.append({"name": f"random-{L}", "text": None, "tokens": ids})
        return out
    _, held = corpus.split(corpus.chapters(corpus.read_kjv()))
    texts = []
    # A short verse, a chapter opening, and two long held-out passages (longer than top_k).
    t, vs = held[3]
    texts.append(("verse", vs[0]))
    t, vs = held[10]
    texts.append(("chapter", corpus.chapter_text(t, vs)[:160]))
    texts.append(("long", None))  # screened below
    a, _ = corpus.half_split(held[21][1][4])
    texts.append(("chat", corpus.chat_prompt(f"Continue this verse: {a}")))
    out = []
    for name, text in texts:
        if name == "long":
            out.append(screen_long(tok, held, n_ctx, top_k))
            continue
        ids = tok.encode(text)
        limit = n_ctx - N_GREEDY - 1 if name != "long" else min(n_ctx - N_GREEDY - 1, 2 * top_k + 70)
        if len(ids) > limit:  # cut at a token boundary, and keep the text that makes those ids
            ids = ids[:limit]
            text = tok.decode(ids)
            if tok.encode(text) != ids:
                raise RuntimeError("prompt cut does not re-encode to the same ids")
        out.append({"name": name, "text": text, "tokens": ids})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--prompts-from", choices=["kjv", "random"], default="kjv")
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(2)
    model, tok, md = export.load(args.model)
    c = model.c
    m64 = export.load(args.model)[0].double()
    global SCREEN_MODEL
    SCREEN_MODEL = model
    with torch.no_grad():
        prompts = pick_prompts(tok, args.prompts_from, c.n_ctx, c.idx_top_k, args.seed)
    blob = open(args.model, "rb").read()
    g = {
        "schema": "glm5-trainer-golden/1",
        "model": os.path.basename(args.model),
        "file_size": len(blob),
        "file_sha256": hashlib.sha256(blob).hexdigest(),
        "n_vocab": c.n_vocab,
        "idx_top_k": c.idx_top_k,
        "tool": "train/goldens.py (PyTorch " + torch.__version__ + ", float32, sparse attention)",
        "logits_all_stride": STRIDE,
        "prompts": [],
    }
    delta = 0.0
    gap_delta = 0.0
    with torch.no_grad():
        for i, p in enumerate(prompts):
            ids = p["tokens"]
            out, ig, eg = pos_margins(model, ids)
            out64, ig64, eg64 = pos_margins(m64, ids)
            lg = out["logits"][0]
            lg64 = out64["logits"][0]
            delta = max(delta, float((lg.double() - lg64).abs().max()))
            fin = np.isfinite(ig) & np.isfinite(ig64)
            if fin.any():
                gap_delta = max(gap_delta, float(np.abs(ig[fin] - ig64[fin]).max()))
            fin = np.isfinite(eg) & np.isfinite(eg64)
            if fin.any():
                gap_delta = max(gap_delta, float(np.abs(eg[fin] - eg64[fin]).max()))
            e = {"name": p["name"], "text": p["text"], "tokens": ids, **({"screen": p["screen"]} if "screen" in p else {}),
                 "logits_last": [short(v) for v in lg[-1].numpy()],
                 "indexer_gap": [None if not np.isfinite(v) else short(v) for v in ig],
                 "expert_gap": [None if not np.isfinite(v) else short(v) for v in eg]}
            gr, margins, gaps = greedy(model, ids, N_GREEDY)
            gr64, _, _ = greedy(m64, ids, N_GREEDY)
            e["greedy"] = gr
            e["greedy_top1_top2_margins"] = [short(v) for v in margins]
            e["greedy_decision_gaps"] = [short(v) for v in gaps]
            e["greedy_equals_f64"] = gr == gr64
            if p["text"] is not None:
                e["greedy_text"] = tok.decode(gr)
            if p["name"] in ("long", f"random-{len(ids)}") and i == len(prompts) - 1 or p["name"] == "long":
                la = []
                for t in range(len(ids)):
                    row = lg[t]
                    top = torch.topk(row, 8)
                    idx = sorted(set(range(0, c.n_vocab, STRIDE)) | set(top.indices.tolist()))
                    la.append({"ids": idx, "logits": [short(row[j]) for j in idx]})
                e["logits_all"] = la
                # NextN draft rows as llama.cpp's drafter (and the engine) lay them out: row p
                # mixes the prompt's token p with the trunk's hidden state at p - 1 (a zero row
                # at p = 0, which training never shows the head) and drafts token p + 1.
                def draft_rows(m):
                    h = m(torch.tensor([ids]), sparse=True)["hidden"]
                    h = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)
                    out = m.nextn_forward(h, torch.tensor([ids]))[0]
                    return out, m.nextn.block.moe.last_gap[0]
                nx, ngap = draft_rows(model)
                nx64, _ = draft_rows(m64)
                delta = max(delta, float((nx.double() - nx64).abs().max()))
                rows = []
                for t in range(nx.shape[0]):
                    top = torch.topk(nx[t], 8)
                    idx = sorted(set(range(0, c.n_vocab, STRIDE)) | set(top.indices.tolist()))
                    rows.append({"ids": idx, "logits": [short(nx[t, j]) for j in idx]})
                e["nextn_logits"] = rows
                e["nextn_expert_gap"] = [short(v) for v in ngap.double().numpy()]
                agree = (nx.argmax(-1)[:-1] == torch.tensor(ids[1:])).double().mean().item()
                e["nextn_top1_agreement_with_prompt"] = agree
            g["prompts"].append(e)
    g["delta_f32_vs_f64"] = delta
    g["decision_delta_f32_vs_f64"] = gap_delta
    g["bound"] = max(4 * delta, 1e-4)
    g["gap_bound"] = max(4 * gap_delta, 1e-5)
    excl = 0
    for e in g["prompts"]:
        worst = np.minimum([np.inf if v is None else v for v in e["indexer_gap"]],
                           [np.inf if v is None else v for v in e["expert_gap"]])
        first_bad = next((t for t, v in enumerate(worst) if v <= g["gap_bound"]), len(worst))
        e["first_excluded_position"] = first_bad
        excl += len(worst) - first_bad
    g["excluded_positions"] = excl
    with open(args.out, "w") as f:
        json.dump(g, f, separators=(",", ":"))
    print(f"{args.out}: {os.path.getsize(args.out)} bytes, delta_f32 {delta:.3g}, decision delta "
          f"{gap_delta:.3g}, bound {g['bound']:.3g}, gap_bound {g['gap_bound']:.3g}, "
          f"excluded positions {excl}, greedy equal to f64: "
          f"{[e['greedy_equals_f64'] for e in g['prompts']]}")
    for e in g["prompts"]:
        print(f"  {e['name']}: {len(e['tokens'])} tokens, first excluded {e['first_excluded_position']}, "
              f"greedy {e.get('greedy_text', e['greedy'])!r}")


if __name__ == "__main__":
    main()
