"""`scratch-models patch`: activation patching from a clean text into a corrupted one of the same length.

The metric is the logit difference between the answer (default: the clean run's prediction) and the wrong answer
(default: the corrupted run's), at the target's position; for the pooler, the cosine similarity with the clean
run's pooler output. Every sweep (residual stream, attention and MLP outputs by position; heads, all positions and
by position) runs batched, with attribution patching's estimate beside it. Writes into the output directory
(staged: an error leaves nothing half-written):
    patching.png    one heatmap per sweep, patched and estimated side by side, 0 = corrupted, 1 = clean
    patching.html   the same as an offline page
    patching.json   every number, raw and normalised
"""

import dataclasses
import json
import os
import time
from pathlib import Path

import torch

from scratch_models.views.figures import patching_png
from scratch_models.analysis.metrics import LogitDiff, PoolerCosine, PoolerOutput
from scratch_models.views.pages import patching_html
from scratch_models.analysis.patching import PatchingResult, activation_patching
from weight_mapping import staged

from .common import at_least_one, check_writable_directory, written_files
from .targets import answer_id, describe, encode, load, positions, predictions


@dataclasses.dataclass
class PatchResult:
    result: PatchingResult
    metric: str  # in words
    tokens: list[str]
    files: list[Path]
    seconds: float


def patch(model: str, clean: str, corrupted: str, *, target: str | None = None, answer: str | None = None,
          wrong: str | None = None, out: str | os.PathLike, batch_size: int, device: str = "cpu") -> PatchResult:
    start = time.perf_counter()
    at_least_one("--batch-size", batch_size)
    check_writable_directory("--out", out)
    loaded = load(model, target, device)
    clean_inputs, clean_tokens = encode(loaded, [clean], device, "--clean")
    corrupted_inputs, corrupted_tokens = encode(loaded, [corrupted], device, "--corrupted")
    lengths = len(clean_tokens[0]), len(corrupted_tokens[0])
    if lengths[0] != lengths[1]:
        raise ValueError(f"--clean is {lengths[0]} tokens ({' '.join(map(repr, clean_tokens[0]))}) and --corrupted "
                         f"{lengths[1]} ({' '.join(map(repr, corrupted_tokens[0]))}): patching by position needs texts "
                         "of the same length in tokens")
    clean_at = positions(loaded, clean_inputs, [clean], "--clean")
    corrupted_at = positions(loaded, corrupted_inputs, [corrupted], "--corrupted")
    if clean_at is not None and not torch.equal(clean_at, corrupted_at):
        raise ValueError(f"the {loaded.opened.mask_token()[1]} is at position {int(clean_at[0])} in --clean and "
                         f"{int(corrupted_at[0])} in --corrupted: put it at the same place in both")
    if loaded.target == "pooler":
        for flag, value in (("--answer", answer), ("--wrong", wrong)):
            if value is not None:
                answer_id(loaded, value, flag)  # refuses it, naming the flag
        with torch.no_grad():
            reference = PoolerOutput()(loaded.model(**clean_inputs))  # refuses a BertModel without a pooler
        metric, what = PoolerCosine(reference), "cosine similarity of pooler_output with the clean run's"
    else:
        with torch.no_grad():
            clean_top = int(predictions(loaded, loaded.model(**clean_inputs), clean_at)[0])
            corrupted_top = int(predictions(loaded, loaded.model(**corrupted_inputs), corrupted_at)[0])
        good = answer_id(loaded, answer, "--answer") if answer is not None else clean_top
        bad = answer_id(loaded, wrong, "--wrong") if wrong is not None else corrupted_top
        if good == bad:
            raise ValueError(f"the answer and the wrong answer are both {describe(loaded, good)!r} (by default the "
                             "clean and corrupted runs' predictions): give --answer and --wrong that differ")
        metric = LogitDiff(good, bad, positions=clean_at)
        what = f"logit({describe(loaded, good)!r}) - logit({describe(loaded, bad)!r})"
    result = activation_patching(loaded.model, clean_inputs, corrupted_inputs, metric, batch_size=batch_size)
    tokens = clean_tokens[0]
    title = f"{model}: {clean!r} vs {corrupted!r}"
    with staged(out) as staging:
        patching_png(result, tokens, staging / "patching.png", title=model)
        (staging / "patching.html").write_text(patching_html(result, tokens, title=title), encoding="utf-8")
        (staging / "patching.json").write_text(json.dumps(
            {"model": model, "clean": clean, "corrupted": corrupted, "metric": what,
             "corrupted_tokens": corrupted_tokens[0], **result.to_json(tokens)}, indent=1), encoding="utf-8")
        files = written_files(staging, out)
    return PatchResult(result, what, tokens, files, time.perf_counter() - start)


def format_strongest(patched: PatchResult) -> str:
    """Per sweep, the patch that moves the metric most (normalised: 1 = the clean run's value restored)."""
    lines = []
    result = patched.result
    for sweep, values in result.patched.items():
        scores = result.normalized(values)
        index = [int(i) for i in torch.unravel_index(scores.abs().argmax(), scores.shape)]
        if sweep == "attn_head_out_all_pos":
            where = f"layer {index[0]}, head {index[1]}"
        else:
            where = f"layer {index[0]}, position {index[1]} {patched.tokens[index[1]]!r}" + (
                f", head {index[2]}" if len(index) == 3 else "")
        lines.append(f"  {sweep:<22} strongest at {where}: {float(scores[tuple(index)]):.3f}")
    return "\n".join(lines)
