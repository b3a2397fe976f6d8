// The patching page: one heatmap per sweep (layer x position, layer x head), patched runs or attribution
// patching's estimate, raw metric or normalised.
"use strict";

const data = JSON.parse(document.getElementById("data").textContent);
const TITLES = {
  resid_pre: "residual stream that each layer reads", resid_mid: "residual stream between attention and MLP",
  attn_out: "attention output", mlp_out: "MLP output", attn_head_out_all_pos: "each head's output, all positions",
  attn_head_out_by_pos: "each head's output, one position",
};
let sweep = Object.keys(data.patched)[0];

function table() {
  const kind = document.querySelector("input[name=kind]:checked").value;
  const normalised = document.getElementById("normalized").checked;
  return data[normalised ? `${kind}_normalized` : kind][sweep];
}

function grid(values) {
  // [layers, positions, heads] (one head at one position) -> rows "L{l} H{h}", columns positions
  if (sweep !== "attn_head_out_by_pos") return values;
  const rows = [];
  values.forEach((positions) => positions[0].forEach((_, h) => rows.push(positions.map((heads) => heads[h]))));
  return rows;
}

function labels(rows) {
  const layers = data.patched[sweep].length;
  if (sweep === "attn_head_out_by_pos") {
    const heads = rows.length / layers;
    return rows.map((_, r) => `L${Math.floor(r / heads)} H${r % heads}`);
  }
  return rows.map((_, l) => `L${l}`);
}

function columns(rows) {
  // a position over its token (on one line when the headers stand on end); a token's own line breaks shown as \n
  return sweep === "attn_head_out_all_pos" ? rows[0].map((_, h) => `H${h}`)
    : data.tokens.map((t, i) => `${i}\n${t.replace(/\n/g, "\\n").replace(/\t/g, "\\t")}`);
}

function draw() {
  const rows = grid(table());
  const normalised = document.getElementById("normalized").checked;
  const scale = normalised ? Math.max(1, maxAbs(rows)) : maxAbs(rows);
  const rowLabels = labels(rows);
  const columnLabels = columns(rows);
  document.getElementById("legend").textContent =
    `${TITLES[sweep]}: rows ${sweep === "attn_head_out_by_pos" ? "layer and head" : "layer"}, columns ` +
    `${sweep === "attn_head_out_all_pos" ? "head" : "position"}. ` +
    (normalised ? "1 = the clean run's metric restored, 0 = left at the corrupted run's."
                : `clean ${formatNumber(data.clean_metric)}, corrupted ${formatNumber(data.corrupted_metric)}.`);
  const describe = (r, c, v) => `${rowLabels[r]}, ${columnLabels[c].replace("\n", " ")}: ${formatNumber(v)}`;
  heatmapTable(document.getElementById("grid"), rows, {
    rowLabels, columnLabels, compact: sweep === "attn_head_out_by_pos",
    colour: (v) => divergingColour(v, scale),
    cellText: (r, c, v) => (sweep === "attn_head_out_by_pos" ? "" : formatNumber(v)),
    title: describe,
    onClick: (r, c) => { document.getElementById("detail").textContent = describe(r, c, rows[r][c]); },
  });
}

tabs(document.getElementById("tabs"), Object.keys(data.patched).map((k) => [k, TITLES[k]]),
     (key) => { sweep = key; draw(); })(sweep);
for (const input of document.querySelectorAll("input")) input.addEventListener("change", draw);
