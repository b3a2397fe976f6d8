/* The pages of `scratch-models features` (feature_pages.py fills in their data): FeaturePages.index() draws the
   table of every feature, sortable by a click on a column's head and searchable; FeaturePages.feature() draws one
   feature: its numbers, the histogram of its activations, its logit effects, and its examples, each token shaded by
   the feature's activation there (hover a token for the number). Plain JavaScript, nothing fetched. */
const FeaturePages = (() => {
  const data = () => JSON.parse(document.getElementById("data").textContent);
  const element = (tag, attributes = {}, text = null) => {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
    if (text !== null) node.textContent = text;
    return node;
  };
  const number = (value, digits = 4) =>
    value === null || value === undefined ? "–" : String(parseFloat(Number(value).toPrecision(digits)));
  const percent = value => `${(100 * value).toPrecision(3)}%`;
  const shown = token => token.replace(/\n/g, "⏎").replace(/\t/g, "⇥");

  function index() {
    const { rows, page, columns } = data();
    const position = Object.fromEntries(columns.map((name, i) => [name, i]));
    const state = { key: "frequency", descending: true, query: "", dead: false, shown: page };
    const body = document.querySelector("#features tbody");
    const heads = [...document.querySelectorAll("#features th[data-key]")];
    const search = document.getElementById("search");

    function matches(row) {
      if (!state.dead && row[position.fired] === 0) return false;
      const query = state.query.trim().toLowerCase();
      if (!query) return true;
      if (/^\d+$/.test(query) && row[position.feature] === Number(query)) return true;
      return row[position.tokens].toLowerCase().includes(query) || row[position.raises].toLowerCase().includes(query);
    }

    function draw() {
      const column = position[state.key], sign = state.descending ? -1 : 1;
      const chosen = rows.filter(matches).sort((a, b) => sign * (a[column] - b[column]) ||
                                                         a[position.feature] - b[position.feature]);
      body.replaceChildren(...chosen.slice(0, state.shown).map(row => {
        const tr = element("tr", { "data-feature": row[position.feature] });
        const link = element("a", { href: `features/${row[position.feature]}.html` }, `#${row[position.feature]}`);
        tr.append(element("td", { class: "number" }), element("td", { class: "number" }, percent(row[position.frequency])),
                  element("td", { class: "number" }, number(row[position.max])),
                  element("td", { class: "number" }, number(row[position.mean])),
                  element("td", { class: "tokens", title: row[position.tokens] }, row[position.tokens]),
                  element("td", { class: "tokens", title: row[position.raises] }, row[position.raises]));
        tr.firstChild.append(link);
        return tr;
      }));
      for (const head of heads) {
        head.classList.toggle("sorted", head.dataset.key === state.key);
        head.classList.toggle("ascending", head.dataset.key === state.key && !state.descending);
      }
      document.getElementById("count").textContent =
        `${Math.min(state.shown, chosen.length)} of ${chosen.length} shown (${rows.length} features)`;
      document.getElementById("more").hidden = chosen.length <= state.shown;
    }

    for (const head of heads) {
      head.addEventListener("click", () => {
        state.descending = head.dataset.key === state.key ? !state.descending : head.dataset.key !== "feature";
        state.key = head.dataset.key;
        draw();
      });
    }
    search.addEventListener("input", () => { state.query = search.value; state.shown = page; draw(); });
    document.getElementById("dead").addEventListener("change", event => { state.dead = event.target.checked; draw(); });
    document.getElementById("more").addEventListener("click", () => { state.shown += page; draw(); });
    draw();
  }

  // a page's packed windows: base64 of little-endian int32 (token indices) or float32 (activations)
  function unpack(base64, Kind) {
    const text = atob(base64), bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    return new Kind(bytes.buffer);
  }

  // each example of a packed set: its value, and its window's tokens (null outside its sequence) and activations
  function examples(set, strings, width) {
    const tokens = unpack(set.tokens, Int32Array), acts = unpack(set.acts, Float32Array);
    return set.value.map((value, n) => ({
      value, document: set.document[n], position: set.position[n], band: set.band ? set.band[n] : null,
      tokens: Array.from(tokens.subarray(n * width, (n + 1) * width), i => i < 0 ? null : strings[i]),
      acts: Array.from(acts.subarray(n * width, (n + 1) * width), a => Number.isNaN(a) ? null : a),
    }));
  }

  function example(item, max, before) {
    const line = element("div", { class: "example", "data-value": item.value,
                                  title: `document ${item.document}, token ${item.position}` });
    line.append(element("span", { class: "value" }, number(item.value)));
    item.tokens.forEach((token, i) => {
      if (token === null) return;  // outside the sequence
      const act = item.acts[i];
      const span = element("span", { class: "token" }, shown(token));
      if (act === null) {
        span.classList.add("unknown");
        span.title = "no activation here (a special token left out)";
      } else {
        span.dataset.act = act;
        span.title = `${shown(token)}: ${number(act, 5)}`;
        if (act > 0) span.style.background = `rgba(255, 120, 0, ${Math.min(1, act / max).toFixed(3)})`;
      }
      if (i === before) span.classList.add("peak");
      line.append(span);
    });
    return line;
  }

  function histogram(svg, edges, counts) {
    const width = Number(svg.getAttribute("width")), height = Number(svg.getAttribute("height"));
    const left = 40, bottom = 30, top = 8, biggest = Math.max(1, ...counts);
    const step = (width - left - 10) / Math.max(1, counts.length);
    const ns = "http://www.w3.org/2000/svg";
    const add = (tag, attributes, text) => {
      const node = document.createElementNS(ns, tag);
      for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
      if (text !== undefined) node.textContent = text;
      svg.append(node);
      return node;
    };
    counts.forEach((count, i) => {
      const tall = (height - bottom - top) * count / biggest;
      const bar = add("rect", { class: "bar", x: left + i * step, y: height - bottom - tall,
                                width: Math.max(1, step - 1), height: tall });
      bar.append(document.createElementNS(ns, "title"));
      bar.firstChild.textContent = `${number(edges[i])} to ${number(edges[i + 1])}: ${count}`;
    });
    const ticks = Math.min(counts.length, 6);
    for (let t = 0; t <= ticks; t++) {
      const i = Math.round(t * counts.length / Math.max(1, ticks));
      add("text", { class: "axis", x: left + i * step, y: height - bottom + 14, "text-anchor": "middle" },
          number(edges[Math.min(i, edges.length - 1)], 2));
    }
    add("text", { class: "axis", x: left - 4, y: top + 8, "text-anchor": "end" }, String(biggest));
    add("text", { class: "axis", x: left + (width - left) / 2, y: height - 2, "text-anchor": "middle" },
        "activation (log scale)");
  }

  function feature() {
    const d = data();
    const numbers = document.getElementById("numbers");
    const quantiles = d.quantiles.map(([q, v]) => `${Math.round(100 * q)}%: ${number(v)}`).join(", ");
    numbers.append(
      element("div", {}, `fires on ${d.fired} of ${d.tokens} tokens (${percent(d.frequency)})`),
      element("div", {}, d.fired ? `max ${number(d.max)}, mean ${number(d.mean)}; quantiles ${quantiles}` :
                                   "never fired on this corpus"));
    for (const [id, target] of [["previous", d.previous], ["next", d.next]]) {
      const link = document.getElementById(id);
      if (target === null) link.hidden = true; else link.href = `${target}.html`;
    }
    histogram(document.getElementById("histogram"), d.hist.edges, d.hist.counts);
    for (const [id, rows] of [["raises", d.logits.top], ["lowers", d.logits.bottom]]) {
      document.getElementById(id).append(...rows.map(([token, value]) => {
        const tr = element("tr");
        tr.append(element("td", { class: "tokens" }, shown(token)), element("td", { class: "number" }, number(value)));
        return tr;
      }));
    }
    document.getElementById("logit-note").textContent = d.logits.how;
    document.getElementById("top").append(
      ...examples(d.top, d.strings, d.width).map(item => example(item, d.max, d.before)));
    const bands = document.getElementById("bands");
    const sample = examples(d.sample, d.strings, d.width);
    for (const band of [3, 2, 1, 0]) {
      const chosen = sample.filter(item => item.band === band);
      if (!chosen.length) continue;
      const block = element("div", { class: "band", "data-band": band });
      block.append(element("h4", {}, d.bands[band]), ...chosen.map(item => example(item, d.max, d.before)));
      bands.append(block);
    }
  }

  return { index, feature };
})();
