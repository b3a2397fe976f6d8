"""`scratch-models`: the parity report and small tools around our models.

transformers is imported inside the commands that need it, so `scratch-models --help` stays quick.
"""

import argparse
import contextlib
import difflib
import logging
import os
import re
import signal
import sys
import threading

from scratch_models import FAMILIES, CheckpointError, ConfigError
from scratch_models.analysis.patching import DEFAULT_BATCH_SIZE
from weight_mapping import DirectoryLock

from . import attribute_cmd, features_cmd, harvest_cmd
from .common import at_least_one, check_writable_directory, check_writable_file
from .targets import TARGETS

WHERE = "a hub id, a local directory, a weights file or a sharded index"
MODEL = f"a checkpoint: `minilm` (the embedded real all-MiniLM-L6-v2, offline), {WHERE}"
# the families whose LM head continues a text (generate), and those whose LM head fills in masks (fill-mask)
CAUSAL = " or ".join(family.title for family in FAMILIES.values() if family.causal)
MASKED_FAMILIES = [family for family in FAMILIES.values() if family.targets.get(family.lm.__name__) == "mlm"]
MASKED = " or ".join(family.title for family in MASKED_FAMILIES)


class Parser(argparse.ArgumentParser):
    """argparse, with a suggestion for a mistyped command, flag or choice (Python 3.14's suggest_on_error does the
    first and the last), and a pointer to quoting for words left over from an unquoted text."""

    def add_argument(self, *names, **kwargs):
        self.flags = [*getattr(self, "flags", []), *(name for name in names if name.startswith("-"))]
        return super().add_argument(*names, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self.given = list(sys.argv[1:] if args is None else args)  # what error() looks through for typos
        return super().parse_known_args(args, namespace)

    def error(self, message):
        found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if found:
            close = difflib.get_close_matches(found[1], re.findall(r"'([^']*)'", found[2]), n=1)
            message += f"; did you mean {close[0]!r}?" if close else ""
        missing = re.fullmatch(r"the following arguments are required: (.*)", message)
        if missing:  # a required flag mistyped is missing, and its typo left over
            typos = [word for word in self.given if word.startswith("-")  # neither a flag nor its abbreviation
                     and not any(flag.startswith(word.partition("=")[0]) for flag in self.flags)]
            message += "".join(f" ({word}: did you mean {close}?)" for word in typos
                               if (close := _close_flag(word, missing[1].split(", "))))
        super().error(message)

    def parse_args(self, args=None, namespace=None):
        args, extra = self.parse_known_args(args, namespace)
        if extra:
            command = self.commands.choices[args.command]
            hints = [f"did you mean {close}?" for word in extra if (close := _close_flag(word, command.flags))]
            if any(not word.startswith("-") for word in extra):
                hints.append("quote a text that has spaces")
            command.error(f"unrecognized arguments: {' '.join(extra)}" + (f" ({'; '.join(hints)})" if hints else ""))
        return args


def _close_flag(word: str, flags: list[str]) -> str | None:
    """The flag of `flags` that `word` (--flag or --flag=value) is or most resembles; None when none is close."""
    if not word.startswith("-"):
        return None
    close = difflib.get_close_matches(word.partition("=")[0], flags, n=1)
    return close[0] if close else None


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="scratch-models", description=__doc__.splitlines()[0])
    commands = parser.commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("verify", help="compare our model with transformers, layer by layer")
    p.add_argument("model", nargs="?", help=f"{MODEL}; default: minilm")
    p.add_argument("--text", action="append", help="input text; repeat for a batch (padded)")
    p.add_argument("--pair", action="append", help="second segment for the text of the same position")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    p.add_argument("--isolate", action="store_true",
                   help="feed each of our layers transformers' input to that layer, so each layer is judged alone")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    p.add_argument("--corpus", metavar="DATA", help="compare on every text of a corpus, each alone (a .txt, .jsonl, "
                                                     ".csv or .parquet file, or a directory saved by datasets): per "
                                                     "tensor the median, p99 and max of max |diff| and the worst text")
    p.add_argument("--limit", type=int, metavar="N", help="--corpus: the first N texts only")
    p.add_argument("--text-column", help="--corpus: the column of texts (default: text)")
    p.add_argument("--pair-column", help="--corpus: the column of second segments (BERT sentence pairs)")

    p = commands.add_parser("fill-mask", help="top tokens for each mask token in a text")
    p.add_argument("model", help=f"a {MASKED} checkpoint with its masked-LM head ({WHERE}), such as "
                                 f"{' or '.join(family.lm_checkpoint for family in MASKED_FAMILIES)}")
    p.add_argument("text", help="text with one or more mask tokens, e.g. 'Paris is the [MASK] of France.'")
    p.add_argument("--top-k", type=int, default=5)

    p = commands.add_parser("classify", help="what a fine-tuned checkpoint's head says: labels with "
                                             "probabilities, a label per token, or an answer span")
    p.add_argument("model", help=f"a checkpoint with a classification or question-answering head ({WHERE})")
    p.add_argument("text", help="the text (for question answering: the question)")
    p.add_argument("--pair", help="second segment (for question answering: the context)")
    p.add_argument("--top-k", type=int, help="show only the best K labels")

    p = commands.add_parser("generate", help=f"continue a prompt with a causal language model ({CAUSAL}), printing "
                                             "tokens as they come")
    p.add_argument("model", help=f"a {CAUSAL} checkpoint ({WHERE})")
    p.add_argument("prompt")
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--do-sample", action="store_true", help="sample instead of taking the most likely token")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"))

    p = commands.add_parser("inspect", help="cache every tensor for one text; attention pictures and a summary",
                            usage="scratch-models inspect [MODEL] TEXT [--pair TEXT] --out DIR [options]")
    p.add_argument("model_and_text", nargs="+", metavar="[MODEL] TEXT",
                   help=f"{MODEL} (default: minilm), then the text")
    p.add_argument("--pair", help="second segment of a sentence pair (families with token types)")
    p.add_argument("--out", required=True, help="directory for attention.html, the PNGs and the summary")
    p.add_argument("--layer", type=int, default=0, help="layer of the head view and the head PNG")
    p.add_argument("--head", type=int, default=0, help="head of the head PNG and the neuron view")
    p.add_argument("--token", type=int, help="query token (index) of the neuron view (default: the window's first)")
    p.add_argument("--window", type=_window, metavar="START:END",
                   help="show tokens START..END-1 only (a long input's page is bounded in size and otherwise shows "
                        "the most tokens that fit, around --token)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")

    p = commands.add_parser("lens", help="logit lens: the most likely token at every layer and position, as a "
                                         "table and a heatmap")
    p.add_argument("model", help=f"a checkpoint with its LM head ({WHERE}): {CAUSAL}, or {MASKED} with its "
                                 "masked-LM head")
    p.add_argument("text")
    p.add_argument("--out", required=True, help="directory for lens.txt, lens.json and lens.png")
    p.add_argument("--top-k", type=int, default=3, help="tokens per cell in lens.json")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")

    p = commands.add_parser("heads", help="which heads matter for a target, and what each one attends to",
                            usage="scratch-models heads MODEL TEXT [TEXT ...] --out DIR [options]")
    p.add_argument("model_and_texts", nargs="+", metavar="MODEL TEXT",
                   help=f"{MODEL}, then one or more texts (a batch, padded)")
    p.add_argument("--target", choices=TARGETS, help="what the heads are scored on (default: what the checkpoint's "
                                                     "head gives): next token, MLM token, class or pooler")
    p.add_argument("--answer", help="the token (or class) whose score is the target (default: the model's own "
                                    "prediction for each text)")
    _sweep_options(p, "heads.png, heads.html, heads.json, heads.txt and attention.html", "ablated copies x texts")

    p = commands.add_parser("patch", help="activation patching heatmaps: which activations carry a clean text's "
                                          "answer into a corrupted one")
    p.add_argument("model", help=MODEL)
    p.add_argument("--clean", required=True, help="the text whose activations are patched in")
    p.add_argument("--corrupted", required=True, help="a text of the same length in tokens that they go into")
    p.add_argument("--target", choices=TARGETS, help="where the answer is read (default: what the checkpoint's head "
                                                     "gives)")
    p.add_argument("--answer", help="the right token or class (default: the clean run's prediction)")
    p.add_argument("--wrong", help="the wrong token or class (default: the corrupted run's prediction)")
    _sweep_options(p, "patching.png, patching.html and patching.json", "patched copies")

    p = commands.add_parser("convert", help="rewrite a checkpoint as config.json + model.safetensors in the layout "
                                            "transformers saves, checking the round trip")
    p.add_argument("source", help=MODEL)
    p.add_argument("destination", help="new (or empty) directory to write")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), help="cast the weights (default: as stored)")
    p.add_argument("--legacy", action="store_true",
                   help="the original release's layout instead (BERT: `bert.` prefix, LayerNorm gamma/beta)")

    p = commands.add_parser("tiny", help="write a small random model of a family, with a tokenizer, to try every "
                                         "command offline")
    p.add_argument("family", choices=list(FAMILIES), help="the family (config.json's model_type)")
    p.add_argument("directory", help="new (or empty) directory to write")
    p.add_argument("--class", dest="class_name", metavar="CLASS",
                   help="the class to write, e.g. a classifier for `classify` (default: the family's LM: "
                        f"{', '.join(family.lm.__name__ for family in FAMILIES.values())})")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")

    harvest_cmd.add_parser(commands, MODEL)
    features_cmd.add_parser(commands, MODEL)
    attribute_cmd.add_parser(commands, MODEL)

    args = parser.parse_args(argv)
    if args.command == "inspect" and len(args.model_and_text) > 2:
        parser.error("inspect takes [MODEL] TEXT: quote a text with spaces")
    if args.command == "heads" and len(args.model_and_texts) < 2:
        parser.error("heads takes MODEL TEXT [TEXT ...]: give the model and at least one text")
    _quiet_transformers()
    before = signal.signal(signal.SIGINT, _interrupt) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        run = {"verify": _verify, "fill-mask": _fill_mask, "classify": _classify, "generate": _generate,
               "inspect": _inspect, "lens": _lens, "heads": _heads, "patch": _patch, "convert": _convert,
               "tiny": _tiny, "harvest": harvest_cmd.run, "features": features_cmd.run,
               "attribute": attribute_cmd.run}
        # one writer per directory, locked before any model loads: harvest and features lock their --out themselves
        # (rank 0 for all under torchrun), convert and tiny their destination
        writes_out = args.command in ("inspect", "lens", "heads", "patch", "attribute")
        if writes_out:
            check_writable_directory("--out", args.out)  # its own words for a path that cannot be a directory
        with DirectoryLock(args.out, args.command) if writes_out else contextlib.nullcontext():
            return run[args.command](args)
    # OSError: a path that does not exist, a full or read-only disk; its message names the path and the reason
    except (CheckpointError, ConfigError, ValueError, OSError) as e:
        print(f"scratch-models {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C: one line (what is kept, where a command says), the shell's code for it
        if os.environ.get("RANK", "0") == "0":
            print(f"scratch-models {args.command}: {e or 'interrupted'}", file=sys.stderr)
        return 130
    finally:
        if before is not None and signal.getsignal(signal.SIGINT) is _interrupt:  # not interrupted: as it was
            signal.signal(signal.SIGINT, before)


def _interrupt(signum, frame):
    """The first Ctrl-C interrupts; those after it are ignored until the process ends, so the interrupted command
    keeps what it wrote and its threads end before Python does (a second Ctrl-C while they ran aborted the process
    with a traceback from threading and C++'s `terminate called`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _sweep_options(p, files: str, rows: str):
    """--out, --batch-size and --device of heads and patch."""
    p.add_argument("--out", required=True, help=f"directory for {files}")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help=f"rows ({rows}) per forward pass")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")


def _verify(args) -> int:
    from .verify import verify, verify_corpus, write_json

    if args.json:
        check_writable_file("--json", args.json)
    corpus_only = [flag for flag, value in (("--limit", args.limit), ("--text-column", args.text_column),
                                            ("--pair-column", args.pair_column)) if value is not None]
    if args.corpus is None and corpus_only:
        raise ValueError(f"{', '.join(corpus_only)} go with --corpus")
    if args.corpus is not None:
        if args.text or args.pair or args.isolate:
            raise ValueError("--corpus reads its texts from the corpus: leave out --text, --pair and --isolate")
        report = verify_corpus(args.model, args.corpus, limit=args.limit, device=args.device, dtype=args.dtype,
                               text_column=args.text_column, pair_column=args.pair_column)
        print(report.format())
        if args.json:
            write_json(report, args.json)
        return 0 if report.passed else 1
    report = verify(args.model, texts=args.text, pairs=args.pair, device=args.device, dtype=args.dtype,
                    isolate=args.isolate)
    print(report.format())
    if args.json:
        write_json(report, args.json)
    return 0 if report.passed else 1


def _fill_mask(args) -> int:
    from .fill_mask import fill_mask

    for position, candidates in fill_mask(args.model, args.text, top_k=args.top_k):
        print(f"mask at token {position}:")
        for rank, (token, probability) in enumerate(candidates, 1):
            print(f"  {rank}. {token:<20} {probability:.4f}")
    return 0


def _classify(args) -> int:
    from .classify import classify, format_classification

    print(format_classification(classify(args.model, args.text, pair=args.pair, top_k=args.top_k)))
    return 0


def _generate(args) -> int:
    import torch
    from transformers import TextStreamer

    from .common import encode, open_model, require_device, say_if_stand_in

    _check_generate_flags(args)
    require_device(args.device)
    opened = open_model(args.model)
    say_if_stand_in(opened)
    family = opened.family
    if not family.causal:
        raise ValueError(f"{opened.source}: generate continues a text with a causal language model ({CAUSAL}); this "
                         f"is a {family.title} checkpoint (fill-mask fills in a masked language model's masks)")
    input_ids = encode(opened, args.prompt, names=["the prompt"], device=args.device)[0]["input_ids"]
    (prompt, (limit, field)) = input_ids.shape[1], family.position_limit(opened.config)
    if prompt + args.max_new_tokens > limit:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: the prompt's {prompt} tokens and "
                         f"{args.max_new_tokens} new ones need {prompt + args.max_new_tokens} positions; this model "
                         f"has {field}={limit}, so at most {limit - prompt} new tokens fit after "
                         "this prompt")
    lm = opened.load(family.lm, dtype=args.dtype, device=args.device)
    generator = torch.Generator(args.device).manual_seed(args.seed)
    # transformers' streamer decodes with whatever tokenizer it is given: here the command's own
    lm.generate(input_ids, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
                temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, generator=generator,
                streamer=TextStreamer(opened.tokenizer))
    return 0


def _check_generate_flags(args) -> None:
    """The flags by their own names, before anything loads (generate itself names its Python arguments)."""
    at_least_one("--max-new-tokens", args.max_new_tokens)
    sampling = [flag for flag, value, default in (("--temperature", args.temperature, 1.0),
                                                  ("--top-k", args.top_k, None), ("--top-p", args.top_p, None))
                if value != default]
    if sampling and not args.do_sample:
        raise ValueError(f"{' and '.join(sampling)} shape sampling, which is off: add --do-sample (without it the "
                         "most likely token is taken)")
    if not args.temperature > 0:
        raise ValueError(f"--temperature must be > 0, got {args.temperature}")
    at_least_one("--top-k", args.top_k)
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")


def _inspect(args) -> int:
    from .inspect_cmd import inspect

    result = inspect(_inspected(args.model_and_text), args.model_and_text[-1], pair=args.pair, out=args.out,
                     layer=args.layer, head=args.head, token=args.token, window=args.window, device=args.device)
    print(f"inspect {result.model}: {len(result.tokens)} tokens: {' '.join(map(repr, result.tokens))}")
    for path in result.files:
        print(f"  wrote {path}")
    for path in result.removed:
        print(f"  removed {path} (an earlier run's)")
    if result.notice:
        print(f"  attention.html: {result.notice}")
    print(f"  in {result.seconds:.1f} s")
    return 0


def _inspected(model_and_text: list[str]):
    """The checkpoint of `inspect [MODEL] TEXT`, opened (None: minilm). An unquoted text (read as MODEL TEXT) and a
    checkpoint given without its text (read as the TEXT) are each pointed out."""
    from weight_mapping import looks_like_checkpoint

    from .common import open_model

    *model, text = model_and_text
    if not model:
        if looks_like_checkpoint(text):
            raise ValueError(f"{text!r} names a checkpoint, and no text follows it: give the text too (inspect "
                             f"{text} TEXT); to inspect {text!r} as a text, name the model before it (inspect minilm "
                             f"{text!r})")
        return None
    try:
        return open_model(model[0])
    except CheckpointError as e:
        # an unquoted text reads as MODEL TEXT: say so beside why the first word is no checkpoint
        raise CheckpointError(f"{e}\n(inspect takes [MODEL] TEXT: if {' '.join(model_and_text)!r} is the text, quote "
                              "it)") from None


def _window(text: str) -> tuple[int, int]:
    """--window START:END as two ints; argparse names the flag when this raises."""
    start, sep, end = text.partition(":")
    if not sep or not start.strip().isdigit() or not end.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected START:END, two token indices, got {text!r}")
    return int(start), int(end)


def _lens(args) -> int:
    from .lens_cmd import lens

    result = lens(args.model, args.text, out=args.out, top_k=args.top_k, device=args.device)
    print(result.table, end="")
    for path in result.files:
        print(f"  wrote {path}")
    return 0


def _heads(args) -> int:
    from .heads_cmd import format_ranked, heads

    model, *texts = args.model_and_texts
    result = heads(model, texts, target=args.target, answer=args.answer, out=args.out, batch_size=args.batch_size,
                   device=args.device)
    print(f"heads {model}: target {result.target}\n{format_ranked(result.report, top=10)}")
    for path in result.files:
        print(f"  wrote {path}")
    print(f"  in {result.seconds:.1f} s")
    return 0


def _patch(args) -> int:
    from .patch_cmd import format_strongest, patch

    result = patch(args.model, args.clean, args.corrupted, target=args.target, answer=args.answer, wrong=args.wrong,
                   out=args.out, batch_size=args.batch_size, device=args.device)
    print(f"patch {args.model}: metric {result.metric}: clean {result.result.clean_metric:.4g}, corrupted "
          f"{result.result.corrupted_metric:.4g}\n{format_strongest(result)}")
    for path in result.files:
        print(f"  wrote {path}")
    print(f"  in {result.seconds:.1f} s")
    return 0


def _convert(args) -> int:
    from .convert import convert

    print(convert(args.source, args.destination, dtype=args.dtype, legacy=args.legacy))
    return 0


def _tiny(args) -> int:
    from .tiny import tiny

    print(tiny(args.family, args.directory, class_name=args.class_name, seed=args.seed))
    return 0


def _quiet_transformers():
    """transformers' progress bars and load warnings would bury the report; errors still show."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
