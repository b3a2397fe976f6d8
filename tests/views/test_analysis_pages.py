"""The patching page's column headers in headless Chromium: level while every label fits its column, all on end as
soon as one does not, never a mix."""

import pytest
import torch

from scratch_models.analysis.patching import PatchingResult
from scratch_models.views.pages import patching_html

SHORT = ["[CLS]", "the", "cat", "[MASK]", "on", "the", "mat", ".", "[SEP]"]
LONG = SHORT[:4] + ["extraordinarily", "\n"] + SHORT[4:]  # one word wider than a column, and a newline token


def result(positions: int, layers=2, heads=3) -> PatchingResult:
    g = torch.Generator().manual_seed(0)
    patched = {"resid_pre": torch.rand(layers, positions, generator=g),
               "attn_head_out_all_pos": torch.rand(layers, heads, generator=g),
               "attn_head_out_by_pos": torch.rand(layers, positions, heads, generator=g)}
    return PatchingResult(1.0, 0.0, patched, {})


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    root = tmp_path_factory.mktemp("patching")
    paths = {}
    for name, tokens in (("short", SHORT), ("long", LONG)):
        paths[name] = root / f"{name}.html"
        paths[name].write_text(patching_html(result(len(tokens)), tokens), encoding="utf-8")
    return {name: path.as_uri() for name, path in paths.items()}


def headers(browser):
    """(writing mode, text as shown) of each column header of the page's table."""
    from selenium.webdriver.common.by import By
    return [(th.value_of_css_property("writing-mode"), th.text)
            for th in browser.find_elements(By.CSS_SELECTOR, "#grid th.column")]


def show(browser, url, tab):
    from selenium.webdriver.common.by import By
    browser.get(url)
    browser.find_element(By.XPATH, f"//div[@id='tabs']/button[{tab}]").click()
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    return headers(browser)


def test_short_tokens_lie_level_a_position_over_its_token(browser, pages):
    shown = show(browser, pages["short"], 1)  # layer x position
    assert [mode for mode, _ in shown] == ["horizontal-tb"] * len(SHORT)
    assert [text for _, text in shown] == [f"{i}\n{t}" for i, t in enumerate(SHORT)]
    shown = show(browser, pages["short"], 2)  # layer x head: H0, H1, H2
    assert shown == [("horizontal-tb", f"H{h}") for h in range(3)]


def test_one_label_wider_than_its_column_turns_them_all(browser, pages):
    shown = show(browser, pages["long"], 1)
    assert {mode for mode, _ in shown} == {"vertical-rl"}
    assert shown[4][1] == "4 extraordinarily" and shown[5][1] == "5 \\n"  # on end: one line, a newline escaped
    assert show(browser, pages["long"], 2) == [("horizontal-tb", f"H{h}") for h in range(3)]  # heads stay level
    # heads by position: compact cells, too narrow for "[MASK]" level
    assert {mode for mode, _ in show(browser, pages["short"], 3)} == {"vertical-rl"}
