"""The picture of a feature attribution (scratch_models/dictionaries/attribution.py): the top features as horizontal
bars, the first-order estimate and the exact ablation side by side, so where the estimate misleads shows at once.

    attribution_png(result, "features.png")
"""

import os
from pathlib import Path

from matplotlib.figure import Figure

from .display import drawable, picture_label, render_png

DPI = 100
ROW = 26  # pixels per feature
LEFT, RIGHT, TOP, BOTTOM = 300, 30, 50, 60
ESTIMATE, EXACT = "#4c72b0", "#dd8452"


def attribution_png(result, path: str | os.PathLike, title: str = "feature attribution", n: int = 20) -> Path:
    """The `n` top features (those ablated exactly), each labelled with its dictionary's hook point, its index
    and the token where it acts most."""
    rows = result.top(n)
    if not rows:
        raise ValueError("no feature fired on these prompts: nothing to draw")
    width, height = LEFT + 520 + RIGHT, TOP + len(rows) * ROW + BOTTOM
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    ax = fig.add_axes((LEFT / width, BOTTOM / height, 520 / width, len(rows) * ROW / height))
    places = range(len(rows))
    ax.barh([p - 0.2 for p in places], [row["attribution"] for row in rows], height=0.4, color=ESTIMATE,
            label="attribution (activation × gradient)")
    ax.barh([p + 0.2 for p in places], [row["ablation"] for row in rows], height=0.4, color=EXACT,
            label="exact ablation")
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_yticks(list(places), [_label(result, row) for row in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(drawable(f"change of the metric when the feature is zeroed (metric {result.metric:.4g})"),
                  fontsize=8)
    ax.legend(fontsize=8, loc="lower right")
    fig.text(8 / width, 1 - 10 / height, drawable(title), va="top", fontsize=10)
    return render_png(fig, width, height).save(path)


def _label(result, row: dict) -> str:
    prompt, position = row["position"]
    token = f" {picture_label(result.tokens[prompt][position], 14)}" if result.tokens else ""
    return drawable(f"{row['hook']} #{row['feature']} @{prompt}:{position}") + token
