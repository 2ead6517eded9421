"""A randomly initialised glm-dsa in the exporter's layout (Part 1's test model: the goldens and
the engine need no training to be compared).

    /usr/bin/python3 train/random_model.py TOKENIZER.json OUT.gguf
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402
from model import Config, GlmDsa  # noqa: E402
from tokenizer import Tokenizer  # noqa: E402


def main():
    tok = Tokenizer.load(sys.argv[1])
    torch.manual_seed(3)
    # Smaller than the trained model, another indexer pattern and top_k, so the test covers a
    # second shape: 3 trunk layers (1 dense), a shared-indexer layer in the middle.
    c = Config(n_vocab=tok.n_vocab, n_embd=64, n_layer=3, n_dense=1, n_ff=192, n_ff_exp=64,
               q_lora=64, kv_lora=32, idx_n_head=8, idx_head=64, idx_top_k=32,
               indexer_full=[True, False, True])
    m = GlmDsa(c)
    with torch.no_grad():
        for moe in m.moe_layers():  # a random selection bias, so that it matters
            moe.bias.copy_(torch.randn(c.n_expert) * 0.1)
        # Positive head weights: at random init many keys score exactly 0 (every head's
        # q.k <= 0), and exact ties at the top_k boundary would leave little to compare;
        # with 8 heads of positive weight such keys are rare.
        for b in list(m.blocks) + [m.nextn.block]:
            if b.attn.with_indexer:
                b.attn.idx_proj.weight.abs_()
    export.export(m, tok, sys.argv[2], "glm5.cpp trainer test: random init")


if __name__ == "__main__":
    main()
