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
const MASKED = 255, STEPS = 254;  // a probability is stored as round(p * 254); 255 marks a masked score
const P8 = bytesOf(D.probs.data);
// Float32Array reads in the platform's byte order: little-endian on every browser platform in use.
const Q = new Float32Array(bytesOf(D.q.data).buffer), K = new Float32Array(bytesOf(D.k.data).buffer);
const at = (l, h, i, j) => ((l * H + h) * S + i) * S + j;
const isMasked = (l, h, i, j) => P8[at(l, h, i, j)] === MASKED;
const prob = (l, h, i, j) => isMasked(l, h, i, j) ? 0 : P8[at(l, h, i, j)] / STEPS;
// q and k are held for the layers in D.neuronLayers only (all of them unless the page had to store less)
const vector = (T, l, h, i) => {
  const first = ((D.neuronLayers.indexOf(l) * H + h) * S + i) * DH;
  return T.subarray(first, first + DH);
};
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
// Lines fainter than 5/254 (2%) are not drawn: each alone would not show, and hundreds of them together are a
// grey haze over the lines that matter (and slow to draw).
const FAINTEST = 5;
const LANE = H * SQUARE + 6;  // beside each column, a lane of one square per head for the focused token
const hv = {layer: D.layer, heads: new Set(range(H)), focus: null};
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
  // Each pair's line takes the colour of the shown head that attends most, with that weight as its opacity.
  // Lines are gathered by (weight, head) and drawn a group at a time, fainter groups first, stronger on top.
  const groups = new Map();
  let lines = 0;
  for (const i of f && f.side === "left" ? [f.index] : range(S)) {
    for (const j of f && f.side === "right" ? [f.index] : range(S)) {
      let best = -1, level = FAINTEST - 1;
      for (const h of heads) {
        const v = P8[at(l, h, i, j)];
        if (v !== MASKED && v > level) { level = v; best = h; }
      }
      if (best < 0) continue;  // no shown head gives this pair a visible weight
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
      ctx.globalAlpha = prob(l, h, i, j);
      ctx.fillStyle = headColor(h);
      ctx.fillRect(left, top, SQUARE - 1, ROW - 10);
    }
  }
}

// ---------- model view ----------
// Darker is more attention: from white towards a dark blue by the weight; masked scores light grey.
const PALETTE = new Uint8ClampedArray(256 * 4);
for (let v = 0; v <= STEPS; v++) {
  const p = v / STEPS;
  PALETTE.set([255 - p * (255 - 12), 255 - p * (255 - 44), 255 - p * (255 - 110), 255], 4 * v);
}
PALETTE.set([222, 225, 230, 255], 4 * MASKED);
const PIXEL = new Uint32Array(PALETTE.buffer);  // a whole RGBA pixel per stored byte, in one write

// Draw a head's [S, S] matrix into `ctx` at (x, y), `size` px a side: one pixel per weight in a scratch canvas,
// then scaled, much faster than S*S fillRects.
function drawMatrix(ctx, l, h, x, y, size) {
  const scratch = document.createElement("canvas");
  scratch.width = scratch.height = S;
  const sctx = scratch.getContext("2d");
  const img = sctx.createImageData(S, S);
  const pixels = new Uint32Array(img.data.buffer), first = at(l, h, 0, 0);
  for (let n = 0; n < S * S; n++) pixels[n] = PIXEL[P8[first + n]];
  sctx.putImageData(img, 0, 0);
  ctx.imageSmoothingEnabled = size < S;  // shrinking averages neighbours; enlarging keeps cells sharp
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
  drawMatrix(zctx, Z.layer, Z.head, m, m, size);
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
  const weight = isMasked(Z.layer, Z.head, i, j) ? "masked" : prob(Z.layer, Z.head, i, j).toFixed(3);
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
for (const l of D.neuronLayers) nvLayer.append(el("option", {value: l}, l));
nvLayer.value = D.layer;
fillSelect(nvHead, H, i => i, D.head);
fillSelect(nvQuery, S, i => `${D.positions[i]}: ${D.tokens[i]}`, D.query);
for (const s of [nvLayer, nvHead, nvQuery]) s.addEventListener("change", drawNeurons);

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
  const formula = document.getElementById("nv-formula");
  formula.replaceChildren(
    "query ", el("span", {class: "tok-chip" + (isB(i) ? " seg-b" : "")}, D.tokens[i]),
    ` (position ${D.positions[i]}), layer ${l}, head ${h}:   score = q·k × ${scaleText(l)} (+ mask);` +
    "   probability = softmax of the scores over the keys" +
    (S < D.inputLength ? ` (all ${D.inputLength} of them: this page lists ${S})` : ""));
  const qScale = maxAbs([q]), kScale = maxAbs(keys), pScale = maxAbs(prods);
  const tbody = document.querySelector("#nv-table tbody");
  tbody.replaceChildren();
  keys.forEach((k, j) => {
    const masked = isMasked(l, h, i, j), p = prob(l, h, i, j);
    const row = el("tr", {class: masked ? "masked" : ""});
    const bar = el("span", {class: "bar"});
    bar.style.width = `${Math.round(p * 160)}px`;
    row.append(
      td([el("span", {class: "tok-chip" + (isB(j) ? " seg-b" : "")}, D.tokens[j])]),
      td([strip(q, qScale, "q")]),
      td([strip(k, kScale, "k")]),
      td([strip(prods[j], pScale, "q∘k")]),
      td([dots[j].toFixed(3)], "num"),
      td([masked ? "masked" : (dots[j] * D.scale[D.neuronLayers.indexOf(l)]).toFixed(3)], "num"),
      td([p.toFixed(3)], "num"),
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
