"""docs/tutorial.ipynb ships with its outputs, so a reader on the web sees what it prints and draws without running
it. They come from a run: `run_tutorial` executes the notebook in a fresh kernel, as a reader would (offline, on the
CPU, without the environment variables that quiet transformers in our tests), and `write_tutorial` stores what it
produced. `differences` says where a stored notebook's outputs are not those of a run of the current code, leaving
aside only what a run cannot repeat bit for bit on another machine (q and k of the page, a PNG's antialiasing, the
last digits of a parity error, the transformers version).
"""

import base64
import copy
import io
import json
import os
import re
from pathlib import Path

import numpy as np

DOCS = Path(__file__).resolve().parents[2] / "docs"
TUTORIAL = DOCS / "tutorial.ipynb"
# A reader's kernel: none of the variables that quiet transformers and huggingface_hub (tests/conftest.py and the
# command line set them), no network, no GPU.
QUIETING = ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE")
KERNEL_ENV = {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}


def run_tutorial(path: Path = TUTORIAL, timeout: int = 600):
    """The notebook at `path` with the outputs of a run in a fresh kernel: a failing cell raises
    (nbclient.exceptions.CellExecutionError, naming the cell). Each cell's consecutive stream outputs are merged and
    the run's timestamps left out, so that the stored file changes only when what a reader sees changes."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    env = {name: value for name, value in os.environ.items() if name not in QUIETING} | KERNEL_ENV
    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute(env=env)
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = _merged(cell.outputs)
    return notebook


def write_tutorial(path: Path = TUTORIAL, check: bool = False) -> list[Path]:
    """Run the notebook; store its outputs when they differ from those stored (with `check`, only report it).
    Returns [path] when it was (or would be) written."""
    import nbformat

    run = run_tutorial(path)
    if not differences(nbformat.read(path, as_version=4), run):
        return []
    if not check:
        staging = path.with_name(f".{path.name}.tmp")
        nbformat.write(run, staging)
        staging.replace(path)
    return [path]


def differences(stored, run) -> list[str]:
    """Where `stored`'s code cells show other outputs than `run`'s (both notebooks), in words; [] when they agree.
    Stream text and plain reprs must be equal (but for the transformers version and the digits of numbers written
    as 1.234e-07, which vary with the machine), each page the same but for its packed tensors, with probabilities
    within a step of each other, each PNG the same size and nearly the same pixels."""
    found = []
    stored_cells = [cell for cell in stored.cells if cell.cell_type == "code"]
    run_cells = [cell for cell in run.cells if cell.cell_type == "code"]
    if [cell.source for cell in stored_cells] != [cell.source for cell in run_cells]:
        return ["the code cells differ"]
    for number, (old, new) in enumerate(zip(stored_cells, run_cells), 1):
        where = f"code cell {number}"
        if old.execution_count != new.execution_count:
            found.append(f"{where}: run as [{old.execution_count}], now [{new.execution_count}]")
        if _kinds(old) != _kinds(new):
            found.append(f"{where}: outputs {_kinds(old)}, now {_kinds(new)}")
            continue
        for a, b in zip(old.outputs, new.outputs):
            if a.output_type == "stream":
                if _steady(a.text) != _steady(b.text):
                    found.append(f"{where}: {a.name} differs")
                continue
            for mime in a.get("data", {}):
                same = {"image/png": _same_png, "text/html": _same_page}.get(mime, _same_text)
                if not same(a.data[mime], b.data[mime]):
                    found.append(f"{where}: {mime} differs")
    return found


def _merged(outputs: list) -> list:
    """Consecutive stream outputs of one name as one (a kernel sends them in pieces, as they are flushed)."""
    merged = []
    for output in outputs:
        if output.output_type == "stream" and merged and merged[-1].output_type == "stream" \
                and merged[-1].name == output.name:
            merged[-1].text += output.text
        else:
            merged.append(copy.deepcopy(output))
    return merged


def _kinds(cell) -> list[str]:
    return [output.name if output.output_type == "stream" else "+".join(sorted(output.get("data", {})))
            for output in cell.outputs]


def _steady(text: str) -> str:
    text = re.sub(r"transformers \d+\.\d+\S*", "transformers *", text)
    return re.sub(r"\d\.\d+e[+-]\d+", "*", text)


def _same_text(a: str, b: str) -> bool:
    return _steady(a) == _steady(b)


def _same_png(a: str, b: str) -> bool:
    from PIL import Image

    images = [Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB") for data in (a, b)]
    if images[0].size != images[1].size:
        return False
    pixels = [np.asarray(image, dtype=np.int16) for image in images]
    return float(np.abs(pixels[0] - pixels[1]).mean()) < 0.5


# what of a page's data a run on another machine may write otherwise: packed tensors, the score scale's last digits
_UNSTEADY = re.compile(r'"data":"[A-Za-z0-9+/=]*"|"scale":\[[^\]]*\]')
_DATA = re.compile(r'<script type="application/json" id="attention-data">(.*?)</script>', re.S)


def _same_page(a: str, b: str) -> bool:
    """Two attention pages (in their iframes, HTML-escaped) alike but for their packed tensors and score scales; their
    probabilities, as stored shades, within one step."""
    import html

    a, b = html.unescape(a), html.unescape(b)
    if _UNSTEADY.sub("", a) != _UNSTEADY.sub("", b):
        return False
    shades = [[np.frombuffer(base64.b64decode(json.loads(data)["probs"]["data"]), dtype=np.uint8)
               for data in _DATA.findall(page)] for page in (a, b)]
    return all(x.shape == y.shape and int(np.abs(x.astype(int) - y).max(initial=0)) <= 1 for x, y in zip(*shades))
