"""Every file of the repository a page names exists: the README, the generated pages and the notebook's text point a
reader at code, and a file moved since (scratch_models/bert.py is scratch_models/bert/model.py now) is a dead end."""

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "docs/hook_names.md", "docs/walkthrough.md", "docs/tutorial.ipynb"]
# a path inside one of the repository's top-level folders, as a page writes it (in backticks, a link, plain text);
# not a template (`tests/models/test_<family>.py`)
NAMED = re.compile(r"\b((?:scratch_models|weight_mapping|scripts|tests|docs)/[\w./-]*\w)(?![\w<{*])")


def text_of(page: str) -> str:
    """A page's text; a notebook's cells only (its outputs are what the code printed)."""
    if page.endswith(".ipynb"):
        return "\n".join("".join(cell["source"]) for cell in json.loads((REPO / page).read_text())["cells"])
    return (REPO / page).read_text(encoding="utf-8")


@pytest.mark.parametrize("page", PAGES)
def test_every_file_a_page_names_exists(page):
    named = {match.rstrip(".") for match in NAMED.findall(text_of(page))}
    named = {path.split("#")[0] for path in named}
    missing = sorted(path for path in named if not (REPO / path).exists())
    assert named and not missing, f"{page} names files that are not in the repository: {missing}"
