"""One self-contained HTML page of a pruned attribution graph (scratch_models.circuits), offline.

    page = GraphPage(graph, tokens)            # page.html; page.save("graph.html"); Jupyter shows it
    GraphPage(graph, tokens, contexts=FeatureContexts.read(["features/"], hooks, width, tokenizer.shown_tokens))

What it shows is what circuit-tracer's frontend files hold (circuits.graph.shown_subgraph): the nodes and edges
pruning keeps at `node_threshold` and `edge_threshold`. Nodes sit by layer (rows: the token embeddings at the bottom,
one row per layer, the logit targets at the top) and by position (columns, labelled with the prompt's tokens); a
cell's features side by side, its error node last. Kinds are shapes: a feature a circle (shaded by its influence),
an error node a grey square, an embedding a green diamond, a logit target a box with its token and probability.
Edges are curves from source to target, blue where the weight is positive and red where negative, as wide and as
opaque as |weight| against the largest shown; at rest the strongest 500 (a select changes it), a chosen node all of
its own. Hover a node to see its edges alone and its numbers (activation, influence, its top incoming and outgoing
edges); a click keeps it; a feature also shows its top corpus contexts when a `scratch-models features` run of its
layer's transcoder is given (FeatureContexts), and says so plainly when none is. A run is matched to a layer by the
hook it read and its width, which cannot tell two sets at the same hook apart: the panel names the run's dictionary.

The markup, style and script are package data (static/graph.{html,css,js}); this module fills in the data as JSON.
"""

import html
import json
import os
import re
from pathlib import Path

import torch

from ..circuits.graph import Graph, Pruned, graph_scores, node_influence, prune_graph, shown_subgraph
from .display import page_file, script_json, write_atomically

IFRAME_HEIGHT = 900  # px of a page shown in a notebook; it scrolls inside
MAX_EDGES = 20_000  # edges a page holds at most (and each node's TOP_EDGES strongest each way): about 1 MB of them
TOP_EDGES = 10  # a node's strongest edges each way, listed in its panel (graph.js's TOP_EDGES)
EXAMPLES = 5  # corpus contexts a feature shows
FEATURES_MANIFEST, FEATURES_FORMAT = "features.json", "scratch-models features"  # dictionaries/features.py's


class GraphPage:
    """The page of `graph` pruned at the thresholds; `tokens` the prompt's tokens as text (one per position).
    contexts: the features' corpus contexts (FeatureContexts), or None.
    max_edges: past this many pruned edges the page holds the strongest max_edges and each node's TOP_EDGES strongest
    each way (what its panel lists), and says so: a browser draws a few tens of thousands of curves, not millions.
    pruned: prune_graph(graph, node_threshold, edge_threshold) where the caller has it already.
    Attributes: html (the page), nodes and edges (how many it draws), notice (what it leaves out, or None)."""

    def __init__(self, graph: Graph, tokens: list[str], *, node_threshold: float = 0.8, edge_threshold: float = 0.98,
                 contexts: "FeatureContexts | None" = None, title: str = "attribution graph",
                 max_edges: int = MAX_EDGES, pruned: Pruned | None = None):
        if len(tokens) != graph.n_pos:
            raise ValueError(f"tokens: {len(tokens)} given for a graph of {graph.n_pos} positions")
        self.title = title
        data = graph_data(graph, tokens, node_threshold=node_threshold, edge_threshold=edge_threshold,
                          contexts=contexts, max_edges=max_edges, pruned=pruned)
        self.nodes, self.edges, self.notice = len(data["nodes"]), len(data["edges"]), data["notice"]
        replacement, completeness = graph_scores(graph)
        subtitle = (f"{graph.n_pos} tokens · {graph.n_layers} layers · {self.nodes} nodes and {data['total']} edges "
                    f"after pruning (node threshold {node_threshold:g}, edge threshold {edge_threshold:g}) of "
                    f"{graph.adjacency_matrix.shape[0]} nodes · replacement score {replacement:.3f}, completeness "
                    f"score {completeness:.3f}")
        parts = {"TITLE": html.escape(title), "SUBTITLE": html.escape(subtitle), "STYLE": page_file("graph.css"),
                 "SCRIPT": page_file("graph.js"), "DATA": script_json(data)}
        # one pass, so a title holding "__DATA__" is not filled in a second time
        self.html = re.sub(r"__(TITLE|SUBTITLE|STYLE|SCRIPT|DATA)__", lambda m: parts[m.group(1)],
                           page_file("graph.html"))

    def __repr__(self) -> str:
        return f"GraphPage({self.title!r}: {self.nodes} nodes, {self.edges} edges)"

    def save(self, path):
        """Write the page to `path` whole, or not at all."""
        return write_atomically(path, self.html.encode())

    def _repr_html_(self) -> str:
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" title="{html.escape(self.title)}" '
                f'sandbox="allow-scripts" style="width: 100%; height: {IFRAME_HEIGHT}px; border: 1px solid #d5d9e0">'
                "</iframe>")


def graph_data(graph: Graph, tokens: list[str], *, node_threshold: float, edge_threshold: float,
               contexts: "FeatureContexts | None", max_edges: int = MAX_EDGES, pruned: Pruned | None = None) -> dict:
    """What the page's script draws: the shown nodes (each with its index in the graph's adjacency matrix and its
    edges' counts, [in, out]), the edges between them as [target, source, weight] (graph indices; past max_edges the
    ones `held` keeps), and the features' contexts."""
    if max_edges < 0:
        raise ValueError(f"max_edges must be at least 0, got {max_edges}")
    pruned = pruned if pruned is not None else prune_graph(graph, node_threshold, edge_threshold)
    shown, targets, sources = shown_subgraph(graph, pruned)
    weights = graph.adjacency_matrix[targets, sources]
    size = graph.adjacency_matrix.shape[0]
    ins, outs = torch.bincount(targets, minlength=size).tolist(), torch.bincount(sources, minlength=size).tolist()
    total = len(weights)
    notice = None
    if total > max_edges:
        keep = held(targets, sources, weights, max_edges)
        targets, sources, weights = targets[keep], sources[keep], weights[keep]
        notice = (f"This page holds {len(weights):,} of the {total:,} edges pruning keeps: the strongest {max_edges:,} "
                  f"and each node's {TOP_EDGES} strongest each way (GraphPage's max_edges).")
    influence = node_influence(graph)
    n_features = len(graph.selected_features)
    error_end = n_features + graph.n_pos * graph.n_layers
    token_end = error_end + graph.n_pos
    nodes = []
    for index in shown.nonzero()[:, 0].tolist():
        node = {"index": index, "influence": influence[index].item(), "degree": [ins[index], outs[index]],
                "cumulative": pruned.cumulative_scores[index].item()}
        if index < n_features:
            layer, pos, feature = graph.active_features[graph.selected_features[index]].tolist()
            node |= {"kind": "feature", "layer": layer, "pos": pos, "feature": feature,
                     "activation": graph.activation_values[graph.selected_features[index]].item()}
        elif index < error_end:
            layer, pos = divmod(index - n_features, graph.n_pos)
            node |= {"kind": "error", "layer": layer, "pos": pos}
        elif index < token_end:
            pos = index - error_end
            node |= {"kind": "embedding", "layer": -1, "pos": pos, "id": int(graph.input_tokens[pos])}
        else:
            j = index - token_end
            token, vocab_index = graph.logit_targets[j]
            node |= {"kind": "logit", "layer": graph.n_layers, "pos": graph.n_pos - 1, "id": int(vocab_index),
                     "token": str(token), "probability": graph.logit_probabilities[j].item()}
        nodes.append(node)
    features = {(n["layer"], n["feature"]) for n in nodes if n["kind"] == "feature"}
    return {"tokens": list(tokens), "nLayers": graph.n_layers, "nodes": nodes, "total": total, "notice": notice,
            "topEdges": TOP_EDGES,
            "edges": [[t, s, w] for t, s, w in zip(targets.tolist(), sources.tolist(), weights.tolist())],
            "contexts": contexts.for_features(features) if contexts is not None else None,
            "contextsNote": "No corpus contexts: no `scratch-models features` run of these transcoders was given "
                            "(scratch-models attribute --features DIR)."}


def held(targets: torch.Tensor, sources: torch.Tensor, weights: torch.Tensor, count: int) -> torch.Tensor:
    """[E] bool: the `count` edges of largest |weight|, and each node's TOP_EDGES largest as a target and as a
    source."""
    order = torch.argsort(weights.abs(), descending=True, stable=True)
    keep = torch.zeros(len(weights), dtype=torch.bool, device=weights.device)
    keep[order[:count]] = True
    for ends in (targets, sources):
        by_node = order[torch.argsort(ends[order], stable=True)]  # grouped by node, strongest first in each
        group = ends[by_node]
        starts = torch.searchsorted(group, group)  # each edge's group's first place (group is sorted)
        keep[by_node[torch.arange(len(group), device=group.device) - starts < TOP_EDGES]] = True
    return keep


class FeatureContexts:
    """The top corpus contexts of transcoder features, read from `scratch-models features` runs of the set's layers
    (one run per layer, of that layer's transcoder, reading its input hook): runs[layer] = the run's directory."""

    def __init__(self, runs: dict[int, Path], shown_tokens, page_root: Path | None = None):
        self.runs, self.shown_tokens, self.page_root = runs, shown_tokens, page_root

    @classmethod
    def read(cls, directories, hooks: list[str], width: int, shown_tokens, page_root=None) -> "FeatureContexts":
        """The runs among `directories` (each a features run, or a directory whose subdirectories are runs), each
        matched to the layer whose transcoder input hook (our name, `hooks[layer]`) it read, with `width` features.
        A directory that holds no run, an unfinished run, one of another width or hook, or two runs of one layer
        are refused naming the directory. `shown_tokens(ids) -> [str]` writes the contexts' tokens; `page_root`: the
        directory the graph page is written to, for relative links to the runs' feature pages."""
        runs: dict[int, Path] = {}
        for directory in map(Path, directories):
            directory = directory.expanduser()
            found = [directory] if (directory / FEATURES_MANIFEST).is_file() else sorted(
                d for d in directory.iterdir() if (d / FEATURES_MANIFEST).is_file()) if directory.is_dir() else []
            if not found:
                raise ValueError(f"{directory}: holds no `scratch-models features` run ({FEATURES_MANIFEST}), nor "
                                 "do its subdirectories")
            for run in found:
                manifest = json.loads((run / FEATURES_MANIFEST).read_text())
                if manifest.get("format") != FEATURES_FORMAT or manifest.get("status") != "complete":
                    raise ValueError(f"{run / FEATURES_MANIFEST}: not a complete `scratch-models features` run "
                                     f"(status {manifest.get('status')!r}): finish it first")
                hook = manifest["settings"]["hook"]
                if hook not in hooks:
                    raise ValueError(f"{run}: a features run of a dictionary at {hook}; the transcoders read "
                                     f"{hooks[0]} ... {hooks[-1]}: not a run of these transcoders")
                layer = hooks.index(hook)
                if manifest["features"] != width:
                    raise ValueError(f"{run}: {manifest['features']} features at {hook}; layer {layer}'s transcoder "
                                     f"has {width}: a run of another dictionary")
                if layer in runs:
                    raise ValueError(f"{run} and {runs[layer]}: two features runs of layer {layer} ({hook})")
                runs[layer] = run
        return cls(runs, shown_tokens, None if page_root is None else Path(page_root))

    def for_features(self, features: set[tuple[int, int]]) -> dict:
        """"layer:feature" -> its numbers, top contexts and page link, for the features of layers with a run."""
        import datasets

        found = {}
        for layer, run in sorted(self.runs.items()):
            wanted = sorted(f for l, f in features if l == layer)
            if not wanted:
                continue
            settings = json.loads((run / FEATURES_MANIFEST).read_text())["settings"]
            before, dictionary = settings["window"][0], settings.get("dictionary") or str(run)
            rows = datasets.load_from_disk(str(run / "dataset")).select(wanted)
            ids = {i for row in rows for window in row["top_ids"][:EXAMPLES] for i in window if i >= 0}
            strings = dict(zip(sorted(ids), self.shown_tokens(sorted(ids)))) if ids else {}
            for feature, row in zip(wanted, rows):
                if row["feature"] != feature:
                    raise ValueError(f"{run / 'dataset'}: row {feature} holds feature {row['feature']}")
                page = run / "features" / f"{feature}.html"
                link = None
                if page.is_file():
                    link = (os.path.relpath(page.resolve(), self.page_root.resolve()) if self.page_root is not None
                            else page.resolve().as_uri())
                found[f"{layer}:{feature}"] = {
                    "run": str(run), "dictionary": dictionary, "fired": row["fired"], "frequency": row["frequency"], "max": row["max"],
                    "before": before, "page": link,
                    "examples": [{"value": value,
                                  "tokens": [strings[i] if i >= 0 else None for i in window],
                                  "acts": [a if a == a else None for a in acts]}  # NaN: no activation there
                                 for value, window, acts in zip(row["top_value"][:EXAMPLES],
                                                                row["top_ids"][:EXAMPLES],
                                                                row["top_acts"][:EXAMPLES])]}
        return found

