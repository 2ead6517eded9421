"""The trainer's validation numbers, measured again by the engine on the exported file:
`glm5 logits --all --cache-type f32` over the same held-out windows as train.py's evaluate().

    /usr/bin/python3 train/engine_eval.py build/glm5 models/kjv-mini.gguf [train/out/tokens.npz]

Prints the engine's validation loss and next-token top-1 accuracy next to the PyTorch ones.
(The engine's NextN drafts are checked by ctest -R NextN, which prints their agreement.)
"""

import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export  # noqa: E402


def main():
    glm5, path = sys.argv[1], sys.argv[2]
    toks = sys.argv[3] if len(sys.argv) > 3 else "train/out/tokens.npz"
    val = np.load(toks)["val"]
    model, _, _ = export.load(path)
    T, n_windows = model.c.n_ctx, 24
    step = max(1, (len(val) - T - 2) // n_windows)
    e_nll = t_nll = e_hit = t_hit = n = 0.0
    worst = 0.0
    for k in range(n_windows):
        w = val[k * step: k * step + T + 1].astype(np.int64)
        r = subprocess.run([glm5, "logits", "-m", path, "--cache-type", "f32", "--all", "--tokens",
                            ",".join(map(str, w[:-1]))], capture_output=True, text=True, check=True)
        e = torch.tensor(json.loads(r.stdout)["logits"]).view(T, -1)
        with torch.no_grad():
            t = model(torch.from_numpy(w[None, :-1]), sparse=True)["logits"][0]
        y = torch.from_numpy(w[1:])
        e_nll += F.cross_entropy(e, y, reduction="sum").item()
        t_nll += F.cross_entropy(t, y, reduction="sum").item()
        e_hit += (e.argmax(-1) == y).sum().item()
        t_hit += (t.argmax(-1) == y).sum().item()
        worst = max(worst, (e - t).abs().max().item())
        n += T
    print(json.dumps({"windows": n_windows, "tokens": int(n), "engine_val_loss": e_nll / n,
                      "pytorch_val_loss": t_nll / n, "engine_top1": e_hit / n,
                      "pytorch_top1": t_hit / n, "max_abs_logit_diff": worst}))


if __name__ == "__main__":
    main()
