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
from scratch_models.tokenizer import NoTokenizerJson
from weight_mapping import CheckpointError, open_checkpoint, staged

from .common import at_least_one, family_of, require_device, require_tokenizer, written_files

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
    checkpoint = open_checkpoint(model)
    family = family_of(checkpoint)
    config = family.config_class.from_json_file(checkpoint.config_path)
    missing = family.missing_head_tensors(checkpoint, config, family.lm)
    if missing:
        raise CheckpointError(f"{model}: the logit lens reads the layers with {family.lm.__name__}'s head, and this "
                              f"checkpoint has none (no {', '.join(missing[:3])}): give one saved with it")
    reads = "the token after each position" if family.causal else "the token at each position (masked-LM head)"
    lm = family.lm.from_pretrained(model, device=device)
    inputs, tokens, decode = _encode(lm, checkpoint, text, device)
    with torch.no_grad():
        _, cache = lm.run_with_cache(**inputs, names=lambda n: re.fullmatch(r"embeddings\.out|layers\.\d+\.out", n))
    table = lens_table(cache, k=top_k)
    top = [[decode(int(i)) for i in entry[:, 0]] for entry in table.token_ids]
    heading = (f"logit lens of {model}: the most likely token (probability) per layer and position; it predicts "
               f"{reads}")
    printed = heading + "\n\n" + format_table(table, tokens, top) + "\n"
    with staged(out) as staging:
        (staging / "lens.txt").write_text(printed, encoding="utf-8")
        (staging / "lens.json").write_text(json.dumps(_as_json(model, text, reads, tokens, table, decode), indent=1),
                                           encoding="utf-8")
        lens_png(table, tokens, top, staging / "lens.png", title=f"logit lens: {model}")
        files = written_files(staging, out)
    return LensResult(model=model, tokens=tokens, table=printed, files=files)


def format_table(table: LensTable, tokens: list[str], top: list[list[str]]) -> str:
    """Rows: the lens entries (0_pre ... final_post); columns: the input tokens; cells: token and probability."""
    header = [""] + [token_label(t, CELL) for t in tokens]
    body = [[label] + [f"{token_label(token, CELL - 5)} {float(p):.2f}" for token, p in zip(row, probs[:, 0])]
            for label, row, probs in zip(table.labels, top, table.probs)]
    widths = [max(len(line[c]) for line in [header, *body]) for c in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *body])


def _encode(lm, checkpoint, text: str, device: str):
    """(model inputs, the input tokens as strings, id -> string) from the checkpoint's tokenizer.json, or from
    transformers' tokenizer when the checkpoint has only vocab files."""
    try:
        inputs = lm.tokenizer(text, device=device)
        return inputs, lm.to_str_tokens(inputs["input_ids"]), lambda i: lm.tokenizer.str_tokens([i])[0]
    except NoTokenizerJson:
        tokenizer = require_tokenizer(checkpoint)
    batch = tokenizer(text, return_tensors="pt")
    inputs = {name: batch[name].to(device) for name in lm.family.input_names if name in batch}
    return inputs, [tokenizer.decode([i]) for i in batch["input_ids"][0].tolist()], lambda i: tokenizer.decode([i])


def _as_json(model: str, text: str, reads: str, tokens: list[str], table: LensTable, decode) -> dict:
    layers = []
    for label, ids, probs in zip(table.labels, table.token_ids.tolist(), table.probs.tolist()):
        layers.append({"label": label, "top": [[{"token": decode(i), "id": i, "prob": p} for i, p in zip(row, row_p)]
                                               for row, row_p in zip(ids, probs)]})
    return {"model": model, "text": text, "predicts": reads, "tokens": tokens, "layers": layers}
