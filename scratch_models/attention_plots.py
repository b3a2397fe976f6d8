"""Attention as PNG heatmaps (matplotlib): every layer x head at a glance, and one head with its tokens.

Figures are sized in pixels, not left to matplotlib's tight layout, so each file's size is known in advance:
the grid is `GRID_LEFT + heads * GRID_CELL` wide and `GRID_TOP + layers * GRID_CELL` high; one head is
`HEAD_SIZE` square. Colour runs from 0 (white) to 1 (dark) in every cell, so heads compare at a glance.
"""

import io
import os
from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .inspection import AttentionCapture

DPI = 100
GRID_CELL, GRID_LEFT, GRID_TOP = 80, 60, 50  # pixels
HEAD_SIZE = 800  # pixels
CMAP = "Blues"
BOUNDARY_COLOUR = "#d62728"  # the A/B line of a sentence pair


def attention_grid_png(capture: AttentionCapture, path: str | os.PathLike, title: str = "attention") -> Path:
    """Every layer (rows) x head (columns) as a small heatmap: query rows, key columns."""
    layers, heads = capture.num_layers, capture.num_heads
    width, height = GRID_LEFT + heads * GRID_CELL, GRID_TOP + layers * GRID_CELL
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    fig.text(4 / width, 1 - 8 / height, f"{title}: layer (rows) x head (columns), query rows x key columns",
             va="top", fontsize=9)
    pad = 4  # pixels between cells
    for layer in range(layers):
        for head in range(heads):
            left, top = GRID_LEFT + head * GRID_CELL, GRID_TOP + layer * GRID_CELL
            ax = fig.add_axes(((left + pad) / width, 1 - (top + GRID_CELL - pad) / height,
                               (GRID_CELL - 2 * pad) / width, (GRID_CELL - 2 * pad) / height))
            _heatmap(ax, capture.probs[layer, head], capture.sentence_b_start, linewidth=0.6)
            ax.set_xticks([])
            ax.set_yticks([])
            if head == 0:
                ax.set_ylabel(f"L{layer}", rotation=0, ha="right", va="center", fontsize=8)
            if layer == 0:
                ax.set_title(f"H{head}", fontsize=8, pad=2)
    return _save(fig, path)


def head_png(capture: AttentionCapture, layer: int, head: int, path: str | os.PathLike,
             title: str = "attention") -> Path:
    """One head's attention with the tokens on both axes and a colour bar."""
    _check_index("layer", layer, capture.num_layers)
    _check_index("head", head, capture.num_heads)
    size = HEAD_SIZE / DPI
    fig = Figure(figsize=(size, size), dpi=DPI)
    # fixed margins leave room for token labels (cut to 14 characters) on the left and at the bottom
    ax = fig.add_axes((0.17, 0.17, 0.68, 0.74))
    image = _heatmap(ax, capture.probs[layer, head], capture.sentence_b_start, linewidth=1.2)
    labels = [_label(t) for t in capture.tokens]
    fontsize = max(4.0, min(10.0, 300 / max(len(labels), 1)))
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=fontsize)
    ax.set_yticks(range(len(labels)), labels, fontsize=fontsize)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(f"{title}: layer {layer}, head {head}", fontsize=11)
    fig.colorbar(image, cax=fig.add_axes((0.87, 0.17, 0.025, 0.74)), label="attention probability")
    return _save(fig, path)


def _heatmap(ax, probs: torch.Tensor, sentence_b_start: int | None, linewidth: float):
    image = ax.imshow(probs.numpy(), cmap=CMAP, vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
    if sentence_b_start is not None:
        edge = sentence_b_start - 0.5  # between the last A token and the first B token
        ax.axhline(edge, color=BOUNDARY_COLOUR, linewidth=linewidth)
        ax.axvline(edge, color=BOUNDARY_COLOUR, linewidth=linewidth)
    return image


def _label(token: str) -> str:
    token = token.replace("\n", "\\n")
    return token if len(token) <= 14 else token[:13] + "…"


def _check_index(name: str, value: int, count: int):
    if not 0 <= value < count:
        raise ValueError(f"{name}={value} is out of range: this model has {count} (0..{count - 1})")


def _save(fig: Figure, path) -> Path:
    """Render fully in memory first, so a failure leaves no half-written file behind."""
    buffer = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buffer)
    path = Path(path)
    path.write_bytes(buffer.getvalue())
    return path
