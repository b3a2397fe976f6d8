"""`scratch-models inspect`: one text (or sentence pair) through our model, every tensor cached, and pictures.

Writes into the output directory:
    attention.html          head view, model view, neuron view and heads view (what each head attends to, as
                            a layer x head grid and a ranked table) in one page that opens offline (bounded in
                            size: a long input shows a window of tokens, and says so)
    attention_grid.png      every layer x head
    head_L{l}_H{h}.png      the chosen head, tokens on both axes
    summary.txt, .json      shape, mean, std, min, max of every cached tensor
All files are written into a hidden staging directory inside `--out` and moved in only when complete, so an
error leaves nothing half-written. A head PNG of an earlier run (another --layer or --head) is removed then, so
the directory holds one run's pictures; files of other names are left alone.
"""

import dataclasses
import json
import os
import re
import time
from pathlib import Path

import torch

from scratch_models.analysis.heads import AttentionSummary
from scratch_models.views.attention_page import AttentionPage
from scratch_models.views.attention_plots import attention_grid_png, head_png
from scratch_models.hooking.inspection import AttentionCapture, format_summary, summarize
from weight_mapping import staged

from .common import check_writable_directory, encode, key_groups, open_model, require_device, written_files


HEAD_PNG = re.compile(r"head_L\d+_H\d+\.png")  # the one name inspect writes that changes between runs


@dataclasses.dataclass
class InspectResult:
    model: str
    tokens: list[str]
    files: list[Path]
    removed: list[Path]  # head PNGs of an earlier run
    notice: str | None  # what the page leaves out, and why
    seconds: float


def inspect(model, text: str, *, pair: str | None = None, out: str | os.PathLike,
            layer: int = 0, head: int = 0, token: int | None = None, window: tuple[int, int] | None = None,
            device: str = "cpu") -> InspectResult:
    """`model`: a checkpoint as open_model takes it (None: minilm). `token` (default: the first of the window) is
    the neuron view's query; `window` (start, end) limits the page and the PNGs to tokens start..end-1."""
    began = time.perf_counter()
    require_device(device)
    check_writable_directory("--out", out)
    opened = open_model(model)
    inputs, tokens = encode(opened, text, pair, device=device,
                            names=["the text" + (" with --pair" if pair is not None else "")])
    tokens = tokens[0]
    segments = opened.tokenizer.sequence_ids(text, pair)  # an empty --pair is none, as encode reads it
    b_start = segments.index(1) if 1 in segments else None
    # the task head too when the checkpoint has one, so its logits are cached as well
    ours = opened.load(opened.widest_model(sequences_only=True), device=device)
    for name, value, count in (("--layer", layer, len(ours.layers)), ("--head", head, ours.layers[0].attn.num_heads)):
        if not 0 <= value < count:
            raise ValueError(f"{name} {value} is out of range 0..{count - 1}")
    if window is not None and not 0 <= window[0] < window[1] <= len(tokens):
        raise ValueError(f"--window {window[0]}:{window[1]} must satisfy 0 <= START < END <= {len(tokens)} (tokens)")
    start, end = window or (0, len(tokens))
    token = start if token is None else token
    if not start <= token < end:
        raise ValueError(f"--token {token} is out of range {start}..{end - 1}"
                         + (f" (--window {start}:{end})" if window else ""))

    with torch.no_grad():
        _, cache = ours.run_with_cache(**inputs)
    capture = AttentionCapture.from_cache(cache, tokens, sentence_b_start=b_start)  # one text: no padding
    heads = AttentionSummary.from_cache(cache, key_groups(opened, [tokens], inputs["attention_mask"]))
    label = opened.source
    summary = summarize(cache)
    page = AttentionPage(capture, layer=layer, head=head, query=token, window=window, title=label, heads=heads)
    pictured = capture if window is None else capture.window(*window)

    with staged(out) as staging:
        page.save(staging / "attention.html")
        attention_grid_png(pictured, title=label).save(staging / "attention_grid.png")
        head_png(pictured, layer, head, title=label).save(staging / f"head_L{layer}_H{head}.png")
        heading = f"{label}\ntokens: {' '.join(map(repr, tokens))}\n\n"
        (staging / "summary.txt").write_text(heading + format_summary(summary) + "\n", encoding="utf-8")
        (staging / "summary.json").write_text(json.dumps(
            {"model": label, "text": text, "pair": pair, "tokens": tokens, "tensors": summary}, indent=1),
            encoding="utf-8")
        files = written_files(staging, out)
    written = {file.name for file in files}
    directory = Path(out).expanduser()
    removed = sorted(f for f in directory.iterdir() if HEAD_PNG.fullmatch(f.name) and f.name not in written)
    for stale in removed:
        stale.unlink()
    return InspectResult(model=label, tokens=tokens, files=files, removed=removed, notice=page.notice,
                         seconds=time.perf_counter() - began)
