"""PNG heatmaps of head scores and patching sweeps (matplotlib's Figure API, no pyplot state).

    heads_png(report, "heads.png")                 zero-ablation, mean-ablation and gradient scores, layer x head,
                                                   each cell with the head's behaviour label
    patching_png(result, tokens, "patching.png")   every sweep, layer x position (heads: layer x head; heads by
                                                   position: the TOP_HEADS heads of largest effect), patched and
                                                   attribution side by side, 0 = corrupted, 1 = clean

Signed values use a diverging map centred on 0 (red above, blue below), so a head that helps and one that hurts
read apart. Head scores: each panel has its own scale, shown by its colour bar; patching panels all span at least
-1 .. 1, so full restoration looks the same in each.
"""

import os
from pathlib import Path
from typing import Sequence

import torch
from matplotlib.figure import Figure

from ..analysis.heads import HeadReport
from ..analysis.patching import PatchingResult
from .display import drawable, label_rotation, picture_label, render_png

DPI = 100
CELL = 56  # pixels per heatmap cell in heads_png
PATCH_CELL = 28  # pixels per cell in patching_png
TOP_HEADS = 12  # heads by position in patching_png: the heads whose patch moves the metric most (the page and the
                # JSON have every head; 144 rows of GPT-2 small would be a 4000-pixel panel of mostly nothing)
MARGIN_LEFT, MARGIN_TOP, MARGIN_BOTTOM, COLORBAR = 70, 60, 90, 70  # pixels
DIVERGING, SEQUENTIAL = "RdBu_r", "Purples"

SWEEP_TITLES = {"resid_pre": "residual stream (layer input)", "resid_mid": "residual stream (between attn and MLP)",
                "attn_out": "attention output", "mlp_out": "MLP output",
                "attn_head_out_all_pos": "head output (all positions)",
                "attn_head_out_by_pos": "head output (by position)"}


def heads_png(report: HeadReport, path: str | os.PathLike, title: str = "heads") -> Path:
    """Three layer x head panels (zero ablation, mean ablation, gradient importance), each head's label in its
    cells."""
    heads, layers = report.num_heads, report.num_layers
    change = "L2 change" if report.vector_target else "change"
    panels = ((report.zero_ablation, f"zero ablation: {change}", not report.vector_target),
              (report.mean_ablation, f"mean ablation: {change}", not report.vector_target),
              (report.importance, "gradient |d metric / d mask|", False))
    panel_w = heads * CELL + COLORBAR
    width = MARGIN_LEFT + len(panels) * (panel_w + 30)
    height = MARGIN_TOP + layers * CELL + 40
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    fig.text(8 / width, 1 - 10 / height, drawable(f"{title}: target {report.target}"), va="top", fontsize=10)
    fontsize = max(4.5, min(8.0, CELL / 7))
    for index, (values, name, signed) in enumerate(panels):
        left = MARGIN_LEFT + index * (panel_w + 30)
        ax = fig.add_axes(_box(left, MARGIN_TOP, heads * CELL, layers * CELL, width, height))
        image = _heatmap(ax, values, signed)
        ax.set_title(name, fontsize=9)
        ax.set_xticks(range(heads), [f"H{h}" for h in range(heads)], fontsize=7)
        ax.set_yticks(range(layers), [f"L{layer}" for layer in range(layers)], fontsize=7)
        scale = float(values.abs().max()) or 1.0
        for layer in range(layers):
            for head in range(heads):
                value = float(values[layer, head])
                dark = abs(value) > 0.6 * scale
                ax.text(head, layer, drawable(f"{report.attention.labels[layer][head]}\n{value:.2g}"), ha="center",
                        va="center", fontsize=fontsize, color="white" if dark else "black")
        fig.colorbar(image, cax=fig.add_axes(_box(left + heads * CELL + 8, MARGIN_TOP, 12, layers * CELL, width,
                                                  height)))
    return render_png(fig, width, height).save(path)


def patching_png(result: PatchingResult, tokens: Sequence[str], path: str | os.PathLike,
                 title: str = "activation patching") -> Path:
    """One row per sweep: the patched runs (left) and attribution patching's estimate (right), normalised so
    0 is the corrupted run's metric and 1 the clean run's."""
    sweeps = list(result.patched)
    columns = [("patched", result.patched)] + ([("attribution (estimate)", result.attribution)]
                                               if result.attribution else [])
    layers = next(iter(result.patched.values())).shape[0]
    rows = {sweep: _shown_rows(result, sweep, layers) for sweep in sweeps}  # sweep -> (grid rows, their labels)
    cols = {sweep: _as_grid(result.patched[sweep]).shape[1] for sweep in sweeps}
    panel_w = max(cols.values()) * PATCH_CELL + COLORBAR + MARGIN_LEFT
    width = MARGIN_LEFT + len(columns) * panel_w
    heights = [len(rows[sweep][0]) * PATCH_CELL + MARGIN_TOP + MARGIN_BOTTOM for sweep in sweeps]
    height = 40 + sum(heights)
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    fig.text(8 / width, 1 - 10 / height, drawable(f"{title}: 0 = corrupted ({result.corrupted_metric:.4g}), 1 = clean "
                                                  f"({result.clean_metric:.4g})"), va="top", fontsize=10)
    top = 40
    for sweep, panel_h in zip(sweeps, heights):
        shown, labels = rows[sweep]
        every_row = _as_grid(result.patched[sweep]).shape[0]
        panel_title = SWEEP_TITLES[sweep] + (f"\ntop {len(shown)} of {every_row} heads"
                                             if len(shown) < every_row else "")
        for index, (kind, values) in enumerate(columns):
            grid = _as_grid(result.normalized(values[sweep]))[shown]
            left = MARGIN_LEFT + index * panel_w
            box_h = len(shown) * PATCH_CELL
            ax = fig.add_axes(_box(left, top + MARGIN_TOP, cols[sweep] * PATCH_CELL, box_h, width, height))
            image = _heatmap(ax, grid, signed=True, scale=max(1.0, float(grid.abs().max())))  # 1 = clean everywhere
            ax.set_title(f"{panel_title}: {kind}", fontsize=9)
            _axis_labels(ax, sweep, tokens, labels, cols[sweep])
            fig.colorbar(image, cax=fig.add_axes(_box(left + cols[sweep] * PATCH_CELL + 8, top + MARGIN_TOP, 12,
                                                      box_h, width, height)))
        top += panel_h
    return render_png(fig, width, height).save(path)


def _as_grid(values: torch.Tensor) -> torch.Tensor:
    """[layers, positions, heads] (heads by position) -> [layers x heads, positions]; 2-D as it is."""
    return values.permute(0, 2, 1).reshape(-1, values.shape[1]) if values.dim() == 3 else values


def _shown_rows(result: PatchingResult, sweep: str, layers: int) -> tuple[list[int], list[str]]:
    """The grid rows a sweep's panel draws, and their labels: every layer; for heads by position the TOP_HEADS
    heads whose patch moves the metric most at any position (by the patched runs, so both columns show the same
    heads), in layer and head order."""
    grid = _as_grid(result.normalized(result.patched[sweep]))
    if sweep != "attn_head_out_by_pos":
        return list(range(grid.shape[0])), [f"L{layer}" for layer in range(layers)]
    heads = grid.shape[0] // layers
    strongest = grid.abs().amax(dim=1)
    shown = sorted(strongest.argsort(descending=True, stable=True)[:TOP_HEADS].tolist())
    return shown, [f"L{row // heads}H{row % heads}" for row in shown]


def _axis_labels(ax, sweep: str, tokens: Sequence[str], row_labels: Sequence[str], cols: int):
    if sweep == "attn_head_out_all_pos":
        ax.set_xticks(range(cols), [f"H{h}" for h in range(cols)], fontsize=7)
        ax.set_xlabel("head", fontsize=8)
    else:
        labels = [picture_label(t, 12) for t in tokens]
        ax.set_xticks(range(cols), labels, rotation=label_rotation(labels, PATCH_CELL - 4, 7), fontsize=7)
    ax.set_yticks(range(len(row_labels)), row_labels, fontsize=7)
    ax.set_ylabel("head" if sweep == "attn_head_out_by_pos" else "layer", fontsize=8)


def _heatmap(ax, values: torch.Tensor, signed: bool, scale: float | None = None):
    values = values.double()
    scale = scale or float(values.abs().max()) or 1.0
    if signed:
        return ax.imshow(values.numpy(), cmap=DIVERGING, vmin=-scale, vmax=scale, interpolation="nearest",
                         aspect="auto")
    return ax.imshow(values.numpy(), cmap=SEQUENTIAL, vmin=0.0, vmax=scale, interpolation="nearest", aspect="auto")


def _box(left, top, w, h, width, height):
    """Pixel box (from the top-left corner) -> matplotlib's figure fractions (from the bottom-left)."""
    return left / width, 1 - (top + h) / height, w / width, h / height
