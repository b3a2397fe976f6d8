"""Attention as PNG heatmaps (matplotlib): every layer x head at a glance, and one head with its tokens.

    attention_grid_png(capture).save("grid.png")     # a PNG object; Jupyter shows it inline
    head_png(capture, layer=2, head=3)

Figures are sized in pixels, not left to matplotlib's tight layout, so each image's size is known in advance:
the grid is `GRID_LEFT + heads * GRID_CELL + GRID_RIGHT` wide and `GRID_TOP + layers * GRID_CELL` high. One head's
heatmap is `head_side(tokens)` pixels square: `LABEL_PX` per token, so every token label has room, within `HEAD_MIN`
and `HEAD_MAX`; past `HEAD_MAX / LABEL_PX` tokens every n-th token is labelled (with its position). Around it the
image adds `HEAD_LEFT + HEAD_RIGHT` pixels of width and `HEAD_TOP + HEAD_BOTTOM` of height for labels and the colour
bar.

Colour is the probability on a square-root scale (display.ATTENTION_COLOURS, the attention page's too), from 0
(white) to 1 (dark), the same in every cell so heads compare at a glance, named by the colour bar. A head drawn in
fewer pixels than it has tokens is shrunk by keeping each block's largest weight, so a one-token-wide diagonal or
column stays visible instead of being sampled away.
"""

import math

import torch
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure

from ..hooking.inspection import AttentionCapture
from .display import ATTENTION_COLOURS, PNG, drawable, picture_label, render_png

DPI = 100
GRID_CELL, GRID_LEFT, GRID_TOP, GRID_RIGHT = 80, 60, 50, 90  # pixels
LABEL_PX, LABEL_PT = 14, 9  # a token label is 9 pt (12.5 px at 100 dpi), given 14 px
HEAD_MIN, HEAD_MAX = 560, 2000  # pixels per side of one head's heatmap
HEAD_LEFT, HEAD_RIGHT, HEAD_TOP, HEAD_BOTTOM = 190, 110, 50, 170  # pixels around it
CMAP = "Blues"
BOUNDARY_COLOUR = "#d62728"  # the A/B line of a sentence pair


def attention_grid_png(capture: AttentionCapture, title: str = "attention") -> PNG:
    """Every layer (rows) x head (columns) as a small heatmap: query rows, key columns."""
    layers, heads = capture.num_layers, capture.num_heads
    width, height = GRID_LEFT + heads * GRID_CELL + GRID_RIGHT, GRID_TOP + layers * GRID_CELL
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    fig.text(4 / width, 1 - 8 / height, drawable(f"{title}{_part(capture)}: layer (rows) x head (columns), query rows "
                                                 "x key columns"), va="top", fontsize=9)
    pad = 4  # pixels between cells
    for layer in range(layers):
        for head in range(heads):
            left, top = GRID_LEFT + head * GRID_CELL, GRID_TOP + layer * GRID_CELL
            ax = fig.add_axes(((left + pad) / width, 1 - (top + GRID_CELL - pad) / height,
                               (GRID_CELL - 2 * pad) / width, (GRID_CELL - 2 * pad) / height))
            image = _heatmap(ax, capture, layer, head, GRID_CELL - 2 * pad, linewidth=0.6)
            ax.set_xticks([])
            ax.set_yticks([])
            if head == 0:
                ax.set_ylabel(f"L{layer}", rotation=0, ha="right", va="center", fontsize=8)
            if layer == 0:
                ax.set_title(f"H{head}", fontsize=8, pad=2)
    cells = layers * GRID_CELL - 2 * pad
    bar = fig.add_axes(((width - GRID_RIGHT + 12) / width, 1 - (GRID_TOP + pad + cells) / height, 12 / width,
                        cells / height))
    _colour_bar(fig, image, bar, cells, fontsize=7)
    return render_png(fig, width, height)


def head_side(tokens: int) -> int:
    """Pixels per side of one head's heatmap for this many tokens."""
    return max(HEAD_MIN, min(HEAD_MAX, tokens * LABEL_PX))


def label_every(tokens: int) -> int:
    """Label every n-th token of one head's heatmap, so that each label has LABEL_PX to itself."""
    return math.ceil(tokens * LABEL_PX / head_side(tokens))


def head_png(capture: AttentionCapture, layer: int, head: int, title: str = "attention") -> PNG:
    """One head's attention with the tokens on both axes and a colour bar."""
    _check_index("layer", layer, capture.num_layers)
    _check_index("head", head, capture.num_heads)
    count = len(capture.tokens)
    side = head_side(count)
    width, height = HEAD_LEFT + side + HEAD_RIGHT, HEAD_TOP + side + HEAD_BOTTOM
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    ax = fig.add_axes((HEAD_LEFT / width, HEAD_BOTTOM / height, side / width, side / height))
    image = _heatmap(ax, capture, layer, head, side, linewidth=1.2)
    every = label_every(count)
    ticks = range(0, count, every)
    labels = [picture_label(capture.tokens[i], 14) if every == 1
              else f"{capture.positions[i]} {picture_label(capture.tokens[i], 14)}" for i in ticks]
    ax.set_xticks(ticks, labels, rotation=90, fontsize=LABEL_PT)
    ax.set_yticks(ticks, labels, fontsize=LABEL_PT)
    ax.set_xlabel("key (attended to)" + ("" if every == 1 else f", one label per {every} tokens"))
    ax.set_ylabel("query (attending)")
    ax.set_title(drawable(f"{title}: layer {layer}, head {head}{_part(capture)}"), fontsize=11)
    cax = fig.add_axes(((HEAD_LEFT + side + 20) / width, HEAD_BOTTOM / height, 18 / width, side / height))
    _colour_bar(fig, image, cax, side, fontsize=9)
    return render_png(fig, width, height)


def shrunk(probs: torch.Tensor, pixels: int) -> torch.Tensor:
    """A [query, key] matrix in at most `pixels` rows and columns, each cell the largest weight of the block it
    covers (the matrix itself when it fits)."""
    if max(probs.shape) <= pixels:
        return probs
    return torch.nn.functional.adaptive_max_pool2d(probs[None].float(), pixels)[0]


def _heatmap(ax, capture: AttentionCapture, layer: int, head: int, pixels: int, linewidth: float):
    count = len(capture.tokens)
    # the extent keeps token coordinates, shrunk or not, so the boundary and the tick labels land on their tokens
    image = ax.imshow(shrunk(capture.probs[layer, head], pixels).numpy(), cmap=CMAP,
                      norm=PowerNorm(ATTENTION_COLOURS.gamma, vmin=0.0, vmax=1.0), interpolation="nearest",
                      aspect="auto", extent=(-0.5, count - 0.5, count - 0.5, -0.5))
    for spine in ax.spines.values():  # a frame just outside the cells: on them it would hide the first and last
        spine.set_position(("outward", 1))
        spine.set_linewidth(0.6)
    if capture.sentence_b_start:  # None: no pair; 0: segment B only, no boundary to draw
        edge = capture.sentence_b_start - 0.5  # between the last A token and the first B token
        ax.axhline(edge, color=BOUNDARY_COLOUR, linewidth=linewidth)
        ax.axvline(edge, color=BOUNDARY_COLOUR, linewidth=linewidth)
    return image


def _colour_bar(fig, image, cax, pixels: int, fontsize: float):
    """The colour bar with named probabilities, as many as its height has room for (a tick in 12 px or more)."""
    ticks = [t for t in ATTENTION_COLOURS.ticks if pixels >= 160 or t in (0, 0.1, 0.5, 1)]
    bar = fig.colorbar(image, cax=cax, ticks=ticks)
    bar.ax.set_yticklabels([f"{t:g}" for t in ticks], fontsize=fontsize)
    bar.set_label(ATTENTION_COLOURS.label, fontsize=fontsize)


def _part(capture: AttentionCapture) -> str:
    return f" ({capture.part})" if capture.part else ""


def _check_index(name: str, value: int, count: int):
    if not 0 <= value < count:
        raise ValueError(f"{name}={value} is out of range: this model has {count} (0..{count - 1})")
