"""The attention PNGs on a long input: every head's pattern shows, in the colours the colour bar names."""

import io

import numpy as np
import pytest
import torch
from matplotlib import colormaps
from PIL import Image

from helpers import long_attention
from scratch_models.hooking.inspection import AttentionCapture
from scratch_models.views.attention_plots import (CMAP, GRID_CELL, GRID_LEFT, GRID_RIGHT, GRID_TOP, HEAD_LEFT, HEAD_TOP,
                                                  attention_grid_png, head_png, head_side, shrunk)
from scratch_models.views.display import ATTENTION_COLOURS

LONG = 155
PREV, SINK = 0.35, 0.3  # weights of the previous-token head and of the first-token ("sink") head


def pixels(png) -> torch.Tensor:
    """[height, width, 3] RGB of a PNG."""
    with Image.open(io.BytesIO(png.data)) as image:
        return torch.from_numpy(np.array(image.convert("RGB"))).int()


def drawn(weight: float) -> torch.Tensor:
    """The RGB the pictures give a probability: the colour map at weight ** gamma (the square root)."""
    assert ATTENTION_COLOURS.gamma == 0.5
    return torch.tensor([round(255 * c) for c in colormaps[CMAP](weight ** 0.5)[:3]])


def close(rgb, weight, tolerance=3) -> torch.Tensor:
    """Where `rgb` [..., 3] is `weight`'s colour."""
    return ((rgb - drawn(weight)).abs() <= tolerance).all(-1)


def test_grid_of_a_long_input_shows_every_heads_pattern():
    grid = pixels(attention_grid_png(long_attention(LONG, PREV, SINK)))
    assert grid.shape[:2] == (GRID_TOP + GRID_CELL, GRID_LEFT + 3 * GRID_CELL + GRID_RIGHT)
    inner = GRID_CELL - 2 * 4  # a cell, inside the 4 px gap around it (its frame lies in the gap)

    def cell(head):
        top, left = GRID_TOP + 4, GRID_LEFT + head * GRID_CELL + 4
        return grid[top:top + inner, left:left + inner]

    # The previous-token diagonal is unbroken, in PREV's colour: no pixel row samples it away (155 tokens in 72 px).
    prev = close(cell(0), PREV, tolerance=8)
    assert prev.any(1).all()
    assert prev.sum() >= inner  # a line of its own colour, a pixel a row at least
    # The first-token column reads SINK on every row.
    assert close(cell(1)[:, 0], SINK).all()
    # An even spread of 1/155 is a faint, even tint: not white, not a pattern.
    even = cell(2).float()
    assert (even - drawn(1 / LONG)).abs().max() <= 3 and drawn(1 / LONG).sum() < drawn(0).sum() - 20


def test_head_png_of_a_long_input_draws_each_weight_on_the_named_scale():
    capture = long_attention(LONG, PREV, SINK)
    side = head_side(LONG)
    image = pixels(head_png(capture, 0, 0))
    at = lambda i, j: image[HEAD_TOP + int((i + 0.5) * side / LONG), HEAD_LEFT + int((j + 0.5) * side / LONG)]
    for i in (1, 40, 77, 154):
        assert close(at(i, i - 1), PREV)
        assert close(at(i, i + 1 if i < LONG - 1 else 0), (1 - PREV) / (LONG - 1))
    # the other heads, from the first-token column to the even spread
    image = pixels(head_png(capture, 0, 1))
    assert close(at(100, 0), SINK) and close(at(100, 50), (1 - SINK) / (LONG - 1))


def test_a_head_larger_than_its_picture_keeps_its_strongest_weights():
    count = 2100  # more tokens than the largest heatmap has pixels (GPT-NeoX reads 2048)
    probs = torch.eye(count)
    small = shrunk(probs, 700)
    assert small.shape == (700, 700) and torch.equal(small, torch.eye(700))  # the diagonal kept whole, not averaged
    assert torch.equal(shrunk(probs[:50, :50], 700), probs[:50, :50])
    capture = AttentionCapture([f"w{i}" for i in range(count)], probs[None, None], probs[None, None].log(),
                               torch.ones(1, 1, count, 2), torch.ones(1, 1, count, 2))
    image = pixels(head_png(capture, 0, 0))
    side = head_side(count)
    heatmap = image[HEAD_TOP + 2:HEAD_TOP + side - 2, HEAD_LEFT + 2:HEAD_LEFT + side - 2]
    assert close(heatmap, 1.0, tolerance=8).any(1).all()  # every pixel row holds a piece of the diagonal


@pytest.mark.parametrize("count", [1, 2, 13])
def test_short_inputs_draw_one_cell_a_token(count):
    probs = torch.full((1, 1, count, count), 1 / count)
    capture = AttentionCapture([f"w{i}" for i in range(count)], probs, probs.log(), torch.ones(1, 1, count, 2),
                               torch.ones(1, 1, count, 2))
    image = pixels(head_png(capture, 0, 0))
    side = head_side(count)
    centre = image[HEAD_TOP + side // 2, HEAD_LEFT + side // 2]
    assert close(centre, 1 / count)
