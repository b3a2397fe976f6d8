// Shared by the heads and patching pages and the attention page: colours, numbers, a 2-D array as an HTML table
// of coloured cells, and tabs.
"use strict";

// Diverging colour for a signed value in [-scale, scale]: blue below 0, white at 0, red above (RdBu_r).
function divergingColour(value, scale) {
  if (!Number.isFinite(value) || scale <= 0) return "#eee";
  const t = Math.max(-1, Math.min(1, value / scale));
  const toward = t > 0 ? [178, 24, 43] : [33, 102, 172];
  const a = Math.abs(t);
  const mix = (c) => Math.round(255 + (c - 255) * a);
  return `rgb(${mix(toward[0])},${mix(toward[1])},${mix(toward[2])})`;
}

// Sequential colour for a value in [0, scale]: white to purple.
function sequentialColour(value, scale) {
  if (!Number.isFinite(value) || scale <= 0) return "#eee";
  const a = Math.max(0, Math.min(1, value / scale));
  const mix = (c) => Math.round(255 + (c - 255) * a);
  return `rgb(${mix(84)},${mix(39)},${mix(143)})`;
}

function maxAbs(rows) {
  let m = 0;
  for (const row of rows) for (const v of row) if (Number.isFinite(v)) m = Math.max(m, Math.abs(v));
  return m;
}

function formatNumber(v) {
  if (!Number.isFinite(v)) return "–";
  const a = Math.abs(v);
  return a !== 0 && (a < 0.01 || a >= 1000) ? v.toExponential(1) : v.toFixed(2);
}

// Whether text on an "rgb(r,g,b)" background should be white: its luma (ITU-R BT.601) under half.
function isDark(colour) {
  const rgb = colour.match(/\d+/g);
  return rgb !== null && rgb.length === 3 && 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 128;
}

// A table of coloured cells in `container` (replacing what it held). rows: 2-D array; options: rowLabels,
// columnLabels (a "\n" breaks a label in two lines), colour(v), cellText(r, c, v) -> string (may hold a label),
// title(r, c, v) -> hover text, onClick(r, c), compact.
function heatmapTable(container, rows, options) {
  const table = document.createElement("table");
  table.className = "heatmap" + (options.compact ? " compact" : "");
  const head = table.createTHead().insertRow();
  head.appendChild(document.createElement("th"));
  for (const label of options.columnLabels) {
    const th = document.createElement("th");
    th.className = "column";
    th.textContent = label;
    head.appendChild(th);
  }
  const body = table.createTBody();
  rows.forEach((row, r) => {
    const tr = body.insertRow();
    const th = document.createElement("th");
    th.textContent = options.rowLabels[r];
    tr.appendChild(th);
    row.forEach((v, c) => {
      const td = tr.insertCell();
      const colour = options.colour(v);
      td.style.background = colour;
      td.classList.toggle("dark", isDark(colour));
      td.dataset.row = r;
      td.dataset.column = c;
      td.innerHTML = options.cellText ? options.cellText(r, c, v) : "";
      td.title = options.title(r, c, v);
      if (options.onClick) td.addEventListener("click", () => options.onClick(r, c));
    });
  });
  container.replaceChildren(table);
  fitColumnHeaders(table);
  return table;
}

// Column headers stand on end only when one of them is wider than its column, and then all of them, so a table
// reads one way: short labels (H3, or a position over a short token) stay level. On end, a label's line break is a
// space.
function fitColumnHeaders(table) {
  const headers = [...table.querySelectorAll("th.column")], first = table.querySelector("tbody td");
  if (!headers.length || !first) return;
  table.classList.add("rotated");  // on end, a header is narrow: the column is as wide as its cells
  const room = first.clientWidth - 4;
  const measure = document.createElement("canvas").getContext("2d");
  measure.font = getComputedStyle(headers[0]).font;
  const lines = headers.flatMap(th => th.textContent.split("\n"));
  const widest = Math.max(...lines.map(line => measure.measureText(line).width));
  table.classList.toggle("rotated", widest > room);
}

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (ch) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;",
                                                      "'": "&#39;"}[ch]));
}

function tabs(container, names, onSelect) {
  const buttons = names.map(([key, text]) => {
    const b = document.createElement("button");
    b.textContent = text;
    b.dataset.key = key;
    b.addEventListener("click", () => select(key));
    container.appendChild(b);
    return b;
  });
  function select(key) {
    for (const b of buttons) b.classList.toggle("active", b.dataset.key === key);
    onSelect(key);
  }
  return select;
}
