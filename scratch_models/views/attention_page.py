"""One self-contained HTML page that shows the attention of one sequence, in three views:

- head view: tokens twice (queries left, keys right) joined by one line per pair, coloured by the head that
  attends most and as opaque as its weight; hover a token for every head's weight apart; past `LONG_INPUT` tokens
  it starts with each query's strongest lines only, since all of them are a tangle;
- model view: a small heatmap for every layer x head, click one to enlarge it;
- neuron view: for one query, the vectors q and k, their elementwise product, q·k, the score and the model's
  probability, key by key (past `LONG_INPUT` tokens, the most likely keys first);
- heads view, when given per-head numbers (`heads`: an AttentionSummary, or a HeadReport that scores the heads for a
  target too): a layer x head grid coloured by a chosen measure, each cell with its head's label ("→[SEP]", "prev",
  ...), and the heads ranked by that measure; a cell or a row opens its head in the other three views.

The idea is bertviz's, but bertviz needs a notebook and a CDN; this page is one file with its data, style and
plain JavaScript inline, so it opens offline, and in a notebook it shows inline in an iframe of its own. The
markup, style and script are package data in `pages/attention.{html,css,js}`, with the heads view's
(`pages/attention_heads.html`, and `heads_view.{html,js}`, `analysis_heatmap.{css,js}` shared with the heads page);
this module fills in the data.

    page = AttentionPage(capture, layer=2, head=3)   # page.html; page.save("attention.html"); Jupyter shows it
    AttentionPage(capture, heads=AttentionSummary.from_cache(cache, groups))   # with the heads view

Colours are those of the PNGs (attention_plots): the probability on a square-root scale, named by a colour bar, and a
thumbnail smaller than its tokens keeps each block's largest weight.

A page holds every layer's probabilities (a byte each, their square root in 254 steps: what the colours show, and
fine steps for the small weights of long inputs) and q and k (float32, so q·k on the page is the model's), which grow
with the square of the tokens. The neuron view's probabilities are exact: each query's log-normaliser (logZ, over all
its keys, shown or not) turns the page's score into the model's probability. A page stays under `max_bytes`: a
longer input shows a window of tokens (around the query), and the page and `page.notice` say so.
"""

import base64
import dataclasses
import html
import json
import re

import torch

from ..analysis.heads import AttentionSummary, HeadReport
from ..hooking.inspection import AttentionCapture
from .display import ATTENTION_COLOURS, page_file, script_json, write_atomically

MAX_BYTES = 20_000_000  # a few seconds to open in Chromium on a 2-core machine; a notebook output stays sane
MAX_TOKENS = 1024  # the head view draws each token as a 22 px row on one canvas, at most 32767 px high
IFRAME_HEIGHT = 900  # px of a page shown in a notebook; it scrolls inside
LONG_INPUT = 40  # tokens; past this the head view and the neuron view start as a long input needs (attention.js)
_MASKED, _STEPS = 255, 254  # probability p is stored as round(p ** gamma * 254), its shade; 255 marks a masked score


class AttentionPage:
    """The page for `capture`, showing `layer`, `head` and `query` (an index into capture.tokens) first.

    window: (start, end) to show tokens start..end-1 only; None shows them all, or, when that page would pass
    `max_bytes` (None: no bound), the most tokens that fit, around `query`.
    heads: per-head numbers of the same model for the heads view (an AttentionSummary: labels, attention shares and
    entropy; a HeadReport: those and ablation and gradient scores); None: no heads view.
    Attributes: html (the page), start and end (the tokens shown, of `total`), notice (why not all of them, or None).
    """

    def __init__(self, capture: AttentionCapture, *, layer: int = 0, head: int = 0, query: int = 0,
                 title: str = "attention", window: tuple[int, int] | None = None, max_bytes: int | None = MAX_BYTES,
                 heads: AttentionSummary | HeadReport | None = None):
        total = len(capture.tokens)
        for name, value, count in (("layer", layer, capture.num_layers), ("head", head, capture.num_heads),
                                   ("query", query, total)):
            if not 0 <= value < count:
                raise ValueError(f"{name} must be in 0..{count - 1}, got {value}")
        heads_data = None if heads is None else _heads_data(heads, capture)
        if window is not None:
            capture.window(*window)  # checks the bounds, naming the window
            if not window[0] <= query < window[1]:
                raise ValueError(f"query {query} is outside the window {window[0]}:{window[1]}")
        wanted = total if window is None else window[1] - window[0]
        # Store less before showing less: q and k of the chosen layer only, then fewer tokens.
        for self.neuron_layers in (list(range(capture.num_layers)), [layer]):
            fits = min(total, MAX_TOKENS, _most_tokens(capture, len(self.neuron_layers), title, heads_data,
                                                       max_bytes))
            if wanted <= fits:
                break
        bounds = ("" if max_bytes is None else f"{max_bytes:,} bytes and ") + f"{MAX_TOKENS} tokens"
        if wanted > fits and window is not None:
            raise ValueError(f"window {window[0]}:{window[1]} holds {wanted} tokens; within a page's bounds "
                             f"({bounds}) at most {fits} fit")
        self.title, self.total = title, total
        while True:
            self.start, self.end = window or _around(query, fits, total)
            bounded = len(self.neuron_layers) < capture.num_layers or self.end - self.start < wanted
            self.notice = _notice(self.start, self.end, total, layer, len(self.neuron_layers) < capture.num_layers,
                                  bounds if bounded else None)
            shown = capture if (self.start, self.end) == (0, total) else capture.window(self.start, self.end)
            self.html = _render(shown, self.neuron_layers, layer=layer, head=head, query=query - self.start,
                                title=title, notice=self.notice, heads=heads_data)
            # The bound is a promise, and _most_tokens only estimates the tokens' text from their average length.
            if max_bytes is None or len(self.html.encode()) <= max_bytes:
                break
            if window is not None or fits == 1:
                raise ValueError(f"the page of tokens {self.start}:{self.end} takes {len(self.html.encode()):,} "
                                 f"bytes, over max_bytes={max_bytes:,}")
            fits -= max(1, fits // 50)

    def __repr__(self) -> str:  # what a notebook stores beside the page: no memory address, the same every run
        return f"AttentionPage({self.title!r}: tokens {self.start}..{self.end - 1} of {self.total})"

    def save(self, path):
        """Write the page to `path` whole, or not at all."""
        return write_atomically(path, self.html.encode())

    def _repr_html_(self) -> str:
        # An iframe gives the page a document of its own: its ids and script cannot meet those of another view in
        # the same notebook, and it needs nothing from outside (no CDN, no notebook extension).
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" title="{html.escape(self.title)}" '
                f'sandbox="allow-scripts" style="width: 100%; height: {IFRAME_HEIGHT}px; border: 1px solid #d5d9e0">'
                "</iframe>")


def _notice(start: int, end: int, total: int, layer: int, one_layer: bool, bounds: str | None) -> str | None:
    """What the page leaves out, and why: `bounds` when the page's bounds made it, None when the caller asked."""
    parts = []
    if (start, end) != (0, total):
        parts.append(f"tokens {start}..{end - 1} of {total} are shown (a query's weights on the other tokens are not, "
                     "so its row sums to less than 1)")
    if one_layer:
        parts.append(f"the neuron view holds layer {layer} only")
    if bounds is not None:
        return (f"This page is bounded to {bounds}: {'; '.join(parts)}. Choose the tokens with window=(start, end) "
                "and the layer with layer=N (scratch-models inspect --window START:END --layer N).")
    return parts[0][0].upper() + parts[0][1:] + "." if parts else None


def _around(query: int, count: int, total: int) -> tuple[int, int]:
    """`count` of `total` tokens with `query` in the middle, as far as the ends allow."""
    start = min(max(query - count // 2, 0), total - count)
    return start, start + count


def _heads_data(heads: AttentionSummary | HeadReport, capture: AttentionCapture) -> dict:
    """What the heads view reads: the summary's or the report's numbers, checked against the capture's heads."""
    if not isinstance(heads, (AttentionSummary, HeadReport)):
        raise TypeError("heads must be an AttentionSummary or a HeadReport (scratch_models.analysis.heads), got "
                        f"{type(heads).__name__}")
    labels = (heads.attention if isinstance(heads, HeadReport) else heads).labels
    if (len(labels), len(labels[0])) != (capture.num_layers, capture.num_heads):
        raise ValueError(f"heads: {len(labels)} layers x {len(labels[0])} heads, but the capture has "
                         f"{capture.num_layers} x {capture.num_heads}")
    return heads.to_json()


def _files(heads: dict | None) -> dict[str, list[str]]:
    """The package data files the page is made of, by kind; the heads view's only when it has one."""
    extra = heads is not None
    return {"html": ["attention.html", *(["attention_heads.html", "heads_view.html"] if extra else [])],
            "css": ["attention.css", *(["analysis_heatmap.css"] if extra else [])],
            "js": ["analysis_heatmap.js", *(["heads_view.js"] if extra else []), "attention.js"]}


def _render(capture: AttentionCapture, neuron_layers: list[int], *, layer: int, head: int, query: int, title: str,
            notice: str | None, heads: dict | None) -> str:
    num_layers, num_heads, seq_len, head_dim = capture.q.shape
    masked = capture.masked
    levels = torch.round(capture.probs.double().clamp(0, 1) ** ATTENTION_COLOURS.gamma * _STEPS).to(torch.uint8)
    data = {
        "tokens": capture.tokens,
        "positions": capture.positions,
        "inputLength": capture.input_length,
        "sentenceBStart": capture.sentence_b_start,
        "probs": _packed(levels.masked_fill(masked, _MASKED)),
        "neuronLayers": neuron_layers,  # the layers whose q and k the page holds, for the neuron view
        "q": _packed(capture.q[neuron_layers].float()),
        "k": _packed(capture.k[neuron_layers].float()),
        "scale": [_score_scale(capture, masked, i) for i in neuron_layers],
        "logZ": _packed(_log_normaliser(capture, masked, neuron_layers)),
        "colours": dataclasses.asdict(ATTENTION_COLOURS), "longInput": LONG_INPUT,
        "layer": layer, "head": head, "query": query,
        "heads": heads,  # for the heads view, or None
    }
    subtitle = " · ".join(
        [f"{seq_len} tokens", *([capture.part] if capture.part else []), f"{num_layers} layers", f"{num_heads} heads",
         f"d = {head_dim} per head",
         *([] if capture.sentence_b_start is None else [f"segment B from token {capture.sentence_b_start}"])])
    files = _files(heads)
    view = "" if heads is None else page_file("attention_heads.html").replace("__VIEW__", page_file("heads_view.html"))
    parts = {"TITLE": html.escape(title), "SUBTITLE": html.escape(subtitle), "NOTICE": html.escape(notice or ""),
             "HEADS": view, "STYLE": "\n".join(page_file(name) for name in files["css"]),
             "SCRIPT": "\n".join(page_file(name) for name in files["js"]), "DATA": script_json(data)}
    # One pass, so a title that happens to contain "__DATA__" is not filled in a second time.
    return re.sub(r"__(TITLE|SUBTITLE|NOTICE|HEADS|STYLE|SCRIPT|DATA)__", lambda m: parts[m.group(1)],
                  page_file("attention.html"))


def _most_tokens(capture: AttentionCapture, neuron_layers: int, title: str, heads: dict | None,
                 max_bytes: int | None) -> int:
    """The most tokens whose page, with q and k of `neuron_layers` layers and the heads view's data, stays within
    max_bytes, estimated from the sizes of its parts."""
    total = len(capture.tokens)
    if max_bytes is None:
        return total
    num_layers, num_heads, _, head_dim = capture.q.shape
    text = sum(len(json.dumps(t)) + len(str(p)) + 2 for t, p in zip(capture.tokens, capture.positions)) / total

    fixed = sum(len(page_file(name).encode()) for names in _files(heads).values() for name in names)
    fixed += len(script_json(heads).encode()) + 2 * len(title.encode()) + 2048

    def size(n):  # base64 takes 4 characters for 3 bytes: probabilities a byte each, q, k and logZ 4 bytes a value
        return (fixed + n * text
                + 4 / 3 * (num_layers * num_heads * n * n + neuron_layers * num_heads * n * (2 * head_dim + 1) * 4))

    if size(1) > max_bytes:
        raise ValueError(f"max_bytes={max_bytes:,} is less than a page of one token needs ({size(1):,.0f} bytes)")
    low, high = 1, total  # size(low) fits; find the largest n that does
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if size(middle) <= max_bytes else (low, middle - 1)
    return low


def _score_scale(capture: AttentionCapture, masked: torch.Tensor, layer: int) -> float:
    """The factor between q·k and the model's score in `layer` (1/√d in BERT and GPT-2; a GPT-2 config may drop
    it, or divide by the layer's number too), read off the model's own scores at the largest |q·k|."""
    dots = capture.q[layer].double() @ capture.k[layer].double().transpose(-1, -2)
    readable = (~masked[layer] & (dots != 0)).flatten()
    if not readable.any():  # every q·k is 0 or masked: any factor gives the model's scores; take the usual one
        return capture.q.shape[-1] ** -0.5
    at = (dots.abs().flatten() * readable).argmax()
    return float(capture.scores[layer].double().flatten()[at] / dots.flatten()[at])


def _log_normaliser(capture: AttentionCapture, masked: torch.Tensor, layers: list[int]) -> torch.Tensor:
    """[layers, heads, query] float32: log of each query's softmax denominator over all the keys of the model's input,
    so that exp(score - logZ) is its probability. A window holds some of the keys only, but every probability is the
    model's, so logZ = score - log(probability) at the query's most likely shown key. +inf where no shown key has a
    probability above 0: every shown probability is then 0."""
    probs, scores = capture.probs[layers].double(), capture.scores[layers].double()
    best, at = probs.masked_fill(masked[layers], 0).max(-1)
    log_z = scores.gather(-1, at[..., None])[..., 0] - best.log()
    return log_z.masked_fill(best == 0, float("inf")).float()


def _packed(t: torch.Tensor) -> dict:
    """A tensor as {"shape", "data": base64 of its values, row-major, little-endian}."""
    values = t.contiguous().numpy()
    values = values.astype(values.dtype.newbyteorder("<"))  # a copy only on a big-endian machine
    return {"shape": list(t.shape), "data": base64.b64encode(values.tobytes()).decode("ascii")}
