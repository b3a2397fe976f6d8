"""Attribution graphs (Ameisen et al. 2025, "Circuit Tracing"): the direct, linear effects between active transcoder
features, error nodes, input tokens and the top output logits of one prompt, number for number with circuit-tracer
0.5.0's `attribute`.

    graph = attribute(model, transcoders, input_ids)          # input_ids: [n], position 0 a BOS-like token
    graph.adjacency_matrix[target, source]                     # circuit-tracer's node order (below)

**The local replacement model.** For this prompt every attention pattern (`attn.probs`) and every norm's divisor
(`scale`, each Norm module's) is frozen at its value, and each layer's MLP output (the transcoders' output hook) is
replaced by the transcoders' reconstruction plus an error term, a constant: the output hook passes on the model's
own tensor, with a gradient only through the skip connection (linear in the MLP's input), none without one. What is
left is linear in the residual stream. A LayerNorm's centring is linear, so it stays (TransformerLens computes it so,
and so does circuit-tracer); biases, a GPT-2's position embeddings and the transcoders' b_dec are constants with no
node. Position 0 (the BOS token circuit-tracer prepends) has no features and a zero error, as circuit-tracer does:
its MLP output is a constant there.

**Edges.** A target node reads the stream through a vector: a feature its encoder row W_enc[i] at its layer's input
hook and position, a logit the demeaned unembedding column (W_U[:, t] - mean over the vocabulary) at the final
norm's output (`ln_f`) of the last position. The gradient of that read with respect to each source's write (a
feature's activation times its decoder row at every output hook it writes, an error vector, a token's embedding at
the embedding hook TransformerLens calls hook_embed) is the edge. Rows are computed `batch_size` targets at a time:
one forward pass of the prompt (once, not repeated per target as circuit-tracer repeats it), and per batch one
backward pass vectorised over the targets (torch.autograd.grad with is_grads_batched), so the activations the
backward pass reads are held once.

**Node order** (circuit-tracer's Graph): the selected features (in the order of `active_features`: layer, position,
feature index), then error nodes (layer-major: error[layer][position]), then tokens, then logits. Rows are targets
and columns sources. Rows of errors and tokens are 0 (nothing feeds them).

**Targets.** `attribution_targets=None`: the most probable next tokens, until their cumulative probability reaches
`desired_logit_prob`, at most `max_n_logits`; token ids; token strings (each one token of the model's tokenizer);
or (label, weight, vector) tuples: any direction in the final norm's output (a logit difference: W_U[:, a] -
W_U[:, b]), used as given (token targets are demeaned over the vocabulary, as circuit-tracer does).

**max_feature_nodes**: as circuit-tracer, the logit rows first, then features in batches, ranked again every
`update_interval` batches by their influence on the logits through the rows computed so far.

**Long prompts.** No matrix that grows with the number of active features squared, or with max_feature_nodes times
it, is held. Each batch of rows goes to disk as it is computed (rows.py: `rows_dir=`, or a temporary directory), and
the influence-ranked visit reads them back a batch at a time for each ranking (graph.influence_over_rows: the same
series circuit-tracer sums, a matrix-vector product per term, summed over the batches). A backward pass's working
set stays under GRADIENT_BYTES: a batch's targets go through in groups (at least one target, whose gradients are
(layers + 1) x tokens x hidden floats), and the decoder vectors are gathered GATHER_BYTES at a time (never one [h]
vector per active feature held). What grows with the prompt: a batch's rows (batch_size x every active feature,
float32), the active features' indices, the forward pass kept for the backward passes, and the graph
itself: its adjacency [N, N] over the kept nodes (max_feature_nodes + (n_layers + 1) x n + logits), in memory or
memory-mapped from the .npy file `rows_to` (written from the stored rows at the end). Pruning and influence read it
a block of rows at a time (graph.py). `rows_dir` also makes a run resumable: the same call continues from the rows
there, bitwise (rows.py).
"""

import contextlib
import dataclasses
import tempfile
from collections.abc import Sequence

import torch

from ..corpus.plan import how_it_rounds
from ..parts.norms import Norm
from .graph import Graph, influence_over_rows
from .rows import RowsError, RowStore, digest
from .transcoders import Transcoders


@dataclasses.dataclass
class Prepared:
    """What one forward pass of the prompt gives: the active features and the vectors of every node."""

    input_ids: torch.Tensor  # [n]
    logits: torch.Tensor  # [V] at the last position
    active_features: torch.Tensor  # [A, 3] (layer, position, feature), lexicographic
    activation_values: torch.Tensor  # [A]
    # one entry per (active feature, output layer it writes): which feature, the output layer, the position (its
    # vector, the decoder row times the activation, is gathered when a batch of rows needs it: held for every entry
    # it would be A x h floats, as large as the rows of a few hundred targets on a long prompt)
    decoder_feature: torch.Tensor  # [D]
    decoder_layer: torch.Tensor  # [D]
    decoder_pos: torch.Tensor  # [D]
    errors: torch.Tensor  # [L, n, h]
    token_vectors: torch.Tensor  # [n, h]

    def encoder_vectors(self, transcoders: Transcoders, chosen: torch.Tensor) -> torch.Tensor:
        """[k, h] the W_enc rows of active features `chosen`."""
        layer, feature = self.active_features[chosen, 0], self.active_features[chosen, 2]
        out = transcoders.W_enc[0].new_empty(len(chosen), transcoders.d_model)
        for l in layer.unique().tolist():
            at = layer == l
            out[at] = transcoders.W_enc[l][feature[at]]
        return out

    def decoder_vectors(self, transcoders: Transcoders, entries: torch.Tensor) -> torch.Tensor:
        """[k, h] what decoder `entries` write: each one's decoder row into its output layer times the activation."""
        features = self.decoder_feature[entries]
        source, feature = self.active_features[features, 0], self.active_features[features, 2]
        target = self.decoder_layer[entries]
        out = transcoders.W_enc[0].new_empty(len(entries), transcoders.d_model)
        for s, m in torch.stack([source, target], 1).unique(dim=0).tolist():
            at = (source == s) & (target == m)
            out[at] = transcoders.decoder(s, m)[feature[at]] * self.activation_values[features[at]][:, None]
        return out


# at most this much of gradients and their cotangents per backward pass (see _Rows.__call__): the working set of
# a batch of rows grows with the prompt's length, so a long prompt's batch goes through in groups
GRADIENT_BYTES = 2 ** 29
GATHER_BYTES = 2 ** 27  # at most this much of gradients gathered at the decoder entries' positions at once


def frozen_points(model) -> tuple[list[str], list[str]]:
    """(every norm's divisor point, every attention pattern point) of `model`: what the local replacement model
    freezes. The norms are found as modules (each family's, q/k norms too), the patterns by their name."""
    points = model.hook_points()
    by_point = {id(point): name for name, point in points.items()}
    scales = [by_point[id(m.scale)] for m in model.modules() if isinstance(m, Norm)]
    return scales, [name for name in points if name.endswith("attn.probs")]


class ReplacementModel:
    """The model and its transcoders, with the hook names the attribution reads and writes."""

    def __init__(self, model, transcoders: Transcoders, *, zero_positions: slice = slice(0, 1)):
        if not model.family.causal:
            raise ValueError(f"attribution graphs explain the next token of a causal language model; "
                             f"{model.family.title} is not one")
        if getattr(model, "lm_head", None) is None and not hasattr(model, "output_embeddings"):
            raise ValueError(f"{type(model).__name__} has no LM head: load the checkpoint as "
                             f"{model.family.lm.__name__}")
        self.model, self.transcoders = model, transcoders
        self.inputs, self.outputs = transcoders.sites(model)
        self.n_layers = transcoders.n_layers
        self.zero_positions = zero_positions
        lens = model.lens_names()
        self.embed = lens["hook_embed"].source if "hook_embed" in lens else "embeddings.out"
        self.final = "ln_f"
        scales, patterns = frozen_points(model)
        self.frozen = scales + patterns
        self.unembedding = model.family.stream(model).unembedding()  # [V, h]

    @torch.no_grad()
    def prepare(self, input_ids: torch.Tensor) -> Prepared:
        """One forward pass: the transcoders' activations at every layer (none at the zeroed positions), the
        error of each layer's reconstruction, the token vectors and the logits. Activations are kept sparse (a
        layer's dense [n, f] lives only while it is encoded), and the reconstruction is the sum of the active
        features' scaled decoder rows, as circuit-tracer decodes."""
        tc, n_layers = self.transcoders, self.n_layers
        seen: dict[str, torch.Tensor] = {}

        def keep(x, name):
            seen[name] = x

        names = set(self.inputs) | set(self.outputs) | {self.embed}
        with self.model.hooks([(lambda name: name in names, keep)]):
            out = self.model(input_ids=input_ids[None])
        xs = [seen[name][0].to(tc.dtype) for name in self.inputs]
        active, values = [], []
        for l in range(n_layers):
            acts = tc.encode(l, xs[l])
            acts[self.zero_positions] = 0
            found = acts.nonzero()  # [k, 2] (position, feature), in order
            active.append(torch.cat([torch.full_like(found[:, :1], l), found], dim=1))
            values.append(acts[found[:, 0], found[:, 1]])
        active_features, activation_values = torch.cat(active), torch.cat(values)
        start = torch.tensor([0, *torch.tensor([len(a) for a in active]).cumsum(0).tolist()])
        feature, layer, pos = [], [], []
        errors = torch.zeros(n_layers, len(input_ids), tc.d_model, dtype=tc.dtype, device=xs[0].device)
        for m in range(n_layers):  # entries by output layer, each source layer's in feature order
            recons = torch.zeros_like(errors[m])
            for source in range(m + 1):
                if m not in tc.writes(source) or not len(active[source]):
                    continue
                scaled = tc.decoder(source, m)[active[source][:, 2]] * values[source][:, None]
                recons.index_add_(0, active[source][:, 1], scaled)
                feature.append(torch.arange(start[source], start[source + 1], device=scaled.device))
                layer.append(torch.full_like(feature[-1], m))
                pos.append(active[source][:, 1])
            skip = tc.skip(m, xs[m])
            recons = recons + tc.b_dec[m] if skip is None else recons + skip + tc.b_dec[m]
            errors[m] = seen[self.outputs[m]][0].to(tc.dtype) - recons
        errors[:, self.zero_positions] = 0
        none = torch.zeros(0, dtype=torch.long)
        cat = (lambda parts, empty: torch.cat(parts) if parts else empty)
        return Prepared(input_ids, out.logits[0, -1], active_features, activation_values, cat(feature, none),
                        cat(layer, none), cat(pos, none), errors, seen[self.embed][0].to(tc.dtype))

    def linear_pass(self, input_ids: torch.Tensor):
        """The forward pass of the local replacement model on the prompt, with the graph kept: (the input hook's
        tensor per layer, the output hook's per layer, the embedding's, the final norm's, the number of elements of
        the largest frozen tensor: a batched backward pass may hold a copy of it per target)."""
        tc = self.transcoders
        inputs, outputs = {}, {}
        held = {}
        by_input = {name: l for l, name in enumerate(self.inputs)}
        by_output = {name: l for l, name in enumerate(self.outputs)}
        frozen = set(self.frozen)

        def detach(x, name):
            held["largest"] = max(held.get("largest", 0), x.numel())
            return x.detach()

        def read_input(x, name):
            inputs[by_input[name]] = x

        def replace_output(x, name):
            l = by_output[name]
            skip = tc.skip(l, inputs[l])
            if skip is None:
                y = x.detach().requires_grad_(True)
            else:
                skip = skip.to(x.dtype)
                y = skip + (x - skip).detach()
            outputs[l] = y
            return y

        def embed(x, name):
            held["embed"] = x.detach().requires_grad_(True)
            return held["embed"]

        def final(x, name):
            held["final"] = x

        hooks = [(lambda name: name in frozen, detach), (lambda name: name in by_input, read_input),
                 (lambda name: name in by_output, replace_output), (self.embed, embed), (self.final, final)]
        with torch.enable_grad(), self.model.hooks(hooks):
            self.model(input_ids=input_ids[None])
        return ([inputs[l] for l in range(self.n_layers)], [outputs[l] for l in range(self.n_layers)],
                held["embed"], held["final"], held.get("largest", 0))


class _Rows:
    """Computes attribution rows for batches of targets on one kept forward pass."""

    def __init__(self, replacement: ReplacementModel, prepared: Prepared):
        self.r, self.p = replacement, prepared
        self.inputs, self.outputs, self.embed, self.final, self.largest_frozen = replacement.linear_pass(
            prepared.input_ids)
        n_layers, n = replacement.n_layers, len(prepared.input_ids)
        self.n_active = len(prepared.active_features)
        self.width = self.n_active + (n_layers + 1) * n

    def __call__(self, layers: torch.Tensor, positions: torch.Tensor, vectors: torch.Tensor) -> torch.Tensor:
        """[k, width] rows for k targets: target j reads the stream at layer layers[j] (n_layers: the
        final norm's output) and position positions[j] through vectors[j]. The backward pass returns a gradient
        [n, h] per target at every output hook and the embedding at once (and the vectorised backward pass of
        `pattern @ values` expands the frozen pattern per target), so targets go through it in groups that keep
        those under GRADIENT_BYTES (the rows are the same whatever the grouping)."""
        n, h = self.embed.shape[-2:]
        # gradients and cotangents at every layer, and the frozen attention pattern a batched matmul expands
        per_target = (2 * (self.r.n_layers + 1) * n * h + self.largest_frozen) * self.embed.element_size()
        group = max(1, GRADIENT_BYTES // per_target)
        rows = torch.zeros(len(layers), self.width, dtype=self.r.transcoders.dtype, device=vectors.device)
        for start in range(0, len(layers), group):
            part = slice(start, start + group)
            self._fill(rows[part], layers[part], positions[part], vectors[part])
        return rows

    def _fill(self, rows: torch.Tensor, layers: torch.Tensor, positions: torch.Tensor, vectors: torch.Tensor):
        """One backward pass for k targets, their rows added into `rows` [k, width] (zeros)."""
        k, h = len(layers), self.embed.shape[-1]
        n_layers, p = self.r.n_layers, self.p
        outs, grads = [], []
        for layer in layers.unique().tolist():
            tensor = self.final if layer == n_layers else self.inputs[layer]
            grad = tensor.new_zeros(k, *tensor.shape)  # [k, 1, n, h]: one cotangent per target
            chosen = (layers == layer).nonzero()[:, 0]
            grad[chosen, 0, positions[chosen]] = vectors[chosen].to(grad.dtype)
            outs.append(tensor)
            grads.append(grad)
        top = int(layers.max())
        sources = [self.outputs[l] for l in range(min(top, n_layers))]
        got = torch.autograd.grad(outs, [*sources, self.embed], grads, retain_graph=True, allow_unused=True,
                                  is_grads_batched=True)
        *out_grads, embed_grad = [None if g is None else g[:, 0] for g in got]
        dtype = rows.dtype
        n = len(p.input_ids)
        gathered = max(1, GATHER_BYTES // (k * h * rows.element_size()))
        for m, g in enumerate(out_grads):
            if g is None:
                continue
            g = g.to(dtype)
            for at in (p.decoder_layer == m).nonzero()[:, 0].split(gathered):
                contributions = torch.einsum("bkh,kh->bk", g[:, p.decoder_pos[at]],
                                             p.decoder_vectors(self.r.transcoders, at))
                rows.index_add_(1, p.decoder_feature[at], contributions)
            start = self.n_active + m * n
            rows[:, start:start + n] = torch.einsum("bnh,nh->bn", g, p.errors[m])
        if embed_grad is not None:
            start = self.n_active + n_layers * n
            rows[:, start:start + n] = torch.einsum("bnh,nh->bn", embed_grad.to(dtype), p.token_vectors)


def decode(model, ids: list[int]) -> str:
    """The text of token ids through the model's tokenizer, or "" where the checkpoint has none."""
    from ..registry.tokenizer import NoTokenizerJson

    tokenizer = getattr(model, "tokenizer", None)
    try:
        return tokenizer.decode(ids) if tokenizer is not None else ""
    except NoTokenizerJson:
        return ""


@dataclasses.dataclass
class Targets:
    labels: list  # (token string, vocab index; a virtual index vocab_size + j for a custom direction)
    probabilities: torch.Tensor  # [k]
    vectors: torch.Tensor  # [k, h]


def logit_targets(replacement: ReplacementModel, logits: torch.Tensor, attribution_targets, *, max_n_logits: int,
                  desired_logit_prob: float, decode=None) -> Targets:
    """circuit-tracer's AttributionTargets: salient logits, chosen token ids, or custom (label, weight, vector)."""
    W = replacement.unembedding  # [V, h]
    vocab = logits.shape[-1]
    decode = decode or (lambda i: "")
    probs = torch.softmax(logits, dim=-1)
    if attribution_targets is None:
        if not 0 < desired_logit_prob <= 1:
            raise ValueError(f"desired_logit_prob must be in (0, 1], got {desired_logit_prob}")
        if max_n_logits < 1:
            raise ValueError(f"max_n_logits must be at least 1, got {max_n_logits}")
        top_p, top_idx = torch.topk(probs, min(max_n_logits, vocab))
        cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), desired_logit_prob)) + 1
        indices = top_idx[:cutoff]
    elif isinstance(attribution_targets, torch.Tensor) or (
            isinstance(attribution_targets, Sequence) and attribution_targets
            and all(isinstance(t, int) for t in attribution_targets)):
        indices = torch.as_tensor(attribution_targets, dtype=torch.long).reshape(-1)
        bad = indices[(indices < 0) | (indices >= vocab)]
        if len(bad) or not len(indices):
            raise ValueError(f"attribution targets must be token ids in [0, {vocab}); got {bad.tolist() or 'none'}")
    elif isinstance(attribution_targets, Sequence) and attribution_targets and all(
            isinstance(t, str) for t in attribution_targets):
        return logit_targets(replacement, logits, torch.tensor([_one_token(replacement.model, t)
                                                                for t in attribution_targets]),
                             max_n_logits=max_n_logits, desired_logit_prob=desired_logit_prob, decode=decode)
    elif isinstance(attribution_targets, Sequence) and attribution_targets:
        labels, weights, vectors = [], [], []
        for j, target in enumerate(attribution_targets):
            if not (isinstance(target, tuple) and len(target) == 3 and isinstance(target[0], str)
                    and isinstance(target[1], (int, float)) and isinstance(target[2], torch.Tensor)):
                raise TypeError(f"attribution target {j}: a custom target is (label: str, weight: float, "
                                f"vector: Tensor [{W.shape[1]}]), got {target!r}")
            if target[2].shape != (W.shape[1],):
                raise ValueError(f"attribution target {j} ({target[0]!r}): vector of shape {list(target[2].shape)}; "
                                 f"the final norm's output has {W.shape[1]} dimensions")
            labels.append((target[0], vocab + j))
            weights.append(float(target[1]))
            vectors.append(target[2])
        return Targets(labels, torch.tensor(weights), torch.stack(vectors).to(W.dtype))
    else:
        raise TypeError("attribution_targets: None, token ids, or (label, weight, vector) tuples; got "
                        f"{attribution_targets!r}")
    vectors = W[indices] - W.mean(dim=0, keepdim=True)
    return Targets([(decode(i), i) for i in indices.tolist()], probs[indices], vectors)


def _one_token(model, text: str) -> int:
    """The id of the one token `text` is (without special tokens); a ValueError otherwise."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(f"attribution target {text!r}: the model has no tokenizer; give token ids")
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if len(ids) != 1:
        raise ValueError(f"attribution target {text!r} is {len(ids)} tokens ({ids}); each string must be one token")
    return ids[0]


def attribute(model, transcoders: Transcoders, input_ids, *, attribution_targets=None, max_n_logits: int = 10,
              desired_logit_prob: float = 0.95, batch_size: int = 512, max_feature_nodes: int | None = None,
              update_interval: int = 4, zero_positions: slice = slice(0, 1), rows_to=None, rows_dir=None,
              identity: dict | None = None, progress=None) -> Graph:
    """The attribution graph of `input_ids` ([n] token ids, position 0 the BOS-like token circuit-tracer prepends:
    it gets no features) under `transcoders`; see the module's docstring. `rows_to`: a path for the adjacency matrix
    (a float32 numpy memmap .npy), instead of memory. `rows_dir`: a directory that keeps the rows as they are
    computed (rows.py): a rerun with the same arguments continues from them, and one with others is refused naming
    what differs; `identity`: what else names the run there (the command line's model and transcoders), JSON values.
    Without rows_dir they go to a temporary directory, removed at the end. `progress(done, total)`: called after each
    batch of feature rows. `zero_positions`: the positions given no features and no error (circuit-tracer's: the
    BOS); slice(0, 0) gives every position its nodes, so each row sums to what its target reads."""
    input_ids = torch.as_tensor(input_ids).reshape(-1)
    if input_ids.ndim != 1 or len(input_ids) < 2:
        raise ValueError(f"attribute takes one prompt of at least 2 token ids (a BOS-like token first), "
                         f"got {len(input_ids)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    vocab = model.config.vocab_size
    bad = input_ids[(input_ids < 0) | (input_ids >= vocab)]
    if len(bad):
        raise ValueError(f"token ids {bad.tolist()} are outside the vocabulary [0, {vocab})")
    model.family.check_length(model.config, len(input_ids), "the prompt")
    replacement = ReplacementModel(model, transcoders, zero_positions=zero_positions)
    was_training, requires = model.training, [p.requires_grad for p in model.parameters()]
    model.eval().requires_grad_(False)
    try:
        prepared = replacement.prepare(input_ids)
        targets = logit_targets(replacement, prepared.logits, attribution_targets, max_n_logits=max_n_logits,
                                desired_logit_prob=desired_logit_prob, decode=lambda i: decode(model, [i]))
        settings = {**(identity or {}), "input_ids": input_ids.tolist(),
                    "targets": [index for _, index in targets.labels],
                    "max_feature_nodes": max_feature_nodes, "batch_size": batch_size,
                    "update_interval": update_interval, "zero_positions": [zero_positions.start, zero_positions.stop],
                    "dtype": str(transcoders.dtype), **how_it_rounds(input_ids.device, torch.get_num_threads()),
                    # the forward pass's numbers: other weights (or a run that rounds otherwise) give other rows
                    "forward pass (digest)": digest(prepared.active_features, prepared.activation_values,
                                                    prepared.logits, targets.vectors, targets.probabilities)}
        with (contextlib.nullcontext(rows_dir) if rows_dir is not None
              else tempfile.TemporaryDirectory(prefix="attribution-rows-")) as directory:
            store = RowStore(directory, settings)
            graph = _build(replacement, prepared, targets, store, batch_size, max_feature_nodes, update_interval,
                           rows_to, progress)
        graph.input_string = decode(model, input_ids.tolist())
        return graph
    finally:
        model.train(was_training)
        for p, r in zip(model.parameters(), requires):
            p.requires_grad_(r)


def _build(replacement, prepared, targets, store, batch_size, max_feature_nodes, update_interval, rows_to, progress):
    """The rows, a batch at a time into `store` (read back from it where a killed run left them), then the adjacency
    from the stored rows. max_feature_nodes below the number active: circuit-tracer's influence-ranked visit, the
    logit rows first, then features in batches ranked again every `update_interval` batches by their influence on
    the logits through the rows stored so far (graph.influence_over_rows, a batch read at a time)."""
    n_layers, n = replacement.n_layers, len(prepared.input_ids)
    total_active = len(prepared.active_features)
    logit_offset = total_active + (n_layers + 1) * n
    n_logits = len(targets.labels)
    max_feature_nodes = min(max_feature_nodes or total_active, total_active)
    rows = _Rows(replacement, prepared)
    layers, positions = prepared.active_features[:, 0], prepared.active_features[:, 1]
    dtype = replacement.transcoders.dtype
    batches = 0

    def visit(nodes, compute):
        nonlocal batches
        if batches < len(store):
            if not torch.equal(store.nodes(batches), nodes.cpu()):  # the settings and numbers matched: a bug
                raise RowsError(f"{store.directory}: batch {batches} holds the rows of other nodes than this run "
                                f"visits; delete {store.directory} to start again")
        else:
            store.append(nodes, compute())
        batches += 1

    for i in range(0, n_logits, batch_size):
        vectors = targets.vectors[i:i + batch_size].to(dtype)
        k = len(vectors)
        visit(torch.arange(i, i + k) + logit_offset,
              lambda: rows(torch.full((k,), n_layers), torch.full((k,), n - 1), vectors).float())
    weights = torch.zeros(logit_offset + n_logits)
    weights[logit_offset:] = targets.probabilities.float()
    visited, done = torch.zeros(total_active, dtype=torch.bool), 0
    while done < max_feature_nodes:
        if max_feature_nodes == total_active:  # every feature, in order
            chosen = torch.arange(total_active)
        else:
            blocks = store.blocks(batches)
            influence = influence_over_rows(lambda wanted: ((nodes, _normalized(block))
                                                            for nodes, block in blocks(wanted)),
                                            weights, max_iter=128)
            rank = torch.argsort(influence[:total_active], descending=True)
            chosen = rank[~visited[rank]][:min(update_interval * batch_size, max_feature_nodes - done)]
        for part in chosen.split(batch_size):
            visit(part, lambda: rows(layers[part], positions[part], prepared.encoder_vectors(
                replacement.transcoders, part)).float())
            visited[part] = True
            done += len(part)
            if progress is not None:
                progress(done, max_feature_nodes)
    selected = visited.nonzero()[:, 0]
    keep = torch.cat([selected, torch.arange(total_active, logit_offset)])  # the columns of the graph's nodes
    size = len(keep) + n_logits
    adjacency = _storage(size, rows_to)
    for batch in range(batches):
        nodes, block = store.nodes(batch), store.rows(batch)
        at = torch.where(nodes < total_active, torch.searchsorted(selected, nodes), nodes - logit_offset + len(keep))
        adjacency[at, :len(keep)] = block[:, keep]
    return Graph(input_tokens=prepared.input_ids.cpu(), active_features=prepared.active_features.cpu(),
                 activation_values=prepared.activation_values.float().cpu(), selected_features=selected,
                 adjacency_matrix=adjacency, logit_targets=targets.labels,
                 logit_probabilities=targets.probabilities.float().cpu(), n_layers=n_layers,
                 vocab_size=replacement.model.config.vocab_size, scan=replacement.transcoders.cfg.scan)


def _normalized(rows: torch.Tensor) -> torch.Tensor:
    """graph.normalize_matrix with circuit-tracer's eps for the partial influences, in place (the rows read from
    disk are ours: no second copy of a batch)."""
    rows.abs_()
    return rows.div_(rows.sum(dim=1, keepdim=True).clamp(min=1e-8))


def _storage(size: int, rows_to) -> torch.Tensor:
    """A zero [size, size] float32 matrix in memory, or backed by the .npy file `rows_to` (written as rows come)."""
    if rows_to is None:
        return torch.zeros(size, size)
    import numpy as np

    return torch.from_numpy(np.lib.format.open_memmap(rows_to, mode="w+", dtype=np.float32, shape=(size, size)))
