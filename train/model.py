"""glm-dsa in PyTorch, as the GGUF describes it (see ../../shared/tools/glm_dsa_numpy_ref.py for
the readable spec of what llama.cpp computes). Trained in the decompressed MLA form; the export
splits kv_b into attn_k_b / attn_v_b as llama.cpp's converter does.

Shapes follow PyTorch order (out, in) for nn.Linear weights; export.py writes them to GGUF.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    n_vocab: int = 2048
    n_embd: int = 128
    n_layer: int = 4  # trunk layers
    n_dense: int = 1  # leading dense layers
    n_ff: int = 384  # dense SwiGLU width
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 128  # routed and shared expert width
    n_head: int = 4
    q_lora: int = 96
    kv_lora: int = 64
    qk_nope: int = 32
    qk_rope: int = 16
    v_head: int = 32
    idx_n_head: int = 4
    idx_head: int = 64
    idx_top_k: int = 64
    indexer_full: list = field(default_factory=lambda: [True, True, False, False])
    n_ctx: int = 256  # training context (context_length in the GGUF)
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-5
    expert_weights_scale: float = 2.5
    nextn: bool = True

    def to_dict(self):
        return asdict(self)


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def hadamard(n, dtype):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).to(dtype)


class Rope:
    """GGML 'normal' RoPE: adjacent pairs (x[2i], x[2i+1]) turned by pos * base^(-2i/n)."""

    def __init__(self, n_rot, base):
        self.n_rot, self.base = n_rot, base
        self.cache = {}

    def cs(self, T, device, dtype):
        key = (T, dtype)
        if key not in self.cache:
            inv = self.base ** (-torch.arange(0, self.n_rot, 2, dtype=torch.float64) / self.n_rot)
            ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
            self.cache[key] = (torch.cos(ang).to(dtype), torch.sin(ang).to(dtype))
        return self.cache[key]

    def __call__(self, x, head_dims):
        """x [B, T, ..., n_rot]: rotates the last axis; head_dims = number of axes between T and it."""
        T = x.shape[1]
        c, s = self.cs(T, x.device, x.dtype)
        shp = (1, T) + (1,) * head_dims + (self.n_rot // 2,)
        c, s = c.view(shp), s.view(shp)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).flatten(-2)


def swiglu(x, g, u, d):
    return F.linear(F.silu(F.linear(x, g)) * F.linear(x, u), d)


class Attention(nn.Module):
    """MLA (decompressed) plus, on full layers, the lightning indexer."""

    def __init__(self, c: Config, with_indexer: bool):
        super().__init__()
        E, H = c.n_embd, c.n_head
        self.c = c
        self.attn_norm = nn.Parameter(torch.ones(E))
        self.q_a = nn.Linear(E, c.q_lora, bias=False)
        self.q_a_norm = nn.Parameter(torch.ones(c.q_lora))
        self.q_b = nn.Linear(c.q_lora, H * (c.qk_nope + c.qk_rope), bias=False)
        self.kv_a = nn.Linear(E, c.kv_lora + c.qk_rope, bias=False)
        self.kv_a_norm = nn.Parameter(torch.ones(c.kv_lora))
        # kv_b in per-head halves: k (nope x kv_lora) and v (v_head x kv_lora)
        self.k_b = nn.Parameter(torch.empty(H, c.qk_nope, c.kv_lora))
        self.v_b = nn.Parameter(torch.empty(H, c.v_head, c.kv_lora))
        self.wo = nn.Linear(H * c.v_head, E, bias=False)
        self.with_indexer = with_indexer
        if with_indexer:
            Hi, Di = c.idx_n_head, c.idx_head
            self.idx_q_b = nn.Linear(c.q_lora, Hi * Di, bias=False)
            self.idx_k = nn.Linear(E, Di, bias=False)
            self.idx_k_norm = nn.Parameter(torch.ones(Di))
            self.idx_k_norm_b = nn.Parameter(torch.zeros(Di))
            self.idx_proj = nn.Linear(E, Hi, bias=False)

    def indexer_scores(self, xn, qr, rope, H_mat):
        """Score [B, Tq, Tk] = sum_h w_h relu(iq_h . ik) (causal mask not applied)."""
        c = self.c
        B, T, _ = xn.shape
        Hi, Di, R = c.idx_n_head, c.idx_head, c.qk_rope
        iq = self.idx_q_b(qr).view(B, T, Hi, Di)
        iq = torch.cat([rope(iq[..., :R], 1), iq[..., R:]], -1)
        k = self.idx_k(xn)
        mu = k.mean(-1, keepdim=True)
        var = (k - mu).pow(2).mean(-1, keepdim=True)
        ik = (k - mu) * torch.rsqrt(var) * self.idx_k_norm + self.idx_k_norm_b  # eps 0, as llama.cpp
        ik = torch.cat([rope(ik[..., :R], 0), ik[..., R:]], -1)
        iq = iq @ H_mat.T
        ik = ik @ H_mat.T
        w = self.idx_proj(xn) / math.sqrt(Di * Hi)  # [B, T, Hi]
        qk = torch.einsum("bthd,bsd->bhts", iq, ik)
        self.last_qk_max = qk.detach().max(1).values  # [B, T, S]: how close a 0 score is to > 0
        return torch.einsum("bhts,bth->bts", F.relu(qk), w)

    def forward(self, x, rope, mask, need_probs=False):
        """x [B, T, E]; mask [B or 1, T, T] bool of visible keys. Returns (out, qr, xn, probs)."""
        c = self.c
        B, T, _ = x.shape
        H, N, R, V = c.n_head, c.qk_nope, c.qk_rope, c.v_head
        xn = rms(x, self.attn_norm, c.rms_eps)
        qr = rms(self.q_a(xn), self.q_a_norm, c.rms_eps)
        q = self.q_b(qr).view(B, T, H, N + R)
        q_nope, q_pe = q[..., :N], rope(q[..., N:], 1)
        kv = self.kv_a(xn)
        lat = rms(kv[..., : c.kv_lora], self.kv_a_norm, c.rms_eps)  # [B, T, C]
        k_pe = rope(kv[..., c.kv_lora:], 0)  # [B, T, R]
        # Decompressed per-head keys and values (the training form; the engine absorbs K_b/V_b).
        k_nope = torch.einsum("btc,hnc->bhtn", lat, self.k_b)
        v = torch.einsum("btc,hvc->bhtv", lat, self.v_b)
        qh = torch.cat([q_nope, q_pe], -1).transpose(1, 2)  # [B, H, T, N+R]
        kh = torch.cat([k_nope, k_pe.unsqueeze(1).expand(B, H, T, R)], -1)
        s = (qh @ kh.transpose(-1, -2)) / math.sqrt(N + R)
        s = s.masked_fill(~mask.unsqueeze(1), float("-inf"))
        p = torch.softmax(s, -1)
        o = (p @ v).transpose(1, 2).reshape(B, T, H * V)
        return self.wo(o), qr, xn, (p if need_probs else None)


class MoE(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        E, X, Fx = c.n_embd, c.n_expert, c.n_ff_exp
        self.c = c
        self.gate_inp = nn.Linear(E, X, bias=False)
        self.register_buffer("bias", torch.zeros(X))  # selection only; balanced, not learned
        self.gate = nn.Parameter(torch.empty(X, Fx, E))
        self.up = nn.Parameter(torch.empty(X, Fx, E))
        self.down = nn.Parameter(torch.empty(X, E, Fx))
        self.sh_gate = nn.Linear(E, Fx, bias=False)
        self.sh_up = nn.Linear(E, Fx, bias=False)
        self.sh_down = nn.Linear(Fx, E, bias=False)
        self.last_load = None
        self.last_gap = None

    def forward(self, xn):
        c = self.c
        shp = xn.shape
        x = xn.reshape(-1, shp[-1])
        p = torch.sigmoid(self.gate_inp(x))
        sel = p + self.bias
        top = torch.topk(sel.detach(), c.n_expert_used + (1 if c.n_expert_used < c.n_expert else 0), -1)
        idx = top.indices[:, : c.n_expert_used]
        if c.n_expert_used < c.n_expert:
            self.last_gap = (top.values[:, c.n_expert_used - 1] - top.values[:, c.n_expert_used]).view(shp[:-1])
        w = torch.gather(p, 1, idx)
        w = w / w.sum(-1, keepdim=True).clamp_min(6.103515625e-5) * c.expert_weights_scale
        out = swiglu(x, self.sh_gate.weight, self.sh_up.weight, self.sh_down.weight)
        load = torch.zeros(c.n_expert, device=x.device)
        for e in range(c.n_expert):
            hit = idx == e
            rows = hit.any(-1).nonzero().squeeze(-1)
            load[e] = rows.numel()
            if rows.numel() == 0:
                continue
            we = (w * hit).sum(-1)[rows].unsqueeze(-1)
            out = out.index_add(0, rows, we * swiglu(x[rows], self.gate[e], self.up[e], self.down[e]))
        self.last_load = load
        return out.view(shp)


class Block(nn.Module):
    def __init__(self, c: Config, il: int, dense: bool, with_indexer: bool):
        super().__init__()
        self.il = il
        self.attn = Attention(c, with_indexer)
        self.ffn_norm = nn.Parameter(torch.ones(c.n_embd))
        self.dense = dense
        if dense:
            self.gate = nn.Linear(c.n_embd, c.n_ff, bias=False)
            self.up = nn.Linear(c.n_embd, c.n_ff, bias=False)
            self.down = nn.Linear(c.n_ff, c.n_embd, bias=False)
        else:
            self.moe = MoE(c)
        self.c = c

    def ffn(self, x):
        xn = rms(x, self.ffn_norm, self.c.rms_eps)
        if self.dense:
            return swiglu(xn, self.gate.weight, self.up.weight, self.down.weight)
        return self.moe(xn)


class NextN(nn.Module):
    def __init__(self, c: Config, il: int):
        super().__init__()
        self.block = Block(c, il, dense=False, with_indexer=True)  # indexer: present, unused
        self.eh_proj = nn.Linear(2 * c.n_embd, c.n_embd, bias=False)
        self.enorm = nn.Parameter(torch.ones(c.n_embd))
        self.hnorm = nn.Parameter(torch.ones(c.n_embd))
        self.shared_head_norm = nn.Parameter(torch.ones(c.n_embd))


class GlmDsa(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.tok_embd = nn.Embedding(c.n_vocab, c.n_embd)
        self.blocks = nn.ModuleList(
            [Block(c, il, il < c.n_dense, c.indexer_full[il]) for il in range(c.n_layer)])
        self.output_norm = nn.Parameter(torch.ones(c.n_embd))
        self.output = nn.Linear(c.n_embd, c.n_vocab, bias=False)
        self.nextn = NextN(c, c.n_layer) if c.nextn else None
        self.rope = Rope(c.qk_rope, c.rope_freq_base)
        self.register_buffer("H_mat", hadamard(c.idx_head, torch.float32), persistent=False)
        self.init_weights()

    def init_weights(self):
        g = torch.Generator().manual_seed(1234)
        resid = 1.0 / math.sqrt(2 * (self.c.n_layer + 1))
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue  # norms: ones (set), biases: zeros
            fan_in = p.shape[-1]
            std = 1.0 / math.sqrt(fan_in)
            if name.endswith(("wo.weight", "down.weight", "sh_down.weight", ".down")):
                std *= resid
            if name == "tok_embd.weight":
                std = 1.0
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)

    # -------------------------------------------------------------------------------------
    def forward(self, tokens, sparse=True, want=(), mtp_tokens=None, kl_rows=4):
        """tokens [B, T]. Returns dict: logits [B,T,V], hidden (post output_norm), and what
        `want` asks for: 'idx_kl' (indexer distillation loss), 'diag' (decision margins),
        'nextn' (NextN logits for positions 0..T-2, using tokens[:,1:] as the next tokens, or
        mtp_tokens [B, T] when given: the token after each position)."""
        c = self.c
        B, T = tokens.shape
        dev = tokens.device
        causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril().unsqueeze(0)
        x = self.tok_embd(tokens)
        out = {}
        sel = None
        groups = []  # (full block, its index scores, [probs of the layers using its selection])
        diag = {"idx_gap": [], "exp_gap": []}
        need_kl = "idx_kl" in want
        for blk in self.blocks:
            at = blk.attn
            if at.with_indexer:
                xn = rms(x, at.attn_norm, c.rms_eps)
                qr = rms(at.q_a(xn), at.q_a_norm, c.rms_eps)
                # The indexer learns only from the distillation loss (inputs detached).
                score = at.indexer_scores(xn.detach(), qr.detach(), self.rope, self.H_mat)
                score = score.masked_fill(~causal, float("-inf"))
                K = min(c.idx_top_k, T)
                # Ties go to the earlier key (a stable sort), as the engine breaks them: keys
                # whose every head has q.k <= 0 score exactly 0, so exact ties are common.
                order = torch.sort(score.detach(), dim=-1, descending=True, stable=True)
                sel = torch.zeros(B, T, T, dtype=torch.bool, device=dev)
                sel.scatter_(-1, order.indices[..., :K], True)
                sel &= causal
                small = (torch.arange(T, device=dev) + 1 <= c.idx_top_k).view(1, T, 1)
                sel = torch.where(small, causal.expand(B, T, T), sel)
                if "diag" in want and T > c.idx_top_k:
                    t2 = order.values[..., : c.idx_top_k + 1]
                    gap = t2[..., -2] - t2[..., -1]
                    # An exact tie at 0 is decided by position in both implementations; it
                    # is fragile only if a zero-score key is close to scoring above 0.
                    zero = (score.detach() == 0) & causal
                    zmargin = torch.where(zero, -at.last_qk_max, torch.full_like(score, float("inf")))
                    zmargin = zmargin.min(-1).values
                    both0 = (t2[..., -2] == 0) & (t2[..., -1] == 0)
                    gap = torch.where(both0, zmargin, gap)
                    gap[:, : c.idx_top_k] = float("inf")  # no choice while t+1 <= top_k
                    diag["idx_gap"].append(gap)
                groups.append([score, []])
            mask = sel if sparse else causal
            a, _, _, probs = at(x, self.rope, mask, need_probs=need_kl)
            if need_kl:
                groups[-1][1].append(probs)
            x = x + a
            x = x + blk.ffn(x)
            if not blk.dense and "diag" in want:
                diag["exp_gap"].append(blk.moe.last_gap)
        h = rms(x, self.output_norm, c.rms_eps)
        out["hidden"] = h
        out["logits"] = self.output(h)
        if need_kl:
            kl = 0.0
            for score, probs in groups:
                # Target: the main attention of the layers this selection serves, summed over
                # heads and layers and L1-normalised (DeepSeek-V3.2's warm-up target); over the
                # selected keys once attention is sparse (the probabilities are zero elsewhere).
                # (on the first kl_rows sequences: the indexer is small and learns fast)
                score = score[:kl_rows]
                tgt = torch.stack([p[:kl_rows].detach().sum(1) for p in probs]).sum(0)
                tgt = tgt / tgt.sum(-1, keepdim=True)
                logq = torch.log_softmax(score.masked_fill(tgt <= 0, float("-inf")), -1)
                term = torch.where(tgt > 0, tgt * (torch.log(tgt.clamp_min(1e-30)) - logq),
                                   torch.zeros_like(tgt))
                kl = kl + term.sum(-1).mean()
            out["idx_kl"] = kl / max(len(groups), 1)
        if "diag" in want:
            out["diag"] = diag
        if "nextn" in want and self.nextn is not None:
            nxt = tokens[:, 1:] if mtp_tokens is None else mtp_tokens
            hh = h[:, : nxt.shape[1]]
            out["nextn"] = self.nextn_forward(hh, nxt)
        return out

    def nextn_forward(self, h, next_tokens):
        """The MTP draft head: h [B, T', E] (trunk hidden after output_norm) at positions
        0..T'-1 and the token after each; dense MLA over those positions, MoE, shared head."""
        c = self.c
        n = self.nextn
        e = rms(self.tok_embd(next_tokens), n.enorm, c.rms_eps)
        z = n.eh_proj(torch.cat([e, rms(h, n.hnorm, c.rms_eps)], -1))
        T = z.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=z.device).tril().unsqueeze(0)
        a, _, _, _ = n.block.attn(z, self.rope, causal)
        z = z + a
        z = z + n.block.ffn(z)
        return self.output(rms(z, n.shared_head_norm, c.rms_eps))

    def moe_layers(self):
        out = [b.moe for b in self.blocks if not b.dense]
        if self.nextn is not None:
            out.append(self.nextn.block.moe)
        return out
