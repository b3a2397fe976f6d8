"""docs/tutorial.ipynb runs from top to bottom in a fresh kernel, offline, and shows what its text says."""

import html
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(DOCS / "tutorial.ipynb", as_version=4)
    stored = [cell for cell in notebook.cells if cell.cell_type == "code"]
    # stored without outputs, so the repository stays small and a reader's first run is their own
    assert stored and all(not cell.outputs and cell.execution_count is None for cell in stored)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")  # the kernel inherits it: any download attempt fails
        env.setenv("CUDA_VISIBLE_DEVICES", "")
        NotebookClient(notebook, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(DOCS)}}).execute()  # raises on a failing cell
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def text_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def data_of(cells, mime) -> list:
    return [o.data[mime] for cell in cells for o in cell.outputs if mime in o.get("data", {})]


def test_tutorial_loads_and_verifies_the_embedded_model(executed):
    load, verify = executed[0], executed[1]
    assert text_of(load).strip() == "6 layers, 12 heads of 32 dimensions, hidden size 384"
    report = text_of(verify)
    assert re.search(r"^(\d+)/\1 tensors within tolerance$", report, re.M), report[-500:]


def test_tutorial_shows_the_attention_page_and_a_png_inline(executed):
    frames = data_of(executed, "text/html")
    assert len(frames) == 1
    page = html.unescape(re.fullmatch(r'<iframe srcdoc="([^"]*)".*</iframe>', frames[0], re.S).group(1))
    assert "<title>all-MiniLM-L6-v2</title>" in page and '"layer":1,"head":1' in page
    assert not re.search(r"https?://", page)  # no CDN: the notebook shows it offline
    assert len(data_of(executed, "image/png")) == 1


def test_tutorial_ablation_shows_the_heads_effect(executed):
    per_token = text_of(executed[4]).splitlines()
    changes = [float(re.search(r"([\d.]+)%", line).group(1)) for line in per_token]
    assert len(changes) == 13
    # the second "flies" (position 8) changes most: the token this head joins to the first "flies"
    assert per_token[8].split()[0] == "flies" and max(changes) == changes[8]
    per_head = text_of(executed[5]).splitlines()
    assert len(per_head) == 13 and per_head[-1].startswith("all 12:")
    values = [float(re.search(r"([\d.]+)%", line).group(1)) for line in per_head]
    assert 0 < max(values[:12]) < values[12]  # every head alone matters less than the whole layer
