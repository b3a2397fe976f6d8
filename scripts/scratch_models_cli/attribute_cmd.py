"""`scratch-models attribute`: the attribution graph of one prompt (scratch_models.circuits), as circuit-tracer
writes it.

    scratch-models attribute MODEL TRANSCODERS "The capital of France is" --out graphs/
    scratch-models attribute MODEL TRANSCODERS --ids 2,300,41,77 --out graphs/

TRANSCODERS: a directory in circuit-tracer's layout (config.yaml + its files) or a hub id of one. The prompt gets a
BOS-like token in front where its first token is not special, as circuit-tracer's ensure_tokenized does. OUT gets
graph.pt, circuit-tracer's frontend files ({slug}.json, graph-metadata.json), graph.html (our offline page of the
pruned graph: scratch_models.views.graph_page; a feature's top corpus contexts from `--features` runs) and
summary.json (the replacement and completeness scores, the logit targets, the counts), each written whole and moved
into place together at the end;
a directory another command is writing into is refused (the command line takes OUT's lock, and makes OUT, before
the model loads).

Resumable: the rows go to OUT/.attribute-partial/rows a batch at a time as they are computed (circuits/rows.py),
and the adjacency to a memory-mapped file beside them. Killed at any moment, the same command continues from the
rows there and writes the graph an uninterrupted run writes, bitwise; a rerun with another model, transcoders,
prompt or setting that decides the rows is refused naming each that differs (the pruning thresholds and --slug
do not decide them: they may change). The partial directory goes once the files are in place.
"""

import json
import shutil
import sys
import time
from pathlib import Path

SUMMARY, GRAPH, PAGE = "summary.json", "graph.pt", "graph.html"
PARTIAL = ".attribute-partial"  # in OUT: the rows of a run not yet finished, and the files staged before their move


def add_parser(commands, model_help: str) -> None:
    p = commands.add_parser("attribute", help="the attribution graph of a prompt through transcoders, as "
                                              "circuit-tracer computes and writes it",
                            description="Replace each MLP of a causal LM by its transcoders (with error nodes), "
                                        "freeze attention and norms for the prompt, and write every direct linear "
                                        "effect between active features, errors, tokens and the top logits: "
                                        "graph.pt, circuit-tracer's frontend JSON and a summary with the "
                                        "replacement and completeness scores.")
    p.add_argument("model", help=model_help)
    p.add_argument("transcoders", help="a transcoder set in circuit-tracer's layout: a directory (config.yaml + "
                                       "layer_{i}.safetensors, or W_enc_{i}/W_dec_{i} for a cross-layer set) or a "
                                       "hub id")
    p.add_argument("prompt", nargs="?", help="the prompt as text (or give --ids)")
    p.add_argument("--ids", help="the prompt as token ids, comma-separated (300,41,77)")
    p.add_argument("--out", required=True, help="directory for the graph, the frontend files and the summary")
    p.add_argument("--slug", default="graph", help="the graph's name in the frontend files (default: graph)")
    p.add_argument("--max-n-logits", type=int, default=10, help="at most this many logit targets")
    p.add_argument("--desired-logit-prob", type=float, default=0.95,
                   help="logit targets until their cumulative probability reaches this")
    p.add_argument("--max-feature-nodes", type=int, help="at most this many features, the most influential")
    p.add_argument("--batch-size", type=int, default=256, help="attribution rows per backward pass")
    p.add_argument("--node-threshold", type=float, default=0.8, help="pruning: the share of influence nodes keep")
    p.add_argument("--edge-threshold", type=float, default=0.98, help="pruning: the share of influence edges keep")
    p.add_argument("--features", action="append", default=[], metavar="DIR",
                   help="a `scratch-models features` run of one layer's transcoder (reading its input hook), or a "
                        "directory of such runs: graph.html shows its features' top corpus contexts and links their "
                        "pages (repeatable)")
    p.add_argument("--zero-positions", type=int,
                   help="the first N positions get no features and no error (default: 1, the BOS; 4 for a Gemma 3 "
                        "-it model, its chat prefix, as circuit-tracer decides by the model's name)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def zero_positions_for(source: str) -> int:
    """How many first positions circuit-tracer gives no features for a model named `source`: Gemma Scope 2's -it
    transcoders were trained without the chat prefix <bos><start_of_turn>user\\n, so a Gemma 3 -it model's first
    four; else the BOS alone."""
    name = str(source).rstrip("/")
    return 4 if "gemma-3" in name and name.endswith("-it") else 1


def run(args) -> int:
    import torch

    from scratch_models.circuits import attribute, graph_scores, load_transcoders, prune_graph, write_frontend_files
    from scratch_models.circuits.attribution import decode
    from scratch_models.views.graph_page import GraphPage

    from .common import at_least_one, check_writable_directory, open_model, require_device

    at_least_one("--batch-size", args.batch_size)
    at_least_one("--max-n-logits", args.max_n_logits)
    at_least_one("--max-feature-nodes", args.max_feature_nodes)
    at_least_one("--zero-positions", args.zero_positions)
    for flag, value in (("--node-threshold", args.node_threshold), ("--edge-threshold", args.edge_threshold),
                        ("--desired-logit-prob", args.desired_logit_prob)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{flag} must be between 0 and 1, got {value}")
    if (args.prompt is None) == (args.ids is None):
        raise ValueError("give the prompt as text or as --ids, one of them")
    require_device(args.device)
    check_writable_directory("--out", args.out)
    opened = open_model(args.model)
    family = opened.family
    if not family.causal:
        raise ValueError(f"{opened.source}: attribution graphs explain a causal LM's next token; {family.title} is "
                         "not one")
    ids = _prompt_ids(opened, args)
    family.check_length(opened.config, len(ids), "the prompt (with the BOS token in front)")
    zero = args.zero_positions or zero_positions_for(opened.source)
    if zero >= len(ids):
        raise ValueError(f"--zero-positions {zero} leaves no position of the {len(ids)}-token prompt its features")
    transcoders = load_transcoders(args.transcoders)
    model = opened.load(family.lm, device=args.device)
    transcoders.to(args.device)
    inputs, _ = transcoders.sites(model)  # a set for another model: refused before any work
    out = Path(args.out).expanduser()  # made by its lock (cli.main)
    contexts = _contexts(args.features, inputs, transcoders.d_transcoder, model, out)
    partial = out / PARTIAL
    staging = partial / "staged"
    shutil.rmtree(staging, ignore_errors=True)
    if (partial / "rows").is_dir():
        print(f"the rows of an unfinished run are in {partial / 'rows'}: continuing them (refused if they were "
              "made with other settings)", file=sys.stderr)
    staging.mkdir(parents=True)
    try:
        started = time.time()
        bar = None if args.quiet else _bar()
        graph = attribute(model, transcoders, torch.tensor(ids, device=args.device),
                          max_n_logits=args.max_n_logits, desired_logit_prob=args.desired_logit_prob,
                          batch_size=args.batch_size, max_feature_nodes=args.max_feature_nodes,
                          zero_positions=slice(0, zero), rows_dir=partial / "rows", rows_to=partial / "adjacency.npy",
                          identity={"model": opened.source, "transcoders": str(args.transcoders)}, progress=bar)
        seconds = time.time() - started
        graph.to_pt(staging / GRAPH)
        scan = graph.scan if graph.scan is not None else str(args.transcoders)
        pruned = prune_graph(graph, args.node_threshold, args.edge_threshold)  # once, for the frontend and the page
        write_frontend_files(graph, args.slug, staging, scan=scan, node_threshold=args.node_threshold,
                             edge_threshold=args.edge_threshold, decode=lambda t: decode(model, [t]), pruned=pruned)
        GraphPage(graph, _shown_tokens(model)(graph.input_tokens.tolist()), node_threshold=args.node_threshold,
                  edge_threshold=args.edge_threshold, contexts=contexts, pruned=pruned,
                  title=f"attribution graph: {graph.input_string or args.slug}").save(staging / PAGE)
        replacement, completeness = graph_scores(graph)
        summary = {"model": opened.source, "transcoders": str(args.transcoders), "prompt": graph.input_string,
                   "input_ids": ids, "tokens": [decode(model, [t]) for t in ids],
                   "logit_targets": [{"token": token, "id": index, "probability": p}
                                     for (token, index), p in zip(graph.logit_targets,
                                                                  graph.logit_probabilities.tolist())],
                   "active_features": len(graph.active_features),
                   "feature_nodes": len(graph.selected_features),
                   "nodes": graph.adjacency_matrix.shape[0],
                   "replacement_score": replacement, "completeness_score": completeness,
                   "zero_positions": zero, "node_threshold": args.node_threshold,
                   "edge_threshold": args.edge_threshold,
                   "seconds": round(seconds, 3)}
        (staging / SUMMARY).write_text(json.dumps(summary, indent=2))
        if (out / "graph-metadata.json").exists():  # the list of graphs there, this one's entry replaced
            listed = json.loads((out / "graph-metadata.json").read_text())
            mine = json.loads((staging / "graph-metadata.json").read_text())["graphs"]
            listed["graphs"] = [g for g in listed.get("graphs", []) if g.get("slug") != args.slug] + mine
            (staging / "graph-metadata.json").write_text(json.dumps(listed, indent=2))
        for file in staging.iterdir():
            file.replace(out / file.name)
        shutil.rmtree(partial)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if partial.is_dir() and not any(partial.glob("rows/batch-*")):  # nothing computed to continue from
            shutil.rmtree(partial, ignore_errors=True)
    print(f"{len(ids)} tokens, {len(graph.active_features)} active features ({len(graph.selected_features)} in the "
          f"graph), {len(graph.logit_targets)} logit targets; replacement score {replacement:.4f}, completeness "
          f"score {completeness:.4f}; {seconds:.1f} s")
    print(f"wrote {out / GRAPH}, {out / (args.slug + '.json')}, {out / 'graph-metadata.json'}, {out / PAGE}, "
          f"{out / SUMMARY}")
    return 0


def _prompt_ids(opened, args) -> list[int]:
    """The prompt's token ids with a BOS-like token in front where the first is not special (circuit-tracer's
    ensure_tokenized: BOS, else padding, else end of text, else any special token)."""
    vocab = opened.config.vocab_size
    if args.ids is not None:
        try:
            ids = [int(part) for part in args.ids.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"--ids {args.ids!r}: comma-separated token ids (300,41,77)") from None
        if not ids:
            raise ValueError("--ids: no token ids given")
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise ValueError(f"--ids: token ids {bad} are outside the vocabulary [0, {vocab})")
        tokenizer = opened.tokenizer
    else:
        if not args.prompt.strip():
            raise ValueError("the prompt is empty: give a text")
        tokenizer = opened.require_tokenizer()
        ids = tokenizer.encode(args.prompt, add_special_tokens=False)
        if not ids:
            raise ValueError(f"the prompt {args.prompt!r} gives no tokens")
    special = dict(tokenizer.special_ids) if tokenizer is not None else {}
    for name in ("bos_token_id", "pad_token_id", "eos_token_id"):
        value = getattr(opened.config, name, None)
        if isinstance(value, int):
            special.setdefault(name.removesuffix("_token_id"), value)
    if ids[0] in set(special.values()):
        return ids
    for role in ("bos", "pad", "eos", *special):
        if role in special and special[role] is not None:
            return [special[role], *ids]
    raise ValueError(f"{opened.source}: neither its tokenizer nor its config names a special token to put before "
                     "the prompt (circuit-tracer gives position 0 no features); give --ids starting with one")


def _shown_tokens(model):
    """ids -> their texts for display (the tokenizer's shown_tokens), "[id]" each where the checkpoint has no
    tokenizer (which its Tokenizer says only when used)."""
    from scratch_models.registry.tokenizer import NoTokenizerJson

    tokenizer = getattr(model, "tokenizer", None)

    def shown(ids):
        try:
            if tokenizer is not None:
                return tokenizer.shown_tokens(ids)
        except NoTokenizerJson:
            pass
        return [f"[{i}]" for i in ids]

    return shown


def _contexts(directories, hooks, width, model, out):
    """The features runs of --features, matched to the transcoders' layers (None where none is given)."""
    if not directories:
        return None
    from scratch_models.views.graph_page import FeatureContexts

    return FeatureContexts.read(directories, hooks, width, _shown_tokens(model), page_root=out)


def _bar():
    """progress(done, total) drawing a tqdm bar on stderr."""
    from tqdm.auto import tqdm

    state = {}

    def progress(done, total):
        if "bar" not in state:
            state["bar"] = tqdm(total=total, desc="feature rows", unit="row", file=sys.stderr, dynamic_ncols=True)
        state["bar"].update(done - state["bar"].n)
        if done >= total:
            state["bar"].close()

    return progress
