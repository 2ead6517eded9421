"""Model <-> GGUF: the metadata keys, value types, tensor names and shapes that
src/model/gen_glm_dsa.cpp writes and llama.cpp's glm-dsa loader reads, in the same order.
"""

from __future__ import annotations

import numpy as np
import torch

import gguf_io as G
from model import Config, GlmDsa
from tokenizer import Tokenizer

ARCH = "glm-dsa"

# The chat template the engine's generator writes (src/model/gen_vocab.cpp, kGlm5ChatTemplate):
# the GLM-5 layout the engine renders, so it finds the template matching.
CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- set think = enable_thinking is defined and enable_thinking -%}"
    "{%- if think -%}<|system|>Reasoning Effort: Max{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}<|system|>{{ m['content'] }}"
    "{%- elif m['role'] == 'user' -%}<|user|>{{ m['content'] }}"
    "{%- elif m['role'] == 'assistant' -%}<|assistant|><think></think>{{ m['content'] }}"
    "{%- elif m['role'] == 'tool' -%}<|observation|><tool_response>{{ m['content'] "
    "}}</tool_response>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|><think>{%- if not think -%}</think>{%- endif "
    "-%}{%- endif -%}")


def metadata(c: Config, tok: Tokenizer, name: str, extra=()):
    p = ARCH + "."
    n_blocks = c.n_layer + (1 if c.nextn else 0)
    md = [
        ("general.architecture", G.STRING, ARCH),
        ("general.name", G.STRING, name),
        ("general.type", G.STRING, "model"),
        ("general.file_type", G.U32, 0),  # ALL_F32
        ("general.quantization_version", G.U32, 2),
    ]
    md += list(extra)
    u32 = lambda k, v: md.append((p + k, G.U32, int(v)))  # noqa: E731
    f32 = lambda k, v: md.append((p + k, G.F32, float(v)))  # noqa: E731
    u32("vocab_size", c.n_vocab)
    u32("context_length", c.n_ctx)
    u32("embedding_length", c.n_embd)
    u32("block_count", n_blocks)
    u32("leading_dense_block_count", c.n_dense)
    u32("feed_forward_length", c.n_ff)
    u32("attention.head_count", c.n_head)
    u32("attention.head_count_kv", 1)
    f32("attention.layer_norm_rms_epsilon", c.rms_eps)
    f32("rope.freq_base", c.rope_freq_base)
    u32("rope.dimension_count", c.qk_rope)
    u32("attention.q_lora_rank", c.q_lora)
    u32("attention.kv_lora_rank", c.kv_lora)
    u32("attention.key_length", c.kv_lora + c.qk_rope)
    u32("attention.value_length", c.kv_lora)
    u32("attention.key_length_mla", c.qk_nope + c.qk_rope)
    u32("attention.value_length_mla", c.v_head)
    u32("expert_count", c.n_expert)
    u32("expert_used_count", c.n_expert_used)
    u32("expert_group_count", 1)
    u32("expert_group_used_count", 1)
    u32("expert_shared_count", 1)
    u32("expert_feed_forward_length", c.n_ff_exp)
    f32("expert_weights_scale", c.expert_weights_scale)
    md.append((p + "expert_weights_norm", G.BOOL, True))
    u32("expert_gating_func", 2)  # sigmoid
    u32("nextn_predict_layers", 1 if c.nextn else 0)
    u32("attention.indexer.head_count", c.idx_n_head)
    u32("attention.indexer.key_length", c.idx_head)
    u32("attention.indexer.top_k", c.idx_top_k)
    md.append((p + "attention.indexer.types", G.ARRAY, (G.BOOL, [bool(x) for x in c.indexer_full])))
    sp = tok.special
    md += [
        ("tokenizer.ggml.model", G.STRING, "gpt2"),
        ("tokenizer.ggml.pre", G.STRING, "glm4"),
        ("tokenizer.ggml.tokens", G.ARRAY, (G.STRING, tok.tokens)),
        ("tokenizer.ggml.token_type", G.ARRAY, (G.I32, tok.types)),
        ("tokenizer.ggml.merges", G.ARRAY, (G.STRING, tok.merges)),
        ("tokenizer.ggml.bos_token_id", G.U32, sp["[gMASK]"]),
        ("tokenizer.ggml.eos_token_id", G.U32, sp["<|endoftext|>"]),
        ("tokenizer.ggml.eot_token_id", G.U32, sp["<|user|>"]),
        ("tokenizer.ggml.eom_token_id", G.U32, sp["<|observation|>"]),
        ("tokenizer.ggml.unknown_token_id", G.U32, sp["<|endoftext|>"]),
        ("tokenizer.ggml.padding_token_id", G.U32, sp["<|endoftext|>"]),
        ("tokenizer.ggml.add_bos_token", G.BOOL, False),
        ("tokenizer.chat_template", G.STRING, CHAT_TEMPLATE),
    ]
    return md


def _block_tensors(b: str, blk, c: Config, is_nextn: bool):
    a = blk.attn
    t = [
        (b + "attn_norm.weight", a.attn_norm),
        (b + "attn_q_a_norm.weight", a.q_a_norm),
        (b + "attn_kv_a_norm.weight", a.kv_a_norm),
        (b + "attn_q_a.weight", a.q_a.weight),
        (b + "attn_q_b.weight", a.q_b.weight),
        (b + "attn_kv_a_mqa.weight", a.kv_a.weight),
        # llama.cpp's converter stores K_b transposed per head: ggml [nope, kv_lora, H]
        (b + "attn_k_b.weight", a.k_b.transpose(1, 2)),
        (b + "attn_v_b.weight", a.v_b),  # ggml [kv_lora, v, H]
        (b + "attn_output.weight", a.wo.weight),
        (b + "ffn_norm.weight", blk.ffn_norm),
    ]
    if a.with_indexer:
        t += [
            (b + "indexer.k_norm.weight", a.idx_k_norm),
            (b + "indexer.k_norm.bias", a.idx_k_norm_b),
            (b + "indexer.proj.weight", a.idx_proj.weight),
            (b + "indexer.attn_k.weight", a.idx_k.weight),
            (b + "indexer.attn_q_b.weight", a.idx_q_b.weight),
        ]
    if blk.dense:
        t += [(b + "ffn_gate.weight", blk.gate.weight), (b + "ffn_up.weight", blk.up.weight),
              (b + "ffn_down.weight", blk.down.weight)]
    else:
        m = blk.moe
        t += [
            (b + "ffn_gate_inp.weight", m.gate_inp.weight),
            (b + "exp_probs_b.bias", m.bias),
            (b + "ffn_gate_exps.weight", m.gate),
            (b + "ffn_up_exps.weight", m.up),
            (b + "ffn_down_exps.weight", m.down),
            (b + "ffn_gate_shexp.weight", m.sh_gate.weight),
            (b + "ffn_up_shexp.weight", m.sh_up.weight),
            (b + "ffn_down_shexp.weight", m.sh_down.weight),
        ]
    return t


def tensor_map(model: GlmDsa):
    """[(gguf name, torch tensor)] in the generator's order."""
    c = model.c
    t = [("token_embd.weight", model.tok_embd.weight), ("output_norm.weight", model.output_norm),
         ("output.weight", model.output.weight)]
    for il, blk in enumerate(model.blocks):
        t += _block_tensors(f"blk.{il}.", blk, c, False)
    if model.nextn is not None:
        b = f"blk.{c.n_layer}."
        n = model.nextn
        t += _block_tensors(b, n.block, c, True)
        t += [(b + "nextn.eh_proj.weight", n.eh_proj.weight), (b + "nextn.enorm.weight", n.enorm),
              (b + "nextn.hnorm.weight", n.hnorm),
              (b + "nextn.shared_head_norm.weight", n.shared_head_norm)]
    return t


def export(model: GlmDsa, tok: Tokenizer, path: str, name: str, extra=()):
    tensors = [(n, p.detach().float().cpu().numpy()) for n, p in tensor_map(model)]
    G.write(path, metadata(model.c, tok, name, extra), tensors)


def load(path: str):
    """An exported F32 file back into (model, tokenizer, metadata): the goldens' source."""
    md, ts = G.read(path)
    p = ARCH + "."
    if md.get("general.architecture") != ARCH:
        raise ValueError(f"{path}: not a glm-dsa file")
    c = Config(
        n_vocab=len(md["tokenizer.ggml.tokens"]), n_embd=md[p + "embedding_length"],
        n_layer=md[p + "block_count"] - md[p + "nextn_predict_layers"],
        n_dense=md[p + "leading_dense_block_count"], n_ff=md[p + "feed_forward_length"],
        n_expert=md[p + "expert_count"], n_expert_used=md[p + "expert_used_count"],
        n_ff_exp=md[p + "expert_feed_forward_length"], n_head=md[p + "attention.head_count"],
        q_lora=md[p + "attention.q_lora_rank"], kv_lora=md[p + "attention.kv_lora_rank"],
        qk_nope=md[p + "attention.key_length_mla"] - md[p + "rope.dimension_count"],
        qk_rope=md[p + "rope.dimension_count"], v_head=md[p + "attention.value_length_mla"],
        idx_n_head=md[p + "attention.indexer.head_count"],
        idx_head=md[p + "attention.indexer.key_length"], idx_top_k=md[p + "attention.indexer.top_k"],
        indexer_full=[bool(x) for x in md[p + "attention.indexer.types"]],
        n_ctx=md[p + "context_length"], rope_freq_base=md[p + "rope.freq_base"],
        rms_eps=md[p + "attention.layer_norm_rms_epsilon"],
        expert_weights_scale=md[p + "expert_weights_scale"], nextn=md[p + "nextn_predict_layers"] > 0)
    model = GlmDsa(c)
    with torch.no_grad():
        for name, param in tensor_map(model):
            # (attn_k_b's entry is a transposed view of the parameter: copy_ writes through it)
            param.copy_(torch.from_numpy(ts[name]).view(param.shape))
    tok = Tokenizer(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.merges"])
    return model.eval(), tok, md
