"""The attribution graph's page (scratch_models.views.graph_page): what it holds, checked against the pruned graph,
then the page driven in headless Chromium (skipped, saying why, without chromium and chromedriver)."""

import json
import os
import re

import pytest
import torch

from circuit_data import random_transcoders
from scratch_models.circuits import attribute, graph_scores, prune_graph
from scratch_models.dictionaries.features import run_features
from scratch_models.views.graph_page import FeatureContexts, GraphPage

TOP_EDGES = 10  # graph.js's TOP_EDGES: the edges a node's panel lists, each way
CORPUS = [f"{s} {i}" for i in range(6) for s in ("The meaning of life is to learn.",
                                                 "Once upon a time there lived a cat.")]
PROMPT = "Once upon a time there lived"
# this random model's errors outweigh its random transcoders' features: at circuit-tracer's default node threshold
# (0.8) pruning keeps no feature, at 0.95 some of both layers
THRESHOLDS = {"node_threshold": 0.95, "edge_threshold": 0.98}


def expected_subgraph(graph, node_threshold=THRESHOLDS["node_threshold"], edge_threshold=THRESHOLDS["edge_threshold"]):
    """What circuit-tracer's frontend files keep, from the masks: the edges pruning kept between the nodes it kept
    {(target, source): weight}, and the nodes with such an edge plus every token and logit."""
    pruned = prune_graph(graph, node_threshold, edge_threshold)
    kept = pruned.node_mask
    edges = {(t, s): graph.adjacency_matrix[t, s].item() for t, s in pruned.edge_mask.nonzero().tolist()
             if kept[t] and kept[s]}
    nodes = {i for edge in edges for i in edge}
    first_token = graph.adjacency_matrix.shape[0] - len(graph.logit_targets) - graph.n_pos
    nodes |= set(range(first_token, graph.adjacency_matrix.shape[0]))
    return nodes, edges


def page_data(page: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="graph-data">(.*?)</script>', page, re.S)
                      .group(1))


@pytest.fixture(scope="module")
def setup(tiny_gpt2, tmp_path_factory):
    """A graph of a tiny GPT-2 with a tokenizer, a features run of the transcoder of the layer of the graph's most
    influential shown feature, and the page with and without its contexts."""
    from scratch_models import GPT2LMHeadModel

    lm = GPT2LMHeadModel.from_pretrained(tiny_gpt2[0])
    transcoders = random_transcoders(lm.config.n_layer, lm.config.n_embd, 24, jumprelu=True, skip=True)
    ids = torch.tensor([0, *lm.tokenizer.encode(PROMPT, add_special_tokens=False)])
    graph = attribute(lm, transcoders, ids, max_n_logits=4)
    tokens = lm.tokenizer.shown_tokens(ids.tolist())
    tokens[2] = "</script><b>&"  # a token that is markup stays text
    root = tmp_path_factory.mktemp("graph-page")
    data = page_data(GraphPage(graph, tokens, **THRESHOLDS).html)
    layers = sorted({n["layer"] for n in data["nodes"] if n["kind"] == "feature"})
    assert len(layers) == 2, "the test wants features shown in both layers: one with contexts, one without"
    with_run = layers[0]
    runs = root / "features"
    run_features(lm, transcoders.dictionary(with_run), CORPUS, runs / f"layer{with_run}", top_k=4,
                 samples=4, window=(3, 2), progress=False, context=16)
    contexts = FeatureContexts.read([runs], transcoders.sites(lm)[0], transcoders.d_transcoder,
                                    lm.tokenizer.shown_tokens, page_root=root)
    page = GraphPage(graph, tokens, contexts=contexts, title="graph <of> a prompt", **THRESHOLDS)
    page.save(root / "graph.html")
    return {"lm": lm, "transcoders": transcoders, "graph": graph, "tokens": tokens, "root": root, "page": page,
            "with_run": with_run, "without_run": layers[1], "run": runs / f"layer{with_run}"}


# ---------- what the page holds ----------

def test_page_is_self_contained_and_escaped(setup):
    page = setup["page"].html
    assert "http://" not in page and "https://" not in page
    for tag in re.findall(r"<(?:script|link|img|iframe|svg|image|use)\b[^>]*>", page, re.I):
        assert not re.search(r"\b(?:src|href)\s*=", tag, re.I), tag
    assert page.count("</script>") == 2  # the token "</script><b>&" closes none
    assert "<b>&" not in page and "graph &lt;of&gt; a prompt" in page
    assert "__" not in re.sub(r"<script.*?</script>", "", page, flags=re.S)  # every placeholder filled in
    assert page_data(page)["tokens"] == setup["tokens"]
    replacement, completeness = graph_scores(setup["graph"])
    assert f"replacement score {replacement:.3f}, completeness score {completeness:.3f}" in page


def test_nodes_and_edges_are_the_pruned_graphs(setup):
    graph = setup["graph"]
    data = page_data(setup["page"].html)
    nodes, edges = expected_subgraph(graph)
    assert [n["index"] for n in data["nodes"]] == sorted(nodes)
    assert {(t, s): w for t, s, w in data["edges"]} == edges
    assert len(data["edges"]) == len(edges) == setup["page"].edges
    n_features = len(graph.selected_features)
    for node in data["nodes"]:
        i = node["index"]
        if i < n_features:
            layer, pos, feature = graph.active_features[graph.selected_features[i]].tolist()
            assert (node["kind"], node["layer"], node["pos"], node["feature"]) == ("feature", layer, pos, feature)
            assert node["activation"] == graph.activation_values[graph.selected_features[i]].item()
    logits = [n for n in data["nodes"] if n["kind"] == "logit"]
    assert [(n["id"], n["probability"]) for n in logits] == [
        (vocab, p) for (_, vocab), p in zip(graph.logit_targets, graph.logit_probabilities.tolist())]
    # other thresholds, other nodes: the page follows them
    looser = page_data(GraphPage(graph, setup["tokens"], node_threshold=0.99, edge_threshold=0.995).html)
    nodes, edges = expected_subgraph(graph, 0.99, 0.995)
    assert [n["index"] for n in looser["nodes"]] == sorted(nodes) and len(looser["edges"]) == len(edges)


def test_contexts_are_the_features_runs(setup):
    import datasets

    data = page_data(setup["page"].html)
    layer = setup["with_run"]
    shown = sorted(n["feature"] for n in data["nodes"] if n["kind"] == "feature" and n["layer"] == layer)
    assert sorted(key for key in data["contexts"]) == sorted(f"{layer}:{f}" for f in set(shown))
    rows = datasets.load_from_disk(str(setup["run"] / "dataset"))
    feature = shown[0]
    found, row = data["contexts"][f"{layer}:{feature}"], rows[feature]
    assert [e["value"] for e in found["examples"]] == pytest.approx(row["top_value"], rel=1e-6)
    strings = setup["lm"].tokenizer.shown_tokens
    assert found["examples"][0]["tokens"] == [strings([i])[0] if i >= 0 else None for i in row["top_ids"][0]]
    assert found["dictionary"] == f"transcoders (layer {layer})"  # Transcoders.dictionary's name, for the panel
    assert found["page"] == os.path.relpath(setup["run"] / "features" / f"{feature}.html", setup["root"])
    assert (setup["root"] / found["page"]).is_file()


def test_features_runs_that_do_not_fit_are_refused_naming_them(setup, tmp_path):
    lm, transcoders, run = setup["lm"], setup["transcoders"], setup["run"]
    hooks, width = transcoders.sites(lm)[0], transcoders.d_transcoder
    with pytest.raises(ValueError, match=f"{tmp_path}: holds no `scratch-models features` run"):
        FeatureContexts.read([tmp_path], hooks, width, str)
    with pytest.raises(ValueError, match="24 features at .* has 12: a run of another dictionary"):
        FeatureContexts.read([run], hooks, 12, str)
    other = [f"layers.{i}.out" for i in range(len(hooks))]
    with pytest.raises(ValueError, match="not a run of these transcoders"):
        FeatureContexts.read([run], other, width, str)
    with pytest.raises(ValueError, match=f"two features runs of layer {setup['with_run']}"):
        FeatureContexts.read([run, run.parent], hooks, width, str)
    with pytest.raises(ValueError, match="tokens: 3 given for a graph of"):
        GraphPage(setup["graph"], ["a", "b", "c"])


# ---------- the page in Chromium ----------

def open_page(browser, path):
    browser.get_log("browser")  # reading the log empties it
    browser.get(path.as_uri())


def severe_errors(browser):
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def drawn(browser):
    """{node index: (kind, x, y)} of the drawn nodes' centres, and {(target, source): weight} of the drawn edges."""
    nodes = browser.execute_script(
        "return [...document.querySelectorAll('#nodes .node')].map(g => { const r = g.getBoundingClientRect();"
        " return [+g.dataset.node, g.dataset.kind, r.x + r.width / 2, r.y + r.height / 2]; })")
    edges = browser.execute_script(
        "return [...document.querySelectorAll('#edges .edge')].map(p =>"
        " [+p.dataset.target, +p.dataset.source, p.dataset.weight]);")
    return {i: (kind, x, y) for i, kind, x, y in nodes}, {(t, s): float(w) for t, s, w in edges}


def test_page_loads_offline_and_draws_the_pruned_graph(browser, setup):
    graph = setup["graph"]
    open_page(browser, setup["root"] / "graph.html")
    assert severe_errors(browser) == []
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0  # nothing fetched
    nodes, edges = drawn(browser)
    expected_nodes, expected_edges = expected_subgraph(graph)
    assert set(nodes) == expected_nodes
    assert edges == expected_edges  # each drawn edge with the adjacency matrix's weight, exactly
    data = page_data(setup["page"].html)
    rows = {"embedding": [], "logit": []}
    for node in data["nodes"]:
        rows.setdefault(node["kind"], []).append(nodes[node["index"]][2])
    # rows: the embeddings at the bottom, each layer above the one before, the logits at the top
    layer_y = {n["layer"]: nodes[n["index"]][2] for n in data["nodes"] if n["kind"] in ("feature", "error")}
    assert min(rows["embedding"]) > max(layer_y.values()) and max(rows["logit"]) < min(layer_y.values())
    assert all(layer_y[a] > layer_y[b] for a in layer_y for b in layer_y if a < b)
    # columns: the embeddings left to right by position, each labelled with its token
    embeddings = sorted((n["pos"], nodes[n["index"]][1]) for n in data["nodes"] if n["kind"] == "embedding")
    xs = [x for _, x in embeddings]
    assert xs == sorted(xs) and len(set(xs)) == graph.n_pos
    titles = browser.execute_script("return [...document.querySelectorAll('.token-label title')]"
                                    ".map(t => t.textContent)")
    assert titles == [f"position {i}: {json.dumps(t)}" for i, t in enumerate(setup["tokens"])]
    assert browser.find_element("id", "graph").get_attribute("data-edges") == str(len(expected_edges))


def _panel_edges(browser, which):
    return browser.execute_script(
        f"return [...document.querySelectorAll('#{which}-edges li[data-node]')]"
        ".map(li => [+li.dataset.node, li.dataset.weight])")


def test_hover_and_click_show_a_nodes_edges(browser, setup):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    graph = setup["graph"]
    _, edges = expected_subgraph(graph)
    open_page(browser, setup["root"] / "graph.html")
    # the feature with the most edges: its lists are cut to the top ones
    degree = {}
    for t, s in edges:
        degree[t], degree[s] = degree.get(t, 0) + 1, degree.get(s, 0) + 1
    feature = max((i for i in degree if i < len(graph.selected_features)), key=degree.get)
    element = browser.find_element(By.CSS_SELECTOR, f'#nodes .node[data-node="{feature}"]')
    ActionChains(browser).move_to_element(element).perform()
    details = browser.find_element(By.ID, "details")
    assert details.is_displayed() and details.get_attribute("data-node") == str(feature)
    on = browser.execute_script("return [...document.querySelectorAll('#edges .edge.on')]"
                                ".map(p => [+p.dataset.target, +p.dataset.source])")
    assert sorted(map(tuple, on)) == sorted(e for e in edges if feature in e)
    for which, mine in (("in", lambda t, s: t == feature), ("out", lambda t, s: s == feature)):
        ranked = sorted(((s if which == "in" else t, w) for (t, s), w in edges.items() if mine(t, s)),
                        key=lambda e: -abs(e[1]))[:TOP_EDGES]
        assert [(i, float(w)) for i, w in _panel_edges(browser, which)] == ranked
    layer, pos, index = graph.active_features[graph.selected_features[feature]].tolist()
    title = browser.find_element(By.ID, "node-title").text
    assert title.startswith(f"feature {index} · layer {layer} · position {pos}")
    activation = graph.activation_values[graph.selected_features[feature]].item()
    assert f"{activation:.4g}" in browser.find_element(By.ID, "node-numbers").text
    # moving away lets go; a click keeps the node until the background is clicked
    ActionChains(browser).move_to_element(browser.find_element(By.CLASS_NAME, "subtitle")).perform()
    assert not details.is_displayed()
    logit = graph.adjacency_matrix.shape[0] - len(graph.logit_targets)  # the likeliest target
    browser.find_element(By.CSS_SELECTOR, f'#nodes .node[data-node="{logit}"]').click()
    ActionChains(browser).move_to_element(browser.find_element(By.CLASS_NAME, "subtitle")).perform()
    assert details.is_displayed() and details.get_attribute("data-node") == str(logit)
    assert _panel_edges(browser, "out") == [] and "none (an output)" in browser.find_element(By.ID, "out-edges").text
    # a listed edge opens its other end
    first, _ = _panel_edges(browser, "in")[0]
    browser.find_element(By.CSS_SELECTOR, f'#in-edges li[data-node="{first}"]').click()
    assert details.get_attribute("data-node") == str(first)
    assert severe_errors(browser) == []


def test_a_features_contexts_or_a_plain_word_that_there_are_none(browser, setup, tmp_path):
    from PIL import Image, ImageStat
    from selenium.webdriver.common.by import By

    data = page_data(setup["page"].html)
    open_page(browser, setup["root"] / "graph.html")
    for layer in (setup["with_run"], setup["without_run"]):
        node = next(n for n in data["nodes"] if n["kind"] == "feature" and n["layer"] == layer)
        browser.find_element(By.CSS_SELECTOR, f'#nodes .node[data-node="{node["index"]}"]').click()
        box = browser.find_element(By.ID, "contexts")
        if layer == setup["without_run"]:
            assert box.find_element(By.ID, "no-contexts").text == (
                f"No features run of layer {layer}'s transcoder was given, so there are no corpus contexts for this "
                "feature.")
            continue
        found = data["contexts"][f"{layer}:{node['feature']}"]
        assert box.find_element(By.CLASS_NAME, "about").text.endswith(f"(features run of transcoders (layer {layer}))")
        examples = box.find_elements(By.CLASS_NAME, "example")
        assert len(examples) == len(found["examples"]) > 0
        peak = found["examples"][0]["tokens"][found["before"]]
        assert examples[0].find_element(By.CLASS_NAME, "peak").get_attribute("textContent") == peak.replace("\n", "↵")
        link = box.find_element(By.TAG_NAME, "a").get_attribute("href")
        assert link == (setup["run"] / "features" / f"{node['feature']}.html").resolve().as_uri()
        shot = tmp_path / "graph.png"
        assert browser.save_screenshot(str(shot))
        with Image.open(shot) as image:
            assert max(ImageStat.Stat(image.convert("RGB")).stddev) > 10
        if os.environ.get("GRAPH_PAGE_SHOT"):  # to look at it by hand
            browser.save_screenshot(os.environ["GRAPH_PAGE_SHOT"])
    # without any run, the panel says so plainly
    bare = tmp_path / "bare.html"
    GraphPage(setup["graph"], setup["tokens"], **THRESHOLDS).save(bare)
    open_page(browser, bare)
    node = next(n for n in data["nodes"] if n["kind"] == "feature")
    browser.find_element(By.CSS_SELECTOR, f'#nodes .node[data-node="{node["index"]}"]').click()
    assert "no `scratch-models features` run of these transcoders was given" in browser.find_element(
        By.ID, "no-contexts").text
    assert severe_errors(browser) == []


def test_at_rest_only_the_strongest_edges_show_and_a_chosen_node_shows_all_its_own(browser, setup):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _, edges = expected_subgraph(setup["graph"])
    assert len(edges) > 50
    open_page(browser, setup["root"] / "graph.html")

    def visible():
        return set(map(tuple, browser.execute_script(
            "return [...document.querySelectorAll('#edges .edge')].filter(p => getComputedStyle(p).display !== 'none')"
            ".map(p => [+p.dataset.target, +p.dataset.source])")))

    assert visible() == set(edges)  # fewer than the 500 drawn at first
    Select(browser.find_element(By.ID, "edge-limit")).select_by_value("50")
    strongest = sorted(edges, key=lambda e: -abs(edges[e]))
    assert visible() == set(strongest[:50])
    assert browser.find_element(By.ID, "edge-count").text == f"50 of {len(edges)} drawn"
    weak = strongest[-1]  # the weakest edge's target, chosen: all of its edges show, the weak one too
    browser.find_element(By.CSS_SELECTOR, f'#nodes .node[data-node="{weak[0]}"]').click()
    assert visible() == set(strongest[:50]) | {e for e in edges if weak[0] in e}
    assert severe_errors(browser) == []



def test_a_page_past_max_edges_holds_the_strongest_and_each_nodes_own_and_says_so(browser, setup, tmp_path,
                                                                                   monkeypatch):
    from selenium.webdriver.common.by import By

    from scratch_models.views import graph_page

    top = 2  # a node's edges listed each way, fewer than this small graph's nodes have, to leave some out
    monkeypatch.setattr(graph_page, "TOP_EDGES", top)
    graph = setup["graph"]
    nodes, edges = expected_subgraph(graph)
    page = GraphPage(graph, setup["tokens"], max_edges=20, **THRESHOLDS)
    strongest = sorted(edges, key=lambda e: -abs(edges[e]))
    expected = set(strongest[:20])
    for end in (0, 1):  # each node's strongest as a target, then as a source
        for node in nodes:
            expected |= set([e for e in strongest if e[end] == node][:top])
    data = page_data(page.html)
    assert {(t, s) for t, s, _ in data["edges"]} == expected and page.edges == len(expected) < len(edges)
    assert page.notice == (f"This page holds {len(expected):,} of the {len(edges):,} edges pruning keeps: the "
                           f"strongest 20 and each node's {top} strongest each way (GraphPage's max_edges).")
    assert f"{len(edges)} edges after pruning" in page.html  # the subtitle counts them all
    page.save(tmp_path / "bounded.html")
    open_page(browser, tmp_path / "bounded.html")
    assert browser.find_element(By.ID, "notice").text == page.notice
    # a node's panel lists its strongest edges, and counts all of them
    busiest = max(nodes, key=lambda i: sum(i == t for t, _ in edges))
    browser.find_element(By.CSS_SELECTOR, f'#nodes .node[data-node="{busiest}"]').click()
    ranked = sorted(((s, w) for (t, s), w in edges.items() if t == busiest), key=lambda e: -abs(e[1]))
    assert len(ranked) > top
    assert [(i, float(w)) for i, w in _panel_edges(browser, "in")] == ranked[:top]
    assert browser.find_element(By.ID, "in-count").text == f"(top {top} of {len(ranked)} by |weight|)"
    assert severe_errors(browser) == []
    with pytest.raises(ValueError, match="max_edges must be at least 0, got -1"):
        GraphPage(graph, setup["tokens"], max_edges=-1)
