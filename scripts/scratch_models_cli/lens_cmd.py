"""`scratch-models lens`: the logit lens of one text. Every layer's residual stream is read out as the model reads
its last one (GPT-2: ln_f and the unembedding, predicting the next token; BERT: the MLM head, predicting the token
at each position), to show where a prediction forms.

Writes into the output directory, through a staging directory so an error leaves nothing half-written:
    lens.txt     the table printed: the most likely token and its probability per layer (rows) and position
    lens.json    the same with the top-k tokens, their ids and probabilities
    lens.png     the table as a heatmap
"""

import dataclasses
import json
import os
import re
from pathlib import Path

import torch

from scratch_models.analysis import LensTable, lens_table
from scratch_models.views.display import token_label
from scratch_models.views.lens_plot import lens_png
from weight_mapping import CheckpointError, staged

from .common import (at_least_one, check_writable_directory, encode, missing_head, open_model, require_device,
                     written_files)

CELL = 16  # characters per cell of the printed table


@dataclasses.dataclass
class LensResult:
    model: str
    tokens: list[str]
    table: str  # what lens.txt holds
    files: list[Path]


def lens(model: str, text: str, *, out: str | os.PathLike, top_k: int = 3, device: str = "cpu") -> LensResult:
    at_least_one("--top-k", top_k)
    require_device(device)
    check_writable_directory("--out", out)
    opened = open_model(model)
    family, source = opened.family, opened.source
    missing = opened.missing_head_tensors(family.lm)
    if missing:
        raise CheckpointError(missing_head(opened, family.lm, missing, "the logit lens"))
    reads = "the token after each position" if family.causal else "the token at each position (masked-LM head)"
    inputs, tokens = encode(opened, text, names=["the text"], device=device)
    tokens = tokens[0]
    lm = opened.load(family.lm, device=device)
    with torch.no_grad():
        _, cache = lm.run_with_cache(**inputs, names=lambda n: re.fullmatch(r"embeddings\.out|layers\.\d+\.out", n))
    table = lens_table(cache, k=top_k)

    def decode(i: int) -> str:
        return opened.tokenizer.str_tokens([i])[0]

    top = [[decode(int(i)) for i in entry[:, 0]] for entry in table.token_ids]
    heading = (f"logit lens of {source}: the most likely token (probability) per layer and position; it predicts "
               f"{reads}")
    printed = heading + "\n\n" + format_table(table, tokens, top) + "\n"
    with staged(out) as staging:
        (staging / "lens.txt").write_text(printed, encoding="utf-8")
        (staging / "lens.json").write_text(json.dumps(_as_json(source, text, reads, tokens, table, decode), indent=1),
                                           encoding="utf-8")
        lens_png(table, tokens, top, staging / "lens.png", title=f"logit lens: {source}")
        files = written_files(staging, out)
    return LensResult(model=source, tokens=tokens, table=printed, files=files)


def format_table(table: LensTable, tokens: list[str], top: list[list[str]]) -> str:
    """Rows: the lens entries (0_pre ... final_post); columns: the input tokens; cells: token and probability."""
    header = [""] + [token_label(t, CELL) for t in tokens]
    body = [[label] + [f"{token_label(token, CELL - 5)} {float(p):.2f}" for token, p in zip(row, probs[:, 0])]
            for label, row, probs in zip(table.labels, top, table.probs)]
    widths = [max(len(line[c]) for line in [header, *body]) for c in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *body])


def _as_json(model: str, text: str, reads: str, tokens: list[str], table: LensTable, decode) -> dict:
    layers = []
    for label, ids, probs in zip(table.labels, table.token_ids.tolist(), table.probs.tolist()):
        layers.append({"label": label, "top": [[{"token": decode(i), "id": i, "prob": p} for i, p in zip(row, row_p)]
                                               for row, row_p in zip(ids, probs)]})
    return {"model": model, "text": text, "predicts": reads, "tokens": tokens, "layers": layers}
