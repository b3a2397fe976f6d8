"use strict";
// Colours, maxAbs and the heads view come from analysis_heatmap.js and heads_view.js, which come first in the page.
const D = JSON.parse(document.getElementById("attention-data").textContent);

// The tensors come packed by attention_page.py: base64 of their values, row-major, little-endian.
function bytesOf(base64) {
  const text = atob(base64), bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return bytes;
}
const [L, H, S] = D.probs.shape, DH = D.q.shape[3];
// A probability p is stored as its shade, round(p ** gamma * 254): the colour scale of every view (the square root, so
// the small weights of a long input show); 255 marks a masked score.
const MASKED = 255, STEPS = 254, GAMMA = D.colours.gamma;
const P8 = bytesOf(D.probs.data);
// Float32Array reads in the platform's byte order: little-endian on every browser platform in use.
const Q = new Float32Array(bytesOf(D.q.data).buffer), K = new Float32Array(bytesOf(D.k.data).buffer);
const LOGZ = new Float32Array(bytesOf(D.logZ.data).buffer);
const at = (l, h, i, j) => ((l * H + h) * S + i) * S + j;
const isMasked = (l, h, i, j) => P8[at(l, h, i, j)] === MASKED;
const prob = (l, h, i, j) => isMasked(l, h, i, j) ? 0 : Math.pow(P8[at(l, h, i, j)] / STEPS, 1 / GAMMA);
const levelOf = p => Math.round(Math.pow(p, GAMMA) * STEPS);
const isLong = S > D.longInput;  // the views start as a long input needs: fewer lines, likeliest keys first
// q, k and logZ are held for the layers in D.neuronLayers only (all of them unless the page had to store less)
const neuronRow = (l, h, i) => (D.neuronLayers.indexOf(l) * H + h) * S + i;
const vector = (T, l, h, i) => T.subarray(neuronRow(l, h, i) * DH, (neuronRow(l, h, i) + 1) * DH);
const range = n => Array.from({length: n}, (_, i) => i);

const isB = i => D.sentenceBStart !== null && i >= D.sentenceBStart;
const headColor = h => `hsl(${Math.round(h * 360 / H)}, 75%, 42%)`;

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
// On a canvas: lines from S queries to S keys, one per pair (not one per head, which blends into mud).
const ROW = 22, LINES = 360, SQUARE = 7;  // px per token row (the CSS .token height), between the lanes, per head
// Lines under 2% are not drawn: each alone would not show, and hundreds of them together are a grey haze over the
// lines that matter (and slow to draw).
const FAINTEST = levelOf(0.02);
const LANE = H * SQUARE + 6;  // beside each column, a lane of one square per head for the focused token
// Every line over 2% of a long input is a tangle (12 heads over 150 tokens: thousands of lines): it starts with each
// query's strongest few, the pairs a reader follows first; hovering a token still shows all of its lines.
const hv = {layer: D.layer, heads: new Set(range(H)), focus: null, strongest: isLong ? 3 : 0};
const linesSelect = document.getElementById("hv-lines"), linesCount = document.getElementById("hv-count");
linesSelect.value = hv.strongest;
linesSelect.addEventListener("change", () => { hv.strongest = +linesSelect.value; drawHeadView(); });
const layerSelect = document.getElementById("layer-select");
const canvas = document.getElementById("hv-canvas");
const ctx = canvas.getContext("2d");
fillSelect(layerSelect, L, i => i, D.layer);
layerSelect.addEventListener("change", () => { hv.layer = +layerSelect.value; drawHeadView(); });

const swatches = range(H).map(h => {
  const s = el("div", {class: "head-swatch", "data-head": h, title: `head ${h}`}, h);
  s.style.background = headColor(h);
  // A double click also fires two clicks; they toggle the head twice, so only the dblclick's effect remains.
  s.addEventListener("click", () => { hv.heads.has(h) ? hv.heads.delete(h) : hv.heads.add(h); drawHeadView(); });
  s.addEventListener("dblclick", () => { hv.heads = new Set([h]); drawHeadView(); });
  document.getElementById("head-swatches").append(s);
  return s;
});
document.getElementById("all-heads").addEventListener("click", () => { hv.heads = new Set(range(H)); drawHeadView(); });

for (const side of ["left", "right"]) {
  const column = document.getElementById(`hv-${side}`);
  D.tokens.forEach((t, i) => {
    const tok = el("div", {class: `token ${side}` + (isB(i) ? " seg-b" : ""), "data-index": i}, t);
    tok.addEventListener("mouseenter", () => { hv.focus = {side, index: i, tok}; drawHeadView(); });
    tok.addEventListener("mouseleave", () => { hv.focus = null; drawHeadView(); });
    column.append(tok);
  });
}

const hvWidth = 2 * LANE + LINES, hvHeight = S * ROW;
// Sharp on high-density screens, within the largest canvas side browsers draw (32767 px).
const density = Math.min(window.devicePixelRatio || 1, 32767 / hvHeight);
canvas.width = Math.round(hvWidth * density);
canvas.height = Math.round(hvHeight * density);
canvas.style.width = `${hvWidth}px`;
canvas.style.height = `${hvHeight}px`;

function drawHeadView() {
  swatches.forEach((s, h) => s.classList.toggle("off", !hv.heads.has(h)));
  document.querySelectorAll(".token.focused").forEach(t => t.classList.remove("focused"));
  const l = hv.layer, f = hv.focus, heads = [...hv.heads].sort((a, b) => a - b);
  if (f) f.tok.classList.add("focused");
  ctx.setTransform(density, 0, 0, density, 0, 0);
  ctx.clearRect(0, 0, hvWidth, hvHeight);
  // Each pair's line takes the colour of the shown head that attends most, with that weight's shade as its opacity.
  // Lines are gathered by (weight, head) and drawn a group at a time, fainter groups first, stronger on top.
  const groups = new Map();
  let lines = 0, visible = 0;
  const strongest = f ? 0 : hv.strongest;  // a focused token shows all of its lines
  for (const i of f && f.side === "left" ? [f.index] : range(S)) {
    const row = [];  // [level, head, key] of each key this query sends a visible line
    for (const j of f && f.side === "right" ? [f.index] : range(S)) {
      let best = -1, level = FAINTEST - 1;
      for (const h of heads) {
        const v = P8[at(l, h, i, j)];
        if (v !== MASKED && v > level) { level = v; best = h; }
      }
      if (best >= 0) row.push([level, best, j]);  // else no shown head gives this pair a visible weight
    }
    visible += row.length;
    if (strongest && row.length > strongest) row.sort((a, b) => b[0] - a[0]).length = strongest;
    for (const [level, best, j] of row) {
      const group = level * H + best;
      if (!groups.has(group)) groups.set(group, []);
      groups.get(group).push(i, j);
      lines++;
    }
  }
  ctx.lineWidth = 1.5;
  for (const group of [...groups.keys()].sort((a, b) => a - b)) {
    const ends = groups.get(group);
    ctx.globalAlpha = Math.floor(group / H) / STEPS;
    ctx.strokeStyle = headColor(group % H);
    for (let n = 0; n < ends.length; n += 2) {  // a path a line: one path of many crossing lines rasterises slowly
      ctx.beginPath();
      ctx.moveTo(LANE, (ends[n] + 0.5) * ROW);
      ctx.lineTo(LANE + LINES, (ends[n + 1] + 0.5) * ROW);
      ctx.stroke();
    }
  }
  if (f) drawLane(l, heads, f);
  ctx.globalAlpha = 1;
  canvas.dataset.lines = lines;  // for tests and the curious: how many lines are drawn
  linesCount.textContent = lines < visible ? `${lines} of ${visible} lines over 2%` : `${lines} lines`;
}

// Beside the other column, each head's own weight for the focused token: a square per head, in its colour,
// as opaque as its weight, so heads that agree are told apart.
function drawLane(l, heads, f) {
  const x = f.side === "left" ? LANE + LINES + 3 : 3;
  for (let n = 0; n < S; n++) {
    const [i, j] = f.side === "left" ? [f.index, n] : [n, f.index];
    for (const h of heads) {
      const left = x + h * SQUARE, top = n * ROW + 5;
      ctx.globalAlpha = 1;
      ctx.strokeStyle = "#d5d9e0";
      ctx.lineWidth = 0.5;
      ctx.strokeRect(left + 0.25, top + 0.25, SQUARE - 1.5, ROW - 10.5);
      ctx.globalAlpha = isMasked(l, h, i, j) ? 0 : P8[at(l, h, i, j)] / STEPS;
      ctx.fillStyle = headColor(h);
      ctx.fillRect(left, top, SQUARE - 1, ROW - 10);
    }
  }
}

// ---------- model view ----------
// Darker is more attention: from white towards a dark blue by the stored shade; masked scores light grey.
const PALETTE = new Uint8ClampedArray(256 * 4);
for (let v = 0; v <= STEPS; v++) {
  const t = v / STEPS;
  PALETTE.set([255 - t * (255 - 12), 255 - t * (255 - 44), 255 - t * (255 - 110), 255], 4 * v);
}
PALETTE.set([222, 225, 230, 255], 4 * MASKED);
const PIXEL = new Uint32Array(PALETTE.buffer);  // a whole RGBA pixel per stored byte, in one write

// A head's [S, S] shades in at most n x n cells: each cell the largest of the block it covers (blocks as torch's
// adaptive max pooling cuts them), masked only where the whole block is. Averaging or sampling, as a scaled image
// would, thins a one-token diagonal away.
function pooled(l, h, n) {
  const first = at(l, h, 0, 0);
  if (n >= S) return P8.subarray(first, first + S * S);
  const lo = c => Math.floor(c * S / n), hi = c => Math.ceil((c + 1) * S / n);
  const rows = new Uint8Array(S * n);  // each query row pooled across the keys first
  for (let i = 0; i < S; i++) {
    for (let c = 0; c < n; c++) {
      let m = MASKED;
      for (let j = lo(c); j < hi(c); j++) {
        const v = P8[first + i * S + j];
        if (v !== MASKED && (m === MASKED || v > m)) m = v;
      }
      rows[i * n + c] = m;
    }
  }
  const out = new Uint8Array(n * n);
  for (let r = 0; r < n; r++) {
    for (let c = 0; c < n; c++) {
      let m = MASKED;
      for (let i = lo(r); i < hi(r); i++) {
        const v = rows[i * n + c];
        if (v !== MASKED && (m === MASKED || v > m)) m = v;
      }
      out[r * n + c] = m;
    }
  }
  return out;
}

// Draw a head's matrix into `ctx` at (x, y), `size` px a side: one pixel per cell in a scratch canvas, then scaled,
// much faster than S*S fillRects.
function drawMatrix(ctx, l, h, x, y, size) {
  const n = Math.min(S, Math.floor(size)), cells = pooled(l, h, n);
  const scratch = document.createElement("canvas");
  scratch.width = scratch.height = n;
  const sctx = scratch.getContext("2d");
  const img = sctx.createImageData(n, n);
  const pixels = new Uint32Array(img.data.buffer);
  for (let c = 0; c < n * n; c++) pixels[c] = PIXEL[cells[c]];
  sctx.putImageData(img, 0, 0);
  ctx.imageSmoothingEnabled = false;  // enlarged cells stay sharp; shrunk ones were pooled above
  ctx.drawImage(scratch, x, y, size, size);
  if (D.sentenceBStart) {  // the A/B boundary, across rows and down columns (none when all is segment B)
    const edge = D.sentenceBStart * size / S;
    ctx.strokeStyle = "#e67e22";
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(x, y + edge); ctx.lineTo(x + size, y + edge);
    ctx.moveTo(x + edge, y); ctx.lineTo(x + edge, y + size);
    ctx.stroke();
  }
}

// The colour scale as a bar with the probabilities it names, as the PNGs' colour bars.
function scaleBar() {
  const width = 360, bar = el("div", {class: "scale"});
  const strip = el("canvas", {width, height: 10});
  const sctx = strip.getContext("2d");
  for (let x = 0; x < width; x++) {
    const v = Math.round(x / (width - 1) * STEPS), [r, g, b] = PALETTE.subarray(4 * v, 4 * v + 3);
    sctx.fillStyle = `rgb(${r},${g},${b})`;
    sctx.fillRect(x, 0, 1, 10);
  }
  const ticks = el("div", {class: "scale-ticks"});
  for (const p of D.colours.ticks) {
    const tick = el("span", {}, String(p));
    tick.style.left = `${Math.pow(p, GAMMA) * width}px`;
    ticks.append(tick);
  }
  const body = el("div", {class: "scale-body"});
  body.append(strip, ticks);
  bar.append(el("span", {class: "scale-name"}, D.colours.label), body);
  return bar;
}
document.getElementById("mv-scale").append(scaleBar());
document.getElementById("zoom-scale").append(scaleBar());

const grid = document.getElementById("mv-grid");
// Thumbnails fill the section's width (narrower in a notebook's output), between 40 and 96 px.
const CELL = Math.max(40, Math.min(96, Math.floor((grid.clientWidth - 40) / H) - 6));
grid.style.gridTemplateColumns = `auto repeat(${H}, ${CELL + 2}px)`;
grid.append(el("div"));
for (let h = 0; h < H; h++) grid.append(el("div", {class: "mv-label"}, `H${h}`));
for (let l = 0; l < L; l++) {
  grid.append(el("div", {class: "mv-label"}, `L${l}`));
  for (let h = 0; h < H; h++) {
    const cell = el("div", {class: "cell", "data-layer": l, "data-head": h, title: `layer ${l}, head ${h}`});
    const thumb = el("canvas", {width: CELL, height: CELL});
    drawMatrix(thumb.getContext("2d"), l, h, 0, 0, CELL);
    cell.append(thumb);
    cell.addEventListener("click", () => select(l, h));
    grid.append(cell);
  }
}

// A clicked head becomes the current one everywhere: enlarged, in the head view alone, in the neuron view.
function select(l, h) {
  document.querySelectorAll(".cell.current").forEach(c => c.classList.remove("current"));
  document.querySelector(`.cell[data-layer="${l}"][data-head="${h}"]`).classList.add("current");
  hv.layer = l; hv.heads = new Set([h]); layerSelect.value = l; drawHeadView();
  if (D.neuronLayers.includes(l)) { nvLayer.value = l; nvHead.value = h; drawNeurons(); }
  if (showInHeadsView) showInHeadsView(l, h);
  openZoom(l, h);
}

// ---------- enlarged head ----------
const zoom = document.getElementById("zoom");
const zoomCanvas = document.getElementById("zoom-canvas");
const zoomReadout = document.getElementById("zoom-readout");
const zctx = zoomCanvas.getContext("2d");
const Z = {layer: 0, head: 0, cell: 0, margin: 0, every: 1, font: ""};
const LABEL = 11;  // px of label text; every n-th token is labelled when cells are smaller, as in the PNG

// A token's label, with its position when not every token is labelled (so the reader can count between them).
const zoomLabel = i => Z.every === 1 ? D.tokens[i] : `${D.positions[i]} ${D.tokens[i]}`;
const labelled = () => range(S).filter(i => i % Z.every === 0);

function openZoom(l, h) {
  Object.assign(Z, {layer: l, head: h});
  document.getElementById("zoom-title").textContent = `Layer ${l}, head ${h}`;
  // Fit the window too (with room for title, labels and readout), so the readout is not scrolled out of sight.
  const room = Math.min(640, window.innerHeight - 280, window.innerWidth - 280);
  Z.cell = Math.max(1, Math.min(40, room / S));
  Z.every = Math.ceil((LABEL + 2) / Z.cell);
  Z.font = `${Math.min(13, Math.max(LABEL, Math.floor(Z.cell) - 2))}px ui-monospace, monospace`;
  zctx.font = Z.font;
  Z.margin = Math.ceil(Math.max(...labelled().map(i => zctx.measureText(zoomLabel(i)).width))) + 10;
  zoomCanvas.width = zoomCanvas.height = Math.ceil(Z.margin + S * Z.cell + 4);
  zoomReadout.textContent = "Point at a cell to read its weight.";
  drawZoom(null);
  zoom.hidden = false;
}

function drawZoom(hover) {
  const size = S * Z.cell, m = Z.margin;
  zctx.clearRect(0, 0, zoomCanvas.width, zoomCanvas.height);
  drawMatrix(zctx, Z.layer, Z.head, m, m, size);
  zctx.font = Z.font;
  zctx.textBaseline = "middle";
  for (const i of labelled()) {
    const c = (i + 0.5) * Z.cell, t = zoomLabel(i);
    zctx.fillStyle = isB(i) ? "#b9650c" : "#1f2430";
    zctx.textAlign = "right";
    zctx.fillText(t, m - 5, m + c);  // query labels down the left
    zctx.save();
    zctx.translate(m + c, m - 5);
    zctx.rotate(-Math.PI / 2);
    zctx.textAlign = "left";
    zctx.fillText(t, 0, 0);  // key labels up the top, rotated to fit
    zctx.restore();
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
  const weight = isMasked(Z.layer, Z.head, i, j) ? "masked" : formatProbability(prob(Z.layer, Z.head, i, j));
  zoomReadout.textContent = `query ${D.positions[i]} "${D.tokens[i]}" → key ${D.positions[j]} "${D.tokens[j]}": ` +
                            weight;
});
const closeZoom = () => { zoom.hidden = true; };
document.getElementById("zoom-close").addEventListener("click", closeZoom);
zoom.addEventListener("click", e => { if (e.target === zoom) closeZoom(); });  // the backdrop, not the box
document.addEventListener("keydown", e => { if (e.key === "Escape") closeZoom(); });

// ---------- neuron view ----------
const nvLayer = document.getElementById("nv-layer");
const nvHead = document.getElementById("nv-head");
const nvQuery = document.getElementById("nv-query");
const nvOrder = document.getElementById("nv-order");
nvOrder.value = isLong ? "probability" : "position";  // among many keys, the few that matter come first
for (const l of D.neuronLayers) nvLayer.append(el("option", {value: l}, l));
nvLayer.value = D.layer;
fillSelect(nvHead, H, i => i, D.head);
fillSelect(nvQuery, S, i => `${D.positions[i]}: ${D.tokens[i]}`, D.query);
for (const s of [nvLayer, nvHead, nvQuery, nvOrder]) s.addEventListener("change", drawNeurons);

// Three significant digits: the small probabilities of a long input read apart (0.00641, not 0.006).
const formatProbability = p => p === 0 ? "0" : p.toPrecision(3);

// Blue for negative, red for positive, paler towards 0; `scale` is the largest |value| in the column, so colours
// compare down the table.
function strip(values, scale, what) {
  const s = el("span", {class: "strip"});
  const w = Math.max(2, Math.min(10, Math.floor(240 / values.length)));
  values.forEach((v, i) => {
    const c = el("span", {title: `${what}[${i}] = ${v}`});
    c.style.width = `${w}px`;
    c.style.background = divergingColour(v, scale);
    s.append(c);
  });
  return s;
}

function td(children, cls) {
  const cell = el("td", cls ? {class: cls} : {});
  cell.append(...children);
  return cell;
}

function scaleText(l) {
  const scale = D.scale[D.neuronLayers.indexOf(l)], inverseRoot = 1 / Math.sqrt(DH);
  const named = Math.abs(scale / inverseRoot - 1) < 1e-3 ? ` = 1/√d, d = ${DH}` : "";
  return `${scale.toPrecision(4)}${named}`;
}

function drawNeurons() {
  const l = +nvLayer.value, h = +nvHead.value, i = +nvQuery.value;
  const q = Array.from(vector(Q, l, h, i)), keys = range(S).map(j => Array.from(vector(K, l, h, j)));
  const prods = keys.map(k => k.map((x, n) => x * q[n]));
  const dots = prods.map(p => p.reduce((a, b) => a + b, 0));
  const scores = dots.map(d => d * D.scale[D.neuronLayers.indexOf(l)]);
  // The model's probability from the score: softmax over all the keys is exp(score − logZ), logZ the log of the sum
  // of exp(score) over all of them (held for each query, as a window holds some keys only).
  const logZ = LOGZ[neuronRow(l, h, i)];
  const probs = range(S).map(j => isMasked(l, h, i, j) ? 0 : Math.exp(scores[j] - logZ));
  const formula = document.getElementById("nv-formula");
  formula.replaceChildren(
    "query ", el("span", {class: "tok-chip" + (isB(i) ? " seg-b" : "")}, D.tokens[i]),
    ` (position ${D.positions[i]}), layer ${l}, head ${h}:   score = q·k × ${scaleText(l)} (+ mask);` +
    "   probability = softmax of the scores = exp(score − logZ), logZ = log Σ exp(score) over the " +
    (S < D.inputLength ? `input's ${D.inputLength} keys (this page lists ${S})` : "keys") +
    ` = ${logZ.toFixed(3)}`);
  const qScale = maxAbs([q]), kScale = maxAbs(keys), pScale = maxAbs(prods);
  const order = range(S);
  if (nvOrder.value === "probability") order.sort((a, b) => probs[b] - probs[a] || a - b);
  const tbody = document.querySelector("#nv-table tbody");
  tbody.replaceChildren();
  order.forEach(j => {
    const k = keys[j], masked = isMasked(l, h, i, j), p = probs[j];
    const row = el("tr", {class: masked ? "masked" : "", "data-key": j});
    const bar = el("span", {class: "bar"});
    bar.style.width = `${Math.round(p * 160)}px`;
    row.append(
      td([el("span", {class: "tok-chip" + (isB(j) ? " seg-b" : "")}, D.tokens[j])]),
      td([strip(q, qScale, "q")]),
      td([strip(k, kScale, "k")]),
      td([strip(prods[j], pScale, "q∘k")]),
      td([dots[j].toFixed(3)], "num"),
      td([masked ? "masked" : scores[j].toFixed(3)], "num"),
      td([formatProbability(p)], "num"),
      td([bar]));
    tbody.append(row);
  });
}

// ---------- heads view ----------
// A head chosen there opens here as a clicked model-view cell does; one chosen here is marked there.
const showInHeadsView = D.heads ? headsView(D.heads) : null;
document.addEventListener("head-selected", e => select(e.detail.layer, e.detail.head));

drawHeadView();
drawNeurons();
