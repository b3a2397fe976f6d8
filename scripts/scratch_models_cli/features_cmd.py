"""`scratch-models features`: what each feature of a sparse dictionary does over a corpus, as a dataset and pages
(scratch_models.dictionaries.features).

    scratch-models features gpt2 path/to/sae corpus.jsonl --out features/
    scratch-models features gpt2 jbloom/GPT2-Small-SAEs-Reformatted corpus.txt --sae-id blocks.8.hook_resid_pre --out f/
    torchrun --nproc_per_node 4 -m scratch_models features gpt2 path/to/sae corpus.jsonl --out features/
    scratch-models features MODEL path/to/transcoders corpus.txt --transcoder-layer 3 --out features/layer3/

A transcoder set in circuit-tracer's layout (--transcoder-layer N): layer N's encoder at its input hook, whose
contexts `scratch-models attribute --features features/` shows on the graph's page.

Run again, the same command resumes the pass; --overwrite starts again.
"""

import argparse

from .common import at_least_one, require_device


def add_parser(commands, model_help: str) -> None:
    p = commands.add_parser("features", help="each feature of a sparse dictionary over a corpus: how often it fires, "
                                             "its top examples, histogram and logit effects, as a dataset and pages",
                            description="Run a model over every document of a corpus once, read a sparse "
                                        "dictionary's features at its hook point, and write what each feature does: "
                                        "out/index.html (every feature, sortable, searchable), a page per feature, "
                                        "and a dataset (datasets.load_from_disk(OUT/dataset)). The same command "
                                        "resumes an interrupted run.")
    p.add_argument("model", help=model_help)
    p.add_argument("dictionary", help="a directory or file of a dictionary (SAELens' cfg.json + "
                                      "sae_weights.safetensors, Gemma Scope's params.npz, sparsify's cfg.json + "
                                      "sae.safetensors) or a hub id (with --sae-id for the folder in it)")
    p.add_argument("data", help="a .txt file (a document a line), a .jsonl / .csv / .parquet file with a text column "
                                "(or input_ids), or a directory saved by datasets")
    p.add_argument("--out", required=True, help="directory of the dataset and pages (new, empty, or a run to resume)")
    p.add_argument("--sae-id", help="the folder of the dictionary inside a hub repository")
    p.add_argument("--hook-name", help="where the dictionary reads, where its files do not say (Gemma Scope's)")
    p.add_argument("--norm-scaling-factor", type=float, help="the input scale of a dictionary with "
                                                              "normalize_activations expected_average_only_in")
    p.add_argument("--transcoder-layer", type=int, metavar="N",
                   help="DICTIONARY is a transcoder set in circuit-tracer's layout (as `attribute` reads): the "
                        "features of layer N's transcoder, read at its input hook")
    p.add_argument("--top-k", type=int, default=20, help="examples kept per feature where it is largest")
    p.add_argument("--samples", type=int, default=20, help="firings sampled per feature, shown by quantile band")
    p.add_argument("--window", type=int, nargs=2, default=(12, 4), metavar=("BEFORE", "AFTER"),
                   help="tokens of context an example shows before and after its token")
    p.add_argument("--no-pages", action="store_true", help="the dataset only")
    p.add_argument("--batching", choices=("pack", "document"),
                   help="pack: documents end to end in sequences of --context tokens (the default for causal models); "
                        "document: one sequence per document (the default for BERT)")
    p.add_argument("--context", type=int, help="tokens per packed sequence (default 128, or the model's positions)")
    p.add_argument("--prepend-bos", action=argparse.BooleanOptionalAction,
                   help="BOS first in each sequence (default: yes when packing)")
    p.add_argument("--drop-special", action="store_true", help="special tokens (BOS, [CLS], [SEP], separators) count "
                                                               "for no feature")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward pass")
    p.add_argument("--threads", type=int, help="CPU threads, each running forward passes and the encoder of its own "
                                               "(default: the cores this process may use, at most OMP_NUM_THREADS "
                                               "when set)")
    p.add_argument("--text-column", help="the column of texts (default: text)")
    p.add_argument("--pair-column", help="the column of second segments, for BERT sentence pairs")
    p.add_argument("--ids-column", help="a column of token ids to read instead of texts")
    p.add_argument("--save-every", type=float, default=60.0, metavar="SECONDS",
                   help="how often the counts reach the disk (all a kill can cost)")
    p.add_argument("--overwrite", action="store_true", help="delete a features run in --out and start again")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--model-dtype", choices=("float32", "float16", "bfloat16"), help="dtype the model computes in "
                                                                                      "(default: as stored)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


# SAE.from_pretrained's keyword arguments -> the options of this command that set them
LOADING_OPTIONS = {"hook_name": "--hook-name", "norm_scaling_factor": "--norm-scaling-factor"}


def run(args) -> int:
    import os

    from scratch_models.dictionaries import SAE, DictionaryError
    from scratch_models.dictionaries.features import run_features

    at_least_one("--batch-size", args.batch_size)
    at_least_one("--top-k", args.top_k)
    at_least_one("--samples", args.samples)
    at_least_one("--threads", args.threads)
    require_device(args.device)
    try:
        if args.transcoder_layer is not None:
            sae = _transcoder_layer(args)
        else:
            sae = SAE.from_pretrained(args.dictionary, args.sae_id, hook_name=args.hook_name,
                                      norm_scaling_factor=args.norm_scaling_factor)
    except DictionaryError as e:  # the library names its keyword arguments; here they are this command's options
        message = str(e)
        for keyword, option in LOADING_OPTIONS.items():
            message = message.replace(f"pass {keyword}=", f"pass {option}")
        raise DictionaryError(message) from None
    _, summary = run_features(args.model, sae, args.data, args.out, overwrite=args.overwrite, device=args.device,
                              model_dtype=args.model_dtype, top_k=args.top_k, samples=args.samples,
                              window=tuple(args.window), pages=not args.no_pages, save_seconds=args.save_every,
                              progress=not args.quiet, threads=args.threads, batching=args.batching,
                              context=args.context,
                              prepend_bos=args.prepend_bos, drop_special=args.drop_special,
                              batch_size=args.batch_size, text_column=args.text_column,
                              pair_column=args.pair_column, ids_column=args.ids_column)
    if os.environ.get("RANK", "0") == "0":
        print(summary.format())
    return 0


def _transcoder_layer(args):
    """Layer --transcoder-layer's transcoder of the set DICTIONARY, as a dictionary at its input hook."""
    from scratch_models.circuits import load_transcoders

    for option, value in (("--sae-id", args.sae_id), ("--hook-name", args.hook_name),
                          ("--norm-scaling-factor", args.norm_scaling_factor)):
        if value is not None:
            raise ValueError(f"{option} is for a dictionary's files; a transcoder set's config.yaml says where it "
                             "reads (give one or the other)")
    return load_transcoders(args.dictionary).dictionary(args.transcoder_layer)
