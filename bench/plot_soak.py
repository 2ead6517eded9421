#!/usr/bin/env python3
"""Plots a soak report's RssAnon curve (tests/server/soak.mjs --report FILE).

    /usr/bin/python3 bench/plot_soak.py REPORT.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rep = json.load(open(sys.argv[1]))
t = [p[0] / 60 for p in rep["rss_kb"]]
mib = [p[1] / 1024 for p in rep["rss_kb"]]
fig, ax = plt.subplots(figsize=(6, 3.2), dpi=110)
ax.plot(t, mib, lw=1.2)
ax.axvline(rep["from"] / 60, color="grey", ls="--", lw=0.8)
ax.set_xlabel("minutes into the soak (before 0: the references, served alone)")
ax.set_ylabel("RssAnon (MiB)")
c = rep["counts"]
ax.set_title(
    f"glm5 serve soak: {c['served']} served, {c['cancelled']} cancelled, {c['refused']} refused; "
    f"slope {rep['slope_mib_per_min']:.3f} MiB/min",
    fontsize=8,
)
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(sys.argv[2])
