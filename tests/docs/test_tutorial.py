"""docs/tutorial.ipynb ships with the outputs of a run of the current code (pictures included, no stderr noise), runs
from top to bottom in a fresh kernel, offline and without the variables that quiet transformers in our tests, and
shows what its text says."""

import base64
import copy
import html
import io
import re

import nbformat
import pytest
from PIL import Image

from scratch_models_docs.tutorial import TUTORIAL, differences, run_tutorial

NOISE = re.compile(r"it/s|Loading weights|Warning|warn|%\|")  # tqdm's bars, warnings

pytestmark = pytest.mark.slow  # a fresh Jupyter kernel runs the whole notebook


@pytest.fixture(scope="module")
def run():
    return run_tutorial()  # raises on a failing cell


@pytest.fixture(scope="module")
def executed(run):
    return [cell for cell in run.cells if cell.cell_type == "code"]


def stored():
    return nbformat.read(TUTORIAL, as_version=4)


def text_of(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def data_of(cells, mime) -> list:
    return [o.data[mime] for cell in cells for o in cell.outputs if mime in o.get("data", {})]


def assert_quiet(cells):
    """Every code cell shows something, in order of running, and nothing on stderr: no progress bar, no warning."""
    assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1))
    assert all(cell.outputs for cell in cells)
    assert [o.text for cell in cells for o in cell.outputs if o.output_type == "stream" and o.name == "stderr"] == []
    assert [o for cell in cells for o in cell.outputs if o.output_type == "error"] == []
    assert not [text for text in map(text_of, cells) if NOISE.search(text)]


def test_the_shipped_notebook_shows_its_outputs_without_noise():
    """What a reader sees on the web without running anything: the printed text, the page and the head's PNG."""
    cells = [cell for cell in stored().cells if cell.cell_type == "code"]
    assert_quiet(cells)
    images = data_of(cells, "image/png")
    assert len(images) == 1
    with Image.open(io.BytesIO(base64.b64decode(images[0]))) as image:
        assert image.format == "PNG" and min(image.size) > 500
    assert len(data_of(cells, "text/html")) == 1
    assert "PNG(" in data_of(cells, "text/plain")[1]  # a short repr beside the image, not its bytes


def test_the_shipped_outputs_are_a_run_of_the_current_code(run):
    assert differences(stored(), run) == [], "regenerate with `python scripts/make_docs.py`"


def test_a_run_prints_no_noise(executed):
    assert_quiet(executed)


def test_differences_see_a_stale_output_and_forgive_what_varies_by_machine():
    notebook = stored()
    assert differences(notebook, notebook) == []

    def changed(edit):
        other = copy.deepcopy(notebook)
        edit([cell for cell in other.cells if cell.cell_type == "code"])
        return differences(notebook, other)

    # what another machine may write otherwise: the transformers version, a parity error's digits, q and k
    def machine(cells):
        cells[1].outputs[0].text = re.sub(r"transformers \d\S*", "transformers 9.9.9", cells[1].outputs[0].text)
        cells[1].outputs[0].text = cells[1].outputs[0].text.replace("0.000e+00", "1.192e-07", 1)
        page = cells[2].outputs[0].data
        page["text/html"] = re.sub(r"(&quot;q&quot;:\{&quot;shape&quot;:\[[\d,]*\],&quot;data&quot;:&quot;)(\w)",
                                   lambda m: m.group(1) + ("B" if m.group(2) == "A" else "A"), page["text/html"])

    assert changed(machine) == []

    def printed(cells):
        cells[4].outputs[0].text = cells[4].outputs[0].text.replace("%", " %", 1)

    def cleared(cells):
        cells[3].outputs, cells[3].execution_count = [], None

    def repainted(cells):
        png = cells[3].outputs[0].data
        with Image.open(io.BytesIO(base64.b64decode(png["image/png"]))) as image:
            inverted = Image.eval(image.convert("RGB"), lambda v: 255 - v)
        buffer = io.BytesIO()
        inverted.save(buffer, format="PNG")
        png["image/png"] = base64.b64encode(buffer.getvalue()).decode()

    def reweighted(cells):  # the page's probabilities two steps apart: another head, another colour scale
        page = cells[2].outputs[0].data
        source = html.unescape(page["text/html"])
        data = re.search(r'"probs":\{"shape":\[[\d,]*\],"data":"([^"]*)"', source)
        levels = bytearray(base64.b64decode(data.group(1)))
        levels[0] = (levels[0] + 2) % 255
        source = source.replace(data.group(1), base64.b64encode(bytes(levels)).decode())
        page["text/html"] = html.escape(source, quote=True)

    assert changed(printed) == ["code cell 5: stdout differs"]
    assert changed(cleared) == ["code cell 4: run as [4], now [None]", "code cell 4: outputs ['image/png+text/plain'], "
                                "now []"]
    assert changed(repainted) == ["code cell 4: image/png differs"]
    assert changed(reweighted) == ["code cell 3: text/html differs"]


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
