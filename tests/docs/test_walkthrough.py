"""docs/walkthrough.md: generated from the current code, its excerpts quoted from the lines it links, its
pictures real PNGs, and a quoted line that disappears from the code is a loud error."""

import math
import re
import shutil
import textwrap
from pathlib import Path

import pytest
from PIL import Image

from scratch_models.parts import attention
from scratch_models.bert.model import BertSelfAttention
from scratch_models_docs import hook_names as docs
from scratch_models_docs.walkthrough import ExcerptError, excerpt, image_paths, walkthrough_markdown

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "walkthrough.md"
# the link the generator puts above each excerpt, then the excerpt itself
EXCERPT = re.compile(r"^\[(?P<path>[^\]#]+)#L(?P<first>\d+)(?:-L(?P<last>\d+))?\]"
                     r"\(\.\./(?P=path)#L(?P=first)(?:-L(?P=last))?\)\n\n```python\n(?P<code>.*?)```$", re.M | re.S)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    images = tmp_path_factory.mktemp("walkthrough-images")
    return walkthrough_markdown(images), images


def assert_png(path: Path):
    with Image.open(path) as image:
        assert image.format == "PNG", path
        assert min(image.size) >= 100, path
        image.verify()


def test_the_committed_page_is_what_the_code_generates_now(generated):
    markdown, images = generated
    assert PAGE.read_text(encoding="utf-8") == markdown, "regenerate with `python scripts/make_docs.py`"
    drawn = [images / path.name for path in image_paths(markdown, Path())]
    assert drawn, "the page shows no picture"
    for path in drawn:
        assert_png(path)


def test_every_picture_the_page_references_is_committed_as_a_png():
    page = PAGE.read_text(encoding="utf-8")
    paths = image_paths(page, PAGE.parent)
    assert len(paths) == 4
    for path in paths:
        assert path.parent == REPO / "docs" / "images"
        assert_png(path)


def test_every_excerpt_is_the_source_at_the_lines_it_links():
    page = PAGE.read_text(encoding="utf-8")
    found = list(EXCERPT.finditer(page))
    runnable = page.count("**The lines that make them.**\n\n```python\n")  # a reader's lines, not an excerpt
    assert len(found) == page.count("```python\n") - runnable >= 15, "a code block without its source link"
    for match in found:
        lines = (REPO / match["path"]).read_text(encoding="utf-8").splitlines(keepends=True)
        first, last = int(match["first"]), int(match["last"] or match["first"])
        assert match["code"] == textwrap.dedent("".join(lines[first - 1:last])), match[0][:80]


def test_an_anchor_missing_from_the_code_is_a_clear_error():
    with pytest.raises(ExcerptError, match=r"attend \(scratch_models/parts/attention\.py\).*'s = q @ k\.T / 8'"):
        excerpt(attention.attend, "s = q @ k.T / 8")
    with pytest.raises(ExcerptError, match=r"BertSelfAttention\.forward.*'no such end'"):
        excerpt(BertSelfAttention.forward, "q = self.q(", "no such end")
    whole = excerpt(BertSelfAttention.split_heads)
    assert whole.code.startswith("def split_heads(self, x):") and whole.last == whole.first + 1


def test_the_check_reports_an_edited_page_and_a_missing_picture(tmp_path, monkeypatch):
    shutil.copy(REPO / "docs" / "hook_names.md", tmp_path / "hook_names.md")
    (tmp_path / "walkthrough.md").write_text(PAGE.read_text(encoding="utf-8") + "edited by hand\n", encoding="utf-8")
    monkeypatch.setattr(docs, "DOCS", tmp_path)
    stale = docs.write_docs(check=True)
    assert stale == [tmp_path / "walkthrough.md", *image_paths(PAGE.read_text(encoding="utf-8"), tmp_path)]


def test_the_gelu_section_says_which_gelu_bert_was_trained_with_and_how_far_transformers_is_from_it():
    """Original BERT (and GPT-2) trained with the tanh GELU; transformers runs BERT with the exact one. The page
    says so, with the largest gap between the two, which it measures."""
    import torch

    from scratch_models.parts import activations

    page = PAGE.read_text(encoding="utf-8")
    section = page[page.index("## 6. GELU"):page.index("## 7.")]
    assert "both models were trained with it" in section and "google-research/bert" in section
    line = torch.linspace(-10, 10, 20001, dtype=torch.float64)
    gap = float((activations.gelu_new(line) - activations.gelu(line)).abs().max())
    assert 4e-4 < gap < 5e-4
    assert f"never differ by more than\n{gap:.1e}" in section


def test_no_number_on_the_page_is_a_zero_rounded_to_four_decimals():
    """"at most 0.0000 (to four decimals)" says nothing a reader can use: a difference is stated exactly, or as a
    bound the generator checks."""
    page = PAGE.read_text(encoding="utf-8")
    assert not re.search(r"(at most|within) -?0\.0000\b", page)
    padding = page[page.index("So padding changes nothing"):][:300]
    assert "up to float64 rounding" in padding and "below\n1e-12" in padding


def test_gpt_neox_has_a_chapter_on_rotary_embeddings_and_the_parallel_residual():
    from scratch_models.parts.rotary import RotaryEmbedding, rotate

    page = PAGE.read_text(encoding="utf-8")
    chapter = page[page.index("## 8. GPT-NeoX"):page.index("## Where to go next")]
    assert "rotary" in chapter and "parallel residual" in chapter and "resid_mid" in chapter
    for function in (RotaryEmbedding.forward, rotate):
        assert excerpt(function).code in chapter
    # the table shows the score depending on the distance alone: equal for equal m - n, different otherwise
    rows = re.findall(r"^\| (\d+) \| (\d+) \| (\d+) \| (-?\d+\.\d{4}) \|$", chapter, re.M)
    by_distance = {}
    for _, _, distance, score in rows:
        by_distance.setdefault(distance, set()).add(score)
    assert len(rows) >= 3 and len(by_distance) >= 2 and all(len(s) == 1 for s in by_distance.values())


def test_where_to_go_next_names_what_is_there():
    """Every family's mapping table, the notebook and the tiny models, each a file or command that exists."""
    from scratch_models.registry.families import FAMILIES

    page = PAGE.read_text(encoding="utf-8")
    section = page[page.index("## Where to go next"):]
    for name in FAMILIES:
        assert f"`weight_mapping/{name}.py`" in section and (REPO / "weight_mapping" / f"{name}.py").is_file()
    assert "(tutorial.ipynb)" in section and "scratch-models tiny FAMILY DIR" in section


def test_the_lines_beside_the_numbers_make_them():
    """Each 'lines that make them' block runs as written and prints numbers the page shows: a reader who copies it
    gets the table beside it (a wrong index or hook name would print numbers the page does not have)."""
    import contextlib
    import io
    import re

    page = PAGE.read_text(encoding="utf-8")
    blocks = re.findall(r"\*\*The lines that make them\.\*\*\n\n```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) >= 10
    shown = set(re.findall(r"-?\d+\.\d{4}", page))
    for code in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "the walkthrough's lines", "exec"), {"__name__": "__walkthrough__"})
        printed = re.findall(r"-?\d+\.\d{4}", out.getvalue())
        assert len(printed) >= 4, out.getvalue()
        missing = [n for n in printed if n not in shown and n.replace("-", "", 1) not in shown]
        assert not missing, (missing, code)
        # shapes too (the Conv1D section's are all shapes): each printed torch.Size is on the page as [a, b, ...]
        shapes = [f"[{size}]" for size in re.findall(r"torch\.Size\(\[([\d, ]+)\]\)", out.getvalue())]
        assert not [shape for shape in shapes if shape not in page], (shapes, code)


def _section(page: str, title: str) -> str:
    start = page.index(title)
    return page[start:page.index("\n## ", start + 1)]


def _rows(section: str, columns: int) -> list[list[str]]:
    """The rows of the section's tables with `columns` cells, the header and rule left out."""
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and line.count("|") == columns + 1]
    return [row for row in rows if re.fullmatch(r"-?\d+\.\d{4}", row[-1]) or re.search(r"\d", row[0])]


def test_the_masks_conv1d_and_pooler_sections_have_their_lines():
    """Issue 35: the masks, Conv1D and pooler sections showed numbers without the lines that make them."""
    page = PAGE.read_text(encoding="utf-8")
    for title in ("## 3. Padding and causal masks", "## 5. GPT-2's Conv1D", "## 7. The pooler over [CLS]"):
        assert "**The lines that make them.**" in _section(page, title), title


def test_the_experts_chapter_routes_as_its_numbers_say():
    """The mixture of experts in numbers: every hook point of parts/moe.py's block named in layer 0, and the
    router's table consistent with itself: probabilities that sum to 1, the chosen experts the top k of them,
    the routing weights those probabilities over their sum, and each chosen expert's weight in the second table."""
    from scratch_models.parts.moe import SparseMoeBlock
    from scratch_models.parts.hook_point import HookPoint
    from scratch_models.registry.families import FAMILIES

    page = PAGE.read_text(encoding="utf-8")
    chapter = _section(page, "## 10. Mixtures of experts")
    config = FAMILIES["mixtral"].tiny()
    block = SparseMoeBlock(8, 4, 3, 2, "silu", renormalize=True, float32_weights=True)
    points = [name for name, module in block.named_modules() if isinstance(module, HookPoint)
              and (not name.startswith("experts.") or name.startswith("experts.0."))]
    assert {"router_logits", "chosen", "routing_weights", "proj", "experts.0.proj"} <= set(points)
    for name in points:
        assert f"`layers.0.mlp.{name}`" in chapter, name
    assert excerpt(SparseMoeBlock.forward).code in chapter and excerpt(SparseMoeBlock.combine).code in chapter
    router = [row for row in _rows(chapter, 4) if row[0].isdigit()]
    assert [int(row[0]) for row in router] == list(range(config.num_local_experts))
    probs = {int(row[0]): float(row[2]) for row in router}
    assert abs(sum(probs.values()) - 1) <= 5e-4 * len(probs)
    chosen = [int(e) for e in re.search(r"`chosen` is `\[([\d, ]+)\]`", chapter)[1].split(", ")]
    assert chosen == sorted(probs, key=probs.get, reverse=True)[:config.num_experts_per_tok]
    assert {int(row[0]) for row in router if row[3] == "yes"} == set(chosen)
    weights = [float(w) for w in re.search(r"`routing_weights` `\[([-\d., ]+)\]`", chapter)[1].split(", ")]
    total = sum(probs[e] for e in chosen)
    assert all(abs(w - probs[e] / total) <= 5e-4 for w, e in zip(weights, chosen))
    experts = [row for row in _rows(chapter, 5) if row[0].isdigit()]
    assert [(int(row[0]), float(row[2])) for row in experts] == list(zip(chosen, weights))
    assert "bit for bit" in chapter


def test_the_post_norm_chapter_shows_where_olmo_2_puts_its_norms():
    """OLMo 2's sublayers read the stream unnormalised and add their output through a norm; Llama's read it
    normalised and add their output as it is: the table says so in its numbers (the tiny models' norms have
    weight 1, so a normalised tensor has an RMS of 1)."""
    from scratch_models.llama.model import LlamaDecoderLayer
    from scratch_models.olmo2.model import Olmo2DecoderLayer

    page = PAGE.read_text(encoding="utf-8")
    chapter = _section(page, "## 9. Where the norm goes, once more")
    for function in (Olmo2DecoderLayer.forward, LlamaDecoderLayer.forward):
        assert excerpt(function).code in chapter
    rows = [row for row in _rows(chapter, 8) if row[0].startswith(("OLMo 2", "Llama"))]
    assert len(rows) >= 4
    for row in rows:
        stream, reads, output, adds, mlp_output, mlp_adds, _ = map(float, row[1:])
        if row[0].startswith("OLMo 2"):
            assert reads == stream and abs(adds - 1) <= 2e-4 and abs(mlp_adds - 1) <= 2e-4, row
            assert abs(output - 1) > 0.1, row  # what the norm receives is not already at RMS 1
        else:
            assert abs(reads - 1) <= 2e-4 and adds == output and mlp_adds == mlp_output, row


def test_the_sinks_chapter_shows_the_extra_column_and_the_row_it_leaves():
    """GPT-OSS's sinks in numbers: the with-sink column sums to 1 with the sink's share in it, the hook point
    `probs` is that column without the sink (so its row sums to 1 less the share), the plain softmax is the kept
    row over its sum, and a query that sees no key gives the sink all its weight and outputs 0."""
    from scratch_models.gpt_oss.model import GptOssAttention

    page = PAGE.read_text(encoding="utf-8")
    chapter = _section(page, "## 11. Attention sinks")
    assert excerpt(GptOssAttention.scaled_dot_product).code in chapter
    assert excerpt(GptOssAttention.__init__, "self.sinks =").code in chapter
    assert "`layers.{i}.self_attn.sinks`" in chapter and "`layers.{i}.attn.sinks`" in chapter
    table = [[cell.strip() for cell in line.strip("|").split("|")] for line in chapter.splitlines()
             if line.startswith("| ") and line.count("|") == 7]
    keys = [row for row in table if row[0].isdigit()]
    sink = next(row for row in table if row[0] == "sink")
    sums = next(row for row in table if row[0] == "row sum")
    assert len(keys) >= 3
    scores = [float(row[2]) for row in keys]
    without, with_sink, probs = ([float(row[c]) for row in keys] for c in (3, 4, 5))
    logit, share = float(sink[2]), float(sink[4])
    assert with_sink == probs  # the hook point is the with-sink softmax, its sink column dropped
    assert abs(sum(with_sink) + share - 1) <= 5e-4 * len(keys) and float(sums[4]) == 1.0
    assert 0 < share < 1 and abs(float(sums[5]) - (1 - share)) <= 5e-5 and float(sums[5]) < 1
    assert abs(sum(probs) - float(sums[5])) <= 5e-4 * len(keys)
    # softmax recomputed from the page's own scores and sink logit, with and without the extra column
    denominator = sum(math.exp(s) for s in scores)
    assert all(abs(w - math.exp(s) / denominator) <= 1e-4 for w, s in zip(without, scores))
    denominator += math.exp(logit)
    assert all(abs(w - math.exp(s) / denominator) <= 1e-4 for w, s in zip(with_sink, scores))
    assert abs(share - math.exp(logit) / denominator) <= 1e-4
    assert all(abs(w - p / float(sums[5])) <= 5e-4 for w, p in zip(without, probs))
    blind = re.search(r"the softmax over the masked scores and the sink is\n?`\[([-\d., ]+)\]`", chapter)
    assert [float(x) for x in blind[1].split(", ")] == [0.0] * len(keys) + [1.0]
    assert "is 0, without a special case" in chapter and "bit for bit" in chapter
