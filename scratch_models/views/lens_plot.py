"""The logit lens as a PNG heatmap (matplotlib): one row per layer (the embeddings at the top, the model's output
at the bottom), one column per input token; each cell shows the most likely token there, coloured by its
probability from 0 (white) to 1 (dark), the same scale in every cell.

The figure is sized in pixels: `LEFT + positions * CELL_WIDTH` wide and `TOP + rows * CELL_HEIGHT + BOTTOM` high.
"""

import os
from pathlib import Path

from matplotlib.figure import Figure

from ..analysis.lens import LensTable
from .display import drawable, label_rotation, picture_label, render_png

DPI = 100
CELL_WIDTH, CELL_HEIGHT = 84, 26  # pixels
LEFT, TOP, BOTTOM, RIGHT = 90, 40, 100, 90  # margins for the row labels, title, input tokens and colour bar
CMAP = "Blues"


def lens_png(table: LensTable, tokens: list[str], top_tokens: list[list[str]], path: str | os.PathLike,
             title: str = "logit lens") -> Path:
    """`tokens`: the input, one per column; `top_tokens[entry][position]`: the text of the most likely token there
    (table.token_ids[entry, position, 0])."""
    probs = table.probs[..., 0]
    rows, columns = probs.shape
    if len(tokens) != columns or len(top_tokens) != rows or any(len(r) != columns for r in top_tokens):
        raise ValueError(f"the lens is {rows} rows x {columns} positions; got {len(tokens)} input tokens and "
                         f"{len(top_tokens)} rows of top tokens")
    width, height = LEFT + columns * CELL_WIDTH + RIGHT, TOP + rows * CELL_HEIGHT + BOTTOM
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    ax = fig.add_axes((LEFT / width, BOTTOM / height, columns * CELL_WIDTH / width, rows * CELL_HEIGHT / height))
    image = ax.imshow(probs.numpy(), cmap=CMAP, vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
    for row in range(rows):
        for column in range(columns):
            dark = float(probs[row, column]) > 0.6
            ax.text(column, row, picture_label(top_tokens[row][column]), ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")
    labels = [picture_label(t) for t in tokens]
    ax.set_xticks(range(columns), labels, rotation=label_rotation(labels, CELL_WIDTH - 6, 8), fontsize=8)
    ax.set_yticks(range(rows), table.labels, fontsize=8)
    ax.set_title(drawable(title), fontsize=10)
    bar = fig.add_axes(((LEFT + columns * CELL_WIDTH + 15) / width, BOTTOM / height, 12 / width,
                        rows * CELL_HEIGHT / height))
    fig.colorbar(image, cax=bar, label="probability")
    return render_png(fig, width, height).save(path)
