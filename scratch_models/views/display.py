"""What the pictures have in common: they show themselves in Jupyter, and they reach the disk whole or not at all;
the pages' markup, style and script files (package data in pages/), and their data as JSON inside the page."""

import dataclasses
import functools
import io
import json
import math
import os
from importlib import resources
from pathlib import Path



@dataclasses.dataclass(frozen=True)
class ColourScale:
    """How a picture shades a value in 0..1: the shade of p is p ** gamma; its colour bar is labelled `label` and
    names the values `ticks`."""

    gamma: float
    label: str
    ticks: tuple[float, ...]


# Attention in the PNGs and on the page. Linear, a long input is blank: over 155 keys an even spread is 0.006 a key,
# and even a sharp head's second choice is often under 0.1. The square root shows 0.01 as a tint and 0.1 a third of
# the way to dark, and stays one scale for every head, so heads still compare.
ATTENTION_COLOURS = ColourScale(0.5, "attention probability (square-root scale)", (0, 0.01, 0.05, 0.1, 0.25, 0.5, 1))


@dataclasses.dataclass(frozen=True)
class PNG:
    """A rendered PNG image: `save(path)` writes it; Jupyter displays it inline (`_repr_png_`)."""

    data: bytes
    width: int
    height: int

    def save(self, path: str | os.PathLike) -> Path:
        return write_atomically(path, self.data)

    def _repr_png_(self) -> bytes:
        return self.data


def render_png(fig, width: int, height: int) -> PNG:
    """A matplotlib Figure of `width` x `height` pixels rendered fully in memory, so a failure writes nothing."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buffer = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buffer)
    return PNG(buffer.getvalue(), width, height)


def write_atomically(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` through a temporary file in the same directory that is then renamed over `path`, so an error
    leaves neither a half-written file nor a stray temporary one."""
    path = Path(path)
    # Not tempfile.mkstemp: its files are private (0600); a file opened with "x" gets the usual permissions.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


@functools.cache
def page_file(name: str) -> str:
    """The text of scratch_models/views/static/`name`."""
    return (resources.files(__package__) / "static" / name).read_text(encoding="utf-8")


def script_json(data) -> str:
    """`data` as JSON to put inside a <script> element: non-finite numbers become null, and every "<", ">" and "&"
    a JSON unicode escape (JSON.parse reads back the same text), so no "</script>" or "<!--" in a token ends or
    confuses the element."""
    text = json.dumps(_finite(data), separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
