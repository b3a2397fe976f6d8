"""The attention page: static checks on the HTML, its size bound, then the page driven in headless Chromium."""

import base64
import colorsys
import html
import json
import math
import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import long_attention
from scratch_models.analysis.heads import AttentionSummary, HeadReport
from scratch_models.views.attention_page import MAX_BYTES, MAX_TOKENS, AttentionPage
from scratch_models.hooking.inspection import AttentionCapture

REPO = Path(__file__).resolve().parents[2]
L, H, S, D = 3, 4, 7, 8
TOKENS = ["[CLS]", "<b>&\"x", "Ġthe", "</script>", "it's", "</s>", "[SEP]"]
ROW, LINES, SQUARE = 22, 360, 7  # the head view's geometry in attention.js
FAINTEST = round(0.02 ** 0.5 * 254)  # the head view's faintest line, 2%, as a stored shade
LANE = H * SQUARE + 6


def make_capture(seed=0, causal=True, dtype=torch.float32, scale=D ** -0.5, shape=(L, H, S, D), **kwargs):
    """Random q, k and the scores and probabilities attention would compute from them."""
    g = torch.Generator().manual_seed(seed)
    layers, heads, seq, dim = shape
    q = torch.randn(layers, heads, seq, dim, generator=g)
    k = torch.randn(layers, heads, seq, dim, generator=g)
    scores = (q @ k.transpose(-1, -2) * torch.tensor(scale).reshape(-1, 1, 1, 1)).to(dtype)
    if causal:
        future = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, torch.finfo(dtype).min)
    tokens = TOKENS if seq == S else [f"t{i}" for i in range(seq)]
    return AttentionCapture(tokens, scores.float().softmax(-1), scores, q.to(dtype), k.to(dtype), **kwargs)


SHARES = ("[CLS]", "</script>", "self", "prev", "next")  # a group named like markup must stay text


def make_summary(layers=L, heads=H) -> AttentionSummary:
    """Numbers of its own: head (1, 2) attends to itself alone, head (2, 0) has the largest entropy, and every head
    a label that says where it is (one label is markup, to be shown as text)."""
    g = torch.Generator().manual_seed(0)
    shares = {name: torch.rand(layers, heads, generator=g, dtype=torch.float64) * 0.4 for name in SHARES}
    entropy = torch.rand(layers, heads, generator=g, dtype=torch.float64)
    if (layers, heads) == (L, H):
        shares["self"][1, 2], entropy[2, 0] = 1.0, 1.9
    labels = [[f"L{layer}·{head}" for head in range(heads)] for layer in range(layers)]
    labels[0][1] = "→<b>x</b>"
    return AttentionSummary(shares, entropy, math.log(S), labels)


def make_report() -> HeadReport:
    """make_summary's heads, scored too: head (0, 3) changes the target most when zeroed, and lowers it."""
    g = torch.Generator().manual_seed(1)
    zero = torch.randn(L, H, generator=g, dtype=torch.float64)
    zero[0, 3] = -5.0
    return HeadReport(target="logit of ' x'", zero_ablation=zero,
                      mean_ablation=torch.randn(L, H, generator=g, dtype=torch.float64),
                      importance=torch.rand(L, H, generator=g, dtype=torch.float64), attention=make_summary(),
                      vector_target=False)


def embedded_data(page: str) -> dict:
    """The page's data with its packed tensors decoded as the page's script decodes them: probabilities from their
    shades, p ** gamma in steps of 1/254 (0 where masked), q, k and logZ as float32."""
    m = re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page, re.S)
    data = json.loads(m.group(1))
    levels = np.frombuffer(base64.b64decode(data["probs"]["data"]), dtype=np.uint8).reshape(data["probs"]["shape"])
    data["masked"] = levels == 255
    data["levels"] = np.where(data["masked"], 0, levels)
    data["shades"] = data["levels"] / 254
    data["probs"] = data["shades"] ** (1 / data["colours"]["gamma"])
    for name in ("q", "k", "logZ"):
        packed = data[name]
        data[name] = np.frombuffer(base64.b64decode(packed["data"]), dtype="<f4").reshape(packed["shape"])
    return data


# ---------- static checks ----------

def test_page_is_self_contained():
    page = AttentionPage(make_capture()).html
    assert "http://" not in page and "https://" not in page
    for tag in re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", page, re.I):
        assert not re.search(r"\b(?:src|href)\s*=", tag, re.I), tag
    for view in ("head-view", "model-view", "neuron-view"):
        assert f'id="{view}"' in page
    assert "__" not in re.sub(r"<script.*?</script>", "", page, flags=re.S)  # every placeholder filled in


def test_markup_ships_as_package_data():
    """The page's files are in the wheel: pyproject's package-data globs cover every file under views/static/."""
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    pages = REPO / "scratch_models" / "views" / "static"
    files = sorted(p.relative_to(pages.parent).as_posix() for p in pages.iterdir())
    assert {"static/attention.css", "static/attention.html", "static/attention.js"} <= set(files)
    assert all(any(fnmatch(f, g) for g in globs["scratch_models.views"]) for f in files)


def test_tokens_are_escaped_and_round_trip():
    page = AttentionPage(make_capture()).html
    # Exactly the page's own two script elements close; the "</script>" token does not close a third.
    assert page.count("</script>") == 2
    assert "<b>&" not in page
    assert embedded_data(page)["tokens"] == TOKENS


def test_probabilities_masks_and_vectors_are_packed_faithfully():
    capture = make_capture()
    data = embedded_data(AttentionPage(capture).html)
    assert data["masked"][0, 0, 0].tolist() == [False] + [True] * (S - 1)  # query 0 may see key 0 only
    assert (data["masked"] == torch.ones(S, S, dtype=torch.bool).triu(1).numpy()).all()
    # shades (the square roots of the probabilities) to within half a step of 1/254, so the probabilities to within
    # a step; q and k exactly
    assert data["colours"]["gamma"] == 0.5
    assert np.abs(data["shades"] - capture.probs.numpy() ** 0.5).max() <= 0.5 / 254 + 1e-9
    assert np.abs(data["probs"] - capture.probs.numpy()).max() <= 1 / 254
    assert data["q"].tolist() == capture.q.tolist() and data["k"].tolist() == capture.k.tolist()
    # logZ turns the model's scores into its probabilities
    assert np.allclose(np.exp(capture.scores.numpy() - data["logZ"][..., None]), capture.probs.numpy(), rtol=1e-5,
                       atol=1e-7)
    assert data["neuronLayers"] == [0, 1, 2]
    assert data["scale"] == pytest.approx([D ** -0.5] * L, rel=1e-6)


def test_score_scale_is_read_off_the_models_scores():
    # GPT-2's scale_attn_by_inverse_layer_idx divides layer i's scores by i + 1 as well
    scales = [D ** -0.5 / (i + 1) for i in range(L)]
    data = embedded_data(AttentionPage(make_capture(scale=scales)).html)
    assert data["scale"] == pytest.approx(scales, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_mask_value_is_masked(dtype):
    capture = make_capture(dtype=dtype)
    assert capture.scores.min().item() == torch.finfo(dtype).min
    data = embedded_data(AttentionPage(capture).html)
    assert data["masked"][1, 2, 0].tolist() == [False] + [True] * (S - 1)
    assert data["scale"] == pytest.approx([D ** -0.5] * L, rel=1e-2)  # read off scores rounded to `dtype`


@pytest.mark.parametrize("kwargs, name", [
    ({"layer": L}, "layer"), ({"head": -1}, "head"), ({"query": S}, "query"), ({"window": (2, 9)}, "window 2:9"),
    ({"window": (3, 5), "query": 1}, "query 1 is outside the window 3:5"),
])
def test_bad_selection_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        AttentionPage(make_capture(), **kwargs)


def test_save_leaves_nothing_behind_on_error(tmp_path):
    page = AttentionPage(make_capture(), title="t")
    with pytest.raises(OSError):
        page.save(tmp_path / "missing" / "page.html")
    assert list(tmp_path.iterdir()) == []
    path = tmp_path / "page.html"
    assert page.save(path) == path
    assert path.read_text(encoding="utf-8") == page.html
    assert list(tmp_path.iterdir()) == [path]


def test_bert_base_page_of_512_tokens_stays_within_the_bound():
    """The issue's case: BERT-base's 12 x 12 heads over 512 tokens made a page of hundreds of MB."""
    capture = make_capture(causal=False, shape=(12, 12, 512, 64))
    page = AttentionPage(capture, layer=5, query=300)
    size = len(page.html.encode())
    assert size <= MAX_BYTES
    shown = page.end - page.start
    assert 200 < shown < 512 and page.start <= 300 < page.end  # around the query
    assert page.neuron_layers == [5]  # q and k of one layer: store less before showing less
    data = embedded_data(page.html)
    assert data["probs"].shape == (12, 12, shown, shown) and data["q"].shape == (1, 12, shown, 64)
    assert data["positions"] == list(range(page.start, page.end)) and data["query"] == 300 - page.start
    assert f"tokens {page.start}..{page.end - 1} of 512 are shown" in page.notice
    assert "bounded to 20,000,000 bytes" in page.notice and "layer 5 only" in page.notice
    assert html.escape(page.notice) in page.html
    # a window beyond the bound is refused, naming the window and what fits
    with pytest.raises(ValueError, match=rf"window 0:512 holds 512 tokens; .* at most {shown} fit"):
        AttentionPage(capture, layer=5, window=(0, 512))


@pytest.mark.parametrize("max_bytes", [200_000, 400_000, 700_000])
@pytest.mark.parametrize("heads", [None, "summary"])
def test_page_fits_any_bound_with_the_most_tokens(max_bytes, heads):
    capture = make_capture(causal=False, shape=(2, 3, 300, 16))
    heads = make_summary(2, 3) if heads else None  # its numbers and the heads view's files count too
    page = AttentionPage(capture, query=150, max_bytes=max_bytes, heads=heads)
    size, shown = len(page.html.encode()), page.end - page.start
    assert shown < 300 and page.neuron_layers == [0]
    # unused: less than one more token's share (2 x 3 probabilities a row and a column, q, k and logZ of one layer
    # in base64, and its text) and 2 KB of the page's own text the estimate keeps in reserve
    one_more = 4 / 3 * (2 * 3 * (2 * shown + 1) + 3 * (2 * 16 + 1) * 4) + 12
    assert max_bytes - one_more - 2048 < size <= max_bytes
    with pytest.raises(ValueError, match="max_bytes=1,000 is less than a page of one token needs"):
        AttentionPage(capture, max_bytes=1_000)


def test_a_window_by_request_says_so_without_a_bound():
    page = AttentionPage(make_capture(), window=(2, 5), query=3)
    assert page.notice.startswith("Tokens 2..4 of 7 are shown") and "bounded" not in page.notice
    data = embedded_data(page.html)
    assert data["tokens"] == TOKENS[2:5] and data["query"] == 1 and data["inputLength"] == 7
    # the neuron view's probabilities stay the model's, over all 7 keys, though 3 are shown: a row sums to less than 1
    shown = make_capture().window(2, 5)
    model = np.exp(shown.scores.numpy() - data["logZ"][..., None])
    assert np.allclose(model, shown.probs.numpy(), rtol=1e-5, atol=1e-7) and model.sum(-1).min() < 0.9
    # a query whose shown keys are all masked (a capture built by hand) gets no probability at all
    blind = make_capture(causal=False)
    blind.scores[:, :, 1] = float("-inf")
    blind.probs[:, :, 1] = 0
    log_z = embedded_data(AttentionPage(blind).html)["logZ"]
    assert np.isinf(log_z[:, :, 1]).all() and np.isfinite(log_z[:, :, [0, 2, 3, 4, 5, 6]]).all()
    assert AttentionPage(make_capture()).notice is None
    # without a bound in bytes, the head view's canvas still bounds the tokens
    long = AttentionPage(make_capture(shape=(1, 1, MAX_TOKENS + 5, 2), causal=False), max_bytes=None)
    assert (long.start, long.end) == (0, MAX_TOKENS) and long.notice.startswith("This page is bounded to 1024 tokens")


def test_heads_view_carries_exactly_the_summarys_numbers():
    summary = make_summary()
    page = AttentionPage(make_capture(), heads=summary).html
    assert 'id="heads-view"' in page and "__" not in re.sub(r"<script.*?</script>", "", page, flags=re.S)
    assert page.count("</script>") == 2  # the "</script>" group's name does not close an element
    data = embedded_data(page)["heads"]
    assert data["labels"] == summary.labels and data["uniform_entropy"] == summary.uniform_entropy
    assert data["entropy"] == summary.entropy.tolist()
    assert list(data["shares"]) == list(SHARES)
    assert all(data["shares"][name] == summary.shares[name].tolist() for name in SHARES)
    assert not {"zero_ablation", "mean_ablation", "importance"} & set(data)  # a summary scores no target
    report = make_report()
    data = embedded_data(AttentionPage(make_capture(), heads=report).html)["heads"]
    assert data["zero_ablation"] == report.zero_ablation.tolist() and data["importance"] == report.importance.tolist()
    assert data["mean_ablation"] == report.mean_ablation.tolist() and data["target"] == "logit of ' x'"
    assert data["entropy"] == report.attention.entropy.tolist() and data["labels"] == report.attention.labels


def test_page_without_heads_has_no_heads_view():
    page = AttentionPage(make_capture()).html
    assert 'id="heads-view"' not in page and "function headsView" not in page and "table.ranked" not in page
    assert embedded_data(page)["heads"] is None


def test_heads_of_another_model_are_refused():
    with pytest.raises(ValueError, match="heads: 2 layers x 4 heads, but the capture has 3 x 4"):
        AttentionPage(make_capture(), heads=make_summary(layers=2))
    with pytest.raises(TypeError, match="heads must be an AttentionSummary or a HeadReport .* got dict"):
        AttentionPage(make_capture(), heads=make_summary().to_json())


def test_notebook_view_is_the_page_in_an_isolated_iframe():
    page = AttentionPage(make_capture())
    frame = page._repr_html_()
    m = re.fullmatch(r'<iframe srcdoc="([^"]*)" title="attention" sandbox="allow-scripts" style="[^"]*"></iframe>',
                     frame)
    assert m and html.unescape(m.group(1)) == page.html


# ---------- in the browser ----------

@pytest.fixture(scope="module")
def driver(browser):
    return browser  # headless Chromium, shared by the page tests (conftest.py)


def heads_apart():
    """Layer 0: head 0 attends from each token to itself, head 1 to its mirror image, heads 2 and 3 to the first
    token: 18 pairs with a line."""
    capture = make_capture(causal=False)
    eye = torch.eye(S)
    capture.probs[0] = torch.stack([eye, eye.flip(1), *[torch.zeros(S, S).index_fill_(1, torch.tensor(0), 1)] * 2])
    return capture


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    root = tmp_path_factory.mktemp("pages")
    causal = make_capture()
    saved = {
        "causal": AttentionPage(causal, layer=1, head=2, query=4).save(root / "causal.html"),
        "pair": AttentionPage(make_capture(seed=1, causal=False, sentence_b_start=4)).save(root / "pair.html"),
        "apart": AttentionPage(heads_apart()).save(root / "apart.html"),
        "bounded": AttentionPage(make_capture(causal=False, shape=(2, 3, 200, 16)), layer=1, query=120,
                                 max_bytes=300_000).save(root / "bounded.html"),
        "heads": AttentionPage(causal, heads=make_summary()).save(root / "heads.html"),
        "report": AttentionPage(causal, heads=make_report()).save(root / "report.html"),
        "long": AttentionPage(long_attention(LONG, PREV, SINK)).save(root / "long.html"),
        "long causal": AttentionPage(LONG_CAUSAL, layer=1, head=2, query=100).save(root / "long-causal.html"),
    }
    # two views in one notebook, as Jupyter puts them side by side in one document
    frames = "".join(AttentionPage(make_capture(seed=s), title=f"view {s}")._repr_html_() for s in (2, 3))
    (root / "notebook.html").write_text(f"<!DOCTYPE html><html><body>{frames}</body></html>", encoding="utf-8")
    return {**{name: path.as_uri() for name, path in saved.items()}, "notebook": (root / "notebook.html").as_uri(),
            "causal capture": causal}


def open_page(driver, url):
    driver.get_log("browser")  # reading the log empties it: each page starts with none of the last one's
    driver.get(url)


def severe_errors(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def drawn_lines(driver):
    return int(driver.find_element("id", "hv-canvas").get_attribute("data-lines"))


def expected_lines(capture, layer, heads, queries=None, keys=None):
    """Pairs with a line: the largest shade over the shown heads is at least FAINTEST, unmasked."""
    levels = torch.round(capture.probs[layer, heads].double() ** 0.5 * 254).masked_fill(capture.masked[layer, heads], 0)
    best = levels.amax(0)[queries if queries is not None else slice(None)][..., keys if keys is not None else
                                                                            slice(None)]
    return int((best >= FAINTEST).sum())


def canvas_pixel(driver, x, y):
    """RGBA of the head view's canvas at CSS pixel (x, y)."""
    return driver.execute_script(
        "const c = document.getElementById('hv-canvas'), k = c.width / c.clientWidth;"
        "return Array.from(c.getContext('2d').getImageData(Math.round(arguments[0] * k),"
        " Math.round(arguments[1] * k), 1, 1).data)", x, y)


def head_rgb(head, heads=H):
    """attention.js's headColor: hsl(round(h * 360 / H), 75%, 42%) as 0..255 RGB."""
    return [round(255 * c) for c in colorsys.hls_to_rgb(round(head * 360 / heads) / 360, 0.42, 0.75)]


def over_white(rgb, alpha):
    return [round(alpha * c + (1 - alpha) * 255) for c in rgb]


def test_views_render_without_errors_all_heads_on(driver, pages):
    from selenium.webdriver.common.by import By
    open_page(driver, pages["causal"])
    assert severe_errors(driver) == []
    assert len(driver.find_elements(By.CSS_SELECTOR, ".cell")) == L * H
    blank = driver.execute_script("""
        return [...document.querySelectorAll('.cell canvas')].filter(c => {
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            return d.every((v, i) => v === d[i % 4]);
        }).length""")
    assert blank == 0
    assert driver.find_elements(By.CSS_SELECTOR, ".head-swatch.off") == []  # every head shown at the start
    assert driver.find_element(By.ID, "layer-select").get_attribute("value") == "1"
    capture = pages["causal capture"]
    assert drawn_lines(driver) == expected_lines(capture, 1, list(range(H))) > S
    assert driver.find_element(By.ID, "notice").is_displayed() is False  # nothing left out, nothing to say


def line_point(query, key, t):
    """The CSS pixel a fraction t along the head view's line from `query` to `key`."""
    return LANE + t * LINES, ROW * (query + 0.5 + t * (key - query))


def test_each_line_takes_its_dominant_heads_colour(driver, pages):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    open_page(driver, pages["apart"])
    assert drawn_lines(driver) == 18
    # each line in its head's colour, unblended; points chosen away from the other lines
    assert canvas_pixel(driver, *line_point(0, 0, 0.25))[:3] == pytest.approx(head_rgb(0), abs=12)
    assert canvas_pixel(driver, *line_point(0, 6, 0.6))[:3] == pytest.approx(head_rgb(1), abs=12)
    # query 2 -> key 0: heads 2 and 3 both give weight 1; one line, of the first of them
    assert canvas_pixel(driver, *line_point(2, 0, 0.3))[:3] == pytest.approx(head_rgb(2), abs=12)
    swatch = driver.find_element(By.CSS_SELECTOR, '.head-swatch[data-head="0"]')
    swatch.click()
    assert drawn_lines(driver) == 18 - 5  # head 0's diagonal goes, but for the first and middle pairs
    swatch.click()
    ActionChains(driver).double_click(swatch).perform()  # head 0 alone
    assert len(driver.find_elements(By.CSS_SELECTOR, ".head-swatch.off")) == H - 1
    assert drawn_lines(driver) == S
    assert canvas_pixel(driver, *line_point(0, 6, 0.6))[3] == 0
    driver.find_element(By.ID, "all-heads").click()
    assert drawn_lines(driver) == 18
    assert severe_errors(driver) == []


def test_hover_focuses_one_token_and_shows_each_heads_weight(driver, pages):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    open_page(driver, pages["apart"])
    token = driver.find_elements(By.CSS_SELECTOR, ".token.left")[2]
    ActionChains(driver).move_to_element(token).perform()
    assert "focused" in token.get_attribute("class").split()
    assert drawn_lines(driver) == 3  # query 2's lines only: to itself, its mirror and the first token
    # the lane beside the keys, a square per head: key 2 has head 0's weight 1 and no other; key 0 heads 2 and 3
    lane = LANE + LINES + 3 + SQUARE / 2

    def square(x, row, head):
        return canvas_pixel(driver, x + head * SQUARE, (row + 0.5) * ROW)

    assert square(lane, 2, 0)[:3] == pytest.approx(head_rgb(0), abs=12) and square(lane, 2, 0)[3] == 255
    assert square(lane, 2, 1)[3] == square(lane, 2, 2)[3] == 0
    assert square(lane, 0, 2)[:3] == pytest.approx(head_rgb(2), abs=12)
    assert square(lane, 0, 3)[:3] == pytest.approx(head_rgb(3), abs=12)
    # a key on the right: the lines into it, and the lane beside the queries
    key = driver.find_elements(By.CSS_SELECTOR, ".token.right")[6]
    ActionChains(driver).move_to_element(key).perform()
    assert drawn_lines(driver) == 2  # from query 0 (head 1) and query 6 (head 0)
    assert square(3 + SQUARE / 2, 0, 1)[:3] == pytest.approx(head_rgb(1), abs=12)
    assert square(3 + SQUARE / 2, 0, 0)[3] == 0
    ActionChains(driver).move_to_element(driver.find_element(By.TAG_NAME, "h1")).perform()
    assert drawn_lines(driver) == 18
    assert severe_errors(driver) == []


def test_cell_click_opens_zoom_and_syncs_views(driver, pages):
    from selenium.webdriver.common.by import By
    open_page(driver, pages["causal"])
    zoom = driver.find_element(By.ID, "zoom")
    assert not zoom.is_displayed()
    driver.find_element(By.CSS_SELECTOR, '.cell[data-layer="2"][data-head="3"]').click()
    assert zoom.is_displayed()
    assert driver.find_element(By.ID, "zoom-title").text == "Layer 2, head 3"
    assert driver.find_element(By.ID, "nv-layer").get_attribute("value") == "2"
    assert driver.find_element(By.ID, "nv-head").get_attribute("value") == "3"
    assert driver.find_element(By.ID, "layer-select").get_attribute("value") == "2"
    assert len(driver.find_elements(By.CSS_SELECTOR, ".head-swatch.off")) == H - 1
    driver.find_element(By.ID, "zoom-close").click()
    assert not zoom.is_displayed()
    assert severe_errors(driver) == []


def test_neuron_view_shows_the_models_scores_key_by_key(driver, pages):
    from selenium.webdriver.common.by import By
    open_page(driver, pages["causal"])
    rows = driver.find_elements(By.CSS_SELECTOR, "#nv-table tbody tr")
    assert len(rows) == S
    assert driver.find_element(By.ID, "nv-query").get_attribute("value") == "4"
    cells = [r.find_elements(By.TAG_NAME, "td") for r in rows]
    assert cells[3][0].text == "</script>"
    assert [c[5].text for c in cells[5:]] == ["masked", "masked"]  # query 4 may not see keys 5 and 6
    capture = pages["causal capture"]
    for j in range(5):  # layer 1, head 2, query 4: the model's score and probability
        assert float(cells[j][5].text) == pytest.approx(float(capture.scores[1, 2, 4, j]), abs=1.5e-3)
        assert float(cells[j][6].text) == pytest.approx(float(capture.probs[1, 2, 4, j]), abs=2.5e-3)
    assert "= 1/√d, d = 8" in driver.find_element(By.ID, "nv-formula").text


def test_sentence_pair_marks_segment_b(driver, pages, tmp_path):
    from PIL import Image, ImageStat
    from selenium.webdriver.common.by import By
    open_page(driver, pages["pair"])
    assert severe_errors(driver) == []
    marked = [t.get_attribute("data-index") for t in driver.find_elements(By.CSS_SELECTOR, ".token.left.seg-b")]
    assert marked == ["4", "5", "6"]
    assert len(driver.find_elements(By.CSS_SELECTOR, "#nv-table .seg-b")) == 3
    shot = tmp_path / "pair.png"
    assert driver.save_screenshot(str(shot))
    with Image.open(shot) as image:
        assert max(ImageStat.Stat(image.convert("RGB")).stddev) > 10


def test_bounded_page_says_so_and_works(driver, pages):
    from selenium.webdriver.common.by import By
    open_page(driver, pages["bounded"])
    assert severe_errors(driver) == []
    notice = driver.find_element(By.ID, "notice")
    assert notice.is_displayed() and "bounded to 300,000 bytes" in notice.text and "of 200 are shown" in notice.text
    shown = len(driver.find_elements(By.CSS_SELECTOR, ".token.left"))
    assert 10 < shown < 200
    assert len(driver.find_elements(By.CSS_SELECTOR, "#nv-table tbody tr")) == shown
    assert [o.text for o in driver.find_elements(By.CSS_SELECTOR, "#nv-layer option")] == ["1"]
    query = driver.find_element(By.CSS_SELECTOR, "#nv-query option:checked").text
    assert query == "120: t120"  # labelled by its position in the input


def test_two_notebook_views_live_side_by_side(driver, pages):
    from selenium.webdriver.common.by import By
    open_page(driver, pages["notebook"])
    frames = driver.find_elements(By.TAG_NAME, "iframe")
    assert len(frames) == 2
    titles = []
    for frame in frames:
        driver.switch_to.frame(frame)
        titles.append(driver.find_element(By.TAG_NAME, "h1").text)
        assert len(driver.find_elements(By.CSS_SELECTOR, ".cell")) == L * H
        assert drawn_lines(driver) > 0
        driver.switch_to.default_content()
    assert titles == ["view 2", "view 3"]
    assert severe_errors(driver) == []


# ---------- long inputs ----------

LONG, PREV, SINK = 155, 0.35, 0.3  # helpers.long_attention: previous-token, first-token and even heads
LONG_CAUSAL = make_capture(causal=True, shape=(2, 3, LONG, 8))  # q, k, scores and probabilities that agree


def shade_rgb(p):
    """The model view's colour of probability p (attention.js's PALETTE at the shade p ** 0.5)."""
    t = round(p ** 0.5 * 254) / 254
    return [round(255 - t * (255 - c)) for c in (12, 44, 110)]


def canvas_rgb(driver, css):
    """[height, width, 3] RGB of the canvas that `css` selects."""
    width, height, flat = driver.execute_script(
        "const c = document.querySelector(arguments[0]);"
        "return [c.width, c.height, Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data)]", css)
    return np.array(flat).reshape(height, width, 4)[..., :3]


def test_long_input_thumbnails_keep_one_token_patterns(driver, pages):
    from selenium.webdriver.common.by import By
    open_page(driver, pages["long"])
    assert severe_errors(driver) == []
    prev = canvas_rgb(driver, '.cell[data-layer="0"][data-head="0"] canvas')
    assert prev.shape[0] < LONG  # 155 tokens in fewer pixels
    # every pixel row holds a piece of the previous-token diagonal, in PREV's shade: none sampled or averaged away
    assert (np.abs(prev - shade_rgb(PREV)).max(-1) <= 2).any(1).all()
    sink = canvas_rgb(driver, '.cell[data-layer="0"][data-head="1"] canvas')
    assert (np.abs(sink[:, 0] - shade_rgb(SINK)).max(-1) <= 2).all()  # the first-token column on every row
    even = canvas_rgb(driver, '.cell[data-layer="0"][data-head="2"] canvas')
    assert (np.abs(even - shade_rgb(1 / LONG)).max(-1) <= 2).all() and shade_rgb(1 / LONG)[0] < 240  # a tint
    # the scale is named, with the probabilities the PNGs' colour bars name, where their shades are
    scale = driver.find_element(By.ID, "mv-scale")
    assert "square-root scale" in scale.text
    ticks = scale.find_elements(By.CSS_SELECTOR, ".scale-ticks span")
    assert [float(t.text) for t in ticks] == [0, 0.01, 0.05, 0.1, 0.25, 0.5, 1]
    left = [t.location["x"] + t.size["width"] / 2 for t in ticks]
    assert [(x - left[0]) / (left[-1] - left[0]) for x in left] == pytest.approx(
        [float(t.text) ** 0.5 for t in ticks], abs=0.01)


def strongest_lines(capture, layer, heads, keep):
    """Lines of the head view showing each query's `keep` strongest (0: all over 2%)."""
    levels = torch.round(capture.probs[layer, heads].double() ** 0.5 * 254).masked_fill(capture.masked[layer, heads], 0)
    per_query = (levels.amax(0) >= FAINTEST).sum(-1)
    return int((per_query if not keep else per_query.clamp(max=keep)).sum())


def test_long_input_head_view_starts_with_each_querys_strongest_lines(driver, pages):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    open_page(driver, pages["long causal"])
    lines = Select(driver.find_element(By.ID, "hv-lines"))
    assert lines.first_selected_option.get_attribute("value") == "3"
    every = strongest_lines(LONG_CAUSAL, 1, [0, 1, 2], 0)
    assert drawn_lines(driver) == strongest_lines(LONG_CAUSAL, 1, [0, 1, 2], 3) < every
    assert driver.find_element(By.ID, "hv-count").text == f"{drawn_lines(driver)} of {every} lines over 2%"
    lines.select_by_value("1")
    assert drawn_lines(driver) == LONG  # each query's strongest key
    lines.select_by_value("0")
    assert drawn_lines(driver) == every and driver.find_element(By.ID, "hv-count").text == f"{every} lines"
    lines.select_by_value("3")
    # a hovered token shows all of its lines, its weakest too
    token = driver.find_elements(By.CSS_SELECTOR, ".token.left")[120]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", token)
    ActionChains(driver).move_to_element(token).perform()
    assert drawn_lines(driver) == expected_lines(LONG_CAUSAL, 1, [0, 1, 2], queries=[120]) > 3
    assert severe_errors(driver) == []
    # a short input starts with every line
    open_page(driver, pages["causal"])
    assert Select(driver.find_element(By.ID, "hv-lines")).first_selected_option.get_attribute("value") == "0"


def test_long_input_enlarged_head_labels_every_nth_token(driver, pages):
    from selenium.webdriver.common.by import By
    open_page(driver, pages["long"])
    driver.find_element(By.CSS_SELECTOR, '.cell[data-layer="0"][data-head="0"]').click()
    zoom = canvas_rgb(driver, "#zoom-canvas")
    cell = driver.execute_script("return Z.cell")
    margin = zoom.shape[1] - 4 - LONG * cell
    assert margin > 40  # room for labels: "150 w150"
    ink = (zoom[:, :int(margin) - 4].min(-1) < 128).any(1)  # rows with label text left of the heatmap
    rows = [int(margin + (i + 0.5) * cell) for i in range(LONG)]
    every = driver.execute_script("return Z.every")
    assert 1 < every < 5 and all(ink[r] for r in rows[::every])
    assert driver.find_element(By.ID, "zoom-scale").text.startswith("attention probability")
    assert severe_errors(driver) == []


def test_long_input_neuron_view_lists_exact_probabilities_likeliest_first(driver, pages):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    open_page(driver, pages["long causal"])
    order = Select(driver.find_element(By.ID, "nv-order"))
    assert order.first_selected_option.get_attribute("value") == "probability"

    def table():  # read in one script: a round trip per row and cell took seconds
        rows = driver.execute_script("return Array.from(document.querySelectorAll('#nv-table tbody tr'), "
                                     "r => [r.getAttribute('data-key'), r.cells[6].innerText])")
        return [int(key) for key, _ in rows], [text.strip() for _, text in rows]

    keys, shown = table()
    want = LONG_CAUSAL.probs[1, 2, 100].double()
    assert keys == sorted(range(LONG), key=lambda j: (-float(want[j]), j))  # masked keys (0) last, in order
    for j, text in zip(keys, shown):
        assert float(text) == pytest.approx(float(want[j]), rel=5e-3, abs=1e-12)  # three significant digits
    assert float(shown[-1]) == 0 and shown[0] != shown[1]
    order.select_by_value("position")
    assert table()[0] == list(range(LONG))
    assert severe_errors(driver) == []


# ---------- the heads view ----------

def heads_cell(driver, layer, head):
    from selenium.webdriver.common.by import By
    return driver.find_element(By.CSS_SELECTOR, f'#heads-view #grid td[data-row="{layer}"][data-column="{head}"]')


def ranked_order(driver):
    from selenium.webdriver.common.by import By
    return [(int(tr.get_attribute("data-layer")), int(tr.get_attribute("data-head")))
            for tr in driver.find_elements(By.CSS_SELECTOR, "#ranked tbody tr")]


def shown_everywhere(driver, layer, head):
    """The head is open in every view: enlarged, the head view's layer with it alone, the neuron view's, the model
    view's current cell, and marked in the heads view's grid and table."""
    from selenium.webdriver.common.by import By
    assert driver.find_element(By.ID, "zoom").is_displayed()
    assert driver.find_element(By.ID, "zoom-title").text == f"Layer {layer}, head {head}"
    assert driver.find_element(By.ID, "layer-select").get_attribute("value") == str(layer)
    on = [s.get_attribute("data-head") for s in driver.find_elements(By.CSS_SELECTOR, ".head-swatch:not(.off)")]
    assert on == [str(head)]
    assert driver.find_element(By.ID, "nv-layer").get_attribute("value") == str(layer)
    assert driver.find_element(By.ID, "nv-head").get_attribute("value") == str(head)
    current = driver.find_element(By.CSS_SELECTOR, ".cell.current")
    assert (current.get_attribute("data-layer"), current.get_attribute("data-head")) == (str(layer), str(head))
    selected = driver.find_elements(By.CSS_SELECTOR, "#heads-view #grid td.selected")
    assert [(c.get_attribute("data-row"), c.get_attribute("data-column")) for c in selected] == [(str(layer), str(head))]
    row = driver.find_element(By.CSS_SELECTOR, "#ranked tr.selected")
    assert (row.get_attribute("data-layer"), row.get_attribute("data-head")) == (str(layer), str(head))
    assert f"layer {layer}, head {head}" in driver.find_element(By.ID, "detail").text


def purple(value):
    """analysis_heatmap.js's sequentialColour at scale 1, as the browser's computed style writes it."""
    r, g, b = (round(255 + (c - 255) * value) for c in (84, 39, 143))
    return f"rgba({r}, {g}, {b}, 1)"


def test_heads_view_shows_every_head_with_its_label(driver, pages):
    from selenium.webdriver.common.by import By
    open_page(driver, pages["heads"])
    assert severe_errors(driver) == []
    summary = make_summary()
    labels = [[heads_cell(driver, layer, head).find_element(By.CLASS_NAME, "label").text for head in range(H)]
              for layer in range(L)]
    assert labels == summary.labels  # the markup label as text
    assert len(driver.find_elements(By.CSS_SELECTOR, "#heads-view #grid td")) == L * H
    tabs = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#heads-view .tabs button")]
    assert tabs == ["what it attends to", "entropy", *(f"share {name}" for name in SHARES)]
    assert len(driver.find_elements(By.CSS_SELECTOR, "#ranked tbody tr")) == L * H
    # the largest share of each head colours its cell, and the heads are ranked by it: head (1, 2)'s self share
    assert heads_cell(driver, 1, 2).value_of_css_property("background-color") == purple(1.0)
    assert "dark" in heads_cell(driver, 1, 2).get_attribute("class").split()  # white text on dark purple
    assert ranked_order(driver)[0] == (1, 2)


def test_clicking_a_head_opens_it_in_every_view(driver, pages):
    from selenium.webdriver.common.by import By
    open_page(driver, pages["heads"])
    heads_cell(driver, 2, 3).click()
    shown_everywhere(driver, 2, 3)
    driver.find_element(By.ID, "zoom-close").click()
    driver.find_element(By.CSS_SELECTOR, '#ranked tr[data-layer="1"][data-head="0"]').click()
    shown_everywhere(driver, 1, 0)
    driver.find_element(By.ID, "zoom-close").click()
    # and a head clicked in the model view is marked in the heads view
    driver.find_element(By.CSS_SELECTOR, '.cell[data-layer="0"][data-head="1"]').click()
    shown_everywhere(driver, 0, 1)
    assert severe_errors(driver) == []


def test_measure_selector_recolours_and_reranks(driver, pages):
    from selenium.webdriver.common.by import By
    open_page(driver, pages["heads"])
    summary = make_summary()
    before = [heads_cell(driver, 0, h).value_of_css_property("background-color") for h in range(H)]
    driver.find_element(By.XPATH, "//div[@id='tabs']/button[text()='share prev']").click()
    assert "the token before it" in driver.find_element(By.ID, "legend").text
    prev = summary.shares["prev"]
    assert [heads_cell(driver, 0, h).value_of_css_property("background-color") for h in range(H)] == [
        purple(float(prev[0, h])) for h in range(H)] != before
    assert heads_cell(driver, 0, 0).text.splitlines() == [summary.labels[0][0], f"{float(prev[0, 0]):.2f}"]
    by_prev = sorted(((layer, head) for layer in range(L) for head in range(H)), key=lambda lh: -float(prev[lh]))
    assert ranked_order(driver) == by_prev
    assert driver.find_element(By.CSS_SELECTOR, "#ranked th.sorted").text == "prev"
    # a column of the table is the same choice: entropy colours the grid (its largest value darkest)
    driver.find_element(By.XPATH, "//table[@id='ranked']//th[text()='entropy']").click()
    assert driver.find_element(By.CSS_SELECTOR, "#tabs button.active").text == "entropy"
    assert heads_cell(driver, 2, 0).value_of_css_property("background-color") == purple(1.0)
    assert ranked_order(driver)[0] == (2, 0)
    driver.find_element(By.XPATH, "//table[@id='ranked']//th[text()='label']").click()  # the table alone
    assert driver.find_element(By.CSS_SELECTOR, "#tabs button.active").text == "entropy"
    named = [(layer, head) for layer in range(L) for head in range(H) if (layer, head) != (0, 1)]  # "L0·0" ...
    assert [row for row in ranked_order(driver) if row != (0, 1)] == named  # "→<b>x</b>" where the locale puts it
    assert severe_errors(driver) == []


def test_report_adds_ablation_and_gradient_measures(driver, pages):
    from selenium.webdriver.common.by import By
    open_page(driver, pages["report"])
    assert severe_errors(driver) == []
    tabs = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#heads-view .tabs button")]
    assert tabs[:5] == ["zero ablation", "mean ablation", "gradient", "what it attends to", "entropy"]
    assert "target: logit of ' x'" in driver.find_element(By.ID, "legend").text
    assert ranked_order(driver)[0] == (0, 3)  # the largest |zero-ablation change|, though negative
    # signed: blue below 0, at full strength for the largest |value|
    assert heads_cell(driver, 0, 3).value_of_css_property("background-color") == "rgba(33, 102, 172, 1)"
    columns = [th.text for th in driver.find_elements(By.CSS_SELECTOR, "#ranked th")]
    assert columns[:9] == ["layer", "head", "label", "zero abl.", "mean abl.", "gradient", "top share", "entropy",
                           "[CLS]"]
    driver.find_elements(By.CSS_SELECTOR, "#ranked tbody tr")[0].click()
    shown_everywhere(driver, 0, 3)


def test_page_without_heads_shows_no_heads_view_in_the_browser(driver, pages):
    from selenium.webdriver.common.by import By
    open_page(driver, pages["causal"])
    assert driver.find_elements(By.ID, "heads-view") == [] and driver.find_elements(By.ID, "tabs") == []
    driver.find_element(By.CSS_SELECTOR, '.cell[data-layer="1"][data-head="1"]').click()  # no heads view to tell
    assert driver.find_element(By.ID, "zoom-title").text == "Layer 1, head 1"
    assert severe_errors(driver) == []
