"""`scratch-models harvest`: activations over a corpus, written to a directory of Arrow shards (scratch_models.corpus).

    scratch-models harvest gpt2 corpus.jsonl --names 'layers.*.out' --out acts/
    torchrun --nproc_per_node 4 -m scratch_models harvest gpt2 corpus.jsonl --names layers.5.out --out acts/

Run again, the same command resumes from the shards already written; --overwrite starts again.
"""

import argparse

from .common import at_least_one, require_device


def add_parser(commands, model_help: str) -> None:
    p = commands.add_parser("harvest", help="run a model over a corpus and write chosen activations to Arrow shards "
                                            "(resumable; several processes under torchrun)",
                            description="Run a model over every document of a corpus and write the tensors of the "
                                        "named hook points, one row per token, as Arrow shards that "
                                        "datasets.load_from_disk(OUT) memory-maps. The same command resumes an "
                                        "interrupted run.")
    p.add_argument("model", help=model_help)
    p.add_argument("data", help="a .txt file (a document a line), a .jsonl / .csv / .parquet file with a text column "
                                "(or input_ids), or a directory saved by datasets")
    p.add_argument("--names", nargs="+", required=True, metavar="PATTERN",
                   help="hook names or globs, e.g. layers.5.out 'layers.*.mlp.post_act'")
    p.add_argument("--out", required=True, help="directory of the shards (new, empty, or a harvest to resume)")
    p.add_argument("--batching", choices=("pack", "document"),
                   help="pack: documents end to end in sequences of --context tokens (SAELens' convention; the "
                        "default for causal models); document: one sequence per document (the default for BERT)")
    p.add_argument("--context", type=int, help="tokens per packed sequence (default 128, or the model's positions)")
    p.add_argument("--positions", choices=("all", "first", "last", "mean"), default="all",
                   help="all: a row per token; first ([CLS]), last or mean: a row per document")
    p.add_argument("--drop-special", action="store_true", help="no rows for special tokens (BOS, separators, "
                                                               "[CLS], [SEP])")
    p.add_argument("--prepend-bos", action=argparse.BooleanOptionalAction,
                   help="BOS first in each sequence (default: yes when packing, as SAELens; no per document, as "
                        "transformers' tokenizer)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="dtype the rows are stored in (bfloat16 as its 16-bit patterns: Arrow has no bfloat16)")
    p.add_argument("--layout", choices=("rows", "saelens"), default="rows",
                   help="rows: a row per token with its document and position; saelens: exactly what SAELens' "
                        "CacheActivationsRunner writes (one hook point, a row per sequence), so SAELens trains from it")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward pass")
    p.add_argument("--shard-size", type=float, default=256, metavar="MB",
                   help="about how large a shard grows (what is written of one survives a kill every 30 s)")
    p.add_argument("--threads", type=int, help="CPU threads, each running forward passes of its own (default: the "
                                               "cores this process may use, at most OMP_NUM_THREADS when set)")
    p.add_argument("--text-column", help="the column of texts (default: text)")
    p.add_argument("--pair-column", help="the column of second segments, for BERT sentence pairs")
    p.add_argument("--ids-column", help="a column of token ids to read instead of texts (default: input_ids when "
                                        "there is no text column)")
    p.add_argument("--overwrite", action="store_true", help="delete a harvest in --out and start again")
    p.add_argument("--compile", action="store_true", help="run the model through compile_model (one graph per batch "
                                                          "shape; the whole model runs)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--model-dtype", choices=("float32", "float16", "bfloat16"), help="dtype the model computes in "
                                                                                      "(default: as stored)")
    p.add_argument("--no-space-check", action="store_true",
                   help="start even when the estimated size exceeds the free space")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    import os

    from scratch_models.corpus import run_harvest

    at_least_one("--batch-size", args.batch_size)
    if not args.shard_size > 0:
        raise ValueError(f"--shard-size must be more than 0 MB, got {args.shard_size}")
    require_device(args.device)
    at_least_one("--threads", args.threads)
    # Ctrl-C: Interrupted says what is kept; the command line prints it and exits 130
    _, summary = run_harvest(args.model, args.data, args.names, args.out, overwrite=args.overwrite,
                             compile=args.compile, device=args.device, model_dtype=args.model_dtype,
                             shard_bytes=int(args.shard_size * 2**20), space_check=not args.no_space_check,
                             progress=not args.quiet, threads=args.threads, batching=args.batching,
                             context=args.context, positions=args.positions, drop_special=args.drop_special,
                             prepend_bos=args.prepend_bos, dtype=args.dtype, layout=args.layout,
                             batch_size=args.batch_size, text_column=args.text_column,
                             pair_column=args.pair_column, ids_column=args.ids_column)
    if os.environ.get("RANK", "0") == "0":
        print(summary.format())
    return 0
