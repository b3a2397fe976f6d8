"""One self-contained HTML page that shows the attention of one sequence, in three views:

- head view: tokens twice (queries left, keys right) joined by lines whose opacity is the attention weight,
  one colour per head;
- model view: a small heatmap for every layer x head, click one to enlarge it;
- neuron view: for one query, the vectors q and k, their elementwise product, q·k, the model's score and the
  probability, key by key.

The idea is bertviz's, but bertviz needs a notebook and a CDN; this page is one string of HTML with its data,
style and plain JavaScript inline, so it opens offline from a file.

    page = attention_html(tokens, probs, q, k, scores)   # one layer stack, one sequence: [L, H, S, ...]
"""

import base64
import html
import json
import os
import re
from pathlib import Path

import torch

from .attention import is_masked

_MASKED_BELOW = -1e30  # a score at or below this is a mask value, not a score a model computed


def attention_html(tokens: list[str], probs: torch.Tensor, q: torch.Tensor, k: torch.Tensor, scores: torch.Tensor,
                   *, sentence_b_start: int | None = None, layer: int = 0, head: int = 0, query: int = 0,
                   title: str = "attention") -> str:
    """The page as a string.

    tokens: S strings; probs, scores: [L, H, S, S] (query rows, key columns; scores scaled and masked, before
    softmax); q, k: [L, H, S, d] per-head queries and keys; sentence_b_start: index of the first token of
    segment B of a sentence pair; layer, head, query: what the page shows first.
    """
    num_layers, num_heads, seq_len, head_dim = _check(tokens, probs, q, k, scores, sentence_b_start)
    for name, value, count in (("layer", layer, num_layers), ("head", head, num_heads), ("query", query, seq_len)):
        if not 0 <= value < count:
            raise ValueError(f"{name} must be in 0..{count - 1}, got {value}")
    data = {
        "tokens": list(tokens),
        # Packed as little-endian binary in base64, 2 or 4 bytes a value instead of ~7 characters of JSON, and
        # rendered far faster. Probabilities in steps of 1/65535 (the page shows 4 decimals); q, k and scores in
        # float32 as computed, so q·k on the page is the model's; masked scores NaN.
        "probs": _packed(torch.round(_cpu(probs).clamp(0, 1) * 65535), "u16"),
        "q": _packed(_cpu(q), "f32"),
        "k": _packed(_cpu(k), "f32"),
        "scores": _packed(_cpu(scores).masked_fill(_masked(scores), float("nan")), "f32"),
        "sentenceBStart": sentence_b_start,
        "layer": layer, "head": head, "query": query,
        "dHead": head_dim,
    }
    # Inside <script>, "</script>" or "<!--" in a token would end or confuse the script element: escape every
    # "<" (and ">", "&" for good measure) as a JSON unicode escape, which JSON.parse turns back into the same text.
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    subtitle = (f"{seq_len} tokens · {num_layers} layers · {num_heads} heads · d = {head_dim} per head"
                + ("" if sentence_b_start is None else f" · segment B from token {sentence_b_start}"))
    parts = {"TITLE": html.escape(title), "SUBTITLE": html.escape(subtitle), "STYLE": _STYLE, "SCRIPT": _SCRIPT,
             "DATA": payload}
    # One pass, so a title that happens to contain "__DATA__" is not filled in a second time.
    return re.sub(r"__(TITLE|SUBTITLE|STYLE|SCRIPT|DATA)__", lambda m: parts[m.group(1)], _PAGE)


def write_attention_html(path, *args, **kwargs) -> Path:
    """Render with `attention_html(*args, **kwargs)` and write the page to `path`.

    The page is rendered before the file is touched and written through a temporary file in the same directory
    that is then renamed, so an error leaves neither a half-written page nor a stray temporary file.
    """
    page = attention_html(*args, **kwargs)
    path = Path(path)
    # Not tempfile.mkstemp: its files are private (0600); a page opened with "x" gets the usual permissions.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _check(tokens, probs, q, k, scores, sentence_b_start) -> tuple[int, int, int, int]:
    """Validate the arguments against each other; return (layers, heads, tokens, head dim)."""
    if not isinstance(tokens, (list, tuple)) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ValueError("tokens must be a non-empty list of strings")
    for name, t in (("probs", probs), ("q", q), ("k", k), ("scores", scores)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-d floating point tensor, got {shape}")
    seq_len = len(tokens)
    num_layers, num_heads = probs.shape[:2]
    if tuple(probs.shape[2:]) != (seq_len, seq_len):
        raise ValueError(f"probs must be [L, H, S, S] with S = len(tokens) = {seq_len}, got {tuple(probs.shape)}")
    if scores.shape != probs.shape:
        raise ValueError(f"scores shape {tuple(scores.shape)} differs from probs shape {tuple(probs.shape)}")
    if q.shape[:3] != probs.shape[:3]:
        raise ValueError(f"q shape {tuple(q.shape)} does not match probs shape {tuple(probs.shape)} in [L, H, S]")
    if k.shape != q.shape:
        raise ValueError(f"k shape {tuple(k.shape)} differs from q shape {tuple(q.shape)}")
    for name, t in (("probs", probs), ("q", q), ("k", k)):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"{name} contains NaN or infinite values")
    if sentence_b_start is not None and not 1 <= sentence_b_start < seq_len:
        raise ValueError(f"sentence_b_start must be None or in 1..{seq_len - 1}, got {sentence_b_start}")
    return num_layers, num_heads, seq_len, q.shape[3]


def _masked(scores: torch.Tensor) -> torch.Tensor:
    """True where a score is a mask value. The dtype's most negative number is tested in that dtype: float16
    masks with -65504, far above -1e30."""
    at_min = is_masked(scores)
    wide = scores.detach().to("cpu", torch.float32)
    return at_min.cpu() | ~torch.isfinite(wide) | (wide <= _MASKED_BELOW)


_PACKED_DTYPES = {"u16": "<u2", "f32": "<f4"}  # the JavaScript side decodes these two


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float32)


def _packed(t: torch.Tensor, kind: str) -> dict:
    """A tensor as {"shape", "kind", "data": base64 of its values, row-major, little-endian}."""
    raw = t.contiguous().numpy().astype(_PACKED_DTYPES[kind]).tobytes()
    return {"shape": list(t.shape), "kind": kind, "data": base64.b64encode(raw).decode("ascii")}


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>__STYLE__</style>
</head>
<body>
<header>
  <h1>__TITLE__</h1>
  <p class="sub">__SUBTITLE__</p>
  <p class="legend" id="segment-legend" hidden>
    <span class="tok-chip">segment A</span> <span class="tok-chip seg-b">segment B</span>
  </p>
</header>

<section id="head-view">
  <h2>Head view</h2>
  <p class="hint">Each query token (left) is joined to each key token (right); a line's opacity is the attention
    weight, its colour the head. Hover a token to follow only its lines. Click a head to toggle it, double-click
    to show only that head.</p>
  <div class="controls">
    <label>Layer <select id="layer-select"></select></label>
    <div id="head-swatches"></div>
  </div>
  <div class="hv-body">
    <div class="hv-col" id="hv-left"></div>
    <svg id="hv-svg"></svg>
    <div class="hv-col" id="hv-right"></div>
  </div>
</section>

<section id="model-view">
  <h2>Model view</h2>
  <p class="hint">Every head of every layer: rows are queries, columns are keys, darker means more attention.
    Click a head to enlarge it and to show it in the other two views.</p>
  <div id="mv-grid"></div>
</section>

<section id="neuron-view">
  <h2>Neuron view</h2>
  <p class="hint">How one query's scores come about: its vector q meets every key's vector k (blue negative,
    red positive), the dot product is scaled and masked into the score, and softmax turns scores into
    probabilities.</p>
  <div class="controls">
    <label>Layer <select id="nv-layer"></select></label>
    <label>Head <select id="nv-head"></select></label>
    <label>Query <select id="nv-query"></select></label>
  </div>
  <p id="nv-formula"></p>
  <table id="nv-table">
    <thead><tr><th>key</th><th>q</th><th>k</th><th>q∘k</th><th>q·k</th><th>score</th><th colspan="2">probability</th>
    </tr></thead>
    <tbody></tbody>
  </table>
</section>

<div id="zoom" hidden>
  <div class="zoom-box">
    <button id="zoom-close" type="button" title="close (Esc)">×</button>
    <h3 id="zoom-title"></h3>
    <canvas id="zoom-canvas"></canvas>
    <p id="zoom-readout">Point at a cell to read its weight.</p>
  </div>
</div>

<script type="application/json" id="attention-data">__DATA__</script>
<script>__SCRIPT__</script>
</body>
</html>
"""

_STYLE = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2430; margin: 0;
       background: #f4f5f7; }
header, section { max-width: 1220px; margin: 0 auto; padding: 12px 24px; }
section { background: #fff; border-radius: 8px; box-shadow: 0 1px 3px rgba(0,0,0,.12); margin-bottom: 16px; }
h1 { margin: 8px 0 2px; font-size: 24px; }
h2 { margin: 4px 0; font-size: 18px; }
.sub, .hint { color: #5a6170; margin: 2px 0 8px; }
.controls { display: flex; flex-wrap: wrap; gap: 16px; align-items: center; margin-bottom: 10px; }
select { font: inherit; padding: 2px 4px; }
.tok-chip { padding: 1px 6px; border-radius: 3px; background: #eef0f3; }
.seg-b { background: #fde9c8; }

#head-swatches { display: flex; flex-wrap: wrap; gap: 4px; }
.head-swatch { width: 26px; height: 20px; border-radius: 3px; color: #fff; font-size: 11px; text-align: center;
               line-height: 20px; cursor: pointer; user-select: none; }
.head-swatch.off { opacity: .2; }
.hv-body { display: flex; align-items: flex-start; justify-content: center; }
.hv-col { display: flex; flex-direction: column; }
#hv-left { align-items: flex-end; }
.token { height: 22px; line-height: 20px; padding: 0 6px; white-space: pre; font-family: ui-monospace, monospace;
         font-size: 13px; border: 1px solid transparent; border-radius: 3px; cursor: default; box-sizing: border-box; }
.token.seg-b { background: #fde9c8; }
.token.focused { border-color: #1f2430; background: #e3e8f4; }
#hv-svg { flex: none; }
.attn-line { stroke-width: 2; }
.hidden { display: none; }

#mv-grid { display: grid; gap: 4px; align-items: center; justify-items: center; }
.mv-label { font-size: 12px; color: #5a6170; }
.cell { cursor: pointer; border: 1px solid #d5d9e0; line-height: 0; }
.cell:hover, .cell.current { outline: 2px solid #c0392b; }
.cell canvas { display: block; }

#zoom { position: fixed; inset: 0; background: rgba(20,24,32,.55); display: flex; align-items: center;
        justify-content: center; z-index: 10; }
#zoom[hidden] { display: none; }
.zoom-box { position: relative; background: #fff; border-radius: 8px; padding: 12px 20px; max-height: 95vh;
            max-width: 95vw; overflow: auto; }
#zoom-title { margin: 0 0 8px; }
#zoom-close { position: absolute; top: 6px; right: 10px; font-size: 20px; border: 0; background: none;
              cursor: pointer; }
#zoom-readout { font-family: ui-monospace, monospace; margin: 6px 0 0; }

#nv-formula { font-family: ui-monospace, monospace; margin: 4px 0 10px; }
#nv-table { border-collapse: collapse; }
#nv-table th { text-align: left; font-weight: 600; padding: 2px 8px; border-bottom: 1px solid #d5d9e0; }
#nv-table td { padding: 2px 8px; white-space: nowrap; vertical-align: middle; }
#nv-table td.num { text-align: right; font-family: ui-monospace, monospace; }
#nv-table tr.masked td { color: #9aa0ab; }
.strip { display: inline-flex; border: 1px solid #d5d9e0; }
.strip span { display: inline-block; height: 16px; }
.bar { display: inline-block; height: 10px; background: #2c6fbb; vertical-align: middle; }
"""

_SCRIPT = r"""
"use strict";
const D = JSON.parse(document.getElementById("attention-data").textContent);

// The tensors come packed (see _packed in attention_page.py): unpack each into nested arrays once.
// Rows stay typed-array views (no copies) unless `plain`: q and k rows go through Array methods like flat().
function unpack({shape, kind, data}, plain) {
  const text = atob(data), bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  // typed arrays read in the platform's byte order: little-endian on every browser platform in use
  const flat = kind === "f32" ? new Float32Array(bytes.buffer) : Float64Array.from(new Uint16Array(bytes.buffer),
                                                                                     x => x / 65535);
  const nest = (start, dims) => {
    if (dims.length === 1) {
      const row = flat.subarray(start, start + dims[0]);
      return plain ? Array.from(row) : row;
    }
    const step = dims.slice(1).reduce((a, b) => a * b);
    return Array.from({length: dims[0]}, (_, i) => nest(start + i * step, dims.slice(1)));
  };
  return nest(0, shape);
}
D.probs = unpack(D.probs, false);
D.scores = unpack(D.scores, false);  // masked scores are NaN
D.q = unpack(D.q, true);
D.k = unpack(D.k, true);
const S = D.tokens.length, L = D.probs.length, H = D.probs[0].length;
const ROW = 22, SVG_WIDTH = 360;  // px per token row in the head view (the CSS .token height must match)
const isB = i => D.sentenceBStart !== null && i >= D.sentenceBStart;
const headColor = h => `hsl(${Math.round(h * 360 / H)}, 70%, 45%)`;

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) e.setAttribute(key, value);
  if (text !== undefined) e.textContent = text;  // textContent, never innerHTML: tokens are untrusted text
  return e;
}

function fillSelect(select, n, label, value) {
  for (let i = 0; i < n; i++) select.append(el("option", {value: i}, label(i)));
  select.value = value;
}

if (D.sentenceBStart !== null) document.getElementById("segment-legend").hidden = false;

// ---------- head view ----------
const hv = {layer: D.layer, heads: new Set([D.head]), lines: []};
const layerSelect = document.getElementById("layer-select");
const svg = document.getElementById("hv-svg");
fillSelect(layerSelect, L, i => i, D.layer);
layerSelect.addEventListener("change", () => { hv.layer = +layerSelect.value; drawLines(); });

const swatches = [];
for (let h = 0; h < H; h++) {
  const s = el("div", {class: "head-swatch", "data-head": h, title: `head ${h}`}, h);
  s.style.background = headColor(h);
  // A double click also fires two clicks; they toggle the head twice, so only the dblclick's effect remains.
  s.addEventListener("click", () => { hv.heads.has(h) ? hv.heads.delete(h) : hv.heads.add(h); drawLines(); });
  s.addEventListener("dblclick", () => { hv.heads = new Set([h]); drawLines(); });
  document.getElementById("head-swatches").append(s);
  swatches.push(s);
}

for (const side of ["left", "right"]) {
  const column = document.getElementById(`hv-${side}`);
  D.tokens.forEach((t, i) => {
    const tok = el("div", {class: `token ${side}` + (isB(i) ? " seg-b" : ""), "data-index": i}, t);
    tok.addEventListener("mouseenter", () => focus(tok, side, i));
    tok.addEventListener("mouseleave", () => focus(null));
    column.append(tok);
  });
}
svg.setAttribute("height", S * ROW);
svg.setAttribute("width", SVG_WIDTH);

function drawLines() {
  swatches.forEach((s, h) => s.classList.toggle("off", !hv.heads.has(h)));
  svg.replaceChildren();
  hv.lines = [];
  for (const h of [...hv.heads].sort((a, b) => a - b)) {
    const p = D.probs[hv.layer][h];
    for (let i = 0; i < S; i++) {
      for (let j = 0; j < S; j++) {
        const line = document.createElementNS(svg.namespaceURI, "line");  // the SVG namespace, spelled once
        const attrs = {class: "attn-line", x1: 4, y1: (i + 0.5) * ROW, x2: SVG_WIDTH - 4, y2: (j + 0.5) * ROW,
                       stroke: headColor(h), "stroke-opacity": p[i][j],
                       "data-head": h, "data-query": i, "data-key": j};
        for (const [key, value] of Object.entries(attrs)) line.setAttribute(key, value);
        svg.append(line);
        hv.lines.push({line, query: i, key: j});
      }
    }
  }
}

// Focus a token: keep only its lines (from a query on the left, into a key on the right); null shows all.
function focus(tok, side, index) {
  document.querySelectorAll(".token.focused").forEach(t => t.classList.remove("focused"));
  if (tok) tok.classList.add("focused");
  for (const {line, query, key} of hv.lines) {
    const keep = !tok || (side === "left" ? query : key) === index;
    line.classList.toggle("hidden", !keep);
  }
}

// ---------- model view ----------
// Darker is more attention: blend from white towards a dark blue by the weight.
function heatRGB(p) {
  return [255 - p * (255 - 12), 255 - p * (255 - 44), 255 - p * (255 - 110)];
}

// Draw a head's [S, S] matrix into `ctx` at (x, y) with `size` px per side: one pixel per weight in a scratch
// canvas, scaled up without smoothing, which is much faster than S*S fillRects.
function drawMatrix(ctx, probs, x, y, size) {
  const scratch = document.createElement("canvas");
  scratch.width = scratch.height = S;
  const sctx = scratch.getContext("2d");
  const img = sctx.createImageData(S, S);
  for (let i = 0; i < S; i++) {
    for (let j = 0; j < S; j++) {
      const [r, g, b] = heatRGB(probs[i][j]);
      img.data.set([r, g, b, 255], 4 * (i * S + j));
    }
  }
  sctx.putImageData(img, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(scratch, x, y, size, size);
  if (D.sentenceBStart !== null) {  // the A/B boundary, across rows and down columns
    const at = D.sentenceBStart * size / S;
    ctx.strokeStyle = "#e67e22";
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(x, y + at); ctx.lineTo(x + size, y + at);
    ctx.moveTo(x + at, y); ctx.lineTo(x + at, y + size);
    ctx.stroke();
  }
}

const grid = document.getElementById("mv-grid");
const CELL = Math.max(40, Math.min(96, Math.floor(1100 / H) - 6));
grid.style.gridTemplateColumns = `auto repeat(${H}, ${CELL + 2}px)`;
grid.append(el("div"));
for (let h = 0; h < H; h++) grid.append(el("div", {class: "mv-label"}, `H${h}`));
for (let l = 0; l < L; l++) {
  grid.append(el("div", {class: "mv-label"}, `L${l}`));
  for (let h = 0; h < H; h++) {
    const cell = el("div", {class: "cell", "data-layer": l, "data-head": h, title: `layer ${l}, head ${h}`});
    const canvas = el("canvas", {width: CELL, height: CELL});
    drawMatrix(canvas.getContext("2d"), D.probs[l][h], 0, 0, CELL);
    cell.append(canvas);
    cell.addEventListener("click", () => select(l, h));
    grid.append(cell);
  }
}

// A clicked head becomes the current one everywhere: enlarged, in the head view alone, in the neuron view.
function select(l, h) {
  document.querySelectorAll(".cell.current").forEach(c => c.classList.remove("current"));
  document.querySelector(`.cell[data-layer="${l}"][data-head="${h}"]`).classList.add("current");
  hv.layer = l; hv.heads = new Set([h]); layerSelect.value = l; drawLines();
  nvLayer.value = l; nvHead.value = h; drawNeurons();
  openZoom(l, h);
}

// ---------- enlarged head ----------
const zoom = document.getElementById("zoom");
const zoomCanvas = document.getElementById("zoom-canvas");
const zoomReadout = document.getElementById("zoom-readout");
const zctx = zoomCanvas.getContext("2d");
const Z = {layer: 0, head: 0, cell: 0, margin: 0, labels: false};

function openZoom(l, h) {
  Object.assign(Z, {layer: l, head: h});
  document.getElementById("zoom-title").textContent = `Layer ${l}, head ${h}`;
  // Fit the window too (with room for title, labels and readout), so the readout is not scrolled out of sight.
  const room = Math.min(640, window.innerHeight - 240, window.innerWidth - 280);
  Z.cell = Math.max(3, Math.min(40, Math.floor(room / S)));
  Z.labels = Z.cell >= 9;  // below that the labels would overlap; the readout still names the tokens
  zctx.font = `${Math.min(13, Z.cell - 2)}px ui-monospace, monospace`;
  Z.margin = Z.labels ? Math.ceil(Math.max(...D.tokens.map(t => zctx.measureText(t).width))) + 10 : 4;
  zoomCanvas.width = zoomCanvas.height = Z.margin + S * Z.cell + 4;
  zoomReadout.textContent = "Point at a cell to read its weight.";
  drawZoom(null);
  zoom.hidden = false;
}

function drawZoom(hover) {
  const size = S * Z.cell, m = Z.margin;
  zctx.clearRect(0, 0, zoomCanvas.width, zoomCanvas.height);
  drawMatrix(zctx, D.probs[Z.layer][Z.head], m, m, size);
  if (Z.labels) {
    zctx.font = `${Math.min(13, Z.cell - 2)}px ui-monospace, monospace`;
    zctx.textBaseline = "middle";
    D.tokens.forEach((t, i) => {
      const c = (i + 0.5) * Z.cell;
      zctx.fillStyle = isB(i) ? "#b9650c" : "#1f2430";
      zctx.textAlign = "right";
      zctx.fillText(t, m - 5, m + c);  // query labels down the left
      zctx.save();
      zctx.translate(m + c, m - 5);
      zctx.rotate(-Math.PI / 2);
      zctx.textAlign = "left";
      zctx.fillText(t, 0, 0);  // key labels up the top, rotated to fit
      zctx.restore();
    });
  }
  if (hover) {
    zctx.strokeStyle = "#c0392b";
    zctx.lineWidth = 2;
    zctx.strokeRect(m + hover.j * Z.cell, m + hover.i * Z.cell, Z.cell, Z.cell);
  }
}

zoomCanvas.addEventListener("mousemove", e => {
  const r = zoomCanvas.getBoundingClientRect();
  const scale = zoomCanvas.width / r.width;  // CSS may shrink the canvas on small screens
  const i = Math.floor(((e.clientY - r.top) * scale - Z.margin) / Z.cell);
  const j = Math.floor(((e.clientX - r.left) * scale - Z.margin) / Z.cell);
  if (i < 0 || j < 0 || i >= S || j >= S) { drawZoom(null); return; }
  drawZoom({i, j});
  const p = D.probs[Z.layer][Z.head][i][j];
  zoomReadout.textContent = `query ${i} "${D.tokens[i]}" → key ${j} "${D.tokens[j]}": ${p.toFixed(4)}`;
});
const closeZoom = () => { zoom.hidden = true; };
document.getElementById("zoom-close").addEventListener("click", closeZoom);
zoom.addEventListener("click", e => { if (e.target === zoom) closeZoom(); });  // the backdrop, not the box
document.addEventListener("keydown", e => { if (e.key === "Escape") closeZoom(); });

// ---------- neuron view ----------
const nvLayer = document.getElementById("nv-layer");
const nvHead = document.getElementById("nv-head");
const nvQuery = document.getElementById("nv-query");
fillSelect(nvLayer, L, i => i, D.layer);
fillSelect(nvHead, H, i => i, D.head);
fillSelect(nvQuery, S, i => `${i}: ${D.tokens[i]}`, D.query);
for (const s of [nvLayer, nvHead, nvQuery]) s.addEventListener("change", drawNeurons);

// Blue for negative, red for positive, paler towards 0; `scale` is the largest |value| in the column, so colours
// compare down the table.
function divergent(v, scale) {
  const t = scale > 0 ? Math.min(1, Math.abs(v) / scale) : 0;
  const [r, g, b] = v < 0 ? [33, 102, 172] : [178, 24, 43];
  return `rgb(${255 - t * (255 - r)}, ${255 - t * (255 - g)}, ${255 - t * (255 - b)})`;
}

function strip(values, scale, what) {
  const s = el("span", {class: "strip"});
  const w = Math.max(2, Math.min(10, Math.floor(240 / values.length)));
  values.forEach((v, i) => {
    const c = el("span", {title: `${what}[${i}] = ${v}`});
    c.style.width = `${w}px`;
    c.style.background = divergent(v, scale);
    s.append(c);
  });
  return s;
}

function td(children, cls) {
  const cell = el("td", cls ? {class: cls} : {});
  cell.append(...children);
  return cell;
}

const maxAbs = rows => Math.max(0, ...rows.flat().map(Math.abs));

function drawNeurons() {
  const l = +nvLayer.value, h = +nvHead.value, i = +nvQuery.value;
  const q = D.q[l][h][i], keys = D.k[l][h];
  const prods = keys.map(k => k.map((x, n) => x * q[n]));
  const dots = prods.map(p => p.reduce((a, b) => a + b, 0));
  const formula = document.getElementById("nv-formula");
  formula.replaceChildren(
    "query ", el("span", {class: "tok-chip" + (isB(i) ? " seg-b" : "")}, D.tokens[i]),
    ` (position ${i}), layer ${l}, head ${h}:   score = q·k / √d (+ mask),  d = ${D.dHead},` +
    ` √d = ${Math.sqrt(D.dHead).toFixed(3)};   probability = softmax over the keys of the scores`);
  const qScale = maxAbs([q]), kScale = maxAbs(keys), pScale = maxAbs(prods);
  const tbody = document.querySelector("#nv-table tbody");
  tbody.replaceChildren();
  keys.forEach((k, j) => {
    const score = D.scores[l][h][i][j], p = D.probs[l][h][i][j];
    const row = el("tr", {class: Number.isNaN(score) ? "masked" : ""});
    const bar = el("span", {class: "bar"});
    bar.style.width = `${Math.round(p * 160)}px`;
    row.append(
      td([el("span", {class: "tok-chip" + (isB(j) ? " seg-b" : "")}, D.tokens[j])]),
      td([strip(q, qScale, "q")]),
      td([strip(k, kScale, "k")]),
      td([strip(prods[j], pScale, "q∘k")]),
      td([dots[j].toFixed(3)], "num"),
      td([Number.isNaN(score) ? "masked" : score.toFixed(3)], "num"),
      td([p.toFixed(4)], "num"),
      td([bar]));
    tbody.append(row);
  });
}

drawLines();
drawNeurons();
"""
