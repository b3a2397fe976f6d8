"""Looking inside: cached tensors against transformers, edits through hooks, pictures, summary, `inspect`."""

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
import torch
import transformers
from PIL import Image, ImageStat

from scratch_models import BertModel, GPT2LMHeadModel
from scratch_models.parts import attention as attention_module
from scratch_models.analysis.heads import attention_summary, token_groups
from scratch_models.views.attention_page import AttentionPage
from scratch_models.views.attention_plots import (GRID_CELL, GRID_LEFT, GRID_RIGHT, GRID_TOP, HEAD_MAX, HEAD_MIN,
                                                  LABEL_PX, attention_grid_png, head_png, head_side, label_every)
from scratch_models.views.display import PNG
from scratch_models.hooking.inspection import AttentionCapture, attention_names, format_summary, summarize
from scratch_models_cli.cli import main
from scratch_models.registry.families import FAMILIES
from scratch_models_docs.hook_names import hook_names_markdown
from scratch_models_cli.verify import at_sighted
from weight_mapping import embedded_checkpoint
from helpers import assert_parity, each_family, model_sizes, padded_batch, reference, save, sighted
MINILM = embedded_checkpoint()
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def minilm():
    tokenizer = transformers.AutoTokenizer.from_pretrained(MINILM)
    batch = tokenizer(["Time flies like an arrow.", "A man plays a guitar."],
                      ["Fruit flies like a banana.", "The crowd listens closely to every note he plays."],
                      padding=True, return_tensors="pt")
    return tokenizer, BertModel.from_pretrained(MINILM), dict(batch)


def cached_by_default(model) -> list[str]:
    """What run_with_cache caches without `names`: every hook point but the opt-in ones (attn.result)."""
    return [name for name, point in model.hook_points().items() if not point.opt_in]


def check_output_fields(family: str, cache: dict, reference_out, num_layers: int, sizes: dict,
                        dims: dict | None = None, seen: torch.Tensor | None = None):
    """Every equality docs/hook_names.md claims (each family's output_fields) holds against transformers' outputs, at the queries
    marked in `seen` [b, s] (None: everywhere), located through the hook points' `dims`; within assert_parity's bound
    for the model's `sizes` (model_sizes)."""
    fields = {k: v for k, v in reference_out.items() if v is not None}
    declared = FAMILIES[family].output_fields
    final_norm = "hidden_states[-1]" in declared.values()  # transformers puts it in the last layer's place
    checked = 0
    for pattern, expression in declared.items():
        for i in range(num_layers) if "{i}" in pattern else [None]:
            if final_norm and pattern == "layers.{i}.out" and i == num_layers - 1:
                continue  # as the page says
            name = pattern.format(i=i)
            if name not in cache or expression.split("[")[0] not in fields:
                continue
            ref = eval(expression, {}, {**fields, "i": i})  # the page's own words, e.g. hidden_states[i + 1]
            if seen is not None:
                cache_at, ref = at_sighted(cache[name], dims[name], seen), at_sighted(ref, dims[name], seen)
            else:
                cache_at = cache[name]
            assert_parity(cache_at, ref, f"{name} = {expression}", **sizes)
            checked += 1
    return checked


def test_minilm_cache_equals_transformers_at_every_documented_point(minilm):
    _, model, batch = minilm
    reference = transformers.BertModel.from_pretrained(MINILM, attn_implementation="eager").eval()
    with torch.no_grad():
        out, cache = model.run_with_cache(**batch)
        ref = reference(**batch, output_hidden_states=True, output_attentions=True)
    assert set(cache) == set(cached_by_default(model))
    # embeddings.out, 6 x attention probabilities, 6 x layer output, pooler
    assert check_output_fields("bert", cache, ref, num_layers=6, sizes=model_sizes(model.config)) == 1 + 6 + 6 + 1
    assert torch.equal(out.last_hidden_state, cache["layers.5.out"])


@each_family
def test_lm_cache_equals_transformers_at_every_documented_point(tmp_path, family):
    """The family's LM on a batch padded on either side: embeddings.out, each layer's probabilities and output (the
    last one's place taken by the final norm where the family declares one as hidden_states[-1]), the logits;
    eager attention compares at the queries that see a key."""
    theirs = reference(family)
    model = FAMILIES[family].lm.from_pretrained(save(theirs, tmp_path))
    batch = padded_batch(family)
    with torch.no_grad():
        out, cache = model.run_with_cache(**batch)
        ref = theirs(**batch, output_hidden_states=True, output_attentions=True)
    seen = sighted(family, batch["attention_mask"])
    assert not seen.all()
    layers = len(model.layers)
    assert check_output_fields(family, cache, ref, num_layers=layers, sizes=model_sizes(model.config),
                               dims=model.hook_dims(), seen=seen) == 1 + layers + layers + 1
    if "hidden_states[-1]" in FAMILIES[family].output_fields.values():
        # the exception the page states: the last layer's output is not hidden_states[-1], the final norm's is
        assert not torch.allclose(cache[f"layers.{layers - 1}.out"], ref.hidden_states[-1])
    assert torch.equal(out.logits, cache["logits"])


def zero_value_weights_of_head(model, layer: int, head: int):
    attn = model.layers[layer].attn
    rows = slice(head * attn.head_dim, (head + 1) * attn.head_dim)
    with torch.no_grad():
        if hasattr(attn, "value"):  # BERT: nn.Linear, weight [out, in]
            attn.value.weight[rows] = 0
            attn.value.bias[rows] = 0
        else:  # GPT-2: Conv1D, weight [in, 3 * out] holding q, k, v side by side
            hidden = attn.c_proj.weight.shape[0]
            columns = slice(2 * hidden + rows.start, 2 * hidden + rows.stop)
            attn.c_attn.weight[:, columns] = 0
            attn.c_attn.bias[columns] = 0


def kill_head(head: int):
    def edit(context, name):
        context = context.clone()
        context[:, head] = 0
        return context
    return edit


def test_zeroing_a_heads_output_equals_zeroing_its_value_weights_bert(minilm):
    """BERT's value weights: an nn.Linear of its own (GPT-2's Conv1D layout below)."""
    _, model, batch = minilm
    with torch.no_grad():
        clean = model(**batch).last_hidden_state
        edited = model.run_with_hooks(**batch, hooks=[("layers.2.attn.context", kill_head(5))]).last_hidden_state
        surgery = BertModel.from_pretrained(MINILM)
        zero_value_weights_of_head(surgery, layer=2, head=5)
        expected = surgery(**batch).last_hidden_state
    assert torch.equal(edited, expected)
    assert float((edited - clean).abs().max()) > 1e-3  # the head mattered


def test_zeroing_a_heads_output_equals_zeroing_its_value_weights_gpt2(tiny_gpt2):
    """GPT-2's value weights: columns of the Conv1D that holds q, k and v side by side."""
    directory, _, _ = tiny_gpt2
    ids = torch.arange(3, 23)[None]
    with torch.no_grad():
        model = GPT2LMHeadModel.from_pretrained(directory)
        edited = model.run_with_hooks(ids, hooks=[("layers.0.attn.context", kill_head(1))]).logits
        zero_value_weights_of_head(model, layer=0, head=1)
        expected = model(ids).logits
    assert torch.equal(edited, expected)


def test_patching_a_layer_output_carries_the_other_runs_values_downstream(minilm):
    tokenizer, model, _ = minilm
    # same length and no padding, so only the residual stream differs between the runs
    clean = tokenizer(["The cat sat on the mat."], return_tensors="pt")
    corrupt = tokenizer(["The dog lay on the rug."], return_tensors="pt")
    assert clean["input_ids"].shape == corrupt["input_ids"].shape
    with torch.no_grad():
        corrupt_out, corrupt_cache = model.run_with_cache(**corrupt, names=lambda n: n.endswith(".out"))
        clean_out = model(**clean)
        patched_out, patched_cache = model.run_with_cache(
            **clean, names=lambda n: n.endswith(".out"),
            hooks=[("layers.2.out", lambda t, name: corrupt_cache[name])])
    for name in ("layers.3.out", "layers.5.out", "pooler.out"):
        assert torch.equal(patched_cache[name], corrupt_cache[name]), name
    assert torch.equal(patched_out.pooler_output, corrupt_out.pooler_output)
    assert not torch.equal(patched_cache["layers.1.out"], corrupt_cache["layers.1.out"])  # upstream untouched
    assert not torch.equal(clean_out.pooler_output, corrupt_out.pooler_output)


def test_hook_api_names_context_manager_and_errors(minilm, monkeypatch):
    _, model, batch = minilm
    names = model.hook_names()
    listened = cached_by_default(model)  # the norms' scale and normalized points (TL's) are opt-in
    assert listened[:5] == ["embeddings.word", "embeddings.token_type", "embeddings.position", "embeddings.sum",
                            "embeddings.out"]
    assert listened[-1] == "pooler.out" and len(listened) == 5 + 6 * 14 + 1
    assert [name for name in names if name in listened] == listened
    assert set(model.hook_docs()) == set(names) and all(model.hook_docs().values())

    fused_calls = []
    real_sdpa = attention_module.F.scaled_dot_product_attention
    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention",
                        lambda *a, **k: fused_calls.append(1) or real_sdpa(*a, **k))
    with torch.no_grad():
        _, cache = model.run_with_cache(**batch, names=["layers.3.attn.probs", "layers.0.mlp.post_act"])
        assert list(cache) == ["layers.0.mlp.post_act", "layers.3.attn.probs"]  # forward order
        assert cache["layers.3.attn.probs"].shape == (2, 12, batch["input_ids"].shape[1], batch["input_ids"].shape[1])
        assert len(fused_calls) == 5  # layer 3 took the explicit path for this call only
        model(**batch)
        assert len(fused_calls) == 11  # and the next call is fused again in every layer

        seen = []
        with model.hooks([("layers.1.out", lambda t, name: seen.append(name))]):  # None: leave the tensor be
            inside = model(**batch).last_hidden_state
        assert seen == ["layers.1.out"]
        assert torch.equal(inside, model(**batch).last_hidden_state)
        model(**batch)
        assert seen == ["layers.1.out"]  # detached when the block ended
        assert not any(p.active for p in model.hook_points().values())

    with pytest.raises(ValueError, match=r"unknown hook point 'layers.3.attn.prob'; did you mean layers.3.attn.probs"):
        model.run_with_cache(**batch, names=["layers.3.attn.prob"])
    with pytest.raises(ValueError, match="did you mean .*layers.2.mlp.post_act"):
        model.run_with_hooks(**batch, hooks=[("layers.2.ffn.post_act", lambda t, n: None)])


@pytest.fixture(scope="module")
def pair_capture(minilm):
    tokenizer, model, _ = minilm
    batch = tokenizer("time flies like an arrow", "fruit flies like a banana", return_tensors="pt")
    with torch.no_grad():
        _, cache = model.run_with_cache(**batch, names=attention_names)
    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
    b_start = batch["token_type_ids"][0].tolist().index(1)
    return AttentionCapture.from_cache(cache, tokens, sentence_b_start=b_start), cache


def test_attention_capture_holds_one_sequence_of_every_layer(pair_capture):
    capture, cache = pair_capture
    seq = len(capture.tokens)
    assert capture.probs.shape == (6, 12, seq, seq) and capture.q.shape == (6, 12, seq, 32)
    assert torch.equal(capture.probs[3], cache["layers.3.attn.probs"][0])
    assert capture.tokens[capture.sentence_b_start - 1] == "[SEP]"
    assert capture.positions == list(range(seq)) and capture.input_length == seq and capture.part == ""
    with pytest.raises(ValueError, match="tokens: 3 given for attention over"):
        AttentionCapture.from_cache(cache, capture.tokens[:3])
    with pytest.raises(ValueError, match="lacks layers.0.attn.q"):
        AttentionCapture.from_cache({k: v for k, v in cache.items() if k != "layers.0.attn.q"}, capture.tokens)
    with pytest.raises(ValueError, match="row=1 is out of range: the cache holds a batch of 1"):
        AttentionCapture.from_cache(cache, capture.tokens, row=1)


def test_capture_checks_its_fields_naming_the_one_at_fault(pair_capture):
    capture, _ = pair_capture
    fields = dict(tokens=capture.tokens, probs=capture.probs, scores=capture.scores, q=capture.q, k=capture.k)
    seq = len(capture.tokens)
    for change, message in [
        (dict(tokens=capture.tokens[:-1]), rf"probs must be \[L, H, S, S\] with S = len\(tokens\) = {seq - 1}"),
        (dict(scores=capture.scores[..., :-1]), rf"scores shape \(6, 12, {seq}, {seq - 1}\) differs from probs"),
        (dict(k=capture.k[..., :4]), rf"k shape \(6, 12, {seq}, 4\) differs from q shape \(6, 12, {seq}, 32\)"),
        (dict(q=capture.q[:2], k=capture.k[:2]), r"q shape \(2, 12, .*does not match probs"),
        (dict(q=capture.q.long()), "q must be a 4-d floating point tensor"),
        (dict(probs=capture.probs.clone().index_fill_(0, torch.tensor(0), float("nan"))), "probs contains NaN"),
        (dict(sentence_b_start=seq), f"sentence_b_start must be None or in 0..{seq - 1}, got {seq}"),
        (dict(positions=[0] * seq), f"positions must be {seq} increasing indices in 0..{seq - 1}"),
        (dict(tokens=[]), "tokens must be a non-empty list of strings"),
    ]:
        with pytest.raises(ValueError, match=message):
            AttentionCapture(**{**fields, **change})


def padded_minilm_row(minilm):
    tokenizer, model, batch = minilm
    with torch.no_grad():
        _, cache = model.run_with_cache(**batch, names=attention_names)
    return tokenizer, batch, cache


def test_capture_leaves_out_right_padding(minilm):
    tokenizer, batch, cache = padded_minilm_row(minilm)
    mask = batch["attention_mask"][0]
    real = int(mask.sum())
    assert real < len(mask)  # row 0 is the shorter pair: padded on the right
    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
    b_start = batch["token_type_ids"][0].tolist().index(1)
    capture = AttentionCapture.from_cache(cache, tokens, sentence_b_start=b_start)
    assert "[PAD]" in tokens and "[PAD]" not in capture.tokens and capture.tokens == tokens[:real]
    assert capture.positions == list(range(real)) and capture.input_length == len(mask)
    assert capture.part == f"{real} of {len(mask)} positions: 0..{real - 1}" and capture.sentence_b_start == b_start
    assert torch.equal(capture.probs[2], cache["layers.2.attn.probs"][0, :, :real, :real])
    assert torch.allclose(capture.probs.sum(-1), torch.ones(()))  # nothing the model attended to was cut off
    assert torch.equal(capture.q, torch.stack([cache[f"layers.{i}.attn.q"][0, :, :real] for i in range(6)]))
    kept = AttentionCapture.from_cache(cache, tokens, sentence_b_start=b_start, drop_padding=False)
    assert kept.tokens == tokens and kept.part == ""
    # the longer row has no padding: nothing is left out
    assert len(AttentionCapture.from_cache(cache, tokenizer.convert_ids_to_tokens(batch["input_ids"][1]),
                                           row=1).tokens) == len(mask)


def test_capture_of_an_all_masked_row_is_refused(minilm):
    tokenizer, model, batch = minilm
    mask = batch["attention_mask"].clone()
    mask[1] = 0
    with torch.no_grad():
        _, cache = model.run_with_cache(**{**batch, "attention_mask": mask}, names=attention_names)
    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][1])
    with pytest.raises(ValueError, match="row 1: every position is masked"):
        AttentionCapture.from_cache(cache, tokens, row=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_capture_leaves_out_left_padding_gpt2(tiny_gpt2, dtype):
    directory, tokenizer, _ = tiny_gpt2
    model = GPT2LMHeadModel.from_pretrained(directory, dtype=dtype)
    ids = torch.tensor([[0, 0, 0, 11, 12, 13, 14], [21, 22, 23, 24, 25, 26, 27]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1] * 7])
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, attention_mask=mask, names=attention_names)
    tokens = [f"t{i}" for i in range(7)]
    capture = AttentionCapture.from_cache(cache, tokens)
    assert capture.tokens == tokens[3:] and capture.positions == [3, 4, 5, 6]
    assert capture.probs.dtype == torch.float32 and capture.probs.shape == (2, 3, 4, 4)
    assert torch.equal(capture.probs, torch.stack([cache[f"layers.{i}.attn.probs"][0, :, 3:, 3:]
                                                   for i in range(2)]).float())
    # the causal mask stays, marked in the capture's own terms; no padding is left to mark
    assert torch.equal(capture.masked[0, 0], torch.ones(4, 4, dtype=torch.bool).triu(1))
    assert len(AttentionCapture.from_cache(cache, tokens, row=1).tokens) == 7  # the last key is not padding


def test_window_cuts_out_a_stretch_of_tokens(pair_capture):
    capture, _ = pair_capture
    b = capture.sentence_b_start
    part = capture.window(2, b + 2)
    assert part.tokens == capture.tokens[2:b + 2] and part.positions == list(range(2, b + 2))
    assert part.sentence_b_start == b - 2 and torch.equal(part.probs, capture.probs[..., 2:b + 2, 2:b + 2])
    assert capture.window(b, b + 1).sentence_b_start == 0  # segment B only
    assert capture.window(0, b).sentence_b_start is None  # segment A only
    assert capture.window(1, 3).window(1, 2).positions == [2]
    with pytest.raises(ValueError, match="window 3:3 must satisfy"):
        capture.window(3, 3)


def png_pixels(picture):
    data = picture.data if isinstance(picture, PNG) else Path(picture).read_bytes()
    with Image.open(io.BytesIO(data)) as image:
        image.verify()  # a well-formed PNG
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    if isinstance(picture, PNG):
        assert image.size == (picture.width, picture.height) and picture._repr_png_() == data
    return image


def test_pngs_are_real_images_of_the_documented_size(pair_capture, tmp_path):
    capture, _ = pair_capture
    grid = png_pixels(attention_grid_png(capture))
    # the size contract in the module docstring
    assert (GRID_CELL, GRID_LEFT, GRID_TOP, GRID_RIGHT) == (80, 60, 50, 90)
    assert grid.size == (60 + 12 * 80 + 90, 50 + 6 * 80)
    head = head_png(capture, 2, 3)
    assert head_side(len(capture.tokens)) == HEAD_MIN == 560
    assert png_pixels(head).size == (190 + 560 + 110, 50 + 560 + 170)
    for image in (grid, png_pixels(head)):
        assert max(ImageStat.Stat(image.convert("L")).stddev) > 20  # drawn on, not blank
    assert head.save(tmp_path / "head.png").read_bytes() == head.data
    with pytest.raises(ValueError, match="head=12 is out of range"):
        head_png(capture, 0, 12)


def test_head_png_labels_stay_readable_for_long_inputs():
    for count in range(1, 1025):
        side, every = head_side(count), label_every(count)
        assert HEAD_MIN <= side <= HEAD_MAX
        assert side / count * every >= LABEL_PX  # each label gets its 14 px: none overlaps the next
        assert every == 1 or side == HEAD_MAX  # labels thin out only once the image is as large as it gets
    assert label_every(60) == 1 and head_side(60) == 840 and label_every(512) == 4
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 300, 4, generator=g), torch.randn(1, 1, 300, 4, generator=g)
    scores = q @ k.transpose(-1, -2)
    long = AttentionCapture([f"w{i}" for i in range(300)], scores.softmax(-1), scores, q, k)
    assert png_pixels(head_png(long, 0, 0)).size == (190 + 2000 + 110, 50 + 2000 + 170)


def test_pictures_of_tensors_that_carry_gradients():
    """run_with_cache detaches what it caches; tensors computed by hand may still carry an autograd graph."""
    q = torch.randn(1, 2, 5, 4, requires_grad=True)
    k = torch.randn(1, 2, 5, 4, requires_grad=True)
    scores = q @ k.transpose(-1, -2) / 2
    capture = AttentionCapture([f"w{i}" for i in range(5)], scores.softmax(-1), scores, q, k)
    assert not any(t.requires_grad for t in (capture.probs, capture.scores, capture.q, capture.k))
    assert png_pixels(head_png(capture, 0, 1)).size[0] > 0 and "w4" in AttentionPage(capture).html


def test_summary_describes_every_cached_tensor(tiny_gpt2):
    directory, _, _ = tiny_gpt2
    model = GPT2LMHeadModel.from_pretrained(directory)
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.arange(5, 12)[None])
    rows = summarize(cache)
    assert [r["name"] for r in rows] == cached_by_default(model)
    probs = next(r for r in rows if r["name"] == "layers.1.attn.probs")
    tensor = cache["layers.1.attn.probs"].double()
    assert probs["shape"] == [1, 3, 7, 7] and probs["masked"] == 0
    assert probs["mean"] == pytest.approx(float(tensor.mean())) and probs["max"] == pytest.approx(float(tensor.max()))
    scores = next(r for r in rows if r["name"] == "layers.0.attn.scores")
    assert scores["masked"] == 3 * (7 * 6 // 2)  # the causal mask's upper triangle, apart from the statistics
    assert scores["min"] > -1e3
    text = format_summary(rows)
    assert text.splitlines()[0].split() == ["name", "shape", "dtype", "mean", "std", "min", "max", "masked"]
    assert len(text.splitlines()) == len(rows) + 1
    assert re.search(r"^layers\.0\.attn\.scores +1x3x7x7 +float32 .* 63$", text, re.M)


def test_cli_inspect_embedded_pair_writes_every_picture_offline(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    assert main(["inspect", "time flies like an arrow", "--pair", "fruit flies like a banana", "--out", str(out),
                 "--layer", "2", "--head", "3", "--token", "4"]) == 0
    printed = capsys.readouterr().out
    assert "'[CLS]' 'time' 'flies' 'like' 'an' 'arrow' '[SEP]' 'fruit' 'flies' 'like' 'a' 'banana' '[SEP]'" in printed
    assert sorted(p.name for p in out.iterdir()) == ["attention.html", "attention_grid.png", "head_L2_H3.png",
                                                      "summary.json", "summary.txt"]
    page = (out / "attention.html").read_text(encoding="utf-8")
    assert not re.search(r"https?://", page) and "<script" in page
    # the heads view: what each head of this run attends to, the numbers attention_summary gives for it
    tokenizer = transformers.AutoTokenizer.from_pretrained(MINILM)
    batch = dict(tokenizer("time flies like an arrow", "fruit flies like a banana", return_tensors="pt"))
    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
    expected = attention_summary(BertModel.from_pretrained(MINILM), batch, token_groups([tokens], ["[CLS]", "[SEP]"]))
    heads = json.loads(re.search(r'id="attention-data">(.*?)</script>', page, re.S).group(1))["heads"]
    assert 'id="heads-view"' in page and heads["labels"] == expected.labels and len(heads["labels"]) == 6
    assert set(heads["shares"]) == {"[CLS]", "[SEP]", "punct", "self", "prev", "next"}
    for got, want in [(heads["entropy"], expected.entropy),
                      *((heads["shares"][name], values) for name, values in expected.shares.items())]:
        assert torch.equal(torch.tensor(got, dtype=torch.float64), want)
    assert png_pixels(out / "attention_grid.png").size == (1110, 530)
    summary = json.loads((out / "summary.json").read_text())
    assert [t["name"] for t in summary["tensors"]] == cached_by_default(BertModel.from_pretrained(MINILM))
    assert summary["tokens"][6] == "[SEP]" and (out / "summary.txt").read_text().count("\n") > 90


def test_cli_inspect_rerun_leaves_no_stale_head_png(tiny_gpt2, tmp_path, capsys):
    directory, _, _ = tiny_gpt2
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "head_L0_H0.png.bak").write_text("mine too")
    assert main(["inspect", str(directory), "Once upon a time", "--out", str(out), "--head", "2"]) == 0
    assert (out / "head_L0_H2.png").is_file()
    capsys.readouterr()
    assert main(["inspect", str(directory), "Once upon a time", "--out", str(out), "--layer", "1"]) == 0
    assert f"removed {out / 'head_L0_H2.png'} (an earlier run's)" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["attention.html", "attention_grid.png", "head_L0_H0.png.bak",
                                                      "head_L1_H0.png", "notes.txt", "summary.json", "summary.txt"]
    # a failed run changes nothing, stale or not
    assert main(["inspect", str(directory), "Once upon a time", "--out", str(out), "--head", "9"]) == 2
    assert (out / "head_L1_H0.png").is_file()


def test_cli_inspect_window(tiny_gpt2, tmp_path, capsys):
    directory, tokenizer, _ = tiny_gpt2
    text = "Once upon a time there lived a cat. The meaning of life is to learn."
    count = len(tokenizer(text)["input_ids"])
    out = tmp_path / "out"
    assert main(["inspect", str(directory), text, "--out", str(out), "--window", "3:9", "--token", "5"]) == 0
    printed = capsys.readouterr().out
    assert f"attention.html: Tokens 3..8 of {count} are shown" in printed
    page = (out / "attention.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="attention-data">(.*?)</script>', page, re.S).group(1))
    assert data["positions"] == list(range(3, 9)) and data["query"] == 2
    assert f"6 of {count} positions: 3..8" in page
    for flags, message in [(["--window", "5:3"], f"--window 5:3 must satisfy 0 <= START < END <= {count}"),
                           (["--window", "0:4", "--token", "4"], r"--token 4 is out of range 0..3 \(--window 0:4\)"),
                           (["--window", "3"], "argument --window: expected START:END, two token indices, got '3'")]:
        with pytest.raises(SystemExit) if "argument" in message else contextlib.nullcontext():
            assert main(["inspect", str(directory), text, "--out", str(tmp_path / "bad"), *flags]) == 2
        assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "bad").exists()


def test_cli_inspect_gpt2_and_errors_leave_nothing(tiny_gpt2, tmp_path, capsys):
    directory, _, _ = tiny_gpt2
    assert main(["inspect", str(directory), "Once upon a time", "--out", str(tmp_path / "g"), "--head", "2"]) == 0
    assert (tmp_path / "g" / "head_L0_H2.png").is_file()
    capsys.readouterr()

    assert main(["inspect", str(directory), "Once", "--out", str(tmp_path / "bad"), "--head", "3"]) == 2
    assert "--head 3 is out of range 0..2" in capsys.readouterr().err
    assert main(["inspect", str(directory), "Once", "--pair", "upon", "--out", str(tmp_path / "bad")]) == 2
    assert "--pair: gpt2 has no sentence pairs" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()  # checked before anything is written


def test_our_attentions_feed_bertviz_unchanged(minilm):
    import bertviz  # in the test extras: a missing bertviz fails here rather than skipping

    tokenizer, model, _ = minilm
    batch = tokenizer("time flies like an arrow", "fruit flies like a banana", return_tensors="pt")
    with torch.no_grad():
        attentions = model(**batch, output_attentions=True).attentions
    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
    b_start = batch["token_type_ids"][0].tolist().index(1)
    head = bertviz.head_view(attentions, tokens, sentence_b_start=b_start, html_action="return")
    grid = bertviz.model_view(attentions, tokens, sentence_b_start=b_start, html_action="return")
    ours = torch.stack(attentions).squeeze(1).double()  # layer x head x query x key
    for html in (head.data, grid.data):
        # bertviz inlines its parameters as JSON; what it draws must be exactly our tensor
        params, _ = json.JSONDecoder().raw_decode(html, html.index('{"attention": '))
        everything = params["attention"][0]
        assert everything["left_text"] == tokens
        assert torch.equal(torch.tensor(everything["attn"], dtype=torch.float64), ours)
        a_to_b = next(view for view in params["attention"] if view["name"] == "Sentence A -> Sentence B")
        assert torch.equal(torch.tensor(a_to_b["attn"], dtype=torch.float64), ours[:, :, :b_start, b_start:])


def test_hook_names_page_is_generated_from_the_current_code():
    """docs/hook_names.md is what the code generates now. (make_docs.py --check also regenerates the walkthrough
    and reruns the tutorial in a Jupyter kernel: test_walkthrough.py and test_tutorial.py check those pages, once
    each in the suite.)"""
    page = (REPO / "docs" / "hook_names.md").read_text(encoding="utf-8")
    assert page == hook_names_markdown(), "regenerate with `python scripts/make_docs.py`"
    listed = set(re.findall(r"^\| `([^`]+)` \|", page, re.M))
    real = BertModel.from_pretrained(MINILM).hook_names()
    assert {re.sub(r"^layers\.\d+\.", "layers.{i}.", n) for n in real} <= listed
    assert "`layers.{i}.out` | [b, s, h] the layer's output, after the MLP's LayerNorm | `hidden_states[i + 1]`" in page
