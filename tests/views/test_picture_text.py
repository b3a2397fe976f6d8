"""Text in the PNGs: every character is one the font draws (no missing-glyph warning, no blank box, no mathtext),
and tick labels lie level unless one of them needs to stand on end; a text table's labels stay on their line."""

import unicodedata
import warnings

import pytest
import torch

from helpers import long_attention
from scratch_models.analysis.heads import AttentionSummary, HeadReport
from scratch_models.analysis.patching import PatchingResult
from scratch_models.views.attention_plots import attention_grid_png, head_png
from scratch_models.views.display import _picture_charmap, drawable, label_rotation, picture_label, token_label
from scratch_models.views.figures import heads_png, patching_png

# a CJK and a Devanagari character (DejaVu Sans has neither), a control character, a mathtext pair, GPT-2's space
AWKWARD = ["[CLS]", "##雄", "ह", "\x00", "$$", " the", "a$b$c", "\n", "ok"]


def test_labels_hold_only_what_the_font_draws():
    charmap = _picture_charmap()
    for token in AWKWARD:
        label = picture_label(token)
        assert all(ord(c) in charmap for c in label), (token, label)
        assert "$" not in label.replace("\\$", "")  # every dollar escaped: no mathtext
    assert picture_label("##雄") == "##\\u96c4" and picture_label("\x00") == "\\x00" and picture_label(" the") == "␣the"
    assert picture_label("$$") == "\\$\\$" and picture_label("[CLS]") == "[CLS]"
    assert drawable("layer 2\n→雄") == "layer 2\n→\\u96c4"  # line breaks stay in titles and cells
    # cut to the width, an escape kept whole or left out whole
    assert picture_label("雄雄雄", width=11) == "\\u96c4…" and picture_label("abcdefghijkl") == "abcdefghij…"
    # the text table of `lens` keeps the characters: a terminal draws them
    assert token_label("##雄 x") == "##雄␣x"


def test_a_text_label_is_one_line_whatever_byte_the_token_holds():
    """A byte-level BPE (GPT-2's, Pythia's) has a token for each of the 256 bytes, and a random or small model may
    predict any: in the lens table each label stays on its line, every control character and line separator
    escaped (a raw vertical tab split the table's line, a carriage return would overwrite it in a terminal)."""
    for c in [chr(i) for i in range(256)] + ["\u2028", "\u2029"]:
        label = token_label(f"a{c}b", width=20)
        assert len(f"<{label}>".splitlines()) == 1, (c, label)
        assert not any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in label), (c, label)
    assert token_label("\x0b") == "\\x0b" and token_label("\r\n") == "\\r\\n" and token_label(" é") == "␣é"


def awkward_capture():
    capture = long_attention(len(AWKWARD))
    capture.tokens = list(AWKWARD)
    return capture


def test_attention_pngs_draw_any_token_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing glyph is a UserWarning; "$$" a ValueError of mathtext
        head_png(awkward_capture(), 0, 0, title="雄 $model$").data
        attention_grid_png(awkward_capture(), title="雄").data


def test_patching_and_heads_pngs_draw_any_token_without_a_warning(tmp_path):
    g = torch.Generator().manual_seed(0)
    layers, heads, positions = 2, 3, len(AWKWARD)
    patched = {"resid_pre": torch.rand(layers, positions, generator=g),
               "attn_head_out_by_pos": torch.rand(layers, positions, heads, generator=g)}
    result = PatchingResult(1.0, 0.0, patched, {})
    shares = {name: torch.rand(layers, heads, generator=g, dtype=torch.float64) for name in ("雄", "$$")}
    labels = [["→雄", "→$$", "broad"], ["prev", "self", "→\x00"]]
    summary = AttentionSummary(shares, torch.rand(layers, heads, generator=g, dtype=torch.float64), 1.0, labels)
    report = HeadReport(target="logit of '雄'", zero_ablation=torch.randn(layers, heads, generator=g),
                        mean_ablation=torch.randn(layers, heads, generator=g),
                        importance=torch.rand(layers, heads, generator=g), attention=summary, vector_target=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        patching_png(result, AWKWARD, tmp_path / "patching.png", title="雄")
        heads_png(report, tmp_path / "heads.png", title="$$")
    assert (tmp_path / "patching.png").stat().st_size > 0 and (tmp_path / "heads.png").stat().st_size > 0


@pytest.mark.parametrize("labels, room, turned", [
    (["1", "+", "2", "=", "3"], 24, 0),  # an arithmetic prompt's tokens lie level under 28 px cells
    (["H0", "H11"], 24, 0),
    (["[CLS]", "the", "[MASK]"], 24, 90),  # one too wide turns them all
    (["[CLS]", "the", "[MASK]"], 78, 0),  # the lens's 84 px cells hold them level
    ([], 24, 0),
])
def test_labels_stand_on_end_only_when_one_needs_it(labels, room, turned):
    assert label_rotation(labels, room, fontsize=7) == turned
