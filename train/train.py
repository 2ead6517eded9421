"""Trains the miniature GLM-5 (glm-dsa) on the King James Bible and exports it to GGUF.

    python3 train/train.py --out train/out            # the full run (train/train.sh)
    python3 train/train.py --out /tmp/t --steps 20    # a smoke run

Losses: next-token cross-entropy, plus 0.3 x the NextN (multi-token prediction) cross-entropy
of the token two ahead, plus the indexer's distillation KL (its inputs are detached, so that
loss trains only the indexer and the main model never sees it). The first --dense-steps steps
attend densely while the indexer warms up on the full attention distribution; afterwards
attention is top-k sparse and the indexer keeps learning on the selected keys. The MoE routing
bias is moved after every step toward balanced load (no auxiliary loss).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402
import export  # noqa: E402
from model import Config, GlmDsa  # noqa: E402
from tokenizer import Tokenizer, train_bpe  # noqa: E402


def log(msg):
    print(msg, flush=True)


def build_data(out_dir, n_vocab, seed):
    """Tokenizer (trained once, cached) and the token streams: training documents and the
    held-out chapters."""
    raw = corpus.read_kjv()
    chs = corpus.chapters(raw)
    train_chs, held = corpus.split(chs)
    docs = corpus.documents(train_chs, random.Random(seed))
    tok_path = os.path.join(out_dir, "tokenizer.json")
    if os.path.exists(tok_path):
        tok = Tokenizer.load(tok_path)
    else:
        t0 = time.time()
        tok = train_bpe("".join(docs), n_vocab, log=log)
        tok.save(tok_path)
        log(f"tokenizer: {n_vocab} tokens, {len(tok.merges)} merges, {time.time() - t0:.0f} s")
    cache = os.path.join(out_dir, "tokens.npz")
    if os.path.exists(cache):
        z = np.load(cache)
        train_ids, val_ids = z["train"], z["val"]
    else:
        t0 = time.time()
        train_ids = np.array([i for d in docs for i in tok.encode(d)], dtype=np.int32)
        val_ids = np.array([i for t, v in held for i in tok.encode(corpus.chapter_text(t, v))],
                           dtype=np.int32)
        np.savez(cache, train=train_ids, val=val_ids)
        log(f"tokens: {len(train_ids)} train, {len(val_ids)} validation, {time.time() - t0:.0f} s")
    return tok, train_ids, val_ids, held


def unigram_nll(train_ids, ids, n_vocab):
    """Cross-entropy of a unigram model of the training tokens (add-one smoothed) on ids."""
    cnt = np.bincount(train_ids, minlength=n_vocab).astype(np.float64) + 1.0
    lp = np.log(cnt / cnt.sum())
    return float(-lp[ids].mean()), lp


def batches_from(ids, n, T, rng):
    starts = rng.integers(0, len(ids) - T - 1, size=n)
    return torch.from_numpy(np.stack([ids[s: s + T + 1] for s in starts]).astype(np.int64))


@torch.no_grad()
def evaluate(model, val_ids, T, n_windows=24):
    """Validation loss (sparse attention) and NextN top-1 agreement with the token two ahead,
    over fixed non-overlapping windows of the held-out chapters."""
    model.eval()
    step = max(1, (len(val_ids) - T - 2) // n_windows)
    nll = cnt = agree = n_mtp = mtp_nll = 0.0
    for k in range(n_windows):
        s = k * step
        w = torch.from_numpy(val_ids[s: s + T + 1].astype(np.int64)).unsqueeze(0)
        out = model(w[:, :-1], sparse=True, want=("nextn",), mtp_tokens=w[:, 1:-1])
        nll += F.cross_entropy(out["logits"][0], w[0, 1:], reduction="sum").item()
        cnt += T
        nx = out["nextn"][0]  # position i predicts token i+2
        tgt = w[0, 2:]
        agree += (nx.argmax(-1) == tgt).sum().item()
        mtp_nll += F.cross_entropy(nx, tgt, reduction="sum").item()
        n_mtp += tgt.numel()
    model.train()
    return nll / cnt, agree / n_mtp, mtp_nll / n_mtp


@torch.no_grad()
def chat_eval(model, tok, held, lp_uni, n=40, seed=7):
    """Held-out half-verses as chat turns: the per-token NLL of the true second half given
    'Continue this verse: <first half>' against the unigram NLL of the same tokens, and the
    word overlap (F1) of the greedy reply with the true second half."""
    model.eval()
    rng = random.Random(seed)
    verses = [v for _, vs in held for v in vs if corpus.half_split(v)]
    rng.shuffle(verses)
    stop = {tok.special["<|user|>"], tok.special["<|endoftext|>"]}
    m_nll = u_nll = ntok = 0.0
    f1s, samples = [], []
    for v in verses[:n]:
        a, b = corpus.half_split(v)
        prompt = tok.encode(corpus.chat_prompt(f"Continue this verse: {a}"))
        ref = tok.encode(b)
        ids = torch.tensor([prompt + ref])
        lg = model(ids[:, :-1], sparse=True)["logits"][0]
        lpm = torch.log_softmax(lg[len(prompt) - 1:], -1)
        m_nll += -lpm[torch.arange(len(ref)), torch.tensor(ref)].sum().item()
        u_nll += -float(lp_uni[ref].sum())
        ntok += len(ref)
        gen = list(prompt)
        for _ in range(min(48, model.c.n_ctx - len(prompt))):
            nxt = int(model(torch.tensor([gen]), sparse=True)["logits"][0, -1].argmax())
            if nxt in stop:
                break
            gen.append(nxt)
        reply = tok.decode(gen[len(prompt):])
        f1s.append(word_f1(reply, b))
        if len(samples) < 8:
            samples.append({"first_half": a, "reference": b, "reply": reply})
    model.train()
    return {"n": len(f1s), "model_nll_per_token": m_nll / ntok, "unigram_nll_per_token": u_nll / ntok,
            "greedy_reply_word_f1": sum(f1s) / len(f1s), "samples": samples}


def word_f1(a, b):
    wa = [w.strip(".,;:?!()'").lower() for w in a.split()]
    wb = [w.strip(".,;:?!()'").lower() for w in b.split()]
    if not wa or not wb:
        return 0.0
    from collections import Counter
    common = sum((Counter(wa) & Counter(wb)).values())
    if common == 0:
        return 0.0
    p, r = common / len(wa), common / len(wb)
    return 2 * p * r / (p + r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="train/out")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dense-steps", type=int, default=-1, help="default: 10%% of --steps")
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--bias-rate", type=float, default=1e-3, help="MoE bias step per update")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--name", default="glm5.cpp KJV miniature")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    t_start, c_start = time.time(), time.process_time()
    tok, train_ids, val_ids, held = build_data(args.out, args.vocab, args.seed)
    cfg = Config(n_vocab=tok.n_vocab, n_embd=args.n_embd)
    T = cfg.n_ctx
    uni_val, lp_uni = unigram_nll(train_ids, val_ids, tok.n_vocab)
    log(f"unigram baseline on validation: {uni_val:.4f} nats/token")

    model = GlmDsa(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters, config {json.dumps(cfg.to_dict())}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    dense_steps = args.dense_steps if args.dense_steps >= 0 else args.steps // 10
    warm = max(1, args.steps // 20)

    def lr_at(s):
        if s < warm:
            return args.lr * (s + 1) / warm
        q = (s - warm) / max(1, args.steps - warm)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * q)))

    rng = np.random.default_rng(args.seed)
    hist = []
    metrics_path = os.path.join(args.out, "history.jsonl")
    hf = open(metrics_path, "w")
    t_loop = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        sparse = step >= dense_steps
        b = batches_from(train_ids, args.batch, T, rng)
        out = model(b[:, :-1], sparse=sparse, want=("idx_kl", "nextn"))
        loss_lm = F.cross_entropy(out["logits"].reshape(-1, cfg.n_vocab), b[:, 1:].reshape(-1))
        nx = out["nextn"]  # positions 0..T-2 predict tokens 2..T
        loss_mtp = F.cross_entropy(nx.reshape(-1, cfg.n_vocab), b[:, 2:].reshape(-1))
        loss = loss_lm + args.mtp_weight * loss_mtp + out["idx_kl"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing: push under-loaded experts up
            for m in model.moe_layers():
                load = m.last_load
                m.bias += args.bias_rate * torch.sign(load.mean() - load)
        rec = {"step": step + 1, "loss": loss_lm.item(), "mtp": loss_mtp.item(),
               "idx_kl": float(out["idx_kl"]), "sparse": sparse}
        if (step + 1) % 10 == 0 or step == 0:
            el = time.time() - t_loop
            eta = el / (step + 1) * (args.steps - step - 1)
            log(f"step {step + 1}/{args.steps} loss {rec['loss']:.3f} mtp {rec['mtp']:.3f} "
                f"idx_kl {rec['idx_kl']:.3f} {'sparse' if sparse else 'dense'} lr {lr_at(step):.2e} "
                f"{el / (step + 1):.2f} s/step, eta {eta / 60:.1f} min")
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            vl, agree, vmtp = evaluate(model, val_ids, T)
            rec.update({"val_loss": vl, "val_nextn_agree": agree, "val_mtp": vmtp})
            loads = [m.last_load.tolist() for m in model.moe_layers()]
            log(f"eval step {step + 1}: val loss {vl:.4f} (unigram {uni_val:.4f}), NextN top-1 "
                f"agreement {agree:.3f}, expert loads {loads}")
        hist.append(rec)
        hf.write(json.dumps(rec) + "\n")
        hf.flush()
    wall, cpu = time.time() - t_start, time.process_time() - c_start

    torch.save({"config": cfg.to_dict(), "state": model.state_dict()}, os.path.join(args.out, "model.pt"))
    gguf_path = os.path.join(args.out, "kjv-mini.gguf")
    export.export(model, tok, gguf_path, args.name)
    vl, agree, vmtp = evaluate(model, val_ids, T)
    ce = chat_eval(model, tok, held, lp_uni)
    summary = {
        "config": cfg.to_dict(), "parameters": n_params, "steps": args.steps, "batch": args.batch,
        "context": T, "tokens_seen": args.steps * args.batch * T, "train_tokens": int(len(train_ids)),
        "val_tokens": int(len(val_ids)), "unigram_val_loss": uni_val, "val_loss": vl,
        "val_loss_below_unigram": uni_val - vl, "val_nextn_top1_agreement": agree,
        "val_nextn_loss": vmtp, "final_train_loss": hist[-1]["loss"], "chat_eval": ce,
        "train_wall_s": wall, "train_cpu_s": cpu, "torch": torch.__version__,
        "threads": args.threads, "dense_steps": dense_steps,
        "expert_bias": [m.bias.tolist() for m in model.moe_layers()],
    }
    json.dump(summary, open(os.path.join(args.out, "summary.json"), "w"), indent=1)
    log(json.dumps({k: v for k, v in summary.items() if k not in ("config", "chat_eval")}))
    log(json.dumps(ce, indent=1))
    try:
        plot(hist, uni_val, os.path.join(args.out, "loss.png"))
    except Exception as e:  # matplotlib missing: the numbers are in history.jsonl
        log(f"no plot: {e}")


def plot(hist, uni_val, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    s = [h["step"] for h in hist]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    # A running mean of 20 steps keeps the training curve readable.
    k = min(20, len(hist))
    tl = np.convolve([h["loss"] for h in hist], np.ones(k) / k, mode="valid")
    ax.plot(s[k - 1:], tl, label=f"training loss ({k}-step mean)", lw=1)
    ev = [h for h in hist if "val_loss" in h]
    ax.plot([h["step"] for h in ev], [h["val_loss"] for h in ev], "o-", label="validation loss", ms=3)
    ax.plot([h["step"] for h in ev], [h["val_mtp"] for h in ev], "s--", ms=3,
            label="validation NextN loss (token +2)")
    ax.axhline(uni_val, color="gray", ls=":", label=f"unigram baseline {uni_val:.2f}")
    ax.set_xlabel("step")
    ax.set_ylabel("nats / token")
    ax.set_title("glm-dsa miniature on the KJV")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
