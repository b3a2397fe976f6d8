"""`scratch-models heads`: which heads matter for a target, and what each one attends to, over a batch of texts.

Writes into the output directory (staged: an error leaves nothing half-written):
    heads.png       zero-ablation, mean-ablation and gradient scores, layer x head, each head's label in its cells
    heads.html      the same as an offline page, a tab per score, and the ranked table
    heads.json      every number: scores, attention shares, entropies, labels, the ranking
    heads.txt       the ranked table
    attention.html  the first text's attention page (as `inspect` writes it) with these numbers in its heads view,
                    where a head of the grid or the table opens its attention
"""

import dataclasses
import json
import os
import time
from pathlib import Path

import torch

from scratch_models.views.figures import heads_png
from scratch_models.analysis.heads import HeadReport, analyze_heads
from scratch_models.analysis.metrics import PoolerOutput, TokenLogit, TokenLogProb
from scratch_models.views.pages import heads_html
from scratch_models.views.attention_page import AttentionPage
from scratch_models.hooking.inspection import AttentionCapture, attention_names
from weight_mapping import staged

from .common import at_least_one, check_writable_directory, key_groups, plural, written_files
from .targets import answer_id, describe, encode, load, positions, predictions


@dataclasses.dataclass
class HeadsResult:
    report: HeadReport
    target: str  # in words
    files: list[Path]
    seconds: float


def heads(model: str, texts: list[str], *, target: str | None = None, answer: str | None = None,
          out: str | os.PathLike, batch_size: int, device: str = "cpu") -> HeadsResult:
    start = time.perf_counter()
    at_least_one("--batch-size", batch_size)
    check_writable_directory("--out", out)
    loaded = load(model, target, device)
    inputs, tokens = encode(loaded, texts, device)
    at = positions(loaded, inputs, texts)
    if loaded.target == "pooler":
        if answer is not None:
            answer_id(loaded, answer, "--answer")  # refuses it, naming the flag
        metric, what = PoolerOutput(), "pooler_output (L2 change)"
    else:
        if answer is not None:
            answers = torch.full((len(texts),), answer_id(loaded, answer, "--answer"))
        else:
            with torch.no_grad():
                answers = predictions(loaded, loaded.model(**inputs), at).cpu()
        kind = {"next": "next-token logit", "mlm": "MLM log-probability", "class": "class logit"}[loaded.target]
        chosen = ", ".join(dict.fromkeys(repr(describe(loaded, int(a))) for a in answers))
        what = f"{kind} of {chosen}" + ("" if answer is not None else " (the model's own prediction)")
        metric_class = TokenLogProb if loaded.target == "mlm" else TokenLogit
        metric = metric_class(answers.to(device), positions=at)
    groups = key_groups(loaded.opened, tokens, inputs["attention_mask"])
    report = analyze_heads(loaded.model, inputs, metric, groups={k: v.to(device) for k, v in groups.items()},
                           target=what, batch_size=batch_size)
    title = f"{model}: {plural(len(texts), 'text')}"
    with torch.no_grad():
        _, cache = loaded.model.run_with_cache(**inputs, names=attention_names)
    capture = AttentionCapture.from_cache(cache, tokens[0])  # the first text; its padding left out
    page_title = f"{model}: {texts[0]!r}" + (f" (text 1 of {len(texts)}; the heads' numbers are over all of them)"
                                             if len(texts) > 1 else "")
    with staged(out) as staging:
        heads_png(report, staging / "heads.png", title=title)
        AttentionPage(capture, title=page_title, heads=report).save(staging / "attention.html")
        (staging / "heads.html").write_text(heads_html(report, title=title), encoding="utf-8")
        (staging / "heads.json").write_text(json.dumps(
            {"model": model, "texts": texts, "tokens": tokens, **report.to_json(), "ranked": report.ranked()},
            indent=1), encoding="utf-8")
        (staging / "heads.txt").write_text(f"{title}\ntarget: {what}\n\n{format_ranked(report)}\n", encoding="utf-8")
        files = written_files(staging, out)
    return HeadsResult(report, what, files, time.perf_counter() - start)


def format_ranked(report: HeadReport, top: int | None = None) -> str:
    """The ranked table as aligned text, the largest |zero-ablation change| first."""
    header = ("rank", "head", "label", "zero abl.", "mean abl.", "gradient", "entropy")
    body = [(str(rank), f"L{row['layer']}H{row['head']}", row["label"],
             *(f"{row[key]:.4g}" for key in ("zero_ablation", "mean_ablation", "importance", "entropy")))
            for rank, row in enumerate(report.ranked()[:top], 1)]
    widths = [max(len(line[c]) for line in [header, *body]) for c in range(len(header))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in [header, *body])
