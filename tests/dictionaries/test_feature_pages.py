"""The pages of `features`: offline (nothing fetched, markup from package data), their data the dataset's, tokens
shown as text; then driven in headless Chromium: the index sorts and searches, a feature's page draws its examples,
histogram and logit effects."""

import base64
import json
import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest

from dictionary_data import random_sae
from scratch_models.dictionaries.features import run_features

REPO = Path(__file__).resolve().parents[2]
MARKUP = ["The <b>cat</b> & the </script> dog.", "Once upon a time there lived a cat.", "It purred.",
          "The meaning of life is to learn."]


@pytest.fixture(scope="module")
def pages(tiny_gpt2, tmp_path_factory):
    from scratch_models import GPT2LMHeadModel

    lm = GPT2LMHeadModel.from_pretrained(tiny_gpt2[0])
    out = tmp_path_factory.mktemp("pages")
    sae = random_sae("standard", 48, 24, hook_name="blocks.1.hook_resid_pre", seed=4)
    dataset, summary = run_features(lm, sae, [f"{s} {i}" for i in range(10) for s in MARKUP], out, top_k=4,
                                    samples=8, window=(3, 2), progress=False, context=16)
    return out, dataset.with_format(None)[:], summary


def embedded(path: Path) -> dict:
    """A page's data, its packed windows unpacked as the page's script unpacks them: each example's tokens (None
    outside its sequence) and activations (None where a token has none)."""
    page = path.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1))
    for name in ("top", "sample"):
        if name in data:
            width = data["width"]
            indices = np.frombuffer(base64.b64decode(data[name]["tokens"]), dtype="<i4").reshape(-1, width)
            acts = np.frombuffer(base64.b64decode(data[name]["acts"]), dtype="<f4").reshape(-1, width)
            data[name]["examples"] = [{"tokens": [data["strings"][i] if i >= 0 else None for i in row],
                                       "acts": [None if a != a else float(a) for a in values]}
                                      for row, values in zip(indices, acts)]
    return data


def test_pages_are_offline_and_their_markup_is_package_data(pages):
    out, rows, _ = pages
    files = [out / "index.html", *sorted((out / "features").glob("*.html"))]
    assert len(files) == 1 + len(rows["feature"])
    for path in files[:3] + files[-1:]:
        page = path.read_text(encoding="utf-8")
        assert "http://" not in page and "https://" not in page
        assert page.count("</script>") == 3  # the data, the script file, the call: no token closes one
        assert "__" not in re.sub(r"<script.*?</script>", "", page, flags=re.S)
        for src in re.findall(r'(?:src|href)="([^"#]+)"', page):
            assert (path.parent / src).resolve().is_file(), src  # every link is a file of the directory
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for name in ("features_index.html", "feature.html", "features.js", "features.css"):
        assert any(fnmatch(f"static/{name}", g) for g in globs["scratch_models.views"])


def test_the_pages_hold_the_datasets_numbers(pages, tiny_gpt2):
    out, rows, summary = pages
    tokenizer = tiny_gpt2[1]
    index = embedded(out / "index.html")
    assert [row[0] for row in index["rows"]] == rows["feature"]
    assert [row[1] for row in index["rows"]] == rows["fired"]
    fired = max(range(len(rows["feature"])), key=lambda f: rows["fired"][f])
    page = embedded(out / "features" / f"{fired}.html")
    assert page["fired"] == rows["fired"][fired] and page["tokens"] == summary.tokens
    assert page["top"]["value"] == pytest.approx(rows["top_value"][fired])
    for example, ids, acts in zip(page["top"]["examples"], rows["top_ids"][fired], rows["top_acts"][fired]):
        assert example["tokens"] == [tokenizer.decode([i]) if i >= 0 else None for i in ids]  # markup and all
        assert example["acts"] == pytest.approx([a if i >= 0 else 0.0 for a, i in zip(acts, ids)])
    assert page["hist"]["counts"] == rows["hist_counts"][fired]
    assert len(page["logits"]["top"]) == 10 and page["logits"]["how"] == "W_dec @ W_U"
    assert page["sample"]["band"] == rows["sample_band"][fired]


# ---------- in the browser ----------


def severe_errors(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def open_page(driver, path):
    driver.get_log("browser")
    driver.get(path.as_uri())


def table_column(driver, index):
    from selenium.webdriver.common.by import By

    return [row.find_elements(By.TAG_NAME, "td")[index].text for row in
            driver.find_elements(By.CSS_SELECTOR, "#features tbody tr")]


def test_the_index_sorts_and_searches(browser, pages):
    from selenium.webdriver.common.by import By

    out, rows, _ = pages
    open_page(browser, out / "index.html")
    assert severe_errors(browser) == []
    alive = [f for f in rows["feature"] if rows["fired"][f]]
    shown = [int(t.lstrip("#")) for t in table_column(browser, 0)]
    assert sorted(shown) == sorted(alive)  # every feature that fired, the dead ones hidden
    frequencies = [rows["frequency"][f] for f in shown]
    assert frequencies == sorted(frequencies, reverse=True)  # most frequent first
    head = browser.find_element(By.CSS_SELECTOR, 'th[data-key="max"]')
    head.click()
    assert [rows["max"][int(t.lstrip("#"))] for t in table_column(browser, 0)] == sorted(
        [rows["max"][f] for f in alive], reverse=True)
    head.click()
    assert [rows["max"][int(t.lstrip("#"))] for t in table_column(browser, 0)] == sorted(
        [rows["max"][f] for f in alive])
    search = browser.find_element(By.ID, "search")
    search.send_keys(str(alive[0]))
    assert str(alive[0]) in [t.lstrip("#") for t in table_column(browser, 0)]
    search.clear()
    search.send_keys("cat")
    found = table_column(browser, 4)
    assert found and all("cat" in (tokens + raises).lower() for tokens, raises in zip(found, table_column(browser, 5)))
    browser.execute_script("const s = document.getElementById('search'); s.value = '';"
                           "s.dispatchEvent(new Event('input'))")
    browser.find_element(By.ID, "dead").click()
    assert len(table_column(browser, 0)) == len(rows["feature"])  # with the features that never fired


def test_a_feature_page_draws_its_examples(browser, pages):
    from selenium.webdriver.common.by import By

    out, rows, _ = pages
    feature = max(range(len(rows["feature"])), key=lambda f: rows["fired"][f])
    open_page(browser, out / "features" / f"{feature}.html")
    assert severe_errors(browser) == []
    examples = browser.find_elements(By.CSS_SELECTOR, "#top .example")
    assert [float(e.get_attribute("data-value")) for e in examples] == pytest.approx(rows["top_value"][feature])
    for example, ids in zip(examples, rows["top_ids"][feature]):
        tokens = example.find_elements(By.CSS_SELECTOR, ".token")
        assert len(tokens) == sum(i >= 0 for i in ids)  # the window, clipped at its sequence's ends
        peak = example.find_elements(By.CSS_SELECTOR, ".token.peak")
        assert len(peak) == 1 and float(peak[0].get_attribute("data-act")) == pytest.approx(
            float(example.get_attribute("data-value")))
    bars = browser.find_elements(By.CSS_SELECTOR, "#histogram rect.bar")
    assert len(bars) == len(rows["hist_counts"][feature])
    assert len(browser.find_elements(By.CSS_SELECTOR, "#raises tr")) == 10
    bands = browser.find_elements(By.CSS_SELECTOR, "#bands .band .example")
    assert len(bands) == len(rows["sample_value"][feature])
    browser.find_element(By.LINK_TEXT, "all features").click()
    assert browser.current_url.endswith("/index.html")
