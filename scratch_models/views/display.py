"""What the pictures have in common: they show themselves in Jupyter, and they reach the disk whole or not at all;
their text is what the font draws; the pages' markup, style and script files (package data in static/), and their
data as JSON inside the page."""

import dataclasses
import functools
import io
import json
import math
import os
import unicodedata
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


@dataclasses.dataclass(frozen=True, repr=False)
class PNG:
    """A rendered PNG image: `save(path)` writes it; Jupyter displays it inline (`_repr_png_`)."""

    data: bytes
    width: int
    height: int

    def __repr__(self) -> str:  # not the bytes: a notebook stores this beside the image
        return f"PNG({self.width}x{self.height})"

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


_SHOWN = {" ": "␣", "\n": "\\n", "\t": "\\t"}  # whitespace a label shows: GPT-2's tokens start with a space


def token_label(token: str, width: int = 11) -> str:
    """A token as one short line of text: spaces shown as ␣, newlines and tabs escaped, and every other control
    character or line separator as its Python escape (a byte-level BPE has a token for each byte: a raw vertical tab
    or carriage return would break the line), cut to `width` characters."""
    return _fit([_SHOWN.get(c) or _one_line(c) for c in token], width)


def _one_line(c: str) -> str:
    return c.encode("unicode_escape").decode("ascii") if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c


def picture_label(token: str, width: int = 11) -> str:
    """token_label for a matplotlib picture: also written so that the picture draws every character (`drawable`)."""
    charmap = _picture_charmap()
    return _fit([_SHOWN.get(c) or _drawable(c, charmap) for c in token], width)


def drawable(text: str) -> str:
    """`text` as a picture can draw it: each character its font lacks (DejaVu Sans has no CJK or Devanagari, 1,052 of
    BERT's 30,522 tokens hold one) and each control character as its Python escape (雄 as \\u96c4), never a
    missing-glyph warning and a blank box; "$" escaped, so no text turns into mathtext (a "$$" token would not draw
    at all). Line breaks stay. A character only a fallback font has is escaped too: the picture looks the same
    on every machine."""
    charmap = _picture_charmap()
    return "".join(c if c == "\n" else _drawable(c, charmap) for c in text)


def _drawable(c: str, charmap: frozenset) -> str:
    if c == "$":
        return "\\$"
    if ord(c) in charmap and unicodedata.category(c) != "Cc":
        return c
    return c.encode("unicode_escape").decode("ascii")


def _fit(parts: list[str], width: int) -> str:
    """The parts joined, cut to `width` characters with "…" between parts (an escape stays whole)."""
    if sum(map(len, parts)) <= width:
        return "".join(parts)
    kept, used = [], 0
    for part in parts:
        if used + len(part) > width - 1:
            break
        kept.append(part)
        used += len(part)
    return "".join(kept) + "…"


def _picture_charmap() -> frozenset:
    """The code points the pictures' font (matplotlib's default for text, as rcParams stand now) has glyphs for."""
    from matplotlib.font_manager import FontProperties, findfont

    return _charmap(findfont(FontProperties()))


@functools.cache
def _charmap(path: str) -> frozenset:
    from matplotlib.ft2font import FT2Font

    return frozenset(FT2Font(path).get_charmap())


def label_rotation(labels, room: float, fontsize: float, dpi: float = 100) -> int:
    """Degrees to turn an axis's tick labels: 0 when each fits in `room` pixels lying level, else 90 for all of them,
    so an axis reads one way and short labels (a digit, H3) stay level."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    measure, font = TextToPath(), FontProperties(size=fontsize)
    widest = max((measure.get_text_width_height_descent(label, font, ismath=False)[0] for label in labels), default=0)
    return 0 if widest * dpi / 72 <= room else 90  # points to pixels


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


def script_json(data, finite: bool = False) -> str:
    """`data` as JSON to put inside a <script> element: non-finite numbers become null (`finite`: the caller made
    them so already; one left is still an error), and every "<", ">" and "&" a JSON unicode escape (JSON.parse reads
    back the same text), so no "</script>" or "<!--" in a token ends or confuses the element."""
    text = json.dumps(data if finite else _finite(data), separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
