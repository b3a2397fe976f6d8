"""An attribution graph, and what circuit-tracer 0.5.0 computes from one (graph.py there): node influence, pruning,
the replacement and completeness scores, and the JSON its frontend (and Neuronpedia's graph viewer) loads
(utils/create_graph_files.py there).

Node order: selected features, error nodes (error[layer][position], layer-major), tokens, logits; rows are targets,
columns sources (attribution.py's docstring).

Influence: with A the adjacency of absolute values, each row normalised to sum 1, and w the logit weights (their
probabilities on the logit nodes, 0 elsewhere), a node's influence is (w A + w A² + ...)[node]: the weight of every
path from it to the logits. Pruning keeps the nodes whose influence makes up `node_threshold` of the total (tokens
and logits always), then the edges whose influence (normalised edge times its target's influence plus weight) makes
up `edge_threshold`, then drops, until nothing changes, feature and error nodes left without an outgoing edge and
features without an incoming one.
"""

import dataclasses
import json
from pathlib import Path

import torch


@dataclasses.dataclass
class Graph:
    input_tokens: torch.Tensor  # [n]
    active_features: torch.Tensor  # [A, 3] (layer, position, feature)
    activation_values: torch.Tensor  # [A]
    selected_features: torch.Tensor  # [S] indices into active_features: the feature nodes
    adjacency_matrix: torch.Tensor  # [N, N] target x source
    logit_targets: list  # [(token string, vocab index)]
    logit_probabilities: torch.Tensor  # [k]
    n_layers: int
    vocab_size: int
    input_string: str = ""
    scan: object = None

    @property
    def n_pos(self) -> int:
        return len(self.input_tokens)

    def logit_weights(self) -> torch.Tensor:
        weights = torch.zeros(self.adjacency_matrix.shape[0])
        weights[-len(self.logit_targets):] = self.logit_probabilities
        return weights

    def to_pt(self, path) -> None:
        """Save with circuit-tracer's Graph.to_pt keys (its `cfg` replaced by n_layers)."""
        torch.save({field.name: getattr(self, field.name) for field in dataclasses.fields(self)}, path)

    @classmethod
    def from_pt(cls, path) -> "Graph":
        return cls(**torch.load(path, weights_only=False))


BLOCK_ROWS = 1024  # rows of the adjacency read at a time by influence, pruning and the scores


def normalize_matrix(matrix: torch.Tensor, eps: float = 1e-10) -> torch.Tensor:
    """|matrix| with each row scaled to sum 1 (an all-zero row stays 0)."""
    absolute = matrix.abs()
    return absolute / absolute.sum(dim=1, keepdim=True).clamp(min=eps)


def influence_over_rows(blocks, weights: torch.Tensor, max_iter: int = 1000) -> torch.Tensor:
    """w Â + w Â² + ..., summed until a term is all zeros, where Â's rows that can be nonzero come from `blocks`:
    blocks(wanted) yields (node indices [k], normalised rows [k, <= len(w)]), skipping the rows whose nodes
    wanted(nodes) says carry no weight in the current term (they add nothing). One block of rows is held at a time:
    a term is one pass over the blocks (a graph has no cycles, so at most its depth of passes)."""
    width = len(weights)
    current, influence = weights, torch.zeros(width)
    for _ in range(max_iter):
        following = torch.zeros(width)
        for nodes, rows in blocks(lambda nodes: bool(current[nodes].any())):
            following[:rows.shape[1]] += current[nodes] @ rows
        if not following.any():
            return influence
        influence = influence + following
        current = following
    raise RuntimeError(f"influence did not converge in {max_iter} iterations: the graph has a cycle")


def compute_influence(A: torch.Tensor, logit_weights: torch.Tensor, max_iter: int = 1000) -> torch.Tensor:
    """w A + w A² + ..., summed until a term is all zeros (a graph has no cycles: at most depth terms)."""
    every = torch.arange(len(A))
    return influence_over_rows(lambda wanted: iter([(every, A)]), logit_weights, max_iter)


def _row_blocks(graph: Graph, transform=None):
    """blocks(wanted) over the rows of the graph's adjacency that can be nonzero (features and logits: nothing feeds
    errors and tokens), BLOCK_ROWS at a time, as float32 tensors passed through transform(nodes, rows)."""
    N, n_logits = graph.adjacency_matrix.shape[0], len(graph.logit_targets)
    ranges = [(0, len(graph.selected_features)), (N - n_logits, N)]

    def read(wanted=None):
        for start, stop in ranges:
            for i in range(start, stop, BLOCK_ROWS):
                nodes = torch.arange(i, min(i + BLOCK_ROWS, stop))
                if wanted is None or wanted(nodes):
                    rows = graph.adjacency_matrix[i:i + len(nodes)].float()
                    yield nodes, rows if transform is None else transform(nodes, rows)
    return read


def node_influence(graph: Graph) -> torch.Tensor:
    return influence_over_rows(_row_blocks(graph, lambda nodes, rows: normalize_matrix(rows)), graph.logit_weights())


def _threshold(scores: torch.Tensor, fraction: float, zeros: int = 0) -> torch.Tensor:
    """The score at which the largest scores make up `fraction` of the total, over `scores` and `zeros` more 0s
    (left out of the sort: they add nothing to the total)."""
    ordered = torch.sort(scores, descending=True).values
    cumulative = torch.cumsum(ordered, dim=0) / ordered.sum()
    index = int(torch.searchsorted(cumulative, fraction).item())
    if index < len(ordered):
        return ordered[index]
    return ordered.new_zeros(()) if zeros else ordered[-1]


@dataclasses.dataclass
class Pruned:
    node_mask: torch.Tensor  # [N] bool
    edge_mask: torch.Tensor  # [N, N] bool
    cumulative_scores: torch.Tensor  # [N] each node's place in the cumulative influence (0..1]


def prune_graph(graph: Graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> Pruned:
    """circuit-tracer's prune_graph, reading the adjacency a block of rows at a time (it may be a memory-mapped
    file): the edge scores of the rows that can be nonzero are held (features and logits: max_feature_nodes + the
    logits times N), and the masks."""
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be between 0.0 and 1.0, got {value}")
    n_tokens, n_logits, n_features = graph.n_pos, len(graph.logit_targets), len(graph.selected_features)
    N = graph.adjacency_matrix.shape[0]
    weights = graph.logit_weights()
    influence = node_influence(graph)
    node_mask = influence >= _threshold(influence, node_threshold)
    node_mask[-n_logits - n_tokens:] = True

    def pruned(nodes, rows):  # the adjacency with the rows and columns of the pruned nodes 0
        rows = rows.masked_fill(~node_mask, 0)
        rows[~node_mask[nodes]] = 0
        return normalize_matrix(rows)

    blocks = _row_blocks(graph, pruned)
    output = influence_over_rows(blocks, weights) + weights
    scored, scores = [], []
    for nodes, rows in blocks():
        scored.append(nodes)
        scores.append(rows * output[nodes, None])
    scored, scores = torch.cat(scored), torch.cat(scores)
    threshold = _threshold(scores.flatten(), edge_threshold, zeros=N * N - scores.numel())
    edge_mask = torch.full((N, N), bool(threshold <= 0))  # the rows not scored score 0
    edge_mask[scored] = scores >= threshold
    del scores
    inner = slice(0, N - n_logits - n_tokens)

    def drop_unconnected():
        node_mask[inner] &= edge_mask[:, inner].any(0)  # features and errors need an outgoing edge
        node_mask[:n_features] &= edge_mask[:n_features].any(1)  # features an incoming one

    # circuit-tracer's order: the edges are masked by the nodes only from the second round on
    before = node_mask.clone()
    drop_unconnected()
    while not torch.equal(node_mask, before):
        before = node_mask.clone()
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
        drop_unconnected()
    ordered, order = torch.sort(influence, descending=True)
    cumulative = torch.zeros_like(influence)
    cumulative[order] = torch.cumsum(ordered, dim=0) / ordered.sum()
    return Pruned(node_mask, edge_mask, cumulative)


def graph_scores(graph: Graph) -> tuple[float, float]:
    """(replacement score, completeness score), as circuit-tracer's compute_graph_scores: the share of the tokens'
    influence on the logits that does not pass through error nodes, and the influence-weighted share of every
    node's inputs that do not come from error nodes. A block of rows at a time."""
    n_features = len(graph.selected_features)
    error_end = n_features + graph.n_pos * graph.n_layers
    token_end = error_end + graph.n_pos
    weights = graph.logit_weights()
    blocks = _row_blocks(graph, lambda nodes, rows: normalize_matrix(rows))
    influence = influence_over_rows(blocks, weights)
    token, error = influence[error_end:token_end].sum(), influence[n_features:error_end].sum()
    replacement = token / (token + error)
    non_error = torch.ones(len(weights))  # a row that is all 0 has no input from errors
    for nodes, normalized in blocks():
        non_error[nodes] = 1 - normalized[:, n_features:error_end].sum(dim=-1)
    output = influence + weights
    completeness = (non_error * output).sum() / output.sum()
    return replacement.item(), completeness.item()


# ---- circuit-tracer's frontend files -------------------------------------------------------------------------------


def _cantor(x: int, y: int) -> int:
    return (x + y) * (x + y + 1) // 2 + y


def frontend_nodes(graph: Graph, pruned: Pruned) -> dict[int, dict]:
    """Node index -> the frontend's node dict, for the nodes pruning kept (create_graph_files' create_nodes)."""
    nodes = {}
    n_features = len(graph.selected_features)
    error_end = n_features + graph.n_pos * graph.n_layers
    token_end = error_end + graph.n_pos
    scores = pruned.cumulative_scores
    for index in pruned.node_mask.nonzero()[:, 0].tolist():
        influence = scores[index].item()
        if index < n_features:
            feature = graph.selected_features[index]
            layer, pos, feat = graph.active_features[feature].tolist()
            nodes[index] = _node(f"{layer}_{feat}_{pos}", _cantor(layer, feat), str(layer), pos,
                                 "cross layer transcoder", f"{layer}_{feat}-0", influence=influence,
                                 activation=graph.activation_values[feature].item())
        elif index < error_end:
            layer, pos = divmod(index - n_features, graph.n_pos)
            nodes[index] = _node(f"0_{layer}_{pos}", -1, str(layer), pos, "mlp reconstruction error",
                                 f"{layer}_{pos}-0", influence=influence)
        elif index < token_end:
            pos = index - error_end
            token = int(graph.input_tokens[pos])
            nodes[index] = _node(f"E_{token}_{pos}", pos, "E", pos, "embedding", f"E_{token}-{pos}",
                                 influence=influence)
        else:
            j = index - token_end
            token, vocab_idx = graph.logit_targets[j]
            prob = graph.logit_probabilities[j].item()
            layer = str(graph.n_layers + 1)
            nodes[index] = _node(f"{layer}_{vocab_idx}_{graph.n_pos - 1}", vocab_idx, layer, graph.n_pos - 1,
                                 "logit", f"L_{vocab_idx}-{graph.n_pos - 1}", token_prob=prob,
                                 is_target_logit=j == 0, clerp=f'Output "{token}" (p={prob:.3f})')
    return nodes


def shown_subgraph(graph: Graph, pruned: Pruned) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a pruned graph shows, as circuit-tracer's frontend files do: (node mask, edge targets, edge sources).
    The edges are those pruning kept between nodes it kept (row-major: by target, then source); the nodes those
    with one of these edges, and every token and logit."""
    kept = pruned.node_mask
    targets, sources = (pruned.edge_mask & kept[:, None] & kept[None, :]).nonzero(as_tuple=True)
    shown = torch.zeros_like(kept)
    shown[targets] = True
    shown[sources] = True
    shown[-len(graph.logit_targets) - graph.n_pos:] = True
    return shown & kept, targets, sources


def _node(node_id, feature, layer, ctx_idx, feature_type, js_id, *, token_prob=0.0, is_target_logit=False,
          clerp="", influence=None, activation=None) -> dict:
    return {"node_id": node_id, "feature": feature, "layer": layer, "ctx_idx": ctx_idx,
            "feature_type": feature_type, "token_prob": token_prob, "is_target_logit": is_target_logit,
            "run_idx": 0, "reverse_ctx_idx": 0, "jsNodeId": js_id, "clerp": clerp, "influence": influence,
            "activation": activation}


def frontend_json(graph: Graph, slug: str, *, scan=None, node_threshold: float = 0.8, edge_threshold: float = 0.98,
                  decode=None, pruned: Pruned | None = None) -> dict:
    """The graph file circuit-tracer's create_graph_files writes as {slug}.json (pruned at the thresholds).
    `decode(token_id) -> str` for the prompt's tokens (circuit-tracer decodes each with the model's tokenizer).
    `pruned`: prune_graph(graph, node_threshold, edge_threshold) where the caller has it already (pruning reads the
    whole adjacency)."""
    scan = scan if scan is not None else graph.scan
    if scan is None:
        raise ValueError("the graph names no scan (the transcoder set's `scan` in its config.yaml): give scan=, "
                         "the frontend needs it to know which transcoders made the graph")
    pruned = pruned if pruned is not None else prune_graph(graph, node_threshold, edge_threshold)
    nodes = frontend_nodes(graph, pruned)
    shown, targets, sources = shown_subgraph(graph, pruned)
    weights = graph.adjacency_matrix[targets, sources].tolist()
    links = [{"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": w}
             for s, t, w in zip(sources.tolist(), targets.tolist(), weights)]
    used = [nodes[index] for index in shown.nonzero()[:, 0].tolist()]
    transcoder_list = []
    if isinstance(scan, list):
        transcoder_list, scan = scan, "custom-" + str(hash("-".join(scan)))
    decode = decode or (lambda token: str(token))
    metadata = {"slug": slug, "scan": scan, "transcoder_list": transcoder_list,
                "prompt_tokens": [decode(int(t)) for t in graph.input_tokens], "prompt": graph.input_string,
                "node_threshold": node_threshold, "schema_version": 1}
    return {"metadata": metadata,
            "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""},
            "nodes": used, "links": links}


def write_frontend_files(graph: Graph, slug: str, directory, **options) -> Path:
    """{slug}.json and graph-metadata.json (the list of graphs, this one's entry replaced) in `directory`, as
    create_graph_files writes them; each file written whole, then moved into place."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = frontend_json(graph, slug, **options)
    target = directory / f"{slug}.json"
    _write_whole(target, json.dumps(data, indent=2))
    index = directory / "graph-metadata.json"
    listed = json.loads(index.read_text()) if index.exists() else {"graphs": []}
    listed["graphs"] = [g for g in listed.get("graphs", []) if g.get("slug") != slug] + [data["metadata"]]
    _write_whole(index, json.dumps(listed, indent=2))
    return target


def _write_whole(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)
