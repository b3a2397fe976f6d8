"use strict";
// The attribution graph page: lays the nodes out by layer (rows) and position (columns), draws the edges, and shows a
// node's numbers, edges and corpus contexts in the side panel. Data: graph_page.py's graph_data.
(function () {
  const data = JSON.parse(document.getElementById("graph-data").textContent);
  const svg = document.getElementById("graph");
  const NS = svg.namespaceURI;  // the inline <svg>'s: new shapes join it without naming a URL here
  const tokens = data.tokens, nLayers = data.nLayers, P = tokens.length;
  const SLOT = 17, PER_LINE = 8, LINE = 16, ROW = 52, LEFT = 64, TOP = 12, MIN_COLUMN = 58;
  const BOTTOM = 44, TOP_EDGES = data.topEdges;

  const nodes = data.nodes;
  const byIndex = new Map(nodes.map(n => [n.index, n]));
  const incoming = new Map(nodes.map(n => [n.index, []]));
  const outgoing = new Map(nodes.map(n => [n.index, []]));
  for (const [target, source, weight] of data.edges) {
    incoming.get(target).push([source, weight]);
    outgoing.get(source).push([target, weight]);
  }
  const byMagnitude = (a, b) => Math.abs(b[1]) - Math.abs(a[1]);
  for (const list of [...incoming.values(), ...outgoing.values()]) list.sort(byMagnitude);

  // ---- layout: row 0 the embeddings, rows 1..nLayers the layers, the top row the logits ----
  const rowOf = n => n.layer + 1;
  const cells = new Map();
  for (const n of nodes) {
    if (n.kind === "logit") continue;
    const key = rowOf(n) + ":" + n.pos;
    if (!cells.has(key)) cells.set(key, []);
    cells.get(key).push(n);
  }
  const kindOrder = {embedding: 0, feature: 1, error: 2};
  for (const cell of cells.values()) {
    cell.sort((a, b) => kindOrder[a.kind] - kindOrder[b.kind] || b.influence - a.influence);
  }
  // a cell wider than PER_LINE nodes wraps onto more lines; a row is as tall as its most wrapped cell
  const linesOf = cell => Math.ceil(cell.length / PER_LINE);
  const widths = tokens.map(() => MIN_COLUMN);
  const lines = new Array(nLayers + 2).fill(1);
  for (const [key, cell] of cells) {
    const [row, pos] = key.split(":").map(Number);
    widths[pos] = Math.max(widths[pos], Math.min(cell.length, PER_LINE) * SLOT + 10);
    lines[row] = Math.max(lines[row], linesOf(cell));
  }
  // a short prompt spreads out over the width there is, up to 2.5 times its columns' widths, and as far as its
  // logit targets' row needs (their boxes narrower, down to 66 px, where many share the width there is)
  const room = document.getElementById("graph-wrap").clientWidth - LEFT - 48;
  const logits = nodes.filter(n => n.kind === "logit").sort((a, b) => b.probability - a.probability);
  const LOGIT_WIDTH = Math.max(66, Math.min(112, room / Math.max(1, logits.length)));
  const natural = widths.reduce((a, b) => a + b, 0);
  const spread = Math.max(Math.min(2.5, Math.max(1, room / natural)), logits.length * LOGIT_WIDTH / natural);
  for (let pos = 0; pos < P; pos++) widths[pos] *= spread;
  const starts = [];
  let x = LEFT;
  for (const w of widths) { starts.push(x); x += w; }
  const centres = [];  // each row's middle, from the top (the logits) down
  let y = TOP;
  for (let row = nLayers + 1; row >= 0; row--) {
    const tall = ROW + (lines[row] - 1) * LINE;
    centres[row] = y + tall / 2;
    y += tall;
  }
  const rowY = row => centres[row];
  const place = new Map();
  for (const [key, cell] of cells) {
    const [row, pos] = key.split(":").map(Number);
    const count = linesOf(cell);
    cell.forEach((n, k) => {
      const line = Math.floor(k / PER_LINE), onLine = Math.min(PER_LINE, cell.length - line * PER_LINE);
      const left = starts[pos] + (widths[pos] - onLine * SLOT) / 2;
      place.set(n.index, [left + (k % PER_LINE + 0.5) * SLOT, rowY(row) + (line - (count - 1) / 2) * LINE]);
    });
  }
  // the logits right-aligned above the last position, the likeliest nearest it
  // the logit targets right-aligned, the likeliest above the last position
  logits.forEach((n, k) => place.set(n.index, [x - (k + 0.5) * LOGIT_WIDTH, rowY(nLayers + 1)]));
  const width = x + 12, height = y + BOTTOM;
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.dataset.nodes = nodes.length;
  svg.dataset.edges = data.edges.length;

  function make(tag, attrs, parent, text) {
    const e = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  // ---- grid and labels ----
  const grid = make("g", {id: "grid"}, svg);
  for (let row = 0; row <= nLayers + 1; row++) {
    const y = rowY(row);
    make("line", {x1: LEFT - 6, x2: width - 6, y1: y, y2: y, class: "grid"}, grid);
    const label = row === 0 ? "embed" : row === nLayers + 1 ? "logits" : "layer " + (row - 1);
    make("text", {x: 6, y: y + 4, class: "row-label"}, grid, label);
  }
  tokens.forEach((token, pos) => {
    const left = starts[pos], middle = left + widths[pos] / 2;
    if (pos > 0) make("line", {x1: left, x2: left, y1: TOP, y2: height - BOTTOM + 4, class: "grid"}, grid);
    const fits = Math.max(3, Math.floor(widths[pos] / 7.5));
    const label = make("text", {x: middle, y: height - BOTTOM + 20, "text-anchor": "middle", class: "token-label"},
                       grid, clip(shown(token), fits));
    make("title", {}, label, `position ${pos}: ${JSON.stringify(token)}`);
    make("text", {x: middle, y: height - BOTTOM + 34, "text-anchor": "middle", class: "position-label"}, grid, pos);
  });

  // ---- edges: a path is made when first shown (a page may hold 100,000 edges; a browser draws a few thousand) ----
  // a fold, not Math.max(...list): a spread of a few hundred thousand edges overflows the stack
  const largest = data.edges.reduce((most, e) => Math.max(most, Math.abs(e[2])), 1e-30);
  const edgeLayer = make("g", {id: "edges"}, svg);
  const strongest = data.edges.map((e, i) => i).sort((a, b) => Math.abs(data.edges[b][2]) - Math.abs(data.edges[a][2]));
  const rankOf = new Int32Array(data.edges.length);
  strongest.forEach((i, rank) => { rankOf[i] = rank; });
  const edgesOf = new Map(nodes.map(n => [n.index, []]));  // a node's edges, by their numbers in data.edges
  data.edges.forEach(([target, source], i) => { edgesOf.get(source).push(i); edgesOf.get(target).push(i); });
  const paths = new Map();
  let limit = 0;

  function edgePath(i) {
    if (paths.has(i)) return paths.get(i);
    const [target, source, weight] = data.edges[i];
    const [sx, sy] = place.get(source), [tx, ty] = place.get(target);
    const middle = (sy + ty) / 2, share = Math.abs(weight) / largest;
    const path = make("path", {
      d: `M${sx} ${sy} C${sx} ${middle} ${tx} ${middle} ${tx} ${ty}`,
      class: "edge " + (weight >= 0 ? "pos" : "neg"), "stroke-width": (0.4 + 3.6 * share).toFixed(2),
      "stroke-opacity": (0.15 + 0.6 * share).toFixed(3), "data-source": source, "data-target": target,
      "data-weight": String(weight)}, edgeLayer);
    paths.set(i, path);
    return path;
  }

  if (data.notice) {  // the page holds some of the pruned edges only
    const notice = document.getElementById("notice");
    notice.textContent = data.notice;
    notice.hidden = false;
  }
  const limitChoice = document.getElementById("edge-limit");
  function limitEdges() {
    limit = limitChoice.value === "all" ? strongest.length : Math.min(strongest.length, +limitChoice.value);
    // the weakest shown made first, so the strong ones lie on top
    for (let rank = limit - 1; rank >= 0; rank--) edgePath(strongest[rank]).classList.remove("beyond");
    for (const [i, path] of paths) if (rankOf[i] >= limit) path.classList.add("beyond");
    svg.dataset.drawn = limit;
    document.getElementById("edge-count").textContent = `${limit} of ${strongest.length} drawn`;
  }
  limitChoice.addEventListener("change", limitEdges);
  limitEdges();

  // ---- nodes ----
  const nodeLayer = make("g", {id: "nodes"}, svg);
  const features = nodes.filter(n => n.kind === "feature");
  const mostInfluence = features.reduce((most, n) => Math.max(most, n.influence), 1e-30);
  const nodeElements = new Map();
  for (const n of nodes) {
    const [px, py] = place.get(n.index);
    const g = make("g", {class: "node " + n.kind, transform: `translate(${px},${py})`, "data-node": n.index,
                         "data-kind": n.kind}, nodeLayer);
    if (n.kind === "feature") {
      const shade = Math.sqrt(Math.max(0, n.influence) / mostInfluence);  // light: little influence, dark: most
      make("circle", {r: 6, class: "shape feature-shape", style: `fill: ${mix([233, 221, 255], [76, 29, 149], shade)}`}, g);
    } else if (n.kind === "error") {
      make("rect", {x: -5, y: -5, width: 10, height: 10, class: "shape error-shape"}, g);
    } else if (n.kind === "embedding") {
      make("path", {d: "M0 -7 L7 0 L0 7 L-7 0 Z", class: "shape embedding-shape"}, g);
    } else {
      const w = LOGIT_WIDTH - 8;
      make("rect", {x: -w / 2, y: -16, width: w, height: 32, rx: 3, class: "shape logit-shape"}, g);
      make("rect", {x: -w / 2 + 1, y: 11, width: Math.max(0, (w - 2) * n.probability), height: 4, class: "logit-bar"}, g);
      make("text", {x: 0, y: -3, "text-anchor": "middle"}, g, clip(logitText(n), Math.floor(w / 7)));
      make("text", {x: 0, y: 9, "text-anchor": "middle", class: "probability"}, g, `p = ${n.probability.toFixed(3)}`);
    }
    make("title", {}, g, label(n));
    g.addEventListener("mouseenter", () => { if (pinned === null) show(n.index); });
    g.addEventListener("mouseleave", () => { if (pinned === null) clear(); });
    g.addEventListener("click", event => { event.stopPropagation(); pin(n.index); });
    nodeElements.set(n.index, g);
  }

  // ---- selection ----
  let pinned = null, focused = null;
  svg.addEventListener("click", () => { pinned = null; clear(); });
  document.addEventListener("keydown", event => { if (event.key === "Escape") { pinned = null; clear(); } });

  function pin(index) {
    pinned = pinned === index ? null : index;
    if (pinned === null) clear(); else show(index);
  }

  function clear() {
    if (focused !== null) {
      for (const i of edgesOf.get(focused)) {
        paths.get(i).classList.remove("on");
        paths.get(i).classList.toggle("beyond", rankOf[i] >= limit);
      }
      for (const g of nodeElements.values()) g.classList.remove("near", "sel");
    }
    focused = null;
    svg.classList.remove("focus");
    document.getElementById("panel-empty").hidden = false;
    document.getElementById("details").hidden = true;
  }

  function show(index) {
    clear();
    focused = index;
    svg.classList.add("focus");
    for (const i of edgesOf.get(index)) edgePath(i).classList.add("on");
    nodeElements.get(index).classList.add("sel");
    for (const [other] of [...incoming.get(index), ...outgoing.get(index)]) nodeElements.get(other).classList.add("near");
    const n = byIndex.get(index);
    document.getElementById("panel-empty").hidden = true;
    const details = document.getElementById("details");
    details.hidden = false;
    details.dataset.node = index;
    document.getElementById("node-title").textContent = label(n);
    const numbers = document.getElementById("node-numbers");
    numbers.replaceChildren();
    const rows = [];
    if (n.kind === "feature") rows.push(["activation", fmt(n.activation)]);
    if (n.kind === "logit") rows.push(["probability", n.probability.toFixed(4)], ["token id", n.id]);
    if (n.kind === "embedding") rows.push(["token id", n.id]);
    if (n.kind !== "logit") {
      rows.push(["influence", fmt(n.influence)],
                ["cumulative influence", (100 * n.cumulative).toFixed(1) + "% (share of all influence, with the nodes above it)"]);
    }
    rows.push(["graph node", n.index]);
    for (const [name, value] of rows) {
      const tr = numbers.insertRow();
      tr.insertCell().textContent = name;
      tr.insertCell().textContent = value;
    }
    edgeList(n, "in", incoming.get(index));
    edgeList(n, "out", outgoing.get(index));
    contexts(n);
  }

  function edgeList(n, which, edges) {
    const list = document.getElementById(which + "-edges");
    list.replaceChildren();
    const count = n.degree[which === "in" ? 0 : 1];  // of all the pruned edges, held by the page or not
    document.getElementById(which + "-count").textContent =
      count > TOP_EDGES ? `(top ${TOP_EDGES} of ${count} by |weight|)` : `(${count})`;
    if (!edges.length) {
      const li = document.createElement("li");
      li.className = "none";
      li.textContent = which === "in" ? "none (an input)" : "none (an output)";
      list.appendChild(li);
    }
    for (const [other, weight] of edges.slice(0, TOP_EDGES)) {
      const li = document.createElement("li");
      li.dataset.node = other;
      li.dataset.weight = String(weight);
      const w = document.createElement("span");
      w.className = "w " + (weight >= 0 ? "pos-text" : "neg-text");
      w.textContent = fmt(weight);
      const bar = document.createElement("span");
      bar.className = "bar";
      const fill = document.createElement("i");
      fill.style.width = (50 * Math.abs(weight) / largest).toFixed(1) + "px";
      fill.style.background = weight >= 0 ? "#2563eb" : "#dc4a26";
      bar.appendChild(fill);
      const name = document.createElement("span");
      name.textContent = label(byIndex.get(other));
      li.append(w, bar, name);
      li.addEventListener("click", () => { pinned = other; show(other); });
      list.appendChild(li);
    }
  }

  function contexts(n) {
    const box = document.getElementById("contexts");
    box.replaceChildren();
    if (n.kind !== "feature") return;
    const heading = document.createElement("h3");
    heading.textContent = "Top corpus contexts";
    box.appendChild(heading);
    const found = data.contexts && data.contexts[n.layer + ":" + n.feature];
    if (!found) {
      const p = document.createElement("p");
      p.className = "none";
      p.id = "no-contexts";
      p.textContent = data.contexts
        ? `No features run of layer ${n.layer}'s transcoder was given, so there are no corpus contexts for this feature.`
        : data.contextsNote;
      box.appendChild(p);
      return;
    }
    const about = document.createElement("p");
    about.textContent = `fires on ${(100 * found.frequency).toPrecision(3)}% of the corpus's tokens, at most ` +
      `${fmt(found.max)} (features run of ${found.dictionary})`;
    about.className = "about";
    box.appendChild(about);
    if (!found.examples.length) {
      const p = document.createElement("p");
      p.className = "none";
      p.textContent = "It never fired on the corpus.";
      box.appendChild(p);
    }
    for (const example of found.examples) {
      const div = document.createElement("div");
      div.className = "example";
      const value = document.createElement("span");
      value.className = "value";
      value.textContent = fmt(example.value);
      div.appendChild(value);
      example.tokens.forEach((token, k) => {
        if (token === null) return;
        const span = document.createElement("span");
        span.className = "t" + (k === found.before ? " peak" : "");
        span.textContent = token.replace(/\n/g, "↵");
        const act = example.acts[k];
        if (act !== null && act > 0 && found.max > 0) {
          span.style.background = `rgba(124, 58, 237, ${Math.min(1, act / found.max) * 0.6})`;
          span.title = "activation " + fmt(act);
        }
        div.appendChild(span);
      });
      box.appendChild(div);
    }
    if (found.page) {
      const a = document.createElement("a");
      a.href = found.page;
      a.textContent = `feature ${n.feature}'s page (every context, histogram, logit effects)`;
      box.appendChild(a);
    }
  }

  // ---- text ----
  function label(n) {
    const at = `position ${n.pos} ${JSON.stringify(shown(tokens[n.pos]))}`;
    if (n.kind === "feature") return `feature ${n.feature} · layer ${n.layer} · ${at}`;
    if (n.kind === "error") return `MLP error · layer ${n.layer} · ${at}`;
    if (n.kind === "embedding") return `embedding · ${at}`;
    return `logit ${logitText(n)} · p = ${n.probability.toFixed(3)}`;
  }
  // the target token as text, its id where the checkpoint has no tokenizer to name it
  function logitText(n) { return n.token ? JSON.stringify(shown(n.token)) : `#${n.id}`; }
  function shown(token) { return token.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥"); }
  function clip(text, count) { return text.length <= count ? text : text.slice(0, count - 1) + "…"; }
  function fmt(v) { return v === null || v === undefined ? "—" : Number(v).toPrecision(4); }
  function mix(a, b, t) { return `rgb(${a.map((c, k) => Math.round(c + (b[k] - c) * t)).join(",")})`; }
})();
