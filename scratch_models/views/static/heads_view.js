// The heads view, alone on the heads page and beside the attention page's views: a layer x head grid coloured by
// one measure (a tab each), every cell with its head's label, and the heads ranked by that measure in a table.
// `data`: what each head attends to (AttentionSummary.to_json: labels, shares, entropy) and, when the heads were
// scored for a target, their ablation and gradient scores (HeadReport.to_json).
// Selecting a head (a grid cell or a table row) fires a "head-selected" event with {layer, head} on document; the
// function returned marks a head selected elsewhere, without the event.
"use strict";

function headsView(data) {
  const tabBar = document.getElementById("tabs"), legend = document.getElementById("legend");
  const grid = document.getElementById("grid"), detail = document.getElementById("detail");
  const table = document.getElementById("ranked");
  const shareNames = Object.keys(data.shares);
  const towards = {self: "the query itself", prev: "the token before it", next: "the token after it",
                   punct: "punctuation", first: "the first token"};

  // key -> {tab, column, legend, values [layers][heads], signed (blue-white-red) or scale (white-purple, null:
  // the largest value)}
  const measures = new Map();
  if (data.zero_ablation) {
    const change = data.vector_target ? "L2 change of the target" : "change of the target (ablated − intact)";
    const target = data.target ? `; target: ${data.target}` : "";
    measures.set("zero_ablation", {tab: "zero ablation", column: "zero abl.", signed: true, values: data.zero_ablation,
                                   legend: `${change} when the head's output is set to 0${target}`});
    measures.set("mean_ablation", {
      tab: "mean ablation", column: "mean abl.", signed: true, values: data.mean_ablation,
      legend: `${change} when the head's output is set to its mean over the batch${target}`});
    measures.set("importance", {tab: "gradient", column: "gradient", scale: null, values: data.importance,
                                legend: "Michel et al. 2019: mean over prompts of |d target / d head mask|"});
  }
  measures.set("top_share", {
    tab: "what it attends to", column: "top share", scale: 1,
    values: data.labels.map((row, l) => row.map((_, h) => Math.max(...shareNames.map((n) => data.shares[n][l][h])))),
    legend: "Clark et al. 2019: the largest share of a query's attention, averaged over the real queries, and the " +
            "label says where it goes; broad = high entropy, mixed = no behaviour dominates"});
  measures.set("entropy", {tab: "entropy", column: "entropy", scale: null, values: data.entropy,
                           legend: "mean entropy of a query's attention, in nats (a head that attends uniformly: " +
                                   `${formatNumber(data.uniform_entropy)})`});
  for (const name of shareNames) {
    measures.set(`share ${name}`, {tab: `share ${name}`, column: name, scale: 1, values: data.shares[name],
                                   legend: `share of a query's attention that goes to ${towards[name] || name}, ` +
                                           "averaged over the real queries"});
  }
  const layers = data.labels.length, heads = data.labels[0].length;
  const rows = [];
  for (let l = 0; l < layers; l++) {
    for (let h = 0; h < heads; h++) {
      const row = {layer: l, head: h, label: data.labels[l][h]};
      for (const [key, m] of measures) row[key] = m.values[l][h];
      rows.push(row);
    }
  }
  let selected = null, measure, sortKey;

  function headText(l, h) {
    const parts = [`layer ${l}, head ${h}: ${data.labels[l][h]}`];
    for (const m of measures.values()) parts.push(`${m.tab} ${formatNumber(m.values[l][h])}`);
    return parts.join("\n");
  }

  function drawGrid() {
    const m = measures.get(measure);
    legend.textContent = m.legend;
    const scale = m.scale || maxAbs(m.values);
    heatmapTable(grid, m.values, {
      rowLabels: m.values.map((_, l) => `L${l}`),
      columnLabels: m.values[0].map((_, h) => `H${h}`),
      colour: m.signed ? (v) => divergingColour(v, scale) : (v) => sequentialColour(v, scale),
      cellText: (l, h, v) => `<span class="label">${escapeHtml(data.labels[l][h])}</span>${formatNumber(v)}`,
      title: headText,
      onClick: pick,
    });
    drawRanked();
  }

  const columns = [["layer", "layer"], ["head", "head"], ["label", "label"],
                   ...[...measures].map(([key, m]) => [key, m.column])];

  function drawRanked() {
    // scores by size, largest first (a head that hurts the target counts as much as one that helps); labels A-Z;
    // layer and head in order
    const sorted = [...rows].sort(
      sortKey === "label" ? (a, b) => a.label.localeCompare(b.label)
        : sortKey === "layer" || sortKey === "head" ? (a, b) => a[sortKey] - b[sortKey] || a.layer - b.layer
        : (a, b) => Math.abs(b[sortKey]) - Math.abs(a[sortKey]));
    table.replaceChildren();
    const header = table.createTHead().insertRow();
    for (const [key, text] of columns) {
      const th = document.createElement("th");
      th.textContent = text;
      th.className = (key === "label" ? "text" : "") + (key === sortKey ? " sorted" : "");
      if (measures.has(key)) th.title = measures.get(key).legend;
      th.addEventListener("click", () => {
        if (measures.has(key)) selectTab(key);
        else { sortKey = key; drawRanked(); }
      });
      header.appendChild(th);
    }
    const body = table.createTBody();
    for (const row of sorted) {
      const tr = body.insertRow();
      tr.dataset.layer = row.layer;
      tr.dataset.head = row.head;
      for (const [key] of columns) {
        const td = tr.insertCell();
        td.textContent = measures.has(key) ? formatNumber(row[key]) : row[key];
        if (key === "label") td.className = "text";
      }
      tr.addEventListener("click", () => pick(row.layer, row.head));
    }
    mark();
  }

  function pick(layer, head) {
    show(layer, head);
    document.dispatchEvent(new CustomEvent("head-selected", {detail: {layer, head}}));
  }

  function show(layer, head) {
    selected = {layer, head};
    detail.textContent = headText(layer, head).replaceAll("\n", " · ");
    mark();
    // Scroll the table's own box to the row, never the page: the head may have been chosen in another view.
    const row = table.querySelector(`tbody tr[data-layer="${layer}"][data-head="${head}"]`);
    const box = table.parentElement, top = row.offsetTop - table.tHead.offsetHeight;
    if (top < box.scrollTop || row.offsetTop + row.offsetHeight > box.scrollTop + box.clientHeight) {
      box.scrollTop = top;
    }
  }

  function mark() {
    const at = (l, h) => selected !== null && l === selected.layer && h === selected.head;
    for (const td of grid.querySelectorAll("td")) {
      td.classList.toggle("selected", at(+td.dataset.row, +td.dataset.column));
    }
    for (const tr of table.querySelectorAll("tbody tr")) {
      tr.classList.toggle("selected", at(+tr.dataset.layer, +tr.dataset.head));
    }
  }

  // a measure colours the grid and ranks the table
  const selectTab = tabs(tabBar, [...measures].map(([key, m]) => [key, m.tab]), (key) => {
    measure = sortKey = key;
    drawGrid();
  });
  selectTab(measures.keys().next().value);
  return show;
}
