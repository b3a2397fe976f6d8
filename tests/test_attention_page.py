"""The attention page: static checks on the HTML, then the page driven in headless Chromium."""

import base64
import json
import re
import shutil

import numpy as np
import pytest
import torch

from scratch_models.attention_page import attention_html, write_attention_html

L, H, S, D = 3, 4, 7, 8
TOKENS = ["[CLS]", "<b>&\"x", "Ġthe", "</script>", "it's", "</s>", "[SEP]"]


def make_inputs(seed=0, causal=True, dtype=torch.float32):
    """Random q, k and the scores and probabilities attention would compute from them."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(L, H, S, D, generator=g)
    k = torch.randn(L, H, S, D, generator=g)
    scores = (q @ k.transpose(-1, -2) / D ** 0.5).to(dtype)
    if causal:
        future = torch.ones(S, S, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, torch.finfo(dtype).min)
    probs = scores.float().softmax(-1)
    return TOKENS, probs, q, k, scores


def embedded_data(page: str) -> dict:
    """The page's data with its packed tensors decoded as the page's script decodes them (masked scores None)."""
    m = re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page, re.S)
    data = json.loads(m.group(1))
    for name in ("probs", "q", "k", "scores"):
        packed = data[name]
        dtype = {"u16": "<u2", "f32": "<f4"}[packed["kind"]]
        values = np.frombuffer(base64.b64decode(packed["data"]), dtype=dtype).astype(np.float64)
        if packed["kind"] == "u16":
            values = values / 65535
        nested = values.reshape(packed["shape"]).tolist()
        data[name] = _none_for_nan(nested)
    return data


def _none_for_nan(x):
    if isinstance(x, list):
        return [_none_for_nan(v) for v in x]
    return None if x != x else x


# ---------- static checks ----------

def test_page_is_self_contained():
    page = attention_html(*make_inputs())
    assert "http://" not in page and "https://" not in page
    for tag in re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", page, re.I):
        assert not re.search(r"\b(?:src|href)\s*=", tag, re.I), tag
    for view in ("head-view", "model-view", "neuron-view"):
        assert f'id="{view}"' in page


def test_tokens_are_escaped_and_round_trip():
    page = attention_html(*make_inputs())
    # Exactly the page's own two script elements close; the "</script>" token does not close a third.
    assert page.count("</script>") == 2
    assert "<b>&" not in page
    data = embedded_data(page)
    assert data["tokens"] == TOKENS


def test_masked_scores_are_null_and_values_packed_faithfully():
    tokens, probs, q, k, scores = make_inputs()
    data = embedded_data(attention_html(tokens, probs, q, k, scores))
    assert data["scores"][0][0][0][1] is None  # query 0 may not see key 1
    assert data["scores"][0][0][1][0] == scores[0, 0, 1, 0].item()  # float32: exact
    assert data["probs"][0][0][0] == [1.0] + [0.0] * (S - 1)
    # probabilities to within half a step of 1/65535; q and k exactly
    assert np.allclose(data["probs"], probs.numpy(), atol=0.5 / 65535, rtol=0)
    assert data["q"] == q.tolist() and data["k"] == k.tolist()


def test_float16_mask_value_is_masked():
    tokens, probs, q, k, scores = make_inputs(dtype=torch.float16)
    assert scores.min().item() == -65504.0
    data = embedded_data(attention_html(tokens, probs, q.half(), k.half(), scores))
    assert data["scores"][1][2][0][1:] == [None] * (S - 1)


@pytest.mark.parametrize("kwargs, name", [
    ({"layer": L}, "layer"), ({"head": -1}, "head"), ({"query": S}, "query"), ({"sentence_b_start": S}, "sentence_b"),
])
def test_bad_selection_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        attention_html(*make_inputs(), **kwargs)


def test_shape_mismatch_names_the_argument():
    tokens, probs, q, k, scores = make_inputs()
    with pytest.raises(ValueError, match=r"probs.*\(3, 4, 7, 7\)"):
        attention_html(tokens[:-1], probs, q, k, scores)
    with pytest.raises(ValueError, match=r"scores shape \(3, 4, 7, 6\).*\(3, 4, 7, 7\)"):
        attention_html(tokens, probs, q, k, scores[..., :-1])
    with pytest.raises(ValueError, match=r"k shape \(3, 4, 7, 4\).*\(3, 4, 7, 8\)"):
        attention_html(tokens, probs, q, k[..., :4], scores)
    with pytest.raises(ValueError, match=r"q shape \(2, 4, 7, 8\)"):
        attention_html(tokens, probs, q[:2], k[:2], scores)


def test_write_leaves_nothing_behind_on_error(tmp_path):
    path = tmp_path / "page.html"
    with pytest.raises(ValueError):
        write_attention_html(path, *make_inputs(), layer=99)
    assert list(tmp_path.iterdir()) == []
    assert write_attention_html(path, *make_inputs(), title="t") == path
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert list(tmp_path.iterdir()) == [path]


# ---------- in the browser ----------

@pytest.fixture(scope="module")
def driver():
    missing = [exe for exe in ("chromium", "chromedriver") if shutil.which(exe) is None]
    if missing:
        pytest.skip(f"not on PATH: {', '.join(missing)}")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1600"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))
    yield d
    d.quit()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    root = tmp_path_factory.mktemp("pages")
    tokens, probs, q, k, scores = make_inputs()
    causal = write_attention_html(root / "causal.html", tokens, probs, q, k, scores, layer=1, head=2, query=4)
    pair = write_attention_html(root / "pair.html", *make_inputs(seed=1, causal=False), sentence_b_start=4)
    return {"causal": causal.as_uri(), "pair": pair.as_uri()}


def open_page(driver, url):
    driver.get_log("browser")  # reading the log empties it: each page starts with none of the last one's
    driver.get(url)


def severe_errors(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def visible_lines(driver):
    return driver.execute_script(
        "return [...document.querySelectorAll('.attn-line')].filter(e => getComputedStyle(e).display !== 'none')"
        ".length")


def test_views_render_without_errors(driver, pages):
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
    assert visible_lines(driver) == S * S  # the initial head, every query to every key
    assert driver.find_element(By.ID, "layer-select").get_attribute("value") == "1"


def test_hover_focuses_one_token(driver, pages):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    open_page(driver, pages["causal"])
    driver.find_elements(By.CSS_SELECTOR, ".head-swatch")[0].click()  # a second head on
    heads = len(driver.find_elements(By.CSS_SELECTOR, ".head-swatch:not(.off)"))
    assert heads == 2
    token = driver.find_elements(By.CSS_SELECTOR, ".token.left")[3]
    ActionChains(driver).move_to_element(token).perform()
    assert visible_lines(driver) == S * heads
    assert "focused" in token.get_attribute("class").split()
    shown = driver.execute_script(
        "return [...document.querySelectorAll('.attn-line')].filter(e => getComputedStyle(e).display !== 'none')"
        ".map(e => e.dataset.query)")
    assert set(shown) == {"3"}
    ActionChains(driver).move_to_element(driver.find_element(By.TAG_NAME, "h1")).perform()
    assert visible_lines(driver) == S * S * heads
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
    driver.find_element(By.ID, "zoom-close").click()
    assert not zoom.is_displayed()
    assert severe_errors(driver) == []


def test_neuron_view_has_one_row_per_key(driver, pages):
    from selenium.webdriver.common.by import By
    open_page(driver, pages["causal"])
    rows = driver.find_elements(By.CSS_SELECTOR, "#nv-table tbody tr")
    assert len(rows) == S
    assert driver.find_element(By.ID, "nv-query").get_attribute("value") == "4"
    cells = [r.find_elements(By.TAG_NAME, "td") for r in rows]
    assert cells[3][0].text == "</script>"
    assert [c[5].text for c in cells[5:]] == ["masked", "masked"]  # query 4 may not see keys 5 and 6
    assert "√d" in driver.find_element(By.ID, "nv-formula").text


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
