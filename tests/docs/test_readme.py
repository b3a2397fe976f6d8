"""Every Python snippet in README.md runs as written, offline: with an empty Hugging Face cache and the hub switched
off, on the embedded model or on the small random stand-ins that `stand_in` writes (into a cache of the test's
own), so the code is proved, not the weights.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


README = Path(__file__).resolve().parents[2] / "README.md"


def snippets() -> list[tuple[int, str]]:
    """(line, code) for each ```python block of the README."""
    text = README.read_text(encoding="utf-8")
    return [(text[:match.start()].count("\n") + 1, match.group(1))
            for match in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)]


RUNNER = """
import json, sys, traceback
for line, code in json.load(open(sys.argv[1])):
    try:
        exec(compile(code, f"README.md, the snippet at line {line}", "exec"), {"__name__": "__readme__"})
    except BaseException:
        traceback.print_exc()
        sys.exit(f"README.md: the snippet at line {line} failed")
"""


def model_of(code: str) -> str:
    """What a snippet runs on: the family of the stand-in it makes, else the embedded checkpoint."""
    made = re.findall(r'stand_in\("([a-z0-9_]+)"', code)
    return made[0] if made else "minilm"


def test_every_snippet_loads_only_what_it_can_have_offline():
    found = snippets()
    assert len(found) >= 12 and sum(model_of(code) == "minilm" for _, code in found) >= 4
    for line, code in found:
        saved = set(re.findall(r'save_pretrained\("([^"]+)"', code))  # a directory the snippet wrote itself
        names = set(re.findall(r'from_pretrained\("([^"]+)"', code)) - saved
        assert names <= {"minilm"}, (line, names)  # a hub id would need the network: a stand-in takes its place
        assert "# needs" not in code, line


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted({model_of(code) for _, code in snippets()}))
def test_every_readme_snippet_runs_as_written_offline(tmp_path, model):
    blocks = [(line, code) for line, code in snippets() if model_of(code) == model]
    cache = tmp_path / "hub-cache"  # empty: the hub is switched off and nothing is cached
    cache.mkdir()
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    work = tmp_path / "cwd"
    work.mkdir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), XDG_CACHE_HOME=str(tmp_path / "xdg"),
               MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path / "blocks.json")], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    if model != "minilm":  # the stand-in was written where stand_in says, once
        assert (tmp_path / "xdg" / "scratch-models" / "tiny" / model / "config.json").is_file()


def test_the_generated_sections_say_what_the_code_says():
    """The report excerpt is a run of today's verify (its transformers version included), the commands table names
    every causal family for generate, and the mapping tables are every family's: `python scripts/make_docs.py`
    rewrites them, and this fails until it has."""
    import transformers

    from scratch_models.registry.families import FAMILIES
    from scratch_models_docs.readme import readme_markdown

    text = README.read_text(encoding="utf-8")
    assert readme_markdown(text) == text, "README.md's generated sections are stale: run python scripts/make_docs.py"
    assert f"against transformers {transformers.__version__}," in text
    generate = next(line for line in text.splitlines() if line.startswith("| `generate` |"))
    assert all(family.title in generate for family in FAMILIES.values() if family.causal)
    assert all(f"`weight_mapping/{name}.py`" in text for name in FAMILIES)
